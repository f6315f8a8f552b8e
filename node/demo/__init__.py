"""The demo: `meshminer demo`, and the network of real node processes on loopback that
it runs on.

`localnet` starts node processes (`python -m node node run`, each with its own data dir
and ports), waits on what their APIs say and stops them; `run` and `elastic` are the
two modes of `meshminer demo` on top of it. The tests and the benchmarks start their
networks with `localnet` too. Nothing of the running node imports this package. It is
a map only: a re-export of `run_demo` would load the command line and rich into every
test that starts a node (`elastic` shows rounds with `node.cli.jobs`).
docs/operations/cli.md.

- `run`: `run_demo`: start the nodes, train the job of the mode asked, report; the
  `single` mode (a digits classifier, trained by one peer).
- `elastic`: the `elastic` mode: a character language model trained by several peers
  in rounds, while a node joins and a worker leaves.
- `localnet`: `LocalNetwork` and `LocalNode`, node processes on loopback with one torch
  thread each; `free_port`, `wait_for`.
"""
