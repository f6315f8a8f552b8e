"""The status pages without a browser: every page renders from node state, escapes
what it shows, answers bad input with a clear HTML error, shows where a ledger chain
breaks, and writes from other origins are refused. (The browser tests against real
node processes are in test_status_page_browser.py.)"""

from __future__ import annotations

import asyncio
import re
import time
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlite_utils
from aiohttp.test_utils import TestClient, TestServer

from ledger.audit import AuditLog
from ledger.chain import Ledger
from node.web import page_data
from node.web.api import WriteGuard, make_app
from node.web.charts import loss_chart
from node.web.filters import short_id, to_toml
from node.web.ledger_api import ledger_routes
from node.web.pages import STATIC, TEMPLATES, PageSources, describe_receipt, page_routes
from node.work.jobs import JobStore
from node.work.service import labelled_job
from tests.ledger_factories import cosigned, key_from, peer_id_of, tamper

XSS = "<script>alert(1)</script>"
TOKEN = "test-token"


class DirectBridge:
    """The bridge's interface, calling straight through (no second loop in these tests)."""

    async def call(self, fn: Any, *args: Any) -> Any:
        return fn(*args)

    async def call_async(self, fn: Any, *args: Any) -> Any:
        return await fn(*args)


class FakeNode:
    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id
        self.policy = {
            "accepting": True,
            "load_limit_pct": 80,
            "max_job_hours": 6.0,
            "max_gpu_memory_share": 0.9,
        }
        self.peer_rows: list[dict[str, Any]] = []

    def status(self) -> dict[str, Any]:
        return {
            "peer_id": self.peer_id,
            "addrs": [f"/ip4/127.0.0.1/tcp/4470/p2p/{self.peer_id}"],
            "capacity": {
                "gpus": [{"name": "x86_64 (2 cores)", "kind": "cpu", "memory_total_mb": 0}],
                "tflops": 0.02,
                "torch_version": "2.13.0+cpu",
                "cuda_version": "",
            },
            "policy": dict(self.policy),
            "load": 0,
            "peers": len(self.peer_rows),
            "connections": len(self.peer_rows),
            "uptime_s": 12.5,
            "version": "0.1.0",
            "reachability": {
                "state": "private",
                "how": "2 of 2 peers could not dial us back",
                "relayed_through": ["12D3KooWRelayRelayRelay"],
                "relaying": False,
                "observed_addrs": ["/ip4/203.0.113.7/tcp/4470"],
            },
        }

    def peers(self) -> list[dict[str, Any]]:
        return [dict(row) for row in self.peer_rows]

    def metrics(self) -> bytes:
        return b""

    async def refresh_capacity(self) -> dict[str, Any]:
        return {}

    def set_policy(self, changes: dict[str, Any]) -> dict[str, Any]:
        self.policy.update(changes)
        return dict(self.policy)


class FakeWork:
    """The work service's calls the pages make, over a real JobStore."""

    def __init__(self, jobs: JobStore, peer_id: str) -> None:
        self.ctx = SimpleNamespace(jobs=jobs, peer_id=peer_id, units_here=set())
        self.worker = None
        self.weights: dict[str, Path] = {}
        self.rounds: dict[str, list[dict[str, Any]]] = {}  # an elastic job's, as the API has them
        self.trials: dict[str, tuple[list[dict[str, Any]], dict | None]] = {}  # a sweep's

    def jobs(self) -> list[dict[str, Any]]:
        out = []
        for job in self.ctx.jobs.list():
            row = labelled_job(job, self.ctx.peer_id)
            row["progress"] = {k: v for k, v in job.progress.items() if k != "history"}
            out.append(row)
        return out

    def job(self, job_id: str) -> dict[str, Any] | None:
        job = self.ctx.jobs.get(job_id)
        if job is None:
            return None
        row = labelled_job(job, self.ctx.peer_id)
        if job_id in self.rounds:
            row["rounds"] = self.rounds[job_id]
        if job_id in self.trials:
            row["trials"], row["best"] = self.trials[job_id]
        return row

    def weights_path(self, job_id: str) -> Path | None:
        return self.weights.get(job_id)


