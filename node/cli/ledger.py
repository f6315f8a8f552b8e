"""CLI commands about the ledger: recent entries and balances, verify, export.

They ask the running node's API, or, with --data-dir, read the node's files directly
(a stopped node's ledger can be checked too).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from node.cli.common import ApiOption, console, err, fail, get, short, token_for
from node.client import ApiError, NodeUnreachable, api_url, request_json
from node.settings import data_dir_from
from protocol.receipts import credit_text

LedgerDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="read this node data dir's ledger directly instead of asking the API",
        show_default=False,
    ),
]


def _open_ledger(data_dir: Path) -> Any:
    from ledger import Ledger, LedgerError
    from node.identity import KEY_FILE, IdentityError, load_or_create_identity

    if not (data_dir / "ledger.db").exists() or not (data_dir / KEY_FILE).exists():
        raise fail(f"{data_dir} has no ledger.db and identity.key; is it a node's data dir?", 2)
    try:
        return Ledger.open(data_dir, load_or_create_identity(data_dir).signing_key)
    except (LedgerError, IdentityError) as exc:
        raise fail(str(exc), 2) from None


def register(app: typer.Typer) -> None:
    ledger_app = typer.Typer(
        help="This node's ledger of work done and received.",
        invoke_without_command=True,
        rich_markup_mode=None,
    )
    app.add_typer(ledger_app, name="ledger")

    @ledger_app.callback()
    def ledger(
        ctx: typer.Context,
        api: ApiOption = None,
        limit: Annotated[int, typer.Option(help="how many recent entries", min=1, max=1000)] = 20,
    ) -> None:
        """Recent entries, this node's balance and the network's, from the audit table."""
        if ctx.invoked_subcommand is not None:
            return
        head = get(api, "/api/v1/ledger?limit=1")["head_seq"]
        entries = get(api, f"/api/v1/ledger?after={max(-1, head - limit)}&limit={limit}")
        balances = get(api, "/api/v1/ledger/balances")
        table = Table(title=f"ledger: last {len(entries['entries'])} of {head + 1} entries")
        for column in ("seq", "time", "kind", "job", "worker", "owner", "credit"):
            table.add_column(column, justify="right" if column in ("seq", "credit") else "left")
        for e in entries["entries"]:
            table.add_row(
                str(e["seq"]),
                time.strftime("%m-%d %H:%M", time.localtime(e["ts"])),
                e["kind"],
                e["job_id"] or "-",
                short(e["worker"]),
                short(e["owner"]),
                credit_text(e["credit"]),
            )
        console.print(table)
        node = balances["node"]
        console.print(
            f"this node: earned {credit_text(node['earned'])} ({node['work_done']} units), "
            f"spent {credit_text(node['spent'])} ({node['work_received']} units), "
            f"{node['rejected']} rejected results"
        )
        network = Table(title="network credit (receipts seen on gossip)")
        for column in ("peer", "earned", "spent", "receipts", "conflicts"):
            network.add_column(column)
        for peer, row in sorted(balances["network"].items(), key=lambda kv: -kv[1]["earned"]):
            network.add_row(
                short(peer),
                credit_text(row["earned"]),
                credit_text(row["spent"]),
                str(row["receipts"]),
                str(row["conflicts"]),
            )
        console.print(network)

    @ledger_app.command("verify")
    def verify(api: ApiOption = None, data_dir: LedgerDirOption = None) -> None:
        """Recompute every hash and check every signature; exit 1 at the first bad seq.

        Asks the running node; with no node running (and no --api), reads the ledger in
        the data dir ($MESHMINER_DATA_DIR or ~/.local/share/meshminer)."""
        report: Any = None
        if data_dir is None:
            try:
                report = request_json(
                    api_url(api), "GET", "/api/v1/ledger/verify",
                    token=token_for(api_url(api)), timeout=300,
                )  # fmt: skip
            except ApiError as exc:
                raise fail(str(exc)) from None
            except NodeUnreachable as exc:
                if api is not None or os.environ.get("MESHMINER_API"):
                    raise fail(str(exc)) from None
                data_dir = data_dir_from(None)
                err.print(f"no node is running here; reading the ledger in {data_dir}")
        if data_dir is not None:
            ledger = _open_ledger(data_dir)
            try:
                found = ledger.verify()
            finally:
                ledger.close()
            ok, text = found.ok, str(found)
        else:
            ok = report["ok"]
            text = (
                f"ledger ok: {report['entries']} entries, head seq {report['head_seq']}, "
                f"{report['signatures_checked']} signatures"
                if ok
                else report["error"]
            )
        if ok:
            console.print(f"[green]{text}[/green]", highlight=False)
            return
        err.print(f"[red]{text}[/red]", highlight=False)
        raise typer.Exit(1)

    @ledger_app.command("export")
    def export(
        format: Annotated[str, typer.Option("--format", help="csv or jsonl")] = "jsonl",
        data_dir: LedgerDirOption = None,
        api: ApiOption = None,
    ) -> None:
        """Write every entry to stdout as CSV or JSON lines."""
        if format not in ("csv", "jsonl"):
            raise fail("--format must be csv or jsonl", 2)
        if data_dir is not None:
            ledger = _open_ledger(data_dir)
            try:
                ledger.export(format, sys.stdout)
            finally:
                ledger.close()
            return
        from ledger.export import write_rows

        after = -1
        rows: list[dict[str, Any]] = []
        while True:
            page = get(api, f"/api/v1/ledger?after={after}&limit=1000")["entries"]
            if not page:
                break
            rows.extend(page)
            after = page[-1]["seq"]
        write_rows(format, rows, sys.stdout)
