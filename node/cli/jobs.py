"""CLI commands about jobs: submit, jobs, jobs show, train-local; node pause/resume/prefs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from node.cli.common import (
    ApiOption,
    TokenOption,
    call,
    console,
    err,
    fail,
    get,
    short,
    token_for,
)
from node.client import api_url, request_json, submit_job

FINAL = ("completed", "failed", "cancelled")


def register(app: typer.Typer, node_app: typer.Typer) -> None:
    jobs_app = typer.Typer(
        help="List jobs, or show one.", invoke_without_command=True, rich_markup_mode=None
    )
    app.add_typer(jobs_app, name="jobs")

    @app.command()
    def submit(
        spec: Annotated[Path, typer.Argument(help="job spec (TOML)", exists=True, dir_okay=False)],
        wait: Annotated[bool, typer.Option(help="follow the job until it ends")] = False,
        api: ApiOption = None,
        token: TokenOption = None,
    ) -> None:
        """Submit a training job to your node (its data and program files are uploaded with it)."""
        from training.spec.job import SpecError, load_spec, local_files, model_files

        url = api_url(api)
        try:
            # a spec may only name data beside it: a downloaded spec must not be able to
            # make you upload ~/.ssh or the like
            parsed = load_spec(spec, allowed_root=spec.resolve().parent)
        except (SpecError, OSError) as exc:
            raise fail(f"{spec}: {exc}", 2) from None
        files = local_files(parsed)
        shards: list[Path] = []
        if parsed.data.shards:  # each shard its own upload, `shard<k>` in shard order
            for k, shard in enumerate(parsed.data.shards):
                if shard.startswith("blob:"):
                    raise fail(
                        f"{spec}: data.shards[{k}] names a blob; a submission uploads every "
                        "shard, so name each by its .bin file",
                        2,
                    )
            shards, files = files, []
        elif len(files) > 1:
            raise fail("a job takes one data file (or data.shards for an elastic job)", 2)
        job = call(
            submit_job,
            url,
            spec.read_text(),
            files[0] if files else None,
            token_for(url, token),
            files=model_files(parsed),
            shards=shards,
        )
        console.print(f"job [bold]{job['id']}[/bold] ({job['name']}) submitted: {job['state']}")
        if wait:
            raise typer.Exit(_follow(url, job["id"]))

    @jobs_app.callback()
    def jobs(ctx: typer.Context, api: ApiOption = None) -> None:
        """List this node's jobs: state, worker, progress, metrics."""
        if ctx.invoked_subcommand is not None:
            return
        rows = get(api, "/api/v1/jobs")
        table = Table(title=f"{len(rows)} jobs")
        for column in ("id", "name", "state", "worker", "progress", "metrics"):
            table.add_column(column)
        for job in rows:
            table.add_row(
                job["id"],
                job["name"],
                _state(job),
                short(job["worker"]),
                _progress(job),
                _metrics(job["metrics"]) + _claim(job),
            )
        console.print(table)

    @jobs_app.command("show")
    def show(job_id: str, api: ApiOption = None) -> None:
        """Everything about one job: spec, timeline, progress, result."""
        url = api_url(api)
        job = get(url, f"/api/v1/jobs/{job_id}")
        table = Table(show_header=False, box=None)
        table.add_row("id", job["id"])
        table.add_row("name", job["name"])
        table.add_row("state", _state(job))
        table.add_row("worker", job["worker"] or "-")
        table.add_row("progress", _progress(job))
        table.add_row("metrics", (_metrics(job["metrics"]) + _claim(job)) or "-")
        if job["weights_sha256"]:
            table.add_row(
                "weights",
                f"{url}/api/v1/jobs/{job['id']}/weights (sha256 {job['weights_sha256'][:16]}…)",
            )
        table.add_row("model", str(job["spec"].get("model", {})))
        table.add_row("data", _data_shown(job["spec"].get("data", {})))
        console.print(table)
        if job.get("rounds"):
            console.print(rounds_table(job["rounds"]))
        if job.get("trials"):
            console.print(trials_table(job["trials"], job.get("best"), job["spec"]["sweep"]))
        timeline = Table(title="timeline")
        timeline.add_column("time")
        timeline.add_column("state")
        timeline.add_column("what")
        for entry in job["timeline"]:
            timeline.add_row(
                time.strftime("%H:%M:%S", time.localtime(entry["t"])), entry["state"], entry["note"]
            )
        console.print(timeline)

    @app.command("train-local")
    def train_local_cmd(
        spec: Annotated[Path, typer.Argument(help="job spec (TOML)", exists=True, dir_okay=False)],
        out: Annotated[Path, typer.Option("--out", help="where to write the weights")] = Path(
            "weights.safetensors"
        ),
    ) -> None:
        """Train a spec on this machine, no network: what a peer would return."""
        from training.errors import TrainingError
        from training.run.local import train_local
        from training.spec.job import SpecError, load_spec, spec_to_plain

        try:
            parsed = load_spec(spec)
        except (SpecError, OSError) as exc:
            raise fail(f"{spec}: {exc}", 2) from None
        with _bar() as bar:
            task = bar.add_task("training", total=None, loss="")

            def emit(event: dict[str, Any]) -> None:
                if event.get("event") == "progress":
                    trial = event.get("trial")
                    bar.update(
                        task,
                        description="training" if trial is None else f"trial {trial}",
                        total=event["total_steps"],
                        completed=event["step"],
                        loss=f"loss {event['loss']:.4f}",
                    )
                elif event.get("event") == "trial":  # a sweep's trial ended
                    value = event["value"]
                    shown = f" {value:.5g}" if isinstance(value, float) else ""
                    bar.console.print(
                        f"trial {event['number']} (of {event['trials']}): {event['state']}{shown}"
                    )

            try:
                result = train_local(parsed, out, emit=emit)
            except (SpecError, TrainingError, ValueError, OSError) as exc:
                raise fail(str(exc)) from None
        if result.get("rounds"):
            console.print(rounds_table(result["rounds"]))
        if result.get("trials"):
            sweep = spec_to_plain(parsed)["sweep"]
            console.print(trials_table(result["trials"], result["best"], sweep))
        console.print(f"weights: {out} (sha256 {result['weights_sha256'][:16]}…)")
        console.print(f"metrics: {_metrics(result.get('metrics', {}))}")

    def _policy_change(api: str | None, token: str | None, body: dict[str, Any]) -> None:
        url = api_url(api)
        policy = call(
            request_json,
            url,
            "PUT",
            "/api/v1/policy",
            body,
            token_for(url, token),
        )
        console.print(f"accepting work: {policy['accepting']}")

    @node_app.command("pause")
    def pause(
        hand_back: Annotated[
            bool,
            typer.Option(
                help="stop the running unit and return it to its owner (default: finish it)"
            ),
        ] = False,
        api: ApiOption = None,
        token: TokenOption = None,
    ) -> None:
        """Stop accepting work; the next capacity ad says so."""
        _policy_change(
            api, token, {"accepting": False, "running": "hand_back" if hand_back else "finish"}
        )

    @node_app.command("resume")
    def resume(api: ApiOption = None, token: TokenOption = None) -> None:
        """Accept work again."""
        _policy_change(api, token, {"accepting": True})

    @node_app.command("prefs")
    def prefs(
        changes: Annotated[
            list[str] | None,
            typer.Argument(help='KEY=VALUE to set, e.g. hours=22:00-07:00 "gpus=0,1"'),
        ] = None,
        api: ApiOption = None,
        token: TokenOption = None,
    ) -> None:
        """Show the node's policy and preferences, or change them while it runs (kept in
        preferences.json in the data dir for the next start)."""
        url = api_url(api)
        if changes:
            body = dict(_pref_value(change) for change in changes)
            shown = call(request_json, url, "PUT", "/api/v1/policy", body, token_for(url, token))
        else:
            shown = get(url, "/api/v1/status")["preferences"]
        table = Table(show_header=False, box=None)
        for key, value in shown.items():
            table.add_row(key, json.dumps(value))
        console.print(table)