class Site:
    def __init__(self, tmp_path: Path, bind: str = "127.0.0.1") -> None:
        self.key = key_from(1)
        self.peer_id = peer_id_of(self.key)
        self.ledger = Ledger.open(tmp_path / "node", self.key)
        self.audit = AuditLog.open(tmp_path / "node")
        self.node = FakeNode(self.peer_id)
        self.jobs = JobStore(sqlite_utils.Database(memory=True))
        self.work = FakeWork(self.jobs, self.peer_id)
        guard = WriteGuard(TOKEN, bind)
        bridge = DirectBridge()
        sources = PageSources(self.node, self.work, self.ledger, self.audit, bridge, guard.open)
        self.app = make_app(
            self.node, bridge, guard, [ledger_routes(self.ledger, self.audit), page_routes(sources)]
        )

    def add_job(self, name: str = "digits-mlp", **changes: Any) -> Any:
        spec = {"name": name, "mode": "single", "model": {"arch": "mlp", "hidden": [32]}}
        job = self.jobs.create(name, spec, "auto", {}, [])
        if changes.get("state") == "completed":  # a job completes from running, never queued
            job = self.jobs.update(job, state="running")
        return self.jobs.update(job, **changes) if changes else job

    def close(self) -> None:
        self.ledger.close()
        self.audit.close()


def serve(site: Site, test: Any) -> Any:
    """Run `test(client)` against the site's app on a real local HTTP server."""

    async def main() -> Any:
        client = TestClient(TestServer(site.app))
        await client.start_server()
        try:
            return await test(client)
        finally:
            await client.close()

    return asyncio.run(asyncio.wait_for(main(), 60))


@pytest.fixture
def site(tmp_path: Path) -> Any:
    s = Site(tmp_path)
    yield s
    s.close()


async def get(client: TestClient, path: str, status: int = 200) -> str:
    response = await client.get(path)
    body = await response.text()
    assert response.status == status, body[:500]
    return body


# -- pages --------------------------------------------------------------------------------


def test_every_page_renders_with_a_csp_that_forbids_inline_and_remote_scripts(
    site: Site,
) -> None:
    job = site.add_job()

    async def test(client: TestClient) -> None:
        for path in ("/", "/network", "/jobs", f"/jobs/{job.id}", "/ledger"):
            response = await client.get(path)
            body = await response.text()
            assert response.status == 200, (path, body[:300])
            assert response.content_type == "text/html"
            csp = response.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "default-src 'none'" in csp
            assert "unsafe-inline" not in csp
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            assert "<script>" not in body and "onclick" not in body and "style=" not in body
            assert '<script src="/static/app.js" defer></script>' in body
        for asset, kind in (("app.js", "javascript"), ("app.css", "text/css")):
            response = await client.get(f"/static/{asset}")
            assert response.status == 200 and kind in response.content_type

    serve(site, test)


def test_nothing_is_fetched_from_anywhere_but_the_node() -> None:
    svg_namespace = "http://www.w3.org/2000/svg"
    for path in [*TEMPLATES.glob("*.html"), *STATIC.glob("*")]:
        text = path.read_text().replace(svg_namespace, "")
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text), path.name


def test_overview_shows_identity_capacity_policy_credit_and_an_intact_ledger(
    site: Site,
) -> None:
    async def test(client: TestClient) -> None:
        body = await get(client, "/")
        assert site.peer_id in body  # full id (shown and copied), not only the short form
        assert f'data-copy="{site.peer_id}"' in body
        assert "/ip4/127.0.0.1/tcp/4470" in body
        assert "0.02" in body and "TFLOP/s" in body and "x86_64 (2 cores)" in body
        assert "accepting" in body and "load limit 80%" in body
        assert "ledger intact" in body
        assert "Idle: no unit is training" in body
        assert "Behind a NAT" in body and "2 of 2 peers could not dial us back" in body
        assert "Reachable through 1 relay" in body and "/ip4/203.0.113.7/tcp/4470" in body

    serve(site, test)


