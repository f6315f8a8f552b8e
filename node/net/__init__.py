"""Networking: everything that touches py-libp2p, and the one bridge between trio and
asyncio.

`host` wraps py-libp2p for the rest of the node and `libp2p_fixes` patches it; only
`relay` and `reachability` besides them import the library. `bridge` is the only
module that knows there are two event loops; everything else here runs in the trio
thread. docs/design/discovery.md, docs/design/libp2p.md, docs/nat.md.

- `host`: `MeshHost`: lifecycle, pubsub, request/response and raw streams.
- `libp2p_fixes`: fixes for py-libp2p 0.8.1's bugs, and defaults a network cannot afford.
- `bridge`: `TrioBridge`, `HttpServerThread`, `EventFeed`: the seam between the loops.
- `inbound`: caps on the streams peers have open to this node.
- `connections`: closing idle connections above the high water mark.
- `peers`: the peer table, and whether a peer fits a job (`unfit_reason`).
- `finder`: peers that can take work now: the table, then directories, then probes.
- `reachability`: whether peers can dial this node, from AutoNAT dial-backs.
- `nat`: staying reachable from behind a NAT: relay slots, circuit addresses.
- `relay`: circuit relay v2 and hole punching (DCUtR) on our host.
- `receipts_gossip`: receipt gossip on `meshminer/receipts/1`, into the audit table.
- `evidence_gossip`: evidence of failed spot checks on `meshminer/evidence/1`.
- `discovery/`: finding peers and being found: bootstrap, capacity gossip on
  `meshminer/capacity/1`, directories and registering with them, what it all costs.
"""
