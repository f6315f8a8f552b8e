"""Example job specs: the digits MLP (single and elastic) and the character LM the
demos train, and the tests' starting point.

One definition, so the demo, the docs' examples and the tests train the same job."""

from __future__ import annotations


def digits_toml(
    name: str = "digits-mlp",
    *,
    steps: int = 500,
    hidden: tuple[int, ...] = (128, 64),
    seed: int = 0,
    batch_size: int = 64,
    lr: float = 1e-3,
    gpu: str = "preferred",
    extra: str = "",
) -> str:
    """A `single` job training an MLP on the built-in digits set, as TOML;
    `extra` is appended verbatim to the [requirements] table."""
    return f"""\
name = "{name}"
mode = "single"
seed = {seed}
[model]
arch = "mlp"
hidden = [{", ".join(str(h) for h in hidden)}]
activation = "relu"
[data]
source = "builtin:digits"
batch_size = {batch_size}
validation = 0.2
[optim]
name = "adamw"
lr = {lr!r}
steps = {steps}
[requirements]
gpu = "{gpu}"
{extra}"""


def elastic_toml(
    name: str = "digits-elastic",
    *,
    workers: int = 4,
    min_workers: int = 1,
    inner_steps: int = 50,
    rounds: int = 10,
    hidden: tuple[int, ...] = (64,),
    seed: int = 0,
    lr: float = 3e-3,
    compression: str = "int4",
    extra: str = "",
) -> str:
    """An `elastic` job: DiLoCo rounds of an MLP on the built-in digits set, as TOML;
    `extra` is appended verbatim to the [elastic] table."""
    return f"""\
name = "{name}"
mode = "elastic"
seed = {seed}
[model]
arch = "mlp"
hidden = [{", ".join(str(h) for h in hidden)}]
[data]
source = "builtin:digits"
batch_size = 32
validation = 0.2
[optim]
name = "adamw"
lr = {lr!r}
[elastic]
workers = {workers}
min_workers = {min_workers}
inner_steps = {inner_steps}
rounds = {rounds}
compression = "{compression}"
{extra}"""


def char_lm_elastic_toml(
    corpus: str,
    name: str = "char-lm-elastic",
    *,
    workers: int = 3,
    min_workers: int = 2,
    inner_steps: int = 30,
    rounds: int = 8,
    width: int = 64,
    context: int = 48,
) -> str:
    """An `elastic` job: a small character transformer on the text file `corpus` (an
    absolute path), as TOML. The elastic demo trains it."""
    return f"""\
name = "{name}"
mode = "elastic"
seed = 0
[model]
arch = "char_transformer"
layers = 2
heads = 2
width = {width}
context = {context}
[data]
source = "builtin:text:{corpus}"
batch_size = 32
validation = 0.1
[optim]
name = "adamw"
lr = 3e-3
[elastic]
workers = {workers}
min_workers = {min_workers}
inner_steps = {inner_steps}
rounds = {rounds}
"""


def sweep_toml(
    name: str = "digits-sweep",
    *,
    trials: int = 12,
    parallel: int = 3,
    steps: int = 200,
    sampler: str = "tpe",
    pruner: str = "none",
    report_every: int = 50,
    space: str = '"optim.lr" = { low = 1e-4, high = 1e-1, log = true }\n'
    '"model.hidden" = { choices = [[16], [32], [64, 32]] }',
) -> str:
    """A `sweep` job over the digits MLP, as TOML; `space` is the [sweep.space] body."""
    return f"""\
name = "{name}"
mode = "sweep"
seed = 0
[model]
arch = "mlp"
hidden = [32]
[data]
source = "builtin:digits"
batch_size = 64
validation = 0.2
[optim]
name = "adamw"
lr = 1e-3
steps = {steps}
[sweep]
trials = {trials}
parallel = {parallel}
metric = "val_loss"
sampler = "{sampler}"
pruner = "{pruner}"
report_every = {report_every}
[sweep.space]
{space}
"""
