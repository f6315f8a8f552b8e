"""The live progress bar `Job.wait()` shows on stderr: steps, loss, an elastic job's round."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


class JobProgress:
    """A one-line bar for one job; `show(job_json)` brings it up to date."""

    def __init__(self, enabled: bool) -> None:
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} steps"),
            TextColumn("{task.fields[loss]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            disable=not enabled,
        )
        self._task = self._bar.add_task("", total=None, loss="")

    def __enter__(self) -> JobProgress:
        self._bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._bar.stop()

    def show(self, job: dict[str, Any]) -> None:
        progress = job.get("progress") or {}
        loss = progress.get("loss")
        self._bar.update(
            self._task,
            description=_describe(job, progress),
            total=progress.get("total_steps") or None,
            completed=progress.get("step", 0),
            loss=f"loss {loss:.4f}" if isinstance(loss, float) else job.get("reason", "")[:60],
        )


def _describe(job: dict[str, Any], progress: dict[str, Any]) -> str:
    """The job's state and, for an elastic job, its round; for a sweep, its trials."""
    if "round" in progress:
        return f"{job['state']}, round {progress['round'] + 1}/{progress['rounds']}"
    if "trials" in progress:
        t = progress["trials"]
        return f"{job['state']}: {t['complete']} of the trials complete, {t['running']} running"
    return str(job["state"])