def _pref_value(change: str) -> tuple[str, Any]:
    """ "key=value": JSON where it parses (numbers, true, lists), else the text."""
    key, sep, text = change.partition("=")
    if not sep or not key:
        raise typer.BadParameter(f"{change!r}: expected KEY=VALUE", param_hint="CHANGES")
    try:
        return key, json.loads(text)
    except ValueError:
        return key, text


def _follow(url: str, job_id: str) -> int:
    """Show a live progress bar with the loss until the job ends; 0 if it completed."""
    with _bar() as bar:
        task = bar.add_task("queued", total=None, loss="")
        while True:
            job = get(url, f"/api/v1/jobs/{job_id}")
            p = job["progress"]
            label = f"{job['state']}" + (f" on {short(job['worker'])}" if job["worker"] else "")
            if "round" in p:  # an elastic job: which round of how many
                label = f"{job['state']}, round {p['round'] + 1}/{p['rounds']}"
            if "trials" in p:  # a sweep: trials ended of how many, and how
                t = p["trials"]
                label = (
                    f"{job['state']}: {t['complete']} complete, {t['pruned']} pruned, "
                    f"{t['failed']} failed, {t['running']} running"
                )
            loss = f"loss {p['loss']:.4f}" if p.get("loss") is not None else (job["reason"][:60])
            bar.update(
                task,
                description=label,
                total=p.get("total_steps") or None,
                completed=p.get("step", 0),
                loss=loss,
            )
            if job["state"] in FINAL:
                break
            time.sleep(0.5)
    if job["state"] != "completed":
        err.print(f"job {job_id} {job['state']}: {job['reason']}", highlight=False)
        return 1
    if job.get("rounds"):
        console.print(rounds_table(job["rounds"]))
    if job.get("trials"):
        console.print(trials_table(job["trials"], job.get("best"), job["spec"]["sweep"]))
    by = job["worker"] or ("its rounds" if job.get("rounds") else "its trials")
    console.print(f"completed by {by}: {_metrics(job['metrics'])}")
    console.print(f"weights: {url}/api/v1/jobs/{job_id}/weights")
    return 0


