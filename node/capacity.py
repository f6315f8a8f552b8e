"""What this machine can offer: its accelerators and a measured throughput figure.

GPUs come from NVML (nvidia-ml-py) when present, else from torch; a node without a
GPU advertises its CPU. Throughput is measured, not looked up: a short matmul loop
at startup gives TFLOP/s, cached in the data dir (keyed by hardware and torch
version) so restarts are quick, and re-measured when the user asks.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

from protocol import GpuInfo

log = logging.getLogger(__name__)

CACHE_FILE = "capacity.json"


@dataclass(frozen=True)
class LocalCapacity:
    gpus: list[GpuInfo]
    tflops: float
    torch_version: str
    cuda_version: str
    determinism: str = ""


def determinism_class(gpus: list[GpuInfo]) -> str:
    """What must be equal for two nodes to train bit for bit alike: the device model,
    torch and CUDA builds, the CPU's kernel set and torch's thread count (CPU
    reductions split by thread). Spot checks and replicas compare hashes strictly
    within a class and with a tolerance across classes."""
    import torch

    device = gpus[0] if gpus else GpuInfo("unknown", kind="cpu")
    parts = [f"{device.kind}:{device.name}", f"torch {torch.__version__}"]
    if device.kind == "cuda":
        parts.append(f"cuda {torch.version.cuda or ''}")
    else:
        parts += [torch.backends.cpu.get_cpu_capability(), f"threads {torch.get_num_threads()}"]
    return " | ".join(parts)[:200]


def discover_gpus() -> list[GpuInfo]:
    """The accelerators on this machine, or the CPU as the single device."""
    gpus = _nvml_gpus() or _torch_gpus()
    return gpus or [_cpu_info()]


def _nvml_gpus() -> list[GpuInfo]:
    try:
        import pynvml  # nvidia-ml-py, optional extra "gpu"
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: NVMLError_LibraryNotFound and friends
        return []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append(
                GpuInfo(
                    name=name.decode() if isinstance(name, bytes) else name,
                    kind="cuda",
                    memory_total_mb=mem.total // 2**20,
                    memory_free_mb=mem.free // 2**20,
                    compute_capability=f"{major}.{minor}",
                )
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _torch_gpus() -> list[GpuInfo]:
    import torch

    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        gpus.append(
            GpuInfo(
                name=props.name,
                kind="cuda",
                memory_total_mb=total // 2**20,
                memory_free_mb=free // 2**20,
                compute_capability=f"{props.major}.{props.minor}",
            )
        )
    return gpus


def _cpu_info() -> GpuInfo:
    total_mb = free_mb = 0
    try:
        meminfo = dict(
            line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines()
        )
        total_mb = int(meminfo["MemTotal"].split()[0]) // 1024
        free_mb = int(meminfo["MemAvailable"].split()[0]) // 1024
    except (OSError, KeyError, ValueError):
        pass
    name = platform.processor() or platform.machine() or "cpu"
    return GpuInfo(
        name=f"{name} ({os.cpu_count() or 1} cores)"[:128],
        kind="cpu",
        memory_total_mb=total_mb,
        memory_free_mb=min(free_mb, total_mb),
    )


def measure_tflops(device: str = "cpu", budget_s: float = 0.5) -> float:
    """Dense matmul throughput in TFLOP/s, timed for about `budget_s` seconds."""
    import torch

    n, dtype = (4096, torch.float16) if device == "cuda" else (512, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm-up: kernels, allocator, thread pool
    _sync(device)
    iters, start = 0, time.perf_counter()
    while True:
        torch.matmul(a, b)
        iters += 1
        if iters % 4 == 0:
            _sync(device)
            elapsed = time.perf_counter() - start
            if elapsed >= budget_s:
                break
    return round(2 * n**3 * iters / elapsed / 1e12, 4)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def local_capacity(data_dir: Path, refresh: bool = False) -> LocalCapacity:
    """Devices and throughput, using the cached benchmark unless `refresh`."""
    import torch

    gpus = discover_gpus()
    cuda_version = torch.version.cuda or ""
    fingerprint = json.dumps([[g.name for g in gpus], torch.__version__, cuda_version])
    cache = data_dir / CACHE_FILE
    tflops = None if refresh else _cached_tflops(cache, fingerprint)
    if tflops is None:
        device = "cuda" if gpus[0].kind == "cuda" else "cpu"
        tflops = measure_tflops(device)
        log.info("measured %.3f TFLOP/s on %s (%s)", tflops, gpus[0].name, device)
        cache.write_text(
            json.dumps({"fingerprint": fingerprint, "tflops": tflops, "measured_at": time.time()})
        )
    return LocalCapacity(gpus, tflops, torch.__version__, cuda_version, determinism_class(gpus))


def _cached_tflops(cache: Path, fingerprint: str) -> float | None:
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint:
        return None
    tflops = data.get("tflops")
    return float(tflops) if isinstance(tflops, int | float) and tflops >= 0 else None
