"""Checkpoints written beside training, never more of them on disk than the worker
may hold.

A checkpoint is taken at the step (a copy of the state in memory, so the next steps
may change it) and written by one background thread: hashing and writing a state
costs about three times copying it, and training goes on meanwhile. Each file
appears under its final name only once it is whole (`.part` until then), and its
`checkpoint` event follows at once: the worker commits to it in its next heartbeat.

`Hold` is the worker's bound (`node/work/trust/commitments.py`): before a checkpoint
is taken, training waits while the folder holds `states` files, or those being
written, unless they are smaller than `floor_bytes` in all. The worker empties the
folder as the owner decides on each state, or moves the files out when it keeps
them all. The result reports the most states the folder held at once.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from training.evidence.checkpoints import checkpoint_file, checkpoint_metadata, state_tensors
from training.model.weights import stream_weights

WAIT_POLL_S = 0.005
PATTERN = "checkpoint-*.safetensors"


@dataclass(frozen=True)
class Hold:
    """How many states the folder may hold (0: no bound), and below how many bytes
    in all the bound does not apply (a small model's states cost nothing to keep)."""

    states: int = 0
    floor_bytes: int = 0


NO_BOUND = Hold()


@dataclass
class Peak:
    states: int = 0
    bytes: int = 0


@dataclass
class _Job:
    index: int
    step: int
    tensors: dict[str, torch.Tensor]


@dataclass
class CheckpointWriter:
    """`on_step` for the training loop: the state at each of `steps`, into `folder`."""

    folder: Path
    steps: list[int]
    emit: Callable[[dict[str, Any]], None]
    state: Callable[[torch.optim.Optimizer], dict[str, torch.Tensor]]
    hold: Hold = NO_BOUND
    shas: list[str] = field(default_factory=list)
    peak: Peak = field(default_factory=Peak)

    def __post_init__(self) -> None:
        self._wanted = set(self.steps)
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=1)
        self._pending = 0  # taken, not yet whole on disk
        self._state_bytes = 0
        self._taken = 0
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._stopped = False
        self._thread = threading.Thread(target=self._write_all, daemon=True)
        self.folder.mkdir(exist_ok=True)
        self._thread.start()

    def on_step(self, step: int, optimizer: torch.optim.Optimizer) -> None:
        if step not in self._wanted:
            return
        self._raise_failure()
        self._wait_for_room()
        tensors = {k: v.detach().to("cpu", copy=True) for k, v in self.state(optimizer).items()}
        self._state_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        with self._lock:
            self._pending += 1
        self._queue.put(_Job(self._taken, step, tensors))
        self._taken += 1

    def close(self) -> list[str]:
        """Wait for the last file; the sha256 of every checkpoint, in step order."""
        self.stop()
        self._raise_failure()
        return self.shas

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._queue.put(None)
            self._thread.join()

    def _held(self) -> int:
        return sum(1 for _ in self.folder.glob(PATTERN))

    def _wait_for_room(self) -> None:
        if self.hold.states <= 0:
            return
        while True:
            with self._lock:
                count = self._held() + self._pending
            small = (count + 1) * self._state_bytes <= self.hold.floor_bytes
            if count < self.hold.states or small:
                return
            self._raise_failure()
            time.sleep(WAIT_POLL_S)

    def _write_all(self) -> None:
        while (job := self._queue.get()) is not None:
            if self._error is not None:
                continue
            try:
                self._write(job)
            except BaseException as exc:  # noqa: BLE001  (raised in the training thread)
                self._error = exc

    def _write(self, job: _Job) -> None:
        final = self.folder / checkpoint_file(job.step)
        part = final.with_name(final.name + ".part")
        sha = stream_weights(part, job.tensors, checkpoint_metadata(job.step))
        with self._lock:
            os.replace(part, final)
            self._pending -= 1
            held = self._held()
        self.peak.states = max(self.peak.states, held)
        self.peak.bytes = max(self.peak.bytes, held * final.stat().st_size)
        self.shas.append(sha)
        self.emit(
            {
                "event": "checkpoint",
                "index": job.index,
                "step": job.step,
                "sha256": sha,
                "file": final.name,
            }
        )

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"a checkpoint could not be written: {self._error}")


@contextmanager
def checkpoints_written(
    run: Any,
    model: torch.nn.Module,
    folder: Path | None,
    steps: list[int],
    emit: Callable[[dict[str, Any]], None],
    hold: Hold,
) -> Iterator[CheckpointWriter | None]:
    """A writer for the run (None without a `folder`), its thread ended on the way out."""
    if folder is None:
        yield None
        return
    writer = CheckpointWriter(
        folder, steps, emit, lambda optim: state_tensors(model, optim, run.device), hold
    )
    try:
        yield writer
    finally:
        writer.stop()
