"""PACKAGE node.cli.

Modules:

    app               The `meshminer` command line.
    common            What the CLI's command modules share: consoles, common options,
                      failing cleanly.
    doctor            `meshminer doctor`: reachability, addresses, peers, clock, ports,
                      permissions, torch and isolation, each problem with its fix
                      (`node.doctor`).
    jobs              CLI commands about jobs: submit, jobs, jobs show, train-local;
                      node pause/resume/prefs.
    ledger            CLI commands about the ledger: recent entries and balances,
                      verify, export.
    service           CLI commands for the node as a service: node install-service,
                      uninstall-service, status.
    tokenize          `meshminer tokenize`: text to the token-id file that a
                      `tokens16`/`tokens32` job reads.
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