def test_partial_renders_only_the_live_block(site: Site) -> None:
    async def test(client: TestClient) -> None:
        body = await get(client, "/?partial=1")
        assert "<html" not in body and 'id="identity"' in body
        full = await get(client, "/")
        assert 'data-live="/?partial=1"' in full
        ledger = await get(client, "/ledger?after=-1")
        assert 'data-live="/ledger?after=-1&amp;partial=1"' in ledger

    serve(site, test)


def test_a_job_named_like_a_script_renders_as_text(site: Site) -> None:
    job = site.add_job(XSS, reason=XSS)
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"

    async def test(client: TestClient) -> None:
        for path in ("/jobs", f"/jobs/{job.id}", "/jobs?partial=1", f"/jobs/{job.id}?partial=1"):
            body = await get(client, path)
            assert XSS not in body, path
            assert escaped in body, path

    serve(site, test)


def test_unknown_pages_and_jobs_get_an_html_404_and_the_api_keeps_json(site: Site) -> None:
    async def test(client: TestClient) -> None:
        body = await get(client, "/jobs/0123456789abcdef", 404)
        assert "No job &#39;0123456789abcdef&#39; on this node." in body
        body = await get(client, "/jobs/%3Cimg%20src=x%20onerror=alert(1)%3E", 404)
        assert "<img src=x" not in body and "&lt;img src=x onerror=alert(1)&gt;" in body
        body = await get(client, "/no/such/page", 404)
        assert "There is no page at /no/such/page." in body
        response = await client.post("/network")
        assert response.status == 405 and "text/html" in response.content_type
        response = await client.get("/api/v1/nope")
        assert response.status == 404
        assert "no such endpoint" in (await response.json())["error"]

    serve(site, test)


def test_the_job_page_shows_progress_chart_timeline_result_and_receipt(
    site: Site, tmp_path: Path
) -> None:
    worker_key = key_from(2)
    worker = peer_id_of(worker_key)
    history = [[s, 2.0 / s, 0.06 if s == 20 else None] for s in range(1, 41)]
    job = site.add_job(
        state="completed",
        worker=worker,
        unit_id="d1b608530bb248d3",
        weights_sha256="ab" * 32,
        metrics={"val_loss": 0.05, "val_accuracy": 0.97, "steps": 40},
        progress={"phase": "training", "step": 40, "total_steps": 40, "history": history},
        note=f"result from {worker} verified; receipt issued",
    )
    receipt = cosigned(site.key, worker_key, job_id=job.id, unit_id="d1b608530bb248d3")
    site.jobs.add_receipt("d1b608530bb248d3", job.id, "owner", site.peer_id, worker, receipt)
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"weights")
    site.work.weights[job.id] = weights

    async def test(client: TestClient) -> None:
        body = await get(client, f"/jobs/{job.id}")
        assert 'data-points="40"' in body  # every training point drawn
        assert 'data-val-points="2"' in body  # one from training, one at the end
        assert "co-signed by owner and worker" in body
        assert f'title="{worker}"' in body
        assert "receipt issued" in body  # the timeline
        assert 'id="weights-link" href="/api/v1/jobs/' + job.id + '/weights"' in body
        assert "name = &#34;digits-mlp&#34;" in body and "[model]" in body  # the spec, as TOML
        assert "val_accuracy" in body

    serve(site, test)


