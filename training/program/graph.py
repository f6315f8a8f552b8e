"""The checked graph: a program's nodes, each an allowed operator called with values of
a few plain kinds, in an order where every name is defined once before it is used.

`check_graph` reads torch's serialized graph (the `graph_module` of a `.pt2`'s
`model.json`, or the same structure inside a meshminer program) and builds the frozen
form the interpreter runs. It is the only reader of graph JSON, so the owner converting
a user's archive and a volunteer receiving a program apply the same rules. Anything
outside them is refused with the node's index and what was found; nothing is looked
up, imported or evaluated from a string in the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from training.program.allowlist import MODE_OPS, RANDOM_OPS, SYM_OPERATORS, allowed
from training.program.errors import ProgramError

MAX_NODES = 50_000
MAX_ARGS = 64
MAX_LIST = 4096
MAX_INT = 2**63
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")
_PART = r"(?:[A-Za-z_][A-Za-z0-9_]{0,99}|[0-9]{1,9})"
STATE_NAME = re.compile(rf"{_PART}(?:\.{_PART}){{0,31}}")  # "1.weight": nn.Sequential
STRING = re.compile(r"[A-Za-z0-9_.,+\-> ]{0,64}")
SYMBOL = re.compile(r"(?:Symbol\('(s[0-9]{1,9})', positive=True, integer=True\)|(s[0-9]{1,9}))")
# torch's ScalarType codes (torch/_export/serde/schema.py) for the dtypes a program may use
DTYPES = {
    1: "uint8",
    2: "int8",
    3: "int16",
    4: "int32",
    5: "int64",
    6: "float16",
    7: "float32",
    8: "float64",
    12: "bool",
    13: "bfloat16",
}
MEMORY_FORMATS = {1: "contiguous_format", 2: "channels_last", 4: "preserve_format"}
STRIDED = 7
POSITIONAL, KEYWORD = 1, 2
# list kinds and the kind of their items (None: the items carry their own tags)
_LISTED_AS = {
    "as_tensors": "as_tensor",
    "as_optional_tensors": None,
    "as_ints": "as_int",
    "as_floats": "as_float",
    "as_bools": "as_bool",
    "as_sym_ints": "as_sym_int",
    "as_sym_floats": "as_sym_float",
}


@dataclass(frozen=True)
class Ref:
    """A value defined earlier in the graph (a tensor, or a symbolic size)."""

    name: str


@dataclass(frozen=True)
class DType:
    name: str  # a torch dtype attribute, from DTYPES


@dataclass(frozen=True)
class MemoryFormat:
    name: str  # from MEMORY_FORMATS


@dataclass(frozen=True)
class Device:
    """Whatever device the graph named: the interpreter puts the training device here."""


@dataclass(frozen=True)
class Node:
    index: int
    target: str  # an allowed target, "torch.ops." stripped
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    outputs: tuple[str | tuple[str, ...] | None, ...]  # a name, a list's names, or unused


@dataclass(frozen=True)
class Input:
    kind: str  # parameter | buffer | constant | user_input
    name: str  # the graph's name for it
    target: str  # the state dict name ("" for a user input)
    dtype: str = ""  # user inputs: the dtype the graph expects
    sizes: tuple[int | str, ...] = ()  # user inputs: ints, or a symbol's name


@dataclass(frozen=True)
class Graph:
    inputs: tuple[Input, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    mutations: tuple[tuple[str, str], ...]  # (buffer's state name, value written back)

    @property
    def user_inputs(self) -> tuple[Input, ...]:
        return tuple(i for i in self.inputs if i.kind == "user_input")

    def state_names(self, kind: str) -> tuple[str, ...]:
        return tuple(i.target for i in self.inputs if i.kind == kind)

    def targets(self) -> set[str]:
        return {node.target for node in self.nodes}

    def draws_random(self) -> bool:
        return any(n.target.removeprefix("aten.") in RANDOM_OPS for n in self.nodes)

    def depends_on_mode(self) -> bool:
        """Dropout or BatchNorm: the graph behaves as the mode it was exported in."""
        return any(n.target.removeprefix("aten.") in MODE_OPS for n in self.nodes)


def check_graph(raw: Any, where: str) -> Graph:
    """Check torch's serialized `graph_module` (`graph` and `signature`) and build a `Graph`.

    Raises `ProgramError` naming `where`, the node and what it found."""
    module = _table(raw, where)
    graph = _table(module.get("graph"), f"{where}.graph")
    signature = _table(module.get("signature"), f"{where}.signature")
    defined: set[str] = set()
    inputs = _inputs(graph, signature, where, defined)
    raw_nodes = _list(graph.get("nodes"), f"{where}.graph.nodes", MAX_NODES)
    nodes = tuple(_node(i, raw, where, defined) for i, raw in enumerate(raw_nodes))
    outputs, mutations = _outputs(graph, signature, where, defined, inputs)
    return Graph(inputs, nodes, outputs, mutations)


def problems(raw: Any, where: str) -> list[str]:
    """Every node's problem at once (for a user to fix them all), not just the first."""
    try:
        check_graph(raw, where)
        return []
    except ProgramError as first:
        found = [str(first)]
    graph = raw.get("graph") if isinstance(raw, dict) else None
    nodes = graph.get("nodes") if isinstance(graph, dict) else []
    for i, node in enumerate(nodes if isinstance(nodes, list) else []):
        target = node.get("target") if isinstance(node, dict) else None
        if isinstance(target, str) and not allowed(target.removeprefix("torch.ops.")):
            message = _refused_target(i, target.removeprefix("torch.ops."), where)
            if message not in found:
                found.append(message)
    return found


