"""The status pages at `/`: overview, network, jobs, one job, ledger (aiohttp + jinja2).

Every page is rendered on the server with autoescaping on; the page's script
(`static/app.js`) only listens to `GET /api/v1/events` and, when an event concerns a
part of the page, fetches that part again (`?partial=1` renders only the page's
`live` block) and swaps it in. After a reconnect (a node restart, a lost connection)
it fetches every part again. Nothing is loaded from anywhere but this node, and the
Content-Security-Policy says so: scripts and styles only from `/static/`, no inline
script.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

from node.web import page_data
from node.web.charts import loss_chart
from node.web.credit import read_credit
from node.web.filters import ago, duration, number, pretty_json, short_id, to_toml, when
from node.web.sweep_charts import importance_bars, parallel_coordinates
from protocol.receipts import credit_text

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
JOB_ID = re.compile(r"[0-9a-f]{16}")
LEDGER_PAGE = 50
VERIFY_CACHE_S = 60.0

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


@dataclass
class PageSources:
    """What the pages read. `node` and `work` are node state: reached only through
    `bridge.call`; `ledger` and `audit` are thread-safe and read in worker threads."""

    node: Any  # NodeState: status(), peers()
    work: Any  # WorkService: jobs(), job(), weights_path(), ctx
    ledger: Any
    audit: Any
    bridge: Any  # TrioBridge
    writes_open: bool  # loopback bind: the submit form needs no token
    own: dict[str, Any] = field(default_factory=dict)  # peer id, name, team: the credit page
    directory_credit: Any = None  # a directory's table in a large network (web.credit)
    verify_cache_s: float = VERIFY_CACHE_S
    _verified: tuple[int, float, Any] | None = field(default=None, repr=False)
    _verify_lock: asyncio.Lock | None = field(default=None, repr=False)

    async def verify(self, fresh: bool = False) -> Any:
        """The ledger's verification report: recent and for the current head, else new."""
        if self._verify_lock is None:
            self._verify_lock = asyncio.Lock()
        async with self._verify_lock:
            head = (await asyncio.to_thread(self.ledger.head)).seq
            cached = self._verified
            if (
                not fresh
                and cached is not None
                and cached[0] == head
                and time.monotonic() - cached[1] < self.verify_cache_s
            ):
                return cached[2]
            report = await asyncio.to_thread(self.ledger.verify)
            self._verified = (head, time.monotonic(), report)
            return report


# -- formatting ---------------------------------------------------------------------------


def make_env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.ChainableUndefined,  # a queued job has no progress yet
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        short=short_id,
        ago=ago,
        when=when,
        num=number,
        duration=duration,
        pretty_json=pretty_json,
        toml=to_toml,
        credit=credit_text,
    )
    env.globals["loss_chart"] = loss_chart
    env.globals["parallel_coordinates"] = parallel_coordinates
    env.globals["importance_bars"] = importance_bars
    return env


def sweep_history(job: dict[str, Any]) -> list[list[Any]]:
    """A sweep's optimisation history, [trial, best so far, its value] per complete
    trial in trial order (empty for other jobs)."""
    if job.get("mode") != "sweep":
        return []
    sign = 1.0 if job["spec"]["sweep"].get("direction") == "minimize" else -1.0
    rows: list[list[Any]] = []
    best: float | None = None
    for trial in sorted(job.get("trials") or [], key=lambda t: t["number"]):
        value = trial.get("value")
        if trial.get("state") != "complete" or not isinstance(value, int | float):
            continue
        best = value if best is None or sign * value < sign * best else best
        rows.append([trial["number"], best, value])
    return rows


# -- receipts -----------------------------------------------------------------------------


