"""PACKAGE training.elastic.

Modules:

    rounds            Elastic (DiLoCo) rounds: the arithmetic, shared by the runner and
                      `train-local`.
    tasks             The runner's elastic tasks: one step of `training.elastic.rounds`
                      per runner request.
"""