def _inputs(graph: dict, signature: dict, where: str, defined: set[str]) -> tuple[Input, ...]:
    names = [
        _tensor_name(arg, f"{where}.graph.inputs[{i}]")
        for i, arg in enumerate(_list(graph.get("inputs"), f"{where}.graph.inputs", MAX_LIST))
    ]
    specs = _list(signature.get("input_specs"), f"{where}.signature.input_specs", MAX_LIST)
    if len(specs) != len(names):
        raise ProgramError(f"{where}: {len(names)} graph inputs but {len(specs)} input specs")
    values = graph.get("tensor_values", {})
    inputs = []
    for i, (name, raw_spec) in enumerate(zip(names, specs, strict=True)):
        path = f"{where}.signature.input_specs[{i}]"
        kind, body = _union(raw_spec, path)
        body = _table(body, path)
        if kind == "user_input":
            if _tensor_name(body.get("arg"), path) != name:
                raise ProgramError(f"{path}: names {body.get('arg')!r}, the graph input is {name}")
            dtype, sizes = _user_meta(values.get(name) if isinstance(values, dict) else None, path)
            inputs.append(Input("user_input", _define(name, defined, path), "", dtype, sizes))
            continue
        state_key = {
            "parameter": "parameter_name",
            "buffer": "buffer_name",
            "tensor_constant": "tensor_constant_name",
        }.get(kind)
        if state_key is None:
            raise ProgramError(
                f"{path}: an input of kind {kind!r} is not accepted (custom and opaque "
                "objects, tokens and constant inputs never are)"
            )
        arg = _table(body.get("arg"), path).get("name")
        if arg != name:
            raise ProgramError(f"{path}: names {arg!r}, the graph input is {name}")
        target = body.get(state_key)
        if not isinstance(target, str) or not STATE_NAME.fullmatch(target):
            raise ProgramError(f"{path}: {target!r} is not a dotted name of identifiers")
        kind = "constant" if kind == "tensor_constant" else kind
        inputs.append(Input(kind, _define(name, defined, path), target))
    return tuple(inputs)


def _user_meta(meta: Any, path: str) -> tuple[str, tuple[int | str, ...]]:
    meta = _table(meta, f"{path} (its tensor_values entry)")
    dtype = DTYPES.get(meta.get("dtype"))  # type: ignore[arg-type]
    if dtype is None:
        raise ProgramError(f"{path}: input dtype code {meta.get('dtype')!r} is not accepted")
    sizes: list[int | str] = []
    for size in _list(meta.get("sizes"), f"{path}.sizes", 16):
        kind, value = _union(size, f"{path}.sizes")
        if kind == "as_int" and _is_int(value) and 0 <= value < MAX_INT:
            sizes.append(value)
        elif kind == "as_expr" and isinstance(value, dict):
            text = value.get("expr_str")
            match = SYMBOL.fullmatch(text) if isinstance(text, str) else None
            if match is None:
                raise ProgramError(
                    f"{path}: symbolic size {str(text)[:80]!r} is not a plain symbol"
                )
            sizes.append(match.group(1) or match.group(2))
        else:
            raise ProgramError(f"{path}: a size must be an int or a plain symbol")
    return dtype, tuple(sizes)


