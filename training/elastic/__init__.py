"""Elastic: the arithmetic of DiLoCo rounds, shared by the network and `train-local`.

Every step goes from files to files (weights, inner optimizer state, deltas, momentum),
so a network run and the one-process simulation go through the same code and give
bitwise-equal weights. The owner's side of the rounds is
`node/work/owner/modes/elastic.py`; docs/design/elastic.md.

- `rounds`: slot seeds, the flat delta, one share (`inner_round`), the outer step.
- `simulate`: `train-local` of an elastic job, every slot of every round in one
  process, through `rounds`.
- `flat`: a model's floating-point state as one float32 vector, and back.
- `updates`: the global weights' way down: each round's change in the job's codes
  (int4 or int8), applied the same on every node (`apply_update`), with the residual
  fed back.
- `starts`: where a share starts: an eager start, from the round before's weights and
  the slot's own delta, before the outer step between them is taken.
- `tasks`: the runner's tasks `elastic_init`, `elastic_inner`, `elastic_outer`: one
  step of `rounds` per request.
"""
