"""The meshminer node daemon.

One process per node. The trio thread owns all node state (`state`), wired at start
by `daemon`; the HTTP thread serves `web`, and the two meet only in
`node/net/bridge.py`; training runs in subprocesses (`work/run/`). Nothing imports
`node` but the console script, `python -m node`, the tests and the benchmarks.
docs/architecture.md.

- `daemon`: the running node: start-up, the nursery of its tasks, the stop.
- `shutdown`: stopping within a bound: a deadline per step, a watchdog behind them.
- `state`: the `Node` object: capacity, policy and preferences, its ad, its status.
- `settings`: every setting, declared once; `settings_schema`: what declaring one
  takes, and the value checks; `settings_doc`: docs/settings.md, written from them.
- `config`: loading settings (defaults < `meshminer.toml` < `preferences.json` <
  flags) and finding the data dir.
- `preferences`: the volunteer's preferences: when this node may train.
- `identity`: the node's Ed25519 key (`identity.key`) and the API token.
- `capacity`: devices, the measured TFLOP/s, the determinism class, `capacity.json`.
- `store`: `node.db`, and the lock on the data dir.
- `timeline`: the node's own timeline of what its volunteer changed.
- `idle`: how long since the volunteer last used the machine.
- `metrics`: Prometheus metrics. `logs`: logging to stderr and `logs/node.log`.
- `doctor`: what stands between this node and useful work, each with its fix.
- `service_unit`: the node as a systemd user service.
- `client`: a small client of the HTTP API, for the CLI and the demo.
- `localnet`: a network of node processes on loopback (demo, tests, benchmarks).
- `demo`, `demo_elastic`: `meshminer demo`.
- `net/`: everything that touches py-libp2p, and the trio/asyncio bridge.
- `web/`: the HTTP API, the status pages, the event feed.
- `work/`: jobs, as their owner and as a worker.
- `cli/`: the `meshminer` command line.
"""

__version__ = "0.1.0"