def _round(n: int, workers: list[str], **changes: Any) -> dict[str, Any]:
    row = {
        "round": n,
        "state": "closed",
        "workers": workers,
        "dropped": [],
        "joined": [],
        "left": [],
        "val_loss": 2.0 - n / 10,
        "bytes_in": 30_000 * len(workers),
        "full_bytes": 120_000 * len(workers),
        "bytes_out": 30_000 * len(workers),
        "seconds": 4.0,
    }
    return {**row, **changes}


def test_an_elastic_job_page_shows_each_rounds_peers_bytes_and_val_loss(site: Site) -> None:
    a, b, c, d = (peer_id_of(key_from(i)) for i in range(2, 6))
    spec = {"name": "lm", "mode": "elastic", "elastic": {"rounds": 5, "workers": 3}}
    job = site.jobs.create("lm", spec, "auto", {}, [])
    history = [[20 * (n + 1), None, 2.0 - n / 10] for n in range(3)]
    site.jobs.update(
        job, state="running", progress={"step": 60, "total_steps": 100, "history": history}
    )
    site.work.rounds[job.id] = [
        _round(0, [a, b, c], joined=[a, b, c]),
        _round(1, [a, b], dropped=[c]),
        _round(2, [a, b, d], joined=[d]),
        _round(3, [], state="open", val_loss=None, bytes_in=0, full_bytes=0),
    ]

    async def test(client: TestClient) -> None:
        body = await get(client, f"/jobs/{job.id}")
        strip = body.split('id="rounds"', 1)[1].split("</section>", 1)[0]
        assert "3 of 5 rounds closed" in strip
        assert "deltas up took 0.24 MB, 4x less than full fp32 weights (0.96 MB)" in strip
        assert "weights and their updates down 0.24 MB" in strip
        rows = strip.split('<li class="round ')[1:]
        assert [r.split('data-round="', 1)[1][0] for r in rows] == ["3", "2", "1", "0"]
        assert f'class="chip joined" title="{d}: joined this round; delta applied"' in rows[1]
        assert f'class="chip left" title="{c}: dropped (lost or late)"' in rows[2]
        assert f'class="chip worked" title="{a}' in rows[2] and "val 1.9" in rows[2]
        assert '<rect class="sent" width="25.0"' in rows[3]
        assert "open" in rows[0]
        assert 'data-val-points="3"' in body and 'data-points="0"' in body  # val loss per round
        assert "3 in round 2 (of 3 wanted)" in body  # the last closed round
        assert "Each accepted share of each round has its own co-signed receipt" in body

    serve(site, test)


def test_a_sweep_job_page_shows_its_trials_and_the_optimisation_history(site: Site) -> None:
    a, b = (peer_id_of(key_from(i)) for i in range(2, 4))
    sweep = {
        "trials": 6,
        "parallel": 2,
        "metric": "val_loss",
        "direction": "minimize",
        "sampler": "tpe",
        "pruner": "asha",
        "report_every": 50,
        "space": {"optim.lr": {"low": 1e-4, "high": 0.1, "log": True}},
    }
    job = site.jobs.create("sw", {"name": "sw", "mode": "sweep", "sweep": sweep}, "auto", {}, [])
    site.jobs.update(job, state="running", progress={"importances": {"optim.lr": 1.0}})

    def trial(n: int, state: str, value: float | None, worker: str = "") -> dict[str, Any]:
        return {
            "number": n,
            "state": state,
            "value": value,
            "params": {"optim.lr": 0.01 * (n + 1)},
            "worker": worker,
            "steps": 100,
        }

    trials = [
        trial(0, "complete", 0.5, a),
        trial(1, "complete", 0.3, b),
        trial(2, "pruned", 1.9, a),
        trial(3, "complete", 0.4, b),
        trial(4, "running", None, a),
    ]
    site.work.trials[job.id] = (trials, {"number": 1, "params": {"optim.lr": 0.02}, "value": 0.3})

    async def test(client: TestClient) -> None:
        body = await get(client, f"/jobs/{job.id}")
        card = body.split('id="sweep"', 1)[1].split("</section>", 1)[0]
        assert "4 of 6 trials ended" in card and "best: trial 1, val_loss 0.3" in card
        assert 'data-points="3" data-val-points="3"' in card  # best so far, and each value
        assert "trial 3: best so far 0.3" in card  # trial 3 (0.4) did not beat trial 1
        rows = card.split("<tr ")[1:]
        assert [r.split('data-trial="', 1)[1][0] for r in rows] == ["0", "1", "2", "3", "4"]
        assert 'class="self"' in rows[1] and "pruned" in rows[2]
        assert "1 trials running on" in body and "Each complete trial has its own" in body
        assert 'id="loss-curve"' not in body
        parallel = card.split('class="chart parallel"', 1)[1].split("</svg>", 1)[0]
        assert 'data-lines="3"' in parallel  # the complete trials
        assert 'class="trial best"' in parallel.split('data-trial="1"', 1)[0].rsplit("<", 1)[1]
        assert "trial 3: val_loss 0.4" in parallel
        importances = card.split('class="chart importances"', 1)[1].split("</svg>", 1)[0]
        assert 'data-bars="1"' in importances and "optim.lr" in importances

    serve(site, test)


