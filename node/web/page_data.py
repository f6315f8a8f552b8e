"""What the status pages read from node state: functions the pages run in the node's
thread through the bridge (`bridge.call(fn, ...)`), each returning plain data."""

from __future__ import annotations

from typing import Any

_PROGRESS = ("step", "total_steps", "loss", "samples_per_s")


def overview(node: Any, work: Any) -> dict[str, Any]:
    """`node.status()` plus the unit this machine is training now (or None)."""
    status = node.status()
    status["training"] = training_now(work)
    return status


def training_now(work: Any) -> dict[str, Any] | None:
    """The unit training on this machine: a peer's (we are its worker) or our own job."""
    if work is None:
        return None
    worker = getattr(work, "worker", None)
    unit = getattr(worker, "current", None)
    if unit is not None:
        progress = unit.progress
        return {
            "role": "worker",
            "owner": unit.owner,
            "job_id": unit.package.job_id,
            "unit_id": unit.package.unit_id,
            "name": str(unit.spec.get("name", "")),
            "phase": unit.phase,
            **{k: progress.get(k) for k in _PROGRESS},
        }
    ctx = work.ctx
    for job in ctx.jobs.in_state("running"):
        if job.worker == ctx.peer_id and job.unit_id in ctx.units_here:
            progress = job.progress
            return {
                "role": "owner",
                "owner": ctx.peer_id,
                "job_id": job.id,
                "unit_id": job.unit_id,
                "name": job.name,
                "phase": progress.get("phase", "training"),
                **{k: progress.get(k) for k in _PROGRESS},
            }
    return None


def job_view(work: Any, job_id: str) -> dict[str, Any] | None:
    """One job as the API shows it, plus its receipt's bytes and whether the weights
    are here to download; None for an unknown job."""
    job = work.job(job_id)
    if job is None:
        return None
    unit_id = job.get("unit_id") or ""
    job["receipt_bytes"] = work.ctx.jobs.receipt(unit_id) if unit_id else None
    job["has_weights"] = work.weights_path(job_id) is not None
    return job
