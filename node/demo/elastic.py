"""`meshminer demo --mode elastic`: one job trained by several nodes at once, in rounds.

Node 1 submits a small character language model (trained on meshminer's own module
docstrings) as an elastic job for three workers. While the first round runs a new node
joins the network; once that round has closed, one worker is stopped, and the newcomer
takes its place in a later round. The demo follows the rounds, then prints the rounds
table and the final validation loss.
"""

from __future__ import annotations

import ast
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from node.cli.jobs import rounds_table
from node.client import submit_job
from node.demo.localnet import LocalNetwork, LocalNode
from training.spec.examples import char_lm_elastic_toml

WORKERS = 3
ROUNDS = 6
# a round of a few seconds: a worker starts its next share the moment its delta is in,
# so with rounds under a second the leaver had trained them all before it was stopped
INNER_STEPS = 150
CORPUS_CHARS = 40_000
PACKAGES = ("protocol", "node", "training", "ledger")


def write_corpus(path: Path) -> Path:
    """The module docstrings of meshminer itself, up to CORPUS_CHARS characters."""
    root = Path(__file__).resolve().parents[2]
    texts = []
    for package in PACKAGES:
        for module in sorted((root / package).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(module.read_text(encoding="utf-8")))
            if doc:
                texts.append(doc)
    path.write_text("\n\n".join(texts)[:CORPUS_CHARS], encoding="utf-8")
    return path


def run_elastic(
    net: LocalNetwork, root: Path, console: Console, rounds: int = ROUNDS, timeout: float = 900
) -> dict:
    """Submit the elastic job on the first node, add a node while round 0 runs and stop
    a worker once it has closed; returns the job as it ended.

    The newcomer joins early so that the owner has seen its capacity ad well before the
    round it is needed in (a node takes seconds to start on a busy machine, and a round
    short of a worker closes as soon as the others are done)."""
    owner, leaver = net.nodes[0], net.nodes[-1]
    corpus = write_corpus(root / "corpus.txt")
    spec = char_lm_elastic_toml(
        str(corpus), workers=WORKERS, rounds=rounds, inner_steps=INNER_STEPS
    )
    (root / "char-lm-elastic.toml").write_text(spec)
    job = submit_job(owner.api, spec, corpus)  # the corpus is uploaded with the spec
    console.print(
        f"\n{owner.name} submitted elastic job {job['id']}: a character LM, {rounds} rounds "
        f"of {WORKERS} workers (spec in {root / 'char-lm-elastic.toml'})"
    )
    joiner, stopped = None, False
    deadline = time.monotonic() + timeout
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} rounds"),
        TextColumn("{task.fields[loss]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("queued", total=rounds, loss="")
        while time.monotonic() < deadline:
            job = owner.get(f"/api/v1/jobs/{job['id']}")
            closed = [r for r in job["rounds"] if r["state"] == "closed"]
            losses = [r["val_loss"] for r in closed if r["val_loss"] is not None]
            loss = f"val loss {losses[-1]:.4f}" if losses else ""  # evaluated after the close
            bar.update(task, description=job["state"], completed=len(closed), loss=loss)
            if job["state"] in ("completed", "failed", "cancelled"):
                break
            if job["rounds"] and joiner is None:
                joiner = net.add()
                bar.console.print(f"{joiner.name} ({joiner.peer_id[-6:]}) joins the network")
            if closed and not stopped:
                bar.console.print(f"stopping {leaver.name} ({leaver.peer_id[-6:]}) mid-job")
                leaver.stop()
                stopped = True
            time.sleep(0.5)
        else:
            raise TimeoutError(f"the elastic demo job did not finish within {timeout:.0f} s")
    _report(owner, job, net, console)
    return job


def _report(owner: LocalNode, job: dict, net: LocalNetwork, console: Console) -> None:
    console.print(rounds_table(job["rounds"]))
    names = {n.peer_id: n.name for n in net.nodes}
    contributed = sorted({names.get(p, p[-6:]) for r in job["rounds"] for p in r["workers"]})
    sent = sum(r.get("bytes_in", 0) for r in job["rounds"])
    full = sum(r.get("full_bytes", 0) for r in job["rounds"])
    down = sum(r.get("bytes_out", 0) for r in job["rounds"])
    console.print(
        f"final validation loss {job['metrics'].get('val_loss', float('nan')):.4f}; "
        f"workers: {', '.join(contributed)}; deltas up took {sent / 1e6:.2f} MB "
        f"({full / max(sent, 1):.1f}x less than fp32 weights), weights and their updates "
        f"down {down / 1e6:.2f} MB ({full / max(down, 1):.1f}x less)"
    )
    console.print(f"  job details: {owner.api}/api/v1/jobs/{job['id']}")
    console.print(f"  status page: {owner.api}/jobs/{job['id']}")