def test_a_remote_workers_metrics_are_labelled_its_claim_until_verified(site: Site) -> None:
    worker = peer_id_of(key_from(2))
    metrics = {"val_loss": 0.05, "steps": 40}
    done = {"state": "completed", "metrics": metrics}
    claimed = site.add_job("claimed", worker=worker, metrics_status="claimed", **done)
    older = site.add_job("older-row", worker=worker, **done)  # stored before metrics_status
    local = site.add_job("trained-here", worker=site.peer_id, **done)
    verified = site.add_job("verified", worker=worker, metrics_status="verified", **done)
    label = f"claimed by {short_id(worker)}, not verified"
    statuses = {j["name"]: j["metrics_status"] for j in site.work.jobs()}
    assert statuses == {
        "claimed": "claimed",
        "older-row": "claimed",
        "trained-here": "local",
        "verified": "verified",
    }

    async def test(client: TestClient) -> None:
        for job in (claimed, older):
            body = await get(client, f"/jobs/{job.id}")
            assert label in body and f'title="reported by worker {worker}' in body
        for job in (local, verified):
            assert "not verified" not in await get(client, f"/jobs/{job.id}")
        rows = re.findall(r'<tr data-job="(\w+)">(.*?)</tr>', await get(client, "/jobs"), re.S)
        labelled = {job_id for job_id, row in rows if label in row}
        assert labelled == {claimed.id, older.id}

    serve(site, test)


def test_a_stored_receipt_that_does_not_verify_says_so() -> None:
    owner, worker = key_from(1), key_from(2)
    good = cosigned(owner, worker)
    assert describe_receipt(good)["valid"]
    flipped = good[:-5] + bytes([good[-5] ^ 1]) + good[-4:]  # inside the worker signature
    described = describe_receipt(flipped)
    assert described["valid"] is False and "signature" in described["error"]
    assert describe_receipt(b"\x00garbage")["valid"] is False
    assert describe_receipt(None) is None


def test_the_network_page_lists_peers_with_credit_and_reputation(site: Site) -> None:
    worker_key, owner_key = key_from(2), key_from(3)
    worker = peer_id_of(worker_key)
    assert site.audit.add(cosigned(owner_key, worker_key)) == "added"
    site.node.peer_rows = [
        {
            "peer_id": worker,
            "addrs": [],
            "gpus": [{"name": "NVIDIA H100", "kind": "cuda", "memory_total_mb": 81559}],
            "tflops": 400.0,
            "load": 50,
            "policy": {"accepting": False, "load_limit_pct": 90},
            "last_seen": time.time() - 5,
            "stale": False,
        }
    ]

    async def test(client: TestClient) -> None:
        body = await get(client, "/network")
        assert f'data-peer="{worker}"' in body and f'data-peer="{site.peer_id}"' in body
        assert "NVIDIA H100 · 79.6 GiB" in body
        assert "1 co-signed receipt" in body  # the worker's reputation
        assert "paused" in body and "5 s ago" in body
        assert "400" in body  # total capacity includes the peer
        assert 'id="total-nodes">2<' in body

    serve(site, test)


