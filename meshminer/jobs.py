"""Jobs on a node: `Job` (follow one, fetch its weights), `job(id)`, `jobs()`.

A `Job` holds the node's JSON for the job as last read (`info`, the fields of
`GET /api/v1/jobs/{id}`); `refresh()` reads it again and `wait()` polls it until the
job ends, so nothing here goes stale without saying when it was read.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from meshminer.connection import Connection
from meshminer.errors import JobFailed
from meshminer.progress import JobProgress

if TYPE_CHECKING:
    import torch

    Module = TypeVar("Module", bound=torch.nn.Module)

FINAL_STATES = ("completed", "failed", "cancelled")
POLL_INTERVAL_S = 0.5
_JOB_ID = re.compile(r"[0-9a-f]{16}")


class Job:
    def __init__(self, info: dict[str, Any], connection: Connection) -> None:
        self.info = info
        self._connection = connection

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.info.get('name', '')!r} {self.state}>"

    @property
    def id(self) -> str:
        return self.info["id"]

    @property
    def state(self) -> str:
        """queued, running, completed, failed or cancelled."""
        return self.info["state"]

    @property
    def metrics(self) -> dict[str, Any]:
        """The result's metrics (`val_loss`, `val_accuracy`, ...); empty until it ends."""
        return self.info.get("metrics") or {}

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """An elastic job's rounds: contributors, joiners and leavers, `val_loss`, bytes."""
        return self.info.get("rounds") or []

    @property
    def trials(self) -> list[dict[str, Any]]:
        """A sweep's trials: `number`, `params`, `state`, `value`."""
        return self.info.get("trials") or []

    def refresh(self) -> Job:
        """Read the job from the node again; returns self."""
        self.info = self._connection.get_json(f"/api/v1/jobs/{self.id}")
        return self

    def wait(self, timeout: float | None = None, progress: bool = True) -> Job:
        """Poll the job until it ends, with a progress bar on stderr unless `progress` is
        false; returns self once it completed. Raises `JobFailed` (the node's reason) if it
        failed or was cancelled, `TimeoutError` if it runs past `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with JobProgress(progress) as bar:
            while self.refresh().state not in FINAL_STATES:
                bar.show(self.info)
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"job {self.id} is still {self.state} after {timeout} s")
                left = POLL_INTERVAL_S if deadline is None else deadline - time.monotonic()
                time.sleep(max(0.0, min(POLL_INTERVAL_S, left)))
            bar.show(self.info)
        if self.state != "completed":
            raise JobFailed(self.id, self.state, self.info.get("reason", ""))
        return self

    def weights(self, path: str | Path | None = None) -> dict[str, torch.Tensor]:
        """The trained weights by name (a completed job's), also saved to `path` if given."""
        from safetensors.torch import load

        data = self._connection.get_bytes(f"/api/v1/jobs/{self.id}/weights")
        if path is not None:
            Path(path).write_bytes(data)
        return load(data)

    def load_into(self, module: Module, strict: bool = True) -> Module:
        """Load the trained weights into `module` (built like the job's model); returns it."""
        module.load_state_dict(self.weights(), strict=strict)
        return module


def job(job_id: str, *, api: str | None = None, token: str | None = None) -> Job:
    """The job `job_id` of the node (read now: an unknown id is a `NodeError`)."""
    if not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"{job_id!r} is not a job id (16 hex digits)")
    connection = Connection.to(api, token)
    return Job(connection.get_json(f"/api/v1/jobs/{job_id}"), connection)


def jobs(*, api: str | None = None, token: str | None = None) -> list[Job]:
    """The node's jobs, as its list shows them (`refresh()` one for its spec and timeline)."""
    connection = Connection.to(api, token)
    return [Job(info, connection) for info in connection.get_json("/api/v1/jobs")]
