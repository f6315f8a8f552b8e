"""What only a CUDA machine can answer about training, in one run: whether spot checks
hold on a GPU, whether the sandboxed runner trains on one, and what an elastic round
costs there. The kernels' own figures are `benchmarks.ops`, the interpreter's speed
`benchmarks.programs --device cuda`.

    python -m benchmarks.gpu [--parts cuda_start determinism sandbox elastic] [--steps 60]

The job is a GPT written in plain PyTorch (tests/programs/models.py, dropout on),
exported and converted as an owner's node does, on token ids drawn from a fixed
Markov chain (so the loss has somewhere to go), in fp32 and in bf16 autocast.

- **determinism**: the runner's `train` task with checkpoints, again without, then
  the owner's `replay` of every segment, all on the GPU: the spot check passes only
  if each replayed segment ends on the worker's checkpoint hash, bit for bit. A CPU
  replay of every segment measures the distance across device kinds, against the
  owner's tolerance (`training.evidence.checkpoints`), beside what a tolerance must
  tell it from: each segment's own movement, and the distance of a worker that
  skipped the segment's last step (replayed on the CPU and on the GPU).
- **sandbox**: `python -m training.run.runner` as the node starts it (rlimits,
  Landlock, no network, a GPU memory share): it must train and write the same
  weights as the unsandboxed run.
- **cuda_start**: what each runner forked by a node's fork server pays to start CUDA
  (its context, then cuBLAS's first product), three times.
- **elastic**: `train-local` of an elastic job on the GPU (the simulation goes
  through the network's round functions): seconds per round and validation loss.

Prints each part as it ends and writes benchmarks/results/gpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from node.work.trust import tolerance_of
from protocol import encode
from tests.programs.export import export_pair
from tests.programs.models import GPT
from training.evidence.bounds import STEP_RATIO
from training.evidence.steps import checkpoint_steps
from training.model.bind import bind_trainable
from training.model.weights import file_sha256
from training.program.job import convert
from training.run.local import train_local
from training.run.runner import run_request
from training.spec.job import parse_spec, spec_to_plain, with_blob_source

RESULTS = Path(__file__).parent / "results" / "gpu.json"
VOCAB, CONTEXT = 512, 128
DEVICE = "cuda"  # --device cpu: a dry run of this script on a machine without a GPU


def write_tokens(path: Path, n: int = 400_000, seed: int = 0) -> None:
    """Token ids from a Markov chain: each id has four likely successors."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, VOCAB, size=(VOCAB, 4))
    choice = rng.integers(0, 4, size=n)
    noise = rng.random(n) < 0.1
    random_ids = rng.integers(0, VOCAB, size=n)
    ids = np.empty(n, dtype=np.uint16)
    ids[0] = 0
    for i in range(1, n):
        ids[i] = random_ids[i] if noise[i] else successors[ids[i - 1], choice[i]]
    ids.tofile(path)


