"""`meshminer doctor`: reachability, addresses, peers, clock, ports, permissions, torch
and isolation, each problem with its fix (`node.machine.doctor`)."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.table import Table

from node.cli.common import ApiOption, DataDirOption, console, token_for
from node.client import ApiError, NodeUnreachable, api_url, request_json
from node.machine import (
    PROBLEM,
    WARN,
    Finding,
    data_dir_findings,
    node_findings,
    torch_findings,
    worst,
)

_STYLE = {"ok": "green", WARN: "yellow", PROBLEM: "red"}


def register(app: typer.Typer) -> None:
    @app.command()
    def doctor(
        api: ApiOption = None,
        data_dir: DataDirOption = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the findings as JSON")] = False,
    ) -> None:
        """Check what stands between this node and useful work; each problem with its
        fix. Exits 1 when something is a problem."""
        from node.settings import data_dir_from

        url = api_url(api)
        findings: list[Finding] = []
        try:
            token = token_for(url)
            status = request_json(url, "GET", "/api/v1/status", token=token, timeout=10)
            peers = request_json(url, "GET", "/api/v1/peers", token=token, timeout=10)
            findings += node_findings(status, peers, time.time())
        except (NodeUnreachable, ApiError) as exc:
            findings.append(Finding("node", PROBLEM, str(exc)))  # which says what to do
        findings += data_dir_findings(data_dir_from(data_dir))
        findings += torch_findings()
        if as_json:
            print(
                json.dumps({"state": worst(findings), "findings": [f.to_json() for f in findings]})
            )
        else:
            table = Table(title=f"meshminer doctor: {worst(findings)}")
            for column in ("check", "state", "what we found", "fix"):
                table.add_column(column, overflow="fold")
            for f in findings:
                style = _STYLE[f.state]
                table.add_row(f.name, f"[{style}]{f.state}[/{style}]", f.detail, f.fix)
            console.print(table)
        if worst(findings) == PROBLEM:
            raise typer.Exit(1)
