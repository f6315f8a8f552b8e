"""The docs name only files that exist, and every package's map names all its parts.

- Every `*.py` path written in docs/ or README.md is a file of this repository,
  written from its root (`node/work/owner/role.py`, not `role.py`). A path whose first
  part is an installed third-party package (`libp2p/network/swarm.py`) is looked up in
  that package instead.
- Every module and sub-package of each package under node/ and training/ (a folder
  with an `__init__.py`) is named in that package's `__init__` docstring, which is the
  package's map: as `` `name` ``, `name.py`, `package.name`, or as the first word of
  an indented line of a module list.

Pure and fast: it reads files and asks importlib where installed packages live.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
MAPPED = ("node", "training")

_URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+")
_PY_PATH = re.compile(r"(?<![\w./-])([\w./-]*\w\.py)\b")


def named_paths(text: str) -> set[str]:
    """The `*.py` paths a page names, URLs left out."""
    return set(_PY_PATH.findall(_URL.sub(" ", text)))


def resolves(path: str) -> bool:
    if (ROOT / path).is_file():
        return True
    first, _, rest = path.partition("/")
    if not rest or (ROOT / first).exists():
        return False
    spec = importlib.util.find_spec(first)
    places = (spec.submodule_search_locations or []) if spec else []
    return any((Path(place) / rest).is_file() for place in places)


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_path_in_the_docs_exists(page: Path) -> None:
    missing = sorted(p for p in named_paths(page.read_text()) if not resolves(p))
    assert not missing, f"{page.relative_to(ROOT)} names files that do not exist: {missing}"


def packages() -> list[Path]:
    return sorted(init.parent for top in MAPPED for init in (ROOT / top).rglob("__init__.py"))


def parts_of(package: Path) -> list[str]:
    """The package's modules and sub-packages, by name."""
    modules = [p.stem for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    subpackages = [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    return sorted(modules + subpackages)


def is_named(name: str, package: Path, doc: str) -> bool:
    dotted = ".".join(package.relative_to(ROOT).parts)
    n = re.escape(name)
    forms = (
        rf"`{n}`",
        rf"(?<![\w.]){n}\.py\b",
        rf"(?<![\w.]){n}/",
        rf"\b{re.escape(dotted)}\.{n}\b",
        rf"(?m)^\s+[-*]?\s*{n}(?=\s|:|$)",
    )
    return any(re.search(form, doc) for form in forms)


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_package_map_names_all_its_parts(package: Path) -> None:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    unnamed = [name for name in parts_of(package) if not is_named(name, package, doc)]
    assert not unnamed, (
        f"{package.relative_to(ROOT)}/__init__.py's docstring does not name {unnamed}"
    )
