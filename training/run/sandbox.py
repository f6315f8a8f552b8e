"""Limits a runner subprocess puts on itself before training.

Only for `python -m training.run.runner`, never in-process: these limits hold for the
whole process, and in a daemon they would bind the daemon.

- Memory: `RLIMIT_AS` (address space). Importing torch alone maps a few hundred MiB to
  a few GiB of address space that is never touched, so the limit is set to the
  address space in use after torch, the parts of it training imports lazily, and its
  thread pool have started, plus
  `memory_limit_mb`. On CUDA it is skipped (the driver reserves far more address
  space than any useful limit), and a note says so; the executor should watch RSS.
- GPU memory: `torch.cuda.set_per_process_memory_fraction` on the training device.
"""

from __future__ import annotations

import os
import resource


def address_space_bytes() -> int:
    """This process's current virtual memory size."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[0])
    return pages * os.sysconf("SC_PAGE_SIZE")


def limit_memory(memory_limit_mb: int, device_type: str) -> str | None:
    """Cap the address space; returns a note when the limit was not applied."""
    if memory_limit_mb <= 0:
        return None
    if device_type == "cuda":
        return "memory_limit_mb not applied: RLIMIT_AS breaks CUDA; watch the RSS instead"
    try:
        import torch

        torch.ones(256, 256) @ torch.ones(256, 256)  # start the intra-op thread pool first
        limit = address_space_bytes() + memory_limit_mb * 2**20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (OSError, ValueError) as exc:
        return f"memory_limit_mb not applied: {exc}"
    return None


def limit_gpu_memory(fraction: float, device: object) -> str | None:
    """Cap this process's share of the GPU's memory (CUDA only)."""
    import torch

    if not isinstance(device, torch.device) or device.type != "cuda" or fraction >= 1.0:
        return None
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return None
