"""One process of `benchmarks.hivemind`'s hivemind side, run by the hivemind virtualenv's
Python with the clone on PYTHONPATH (it imports meshminer's training code, never `node`).

    hivemind_peer.py bootstrap ADDRS_FILE
    hivemind_peer.py peer SPEC_JSON OUT_JSON --index I --peers N --initial-peer ADDR ...

- `bootstrap`: a hivemind DHT on 127.0.0.1 that the peers join; writes its multiaddrs
  to ADDRS_FILE and runs until SIGTERM.
- `peer`: builds the spec's model and data exactly as meshminer does
  (`training.run.execute.prepare`, the seeded init of `training.elastic.rounds`), and
  trains it with `hivemind.Optimizer` in local-updates mode on its own third of the
  training windows until the optimizer reaches `--epochs` (or `--deadline` seconds
  pass, or the peer has taken `--max-steps` steps when that is above 0); then the
  validation loss as meshminer's owner computes it after an outer step
  (`training.run.execute.validate`). Writes OUT_JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import hivemind
import torch
from hivemind.utils import get_dht_time

from training.elastic.rounds import slot_seed
from training.model.bind import bind_trainable
from training.model.modules import build_model
from training.program.job import bind_local
from training.run.execute import deterministic, prepare, validate
from training.run.loop import batches, forward_loss
from training.run.optim import make_loss
from training.spec.job import parse_spec

LISTEN = ["/ip4/127.0.0.1/tcp/0"]
RUN_ID = "meshminer-bench"
BARRIER_TIMEOUT_S = 120.0


class Averagings(logging.Handler):
    """Counts the state averager's outcomes from its status log lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.groups: list[int] = []
        self.failed = 0
        self.resyncs = 0  # steps that loaded the state from peers instead of training

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Averaged parameters with "):
            self.groups.append(int(message.split()[3]))
        elif message.startswith("Averaging failed"):
            self.failed += 1
        elif message == "Peer is out of sync":
            self.resyncs += 1


def bootstrap(addrs_file: Path) -> None:
    dht = hivemind.DHT(start=True, host_maddrs=LISTEN)
    addrs_file.write_text("\n".join(str(a) for a in dht.get_visible_maddrs()))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    dht.shutdown()


def _barrier(dht: hivemind.DHT, key: str, index: int, peers: int) -> dict[Any, Any]:
    """Announce this peer under `key` and wait until all `peers` have (over the DHT)."""
    dht.store(key, subkey=index, value=True, expiration_time=get_dht_time() + 3600)
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while True:
        found = dht.get(key, latest=True)
        entries = {k: v.value for k, v in found.value.items()} if found else {}
        if len(entries) >= peers or time.monotonic() > deadline:
            return entries
        time.sleep(0.2)


def peer(args: argparse.Namespace) -> None:
    began = time.monotonic()
    spec = bind_trainable(bind_local(parse_spec(json.loads(args.spec.read_text()))))
    optim = spec.optim  # what `training.run.optim.make_optimizer` makes of it, below
    plain = optim.schedule == "constant" and optim.grad_clip is None and optim.precision == "fp32"
    if optim.name != "adamw" or not plain:
        raise SystemExit("the peer trains constant-rate fp32 AdamW specs without clipping only")
    run = prepare(spec, None, "cpu")
    with deterministic(spec.seed):  # round 0's global weights, as `init_weights` makes them
        model = build_model(run.plan)
    order = torch.randperm(len(run.data.train), generator=torch.Generator().manual_seed(spec.seed))
    own = order[args.index :: args.peers]  # this peer's third of the training windows
    batch = run.summary.batch_size
    draws = batches(len(own), batch, slot_seed(spec.seed, args.index, 0))
    loss_fn = make_loss(run.summary.loss, run.data.info.task)

    counts = Averagings()
    logging.getLogger("hivemind").addHandler(counts)
    dht = hivemind.DHT(initial_peers=args.initial_peer, start=True, host_maddrs=LISTEN)
    opt = hivemind.Optimizer(
        dht=dht,
        run_id=RUN_ID,
        params=model.parameters(),
        optimizer=lambda groups: torch.optim.AdamW(
            groups, lr=optim.lr, weight_decay=optim.weight_decay
        ),
        target_batch_size=args.peers * batch * args.inner_steps,
        batch_size_per_step=batch,
        use_local_updates=True,
        # averaged within the step that closes the epoch: in the background (the default)
        # the next step waits for it anyway, and the tracker counts that wait as
        # training, so epochs closed with anywhere from 1/3 to all of their samples
        delay_state_averaging=False,
        matchmaking_time=args.matchmaking,
        averaging_timeout=args.averaging_timeout,
        averager_opts={"request_timeout": args.matchmaking / 2},  # below matchmaking_time
        verbose=True,
    )
    _barrier(dht, "bench-ready", args.index, args.peers)
    trained_from = time.monotonic()
    deadline = began + args.deadline
    steps, hit_deadline, losses = 0, False, []
    model.train()
    with deterministic(slot_seed(spec.seed, args.index, 0)):
        while opt.local_epoch < args.epochs:
            if args.max_steps and steps >= args.max_steps:
                break
            if time.monotonic() > deadline:
                hit_deadline = True
                break
            x, y = run.data.train.batch(own[next(draws)])
            loss = forward_loss(model, loss_fn, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            losses.append(loss.item())
    train_s = time.monotonic() - trained_from
    # the averaging begun at the last epoch's transition runs in the background: apply it
    opt.state_averager.step(wait_for_delayed_updates=True)
    val = validate(run, model)
    report = {
        "index": args.index,
        "epoch": opt.local_epoch,
        "steps": steps,
        "hit_deadline": hit_deadline,
        "averaged": len([g for g in counts.groups if g > 1]),
        "group_sizes": counts.groups,
        "averaging_failed": counts.failed,
        "resyncs": counts.resyncs,
        "samples": (steps - counts.resyncs) * batch,
        "train_loss": sum(losses[-10:]) / max(len(losses[-10:]), 1),
        "train_s": train_s,
        "done_at": time.time(),  # its loss known: the run's end, as a job's last round's
        **val,
    }
    args.out.write_text(json.dumps(report))
    _barrier(dht, "bench-done", args.index, args.peers)  # nobody leaves a group mid-round
    opt.shutdown()
    dht.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="role", required=True)
    boot = sub.add_parser("bootstrap")
    boot.add_argument("addrs", type=Path)
    one = sub.add_parser("peer")
    one.add_argument("spec", type=Path)
    one.add_argument("out", type=Path)
    one.add_argument("--index", type=int, required=True)
    one.add_argument("--peers", type=int, required=True)
    one.add_argument("--initial-peer", action="append", required=True)
    one.add_argument("--epochs", type=int, required=True)
    one.add_argument("--inner-steps", type=int, required=True)
    one.add_argument("--deadline", type=float, required=True)
    one.add_argument("--max-steps", type=int, required=True)
    one.add_argument("--matchmaking", type=float, required=True)
    one.add_argument("--averaging-timeout", type=float, required=True)
    args = parser.parse_args()
    try:
        bootstrap(args.addrs) if args.role == "bootstrap" else peer(args)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)  # hivemind's helper processes and threads can hold a normal exit forever


if __name__ == "__main__":
    main()