def describe_receipt(data: bytes | None) -> dict[str, Any] | None:
    """A stored co-signed receipt, decoded and its signatures checked, for display."""
    if not data:
        return None
    from protocol import ProtocolError
    from protocol.receipts import open_cosigned, open_receipt, parse_cosigned, verify_claim

    try:
        cosigned = parse_cosigned(data)
        receipt = open_receipt(cosigned.receipt)
        if cosigned.countersigned:
            open_cosigned(data)
        else:
            verify_claim("owner", receipt.owner, cosigned, cosigned.owner_sig)
    except ProtocolError as exc:
        return {"valid": False, "error": str(exc)}
    return {
        "valid": True,
        "error": "",
        "countersigned": cosigned.countersigned,
        "credit_formula": cosigned.credit_formula,
        "owner": receipt.owner,
        "worker": receipt.worker,
        "weights_sha256": receipt.weights_sha256,
        "steps": receipt.steps,
        "samples": receipt.samples,
        "metrics": dict(receipt.metrics),
        "issued_at": receipt.issued_at,
        "credit": cosigned.credit,
        "owner_sig": cosigned.owner_sig.hex(),
        "worker_sig": cosigned.worker_sig.hex(),
    }


# -- routes -------------------------------------------------------------------------------


def _html(body: str, status: int = 200) -> web.Response:
    return web.Response(
        text=body, status=status, content_type="text/html", charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )  # fmt: skip


