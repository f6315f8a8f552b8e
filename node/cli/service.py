"""CLI commands for the node as a service: node install-service, uninstall-service,
status."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from node.cli.common import ApiOption, DataDirOption, console, err, fail, token_for
from node.client import ApiError, NodeUnreachable, api_url, request_json


def register(node_app: typer.Typer, show_status: Callable[[dict[str, Any]], None]) -> None:
    @node_app.command(
        "install-service",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def install_service(
        ctx: typer.Context,
        data_dir: DataDirOption = None,
        start: Annotated[
            bool, typer.Option("--start/--no-start", help="enable and start it now")
        ] = True,
    ) -> None:
        """Run the node as a systemd user service, started at login (at boot too after
        `loginctl enable-linger`). Flags after the options go to `node run`, e.g.
        `meshminer node install-service -- --hours 22:00-07:00`."""
        from node.machine.service_unit import ServiceError, install, unit_path
        from node.settings import data_dir_from

        directory = data_dir_from(data_dir).resolve()
        try:
            path = install(directory, list(ctx.args), start=start)
        except ServiceError as exc:
            raise fail(
                f"{exc}\nThe unit file is written ({unit_path()}); start the node with "
                f"`meshminer node run --data-dir {directory}` instead, or where systemd "
                "runs: systemctl --user enable --now meshminer.service"
            ) from None
        console.print(f"wrote {path}", highlight=False)
        if start:
            console.print(
                "meshminer.service is enabled and started: it starts at login from now on.\n"
                "  its log: journalctl --user -u meshminer.service -f\n"
                "  to start it at boot, before any login: loginctl enable-linger $USER",
                highlight=False,
            )

    @node_app.command("uninstall-service")
    def uninstall_service() -> None:
        """Stop the service, disable it and remove its unit file (the data dir stays)."""
        from node.machine.service_unit import uninstall

        console.print(uninstall(), highlight=False)

    @node_app.command("status")
    def node_status(api: ApiOption = None) -> None:
        """Whether the service runs, and what the node says of itself."""
        from node.machine.service_unit import state

        console.print(f"service: meshminer.service {state()}", highlight=False)
        url = api_url(api)
        try:
            status = request_json(url, "GET", "/api/v1/status", token=token_for(url))
        except (NodeUnreachable, ApiError) as exc:
            err.print(f"node: not answering at {url} ({str(exc).splitlines()[0]})")
            raise typer.Exit(1) from None
        show_status(status)
