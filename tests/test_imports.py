"""The import graph of our packages: no cycles (lazy, function-level imports
included, since they only hide one), and dependencies point one way: protocol
imports nothing of ours, training and ledger only protocol, nothing imports node,
and the public Python API (meshminer) only the program check of training, since it
talks to a node over HTTP, never through node's code; nothing imports meshminer.
Inside node/work, `jobs`, `blobs` and `run` import nothing else of it, and only the
owner's engine imports the job modes."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("node", "protocol", "training", "ledger", "meshminer")
#: what each package may import: packages, or single modules (with their submodules)
ALLOWED = {
    "protocol": {"protocol"},
    "training": {"training", "protocol"},
    "ledger": {"ledger", "protocol"},
    "node": {"node", "protocol", "training", "ledger"},
    "meshminer": {"meshminer", "training.program"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}" in modules
                    else node.module
                    for a in node.names
                ]
            else:
                continue
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name)):
            return found
    return None


def test_no_import_cycles() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_dependencies_point_one_way() -> None:
    for name, deps in _graph().items():
        allowed = ALLOWED[name.split(".")[0]]
        wrong = {d for d in deps if not any(d == a or d.startswith(f"{a}.") for a in allowed)}
        assert not wrong, f"{name} imports {sorted(wrong)}"


#: inside node/work: the parts that stand alone import nothing else of node/work, and
#: only the owner's engine knows the job modes
ALONE = ("node.work.jobs", "node.work.blobs", "node.work.run")
MODES = "node.work.owner.modes"


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def test_the_parts_of_node_work_stand_alone() -> None:
    for name, deps in _graph().items():
        for part in ALONE:
            if _within(name, part):
                wrong = {d for d in deps if _within(d, "node.work") and not _within(d, part)}
                assert not wrong, f"{name} ({part} stands alone) imports {sorted(wrong)}"


def test_only_the_owner_knows_the_job_modes() -> None:
    for name, deps in _graph().items():
        if not _within(name, "node.work.owner"):
            wrong = {d for d in deps if _within(d, MODES)}
            assert not wrong, f"{name} imports the job modes {sorted(wrong)}"
