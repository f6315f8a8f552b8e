"""A meshminer program: the checked graphs (train, and eval when the model has modes)
and the initial state, in one deterministic safetensors file.

This is all a volunteer ever receives of a user's model. The file is written by
`training.model.weights` (sorted, byte-for-byte reproducible) with the graphs as JSON in its
metadata: torch's graph schema cut down to nodes (target, arguments, outputs), inputs,
outputs and the signature, without stack traces, module paths, guards, range
constraints or sample inputs. Reading it goes through `check_graph` again, so a
hostile owner's hand-made program meets the same rules as a user's archive.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from training.program.archive import Archive
from training.program.errors import ProgramError
from training.program.graph import Graph, check_graph

PROGRAM_FORMAT = "meshminer.program/1"
MAX_PROGRAM_JSON = 64 * 2**20


@dataclass(frozen=True)
class Program:
    train: Graph
    eval: Graph | None
    tensors: dict[str, torch.Tensor]  # canonical state name -> initial value
    aliases: dict[str, str]  # every state name -> its canonical name (tied weights share)
    persistent: frozenset[str]  # state names that belong in the state dict
    graphs_json: dict[str, Any]  # the stripped graph modules, as stored

    def state(self, name: str) -> torch.Tensor:
        return self.tensors[self.aliases[name]]

    def kind(self, name: str) -> str:
        """parameter, buffer or constant, as the graphs take it."""
        return self._kinds[name]

    @cached_property
    def _kinds(self) -> dict[str, str]:
        return {
            item.target: item.kind
            for graph in (self.eval, self.train)  # the train graph's word wins
            if graph is not None
            for item in graph.inputs
            if item.kind != "user_input"
        }


def from_archives(
    train: Archive, eval_archive: Archive | None, label: str, *, require_eval: bool = True
) -> Program:
    """The program of a user's export (and its eval-mode export), checked."""
    graphs = {"train": _strip(train.graph_module)}
    if eval_archive is not None:
        graphs["eval"] = _strip(eval_archive.graph_module)
    tensors, aliases = _canonical(train.tensors)
    program = _build(graphs, tensors, aliases, train.persistent, label, require_eval)
    if eval_archive is not None:
        for name in program.eval.state_names("parameter") if program.eval else ():
            theirs, ours = eval_archive.tensors.get(name), train.tensors.get(name)
            if theirs is None or ours is None or theirs.shape != ours.shape:
                raise ProgramError(
                    f"model.eval_program: parameter {name!r} is not the train program's; export "
                    "the same module twice (train mode, then eval mode)"
                )
    return program


