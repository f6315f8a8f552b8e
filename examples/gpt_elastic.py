"""A GPT written in plain PyTorch, trained on a text file by peers in elastic mode.

    meshminer node run                # a node of yours, in a network of volunteers
    python examples/gpt_elastic.py --text corpus.txt --workers 3 --rounds 20

The text is tokenized here (`meshminer tokenize`: a byte-level BPE, only ids leave this
machine); the module is exported with `torch.export` and checked against the operators
volunteers run; the network trains it in DiLoCo rounds; the weights come back into the
same module, which then writes a few tokens. The default model has about 10M
parameters (nanoGPT's shape); `--tiny` makes a small one for a quick try.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import meshminer


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        nn.init.normal_(self.wte.weight, std=0.02)  # torch's N(0, 1) starts the loss at ~16
        nn.init.normal_(self.wpe.weight, std=0.02)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text", type=Path, required=True, help="a UTF-8 text file")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--inner-steps", type=int, default=100)
    parser.add_argument("--tiny", action="store_true", help="a small model, for a quick try")
    parser.add_argument("--api", default=None, help="your node's API (default: as the CLI)")
    args = parser.parse_args()

    vocab, context, width, layers, heads, batch = (
        (512, 32, 32, 1, 2, 8) if args.tiny else (4096, 256, 384, 6, 6, 16)
    )
    ids = args.text.with_suffix(".bin")
    subprocess.run(
        ["meshminer", "tokenize", str(args.text), "--out", str(ids), "--vocab-size", str(vocab)],
        check=True,
    )
    torch.manual_seed(0)
    model = GPT(vocab, context, width, layers, heads)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"GPT: {parameters / 1e6:.1f}M parameters", file=sys.stderr)
    job = meshminer.submit(
        model,
        torch.randint(0, vocab, (2, context)),
        data=ids,
        data__format="tokens16",
        data__vocab_size=vocab,
        data__batch_size=batch,
        mode="elastic",
        elastic__workers=args.workers,
        elastic__min_workers=1,
        elastic__rounds=args.rounds,
        elastic__inner_steps=args.inner_steps,
        optim__lr=3e-4,
        name="gpt-elastic",
        api=args.api,
    )
    job.wait()
    job.load_into(model)
    print(f"validation loss by round: {[r['val_loss'] for r in job.rounds]}")

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(ids.with_suffix(".tokenizer.json")))
    prompt = torch.tensor([tokenizer.encode(args.text.read_text()[:40]).ids[-context // 2 :]])
    model.eval()
    with torch.no_grad():
        for _ in range(20):
            logits = model(prompt[:, -context:])
            prompt = torch.cat([prompt, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    print(f"sample: {tokenizer.decode(prompt[0].tolist())!r}")


if __name__ == "__main__":
    main()
