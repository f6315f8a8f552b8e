"""PACKAGE training.model.

Modules:

    bind              Counting what a spec's model will train, before anything is
                      allocated: the module on the `meta` device with `model.trainable`
                      applied. The owner's node binds a spec this way at submit (and
                      `train-local` here); the owner also reads an elastic delta's
                      length from it. Kept apart from `training.model.start`, which
                      `training.model.modules` imports.
    layers            The allow-list of torch layers for `arch = "layers"`, and shape
                      propagation over it.
    modules           Torch modules built from a model plan (`training.model.plan`),
                      never from peer code.
    plan              A model's plan: every layer with its resolved sizes, worked out
                      before any tensor exists.
    start             `model.init` and `model.trainable` applied to a module
                      (`training.spec.start` is the spec side): the init's tensors
                      loaded, checked name by name against the model, and every
                      parameter outside the trainable patterns frozen.
    weights           Trained weights as safetensors with deterministic bytes.
"""
