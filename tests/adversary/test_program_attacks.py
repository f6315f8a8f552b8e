"""Hostile programs against our reader, checker and dry run, in this process: every
attack is refused with an error naming what was found, before any of its ops runs,
and its payload (which `torch.export.load` would run) never runs.

The archives are the user's side (`convert_pt2` on an owner's node at submit,
`check_pt2` in `meshminer.export`); the programs are what a hostile owner hands a
volunteer (`decode_program` and `figures`, as the sandboxed runner calls them). The
same attacks against real nodes are in `test_program_attacks_nodes.py`.

Holes found while writing these tests (an eval graph's dry run, factory nodes without a
device, state no graph takes) are fixed, and their tests keep them fixed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hostile_archives import ARCHIVES, deviceless_arange, sample_inputs_pickle, unused_weight
from hostile_programs import (
    NODE_ATTACKS,
    PROGRAMS,
    Honest,
    code,
    command,
    deviceless_arange_node,
    export_honest,
    hostile_program,
    marker_pickle,
    marker_torch_save,
    symbolic_size_code,
    unused_state,
)

from training.program import (
    ProgramError,
    check_pt2,
    convert_pt2,
    decode_program,
    encode_program,
    figures,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Honest:
    return export_honest(tmp_path_factory.mktemp("honest"))


@pytest.fixture(scope="module")
def honest_program(honest: Honest) -> bytes:
    return encode_program(convert_pt2(honest.train, honest.eval))


def _refusal(call: object, *args: object) -> str:
    with pytest.raises(ProgramError) as caught:
        call(*args)  # type: ignore[operator]
    return str(caught.value)


def _figures_of(path: Path) -> object:
    """What the volunteer's runner does with a program blob before any real op."""
    return figures(decode_program(path))


# -- controls: the honest files pass, and the payloads are live -------------------------------


def test_the_honest_archive_converts_and_its_program_decodes(
    honest: Honest, honest_program: bytes, tmp_path: Path
) -> None:
    """The refusals below are about the attacks, not about how the files are built."""
    assert check_pt2(honest.train) == [] and check_pt2(honest.eval) == []
    path = tmp_path / "program.safetensors"
    path.write_bytes(honest_program)
    program = decode_program(path)
    assert figures(program) == figures(convert_pt2(honest.train, honest.eval))
    assert encode_program(program) == honest_program


LIVE_UNDER_TORCH = {
    "sample inputs pickle": sample_inputs_pickle,
    **{
        name: ARCHIVES[name][0]
        for name in ("use_pickle weights", "opaque object", "code in a symbolic size")
    },
}


@pytest.mark.parametrize("name", LIVE_UNDER_TORCH)
def test_the_payloads_are_live(honest: Honest, tmp_path: Path, name: str) -> None:
    """`torch.export.load` runs these archives' payloads (the marker appears), so the
    absence of the marker after our reader refused them means something."""
    marker = tmp_path / "marker"
    hostile = LIVE_UNDER_TORCH[name](honest.train, tmp_path / "hostile", marker)
    with contextlib.suppress(Exception):  # it may fail after the payload ran
        torch.export.load(hostile)
    assert marker.exists(), f"torch.export.load did not run the {name} payload"


def test_the_payload_kinds_are_live(tmp_path: Path) -> None:
    """Each kind of payload the builders plant creates its marker when run."""
    pickle.loads(marker_pickle(tmp_path / "pickle"))
    torch.load(io.BytesIO(marker_torch_save(tmp_path / "torch")), weights_only=False)
    exec(code(tmp_path / "code"))
    assert os.system(command(tmp_path / "command")) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"pickle", "torch", "code", "command"}


# -- archives (the owner's submit, meshminer.export's check) ----------------------------------


def _archive_cases() -> list[object]:
    cases = []
    for name in ARCHIVES:
        for which in ("train", "eval"):
            marks: list = []
            cases.append(pytest.param(name, which, id=f"{name} [{which}]", marks=marks))
    return cases


@pytest.mark.parametrize(("name", "which"), _archive_cases())
def test_a_hostile_archive_is_refused_naming_what_it_found(
    honest: Honest, tmp_path: Path, name: str, which: str
) -> None:
    """`convert_pt2` (the owner's submit) refuses the train or the eval export."""
    builder, expected = ARCHIVES[name]
    marker = tmp_path / "marker"
    hostile = builder(getattr(honest, which), tmp_path / "hostile", marker)
    pair = (hostile, honest.eval) if which == "train" else (honest.train, hostile)
    message = _refusal(convert_pt2, *pair)
    assert expected in message, message
    assert not marker.exists()


@pytest.mark.parametrize(("name", "which"), [(n, w) for n in ARCHIVES for w in ("train", "eval")])
def test_check_pt2_lists_what_a_hostile_archive_holds(
    honest: Honest, tmp_path: Path, name: str, which: str
) -> None:
    """`check_pt2` (the user's own check, before anything is sent) says the same."""
    builder, expected = ARCHIVES[name]
    marker = tmp_path / "marker"
    found = check_pt2(builder(getattr(honest, which), tmp_path / "hostile", marker))
    assert found and any(expected in problem for problem in found), found
    assert not marker.exists()


