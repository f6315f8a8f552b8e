"""A cap on the streams peers have open to this node's own protocols at once.

Every stream a peer opens on one of our protocols costs a task, buffers and a
handler's work; a stranger that opens a thousand at once must not be able to make
the node do a thousand things. Beyond `per_peer` open streams from one peer, or
`total` from everybody, a new stream is reset at once, before anything of it is
read. Counted refusals say who is flooding.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

PER_PEER = 32
TOTAL = 512


class InboundLimiter:
    def __init__(self, per_peer: int = PER_PEER, total: int = TOTAL) -> None:
        self.per_peer = per_peer
        self.total = total
        self._open: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()  # by protocol

    @property
    def open_streams(self) -> int:
        return sum(self._open.values())

    @contextmanager
    def slot(self, peer: str, protocol: str) -> Iterator[bool]:
        """Yields whether the stream may be served; holds a slot while it is."""
        if self._open[peer] >= self.per_peer or self.open_streams >= self.total:
            self.refused[protocol] += 1
            if self.refused[protocol] % 100 == 1:
                log.warning(
                    "refusing %s streams from %s: %d open from it, %d in all",
                    protocol,
                    peer,
                    self._open[peer],
                    self.open_streams,
                )
            yield False
            return
        self._open[peer] += 1
        try:
            yield True
        finally:
            self._open[peer] -= 1
            if not self._open[peer]:
                del self._open[peer]
