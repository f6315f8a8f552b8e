"""PACKAGE training.data.

Modules:

    batches           Data sets as tensors: loaded, converted, split by seed, and cut
                      into batches.
    formats           Readers for the data file formats, numpy only, none of which can
                      run code.
    info              What a job's data looks like, found cheaply: sample shape, task,
                      classes, split sizes.
    sources           Where a job's data comes from: the `data.source` string and what
                      it points at.
"""