def test_the_sample_inputs_pickle_never_runs_nor_reaches_a_volunteer(
    honest: Honest, honest_program: bytes, tmp_path: Path
) -> None:
    """The entry is in every honest archive and is never opened: the archive converts,
    the payload never runs, and the program a volunteer receives is byte for byte the
    honest archive's (no sample inputs, nothing of the pickle)."""
    marker = tmp_path / "marker"
    hostile = sample_inputs_pickle(honest.train, tmp_path / "hostile", marker)
    assert check_pt2(hostile) == []
    program = encode_program(convert_pt2(hostile, honest.eval))
    assert program == honest_program
    path = tmp_path / "program.safetensors"
    path.write_bytes(program)
    assert encode_program(decode_program(path)) == honest_program
    assert str(marker).encode() not in program and b"Touch" not in program
    assert not marker.exists()


# -- programs (what a hostile owner sends a volunteer) ----------------------------------------


def _program_cases() -> list[object]:
    cases = [pytest.param(name, "train", id=f"{name} [train]") for name in PROGRAMS]
    for name in NODE_ATTACKS:
        marks: list = []
        cases.append(pytest.param(name, "eval", id=f"{name} [eval]", marks=marks))
    return cases


@pytest.mark.parametrize(("name", "which"), _program_cases())
def test_a_hostile_program_is_refused_before_any_op_runs(
    honest_program: bytes, tmp_path: Path, name: str, which: str
) -> None:
    """`decode_program` and the `meta` dry run (`figures`) refuse it, as the sandboxed
    runner calls them before the first real op."""
    marker = tmp_path / "marker"
    if which == "train":
        builder, expected = PROGRAMS[name]
        data = builder(honest_program, marker)
    else:
        attack, expected = NODE_ATTACKS[name]
        data = hostile_program(honest_program, attack, marker, "eval")
    path = tmp_path / "program.safetensors"
    path.write_bytes(data)
    message = _refusal(_figures_of, path)
    assert expected in message, message
    assert not marker.exists()


def test_a_hostile_program_changes_only_its_header(honest_program: bytes, tmp_path: Path) -> None:
    """The builders change what they say and nothing else: an edit that changes
    nothing gives back the honest bytes, and one attack changes only the graph."""
    from hostile_programs import program_layout, rewrite_program

    assert rewrite_program(honest_program, lambda layout, tensors: None) == honest_program
    hostile = hostile_program(honest_program, symbolic_size_code, tmp_path / "marker")
    before, after = program_layout(honest_program), program_layout(hostile)
    assert before["aliases"] == after["aliases"]
    assert before["graphs"]["eval"] == after["graphs"]["eval"]
    assert before["graphs"]["train"] != after["graphs"]["train"]


# -- holes found (xfail: each says what happens instead) --------------------------------------


@pytest.mark.parametrize("where", ["archive", "check_pt2", "program"])
def test_state_that_no_graph_takes_is_refused_by_name(
    honest: Honest, honest_program: bytes, tmp_path: Path, where: str
) -> None:
    if where == "program":
        path = tmp_path / "program.safetensors"
        path.write_bytes(unused_state(honest_program, tmp_path / "marker"))
        assert "'hook'" in _refusal(_figures_of, path)
        return
    hostile = unused_weight(honest.train, tmp_path / "hostile", tmp_path / "marker")
    if where == "check_pt2":
        assert any("'hook'" in problem for problem in check_pt2(hostile))
    else:
        assert "'hook'" in _refusal(convert_pt2, hostile, honest.eval)


_CAPPED = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    from training.program import ProgramError, convert_pt2, decode_program, figures

    train, evaluation, hostile = (Path(p) for p in sys.argv[1:4])
    convert_pt2(train, evaluation)  # every lazy import done before the cap
    vm = next(int(line.split()[1]) for line in open("/proc/self/status")
              if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
    try:
        if sys.argv[4] == "program":
            figures(decode_program(hostile))
        else:
            convert_pt2(hostile, evaluation)
        print(json.dumps({"accepted": True}))
    except ProgramError as exc:
        print(json.dumps({"refused": str(exc)}))
    """
)


@pytest.mark.parametrize("kind", ["archive", "program"])
@pytest.mark.process
def test_a_factory_node_without_a_device_still_allocates_nothing(
    honest: Honest, honest_program: bytes, tmp_path: Path, kind: str
) -> None:
    """Run in a child capped at 1 GiB of address space above its start, so that a real
    allocation fails at once on any machine (whatever its overcommit setting)."""
    marker = tmp_path / "marker"
    if kind == "program":
        hostile = tmp_path / "program.safetensors"
        hostile.write_bytes(hostile_program(honest_program, deviceless_arange_node, marker))
    else:
        hostile = deviceless_arange(honest.train, tmp_path / "hostile", marker)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _CAPPED, str(honest.train), str(honest.eval), str(hostile), kind],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert "makes a tensor of 1,000,000,000,000 elements" in answer.get("refused", ""), answer
    assert not marker.exists()
