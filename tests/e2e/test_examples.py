"""The examples in `examples/`, run as a user runs them, against real nodes: a GPT on a
text file in elastic mode, a ResNet on image arrays, and a fine-tune of its head."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from node.demo.localnet import ONE_THREAD, LocalNetwork

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str, *args: str, cwd: Path) -> str:
    env = {
        **os.environ,
        **ONE_THREAD,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_the_examples_train_through_the_network(localnet: LocalNetwork, tmp_path: Path) -> None:
    owner = localnet.add(["--not-accepting"])
    localnet.add_many(2)
    localnet.wait_all_see_each_other(timeout=30)

    text = tmp_path / "corpus.txt"
    text.write_text((EXAMPLES.parent / "README.md").read_text()[:20000])
    gpt = _run(
        "gpt_elastic.py",
        "--text",
        str(text),
        "--tiny",
        "--workers",
        "2",
        "--rounds",
        "2",
        "--inner-steps",
        "5",
        "--api",
        owner.api,
        cwd=tmp_path,
    )
    assert "validation loss by round:" in gpt and "sample:" in gpt

    resnet = _run(
        "resnet_images.py",
        "--steps",
        "60",
        "--out",
        str(tmp_path / "resnet.safetensors"),
        "--api",
        owner.api,
        cwd=tmp_path,
    )
    assert (tmp_path / "resnet.safetensors").is_file() and "accuracy on all digits" in resnet

    tune = _run(
        "finetune_head.py",
        "--init",
        str(tmp_path / "resnet.safetensors"),
        "--steps",
        "30",
        "--api",
        owner.api,
        cwd=tmp_path,
    )
    assert "trained 330 parameters: ['fc.weight', 'fc.bias']" in tune