def rounds_table(rounds: list[dict[str, Any]]) -> Table:
    """An elastic job's rounds: who contributed, who joined or left, loss, traffic."""
    table = Table(title="rounds")
    columns = ("round", "workers", "joined", "left", "val loss", "MB up", "MB down", "seconds")
    for column in columns:
        table.add_column(column, justify="right" if column != "joined" else "left")
    for r in rounds:
        workers = r["workers"]
        count = len(workers) if isinstance(workers, list) else int(workers)
        val = r.get("val_loss")
        table.add_row(
            str(r["round"]),
            str(count) + (" (open)" if r.get("state") == "open" else ""),
            ", ".join(short(p) for p in r.get("joined", [])) or "-",
            ", ".join(short(p) for p in sorted({*r.get("left", []), *r.get("dropped", [])})) or "-",
            f"{val:.4f}" if isinstance(val, float) else "-",
            f"{r.get('bytes_in', 0) / 1e6:.3f}",  # deltas, workers to owner
            f"{r.get('bytes_out', 0) / 1e6:.3f}",  # weights or their update, owner to workers
            f"{r['seconds']:.1f}" if "seconds" in r else "-",
        )
    return table


def trials_table(trials: list[dict[str, Any]], best: dict | None, sweep: dict) -> Table:
    """A sweep's trials, best first (by the sweep's metric); the best one in bold."""
    sign = 1.0 if sweep["direction"] == "minimize" else -1.0
    ordered = sorted(  # complete trials by value, then the others (pruned, failed, running)
        trials,
        key=lambda t: (t["state"] != "complete", sign * (t["value"] or 0.0), t["number"]),
    )
    keys = list(sweep["space"])
    table = Table(title=f"trials ({sweep['metric']}, {sweep['direction']})")
    for column in ("trial", "state", sweep["metric"], *keys, "worker", "steps"):
        table.add_column(column)
    for t in ordered:
        value = t["value"]
        is_best = best is not None and t["number"] == best["number"]
        table.add_row(
            str(t["number"]),
            t["state"],
            f"{value:.5g}" if isinstance(value, float) else "-",
            *(_param(t["params"].get(k)) for k in keys),
            short(t["worker"]) if t.get("worker") else "-",
            str(t["steps"]),
            style="bold green" if is_best else None,
        )
    return table


def _param(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TextColumn("{task.fields[loss]}"),
        TimeElapsedColumn(),
        console=console,
    )


def _data_shown(data: dict[str, Any]) -> str:
    """A job's data: its source, or how many shards and the first's blob."""
    shards = data.get("shards") or []
    if shards:
        return f"{len(shards)} shards, the first {shards[0][:17]}…"
    return str(data.get("source", ""))


def _state(job: dict[str, Any]) -> str:
    return job["state"] + (
        f" ({job['reason']})" if job["reason"] and job["state"] in ("queued", "failed") else ""
    )


def _progress(job: dict[str, Any]) -> str:
    p = job["progress"]
    if not p.get("total_steps"):
        return "-"
    loss = f", loss {p['loss']:.4f}" if p.get("loss") is not None else ""
    return f"{p['step']}/{p['total_steps']}{loss}"


def _claim(job: dict[str, Any]) -> str:
    """A remote worker's metrics are its word until verified."""
    if job.get("metrics") and job.get("metrics_status") == "claimed":
        return f" (claimed by {short(job['worker'])}, not verified)"
    if job.get("metrics") and job.get("metrics_status") == "verified":
        return " (verified by a spot check)"
    return ""


def _metrics(metrics: dict[str, Any]) -> str:
    keys = ("val_accuracy", "val_loss", "train_loss")
    return ", ".join(f"{k} {metrics[k]:.4f}" for k in keys if isinstance(metrics.get(k), float))
