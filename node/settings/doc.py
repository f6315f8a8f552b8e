"""docs/settings.md, written from the settings' declarations
(`node.settings.declarations`): `python -m node.settings.doc` writes it; with `--check`
it only says whether the file is what would be written (exit status 1 when not)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from node.settings.declarations import SETTINGS
from node.settings.schema import Setting
from protocol import Policy

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
COLUMNS = ("key", "type", "default", "unit", "meaning", "`node run` flag", "API")


def toml_value(value: Any) -> str:
    """`value` as written in meshminer.toml."""
    return json.dumps(value)


def flag_cell(s: Setting) -> str:
    return " / ".join(f"`{flag}`" for flag in s.flags) if s.flags else "(file only)"


def row(s: Setting) -> tuple[str, ...]:
    """One setting's cells: key, type, default, unit, meaning, flag, API."""
    return (
        f"`{s.key}`",
        s.type,
        f"`{toml_value(s.default)}`",
        s.unit,
        s.description,
        flag_cell(s),
        "yes" if s.api else "",
    )


def settings_markdown() -> str:
    """The whole of docs/settings.md."""
    advertised = ", ".join(f"`{f.name}`" for f in fields(Policy))
    lines = [
        "# Settings",
        "",
        "<!-- Written by `python -m node.settings.doc` from the declarations in",
        "node/settings/declarations.py; change those, then run it again. -->",
        "",
        "Every setting of a node, declared once in `node/settings/declarations.py`: the",
        "config file, the flags of `meshminer node run`, the keys `PUT /api/v1/policy` takes",
        "and this table all come from there, in the same words.",
        "",
        "Precedence: built-in default < `meshminer.toml` in the data dir <",
        "`preferences.json` in the data dir (what the status page, `meshminer node prefs`",
        "or `PUT /api/v1/policy` changed) < flag. A key written `policy.x` goes in the",
        "`[policy]` table of the file. Those marked in the API column can be changed",
        "while the node runs; the change is kept in `preferences.json`, not written to",
        "`meshminer.toml`. Advertised in every capacity ad:",
        f"{advertised}.",
        "",
        "In the file an integer is taken where a float is expected, and nothing else is",
        "converted. An unknown key, a key in the wrong table, a value of the wrong type",
        "or one that breaks its rule (in parentheses below), in the file or a flag, stops",
        "the node before it starts, with an error naming the key.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + " --- |" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(row(s)) + " |" for s in SETTINGS]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m node.settings.doc", description=__doc__)
    parser.add_argument("path", nargs="?", type=Path, default=DOC_PATH)
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    args = parser.parse_args(argv)
    text = settings_markdown()
    if args.check:
        current = args.path.exists() and args.path.read_text() == text
        print(f"{args.path}: {'current' if current else 'out of date'}")
        return 0 if current else 1
    args.path.write_text(text)
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
