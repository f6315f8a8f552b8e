"""Data: where a job's data comes from, what it looks like, and its batches.

No reader here can run code: numpy and safetensors only, pickles refused by name. The
split and the batches depend only on the data's bytes and the seed, so a worker
reading a blob and `train-local` reading the file train on the same batches. Only
`batches` imports torch.

- `sources`: the `data.source` string and what it points at: a file, a built-in set,
  a blob.
- `formats`: readers for the file formats: csv, npz, safetensors, text, token ids.
- `info`: what the data looks like, found cheaply: sample shape, task, classes, splits.
- `batches`: data sets as tensors: loaded, converted, split by seed, cut into batches.
"""
