"""The budget: how big and how costly a job is, and the limits it must stay under.

Checked twice, with the same code: by the owner at submit time and by the worker
before it allocates anything. Everything is counted from the plan (`training.model.plan`),
in Python integers, so a request for 10^12 parameters is refused in microseconds with
the count in the message.

The memory figure is a rough upper estimate for one device:
parameters x 4 bytes x 4 (weights, gradients, two Adam moments)
+ activations per sample x batch x 4 bytes x 2 (kept for backward, and their gradients)
+ the data set in memory (4 bytes per feature value, 8 per character of text)
+ the per-epoch shuffle (8 bytes per training sample or window).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from training.data.info import DataFiles, DatasetInfo, probe
from training.errors import SpecError
from training.model.plan import ModelPlan, plan_model
from training.spec.job import JobSpec

MAX_PARAMETERS = 1_000_000_000
MAX_MEMORY_BYTES = 256 * 2**30
DEFAULT_LOSS = {"classification": "cross_entropy", "regression": "mse", "lm": "cross_entropy"}
ALLOWED_LOSSES = {
    "classification": ("cross_entropy",),
    "regression": ("mse", "l1"),
    "lm": ("cross_entropy",),
}


@dataclass(frozen=True)
class SpecSummary:
    """What a valid job will do; `training_flops` is the basis for credit."""

    parameters: int
    estimated_memory_bytes: int
    flops_per_sample: int  # forward pass, one sample
    task: str
    loss: str
    num_samples: int  # training + validation
    num_train: int
    num_val: int
    batch_size: int  # effective: data.batch_size, capped at the training split's size
    total_steps: int
    training_flops: int  # flops_per_sample x samples trained x (3, or 2 + the share that trains)


def schedule_length(spec: JobSpec, info: DatasetInfo) -> tuple[int, int]:
    """(effective batch size, optimizer steps of one unit).

    A single job's unit is the whole run; an elastic job's is one round's H inner steps.

        An epoch is `num_train // batch` full batches; the remainder of each shuffled
        epoch is not used, so every step sees a full batch.
    """
    batch = min(spec.data.batch_size, info.num_train)
    if spec.elastic is not None:  # one unit: one worker's share of one round
        return batch, spec.elastic.inner_steps
    if spec.optim.steps is not None:
        return batch, spec.optim.steps
    assert spec.optim.epochs is not None
    return batch, spec.optim.epochs * (info.num_train // batch)


def check_budget(spec: JobSpec, info: DatasetInfo) -> SpecSummary:
    """Plan the model on this data and check it against the limits; `SpecError` if not."""
    plan = plan_model(spec.model, info)
    return summarize(spec, info, plan)


def summarize(spec: JobSpec, info: DatasetInfo, plan: ModelPlan) -> SpecSummary:
    """`check_budget` for an existing plan."""
    if plan.parameters > MAX_PARAMETERS:
        raise SpecError(
            f"model: {plan.parameters:,} parameters is over the limit of {MAX_PARAMETERS:,}"
        )
    batch, steps = schedule_length(spec, info)
    memory = plan.parameters * 4 * 4 + plan.activations_per_sample * batch * 4 * 2
    if info.task == "lm":  # the text as int64 ids, and a per-epoch permutation of windows
        memory += (info.num_samples + info.sample_shape[0]) * 8 + info.num_train * 8
    else:
        memory += info.num_samples * math.prod(info.sample_shape) * 4 + info.num_train * 8
    if memory > MAX_MEMORY_BYTES:
        raise SpecError(
            f"model: the job needs an estimated {memory / 2**30:,.1f} GiB; the limit is "
            f"{MAX_MEMORY_BYTES / 2**30:.0f} GiB (lower data.batch_size or the model size)"
        )
    loss = spec.optim.loss or DEFAULT_LOSS[info.task]
    if loss not in ALLOWED_LOSSES[info.task]:
        raise SpecError(
            f"optim.loss {loss!r} does not fit {info.task}; use "
            f"{' or '.join(ALLOWED_LOSSES[info.task])}"
        )
    warmup = spec.optim.warmup_steps
    if spec.optim.schedule != "constant" and warmup >= steps and warmup > 0:
        raise SpecError(f"optim.warmup_steps ({warmup}) must be less than the run's {steps} steps")
    fixed = plan.program.batch if plan.program is not None else 0
    if fixed and batch != fixed:
        raise SpecError(
            f"data.batch_size: the program was exported for batches of exactly {fixed}, but "
            f"this job's batches are {batch}; set data.batch_size = {fixed}, or export with a "
            "dynamic batch dimension (meshminer.export does)"
        )
    if batch < 2 and any(layer.type.startswith("BatchNorm") for layer in plan.layers):
        raise SpecError("data.batch_size must be >= 2 for a model with BatchNorm layers")
    return SpecSummary(
        parameters=plan.parameters,
        estimated_memory_bytes=memory,
        flops_per_sample=plan.flops_per_sample,
        task=info.task,
        loss=loss,
        num_samples=info.num_samples,
        num_train=info.num_train,
        num_val=info.num_val,
        batch_size=batch,
        total_steps=steps,
        training_flops=_training_flops(spec, plan, plan.flops_per_sample * steps * batch),
    )


def _training_flops(spec: JobSpec, plan: ModelPlan, forward: int) -> int:
    """A run's FLOPs from its forward FLOPs: x3 (forward and backward) when everything
    trains; with `model.trainable`, the forward, the activations' gradients, and the
    weights' gradients of the share of parameters that trains (integers: both sides of
    a receipt compute the same figure)."""
    if not spec.start.trainable:
        return forward * 3
    if not spec.start.trainable_parameters:
        raise SpecError(
            "model.trainable_parameters: not counted yet (the node counts it at submit, "
            "train-local before training)"
        )
    return forward * 2 + forward * spec.start.trainable_parameters // max(plan.parameters, 1)


def validate_for_submit(spec: JobSpec, data_file: DataFiles = None) -> SpecSummary:
    """Everything that can be checked before training: data, shapes, budget.

    `data_file` is the data on this machine (the uploaded file, or a blob's file);
    without it, built-in sources need nothing and file sources read the spec's path.
    Features are not loaded for npz and safetensors files (labels are).
    """
    summary = check_budget(spec, probe(spec, data_file))
    if spec.sweep is not None:
        check_space(spec, data_file)
    return summary


def check_space(spec: JobSpec, data_file: DataFiles = None) -> None:
    """Every choice and both ends of every range of a sweep's space give a trial that
    passes the spec's rules and the budget; the error names the key and the value."""
    from training.spec.job import spec_to_plain
    from training.spec.sweep import corner_params
    from training.sweep.trials import trial_spec

    assert spec.sweep is not None
    base = spec_to_plain(spec)
    for key, value, params in corner_params(spec.sweep.space):
        try:
            trial = trial_spec(base, params, spec.sweep.report_every)
            check_budget(trial, probe(trial, data_file))
        except SpecError as exc:
            raise SpecError(f"sweep.space {key!r} = {value!r}: {exc}") from None
    metric = spec.sweep.metric
    if metric.startswith("val_") and spec.data.validation == 0:
        raise SpecError(f"sweep.metric {metric!r} needs a validation split (data.validation > 0)")
    if metric == "val_accuracy" and probe(spec, data_file).task != "classification":
        raise SpecError("sweep.metric 'val_accuracy' needs a classification task")