# -- the ledger page ---------------------------------------------------------------------


def _fill(ledger: Ledger, n: int) -> None:
    worker, owner = peer_id_of(key_from(2)), ledger.peer_id
    for i in range(n):
        ledger.append_rejected(f"{i + 2**40:016x}", f"{i:016x}", worker, owner, f"bad weights {i}")


def test_ledger_pages_newest_first_and_verifies(site: Site) -> None:
    _fill(site.ledger, 60)

    async def test(client: TestClient) -> None:
        body = await get(client, "/ledger")
        seqs = [int(s) for s in re.findall(r'<tr id="seq-(\d+)"', body)]
        assert seqs == list(range(60, 10, -1))  # the newest 50
        assert 'href="/ledger?after=-1" rel="next">older' in body
        older = await get(client, "/ledger?after=-1")
        assert [int(s) for s in re.findall(r'<tr id="seq-(\d+)"', older)][-1] == 0
        verified = await get(client, "/ledger?verify=1")
        assert "chain intact" in verified and "61 entries" in verified

    serve(site, test)


def test_a_broken_chain_is_shown_where_it_breaks(site: Site, tmp_path: Path) -> None:
    _fill(site.ledger, 12)
    tamper(tmp_path / "node", ("UPDATE entries SET credit = 5.0 WHERE seq = 7", ()))

    async def test(client: TestClient) -> None:
        body = await get(client, "/ledger?verify=1&after=-1")
        assert "chain broken at seq 7" in body
        assert "seq 7: hash does not match its contents" in body
        assert re.search(r'<tr id="seq-7" class="[^"]*\bbad\b', body)
        assert 'href="/ledger?after=6#seq-7"' in body
        assert "data-live=" not in body.split('id="ledger"')[1][:80]  # a broken view stays put
        overview = await get(client, "/")
        assert "ledger broken at seq 7" in overview

    serve(site, test)


@pytest.mark.parametrize("after", ["x", "-2", "1e3", str(2**63), "<b>"])
def test_bad_ledger_parameters_get_a_400_page_and_change_nothing(site: Site, after: str) -> None:
    _fill(site.ledger, 3)
    head = site.ledger.head().hash

    async def test(client: TestClient) -> None:
        body = await get(client, f"/ledger?after={after}", 400)
        assert "&#39;after&#39; must be a whole number in -1..4611686018427387904" in body
        assert "<b>" not in body

    serve(site, test)
    assert site.ledger.head().hash == head and site.ledger.verify().ok


# -- writes --------------------------------------------------------------------------------


def test_writes_from_another_origin_or_host_are_refused_and_change_nothing(site: Site) -> None:
    async def test(client: TestClient) -> None:
        url = str(client.make_url("/"))[:-1]
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
            {"Origin": url + "0"},  # another port
            {"Host": "evil.example:80"},  # DNS rebinding onto a loopback-bound node
        ):
            response = await client.put(
                "/api/v1/policy", json={"accepting": False}, headers=headers
            )
            assert response.status == 403, headers
            assert "refused" in (await response.json())["error"]
        assert site.node.policy["accepting"] is True
        response = await client.put(
            "/api/v1/policy", json={"accepting": False}, headers={"Origin": url}
        )
        assert response.status == 200  # the node's own page
        assert site.node.policy["accepting"] is False

    serve(site, test)


