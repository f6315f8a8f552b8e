"""Run: the runner subprocess, and the path from a spec to a weights file.

`python -m training.run.runner` is what a node starts for every task: it reads one
request, limits and isolates itself before it parses the spec or imports torch, and
trains. `train-local` takes the same path in-process, so both give bitwise-equal
weights. A runner never reads a file its request does not name as a blob.

- `runner`: the sandboxed subprocess; its docstring lists the request and the tasks.
- `isolation`: what a runner does to itself before it touches a peer's job:
  parent-death signal, rlimits, an empty network namespace, Landlock.
- `sandbox`: the memory limits a runner puts on itself.
- `forkserver`: a warm parent that imports torch once and forks one runner per task.
- `execute`: one job from spec to weights file, shared by the runner and `train_local`.
- `loop`: the train loop: seeded, deterministic, throttled progress, validation.
- `optim`: optimizer, learning-rate schedule and loss from `[optim]`.
- `no_dynamo`: torch.optim and our custom ops without importing torch._dynamo (2.6 s
  of CPU in every process that trains).
- `local`: `meshminer train-local JOB.toml`, with no network.
"""
