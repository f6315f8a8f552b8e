"""Where training starts and what trains: `model.init` and `model.trainable`, for every
arch (fine-tuning, LoRA).

- `init`: a safetensors file of the model's state (names, shapes and dtypes exactly the
  model's; `training.model.start` refuses a mismatch naming the tensor). A local file in the
  user's spec; `blob:<sha256>` once the owner's node has stored it. Checkpoint 0, an
  elastic job's round-0 weights and a program's initial state are then the init's.
- `trainable`: glob patterns over parameter names (`fnmatch`: `head.*`, `*.lora_*`);
  every other parameter is frozen, and the optimizer, checkpoints, elastic deltas and
  credit cover only what trains. A pattern that matches no parameter is refused.
- `trainable_parameters`: how many parameters the patterns select, counted from the
  model by the node that binds the spec (the owner at submit, `train-local` here) and
  re-counted by every runner; a spec whose count differs is refused. Credit reads it,
  so it needs no torch.

Nothing here imports torch (`training.model.start` applies all this to a module).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.data.sources import resolve_path
from training.errors import SpecError
from training.spec.fields import Section

MAX_PATTERNS = 64
_PATTERN = re.compile(r"[A-Za-z0-9_.*?\[\]!-]{1,200}")
_BLOB = re.compile(r"blob:[0-9a-f]{64}")


@dataclass(frozen=True)
class StartSpec:
    init: str | None = None  # a local .safetensors, or blob:<sha256>
    trainable: tuple[str, ...] = ()  # () : every parameter trains
    trainable_parameters: int = 0  # counted when the spec is bound (0: not yet)

    @property
    def init_blob(self) -> str | None:
        """The init's sha256 once it is a blob."""
        return self.init.removeprefix("blob:") if self.init and _BLOB.fullmatch(self.init) else None


def parse_start(section: Section, base_dir: Path | None, allowed_root: Path | None) -> StartSpec:
    """`init`, `trainable` and `trainable_parameters` from the `[model]` table."""
    init = section.string("init", None, max_len=4096)
    if init is not None and not _BLOB.fullmatch(init):
        if init.startswith("blob:"):
            raise SpecError("model.init: a stored init is blob:<64 lowercase hex digits>")
        if Path(init).suffix.lower() != ".safetensors":
            raise SpecError(
                f"model.init: {init[:100]!r} is not a .safetensors file (pickled checkpoints "
                "such as .pt, .pth and .bin are never read; save with safetensors)"
            )
        init = resolve_path(init, base_dir, allowed_root, "model.init")
    raw = section.get("trainable", [])
    if not isinstance(raw, list | tuple) or len(raw) > MAX_PATTERNS:
        raise SpecError(f"model.trainable must be a list of at most {MAX_PATTERNS} glob patterns")
    for i, pattern in enumerate(raw):
        if not isinstance(pattern, str) or not _PATTERN.fullmatch(pattern):
            raise SpecError(
                f"model.trainable[{i}]: {str(pattern)[:60]!r} is not a glob pattern over "
                "parameter names (letters, digits, _ . - * ? [ ] !)"
            )
    trainable = tuple(raw)
    count = section.integer("trainable_parameters", 0, lo=0, hi=10**12)
    if count and not trainable:
        raise SpecError("model.trainable_parameters is counted for model.trainable; set both")
    return StartSpec(init, trainable, count)


def start_plain(start: StartSpec) -> dict[str, Any]:
    """The keys `[model]` carries for `start` (none at the defaults: old specs stay equal)."""
    plain: dict[str, Any] = {}
    if start.init is not None:
        plain["init"] = start.init
    if start.trainable:
        plain["trainable"] = list(start.trainable)
    if start.trainable_parameters:
        plain["trainable_parameters"] = start.trainable_parameters
    return plain
