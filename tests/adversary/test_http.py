"""The HTTP API against a web page in the volunteer's browser, a stranger on the
network and another local user, with real node processes.

- bound to loopback: a request whose Host is not a loopback name (DNS rebinding: a
  site that points its own name at 127.0.0.1) is refused, reads included;
- bound to 0.0.0.0: every read needs the token (weights and specs are private);
- a short token file stops the node at start; the data dir and the secrets in it are
  for this user only; hammering the ledger verification costs one run.
Every refused request leaves the node's jobs and policy as they were.
"""

from __future__ import annotations

import http.client
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from node.demo.localnet import LocalNetwork, LocalNode, free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNetwork]:
    network = LocalNetwork(tmp_path_factory.mktemp("http"), ["--not-accepting", "--cold-runners"])
    try:
        yield network
    finally:
        network.stop()


@pytest.fixture(scope="module")
def local(net: LocalNetwork) -> LocalNode:
    return net.add()


@pytest.fixture(scope="module")
def public(net: LocalNetwork) -> LocalNode:
    return net.add(http_host="0.0.0.0")


def _call(
    node: LocalNode,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


READS = [
    "/api/v1/status",
    "/api/v1/peers",
    "/api/v1/jobs",
    "/api/v1/jobs/0123456789abcdef",
    "/api/v1/jobs/0123456789abcdef/weights",
    "/api/v1/ledger",
    "/api/v1/ledger/verify",
    "/api/v1/ledger/balances",
    "/api/v1/events",
    "/metrics",
]
PAGES = ["/", "/network", "/jobs", "/ledger"]


def test_a_rebound_dns_name_gets_nothing_from_a_loopback_node(local: LocalNode) -> None:
    before = (local.get("/api/v1/jobs"), local.get("/api/v1/status")["policy"])
    port = local.http_port
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
        for path in READS + PAGES:
            code, _, body = _call(local, "GET", path, {"Host": host})
            assert code == 403, (host, path, code)
        code, _, body = _call(
            local,
            "PUT",
            "/api/v1/policy",
            {"Host": host, "Content-Type": "application/json"},
            json.dumps({"accepting": True}).encode(),
        )
        assert code == 403 and b"loopback Host" in body
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
        assert _call(local, "GET", "/api/v1/status", {"Host": host})[0] == 200
    # a page of another origin cannot write, even with a loopback Host
    code, _, _ = _call(
        local,
        "PUT",
        "/api/v1/policy",
        {"Origin": "http://evil.example", "Content-Type": "application/json"},
        json.dumps({"accepting": True}).encode(),
    )
    assert code == 403
    assert (local.get("/api/v1/jobs"), local.get("/api/v1/status")["policy"]) == before


def test_reads_need_the_token_on_a_non_loopback_bind(public: LocalNode) -> None:
    token = public.token
    assert token
    for path in READS:
        code, _, body = _call(public, "GET", path)
        assert code == 401, (path, code)
        assert b"api.token" in body
        code, _, _ = _call(public, "GET", path, {"Authorization": "Bearer wrong"})
        assert code == 401, path
    for path in PAGES:
        code, headers, _ = _call(public, "GET", path)
        assert (code, headers.get("Location")) == (303, "/login"), path
    assert _call(public, "GET", "/login")[0] == 200
    auth = {"Authorization": f"Bearer {token}"}
    for path in ("/api/v1/status", "/api/v1/jobs", "/api/v1/ledger", "/metrics"):
        assert _call(public, "GET", path, auth)[0] == 200, path
    assert _call(public, "GET", "/", {"Cookie": f"meshminer_token={token}"})[0] == 200


def test_writes_on_a_non_loopback_bind_need_the_token_and_change_nothing(
    public: LocalNode,
) -> None:
    before = (public.get("/api/v1/jobs"), public.get("/api/v1/status")["policy"])
    policy = json.dumps({"accepting": True}).encode()
    spec = b'--B\r\nContent-Disposition: form-data; name="spec"\r\n\r\nname = "x"\r\n--B--\r\n'
    writes = [
        ("PUT", "/api/v1/policy", {"Content-Type": "application/json"}, policy),
        ("POST", "/api/v1/capacity/refresh", {}, b""),
        ("POST", "/api/v1/jobs", {"Content-Type": "multipart/form-data; boundary=B"}, spec),
        ("POST", "/api/v1/jobs/0123456789abcdef/cancel", {}, b""),
    ]
    for method, path, headers, body in writes:
        for auth in ({}, {"Authorization": "Bearer " + "x" * 43}, {"Cookie": "meshminer_token=x"}):
            code, _, _ = _call(public, method, path, {**headers, **auth}, body)
            assert code == 401, (path, auth, code)
        # the token in a page of another origin (a leaked cookie) does not write either
        auth = {"Authorization": f"Bearer {public.token}", "Origin": "http://evil.example"}
        assert _call(public, method, path, {**headers, **auth}, body)[0] == 403, path
    assert (public.get("/api/v1/jobs"), public.get("/api/v1/status")["policy"]) == before


def test_a_refused_upload_leaves_no_file_behind(local: LocalNode) -> None:
    data = (
        b'--B\r\nContent-Disposition: form-data; name="spec"\r\n\r\nname = \r\n'
        b'--B\r\nContent-Disposition: form-data; name="data"; filename="d.csv"\r\n\r\n'
        b"1,2\r\n--B--\r\n"
    )
    before = local.get("/api/v1/jobs")
    code, _, body = _call(
        local, "POST", "/api/v1/jobs", {"Content-Type": "multipart/form-data; boundary=B"}, data
    )
    assert code == 400, body
    uploads = local.data_dir / "uploads"
    assert stat.S_IMODE(uploads.stat().st_mode) == 0o700
    assert list(uploads.iterdir()) == []
    assert local.get("/api/v1/jobs") == before


def test_hammering_ledger_verify_costs_one_run(local: LocalNode) -> None:
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _call(local, "GET", "/api/v1/ledger/verify"), range(40)))
    assert {code for code, _, _ in answers} == {200}
    runs = {json.loads(body)["checked_at"] for _, _, body in answers}
    assert len(runs) == 1, f"{len(runs)} verify runs for 40 requests"
    assert local.get("/api/v1/status")["peer_id"] == local.peer_id


