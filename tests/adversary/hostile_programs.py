"""Hostile programs, built as an attacker would build them: payloads, the honest
export every variant starts from, the node-level attacks, and hostile meshminer
programs (what a hostile owner hands a volunteer directly, never through conversion).
`hostile_archives.py` builds the hostile `.pt2` archives from the same pieces.

Every payload here is live: run the way `torch.export.load` (or a careless reader)
would run it, it creates the marker file the builder was given
(`test_program_attacks.py`: `test_the_payload_kinds_are_live` for each kind, and
`test_the_payloads_are_live` under `torch.export.load` itself). A test that finds no
marker after our reader refused the file therefore knows the payload never ran, not
merely that it was harmless.

A node-level attack (`NODE_ATTACKS`) edits torch's serialized graph in place; the same
edit applies to a `.pt2`'s `models/model.json` (`graph_module`) and to a program's
`graphs.train` or `graphs.eval`, because a program keeps that structure, stripped.
"""

from __future__ import annotations

import io
import json
import pathlib
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.model.weights import weights_bytes

Graph = dict[str, Any]  # torch's serialized graph_module (archive) or a program's graph
ENOUGH = 10**12  # elements: 3.6 TiB as float32, far past the dry run's 16 GiB limit


# -- payloads that would create the marker if anything ran them -------------------------


