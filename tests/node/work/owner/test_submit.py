"""Submitting jobs: every bad spec or upload gets a clear error and stores nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.client import submit_job
from node.demo.localnet import LocalNetwork, LocalNode, wait_for

pytestmark = pytest.mark.slow

GOOD = """
name = "ok"
mode = "single"
[model]
arch = "mlp"
hidden = [8]
[data]
source = "{source}"
label = "target"
[optim]
steps = 5
"""


def _post_json(node: LocalNode, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"{node.api}/api/v1/jobs",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _stored_blobs(node: LocalNode) -> list[Path]:
    return sorted(p for p in (node.data_dir / "blobs").rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalNode]:
    """One paused node for the whole module: refused submissions change nothing, so the
    cases cannot disturb each other (the one accepted job comes last)."""
    net = LocalNetwork(tmp_path_factory.mktemp("submit"), ["--not-accepting", "--cold-runners"])
    try:
        yield net.add()
    finally:
        net.stop()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            'name = "x"\nmode = "single"\n[model]\narch = "layers"\nlayers = [{type = "Evil"}]\n'
            '[data]\nsource = "builtin:digits"\n[optim]\nsteps = 5\n',
            "model.layers[0]",
        ),
        (
            'name = "x"\nmode = "single"\n[model]\narch = "mlp"\nhidden = [-4]\n'
            '[data]\nsource = "builtin:digits"\n[optim]\nsteps = 5\n',
            "model.hidden[0]",
        ),
        (
            'name = "x"\nmode = "single"\n[model]\narch = "mlp"\nhidden = [1000000, 1000000]\n'
            '[data]\nsource = "builtin:digits"\n[optim]\nsteps = 5\n',
            "parameters",
        ),
        (
            'name = "x"\nmode = "swarm"\n[model]\narch = "mlp"\n[data]\n'
            'source = "builtin:digits"\n[optim]\nsteps = 5\n',
            "mode",
        ),
        (GOOD.format(source="train.csv"), "upload it with the spec"),
        ("name = ", "not valid TOML"),
    ],
)
def test_bad_specs_are_refused_and_nothing_is_stored(
    node: LocalNode, spec: str, message: str
) -> None:
    code, body = _post_json(node, {"spec": spec})
    assert code == 400, body
    assert message in body["error"]
    assert node.get("/api/v1/jobs") == []
    assert _stored_blobs(node) == []
    assert node.get("/api/v1/status")["peer_id"] == node.peer_id  # still serving


def test_pickle_and_bad_data_uploads_are_refused(node: LocalNode, tmp_path: Path) -> None:
    pt = tmp_path / "data.pt"
    pt.write_bytes(b"\x80\x04\x95" + b"\x00" * 64)  # a pickle header
    from node.client import ApiError

    with pytest.raises(ApiError, match="pickle"):
        submit_job(node.api, GOOD.format(source="data.pt"), pt)
    garbage = tmp_path / "train.csv"
    garbage.write_text("a,b\n1,2\n")  # no 'target' column
    with pytest.raises(ApiError, match="target"):
        submit_job(node.api, GOOD.format(source="train.csv"), garbage)
    assert node.get("/api/v1/jobs") == []
    assert _stored_blobs(node) == []


def test_program_uploads_must_match_the_spec(node: LocalNode, tmp_path: Path) -> None:
    import torch

    from node.client import ApiError
    from tests.programs.export import export_pair, program_toml
    from tests.programs.models import ResNet

    export_pair(ResNet(width=4), (torch.randn(4, 1, 8, 8),), tmp_path)
    program = {"program": tmp_path / "model.pt2", "eval_program": tmp_path / "model.eval.pt2"}
    spec = program_toml("p", steps=5)
    cases = {
        "form field 'program'": (spec, {}),
        "form field 'eval_program'": (spec, {"program": program["program"]}),
        "'program', but the spec sets no model.program": (
            GOOD.format(source="builtin:digits"),
            program,
        ),
        "'eval_program', but the spec sets no model.eval_program": (
            spec.replace('eval_program = "model.eval.pt2"', ""),
            program,
        ),
        "'init', but the spec sets no model.init": (spec, {**program, "init": program["program"]}),
    }
    for message, (text, files) in cases.items():
        with pytest.raises(ApiError, match=message):
            submit_job(node.api, text, None, files=files)
    # the archive's own name, not where the upload was saved, in the refusal
    (tmp_path / "bad.pt2").write_bytes(b"not a zip")
    with pytest.raises(ApiError, match="model.pt2: not a torch.export archive"):
        submit_job(node.api, spec, None, files={**program, "program": tmp_path / "bad.pt2"})
    assert node.get("/api/v1/jobs") == []
    assert _stored_blobs(node) == []


def test_csv_upload_is_stored_as_a_blob_and_the_spec_rewritten(
    node: LocalNode, tmp_path: Path
) -> None:
    data = tmp_path / "train.csv"
    data.write_text("x1,x2,target\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(40)))
    job = submit_job(node.api, GOOD.format(source="train.csv"), data)
    assert job["state"] == "queued"
    assert job["spec"]["data"]["source"].startswith("blob:")
    assert len(_stored_blobs(node)) == 1
    # this node is paused and has no peers: the job waits and says why
    shown = wait_for(
        lambda: (j := node.get(f"/api/v1/jobs/{job['id']}"))["reason"] and j, 15, "the queue reason"
    )
    assert shown["state"] == "queued"
    assert "no peer fits" in shown["reason"] and "not accepting work" in shown["reason"]


def test_cli_refuses_data_outside_the_spec_folder(tmp_path: Path) -> None:
    outside = tmp_path / "secret.csv"
    outside.write_text("x,target\n1,0\n")
    spec_dir = tmp_path / "specs"
    spec_dir.mkdir()
    spec = spec_dir / "job.toml"
    spec.write_text(GOOD.format(source="../secret.csv"))
    out = subprocess.run(
        [sys.executable, "-m", "node", "submit", str(spec), "--api", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "outside" in out.stderr
