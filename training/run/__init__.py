"""PACKAGE training.run.

Modules:

    execute           One job from spec to weights file: the path shared by the runner
                      and `train_local`.
    forkserver        A warm parent for runners: imports torch once, then forks one
                      runner per task.
    isolation         What a training subprocess does to itself before it touches a
                      peer's job.
    local             Train a spec on this machine, with no network: `meshminer train-
                      local JOB.toml`.
    loop              The train loop: seeded, deterministic, throttled progress,
                      evaluation at the end (and every `optim.validate_every` steps,
                      reported with the progress).
    optim             Optimizer, learning-rate schedule and loss from the spec's
                      `[optim]` table.
    runner            The sandboxed training subprocess: `python -m
                      training.run.runner`.
    sandbox           Limits a runner subprocess puts on itself before training.
"""
