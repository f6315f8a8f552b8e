"""Work: what a node does with jobs, as their owner and as a worker.

Every node plays both roles. The owner places a job's units on peers (or trains them
itself), and checks what comes back before it issues a receipt; the worker checks an
offer against its volunteer's policy, trains in a subprocess and returns a signed
result. All of it runs in the trio thread, except the blob server's threads. The
parts depend one way: `jobs`, `blobs` and `run` import nothing else of `node/work`;
`context` joins them with the node's identity and network; `trust`, `owner`,
`offers`, `heartbeats` and `worker` build on the context; `service` wires everything.
docs/architecture.md follows one job through these parts.

Files:
- `context`: what both roles share: identity, host, stores, policy, job keys (`WorkContext`).
- `offers`: offering one unit to one peer: the sealed work package and the answer.
- `receipts`: the receipt exchange, both ends: the owner issues, the worker countersigns.
- `worker`: the worker's side (`WorkerRole`): offer checks, fetch, train, and the
  result's states kept for the owner's checks.
- `heartbeats`: a running unit (`RunningUnit`) and its heartbeats, the worker's end of
  the progress exchange: the lease, the states it holds for the owner's checks
  (`HeldEvidence`), the round's weights an eager share takes.
- `delivery`: the worker's result sent with retries, and the receipt countersigned.
- `held_weights`: each elastic job's newest global weights on a worker, which the
  owner's next round update applies to.
- `taken_weights`: the round's weights an eager share takes on its way: the owner's
  grant checked, the blob fetched, the runner told.
- `service`: the work service (`WorkService`): stores, the blob server, both roles, the
  stream handlers, and the calls the HTTP API makes.

Packages:
- `jobs/`: `node.db`'s work tables (jobs, units, receipts, rounds, trials, unit keys)
  and the states a job and a unit may take.
- `blobs/`: content-addressed blobs: the store, grants, serving and fetching.
- `run/`: a unit's training subprocess: the request, the executor, the fork server,
  the volunteer's availability.
- `trust/`: checking a worker's result: spot checks, replicas, reputation.
- `owner/`: the owner's engine and its parts; `owner/modes/` holds one mode per kind
  of job (single, elastic, sweep).
"""
