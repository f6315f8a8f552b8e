"""`meshminer tokenize`: text to the token-id file that a `tokens16`/`tokens32` job reads.

The tokenizer (byte-level BPE, Hugging Face `tokenizers`) runs only here, on the job
owner's machine: workers see nothing but the ids, so they need neither the tokenizer
nor the text, and the file they read cannot hold anything but numbers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Annotated, Any

import typer

from node.cli.common import console, fail

#: characters of text encoded per batch, so a large file is never one string
BATCH_CHARS = 1 << 20
UINT16_VOCAB = 1 << 16


@dataclass(frozen=True)
class Tokenized:
    """What `tokenize_file` wrote: the facts a spec for the file needs."""

    ids: int
    vocab_size: int
    format: str  # tokens16 | tokens32
    bytes: int
    tokenizer: Path
    trained: bool  # False: an existing tokenizer file was used


def tokenizer_path_for(out: Path) -> Path:
    """Where a trained tokenizer goes by default: `train.bin` -> `train.tokenizer.json`."""
    return out.with_name(out.stem + ".tokenizer.json")


def tokenize_file(
    text: Path, out: Path, vocab_size: int = 4096, tokenizer: Path | None = None
) -> Tokenized:
    """Encode the UTF-8 file `text` into little-endian ids at `out`.

    An existing `tokenizer` JSON is used as is; otherwise a byte-level BPE of
    `vocab_size` is trained on the text and saved to `tokenizer` (default: beside
    `out`), since the ids mean nothing without it. Ids are uint16 when the vocabulary
    fits, else uint32. Raises ValueError or OSError with a message for the user.
    """
    import numpy as np
    from tokenizers import ByteLevelBPETokenizer, Tokenizer

    _check_text(text)
    encoder: Any
    if tokenizer is not None and tokenizer.is_file():
        try:
            encoder = Tokenizer.from_file(str(tokenizer))
        except Exception as exc:  # tokenizers raises its own exception type
            raise ValueError(f"{tokenizer} is not a tokenizer JSON file: {exc}") from exc
        trained = False
    else:
        if vocab_size < 256:
            raise ValueError(f"--vocab-size {vocab_size}: a byte-level BPE needs at least 256")
        encoder = ByteLevelBPETokenizer()
        lines = chain.from_iterable(_batches(text))
        encoder.train_from_iterator(lines, vocab_size=vocab_size, show_progress=False)
        tokenizer = tokenizer or tokenizer_path_for(out)
        encoder.save(str(tokenizer))
        trained = True
    vocab = encoder.get_vocab_size()
    fmt = "tokens16" if vocab <= UINT16_VOCAB else "tokens32"
    dtype = np.dtype("<u2" if fmt == "tokens16" else "<u4")
    count = 0
    partial = out.with_name(out.name + ".part")
    try:
        with partial.open("wb") as handle:
            for lines in _batches(text):
                encodings = encoder.encode_batch(lines)
                ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), dtype=dtype)
                handle.write(ids.tobytes())
                count += ids.size
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, out)
    return Tokenized(count, vocab, fmt, count * dtype.itemsize, tokenizer, trained)


def _check_text(text: Path) -> None:
    with text.open("rb") as handle:
        head = handle.read(1)
    if not head:
        raise ValueError(f"{text} is empty")


def _batches(text: Path) -> Iterator[list[str]]:
    """The text's lines (ends kept, so the ids decode to the same bytes), in batches."""
    batch: list[str] = []
    held = 0
    try:
        with text.open(encoding="utf-8", newline="") as handle:
            for line in handle:
                batch.append(line)
                held += len(line)
                if held >= BATCH_CHARS:
                    yield batch
                    batch, held = [], 0
    except UnicodeDecodeError as exc:
        raise ValueError(f"{text} is not UTF-8 text: {exc}") from exc
    if batch:
        yield batch


def register(app: typer.Typer) -> None:
    @app.command()
    def tokenize(
        text: Annotated[
            Path, typer.Argument(help="UTF-8 text to tokenize", exists=True, dir_okay=False)
        ],
        out: Annotated[Path, typer.Option("--out", help="the token-id file to write (.bin)")],
        vocab_size: Annotated[
            int, typer.Option(help="vocabulary of the BPE to train (not with an existing file)")
        ] = 4096,
        tokenizer: Annotated[
            Path | None,
            typer.Option(
                help="a tokenizer JSON: used if it exists, else trained and saved there "
                "[default: OUT's name with .tokenizer.json, trained]",
                dir_okay=False,
            ),
        ] = None,
    ) -> None:
        """Turn a text file into token ids for an LM job (data.format tokens16/tokens32)."""
        if out.suffix.lower() != ".bin":
            raise fail(f"--out {out}: a token file ends in .bin", 2)
        try:
            done = tokenize_file(text, out, vocab_size, tokenizer)
        except (ValueError, OSError) as exc:
            raise fail(str(exc)) from None
        how = "trained" if done.trained else "used"
        console.print(
            f"wrote {out}: {done.ids:,} ids, vocabulary {done.vocab_size:,}, "
            f"{done.bytes:,} bytes\n"
            f"tokenizer: {done.tokenizer} ({how}; decode the model's output with it)\n"
            "in the spec:\n"
            "  [data]\n"
            f'  source = "{out.name}"\n'
            f'  format = "{done.format}"\n'
            f"  vocab_size = {done.vocab_size}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