def test_a_non_loopback_node_needs_the_token_for_everything_and_its_login_sets_it(
    tmp_path: Path,
) -> None:
    site = Site(tmp_path, bind="0.0.0.0")

    async def test(client: TestClient) -> None:
        body = await get(client, "/jobs")  # redirected to the login page
        assert "asks for its API token" in body and "api.token" in body
        for path in ("/api/v1/status", "/api/v1/jobs", "/api/v1/ledger", "/metrics"):
            response = await client.get(path)
            assert response.status == 401, path
        response = await client.put("/api/v1/policy", json={"accepting": False})
        assert response.status == 401
        response = await client.post("/login", data={"token": "wrong"})
        assert response.status == 401 and "not this node's token" in await response.text()
        assert site.node.policy["accepting"] is True
        response = await client.get("/api/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status == 200
        response = await client.post("/login", data={"token": TOKEN}, allow_redirects=False)
        assert response.status == 303 and response.headers["Location"] == "/"
        cookie = response.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        body = await get(client, "/jobs")
        assert 'id="token"' in body
        response = await client.put("/api/v1/policy", json={"accepting": False})
        assert response.status == 200
        assert site.node.policy["accepting"] is False

    try:
        serve(site, test)
    finally:
        site.close()


# -- pieces --------------------------------------------------------------------------------


def test_the_loss_chart_draws_what_it_is_given() -> None:
    empty = str(loss_chart([], 100))
    assert 'data-points="0"' in empty and "no loss reported yet" in empty
    rows = [[1, 2.3, None], [2, float("nan"), None], ["x", 1.0], [3, 0.02, 0.05], [4, True]]
    chart = str(loss_chart(rows, 10, final_val=(10, 0.04), title=XSS))
    assert 'data-points="2" data-val-points="2"' in chart  # nan, bad step, bool skipped
    assert "loss (log)" in chart  # 2.3 / 0.02 spans more than 10x
    assert XSS not in chart and "&lt;script&gt;" in chart
    result_only = str(loss_chart([], 400, final_val=(400, 0.15), final_train=(400, 0.12)))
    assert 'data-points="1" data-val-points="1"' in result_only  # too short for a heartbeat
    linear = str(loss_chart([[1, 0.5, None], [2, 0.4, None]], 2))
    assert "loss (log)" not in linear and linear.count('class="series train"') == 2  # + legend


def test_specs_are_shown_as_toml_that_reads_back_the_same() -> None:
    spec = {
        "name": 'quote " and <tag>',
        "seed": 0,
        "model": {"arch": "mlp", "hidden": [128, 64], "dropout": 0.0},
        "data": {"source": "builtin:digits", "validation": 0.2},
        "layers": [{"type": "linear", "out": 10}],
        "optim": {"lr": 0.003, "steps": 500, "schedule": {"name": "cosine"}},
        "requirements": {"gpu": "none"},
    }
    assert tomllib.loads(to_toml(spec)) == spec


def test_training_now_names_a_peers_unit_or_our_own() -> None:
    jobs = JobStore(sqlite_utils.Database(memory=True))
    work = FakeWork(jobs, "me")
    assert page_data.training_now(work) is None
    job = jobs.create("mine", {}, "auto", {}, [])
    jobs.update(job, state="running", worker="me", unit_id="bb82030dbc2bcaba", progress={"step": 3})
    work.ctx.units_here.add("bb82030dbc2bcaba")
    assert page_data.training_now(work)["role"] == "owner"
    work.worker = SimpleNamespace(
        current=SimpleNamespace(
            owner="peer",
            package=SimpleNamespace(job_id="189f40034be7a199", unit_id="0bfe935e70c321c7"),
            spec={"name": "theirs"},
            phase="training",
            progress={"step": 7, "total_steps": 10, "loss": 0.1, "samples_per_s": 5.0},
        )
    )
    now = page_data.training_now(work)
    assert (now["role"], now["name"], now["step"], now["owner"]) == ("worker", "theirs", 7, "peer")