def _node(index: int, raw: Any, where: str, defined: set[str]) -> Node:
    path = f"{where} node {index}"
    node = _table(raw, path)
    target = node.get("target")
    if not isinstance(target, str):
        raise ProgramError(f"{path}: target must be a string")
    target = target.removeprefix("torch.ops.")
    if not allowed(target):
        raise ProgramError(_refused_target(index, target, where))
    path = f"{path} ({target})"
    args: list[Any] = []
    kwargs: list[tuple[str, Any]] = []
    for raw_arg in _list(node.get("inputs"), f"{path}.inputs", MAX_ARGS):
        named = _table(raw_arg, f"{path}.inputs")
        arg_name = named.get("name")
        if not isinstance(arg_name, str) or not NAME.fullmatch(arg_name):
            raise ProgramError(f"{path}: argument name {str(arg_name)[:80]!r} is not an identifier")
        value = _value(named.get("arg"), f"{path} argument {arg_name}", defined)
        if named.get("kind") == POSITIONAL:
            if kwargs:
                raise ProgramError(f"{path}: positional argument {arg_name} after a keyword")
            args.append(value)
        elif named.get("kind") == KEYWORD:
            kwargs.append((arg_name, value))
        else:
            raise ProgramError(f"{path}: argument {arg_name} is neither positional nor keyword")
    if target in SYM_OPERATORS and (len(args) != 2 or kwargs):
        raise ProgramError(f"{path}: takes two positional sizes")
    outputs = tuple(
        _output(raw, f"{path} output {i}", defined)
        for i, raw in enumerate(_list(node.get("outputs"), f"{path}.outputs", MAX_ARGS))
    )
    return Node(index, target, tuple(args), tuple(kwargs), outputs)


def _refused_target(index: int, target: str, where: str) -> str:
    namespace = target.split(".", 1)[0]
    if namespace != "aten" and not target.startswith("_operator."):
        why = f"namespace {namespace[:40]!r} is not accepted (only reviewed aten operators are)"
    else:
        why = "not on the allow-list of reviewed operators"
    return f"{where} node {index}: {target[:120]!r}: {why}"


def _value(raw: Any, path: str, defined: set[str]) -> Any:
    kind, value = _union(raw, path)
    if kind == "as_none":
        return None
    if kind == "as_tensor":
        return _use(_tensor_name(raw, path), defined, path)
    if kind in _LISTED_AS:  # a list of one kind: each item read as that kind
        item_kind = _LISTED_AS[kind]
        items = _list(value, path, MAX_LIST)
        return tuple(
            _value(item if item_kind is None else {item_kind: item}, path, defined)
            for item in items
        )
    if kind in ("as_int", "as_float", "as_bool"):
        return _scalar(kind, value, path)
    if kind in ("as_sym_int", "as_sym_float"):
        return _sym(kind, value, path, defined)
    if kind == "as_string":
        if not isinstance(value, str) or not STRING.fullmatch(value):
            raise ProgramError(f"{path}: string {str(value)[:80]!r} is not a short plain word")
        return value
    if kind == "as_scalar_type":
        if value not in DTYPES:
            raise ProgramError(f"{path}: dtype code {value!r} is not accepted")
        return DType(DTYPES[value])
    if kind == "as_device":
        return Device()
    if kind == "as_layout":
        if value != STRIDED:
            raise ProgramError(f"{path}: only the strided layout is accepted, got {value!r}")
        return None
    if kind == "as_memory_format":
        if value not in MEMORY_FORMATS:
            raise ProgramError(f"{path}: memory format {value!r} is not accepted")
        return MemoryFormat(MEMORY_FORMATS[value])
    raise ProgramError(
        f"{path}: an argument of kind {kind!r} is not accepted (subgraphs, custom objects, "
        "operators and nested lists never are)"
    )


