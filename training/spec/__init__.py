"""PACKAGE training.spec.

Modules:

    examples          Example job specs: the digits MLP (single and elastic) and the
                      character LM the demos train, and the tests' starting point.
    fields            Typed, path-naming reads from a parsed TOML table.
    job               The job spec: what to train, on which data, how, and what it
                      needs.
    program           A program's `[model]` table (`arch = "program"`): the user's
                      `.pt2` files, or the converted program blob and the figures
                      counted from it (docs/programs.md).
    start             Where training starts and what trains: `model.init` and
                      `model.trainable`, for every arch (fine-tuning, LoRA).
    sweep             A sweep job's `[sweep]` table: the study's settings and its search
                      space.
"""
