"""Evidence: what lets an owner check a worker without trusting it.

A worker's runner writes its training state at checkpoint steps and commits to their
hashes as it goes and in its signed result (`checkpoints`, `writer`); the owner
replays segments in its own runner (`replay`). A returned weights file is checked
before anything of it is accepted: its header in the daemon (`result_check`), its
values in a subprocess of their own (`check_weights`), so the daemon parses no
peer's tensor bytes. The comparisons are the owner's (`node/work/trust/`);
docs/design/trust.md.

- `checkpoints`: the full training state every k steps, its hash, replaying a segment.
- `steps`: which steps those are (no torch: the owner's daemon computes them).
- `bounds`: how far a replay on another device kind may land and still agree (no
  torch: the daemon compares by them).
- `writer`: checkpoints written by a thread beside training, never more on disk at
  once than the worker may hold.
- `replay`: the runner's `replay` task: the owner's side of a spot check.
- `result_check`: a weights file or an elastic delta checked against the model plan.
- `check_weights`: `python -m training.evidence.check_weights`: are a file's values
  finite; is a delta this round's.
"""