def _scalar(kind: str, value: Any, path: str) -> int | float | bool:
    if kind == "as_bool" and isinstance(value, bool):
        return value
    if kind == "as_int" and _is_int(value) and -MAX_INT <= value < MAX_INT:
        return value
    if kind == "as_float" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ProgramError(f"{path}: {str(value)[:40]!r} is not a valid {kind[3:]}")


def _sym(kind: str, value: Any, path: str, defined: set[str]) -> Any:
    inner, item = _union(value, path)
    if inner == "as_name":
        return _use(item, defined, path)
    return _scalar("as_int" if kind == "as_sym_int" else "as_float", item, path)


def _output(raw: Any, path: str, defined: set[str]) -> str | tuple[str, ...] | None:
    kind, value = _union(raw, path)
    if kind == "as_tensor":
        return _define(_tensor_name(raw, path), defined, path)
    if kind == "as_tensors":
        return tuple(
            _define(_tensor_name({"as_tensor": v}, path), defined, path)
            for v in _list(value, path, MAX_LIST)
        )
    if kind == "as_sym_int":
        inner, name = _union(value, path)
        if inner != "as_name":
            raise ProgramError(f"{path}: a symbolic size output needs a name")
        return _define(name, defined, path)
    if kind == "as_none":
        return None
    raise ProgramError(f"{path}: an output of kind {kind!r} is not accepted")


def _outputs(
    graph: dict, signature: dict, where: str, defined: set[str], inputs: tuple[Input, ...]
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    raw_outputs = _list(graph.get("outputs"), f"{where}.graph.outputs", MAX_LIST)
    names = [_tensor_name(o, f"{where}.graph.outputs") for o in raw_outputs]
    specs = _list(signature.get("output_specs"), f"{where}.signature.output_specs", MAX_LIST)
    if len(specs) != len(names):
        raise ProgramError(f"{where}: {len(names)} graph outputs but {len(specs)} output specs")
    buffers = {i.target for i in inputs if i.kind == "buffer"}
    users, mutations = [], []
    for i, (name, raw_spec) in enumerate(zip(names, specs, strict=True)):
        path = f"{where}.signature.output_specs[{i}]"
        _use(name, defined, path)
        kind, body = _union(raw_spec, path)
        if kind == "user_output":
            users.append(name)
        elif kind == "buffer_mutation":
            buffer = _table(body, path).get("buffer_name")
            if buffer not in buffers:
                raise ProgramError(f"{path}: mutates {str(buffer)[:80]!r}, which is no buffer")
            mutations.append((buffer, name))
        else:
            raise ProgramError(f"{path}: an output of kind {kind!r} is not accepted")
    if len(users) != 1:
        raise ProgramError(f"{where}: the graph must return one tensor; it returns {len(users)}")
    return tuple(users), tuple(mutations)


def _define(name: Any, defined: set[str], path: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ProgramError(f"{path}: name {str(name)[:80]!r} is not an identifier")
    if name in defined:
        raise ProgramError(f"{path}: name {name!r} is defined twice")
    defined.add(name)
    return name


def _use(name: Any, defined: set[str], path: str) -> Ref:
    if not isinstance(name, str) or name not in defined:
        raise ProgramError(f"{path}: {str(name)[:80]!r} is used before it is defined")
    return Ref(name)


def _tensor_name(raw: Any, path: str) -> str:
    kind, value = _union(raw, path)
    if kind != "as_tensor":
        raise ProgramError(f"{path}: expected a tensor, found {kind!r}")
    name = _table(value, path).get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ProgramError(f"{path}: name {str(name)[:80]!r} is not an identifier")
    return name


def _union(raw: Any, path: str) -> tuple[str, Any]:
    if not isinstance(raw, dict) or len(raw) != 1:
        raise ProgramError(f"{path}: expected a one-key tagged value, found {str(raw)[:80]!r}")
    ((kind, value),) = raw.items()
    return str(kind)[:40], value


def _table(raw: Any, path: str) -> dict:
    if not isinstance(raw, dict):
        raise ProgramError(f"{path}: expected a table, found {type(raw).__name__}")
    return raw


def _list(raw: Any, path: str, limit: int) -> list:
    if not isinstance(raw, list):
        raise ProgramError(f"{path}: expected a list, found {type(raw).__name__}")
    if len(raw) > limit:
        raise ProgramError(f"{path}: {len(raw)} entries; at most {limit}")
    return raw


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
