"""Finished units' folders are removed after a while.

A unit's folder (`units/<unit id>/`: the runner's log and its weights file) is kept
`unit_files_keep_hours` after it was last written, for the post-mortem, then removed.
A unit still training on this node is never touched, whatever its age.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import trio

from protocol.ids import is_id

log = logging.getLogger(__name__)

CHECK_EVERY_S = 600.0


def remove_old_unit_folders(
    units_dir: Path, keep_s: float, busy: Iterable[str], now: float
) -> list[str]:
    """Remove unit folders older than `keep_s` that are not in `busy`; their names."""
    if not units_dir.is_dir():
        return []
    busy = set(busy)
    removed = []
    for folder in units_dir.iterdir():
        if folder.name in busy or not folder.is_dir() or folder.is_symlink():
            continue
        newest = max(
            (p.stat().st_mtime for p in folder.rglob("*") if not p.is_symlink()),
            default=folder.stat().st_mtime,
        )
        if now - max(newest, folder.stat().st_mtime) > keep_s:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed


async def keep_removing_old_folders(
    units_dir: Path, keep_s: float, busy: Callable[[], set[str]]
) -> None:
    """`remove_old_unit_folders` every `CHECK_EVERY_S`, sparing the units `busy()` names."""
    while True:
        removed = await trio.to_thread.run_sync(
            remove_old_unit_folders, units_dir, keep_s, set(busy()), time.time()
        )
        if removed:
            log.info(
                "removed %d finished unit folder(s) older than %g h", len(removed), keep_s / 3600
            )
        await trio.sleep(CHECK_EVERY_S)


def _inner_states(data_dir: Path, job_id: str, slot: int) -> tuple[Path, dict[int, Path]]:
    """This node's kept inner states of `slot` of an elastic job, by the round whose
    start each is (under units/, so they go with the old unit folders)."""
    if not is_id(job_id):
        raise ValueError(f"not a job id: {job_id[:80]!r}")
    folder = data_dir / "units" / job_id
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = {}
    for path in folder.glob(f"slot-{int(slot)}-round-*.safetensors"):
        number = path.name.removesuffix(".safetensors").rsplit("-", 1)[1]
        if number.isdigit():
            found[int(number)] = path
    return folder, found


def inner_state_for(data_dir: Path, job_id: str, slot: int, round_: int) -> Path | None:
    """The inner optimizer state a share of `round_` for `slot` starts from: the one
    as of that round's start (so a share trained again, after its owner restarted,
    starts where its first attempt did), else the newest from an earlier round, else
    None (a fresh state)."""
    _, found = _inner_states(data_dir, job_id, slot)
    earlier = [r for r in found if r <= round_]
    return found[max(earlier)] if earlier else None


def keep_inner_state(data_dir: Path, job_id: str, slot: int, round_: int, state: Path) -> None:
    """Keep `state`, the inner state after this node's share of `round_`, as the start
    of the next round; states from before `round_`'s start are no longer needed."""
    folder, found = _inner_states(data_dir, job_id, slot)
    state.replace(folder / f"slot-{int(slot)}-round-{int(round_) + 1}.safetensors")
    for number, path in found.items():
        if number < round_:
            path.unlink(missing_ok=True)