class Touch:
    """Unpickling this calls `pathlib.Path.touch(marker)`: what a pickle anywhere in a
    stranger's file can do (any callable, any arguments)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def code(marker: Path) -> str:
    """Python source that creates the marker (what `exec`/`eval`/`sympify` would run)."""
    return f"__import__('pathlib').Path({str(marker)!r}).touch()"


def command(marker: Path) -> str:
    """A shell command that creates the marker (what `os.system` would run)."""
    return f"touch {marker}"


def marker_pickle(marker: Path) -> bytes:
    """A plain pickle (`pickle.loads` runs it: opaque objects, `torch.load` of old files)."""
    return pickle.dumps(Touch(marker), protocol=4)


def marker_torch_save(marker: Path) -> bytes:
    """`torch.save`'s zip around the payload (`torch.load(..., weights_only=False)` runs
    it: what `torch.export.load` does with sample inputs and `use_pickle` weights)."""
    buffer = io.BytesIO()
    torch.save(Touch(marker), buffer)
    return buffer.getvalue()


# -- the honest starting point ------------------------------------------------------------


@dataclass(frozen=True)
class Honest:
    """An honest export pair (train mode, eval mode) of a small ResNet with BatchNorm."""

    train: Path
    eval: Path


def export_honest(folder: Path) -> Honest:
    """Export `ResNet(width=4)` twice, as a user would (dynamic batch, min 2)."""
    from programs.models import ResNet

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = ResNet(width=4)
    sample = (torch.randn(2, 1, 8, 8),)
    dynamic = ({0: torch.export.Dim("batch", min=2)},)
    paths = Honest(folder / "model.pt2", folder / "model.eval.pt2")
    for path, train in ((paths.train, True), (paths.eval, False)):
        model.train(train)
        torch.export.save(torch.export.export(model, sample, dynamic_shapes=dynamic), path)
    return paths


# -- node-level attacks: shared by archives and programs ----------------------------------


def _arg(name: str, value: dict[str, Any], kind: int = 1) -> dict[str, Any]:
    return {"name": name, "arg": value, "kind": kind}  # kind 1 positional, 2 keyword


def _retarget(graph: Graph, target: str, inputs: list[dict[str, Any]]) -> None:
    """Node 0 calls `target` instead; its output keeps its name, so the rest still fits."""
    node = graph["graph"]["nodes"][0]
    node["target"] = target
    node["inputs"] = inputs


def from_file_node(graph: Graph, marker: Path) -> None:
    """`aten.from_file` reads any file into a tensor (here the host's name)."""
    _retarget(
        graph,
        "torch.ops.aten.from_file.default",
        [
            _arg("filename", {"as_string": "/etc/hostname"}),
            _arg("shared", {"as_bool": False}),
            _arg("size", {"as_int": 64}),
            _arg("dtype", {"as_scalar_type": 1}, kind=2),
        ],
    )


def os_system_node(graph: Graph, marker: Path) -> None:
    """A target naming `os.system`, as a reader that resolved targets by name would call."""
    _retarget(graph, "os.system", [_arg("command", {"as_string": command(marker)})])


def torch_os_system_node(graph: Graph, marker: Path) -> None:
    """`torch.os.system`: `os` reached through torch's own module attributes."""
    _retarget(graph, "torch.os.system", [_arg("command", {"as_string": command(marker)})])


def evil_namespace_node(graph: Graph, marker: Path) -> None:
    """An operator in a namespace nobody registered (a custom op library's would be)."""
    _retarget(
        graph,
        "torch.ops.evil.run.default",
        [
            _arg("command", {"as_string": command(marker)}),
        ],
    )


def _rename(value: Any, old: str, new: str) -> None:
    """Every `"name": old` in the structure (definitions and uses) becomes `new`."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "name" and item == old:
                value[key] = new
            else:
                _rename(item, old, new)
    elif isinstance(value, list):
        for item in value:
            _rename(item, old, new)


def code_name_node(graph: Graph, marker: Path) -> None:
    """Node 0's output (and every use of it) is named by code: a reader that built
    Python source from names (as torch's codegen does) would run it."""
    old = graph["graph"]["nodes"][0]["outputs"][0]["as_tensor"]["name"]
    _rename(graph["graph"], old, code(marker))


def undefined_name_node(graph: Graph, marker: Path) -> None:
    """Node 0 reads a tensor no input and no node defines."""
    node = graph["graph"]["nodes"][0]
    first = next(a for a in node["inputs"] if "as_tensor" in a["arg"])
    first["arg"] = {"as_tensor": {"name": "never_defined_anywhere"}}


def huge_arange_node(graph: Graph, marker: Path, *, device: bool = True) -> None:
    """An `arange` of 10^12 float32 elements whose sum is added to the output (so it is
    used): 3.6 TiB, and only the dry run's size check stands between it and a real run.
    With `device`, the node names a device as `torch.export` always writes it."""
    body = graph["graph"]
    inputs = [_arg("end", {"as_int": ENOUGH}), _arg("dtype", {"as_scalar_type": 7}, kind=2)]
    if device:
        inputs.append(_arg("device", {"as_device": {"type": "cpu", "index": None}}, kind=2))
    output = body["outputs"][0]["as_tensor"]["name"]
    body["nodes"] += [
        {
            "target": "torch.ops.aten.arange.default",
            "inputs": inputs,
            "outputs": [{"as_tensor": {"name": "huge"}}],
        },
        {
            "target": "torch.ops.aten.sum.default",
            "inputs": [_arg("self", {"as_tensor": {"name": "huge"}})],
            "outputs": [{"as_tensor": {"name": "huge_sum"}}],
        },
        {
            "target": "torch.ops.aten.add.Tensor",
            "inputs": [
                _arg("self", {"as_tensor": {"name": output}}),
                _arg("other", {"as_tensor": {"name": "huge_sum"}}),
            ],
            "outputs": [{"as_tensor": {"name": "with_huge"}}],
        },
    ]
    body["outputs"][0]["as_tensor"]["name"] = "with_huge"
    for spec in graph["signature"]["output_specs"]:
        if "user_output" in spec:
            spec["user_output"]["arg"]["as_tensor"]["name"] = "with_huge"


def deviceless_arange_node(graph: Graph, marker: Path) -> None:
    """The same `arange` without a device argument (aten then defaults to the CPU)."""
    huge_arange_node(graph, marker, device=False)


def symbolic_size_code(graph: Graph, marker: Path) -> None:
    """The user input's batch size is code instead of a symbol (`torch.export.load`
    hands these strings to `sympify`, which evaluates them)."""
    (user,) = (s["user_input"] for s in graph["signature"]["input_specs"] if "user_input" in s)
    sizes = graph["graph"]["tensor_values"][user["arg"]["as_tensor"]["name"]]["sizes"]
    sizes[0] = {"as_expr": {"expr_str": code(marker), "hint": {"as_int": 2}}}


# (attack, what the refusal must say)
NODE_ATTACKS: dict[str, tuple[Callable[[Graph, Path], None], str]] = {
    "from_file node": (from_file_node, "'aten.from_file.default': not on the allow-list"),
    "os.system target": (os_system_node, "namespace 'os' is not accepted"),
    "torch.os.system target": (torch_os_system_node, "namespace 'torch' is not accepted"),
    "unregistered namespace": (evil_namespace_node, "namespace 'evil' is not accepted"),
    "name holding code": (code_name_node, "is not an identifier"),
    "undefined name": (undefined_name_node, "'never_defined_anywhere' is used before it is"),
    "10^12-element arange": (huge_arange_node, "makes a tensor of 1,000,000,000,000 elements"),
    "code in a symbolic size": (symbolic_size_code, "is not a plain symbol"),
}


# -- hostile meshminer programs ------------------------------------------------------------


def program_parts(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A program file's tensors and its `__metadata__` (the header JSON, read by hand)."""
    from safetensors.torch import load

    (length,) = struct.unpack_from("<Q", data)
    return load(data), json.loads(data[8 : 8 + length])["__metadata__"]


def program_layout(data: bytes) -> dict[str, Any]:
    """The program's `{"graphs", "aliases", "persistent"}` (its `program` metadata)."""
    return json.loads(program_parts(data)[1]["program"])


ProgramEdit = Callable[[dict[str, Any], dict[str, torch.Tensor]], None]


def rewrite_program(data: bytes, edit: ProgramEdit) -> bytes:
    """The program with `edit` applied to its layout and tensors, written as
    `encode_program` writes a program (so only the edit differs)."""
    tensors, metadata = program_parts(data)
    layout = json.loads(metadata["program"])
    edit(layout, tensors)
    text = json.dumps(layout, sort_keys=True, separators=(",", ":"))
    return weights_bytes(tensors, {**metadata, "program": text})


def hostile_program(
    honest: bytes, attack: Callable[[Graph, Path], None], marker: Path, graph: str = "train"
) -> bytes:
    """`honest` with a node-level `attack` applied to its `graph` ("train" or "eval")."""
    return rewrite_program(honest, lambda layout, _: attack(layout["graphs"][graph], marker))


def third_graph(honest: bytes, marker: Path) -> bytes:
    """A graph beside train and eval (holding code in a name), which a reader that
    ran every graph it found would run."""

    def edit(layout: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        layout["graphs"]["hook"] = json.loads(json.dumps(layout["graphs"]["train"]))
        code_name_node(layout["graphs"]["hook"], marker)

    return rewrite_program(honest, edit)


def unused_state(honest: bytes, marker: Path) -> bytes:
    """A tensor under a state name that no graph takes as an input."""

    def edit(layout: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        layout["aliases"]["hook"] = "hook"
        tensors["hook"] = torch.zeros(4)

    return rewrite_program(honest, edit)


def _on_train(attack: Callable[[Graph, Path], None]) -> Callable[[bytes, Path], bytes]:
    def build(honest: bytes, marker: Path) -> bytes:
        return hostile_program(honest, attack, marker)

    build.__doc__ = attack.__doc__
    return build


# name -> (builder(honest program bytes, marker) -> hostile bytes, what the refusal says)
PROGRAMS: dict[str, tuple[Callable[[bytes, Path], bytes], str]] = {
    **{name: (_on_train(attack), text) for name, (attack, text) in NODE_ATTACKS.items()},
    "a third graph": (third_graph, "a program holds a train graph and optionally an eval graph"),
}
