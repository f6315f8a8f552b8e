"""A user's `torch.export` archive(s) to a meshminer program, on the owner's machine
(and on the user's, to check before anything is sent)."""

from __future__ import annotations

from pathlib import Path

from training.program.archive import read_pt2
from training.program.errors import ProgramError
from training.program.figures import ProgramFigures, figures
from training.program.graph import problems
from training.program.program import Program, from_archives


def convert_pt2(program: Path, eval_program: Path | None = None) -> Program:
    """Read and check the user's archives and build the program (dry-run included)."""
    return convert_with_figures(program, eval_program)[0]


def convert_with_figures(
    program: Path, eval_program: Path | None = None, labels: tuple[str, str] | None = None
) -> tuple[Program, ProgramFigures]:
    """`convert_pt2` and the program's figures from its one dry run; `labels` name the
    two files in errors (an upload's own names rather than where it was saved)."""
    names = labels or (Path(program).name, Path(eval_program or "").name)
    train = read_pt2(Path(program), names[0])
    evaluation = read_pt2(Path(eval_program), names[1]) if eval_program is not None else None
    built = from_archives(train, evaluation, "model.program")
    return built, figures(built)


def check_pt2(path: Path) -> list[str]:
    """Every reason the archive at `path` would be refused, train or eval export alike
    (empty when a volunteer would run it)."""
    try:
        archive = read_pt2(Path(path))
    except ProgramError as exc:
        return [str(exc)]
    found = problems(archive.graph_module, Path(path).name)
    if found:
        return found
    try:
        figures(from_archives(archive, None, Path(path).name, require_eval=False))
    except ProgramError as exc:
        return [str(exc)]
    return []
