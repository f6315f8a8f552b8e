"""How far a replay on another determinism class may land from a worker's claimed
state and still agree (docs/design/trust.md, "Across device kinds"). Constants only,
with no torch import: the daemon compares by them, and starting it loads no torch (a
volunteer's daemon never does; an owner's, once it first checks a result's shapes)."""

#: across determinism classes: the largest relative L2 distance of any weight tensor
#: after one replayed segment (measured honest: <= 1e-6; one skipped step: >= 1e-2)
TOLERANCE = 1e-3
#: the same for a job trained in bf16 (`optim.precision`): 8 bits of mantissa in the
#: matrix products put kernels of two classes further apart
BF16_TOLERANCE = 3e-2
#: bf16 across device kinds (a CPU replay of a GPU's segment): measured on an H200,
#: honest segments land 0.008-0.032 away and 4-8 of the replay's own last step, so
#: neither bound above clears them. This one does, with three times that margin; it
#: still catches a segment claimed without training (0.17-1.0 away in that run), not
#: a skipped step (0.016-0.16), which only a replayer of the worker's kind can see
BF16_ACROSS_KINDS = 0.1

#: across device kinds (a CPU replay of a GPU's segment): the claimed state may be this
#: far from the replay, as a share of the replay's own last step, tensor by tensor. A
#: worker that skipped a step of the segment lands about one step away (ratio ~1);
#: honest noise between devices starts at zero at the segment's start and stays a
#: fraction of a step over a segment's few steps (docs/design/trust.md)
STEP_RATIO = 0.5
