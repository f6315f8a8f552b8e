"""The capacity cache: a node's first start measures and imports torch; a restart on the
same machine reads the cache and does neither (nor does anything else the daemon
imports: torch costs a node 2.5 s of CPU at start and memory it never uses); a changed
machine or a bad cache file means measuring again, never an error. A first start
measures in a process of its own, so the daemon never imports torch for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from processes import torch_mapped

from node.client import submit_job
from node.demo.localnet import LocalNetwork
from node.machine.capacity import (
    CACHE_FILE,
    LocalCapacity,
    local_capacity,
    measure_elsewhere,
    measured_capacity,
)
from training.spec.examples import digits_toml

pytestmark = pytest.mark.process  # each test starts a fresh interpreter

READ_IN_A_FRESH_INTERPRETER = """
import json, sys
from pathlib import Path
import node.daemon, node.cli.app
import training.evidence.steps  # what the owner's loop computes a unit's checkpoints with
from node.machine.capacity import local_capacity
c = local_capacity(Path(sys.argv[1]))
print(json.dumps({"torch_imported": "torch" in sys.modules, "tflops": c.tflops,
                  "torch_version": c.torch_version, "cuda_version": c.cuda_version,
                  "determinism": c.determinism, "device": c.gpus[0].kind}))
"""


def _fresh_read(data_dir: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", READ_IN_A_FRESH_INTERPRETER, str(data_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LocalCapacity]:
    data_dir = tmp_path_factory.mktemp("capacity")
    return data_dir, local_capacity(data_dir)


def test_a_restart_reads_the_cache_without_importing_torch(
    measured: tuple[Path, LocalCapacity],
) -> None:
    data_dir, first = measured
    assert first.tflops > 0 and first.torch_version and first.determinism
    again = _fresh_read(data_dir)
    assert again == {
        "torch_imported": False,
        "tflops": first.tflops,
        "torch_version": first.torch_version,
        "cuda_version": first.cuda_version,
        "determinism": first.determinism,
        "device": first.gpus[0].kind,
    }


@pytest.mark.parametrize(
    "change",
    [
        lambda d: {**d, "fingerprint": "another machine"},
        lambda d: {**d, "tflops": "fast"},
        lambda d: {**d, "determinism": "x" * 201},
        lambda d: [d],
    ],
    ids=["other machine", "not a number", "too long", "not an object"],
)
def test_a_cache_that_does_not_fit_is_measured_again(
    measured: tuple[Path, LocalCapacity], tmp_path: Path, change
) -> None:
    cached = json.loads((measured[0] / CACHE_FILE).read_text())
    (tmp_path / CACHE_FILE).write_text(json.dumps(change(cached)))
    result = _fresh_read(tmp_path)
    assert result["torch_imported"] and result["tflops"] > 0
    rewritten = json.loads((tmp_path / CACHE_FILE).read_text())
    assert rewritten["fingerprint"] == cached["fingerprint"]
    assert rewritten["measured_at"] > cached["measured_at"]


def test_garbage_in_the_cache_file_is_measured_over(tmp_path: Path) -> None:
    (tmp_path / CACHE_FILE).write_bytes(b"\xff\x00{not json")
    assert local_capacity(tmp_path).tflops > 0
    assert json.loads((tmp_path / CACHE_FILE).read_text())["tflops"] > 0


MEASURE_ELSEWHERE_IN_A_FRESH_INTERPRETER = """
import json, sys
from pathlib import Path
import node.daemon, node.cli.app
from node.machine.capacity import measure_elsewhere, measured_capacity
measuring = measure_elsewhere(Path(sys.argv[1]))
c = measured_capacity(Path(sys.argv[1]), measuring)
print(json.dumps({"measured_elsewhere": measuring is not None, "tflops": c.tflops,
                  "determinism": c.determinism, "torch_imported": "torch" in sys.modules}))
"""


def test_a_first_start_measures_in_a_process_of_its_own(tmp_path: Path) -> None:
    """The daemon starts the measurement before its own imports and never imports
    torch: the measuring process writes the cache, the daemon reads it."""
    data_dir = tmp_path / "new-node"  # not there yet: the measurement makes it
    out = subprocess.run(
        [sys.executable, "-c", MEASURE_ELSEWHERE_IN_A_FRESH_INTERPRETER, str(data_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    first = json.loads(out.stdout)
    assert first["measured_elsewhere"] and not first["torch_imported"]
    assert first["tflops"] > 0 and first["determinism"]
    assert json.loads((data_dir / CACHE_FILE).read_text())["tflops"] == first["tflops"]
    assert measure_elsewhere(data_dir) is None  # cached: nothing to measure
    again = measure_elsewhere(data_dir, refresh=True)
    assert again is not None and again.wait(timeout=120) == 0


def test_a_measurement_elsewhere_that_fails_is_made_here(tmp_path: Path) -> None:
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    capacity = measured_capacity(tmp_path, failed)
    assert capacity.tflops > 0
    assert json.loads((tmp_path / CACHE_FILE).read_text())["tflops"] == capacity.tflops


def test_a_started_node_and_a_submitted_job_leave_torch_out_of_the_daemon(
    localnet: LocalNetwork,
) -> None:
    """A first start measures elsewhere, and a plain spec's submit reads no model: the
    daemon maps no torch library (a submit once imported torch there, 3.5 s on a busy
    machine before the job was queued)."""
    node = localnet.add(["--not-accepting"])
    job = submit_job(node.api, digits_toml(steps=3, hidden=(8,)), None)
    assert job["state"] == "queued"
    assert node.proc is not None and not torch_mapped(node.proc.pid)
