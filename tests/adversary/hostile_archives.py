"""Hostile `torch.export` archives (`.pt2`), as a user's upload or a careless export
tool could hand them to an owner's node: an honest archive rewritten entry by entry,
so that each differs from an accepted file only by its attack.

Each builder takes (the honest archive, a folder to write into, the marker file) and
returns the hostile copy, named as the honest one was (`model.pt2` or
`model.eval.pt2`). Entries stay STORED under the same root folder, in the same
order, unless the attack is the entry's form itself. The payloads and the node-level
attacks come from `hostile_programs.py`.
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hostile_programs import (
    NODE_ATTACKS,
    Graph,
    code,
    command,
    deviceless_arange_node,
    marker_pickle,
    marker_torch_save,
)

ArchiveBuilder = Callable[[Path, Path, Path], Path]  # (honest .pt2, out folder, marker)


# -- zip surgery ---------------------------------------------------------------------------


def read_entries(path: Path) -> tuple[str, dict[str, bytes]]:
    """(root folder, {entry name under the root: bytes}) in the archive's order."""
    with zipfile.ZipFile(path) as archive:
        infos = [i for i in archive.infolist() if not i.is_dir()]
        (root,) = {i.filename.split("/", 1)[0] for i in infos}
        return root, {i.filename.split("/", 1)[1]: archive.read(i) for i in infos}