def export_model(folder: Path, width: int, layers: int, dropout: float) -> None:
    torch.manual_seed(0)
    heads = max(1, width // 64)
    model = GPT(
        vocab=VOCAB, context=CONTEXT, width=width, layers=layers, heads=heads, dropout=dropout
    )
    export_pair(model, (torch.randint(0, VOCAB, (2, CONTEXT)),), folder)


def raw_spec(folder: Path, precision: str, steps: int | None, **top: Any) -> dict[str, Any]:
    return {
        "name": f"gpu-{precision}",
        "seed": 7,
        "model": {
            "arch": "program",
            "program": str(folder / "model.pt2"),
            "eval_program": str(folder / "model.eval.pt2"),
        },
        "data": {"source": str(folder / "train.bin"), "format": "tokens16", "batch_size": 16},
        "optim": {"lr": 3e-4, "precision": precision, **({"steps": steps} if steps else {})},
        **top,
    }


def blob_job(folder: Path, precision: str, steps: int, checkpoints: int) -> tuple[dict, dict]:
    """The plain spec naming blobs, and the blobs' files, as an owner's node sends them."""
    trust = (
        {"checkpoints": checkpoints} if checkpoints else {"checkpoints": 0, "spot_check_budget": 0}
    )
    spec = parse_spec(raw_spec(folder, precision, steps, trust=trust))
    bound, program = convert(spec)
    sha = bound.model.program.removeprefix("blob:")  # type: ignore[union-attr]
    (folder / f"{sha}.program").write_bytes(program)
    tokens = folder / "train.bin"
    bound = with_blob_source(bind_trainable(bound), file_sha256(tokens), "tokens16")
    blobs = {sha: str(folder / f"{sha}.program"), file_sha256(tokens): str(tokens)}
    return spec_to_plain(bound), blobs


def request(spec: dict, blobs: dict, folder: Path, device: str = "", **more: Any) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    out = str(folder / "weights.safetensors")
    return {"spec": spec, "blobs": blobs, "out": out, "device": device or DEVICE, **more}


def timed(req: dict) -> dict[str, Any]:
    began = time.monotonic()
    result = run_request(req, lambda event: None)
    result["took_s"] = round(time.monotonic() - began, 2)
    return result


def determinism(folder: Path, precision: str, steps: int) -> dict[str, Any]:
    spec, blobs = blob_job(folder, precision, steps, checkpoints=6)
    worker = timed(request(spec, blobs, folder / f"worker-{precision}", checkpoints=True))
    again = timed(request(spec, blobs, folder / f"again-{precision}"))
    cps = worker["checkpoints"]
    files = sorted((folder / f"worker-{precision}" / "checkpoints").iterdir())
    blobs = blobs | {sha: str(path) for sha, path in zip(cps, files, strict=True)}
    steps_at = checkpoint_steps(steps, 6)
    segments = [
        {"start": steps_at[i], "end": steps_at[i + 1], "from": cps[i]} for i in range(len(cps) - 1)
    ]
    table = {"init": True, "segments": segments, "final": cps[-1]}
    replay = timed(request(spec, blobs, folder / f"owner-{precision}", task="replay", replay=table))
    claimed = [s | {"claimed": cps[i + 1]} for i, s in enumerate(segments)]
    across = timed(
        request(
            spec,
            blobs,
            folder / f"cpu-{precision}",
            device="cpu",
            task="replay",
            replay={"segments": claimed},
        )
    )
    # a worker that skipped the last step of each segment, as a CPU owner and as a
    # GPU owner would measure it: what a tolerance must tell apart from the above
    skipped = [s | {"end": s["end"] - 1, "claimed": cps[i + 1]} for i, s in enumerate(segments)]
    cheat = {
        device: timed(
            request(spec, blobs, folder / f"skip-{device}-{precision}", device=device,
                    task="replay", replay={"segments": skipped})
        )
        for device in ("cpu", DEVICE)
    }  # fmt: skip
    tolerance = tolerance_of({"optim": {"precision": precision}}, kinds=True)
    return {
        "precision": precision,
        "steps": steps,
        "train_s": worker["took_s"],
        "train_again_s": again["took_s"],
        "val_loss": worker["metrics"].get("val_loss"),
        "run_to_run_bitwise": again["weights_sha256"] == worker["weights_sha256"],
        "replay_s": replay["took_s"],
        "replay_init_bitwise": replay["init_sha256"] == cps[0],
        "replay_segments_bitwise": [a == b for a, b in zip(replay["ends"], cps[1:], strict=True)],
        "replay_final_bitwise": replay["weights_sha256"] == worker["weights_sha256"],
        "cpu_replay_s": across["took_s"],
        "cpu_vs_gpu_distance": across["distances"],
        # in the replay's own last steps: what an owner without a GPU holds to STEP_RATIO
        "cpu_vs_gpu_step_ratio": across["step_ratios"],
        "within_step_ratio": all(r <= STEP_RATIO for r in across["step_ratios"]),
        "cpu_vs_gpu_cpu_hashes_equal": [
            a == b for a, b in zip(across["ends"], cps[1:], strict=True)
        ],
        "segment_movement": [movement(files[i], files[i + 1]) for i in range(len(segments))],
        "one_step_skipped_cpu_distance": cheat["cpu"]["distances"],
        "one_step_skipped_cpu_step_ratio": cheat["cpu"]["step_ratios"],
        "one_step_skipped_same_device_distance": cheat[DEVICE]["distances"],
        "tolerance": tolerance,
        "within_tolerance": all(d <= tolerance for d in across["distances"]),
    }


def movement(start: Path, end: Path) -> float:
    """How far a segment moved the weights: the largest relative L2 change of a weight
    tensor between two checkpoints (the measure `relative_distance` uses)."""
    a, b = load_file(str(start)), load_file(str(end))
    worst = 0.0
    for name, after in b.items():
        if name.startswith("model.") and after.is_floating_point():
            change = float((after.double() - a[name].double()).norm())
            worst = max(worst, change / max(float(after.double().norm()), 1e-12))
    return worst


def sandbox(folder: Path, steps: int) -> dict[str, Any]:
    """The runner as the node starts it, against the same request run in this process."""
    spec, blobs = blob_job(folder, "fp32", steps, checkpoints=0)
    plain = timed(request(spec, blobs, folder / "in-process"))
    limits = {
        "gpu_memory_fraction": 0.5,
        "memory_limit_mb": 16384,
        "isolation": {"cpu_seconds": 900, "disk_quota_bytes": 2 << 30, "parent_pid": os.getpid()},
    }
    req = request(spec, blobs, folder / "sandboxed", **limits)
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "training.run.runner"],
        input=encode(req),
        capture_output=True,
        timeout=600,
    )
    took = round(time.monotonic() - began, 2)
    events = [json.loads(line) for line in done.stdout.decode().splitlines() if line.strip()]
    last = events[-1] if events else {}
    return {
        "exit_code": done.returncode,
        "took_s": took,
        "in_process_s": plain["took_s"],
        "device": last.get("device"),
        "same_weights": last.get("weights_sha256") == plain["weights_sha256"],
        "notes": [e.get("notes") for e in events if e.get("event") == "started"],
        "error": last.get("message") if last.get("event") == "error" else None,
        "stderr_tail": done.stderr.decode(errors="replace")[-1500:] if done.returncode else "",
    }


