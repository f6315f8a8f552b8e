"""The HTTP API and the CLI against one real node process."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from node.demo.localnet import LocalNetwork, LocalNode, free_port, wait_for

pytestmark = pytest.mark.slow


def _request(node: LocalNode, method: str, path: str, token: str | None = None):
    req = urllib.request.Request(
        f"{node.api}{path}", method=method, data=b"" if method != "GET" else None
    )
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "node", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


def test_status_peers_metrics_and_errors(localnet: LocalNetwork) -> None:
    node = localnet.add()
    status = node.get("/api/v1/status")
    assert status["peer_id"] == node.peer_id
    assert status["addrs"] == [f"/ip4/127.0.0.1/tcp/{node.p2p_port}/p2p/{node.peer_id}"]
    assert status["capacity"]["tflops"] > 0
    assert status["capacity"]["gpus"][0]["kind"] in ("cpu", "cuda")
    assert status["capacity"]["torch_version"]
    assert status["uptime_s"] >= 0 and status["version"]
    assert node.get("/api/v1/peers") == []

    code, body = _request(node, "GET", "/api/v1/nope")
    assert code == 404
    assert "no such endpoint" in json.loads(body)["error"]

    code, body = _request(node, "GET", "/metrics")
    assert code == 200 and b"meshminer_peers 0.0" in body

    # loopback bind: writes need no token
    code, body = _request(node, "POST", "/api/v1/capacity/refresh")
    assert code == 200, body
    assert json.loads(body)["tflops"] > 0


def test_writes_need_the_token_when_not_bound_to_loopback(localnet: LocalNetwork) -> None:
    node = localnet.add(http_host="0.0.0.0")
    assert node.get("/api/v1/status")["peer_id"]  # with the token

    code, body = _request(node, "POST", "/api/v1/capacity/refresh")
    assert code == 401
    assert "api.token" in json.loads(body)["error"]
    code, _ = _request(node, "POST", "/api/v1/capacity/refresh", token="wrong")
    assert code == 401

    token = (node.data_dir / "api.token").read_text().strip()
    code, body = _request(node, "POST", "/api/v1/capacity/refresh", token=token)
    assert code == 200, body


def test_cli_status_and_peers(localnet: LocalNetwork) -> None:
    first, second = localnet.start(2)
    localnet.wait_all_see_each_other(timeout=15)
    cost = wait_for(  # two samples 5 s apart, with the peer's 1 s refresh between them
        lambda: (d := first.get("/api/v1/status")["discovery"]).get("ads_in") and d,
        20,
        "a minute's discovery figures",
    )
    assert cost["ads_out"] > 0 and cost["bytes_in"] > 0 and cost["check_cpu_ms"] > 0
    assert 0 < cost["node_cpu_pct"] < 200
    code, body = _request(first, "GET", "/metrics")
    metrics = body.decode()
    assert 'meshminer_discovery_messages_total{direction="in",kind="ad"}' in metrics
    assert "meshminer_discovery_check_cpu_seconds_total" in metrics
    assert "process_cpu_seconds_total" in metrics
    out = _cli("status", "--api", first.api)
    assert out.returncode == 0, out.stderr
    assert first.peer_id in out.stdout and "TFLOP/s" in out.stdout
    assert "ads/min in" in out.stdout
    out = _cli("peers", "--api", first.api)
    assert out.returncode == 0, out.stderr
    assert "1 peers" in out.stdout and second.peer_id[:8] in out.stdout


def test_cli_says_how_to_start_a_node_when_none_runs() -> None:
    out = _cli("status", "--api", f"http://127.0.0.1:{free_port()}")
    assert out.returncode == 1
    assert "no meshminer node is answering" in out.stderr
    assert "meshminer node run" in out.stderr


def _put_json(node: LocalNode, path: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"{node.api}{path}", data=body, method="PUT", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_policy_and_job_endpoints_refuse_bad_input(localnet: LocalNetwork) -> None:
    node = localnet.add()
    before = node.get("/api/v1/status")["policy"]
    for body, message in [
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"acepting": false}', "unknown preference 'acepting'"),
        (b'{"accepting": "no"}', "accepting must be true or false"),
        (b'{"hours": "late"}', "is not a window like"),
        (b'{"gpus": [0, 0]}', "gpus lists a device twice"),
        (b'{"idle_minutes": -1}', "idle_minutes must be 0..1440"),
        (b'{"deny_owners": ["me"]}', "is not a peer id"),
        (b'{"load_limit_pct": 150}', "load_limit_pct"),
        (b'{"max_gpu_memory_share": 0}', "max_gpu_memory_share"),
        (b'{"accepting": false, "running": "later"}', "'running' must be"),
    ]:
        code, answer = _put_json(node, "/api/v1/policy", body)
        assert code == 400, (body, answer)
        assert message in answer["error"], (body, answer)
    assert node.get("/api/v1/status")["policy"] == before  # nothing changed
    assert node.get("/api/v1/status")["preferences"]["hours"] == ""
    assert not (node.data_dir / "preferences.json").exists()

    code, answer = _put_json(node, "/api/v1/policy", b'{"accepting": false}')
    assert code == 200 and answer["accepting"] is False
    assert node.get("/api/v1/status")["policy"]["accepting"] is False
    owner = node.peer_id  # any valid peer id
    body = json.dumps({"gpus": "0, 1", "deny_owners": [owner], "daily_gpu_hours": 2})
    code, answer = _put_json(node, "/api/v1/policy", body.encode())
    assert code == 200 and answer["gpus"] == [0, 1] and answer["deny_owners"] == [owner]
    saved = node.data_dir / "preferences.json"
    assert json.loads(saved.read_text()) == {
        "accepting": False, "gpus": [0, 1], "deny_owners": [owner], "daily_gpu_hours": 2.0
    }  # fmt: skip
    assert saved.stat().st_mode & 0o777 == 0o600
    timeline = [e["note"] for e in node.get("/api/v1/status")["timeline"]]
    assert timeline[-1] == f"set daily_gpu_hours to 2.0, gpus to [0, 1], deny_owners to {[owner]!r}"

    for method, path in [
        ("GET", "/api/v1/jobs/0123456789abcdef"),
        ("GET", "/api/v1/jobs/0123456789abcdef/weights"),
        ("POST", "/api/v1/jobs/0123456789abcdef/cancel"),
        ("GET", "/api/v1/jobs/../../etc/passwd"),
    ]:
        code, body = _request(node, method, path)
        assert code == 404, (path, body)
        assert "error" in json.loads(body)
    code, body = _request(node, "POST", "/api/v1/jobs")  # no body, wrong type
    assert code == 415 and "multipart/form-data" in json.loads(body)["error"]
    assert node.get("/api/v1/jobs") == []
