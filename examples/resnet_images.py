"""A small ResNet on image arrays, trained by a peer; then evaluated here.

    meshminer node run
    python examples/resnet_images.py --steps 600 --out resnet.safetensors

The images are scikit-learn's 8x8 digits, written as an `.npz` of `x` (N, 1, 8, 8)
float32 and `y` (N,) labels, the layout any image array takes. BatchNorm makes the
model behave differently in training and evaluation, so `meshminer.export` sends both
graphs. The trained weights load into the module and are saved for the fine-tune
example (`examples/finetune_head.py`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from sklearn.datasets import load_digits
from torch import nn

import meshminer


class Block(nn.Module):
    def __init__(self, channels: int, stride: int = 1) -> None:
        super().__init__()
        out = channels * stride
        self.conv1 = nn.Conv2d(channels, out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out)
        self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out)
        self.shortcut = nn.Sequential()
        if stride != 1:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels, out, 1, stride, bias=False), nn.BatchNorm2d(out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu_(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        y += self.shortcut(x)
        return torch.relu_(y)


class ResNet(nn.Module):
    def __init__(self, classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        )
        self.layer1 = Block(width)
        self.layer2 = Block(width, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.layer2(self.layer1(self.stem(x)))), 1))


def digits_npz(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The digits as image arrays in `path`; returns them as tensors too."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    np.savez(path, x=x, y=y)
    return torch.from_numpy(x), torch.from_numpy(y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--out", type=Path, default=Path("resnet.safetensors"))
    parser.add_argument("--api", default=None, help="your node's API (default: as the CLI)")
    args = parser.parse_args()

    x, y = digits_npz(args.out.with_name("digits.npz"))
    torch.manual_seed(0)
    model = ResNet()
    job = meshminer.submit(
        model,
        x[:4],
        data=args.out.with_name("digits.npz"),
        steps=args.steps,
        data__batch_size=32,
        optim__lr=3e-3,
        name="resnet-digits",
        api=args.api,
    )
    job.wait()
    job.load_into(model)
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(-1) == y).float().mean().item()
    print(f"validation accuracy (the node's): {job.metrics['val_accuracy']:.3f}")
    print(f"accuracy on all digits, here: {accuracy:.3f}")
    save_file(model.state_dict(), args.out)
    print(f"weights: {args.out}")


if __name__ == "__main__":
    main()
