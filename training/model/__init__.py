"""Model: what a spec builds, counted before any tensor exists, then built.

A model is data, never code: a named architecture or a stack of allow-listed layers.
It is planned in Python integers (`plan`), so the budget is checked before torch
allocates anything, and built as torch modules (`modules`) from that plan only.
`layers` and `plan` import no torch; the rest runs in a runner, or in the owner's
checks.

- `layers`: the allow-list of torch layers for `arch = "layers"`, and shape
  propagation over it.
- `plan`: every layer with its resolved sizes, parameters and FLOPs.
- `modules`: torch modules built from a plan, never from peer code.
- `start`: `model.init` and `model.trainable` applied to a module.
- `bind`: counting what a spec's model will train, on the `meta` device.
- `weights`: trained weights as safetensors with deterministic bytes.
- `dropout`: dropout and the program ops that draw random numbers, the same bits on
  every device (so an owner without a GPU can replay a GPU worker's segment).
"""
