"""`data.shards`: an elastic job's token ids as many files, each its own blob.

A sharded job names `shards = ["part-000.bin", ...]` instead of `data.source`, with
`data.format` (`tokens16` or `tokens32`) and `data.vocab_size` (each process reads
only some shards, so the vocabulary, and with it the model, cannot come from the
data). Slot s of W reads the shards `training.elastic.rounds.slot_shards` assigns it,
so a worker fetches about 1/W of the data; the owner, which validates, holds them all.
Each shard splits like one token file: its head trains, its tail validates.
"""

from __future__ import annotations

from pathlib import Path

from training.data.sources import TOKEN_FORMATS, parse_source, resolve_path
from training.errors import SpecError

MAX_SHARDS = 64  # a work package names its slot's shards among at most 256 blobs


def parse_shards(
    raw: tuple[str, ...], fmt: str | None, base_dir: Path | None, allowed_root: Path | None
) -> tuple[str, ...]:
    """The shard list with local files resolved and blobs normalised."""
    if fmt not in TOKEN_FORMATS:
        raise SpecError(
            'data.shards: shards are token id files; set data.format = "tokens16" or "tokens32"'
        )
    shards = []
    for i, item in enumerate(raw):
        where = f"data.shards[{i}]"
        if not item.startswith("blob:") and Path(item).suffix.lower() != ".bin":
            raise SpecError(f"{where}: a shard is a .bin file of token ids or a blob; got {item!r}")
        parsed = parse_source(item, fmt, where)
        if parsed.origin == "blob":
            shards.append(f"blob:{parsed.sha256}")
        else:
            shards.append(resolve_path(item, base_dir, allowed_root, where))
    if len(set(shards)) != len(shards):
        raise SpecError("data.shards: a shard is named twice")
    return tuple(shards)


def shards_of_slot(n_shards: int, workers: int, slot: int) -> list[int]:
    """The shards data slot `slot` of `workers` reads: every `workers`-th from its own
    number, or, with fewer shards than slots, one shard shared round-robin."""
    own = slot % workers
    if n_shards >= workers:
        return list(range(own, n_shards, workers))
    return [own % n_shards]


def shard_shas(shards: tuple[str, ...]) -> list[str]:
    """The blob sha256 of every shard, in order (a spec after upload names only blobs)."""
    shas = [s.removeprefix("blob:") for s in shards]
    if any(len(sha) != 64 for sha in shas):
        raise SpecError("data.shards: a local shard has no blob yet")
    return shas
