"""The meshminer node daemon.

One process per node. The trio thread owns all node state (`state`), wired at start
by `daemon`; the HTTP thread serves `web`, and the two meet only in
`node/net/bridge.py`; training runs in subprocesses (`work/run/`). Nothing imports
`node` but the console script, `python -m node`, the tests and the benchmarks.
docs/architecture.md.

The modules here are the node itself; the packages are its parts.

- `daemon`: the running node: start-up, the nursery of its tasks, the stop.
- `shutdown`: stopping within a bound: a deadline per step, a watchdog behind them.
- `state`: the `Node` object: capacity, policy and preferences, its ad, its status.
- `preferences`: the volunteer's preferences: when this node may train.
- `identity`: the node's Ed25519 key (`identity.key`) and the API token.
- `store`: `node.db`, and the lock on the data dir.
- `timeline`: the node's own timeline of what its volunteer changed.
- `metrics`: Prometheus metrics. `logs`: logging to stderr and `logs/node.log`.
- `client`: a small client of the HTTP API, for the CLI and the demo.
- `settings/`: every setting, declared once; loading them (`meshminer.toml`,
  `preferences.json`, flags), docs/settings.md made from them.
- `machine/`: the machine the node runs on: capacity, idleness, the systemd service,
  the doctor's findings.
- `net/`: everything that touches py-libp2p, and the trio/asyncio bridge.
- `web/`: the HTTP API, the status pages, the event feed.
- `work/`: jobs, as their owner and as a worker.
- `cli/`: the `meshminer` command line.
- `demo/`: `meshminer demo`, and the local network of node processes it runs (which
  the tests and the benchmarks use too).
"""

__version__ = "0.1.0"
