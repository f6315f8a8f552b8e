"""`python -m node ...` is `meshminer ...` (used to start nodes as subprocesses)."""

from node.cli import app

app(prog_name="meshminer")
