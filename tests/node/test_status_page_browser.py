"""The status page in a real browser: Playwright drives Debian's Chromium against three
node processes on loopback. A job submitted from the page trains on a peer while its
loss curve grows without a reload, completes, and its weights download; the ledger
shows the receipt and verifies; a script-like job name stays text; a restarted node's
page reconnects; a non-loopback node asks for its token before showing anything.

Screenshots of each page go to $MESHMINER_SCREENSHOTS when set (the ones in
docs/images/ are made that way), else to the test's temporary directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open

from node.client import request_json
from node.demo.localnet import LocalNetwork, LocalNode, free_port, wait_for
from tests.conftest import NODE_ARGS

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = Path(os.environ.get("MESHMINER_CHROMIUM", "/usr/bin/chromium"))  # Debian's
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
XSS = "<script>alert(1)</script>"
LONG_STEPS = 30_000  # trains for 25 s or more on 2 cores; cancelled once seen growing
SPEC = """name = "{name}"
seed = 0
[model]
arch = "mlp"
hidden = [32]
[data]
source = "builtin:digits"
batch_size = 64
validation = 0.2
[optim]
name = "adamw"
lr = 0.003
steps = {steps}
"""


def _browser_missing() -> str:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package playwright is not installed (pip install -e '.[test]')"
    if not CHROMIUM.exists():
        return f"no {CHROMIUM}: install Debian's chromium (apt-get install -y chromium)"
    return ""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    missing = _browser_missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests cannot run under CI: {missing}")
        pytest.skip(f"browser tests skipped: {missing}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),  # an empty user data dir
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 860},
            accept_downloads=True,
        )
        context.set_default_timeout(30_000)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LocalNode]]:
    """node1 (the job owner) and node2 on loopback, node3 with its API on 0.0.0.0."""
    net = LocalNetwork(tmp_path_factory.mktemp("net"), NODE_ARGS)
    try:
        first = net.add()
        named = ["--name", "Ada L.", "--team", "Analytical Engines"]
        for name, http_host in (("node2", "127.0.0.1"), ("node3", "0.0.0.0")):
            args = [*NODE_ARGS, "--bootstrap", first.multiaddr]
            args += named if name == "node2" else []
            node = LocalNode(name, net.root / name, free_port(), free_port(), args, http_host)
            net.nodes.append(node)
            node.launch()  # the two boot in parallel
        for node in net.nodes[1:]:
            node.wait_ready(90)
        net.wait_all_see_each_other(timeout=30)
        yield net.nodes
    finally:
        net.stop()
        for node in net.nodes:
            print(f"--- {node.name} ({node.peer_id}) log ---\n{node.log_tail(25)}")


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("MESHMINER_SCREENSHOTS") or tmp_path / "screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


def _new_page(browser: Any, errors: list[str] | None = None) -> Any:
    """A new tab; script errors, CSP violations and dialogs are added to `errors`."""
    seen = errors if errors is not None else []
    page = browser.new_page()
    page.on("console", lambda m: m.type == "error" and seen.append(m.text))
    page.on("pageerror", lambda exc: seen.append(str(exc)))

    def dialog(d: Any) -> None:
        seen.append(f"dialog: {d.message}")
        d.dismiss()

    page.on("dialog", dialog)
    return page


def _live(page: Any) -> None:
    from playwright.sync_api import expect

    expect(page.locator("#conn")).to_have_attribute("data-state", "live")


def _points(page: Any) -> int:
    return int(page.locator("svg.chart").get_attribute("data-points"))


def _wait_points(page: Any, more_than: int, timeout: float) -> int:
    """Poll the chart's point count until it exceeds `more_than` (the page's CSP has no
    'unsafe-eval', so Playwright's wait_for_function cannot run in it)."""
    return wait_for(
        lambda: (n := _points(page)) > more_than and n,
        timeout,
        f"the loss curve to have more than {more_than} points",
    )


