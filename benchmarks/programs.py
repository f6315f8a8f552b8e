"""The program interpreter against eager PyTorch: one training step of a GPT, the same
module, the same batches, in the same process (goal: interpreter / eager >= 0.95 in
steps per second).

    .venv/bin/python -m benchmarks.programs [--width 256] [--layers 4] [--context 128]
                                            [--batch 8] [--steps 10] [--threads 1]

The module is exported (train and eval) and converted exactly as an owner's node does;
both sides train with AdamW, alternating step by step so that other load on the machine
falls on both. On a CUDA machine (`--device cuda`) it also times bf16 autocast steps.
Prints the medians and their ratio and writes benchmarks/results/programs.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from tests.programs.export import export_pair
from tests.programs.models import GPT
from training.program import ProgramModule, convert_pt2
from training.run.loop import autocast

RESULTS = Path(__file__).parent / "results" / "programs.json"


def _step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, x, y, device, precision
) -> float:
    began = time.perf_counter()
    with autocast(precision, device):
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    eager = GPT(
        vocab=args.vocab,
        context=args.context,
        width=args.width,
        layers=args.layers,
        heads=max(1, args.width // 64),
        dropout=0.0,
    )
    params = sum(p.numel() for p in eager.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        example = torch.randint(0, args.vocab, (2, args.context))
        began = time.perf_counter()
        export_pair(eager, (example,), Path(tmp))
        exported = time.perf_counter() - began
        began = time.perf_counter()
        program = convert_pt2(Path(tmp) / "model.pt2", Path(tmp) / "model.eval.pt2")
        converted = time.perf_counter() - began
    ours = ProgramModule(program).to(device)
    eager = eager.to(device)
    optimizers = {m: torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (eager, ours)}
    precisions = ["fp32", "bf16"] if device.type == "cuda" else ["fp32"]
    times: dict[str, list[float]] = {
        f"{name}_{p}": [] for name in ("eager", "interpreter") for p in precisions
    }
    g = torch.Generator().manual_seed(1)
    for step in range(args.steps + 2):  # two warm-up steps
        x = torch.randint(0, args.vocab, (args.batch, args.context), generator=g).to(device)
        y = torch.randint(0, args.vocab, (args.batch, args.context), generator=g).to(device)
        for precision in precisions:
            for name, model in (("eager", eager), ("interpreter", ours)):
                took = _step(model, optimizers[model], x, y, device, precision)
                if step >= 2:
                    times[f"{name}_{precision}"].append(took)
    medians = {k: statistics.median(v) for k, v in times.items()}
    tokens = args.batch * args.context
    result = {
        "parameters": params,
        "nodes": len(program.train.nodes),
        "device": device.type,
        "threads": args.threads,
        "batch": args.batch,
        "context": args.context,
        "export_s": round(exported, 3),
        "convert_s": round(converted, 3),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
    }
    for p in precisions:
        eager_s, ours_s = medians[f"eager_{p}"], medians[f"interpreter_{p}"]
        result[p] = {
            "eager_step_ms": round(1000 * eager_s, 2),
            "interpreter_step_ms": round(1000 * ours_s, 2),
            "speed_ratio": round(eager_s / ours_s, 3),
            "tokens_per_s_interpreter": round(tokens / ours_s),
        }
    print(json.dumps(result, indent=2))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
