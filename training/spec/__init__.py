"""Spec: the job spec, read from TOML and checked, with no torch.

A spec arrives as plain data from a file or a peer; every read checks type and range
and names the key path, and a key nobody read is an error. Nothing here imports torch,
so the daemon validates specs and a runner checks its request before torch loads.
docs/jobspec.md.

- `job`: the job spec (`JobSpec`): what to train, on which data, how, what it needs;
  `parse_spec`, `load_spec`, `spec_to_plain`.
- `model`, `data`, `optim`: the `[model]` (declarative archs), `[data]` and `[optim]`
  tables, each parsed and written back as plain data.
- `fields`: typed, path-naming reads from a parsed TOML table.
- `start`: `model.init` and `model.trainable`, for every arch (fine-tuning).
- `program`: a program's `[model]` table (`arch = "program"`; docs/programs.md).
- `shards`: `data.shards`, an elastic job's token ids as many blobs, and which shards
  each data slot reads.
- `sweep`: a sweep job's `[sweep]` table: the study's settings and its search space.
- `examples`: example specs: the digits MLP (single and elastic) and the character LM
  the demos train.
"""
