"""Programs: users' own PyTorch models, carried as checked graphs that volunteers run
without running any code a stranger wrote.

The map, in the order a program travels:
- `archive`: our own reader of a `torch.export.save` archive (`.pt2`): zip entries,
  JSON and raw tensor bytes; never `torch.export.load`, pickle, sympy or `exec`.
- `allowlist`: the reviewed `aten` overloads (and integer size arithmetic) a node may call.
- `graph`: `check_graph`, the one reader of graph JSON: allowed targets, plain argument
  kinds, names defined once before use, symbolic sizes checked by pattern.
- `program`: the meshminer program file (graphs + initial state as deterministic
  safetensors), `encode_program` / `decode_program`.
- `figures`: parameters, FLOPs and activations from a dry run on the `meta` device,
  which also refuses a graph that would make an absurd tensor.
- `interpreter`: `ProgramModule`, an `nn.Module` that runs the nodes; autograd does
  the backward.
- `convert`: `.pt2` -> program on the owner's side; `check_pt2` for the user's.
- `job`: a spec's program: converted from the user's archives (the owner, `train-local`)
  or read from its blob and checked against the figures the spec states.
- `errors`: `ProgramError`, the one error the reader, checker and interpreter raise.

Nothing here imports `node`; `meshminer.export` uses `check_pt2`.
"""

from training.program.convert import check_pt2, convert_pt2
from training.program.errors import ProgramError
from training.program.figures import FLOP_COUNTER, ProgramFigures, figures
from training.program.interpreter import ProgramModule
from training.program.program import Program, decode_program, encode_program

__all__ = [
    "FLOP_COUNTER",
    "Program",
    "ProgramError",
    "ProgramFigures",
    "ProgramModule",
    "check_pt2",
    "convert_pt2",
    "decode_program",
    "encode_program",
    "figures",
]