def encode_program(program: Program) -> bytes:
    """The program file's bytes: equal programs give equal bytes."""
    from training.model.weights import weights_bytes

    layout = {
        "graphs": program.graphs_json,
        "aliases": dict(sorted(program.aliases.items())),
        "persistent": sorted(program.persistent),
    }
    text = json.dumps(layout, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return weights_bytes(program.tensors, {"format": PROGRAM_FORMAT, "program": text})


def decode_program(path: Path, label: str = "model.program") -> Program:
    """Read and check a program file (a volunteer's only view of the model)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            if metadata.get("format") != PROGRAM_FORMAT:
                raise ProgramError(f"{label}: not a {PROGRAM_FORMAT} file")
            text = metadata.get("program", "")
            if len(text) > MAX_PROGRAM_JSON:
                raise ProgramError(f"{label}: its graphs are over {MAX_PROGRAM_JSON} bytes")
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        if isinstance(exc, ProgramError):
            raise
        raise ProgramError(f"{label}: cannot read the program file: {str(exc)[:200]}") from None
    try:
        layout = json.loads(text)
    except (ValueError, RecursionError):
        raise ProgramError(f"{label}: the program's graphs are not JSON") from None
    if not isinstance(layout, dict) or not isinstance(layout.get("graphs"), dict):
        raise ProgramError(f"{label}: the program has no graphs")
    aliases, persistent = layout.get("aliases"), layout.get("persistent")
    if not isinstance(aliases, dict) or not isinstance(persistent, list):
        raise ProgramError(f"{label}: the program has no state table")
    if any(not isinstance(v, str) or v not in tensors for v in aliases.values()):
        raise ProgramError(f"{label}: a state name points at a tensor the file lacks")
    if set(tensors) - set(aliases.values()):
        raise ProgramError(f"{label}: the file holds tensors no state name uses")
    return _build(layout["graphs"], tensors, aliases, frozenset(map(str, persistent)), label)


def _build(
    graphs: Any,
    tensors: dict[str, torch.Tensor],
    aliases: dict[str, str],
    persistent: frozenset[str],
    label: str,
    require_eval: bool = True,
) -> Program:
    if set(graphs) - {"train", "eval"} or "train" not in graphs:
        raise ProgramError(f"{label}: a program holds a train graph and optionally an eval graph")
    train = check_graph(graphs["train"], f"{label} (train)")
    eval_graph = check_graph(graphs["eval"], f"{label} (eval)") if "eval" in graphs else None
    for graph, which in ((train, "train"), (eval_graph, "eval")):
        for item in graph.inputs if graph else ():
            if item.kind != "user_input" and item.target not in aliases:
                raise ProgramError(f"{label} ({which}): no initial value for {item.target!r}")
    taken = {i.target for g in (train, eval_graph) if g for i in g.inputs}
    unused = sorted(set(aliases) - taken)
    if unused:
        raise ProgramError(f"{label}: state tensor {unused[0][:100]!r} is no graph's input")
    if require_eval and eval_graph is None and train.depends_on_mode():
        raise ProgramError(
            f"{label}: the model has dropout or BatchNorm, so it needs a second export in eval "
            "mode (model.eval_program; meshminer.export does both)"
        )
    if eval_graph is not None and len(eval_graph.user_inputs) != len(train.user_inputs):
        raise ProgramError(f"{label}: the eval graph takes other inputs than the train graph")
    return Program(train, eval_graph, tensors, dict(aliases), persistent, dict(graphs))


def _canonical(named: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """One tensor per storage: tied names (the same object) point at the first name."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[int, str] = {}
    for name in sorted(named):
        canonical = first.setdefault(id(named[name]), name)
        aliases[name] = canonical
        if canonical == name:
            tensors[name] = named[name]
    return tensors, aliases


def _meta(meta: Any) -> Any:
    return {k: meta.get(k) for k in ("dtype", "sizes")} if isinstance(meta, dict) else meta


def _strip(module: dict[str, Any]) -> dict[str, Any]:
    """The parts of torch's graph module a program keeps (unknown keys are dropped, not
    trusted): nodes without metadata; only the user inputs' tensor descriptions."""
    graph = module.get("graph") if isinstance(module.get("graph"), dict) else {}
    nodes = graph.get("nodes") if isinstance(graph.get("nodes"), list) else []
    kept_nodes = [
        {k: n[k] for k in ("target", "inputs", "outputs") if k in n}
        for n in nodes
        if isinstance(n, dict)
    ]
    signature = module.get("signature") if isinstance(module.get("signature"), dict) else {}
    user_inputs = set()
    for spec in signature.get("input_specs") or []:
        arg = spec.get("user_input", {}).get("arg", {}) if isinstance(spec, dict) else {}
        name = arg.get("as_tensor", {}).get("name") if isinstance(arg, dict) else None
        if isinstance(name, str):
            user_inputs.add(name)
    values = graph.get("tensor_values") if isinstance(graph.get("tensor_values"), dict) else {}
    return {
        "graph": {
            "inputs": graph.get("inputs"),
            "outputs": graph.get("outputs"),
            "nodes": kept_nodes,
            "tensor_values": {k: _meta(values[k]) for k in sorted(user_inputs) if k in values},
        },
        "signature": {
            "input_specs": signature.get("input_specs"),
            "output_specs": signature.get("output_specs"),
        },
    }
