"""The request the node writes to a training subprocess (`training.run.runner`).

`RunnerRequest` is that request, typed; `as_plain()` is the map the runner reads (its
module docstring lists the keys), to which `executor.run_training` adds `isolation`.
A request starts as a job's training (`for_spec`, with this node's device settings)
and becomes another task's by `replaying`, `elastic_task`, `with_checkpoints` and
`resuming`.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from protocol.rounds import RoundShare
from training.run.runner import Task  # what the runner does with the request

Device = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True)
class RunnerRequest:
    spec: dict[str, Any]  # spec_to_plain output, with a blob: or builtin: source
    blobs: dict[str, str]  # sha256 -> absolute path of that blob's file
    out: Path  # where the runner writes the weights (every other path is beside it)
    device: Device = "auto"
    gpu_memory_fraction: float = 1.0
    memory_limit_mb: int = 0  # 0: no limit
    gpus: tuple[int, ...] = ()  # the CUDA devices it may use (none named: all)
    task: Task = "train"
    checkpoints: bool = False  # train, elastic_inner: keep the evidence for spot checks
    # at most this many checkpoints on disk at once (0: no bound), unless they are
    # under `hold_floor_bytes` in all (`training.evidence.writer.Hold`)
    hold_states: int = 0
    hold_floor_bytes: int = 0
    resume: tuple[str, int] | None = None  # train: go on from this state (sha256, step)
    final_validation: bool = True  # train: evaluate the weights at the end
    replay: dict[str, Any] | None = None  # the replay task's segments
    elastic: dict[str, Any] | None = None  # the elastic tasks' files

    @classmethod
    def for_spec(
        cls,
        spec: dict[str, Any],
        blobs: dict[str, str],
        out: Path,
        *,
        gpu_memory_fraction: float,
        memory_limit_mb: int,
        gpus: Iterable[int] | None = None,
    ) -> RunnerRequest:
        """Training `spec` on this node: on the CPU when the spec needs no GPU."""
        device: Device = "cpu" if spec.get("requirements", {}).get("gpu") == "none" else "auto"
        return cls(
            spec,
            blobs,
            out,
            device=device,
            gpu_memory_fraction=gpu_memory_fraction,
            memory_limit_mb=memory_limit_mb,
            gpus=tuple(gpus or ()),
        )

    def replaying(self, replay: dict[str, Any]) -> RunnerRequest:
        """The owner's spot check: replay the segments in `replay`."""
        return dataclasses.replace(self, task="replay", replay=replay)

    def elastic_task(self, task: Task, elastic: dict[str, Any]) -> RunnerRequest:
        """One step of an elastic job, on the files `elastic` names (none: no table)."""
        return dataclasses.replace(self, task=task, elastic=elastic or None)

    def with_checkpoints(self, hold_states: int = 0, floor_bytes: int = 0) -> RunnerRequest:
        """The same task, keeping its checkpoints as evidence: at most `hold_states`
        on disk at once (0: all of them) once they pass `floor_bytes` in all."""
        return dataclasses.replace(
            self, checkpoints=True, hold_states=hold_states, hold_floor_bytes=floor_bytes
        )

    def resuming(self, state_sha256: str, step: int) -> RunnerRequest:
        """The same training, going on from a lost unit's state (one of its blobs)."""
        return dataclasses.replace(self, resume=(state_sha256, step))

    def without_final_validation(self) -> RunnerRequest:
        """The same training, its weights not evaluated at the end: the owner of a
        spot-checked unit evaluates them itself, so the worker's figures would be a
        claim no one reads, at the cost of a validation pass."""
        return dataclasses.replace(self, final_validation=False)

    def as_plain(self) -> dict[str, Any]:
        """The map the runner reads; keys left at their defaults are left out."""
        plain: dict[str, Any] = {
            "spec": self.spec,
            "blobs": self.blobs,
            "out": str(self.out),
            "device": self.device,
            "gpu_memory_fraction": self.gpu_memory_fraction,
            "memory_limit_mb": self.memory_limit_mb,
        }
        if self.gpus:
            plain["gpus"] = list(self.gpus)
        if self.task != "train":
            plain["task"] = self.task
        if self.replay is not None:
            plain["replay"] = self.replay
        if self.elastic is not None:
            plain["elastic"] = self.elastic
        if self.checkpoints:
            plain["checkpoints"] = True
        if self.hold_states:
            plain["hold"] = {"states": self.hold_states, "floor_bytes": self.hold_floor_bytes}
        if self.resume is not None:
            plain["resume"] = {"state": self.resume[0], "step": self.resume[1]}
        if not self.final_validation:
            plain["final_validation"] = False
        return plain


#: how a role gets a request for (spec, blobs, out) with this node's device settings
RequestBuilder = Callable[[dict[str, Any], dict[str, str], Path], RunnerRequest]


REBUILT_WEIGHTS = "weights_in.safetensors"  # a share's weights, rebuilt beside `out`
TAKES_NOTICE = "takes.json"  # where the round's weights an eager share takes are
TAKEN_WEIGHTS = "weights_taken.safetensors"  # those weights, as the runner rebuilt them


def share_request(
    request: RunnerRequest,
    job_id: str,
    share: RoundShare,
    kept: Path | None,
    out: Path,
    rebuild: bool = False,
    takes: bool = False,
) -> RunnerRequest:
    """The runner request for one share of a round: the kept inner state (copied in
    beside `out`, since the runner reads nothing else of this node's), an eager
    start's delta, the files it writes back and, to `rebuild` the share's weights from
    the round before's and the owner's update, those two and where the weights go.
    A share that `takes` its round's weights on its way waits for their notice."""
    elastic: dict[str, Any] = {
        "job_id": job_id,
        "round": share.round,
        "slot": share.slot,
        "weights": share.weights_sha256,
        "state_out": str(out.parent / "state_out.safetensors"),
    }
    if share.start_delta_sha256:
        elastic["start_delta"] = share.start_delta_sha256
    if rebuild:
        elastic["base"] = share.base_sha256
        elastic["update"] = share.update_sha256
        elastic["weights_out"] = str(out.parent / REBUILT_WEIGHTS)
    if takes:
        elastic["takes"] = str(out.parent / TAKES_NOTICE)
        elastic["takes_out"] = str(out.parent / TAKEN_WEIGHTS)
    if kept is not None and kept.is_file():
        out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        state_in = out.parent / "state_in.safetensors"
        shutil.copyfile(kept, state_in)
        elastic["state_in"] = str(state_in)
    return request.elastic_task("elastic_inner", elastic)