def elastic(folder: Path, precision: str, rounds: int) -> dict[str, Any]:
    top = {
        "mode": "elastic",
        "elastic": {"workers": 4, "rounds": rounds, "inner_steps": 50},
    }
    spec = parse_spec(raw_spec(folder, precision, None, **top))
    began = time.monotonic()
    result = train_local(spec, folder / f"elastic-{precision}.safetensors", device=DEVICE)
    per_round = result["rounds"]
    return {
        "precision": precision,
        "workers": 4,
        "inner_steps": 50,
        "rounds": rounds,
        "took_s": round(time.monotonic() - began, 2),
        "round_s": [round(r["seconds"], 3) for r in per_round],
        "val_loss": [r["val_loss"] for r in per_round],
    }


def cuda_start(repeats: int = 3) -> dict[str, Any]:
    """What each forked runner pays to start CUDA: a node's fork server imports torch
    and never starts CUDA (it does not survive a fork), so every share's runner starts
    it afresh. Forked from this process before it touches CUDA itself: the first
    tensor (the context) and the first matrix product (cuBLAS's handle), each timed."""
    runs = []
    for _ in range(repeats):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the runner's part
            os.close(read_end)
            report: dict[str, Any] = {}
            try:
                began = time.monotonic()
                torch.zeros(1, device=DEVICE).sum().item()
                report["context_s"] = round(time.monotonic() - began, 3)
                began = time.monotonic()
                x = torch.ones(256, 256, device=DEVICE)
                (x @ x).sum().item()
                report["first_matmul_s"] = round(time.monotonic() - began, 3)
            except Exception as exc:
                report["error"] = f"{type(exc).__name__}: {exc}"[:500]
            os.write(write_end, json.dumps(report).encode())
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            runs.append(json.loads(pipe.read() or b"{}"))
        os.waitpid(pid, 0)
    return {"forked_runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--parts", nargs="+", default=["cuda_start", "determinism", "sandbox", "elastic"]
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/meshminer-gpu"))
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    started = cuda_start() if "cuda_start" in args.parts else None  # before CUDA here
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: benchmarks.gpu needs a GPU")
    folder = args.folder
    folder.mkdir(parents=True, exist_ok=True)
    write_tokens(folder / "train.bin")
    export_model(folder, args.width, args.layers, args.dropout)
    results: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "model": {"width": args.width, "layers": args.layers, "dropout": args.dropout},
    }

    def part(name: str, run: Any) -> None:
        began = time.monotonic()
        try:
            results[name] = run()
        except Exception as exc:  # one part failing must not lose the others' figures
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        print(f"--- {name} ({time.monotonic() - began:.1f} s)", flush=True)
        print(json.dumps(results[name], indent=1), flush=True)
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")

    if started is not None:
        part("cuda_start", lambda: started)
    for precision in ("fp32", "bf16"):
        if "determinism" in args.parts:
            part(f"determinism_{precision}", lambda p=precision: determinism(folder, p, args.steps))
    if "sandbox" in args.parts:
        part("sandbox", lambda: sandbox(folder, args.steps))
    for precision in ("fp32", "bf16"):
        if "elastic" in args.parts:
            part(f"elastic_{precision}", lambda p=precision: elastic(folder, p, args.rounds))


if __name__ == "__main__":
    main()
