"""A fine-tune: start from the weights a first job produced and train only the head.

    python examples/resnet_images.py --out resnet.safetensors     # the first job
    python examples/finetune_head.py --init resnet.safetensors --steps 200

`init=` uploads the first job's weights (safetensors: every tensor must be the model's,
by name, shape and dtype) and `model__trainable` freezes every parameter outside the
glob patterns: the optimizer, the checkpoints a volunteer keeps as evidence and the
credit then cover only the head. BatchNorm's running statistics still move, as in
PyTorch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from resnet_images import ResNet, digits_npz
from safetensors.torch import load_file

import meshminer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--init", type=Path, default=Path("resnet.safetensors"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--api", default=None, help="your node's API (default: as the CLI)")
    args = parser.parse_args()

    x, y = digits_npz(args.init.with_name("digits.npz"))
    model = ResNet()
    model.load_state_dict(load_file(args.init))  # what the job starts from
    job = meshminer.submit(
        model,
        x[:4],
        data=args.init.with_name("digits.npz"),
        steps=args.steps,
        init=args.init,
        model__trainable=["fc.*"],
        data__batch_size=32,
        optim__lr=1e-3,
        name="resnet-head",
        api=args.api,
    )
    job.wait()
    before = load_file(args.init)
    job.load_into(model)
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    print(f"trained {job.info['spec']['model']['trainable_parameters']} parameters: {moved}")
    print(f"validation accuracy: {job.metrics['val_accuracy']:.3f}")


if __name__ == "__main__":
    main()
