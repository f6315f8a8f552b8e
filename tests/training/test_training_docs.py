"""docs/jobspec.md stays true: its examples parse and validate, its figures hold, and
its layer table lists exactly the allow-list."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from training.budget import validate_for_submit
from training.model.layers import LAYER_TYPES
from training.spec.job import load_spec

DOC = Path(__file__).resolve().parents[2] / "docs" / "jobspec.md"


def examples() -> dict[str, str]:
    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(), flags=re.S)
    return {re.search(r'^name = "(.*)"', block, re.M).group(1): block for block in blocks}


def test_every_example_validates(tmp_path: Path) -> None:
    (tmp_path / "corpus.txt").write_text("To be, or not to be, that is the question. " * 40)
    (tmp_path / "houses.csv").write_text(
        "rooms,area,price\n" + "".join(f"{i % 5},{50 + i},{1000.0 + i}\n" for i in range(40))
    )
    for k in range(4):  # the sharded example's token ids
        (np.arange(2000) % 256).astype(np.uint16).tofile(tmp_path / f"part-{k:03d}.bin")
    summaries = {}
    for name, text in examples().items():
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        summaries[name] = validate_for_submit(load_spec(path), None)
    assert set(summaries) == {
        "digits-mlp",
        "digits-cnn",
        "digits-elastic",
        "digits-sweep",
        "tiny-shakespeare-lm",
        "digits-layers",
        "houses",
        "sharded-lm",
    }
    assert summaries["digits-mlp"].parameters == 17226
    assert summaries["digits-cnn"].parameters == 6090
    assert summaries["digits-cnn"].total_steps == 10 * 22
    assert summaries["houses"].task == "regression"


def test_the_layer_table_covers_the_allow_list() -> None:
    text = DOC.read_text()
    table = text[text.index("| type | arguments") : text.index("A layer whose kernel")]
    rows = [line.split("|")[1] for line in table.splitlines()[2:] if line.startswith("|")]
    documented = {name for row in rows for name in re.findall(r"`(\w+)`", row)}
    assert documented == set(LAYER_TYPES)
