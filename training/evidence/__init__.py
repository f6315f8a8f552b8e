"""PACKAGE training.evidence.

Modules:

    check_weights     `python -m training.evidence.check_weights PATH`: are all values
                      in a weights file finite?
    checkpoints       Checkpoints as evidence: the full training state every k steps,
                      and its replay.
    replay            The runner's `replay` task: the owner's side of a spot check, in
                      its own sandbox.
    result_check      Checking a worker's weights file before the owner accepts it.
"""
