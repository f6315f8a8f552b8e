"""The project as a volunteer installs it: a wheel (`python -m build`), installed into
a fresh venv, runs a node outside the clone, with its status page's templates and
static files."""

from __future__ import annotations

import json
import signal
import site
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from node.demo.localnet import free_port, wait_for

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


def test_the_wheel_installs_into_a_fresh_venv_and_runs_a_node(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = dist.glob("meshminer-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    # the dependencies (torch, libp2p, ...) come from this test's environment, as a
    # path only: its own copy of meshminer (an editable install) is not imported
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(purelib, "deps-from-test-env.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "200"}
    where = subprocess.run(
        [str(python), "-c", "import node, node.web; print(node.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(purelib), where.stdout  # not the clone's copy

    http = free_port()
    data = tmp_path / "data"
    command = [str(venv / "bin" / "meshminer"), "node", "run", "--data-dir", str(data),
               "--http", f"127.0.0.1:{http}", "--listen", f"/ip4/127.0.0.1/tcp/{free_port()}",
               "--no-mdns"]  # fmt: skip
    log = (tmp_path / "node.log").open("w")
    node = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        api = f"http://127.0.0.1:{http}"
        status = wait_for(lambda: _status(api), 120, "the installed node's API")
        assert status["version"] and status["peer_id"].startswith("12D3KooW")
        page = _get(f"{api}/").decode()
        assert "This node" in page and status["peer_id"] in page  # a template rendered
        assert b"overflow-wrap" in _get(f"{api}/static/app.css")  # a static file
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(timeout=30)
        log.close()
    banner = (tmp_path / "node.log").read_text()
    assert f"data dir  {data}" in banner and "First start" in banner, banner[-2000:]


def _status(api: str) -> dict | None:
    try:
        return json.loads(_get(f"{api}/api/v1/status"))
    except OSError:
        return None
