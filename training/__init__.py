"""Training: job spec -> model, optimizer and data; the train loop; the runner.

What the rest of meshminer calls:
- `training.spec.job`: `load_spec`, `parse_spec`, `spec_to_plain`, `local_files`,
  `with_blob_source`, `validate_for_submit`, `SpecError` (the job spec; no torch).
- `training.run.runner`: `python -m training.run.runner` (the sandboxed subprocess) and
  `run_request` (the same, in-process).
- `training.run.local`: `train_local` (`meshminer train-local`).

How a spec becomes weights, one idea per module: `fields` (typed reads that name the
key path), `sources` (what `data.source` points at), `layers` (the layer allow-list
and shape propagation), `formats` and `datainfo` (reading data files, cheaply when
possible), `plan` (every layer's sizes, parameters and FLOPs, before any tensor
exists), `budget` (the limits), then with torch: `data`, `models`, `optim`, `loop`,
`weights`, `execute` (the path shared by runner and train_local), `sandbox`
(process limits). See docs/jobspec.md.

`training` imports `protocol` (the codec, in the runner) and never `node`.
"""
