"""The node's HTTP surface: the JSON API under /api/v1, Prometheus /metrics, the status
pages and their live event stream, served by aiohttp in the HTTP thread.

Nothing here touches node state directly: handlers call into the trio thread through
the bridge (`node/net/bridge.py`) and see the node only through the `NodeState` and
`Jobs` protocols; ledger reads run in worker threads. docs/operations/http-api.md,
docs/status-page.md.

- `api`: the app, the node's own routes (status, peers, policy, capacity, metrics,
  login) and the guard on writes and hosts.
- `jobs_api`: job routes: submit (spec and uploaded files), list, show, weights, a
  sweep's study, cancel.
- `ledger_api`: ledger routes: entries, verification, balances.
- `credit`: the network's credit as this node audited it: `GET /api/v1/credit`, and
  the Credit page's table.
- `events`: the node's live event feed, and `GET /api/v1/events` (server-sent events).
- `pages`: the status pages at `/` (jinja2 templates in `templates/`, `static/`).
- `page_data`: what the pages read from node state, run in the node's thread.
- `filters`: the templates' filters (ids, times, numbers, a spec as TOML).
- `charts`: server-rendered SVG charts (the loss chart).
- `sweep_charts`: a sweep's SVGs: params against value, and the importances.
"""