def write_entries(
    path: Path,
    root: str,
    entries: dict[str, bytes],
    *,
    deflated: frozenset[str] = frozenset(),
    encrypted: frozenset[str] = frozenset(),
) -> Path:
    """Write `entries` under `root`, STORED unless named in `deflated`; the entries in
    `encrypted` get the encryption bit in both headers (their bytes stay plain: a
    reader that decrypted nothing but trusted the bit would still be fooled)."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            kind = zipfile.ZIP_DEFLATED if name in deflated else zipfile.ZIP_STORED
            archive.writestr(zipfile.ZipInfo(f"{root}/{name}"), data, compress_type=kind)
        for info in archive.infolist():
            if info.filename.split("/", 1)[1] in encrypted:
                info.flag_bits |= 0x1  # the central directory is written at close
    if encrypted:
        raw = bytearray(path.read_bytes())
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.filename.split("/", 1)[1] in encrypted:
                    at = info.header_offset + 6  # the local header's general purpose flag
                    flags = struct.unpack_from("<H", raw, at)[0]
                    struct.pack_into("<H", raw, at, flags | 0x1)
        path.write_bytes(bytes(raw))
    return path


def _edit(
    honest: Path, out: Path, edit: Callable[[dict[str, bytes]], None], **form: frozenset[str]
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    root, entries = read_entries(honest)
    edit(entries)
    return write_entries(out / honest.name, root, entries, **form)


def _json_entry(entries: dict[str, bytes], name: str, edit: Callable[[Any], None]) -> None:
    value = json.loads(entries[name])
    edit(value)
    entries[name] = json.dumps(value).encode()


def _graph_edit(attack: Callable[[Graph, Path], None], marker: Path) -> Callable[[dict], None]:
    def edit(entries: dict[str, bytes]) -> None:
        _json_entry(entries, "models/model.json", lambda m: attack(m["graph_module"], marker))

    return edit


WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"


def _first_weight(config: dict[str, Any]) -> dict[str, Any]:
    return next(iter(config["config"].values()))


# -- the variants ---------------------------------------------------------------------------


def sample_inputs_pickle(honest: Path, out: Path, marker: Path) -> Path:
    """Every honest archive carries `torch.save`'s pickle of the sample inputs, which
    `torch.export.load` unpickles; here it is the payload (a reader that opened it ran it)."""

    def edit(entries: dict[str, bytes]) -> None:
        entries["data/sample_inputs/model.pt"] = marker_torch_save(marker)

    return _edit(honest, out, edit)


def use_pickle_weights(honest: Path, out: Path, marker: Path) -> Path:
    """The first weight is flagged `use_pickle` (torch's path for tensor subclasses) and
    its file is the payload."""

    def edit(entries: dict[str, bytes]) -> None:
        config = json.loads(entries[WEIGHTS_CONFIG])
        first = _first_weight(config)
        first["use_pickle"] = True
        entries[f"data/weights/{first['path_name']}"] = marker_torch_save(marker)
        entries[WEIGHTS_CONFIG] = json.dumps(config).encode()

    return _edit(honest, out, edit)


def _constant_object(prefix: str, payload: Callable[[Path], bytes]) -> ArchiveBuilder:
    def build(honest: Path, out: Path, marker: Path) -> Path:
        def edit(entries: dict[str, bytes]) -> None:
            entries[f"data/constants/{prefix}_0"] = payload(marker)
            config = json.loads(entries[CONSTANTS_CONFIG])
            config["config"]["hook"] = {
                "path_name": f"{prefix}_0",
                "is_param": False,
                "use_pickle": True,
                "tensor_meta": None,
            }
            entries[CONSTANTS_CONFIG] = json.dumps(config).encode()

        return _edit(honest, out, edit)

    build.__doc__ = f"A constant `{prefix}_0` (torch unpickles it at load), with its config entry."
    return build


opaque_object = _constant_object("opaque_obj", marker_pickle)  # pickle.loads
custom_object = _constant_object("custom_obj", marker_torch_save)  # torchbind's unpickler


def _extra_entry(name: str, payload: Callable[[Path], bytes]) -> ArchiveBuilder:
    def build(honest: Path, out: Path, marker: Path) -> Path:
        def edit(entries: dict[str, bytes]) -> None:
            entries[name] = payload(marker)

        return _edit(honest, out, edit)

    build.__doc__ = f"An entry {name!r} added beside the honest ones."
    return build


legacy_weights_pickle = _extra_entry("data/weights/model.pt", marker_torch_save)
# any bytes: what matters is that a reader that dlopen()ed it would run its constructors
aotinductor_library = _extra_entry(
    "data/aotinductor/model/model.so", lambda m: b"\x7fELF\x02\x01\x01" + command(m).encode()
)
unknown_entry = _extra_entry("extra/hook.py", lambda m: code(m).encode())


def guard_code(honest: Path, out: Path, marker: Path) -> Path:
    """`guards_code` holds Python that `torch.export.load` would `exec` to check inputs."""

    def edit(entries: dict[str, bytes]) -> None:
        _json_entry(entries, "models/model.json", lambda m: m.update(guards_code=[code(marker)]))

    return _edit(honest, out, edit)


def _view(field: str) -> ArchiveBuilder:
    def build(honest: Path, out: Path, marker: Path) -> Path:
        def edit(entries: dict[str, bytes]) -> None:
            def reach(config: dict[str, Any]) -> None:
                first = _first_weight(config)
                meta = first["tensor_meta"]
                if field == "storage_offset":  # starts at its last element: runs past
                    elements = len(entries[f"data/weights/{first['path_name']}"]) // 4
                    meta["storage_offset"] = {"as_int": elements - 1}
                else:  # the outer stride jumps a megabyte per step
                    meta["strides"][0] = {"as_int": 2**20}

            _json_entry(entries, WEIGHTS_CONFIG, reach)

        return _edit(honest, out, edit)

    build.__doc__ = f"The first weight's {field} reaches past its file's bytes (an overread)."
    return build


def _form(deflated: frozenset[str] = frozenset(), encrypted: frozenset[str] = frozenset()):
    def build(honest: Path, out: Path, marker: Path) -> Path:
        return _edit(honest, out, lambda entries: None, deflated=deflated, encrypted=encrypted)

    build.__doc__ = "models/model.json in a form the format never writes (compressed, encrypted)."
    return build


def _node(attack: Callable[[Graph, Path], None]) -> ArchiveBuilder:
    def build(honest: Path, out: Path, marker: Path) -> Path:
        return _edit(honest, out, _graph_edit(attack, marker))

    build.__doc__ = attack.__doc__
    return build


def unused_weight(honest: Path, out: Path, marker: Path) -> Path:
    """A weights config entry that no graph input takes (four floats of the first
    weight's file)."""

    def add(config: dict[str, Any]) -> None:
        first = _first_weight(config)
        meta = {**first["tensor_meta"], "sizes": [{"as_int": 4}], "strides": [{"as_int": 1}]}
        config["config"]["hook"] = {**first, "tensor_meta": meta}

    def edit(entries: dict[str, bytes]) -> None:
        _json_entry(entries, WEIGHTS_CONFIG, add)

    return _edit(honest, out, edit)


deviceless_arange = _node(deviceless_arange_node)

# name -> (builder, what the refusal must say). `sample_inputs_pickle` is not here: its
# entry is never opened, so the archive converts (without it).
ARCHIVES: dict[str, tuple[ArchiveBuilder, str]] = {
    "use_pickle weights": (use_pickle_weights, "is stored as a pickle (use_pickle); refused"),
    "opaque object": (opaque_object, "'data/constants/opaque_obj_0' is not part of the format"),
    "custom object": (custom_object, "'data/constants/custom_obj_0' is not part of the format"),
    "legacy weights pickle": (
        legacy_weights_pickle,
        "'data/weights/model.pt' is not part of the format",
    ),
    "AOTInductor .so": (
        aotinductor_library,
        "'data/aotinductor/model/model.so' is not part of the format",
    ),
    "guard code": (guard_code, "is not a comparison of input sizes"),
    "view past its bytes (storage_offset)": (_view("storage_offset"), "past the 36 its bytes"),
    "view past its bytes (stride)": (_view("strides"), "past the 36 its bytes"),
    "compressed entry": (
        _form(deflated=frozenset({"models/model.json"})),
        "'models/model.json' is compressed",
    ),
    "encrypted entry": (
        _form(encrypted=frozenset({"models/model.json"})),
        "'models/model.json' is encrypted",
    ),
    "unknown entry": (unknown_entry, "'extra/hook.py' is not part of the format"),
    **{name: (_node(attack), expected) for name, (attack, expected) in NODE_ATTACKS.items()},
}
