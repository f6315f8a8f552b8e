"""The `meshminer` command line (typer).

`app` builds the command tree and each other module registers the commands of one
topic. Commands talk to a node through its HTTP API (`node.client`), never through
its state; only `node run` (which starts a node), `train-local`, `tokenize` and the
ledger commands given `--data-dir` (which read a stopped node's files) work without
one. docs/operations/cli.md.

- `app`: the command tree; `node run`, `status`, `peers`, `demo`.
- `common`: what the command modules share: consoles, common options, the token to
  send, failing cleanly.
- `settings_options`: the options of `node run` that set settings, made from their
  declarations (`node.settings.declarations`).
- `jobs`: submit, jobs, jobs show, train-local; node pause, resume, prefs.
- `ledger`: the ledger's recent entries and balances, verify, export.
- `service`: node install-service, uninstall-service, status.
- `doctor`: `meshminer doctor` (`node.machine.doctor`).
- `tokenize`: `meshminer tokenize`: text to the token-id file of a `tokens16` or
  `tokens32` job.
"""

from node.cli.app import app
from node.cli.common import token_for
from node.cli.jobs import rounds_table
from node.cli.tokenize import tokenize_file

__all__ = [
    "app",
    "rounds_table",
    "token_for",
    "tokenize_file",
]