def test_the_data_dir_and_its_secrets_are_for_this_user_only(local: LocalNode) -> None:
    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(local.data_dir) == 0o700
    assert mode(local.data_dir / "identity.key") == 0o600
    assert mode(local.data_dir / "api.token") == 0o600


def _run_node(data_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable, "-m", "node", "node", "run", "--data-dir", str(data_dir),
            "--listen", f"/ip4/127.0.0.1/tcp/{free_port()}",
            "--http", f"127.0.0.1:{free_port()}", "--no-mdns",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("content", "mode", "says"),
    [
        ("hunter2\n", 0o600, "needs at least 32"),
        ("", 0o600, "needs at least 32"),
        ("x" * 64, 0o640, "readable by other users"),
    ],
    ids=["short", "empty", "group-readable"],
)
def test_a_weak_token_file_stops_the_node_at_start(
    tmp_path: Path, content: str, mode: int, says: str
) -> None:
    data_dir = tmp_path / "weak"
    data_dir.mkdir(mode=0o755)
    token = data_dir / "api.token"
    token.write_text(content)
    token.chmod(mode)
    out = _run_node(data_dir)
    assert out.returncode == 2, out.stdout + out.stderr
    said = " ".join(out.stderr.split())  # the console wraps long lines
    assert says in said and "did not start" in said
    squeezed = "".join(said.split())  # a long path may be folded mid-name
    assert "Deletethefile" in squeezed or f"chmod600{token}" in squeezed
    assert token.read_text() == content  # left as it was
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700  # tightened on the way


def _cli(*args: str, data_dir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MESHMINER_TOKEN"}
    return subprocess.run(
        [sys.executable, "-m", "node", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "MESHMINER_DATA_DIR": str(data_dir), "COLUMNS": "200"},
    )


def test_the_cli_sends_its_own_nodes_token_and_only_to_this_machine(
    public: LocalNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = f"http://127.0.0.1:{public.http_port}"
    out = _cli("jobs", "--api", api, data_dir=public.data_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "jobs" in out.stdout
    out = _cli("jobs", "--api", api, data_dir=tmp_path)  # a data dir without a token
    assert out.returncode == 1 and "401" in out.stderr + out.stdout
    from node.cli import token_for

    monkeypatch.delenv("MESHMINER_TOKEN", raising=False)
    monkeypatch.setenv("MESHMINER_DATA_DIR", str(public.data_dir))
    assert token_for(api) == public.token
    assert token_for("http://node.example.org:8470") is None
    assert token_for("http://node.example.org:8470", "given") == "given"
