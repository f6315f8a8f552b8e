"""What this machine can offer: its accelerators and a measured throughput figure.

GPUs come from NVML (nvidia-ml-py) when present, else from torch; a node without a
GPU advertises its CPU. Throughput is measured, not looked up: a short matmul loop
at first start gives TFLOP/s, cached in the data dir with what else needs torch to
learn (keyed by hardware and torch build), so a restart neither measures nor imports
torch, and re-measured when the user asks.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from protocol import GpuInfo

log = logging.getLogger(__name__)

CACHE_FILE = "capacity.json"
MEASURE_TIMEOUT_S = 300.0  # a measurement takes seconds; a hung one is measured over


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


def measure_elsewhere(data_dir: Path, refresh: bool = False) -> subprocess.Popen | None:
    """Start measuring in a process of its own (`measure_main`) when a measurement is
    due and its answer can come back through the cache: the daemon then never imports
    torch (2-3 s of CPU and the memory it keeps), and a first start measures while the
    daemon imports its own modules. None when the cache holds, or when only torch can
    tell the machine apart (`machine_fingerprint`)."""
    nvml_gpus = _nvml_gpus()
    fingerprint = machine_fingerprint(nvml_gpus)
    if fingerprint is None:
        return None
    cached = _read_cache(data_dir / CACHE_FILE, fingerprint, nvml_gpus or [_cpu_info()])
    if cached is not None and not refresh:
        return None
    code = "import sys; from node.machine.capacity import measure_main; measure_main(sys.argv[1:])"
    args = [sys.executable, "-c", code, str(data_dir)]
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return subprocess.Popen(
            [*args, *(["--refresh"] if refresh else [])],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
    except OSError:  # the node says what is wrong with its data dir when it starts
        return None


def measured_capacity(
    data_dir: Path, measuring: subprocess.Popen | None, refresh: bool = False
) -> LocalCapacity:
    """The capacity, once `measuring` (from `measure_elsewhere`) has written the cache;
    measured here when it could not (or nothing measured elsewhere and `refresh`)."""
    if measuring is None:
        return local_capacity(data_dir, refresh)
    try:
        code = measuring.wait(timeout=MEASURE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        measuring.kill()
        code = measuring.wait()
    if code != 0:
        log.warning("measuring in a process of its own failed (exit %s); measuring here", code)
        return local_capacity(data_dir, refresh)
    capacity = local_capacity(data_dir)  # the cache it wrote (measured here if it did not)
    log.info("measured %.3f TFLOP/s on %s", capacity.tflops, capacity.gpus[0].name)
    return capacity


def local_capacity(data_dir: Path, refresh: bool = False) -> LocalCapacity:
    """Devices and throughput, from the data dir's cache unless `refresh` or the machine
    changed. A cache hit does not import torch: that is 1.7 s of CPU, more than half of
    what a node's start costs."""
    cache = data_dir / CACHE_FILE
    nvml_gpus = _nvml_gpus()
    fingerprint = machine_fingerprint(nvml_gpus)
    if not refresh and fingerprint is not None:
        cached = _read_cache(cache, fingerprint, nvml_gpus or [_cpu_info()])
        if cached is not None:
            return cached
    import torch

    gpus = nvml_gpus or _torch_gpus() or [_cpu_info()]
    device = "cuda" if gpus[0].kind == "cuda" else "cpu"
    tflops = measure_tflops(device)
    log.info("measured %.3f TFLOP/s on %s (%s)", tflops, gpus[0].name, device)
    capacity = LocalCapacity(
        gpus, tflops, torch.__version__, torch.version.cuda or "", determinism_class(gpus)
    )
    if fingerprint is not None:
        cache.write_text(
            json.dumps(
                {
                    "fingerprint": fingerprint,
                    "tflops": tflops,
                    "torch_version": capacity.torch_version,
                    "cuda_version": capacity.cuda_version,
                    "determinism": capacity.determinism,
                    "measured_at": time.time(),
                }
            )
        )
    return capacity


def machine_fingerprint(nvml_gpus: list[GpuInfo]) -> str | None:
    """What the cached figures depend on, read without importing torch: the GPUs NVML
    sees, torch's build, the CPU and the thread settings. None where only torch can
    tell whether there is a GPU (a GPU driver is loaded but NVML cannot be asked)."""
    if not nvml_gpus and any(Path(p).exists() for p in ("/proc/driver/nvidia", "/dev/kfd")):
        return None
    try:
        torch_build = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    threads = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY")}
    cores = [os.cpu_count(), len(os.sched_getaffinity(0))]
    return json.dumps([[g.name for g in nvml_gpus], torch_build, _cpu_model(), cores, threads])


def _cpu_model() -> str:
    """The CPU's model and instruction-set flags, which pick torch's CPU kernels."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(
        line.split(":", 1) for line in text.split("\n\n", 1)[0].splitlines() if ":" in line
    )
    model = fields.get("model name", "").strip()
    flags = fields.get("flags", "").strip()
    return f"{platform.machine()} {model} {hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def _read_cache(cache: Path, fingerprint: str, gpus: list[GpuInfo]) -> LocalCapacity | None:
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint:
        return None
    tflops = data.get("tflops")
    texts = [data.get(k) for k in ("torch_version", "cuda_version", "determinism")]
    if not isinstance(tflops, int | float) or not tflops >= 0:
        return None
    if not all(isinstance(t, str) and len(t) <= 200 for t in texts):
        return None
    return LocalCapacity(gpus, float(tflops), *texts)


def measure_main(args: list[str]) -> None:
    """`measure_elsewhere`'s process (`DATA_DIR [--refresh]`): measure, write the cache."""
    local_capacity(Path(args[0]), refresh="--refresh" in args[1:])