def page_routes(src: PageSources) -> Callable[[web.Application], None]:
    """Returns a function that adds the pages, `/static/` and the HTML error pages."""
    env = make_env()

    def render(request: web.Request, name: str, status: int = 200, **context: Any) -> web.Response:
        template = env.get_template(name)
        context.update(
            path=request.path,
            live_url=_live_url(request),
            now=time.time(),
            writes_open=src.writes_open,
        )
        if request.query.get("partial") == "1" and "live" in template.blocks:
            body = "".join(template.blocks["live"](template.new_context(context)))
        else:
            body = template.render(context)
        return _html(body, status)

    def error_page(request: web.Request, status: int, title: str, message: str) -> web.Response:
        return render(request, "error.html", status, code=status, title=title, message=message)

    def int_query(request: web.Request, name: str, low: int, high: int) -> int | None:
        raw = request.query.get(name)
        if raw is None or raw == "":
            return None
        try:
            value = int(raw)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise _BadQuery(f"'{name}' must be a whole number in {low}..{high}, got {raw[:40]!r}")
        return value

    async def overview(request: web.Request) -> web.Response:
        state = await src.bridge.call(page_data.overview, src.node, src.work)
        balances = await asyncio.to_thread(src.ledger.balances)
        report = await src.verify()
        return render(request, "overview.html", s=state, balances=balances, report=report)

    async def network(request: web.Request) -> web.Response:
        status = await src.bridge.call(src.node.status)
        peers = await src.bridge.call(src.node.peers)
        credit, conflicts = await asyncio.to_thread(
            lambda: (src.audit.network_credit(), src.audit.conflicts())
        )
        rows = [_own_row(status)] + peers
        for row in rows:
            row.setdefault("self", False)
            row["credit"] = credit.get(row["peer_id"], {})
            row["reputation"] = _reputation(row["credit"])
        live = [r for r in rows if not r.get("stale")]
        totals = {
            "nodes": len(live),
            "tflops": sum(float(r.get("tflops") or 0) for r in live),
            "gpus": sum(1 for r in live for g in r.get("gpus", []) if g.get("kind") == "cuda"),
            "accepting": sum(1 for r in live if r.get("policy", {}).get("accepting")),
        }
        return render(
            request,
            "network.html",
            s=status,
            rows=rows,
            totals=totals,
            conflicts=conflicts,
        )

    async def credit(request: web.Request) -> web.Response:
        view = await read_credit(
            src.audit, lambda: src.bridge.call(src.node.peers), src.own, src.directory_credit
        )
        return render(request, "credit.html", view=view)

    async def jobs(request: web.Request) -> web.Response:
        listing = await src.bridge.call(src.work.jobs)
        status = await src.bridge.call(src.node.status)
        return render(request, "jobs.html", jobs=listing, s=status)

    async def job(request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        view = None
        if JOB_ID.fullmatch(job_id):
            view = await src.bridge.call(page_data.job_view, src.work, job_id)
        if view is None:
            return error_page(request, 404, "No such job", f"No job {job_id!r} on this node.")
        receipt = describe_receipt(view.pop("receipt_bytes"))
        metrics = view.get("metrics") or {}
        final_val = final_train = None
        if metrics.get("steps"):
            if isinstance(metrics.get("val_loss"), int | float):
                final_val = (metrics["steps"], metrics["val_loss"])
            if isinstance(metrics.get("train_loss"), int | float):
                final_train = (metrics["steps"], metrics["train_loss"])
        return render(
            request,
            "job.html",
            job=view,
            receipt=receipt,
            final_val=final_val,
            final_train=final_train,
            sweep_history=sweep_history(view),
        )

    async def ledger(request: web.Request) -> web.Response:
        try:
            after = int_query(request, "after", -1, 2**62)
        except _BadQuery as exc:
            return error_page(request, 400, "Bad request", str(exc))
        verify = request.query.get("verify") == "1"
        report = await src.verify(fresh=True) if verify else None
        head = (await asyncio.to_thread(src.ledger.head)).seq
        if after is None:
            after = max(-1, head - LEDGER_PAGE)
        entries = await asyncio.to_thread(src.ledger.entries, after, LEDGER_PAGE)
        balances = await asyncio.to_thread(src.ledger.balances)
        problems = [(_problem_seq(text), text) for text in (report.problems if report else [])]
        return render(
            request,
            "ledger.html",
            entries=list(reversed(entries)),
            balances=balances,
            report=report,
            problems=problems,
            bad={seq for seq, _ in problems if seq is not None},
            after=after,
            head=head,
            page=LEDGER_PAGE,
        )

    @web.middleware
    async def html_errors(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Unknown pages get an HTML 404 (the API keeps its JSON errors)."""
        if request.path.startswith("/api/") or request.path == "/metrics":
            return await handler(request)
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return error_page(
                request, 404, "Not found", f"There is no page at {request.path[:200]}."
            )
        except web.HTTPMethodNotAllowed as exc:
            return error_page(request, 405, "Method not allowed", exc.text or "")

    async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)

    def add(app: web.Application) -> None:
        app.router.add_get("/", overview)
        app.router.add_get("/network", network)
        app.router.add_get("/credit", credit)
        app.router.add_get("/jobs", jobs)
        app.router.add_get("/jobs/{job_id}", job)
        app.router.add_get("/ledger", ledger)
        app.router.add_static("/static/", STATIC, name="static")
        app.middlewares.append(html_errors)
        app.on_response_prepare.append(security_headers)

    return add


class _BadQuery(ValueError):
    pass


def _problem_seq(problem: str) -> int | None:
    """The seq a verification problem names ("seq 17: hash does not match ...")."""
    match = re.match(r"seq (\d+)\b", problem)
    return int(match.group(1)) if match else None


def _live_url(request: web.Request) -> str:
    query = {k: v for k, v in request.query.items() if k not in ("partial", "verify")}
    query["partial"] = "1"
    return str(request.rel_url.with_query(query))


def _own_row(status: dict[str, Any]) -> dict[str, Any]:
    capacity = status.get("capacity", {})
    return {
        "peer_id": status["peer_id"],
        "addrs": status.get("addrs", []),
        "gpus": capacity.get("gpus", []),
        "tflops": capacity.get("tflops", 0.0),
        "load": status.get("load", 0),
        "policy": status.get("policy", {}),
        "paused": status.get("availability", {}).get("paused", ""),
        "last_seen": time.time(),
        "stale": False,
        "self": True,
    }


def _reputation(credit: dict[str, Any]) -> dict[str, Any]:
    """Reputation from the audit table: receipts co-signed by others, less conflicts."""
    receipts, conflicts = int(credit.get("receipts", 0)), int(credit.get("conflicts", 0))
    if conflicts:
        label, level = f"{conflicts} conflicting receipt{'s' * (conflicts != 1)}", "bad"
    elif receipts:
        label, level = f"{receipts} co-signed receipt{'s' * (receipts != 1)}", "good"
    else:
        label, level = "no receipts yet", "new"
    return {"label": label, "level": level, "receipts": receipts, "conflicts": conflicts}
