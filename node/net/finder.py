"""Finding peers that can take work now: the table, then directories, then probes.

Sparrow's lesson (SOSP 2013) is that a scheduler does not need a fresh global view,
only a few fresh answers at the moment it places work: probe a handful of candidates
and bind the work to whichever answers free. Here the candidates come from the peer
table (every peer's ad in a small network; in a large one the directories' copies,
asked for when too few fit) and a candidate whose ad is not fresh is probed on
`/meshminer/probe/1` before an offer goes to it. A peer that does not answer leaves
the table, so a dead peer is never offered work, however long its registration lasts.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from node.net.discovery import CapacityGossip, Registration, query_directories
from node.net.host import HostError
from node.net.peers import PeerEntry, fitting, free_tflops, unfit_reason
from protocol import AD_LIMITS
from protocol.directory import GPU_WISHES, MAX_WANT
from protocol.names import PROBE_PROTOCOL

log = logging.getLogger(__name__)

WANT = 8  # fitting candidates an owner wants in hand before it places work
PROBE_TIMEOUT_S = 3.0
QUERY_EVERY_S = 10.0  # directories are asked at most this often for one set of requirements
MAX_VOUCHED = 4096  # peers whose directory is remembered until they are probed


def parse_find_query(query: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """`k` and job requirements from a find request's query string; ValueError names
    the parameter that is wrong."""
    unknown = set(query) - {"k", "gpu", "min_gpu_memory_gb", "max_hours"}
    if unknown:
        raise ValueError(
            f"unknown parameter {sorted(unknown)[0]!r}: use k, gpu, min_gpu_memory_gb, max_hours"
        )

    def number(name: str, default: float, lo: float, hi: float) -> float:
        text = query.get(name, str(default))
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number, not {text[:40]!r}") from None
        if not lo <= value <= hi:  # also refuses nan
            raise ValueError(f"{name} must be {lo:g}..{hi:g}")
        return value

    k = number("k", WANT, 1, MAX_WANT)
    if k != int(k):
        raise ValueError("k must be a whole number")
    gpu = query.get("gpu", "preferred")
    if gpu not in GPU_WISHES:
        raise ValueError(f"gpu must be one of {', '.join(GPU_WISHES)}")
    requirements = {
        "gpu": gpu,
        "min_gpu_memory_gb": number("min_gpu_memory_gb", 0.0, 0, 10**6),
        "max_hours": number("max_hours", 1.0, 1e-6, 24 * 365),
    }
    return int(k), requirements


@dataclass
class Found:
    """What `find` saw: live fitting peers (probed just now), best first."""

    peers: list[PeerEntry]
    candidates: int = 0  # fitting peers it considered
    probed: int = 0
    connected: int = 0  # probed over a connection already open (the rest dialled first)
    dead: int = 0  # probed and did not answer
    from_directories: int = 0  # ads the directories returned
    directories_s: float = 0.0  # of `seconds`, waiting for the directories' answers
    seconds: float = 0.0
    # each answered probe: (over a connection already open, seconds until it answered)
    answers: list[tuple[bool, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "peers": [e.to_json() for e in self.peers],
            "candidates": self.candidates,
            "probed": self.probed,
            "connected": self.connected,
            "dead": self.dead,
            "from_directories": self.from_directories,
            "directories_s": round(self.directories_s, 3),
            "seconds": round(self.seconds, 3),
            "notes": self.notes,
        }


class PeerFinder:
    def __init__(self, gossip: CapacityGossip, registration: Registration) -> None:
        self.gossip = gossip
        self.registration = registration
        self.peers = gossip.peers
        self.host = gossip.host
        self._asked: dict[str, float] = {}  # requirements key -> when directories were asked
        self._vouched_by: dict[str, str] = {}  # peer -> the directory its ad came from

    def fitting(self, requirements: dict[str, Any], excluded: set[str]) -> list[PeerEntry]:
        return fitting(self.peers.entries(), requirements, excluded)

    async def top_up(
        self, requirements: dict[str, Any], excluded: set[str], want: int = WANT
    ) -> int:
        """Ask directories for more candidates when fewer than `want` fit; returns the
        number of ads they sent. Rate-limited per set of requirements."""
        if len(self.fitting(requirements, excluded)) >= want:
            return 0
        if not self.registration.directories():
            return 0
        key = repr(sorted(requirements.items()))
        now = time.monotonic()
        if now - self._asked.get(key, -1e9) < QUERY_EVERY_S:
            return 0
        self._asked[key] = now
        ads = await query_directories(self.registration, requirements, 2 * want + len(excluded))
        if len(self._vouched_by) > MAX_VOUCHED:
            self._vouched_by.clear()
        with self.peers.batch():
            for directory, raw in ads:
                peer = self.gossip.ingest_checked(raw, None, "directory")
                if peer:
                    self._vouched_by[peer] = directory
        return len(ads)

    def needs_probe(self, entry: PeerEntry) -> bool:
        """A copy from a directory, or an ad older than one refresh, is probed first."""
        if entry.via == "directory":
            return True
        return time.time() - entry.last_seen > self.gossip.publish_interval_s

    async def probe(self, peer_id: str) -> bool:
        """Ask `peer_id` for its current ad; True when it answered with a valid one.
        A peer that does not answer is dropped from the table."""
        live = await self._probe(peer_id)
        directory = self._vouched_by.pop(peer_id, None)
        if directory is not None:  # the directory is rated by what its peers do
            self.registration.vouched(directory, live)
        return live

    async def _probe(self, peer_id: str) -> bool:
        self.gossip.cost.sent(b"", "probe")
        try:
            raw = await self.host.request(
                peer_id, PROBE_PROTOCOL, b"", AD_LIMITS.max_bytes, PROBE_TIMEOUT_S
            )
        except HostError as exc:
            log.info("probe of %s failed: %s", peer_id, exc)
            self.peers.forget(peer_id)
            return False
        self.gossip.cost.received(raw, "probe")
        if not self.gossip.ingest_checked(raw, peer_id, "probe"):
            self.peers.forget(peer_id)
            return False
        return True

    async def still_fits(
        self, peer_id: str, requirements: dict[str, Any], count_load: bool = True
    ) -> bool:
        """Late binding: probe `peer_id` if its ad is not fresh, then ask again whether
        it can take the job (its load or pause may have changed)."""
        entry = self.peers.get(peer_id)
        if entry is None:
            return False
        if self.needs_probe(entry) and not await self.probe(peer_id):
            return False
        return self._fits_now(peer_id, requirements, count_load) is not None

    def _fits_now(
        self, peer_id: str, requirements: dict[str, Any], count_load: bool = True
    ) -> PeerEntry | None:
        """The peer's entry if its current ad can take a job with `requirements`."""
        entry = self.peers.get(peer_id)
        fits = entry is not None and unfit_reason(entry.ad, requirements, count_load) is None
        return entry if fits else None

    async def _probe_into(
        self,
        peer_id: str,
        requirements: dict[str, Any],
        live: dict[str, PeerEntry],
        k: int,
        found: Found,
        done: trio.CancelScope,
    ) -> None:
        found.probed += 1
        connected = peer_id in self.host.connected_peers()
        found.connected += connected
        started = time.monotonic()
        if not await self.probe(peer_id):
            found.dead += 1
            return
        found.answers.append((connected, time.monotonic() - started))
        entry = self._fits_now(peer_id, requirements)
        if entry is not None:
            live[peer_id] = entry
            if len(live) >= k:
                done.cancel()  # k answered: the slower ones are not waited for

    async def find(
        self, requirements: dict[str, Any], k: int = WANT, excluded: set[str] | None = None
    ) -> Found:
        """Up to `k` peers fitting `requirements` that answered a probe just now."""
        started = time.monotonic()
        excluded = excluded or set()
        found = Found([])
        self._asked.clear()  # an explicit search always asks the directories
        await self._ask_directories(requirements, excluded, k, found)
        live: dict[str, PeerEntry] = {}
        asked: set[str] = set()
        for _ in range(3):  # rounds: candidates in hand, then the directories again
            candidates = [
                e for e in self.fitting(requirements, excluded | asked) if e.ad.peer_id not in live
            ]
            random.shuffle(candidates)  # not the table's order: peer ids can be ground
            candidates = candidates[: 2 * k]
            if not candidates:
                break
            found.candidates += len(candidates)
            asked |= {e.ad.peer_id for e in candidates}
            async with trio.open_nursery() as nursery:
                for entry in candidates:
                    nursery.start_soon(
                        self._probe_into,
                        entry.ad.peer_id,
                        requirements,
                        live,
                        k,
                        found,
                        nursery.cancel_scope,
                    )
            if len(live) >= k:
                break
            self._asked.clear()
            await self._ask_directories(requirements, excluded | asked, k, found)
        found.peers = sorted(live.values(), key=lambda e: free_tflops(e.ad), reverse=True)[:k]
        found.seconds = time.monotonic() - started
        if not found.peers:
            found.notes.append("no peer that fits answered")
        log.info(
            "found %d of %d peers in %.3f s (directories %.3f s; %d probed, %d connected, "
            "%d dead; answers in ms, o: connection open, d: dialled: %s)",
            len(found.peers), k, found.seconds, found.directories_s, found.probed,
            found.connected, found.dead,
            " ".join(f"{'o' if c else 'd'}{s * 1000:.0f}" for c, s in found.answers),
        )  # fmt: skip
        return found

    async def _ask_directories(
        self, requirements: dict[str, Any], excluded: set[str], k: int, found: Found
    ) -> None:
        started = time.monotonic()
        found.from_directories += await self.top_up(requirements, excluded, k)
        found.directories_s += time.monotonic() - started
