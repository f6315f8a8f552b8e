"""training.ops: each Triton kernel's memory bandwidth against a plain copy, and its
speed against the unfused torch reference, in the same run.

    .venv/bin/python -m benchmarks.ops [--numel N] [--k 8] [--block-size 256]
                                       [--repeats 20] [--adamw-tensors 200]
                                       [--quiet 1.0 --quiet-wait 0]

On a CUDA machine, for each op:
- **bytes**: what the op must read and write once (e.g. quantizing n bf16 values
  reads 2n bytes and writes n codes and 4n/block_size bytes of scales).
- **kernel GB/s** and **copy GB/s**: those bytes over the kernel's median time, and a
  plain device-to-device `copy_` moving the same number of bytes (half read, half
  written) over its median time; **of copy** is their ratio (goal: >= 0.70 for
  quantize and dequantize).
- **vs reference**: the unfused pure-torch reference (`training.ops.reference`) on
  the same tensors, its time over the kernel's (goal: >= 2x for the fused outer step
  and AdamW). For AdamW, `torch.optim.AdamW` (per-tensor, foreach and fused) over the
  same elements split into `--adamw-tensors` parameters is timed too, for context.
Times are CUDA-event medians of `--repeats` runs of a few launches each, after warm-up.

Without a GPU it times the references on the CPU only (and a CPU copy for scale), and
says that no GPU was found: the kernels' figures need a GPU. CPU timings move with
other work on the machine: `--quiet-wait S` waits up to S seconds for a load average
below `--quiet` first, and the load is recorded with the results. With `--interpreter`
(and TRITON_INTERPRET=1 in the environment) it runs the GPU path's code on small CPU
tensors in Triton's interpreter, to check this script itself; those times mean
nothing and are not written to the results.

Prints a table and writes benchmarks/results/ops.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from training import ops
from training.ops import _dispatch, reference

RESULTS = Path(__file__).parent / "results" / "ops.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GOALS = {"quantize": 0.70, "dequantize": 0.70}  # of copy bandwidth
SPEEDUP_GOALS = {"outer step": 2.0, "adamw": 2.0}  # over the unfused reference


@dataclass
class Case:
    """One op at one size: what it moves, and how to run it each way."""

    name: str
    detail: str
    nbytes: int
    kernel: Callable[[], Any] | None
    reference: Callable[[], Any]
    context: dict[str, Callable[[], Any]] = field(default_factory=dict)


class Timer:
    """Median seconds per call: CUDA events on a GPU, perf_counter on the CPU. The
    fastest sample is kept too (`best`): on a shared CPU it is the steadier figure."""

    def __init__(self, device: torch.device, repeats: int, inner: int) -> None:
        self.device, self.repeats, self.inner = device, repeats, inner
        self.best = math.nan

    def __call__(self, fn: Callable[[], Any]) -> float:
        for _ in range(2):  # warm-up: compile, allocate, fault pages in
            fn()
        self._sync()
        samples = []
        for _ in range(self.repeats):
            if self.device.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(self.inner):
                    fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / 1e3 / self.inner)
            else:
                started = time.perf_counter()
                for _ in range(self.inner):
                    fn()
                samples.append((time.perf_counter() - started) / self.inner)
        self.best = min(samples)
        return statistics.median(samples)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def copy_seconds(timer: Timer, nbytes: int, device: torch.device) -> float:
    """A plain copy that moves `nbytes` in all: nbytes/2 read, nbytes/2 written."""
    half = max(nbytes // 2, 1)
    src = torch.empty(half, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    src.fill_(1)
    return timer(lambda: dst.copy_(src))


def quantize_cases(numel: int, block_size: int, device: torch.device) -> list[Case]:
    cases = []
    nblocks = -(-numel // block_size)
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        x = torch.randn(numel, device=device).to(dtype)
        q = ops.quantize_blockwise(x, block_size)
        size = x.element_size()
        packed = numel + 4 * nblocks
        cases.append(
            Case(
                "quantize",
                name,
                numel * size + packed,
                lambda x=x: ops.quantize_blockwise(x, block_size),
                lambda x=x: reference.quantize_blockwise(x, block_size),
            )
        )
        cases.append(
            Case(
                "dequantize",
                name,
                packed + numel * size,
                lambda q=q: ops.dequantize_blockwise(q),
                lambda q=q, dtype=dtype: reference.dequantize_blockwise(
                    q.codes, q.scales, q.shape, dtype, block_size
                ),
            )
        )
    return cases


def outer_case(numel: int, k: int, block_size: int, device: torch.device) -> Case:
    gen = torch.Generator(device=device).manual_seed(0)
    deltas = [
        ops.quantize_blockwise(torch.randn(numel, device=device, generator=gen) * 1e-3, block_size)
        for _ in range(k)
    ]
    batch = ops.QuantizedBatch.stack(deltas)
    params = torch.randn(numel, device=device)
    buf = torch.zeros(numel, device=device)
    ref_params, ref_buf = params.clone(), buf.clone()
    nblocks = -(-numel // block_size)
    moved = k * (numel + 4 * nblocks) + 2 * (4 * numel + 4 * numel)  # codes+scales; p, buf r+w

    def fused() -> None:
        torch.ops.meshminer.outer_nesterov_step_(
            params, buf, batch.codes, batch.scales, block_size, 0.7, 0.9
        )

    def unfused() -> None:
        reference.outer_nesterov_step_(
            ref_params, ref_buf, batch.codes, batch.scales, block_size, 0.7, 0.9
        )

    detail = f"K={k}, float32 params and momentum"
    return Case("outer step", detail, moved, fused, unfused)


def adamw_case(numel: int, tensors: int, device: torch.device, with_kernel: bool) -> Case:
    flat = [torch.randn(numel, device=device) for _ in range(4)]
    flat[3].abs_()  # exp_avg_sq
    ref = [t.clone() for t in flat]
    steps = iter(range(1, 10**9))

    def fused() -> None:
        torch.ops.meshminer.adamw_step_(
            flat[0], flat[1], flat[2], flat[3], 1e-3, 0.9, 0.999, 1e-8, 1e-2, next(steps)
        )

    def unfused() -> None:
        reference.adamw_step_(ref[0], ref[1], ref[2], ref[3], 1e-3, 0.9, 0.999, 1e-8, 1e-2, 5)

    context = {}
    sizes = [numel // tensors + (1 if i < numel % tensors else 0) for i in range(tensors)]
    for label, options in (
        ("torch.optim.AdamW (per tensor)", {"foreach": False}),
        ("torch.optim.AdamW (foreach)", {"foreach": True}),
        ("torch.optim.AdamW (fused)", {"fused": True}),
    ):
        if options.get("fused") and device.type != "cuda":
            continue
        params = [torch.nn.Parameter(torch.randn(n, device=device)) for n in sizes]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2, **options)
        context[label] = opt.step
    detail = f"float32, one flat buffer ({tensors} tensors for torch.optim)"
    moved = 4 * numel * 4 + 3 * numel * 4
    return Case("adamw", detail, moved, fused if with_kernel else None, unfused, context)


def run(args: argparse.Namespace, device: torch.device, with_kernels: bool) -> list[dict]:
    timer = Timer(device, args.repeats, args.inner)
    cases = quantize_cases(args.numel, args.block_size, device)
    cases.append(outer_case(args.numel, args.k, args.block_size, device))
    cases.append(adamw_case(args.numel, args.adamw_tensors, device, with_kernels))
    rows = []
    for case in cases:
        copy_s = copy_seconds(timer, case.nbytes, device)
        ref_s = timer(case.reference)
        ref_best_s = timer.best
        row: dict[str, Any] = {
            "op": case.name,
            "detail": case.detail,
            "bytes": case.nbytes,
            "copy_gbps": round(case.nbytes / copy_s / 1e9, 1),
            "reference_ms": round(ref_s * 1e3, 3),
            "reference_gbps": round(case.nbytes / ref_s / 1e9, 1),
            "reference_best_ms": round(ref_best_s * 1e3, 3),
            "reference_best_gbps": round(case.nbytes / ref_best_s / 1e9, 1),
        }
        if with_kernels and case.kernel is not None:
            kernel_s = timer(case.kernel)
            row.update(
                kernel_ms=round(kernel_s * 1e3, 3),
                kernel_gbps=round(case.nbytes / kernel_s / 1e9, 1),
                of_copy=round(copy_s / kernel_s, 3),
                speedup_vs_reference=round(ref_s / kernel_s, 2),
            )
        for label, fn in case.context.items():
            row[label] = round(timer(fn) * 1e3, 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def wait_for_quiet(below: float, at_most_s: float) -> float:
    """Wait (up to `at_most_s`) for the 1-minute load average to drop below `below`:
    on a 2-core machine other work moves CPU timings more than anything measured."""
    started = time.monotonic()
    while os.getloadavg()[0] >= below and time.monotonic() - started < at_most_s:
        time.sleep(2)
    return time.monotonic() - started


def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": None,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    if _dispatch.triton_available():
        import triton

        info["triton"] = triton.__version__
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=torch.cuda.get_device_name(device),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
        )
    return info


def table(rows: list[dict], with_kernels: bool) -> None:
    if with_kernels:
        head = ("op", "detail", "MB", "kernel ms", "GB/s", "copy GB/s", "of copy", "vs ref")
        keys = ("kernel_ms", "kernel_gbps", "copy_gbps", "of_copy", "speedup_vs_reference")
    else:
        head = ("op", "detail", "MB", "ref ms (median)", "ref ms (best)", "best GB/s", "copy GB/s")
        keys = ("reference_ms", "reference_best_ms", "reference_best_gbps", "copy_gbps")
    lines = [head]
    for row in rows:
        values = [row.get(key, "-") for key in keys]
        lines.append((row["op"], row["detail"], f"{row['bytes'] / 1e6:.1f}", *map(str, values)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    for row in rows:
        extra = {k: v for k, v in row.items() if k.startswith("torch.optim")}
        if extra:
            print(f"{row['op']}: " + ", ".join(f"{k} {v} ms" for k, v in extra.items()))


def goals(rows: list[dict]) -> dict[str, bool]:
    met = {}
    for row in rows:
        label = f"{row['op']} {row['detail']}"
        if row["op"] in GOALS and "of_copy" in row:
            met[label] = row["of_copy"] >= GOALS[row["op"]]
        if row["op"] in SPEEDUP_GOALS and "speedup_vs_reference" in row:
            met[label] = row["speedup_vs_reference"] >= SPEEDUP_GOALS[row["op"]]
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numel", type=int, default=None, help="elements per tensor")
    parser.add_argument("--k", type=int, default=8, help="deltas averaged by the outer step")
    parser.add_argument("--block-size", type=int, default=ops.DEFAULT_BLOCK_SIZE)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--inner", type=int, default=None, help="calls per timed sample")
    parser.add_argument("--adamw-tensors", type=int, default=200)
    parser.add_argument("--quiet", type=float, default=1.0, help="CPU: wait for a load below")
    parser.add_argument("--quiet-wait", type=float, default=0, help="CPU: for at most this long")
    parser.add_argument(
        "--interpreter",
        action="store_true",
        help="check this script: the GPU path on CPU in Triton's interpreter (no figures)",
    )
    args = parser.parse_args()

    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    interpreter = args.interpreter and not gpu
    if gpu:
        defaults = (1 << 26, 20, 5)  # 64 Mi elements: 256 MiB per float32 tensor
    elif interpreter:
        defaults = (5000, 1, 1)
    else:
        defaults = (1 << 22, 5, 1)  # 4 Mi elements: a few seconds on two cores
    args.numel = args.numel or defaults[0]
    args.repeats = args.repeats or defaults[1]
    args.inner = args.inner or defaults[2]

    if gpu:
        print(f"GPU: {torch.cuda.get_device_name(device)}; Triton kernels vs references")
        if not _dispatch.triton_available():
            raise SystemExit("a GPU but no triton: pip install -e '.[gpu]'")
        rows = run(args, device, with_kernels=True)
    elif interpreter:
        from training.ops.testing import triton_on_cpu

        print("no GPU found; --interpreter: kernels in Triton's interpreter (times mean nothing)")
        with triton_on_cpu():
            rows = run(args, device, with_kernels=True)
        table(rows, with_kernels=True)
        print(f"goals (meaningless here): {goals(rows)}")
        return
    else:
        print(
            "no GPU found: timing the pure-torch references on the CPU only; the Triton "
            "kernels' bandwidth and speedups need a CUDA machine"
        )
        waited = wait_for_quiet(args.quiet, args.quiet_wait)
        if waited:
            print(f"waited {waited:.0f} s for a load average below {args.quiet}")
        rows = run(args, device, with_kernels=False)

    result = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": "cuda" if gpu else "cpu",
        "gpu_found": gpu,
        "machine": machine(device),
        "numel": args.numel,
        "k": args.k,
        "block_size": args.block_size,
        "repeats": args.repeats,
        "inner": args.inner,
        "rows": rows,
        "goals_met": goals(rows),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print()
    table(rows, with_kernels=gpu)
    if gpu:
        print(f"\ngoals met: {result['goals_met']}")
    print(f"\n{RESULTS}")


if __name__ == "__main__":
    main()