def _api_json(node: LocalNode, method: str, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        node.api + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_job_submitted_from_the_page_trains_live_completes_and_lands_in_the_ledger(
    browser: Any, network: list[LocalNode], shots: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    owner = network[0]
    errors: list[str] = []
    page = _new_page(browser, errors)

    # overview: this node and its two peers
    page.goto(owner.api + "/")
    _live(page)
    expect(page.locator("#peer-count")).to_have_text("2")
    expect(page.locator("#peer-id")).to_have_text(owner.peer_id)
    expect(page.locator("#ledger-badge")).to_have_text("ledger intact")
    page.screenshot(path=shots / "overview.png", full_page=True)

    page.goto(owner.api + "/network")
    _live(page)
    expect(page.locator("#peers tbody tr")).to_have_count(3)
    page.screenshot(path=shots / "network.png", full_page=True)

    # submit from the page (pasted TOML) a job long enough to watch
    page.goto(owner.api + "/jobs")
    _live(page)
    page.fill("#spec", SPEC.format(name="digits-live", steps=LONG_STEPS))
    page.click("#submit-button")
    page.wait_for_url("**/jobs/*")
    live_id = page.url.rsplit("/", 1)[1]
    expect(page.locator("#job-name")).to_have_text("digits-live")
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    # its loss curve gains points while it trains (one per worker heartbeat), no reload
    seen = _wait_points(page, 1, 60)
    expect(page.locator("#job-state .state")).to_have_text("running")
    _wait_points(page, max(seen, 7), 30)
    expect(page.locator("#job-state .state")).to_have_text("running")
    expect(page.locator("#samples-per-s")).not_to_have_text("–")
    assert page.evaluate("window.__sameDocument === true")
    page.screenshot(path=shots / "job-training.png", full_page=True)

    # the worker's overview names the unit it is training now
    job = owner.get(f"/api/v1/jobs/{live_id}")
    worker = next(n for n in network if n.peer_id == job["worker"])
    assert worker is not owner
    other = _new_page(browser, errors)
    _sign_in(other, worker)
    other.goto(worker.api + "/")
    expect(other.locator("#training")).to_contain_text("digits-live")
    other.close()

    # cancelled from its page
    page.click("#cancel-button")
    expect(page.locator("#job-state .state")).to_have_text("cancelled")
    assert page.evaluate("window.__sameDocument === true")

    # a short job: completed, and its weights download as safetensors
    page.goto(owner.api + "/jobs")
    page.fill("#spec", SPEC.format(name="digits-mlp", steps=400))
    page.click("#submit-button")
    page.wait_for_url("**/jobs/*")
    job_id = page.url.rsplit("/", 1)[1]
    expect(page.locator("#job-state .state")).to_have_text("completed", timeout=120_000)
    # the worker's countersignature re-renders the part after the job completes; a click
    # while the link is swapped out downloads nothing
    expect(page.locator("#receipt")).to_contain_text("co-signed by owner and worker")
    with page.expect_download() as download_info:
        page.click("#weights-link")
    weights = tmp_path / "weights.safetensors"
    download_info.value.save_as(weights)
    job = owner.get(f"/api/v1/jobs/{job_id}")
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == job["weights_sha256"]
    with safe_open(str(weights), framework="pt") as f:
        assert len(list(f.keys())) >= 2
    expect(page.locator("svg.chart")).to_have_attribute("data-val-points", "1")  # the result
    page.screenshot(path=shots / "job.png", full_page=True)

    page.goto(owner.api + "/jobs")
    _live(page)
    expect(page.locator(f'tr[data-job="{job_id}"]')).to_contain_text("completed")
    expect(page.locator(f'tr[data-job="{live_id}"]')).to_contain_text("cancelled")
    page.screenshot(path=shots / "jobs.png", full_page=True)

    # the ledger: the receipt as work received, and a passing verification
    page.goto(owner.api + "/ledger")
    _live(page)
    row = page.locator("#entries tr.kind-work_received", has=page.locator(f"text={job_id}"))
    expect(row).to_have_count(1)
    page.click("#verify-button")
    expect(page.locator("#verify-result")).to_have_text("chain intact")
    page.screenshot(path=shots / "ledger.png", full_page=True)

    # a second job goes to the other worker (the first one is paused): the credit page
    # lists both workers' credit, with the name and team node2's ad carries
    first = job["worker"]
    (paused,) = [n for n in network[1:] if n.peer_id == first]
    request_json(paused.api, "PUT", "/api/v1/policy", {"accepting": False}, paused.token)
    try:
        second = owner.wait_job_end(owner.submit_spec(SPEC.format(name="digits-2", steps=50)), 120)
    finally:
        request_json(paused.api, "PUT", "/api/v1/policy", {"accepting": True}, paused.token)
    assert second["state"] == "completed" and second["worker"] != first
    # a job completes when its result is taken; its worker's co-signed receipt comes after
    workers = {first, second["worker"]}
    wait_for(
        lambda: {r["peer_id"] for r in owner.get("/api/v1/credit")["peers"]} == workers,
        60,
        "both workers' co-signed receipts in the owner's audit",
    )
    page.goto(owner.api + "/credit")
    _live(page)
    expect(page.locator("#credit-view")).to_contain_text("not a global truth")
    for worker in (first, second["worker"]):
        row = page.locator(f"#credit-table tr[data-peer='{worker}']")
        expect(row.locator("td.units")).to_have_text("1")
    named = page.locator(f"#credit-table tr[data-peer='{network[1].peer_id}']")
    expect(named.locator("td.name")).to_have_text("Ada L.")
    expect(named.locator("td.team")).to_have_text("Analytical Engines")
    page.screenshot(path=shots / "credit.png", full_page=True)
    credit = owner.get("/api/v1/credit")
    assert {r["peer_id"] for r in credit["peers"]} == workers
    assert credit["rank"] is None  # the owner trained nothing

    assert errors == []  # no script error, no CSP violation, no dialog
    page.close()


def test_a_script_like_job_name_is_text_and_unknown_jobs_get_a_404_page(
    browser: Any, network: list[LocalNode]
) -> None:
    from playwright.sync_api import expect

    owner = network[0]
    status, job = _api_json(
        owner, "POST", "/api/v1/jobs", {"spec": SPEC.format(name=XSS, steps=20)}
    )
    assert status == 201, job
    errors: list[str] = []
    page = _new_page(browser, errors)
    page.goto(owner.api + "/jobs")
    _live(page)
    expect(page.locator(f'tr[data-job="{job["id"]}"] .job-link')).to_have_text(XSS)
    page.goto(f"{owner.api}/jobs/{job['id']}")
    expect(page.locator("#job-name")).to_have_text(XSS)
    assert page.locator("script:not([src])").count() == 0
    assert errors == []  # no dialog, no script error

    response = page.goto(owner.api + "/jobs/0123456789abcdef")
    assert response.status == 404
    expect(page.locator("h1")).to_contain_text("No such job")
    expect(page.locator(".message")).to_have_text("No job '0123456789abcdef' on this node.")
    page.close()


def _sign_in(page: Any, node: LocalNode) -> None:
    """A node not bound to loopback shows nothing before its token is given."""
    if node.http_host == "127.0.0.1":
        return
    page.goto(node.api + "/login")
    page.fill("input[name=token]", node.token)
    page.click("button[type=submit]")
    page.wait_for_url(node.api + "/")


def test_a_non_loopback_node_asks_for_its_token_before_anything(
    browser: Any, network: list[LocalNode], tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    node = network[2]  # API bound to 0.0.0.0
    token_file = node.data_dir / "api.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    page = _new_page(browser)
    page.context.clear_cookies()  # a stranger: not signed in by an earlier test
    page.goto(node.api + "/jobs")  # every page sends a stranger to the login form
    expect(page.locator("h1")).to_contain_text("asks for its API token")
    page.fill("input[name=token]", "wrong")
    page.click("button[type=submit]")
    expect(page.locator("body")).to_contain_text("not this node's token")
    assert node.get("/api/v1/jobs") == []  # nothing stored

    _sign_in(page, node)
    page.goto(node.api + "/jobs")
    spec_file = tmp_path / "job.toml"
    spec_file.write_text(SPEC.format(name="no-token", steps=20))
    page.set_input_files("#spec-file", spec_file)  # an uploaded spec fills the form
    expect(page.locator("#spec")).to_have_value(spec_file.read_text())
    page.click("#submit-button")
    page.wait_for_url("**/jobs/*")
    expect(page.locator("#job-name")).to_have_text("no-token")
    page.close()


def test_the_page_reconnects_after_a_node_restart(browser: Any, network: list[LocalNode]) -> None:
    from playwright.sync_api import expect

    node = network[1]
    # a unit still training here (an earlier test's job) would be handed back first
    wait_for(lambda: node.get("/api/v1/status")["load"] == 0, 60, "node2's units to end")
    page = _new_page(browser)
    page.goto(node.api + "/")
    _live(page)
    boot = page.evaluate("document.body.dataset.boot")
    page.evaluate("window.__sameDocument = true")
    try:
        # an open event stream does not hold the stop up: the node bounds its own stop
        # (node.shutdown), so this waits for the exit itself, not for a time
        assert node.stop(signal.SIGTERM) == 0, node.log_tail()
        expect(page.locator("#conn")).to_have_attribute("data-state", "reconnecting")
    finally:
        if node.proc is None or node.proc.poll() is not None:
            node.start()  # up again (its API answers), also for the tests after this one
    _live(page)
    assert page.evaluate("document.body.dataset.boot") != boot  # a new node process
    status, _ = _api_json(node, "PUT", "/api/v1/policy", {"accepting": False})
    assert status == 200
    expect(page.locator("#policy")).to_contain_text("paused")  # live, after the restart
    assert page.evaluate("window.__sameDocument === true")
    _api_json(node, "PUT", "/api/v1/policy", {"accepting": True})
    wait_for(lambda: node.get("/api/v1/status")["policy"]["accepting"], 10, "the resume")
    page.close()


def _window_excluding_now() -> str:
    """A one-hour window starting two hours from now, local time."""
    now = time.localtime()
    start = (now.tm_hour + 2) % 24
    return f"{start:02d}:{now.tm_min:02d}-{(start + 1) % 24:02d}:{now.tm_min:02d}"


def test_the_preferences_panel_steers_the_node_and_its_peers_see_it(
    browser: Any, network: list[LocalNode], shots: Path, tmp_path: Path
) -> None:
    """On node2's overview the volunteer sets a load limit and hours that exclude now,
    then pauses: each applies live, node2's timeline says so, and node1's peer table
    shows it from node2's next ad. A bad value is refused with the key, nothing kept.
    Then a program it names as exclusive runs, and training pauses until it ends."""
    from playwright.sync_api import expect

    owner, volunteer = network[0], network[1]
    errors: list[str] = []
    page = _new_page(browser, errors)
    page.goto(volunteer.api + "/")
    _live(page)
    form = page.locator("#preferences-form")
    result = page.locator("#preferences-result")

    form.locator("input[name=hours]").fill("7pm till late")
    form.locator("button[type=submit]").click()
    expect(result).to_contain_text("400: hours: '7pm till late' is not a window")
    assert volunteer.get("/api/v1/status")["preferences"]["hours"] == ""
    errors.remove(
        "Failed to load resource: the server responded with a status of 400 (Bad Request)"
    )

    hours = _window_excluding_now()
    form.locator("input[name=hours]").fill(hours)
    form.locator("input[name=load_limit_pct]").fill("40")
    form.locator("button[type=submit]").click()
    expect(result).to_contain_text("saved: load_limit_pct, hours")
    expect(page.locator("#paused-because")).to_contain_text(f"outside its hours ({hours})")
    expect(page.locator("#node-timeline")).to_contain_text(f"hours to '{hours}'")
    expect(page.locator("#node-timeline")).to_contain_text("training paused: outside its hours")
    page.screenshot(path=str(shots / "preferences.png"), full_page=True)

    peers = _new_page(browser, errors)
    peers.goto(owner.api + "/network")
    row = peers.locator(f"tr[data-peer='{volunteer.peer_id}'] td.policy")
    expect(row).to_contain_text(f"outside its hours ({hours})", timeout=20_000)
    expect(row).to_contain_text("≤40% of the time")

    page.locator("button[data-steer=pause]").click()
    expect(result).to_contain_text("saved: accepting")
    expect(row).to_contain_text("paused", timeout=20_000)
    expect(page.locator("#policy")).to_contain_text("paused")

    form.locator("input[name=hours]").fill("")
    form.locator("input[name=load_limit_pct]").fill("100")
    form.locator("button[type=submit]").click()
    expect(result).to_contain_text("saved: load_limit_pct, hours")
    page.locator("button[data-steer=resume]").click()
    expect(result).to_contain_text("saved: accepting")
    expect(row).to_contain_text("accepting", timeout=20_000)
    expect(page.locator("#node-timeline")).to_contain_text("training allowed again")
    saved = json.loads((volunteer.data_dir / "preferences.json").read_text())
    assert saved["hours"] == "" and saved["accepting"] is True  # kept for the next start

    # a machine guard: a program the volunteer named starts, and training pauses
    game = tmp_path / "supertuxkart"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", game)
    child = subprocess.Popen([game, "300"])
    try:
        form.locator("textarea[name=exclusive_apps]").fill("supertuxkart")
        form.locator("input[name=pause_on_battery]").check()  # test nodes start without it
        form.locator("button[type=submit]").click()
        expect(result).to_contain_text("saved: pause_on_battery, exclusive_apps")
        expect(page.locator("#paused-because")).to_contain_text("supertuxkart is running")
        expect(row).to_contain_text("supertuxkart is running", timeout=20_000)
    finally:
        child.kill()
        child.wait()
    wait_for(  # the program ended: training goes on
        lambda: volunteer.get("/api/v1/status")["availability"]["paused"] == "",
        20,
        "training to be allowed again",
    )
    saved = json.loads((volunteer.data_dir / "preferences.json").read_text())
    assert saved["exclusive_apps"] == ["supertuxkart"] and saved["pause_on_battery"] is True
    assert not errors, errors
    for tab in (page, peers):
        tab.close()
