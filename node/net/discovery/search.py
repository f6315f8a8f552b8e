"""The owner's side of directories: which to ask, the query, the answers merged.

An owner asks three directories at once, those that listed it to a stranger first
(`Registration.ask_order`; only those, when two or more did), each for a random
seed's order of the peers that fit the job, and uses the first two answers: one may
hide peers or be gone, and a directory that hides everyone answers fastest, so thin
answers do not end the search. The answers are merged one ad from each in turn, so
no one directory fills the list; the caller (`node/net/finder.py`) checks each ad and
probes each peer before any offer.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from typing import TYPE_CHECKING

import trio

from node.net.discovery.listing import REQUEST_TIMEOUT_S, SEED_BYTES, open_reply
from node.net.host import HostError
from protocol import ProtocolError, seal
from protocol.directory import DIRECTORY_LIMITS, MAX_WANT, DirectoryQuery
from protocol.names import QUERY_PROTOCOL

if TYPE_CHECKING:
    from node.net.discovery.registration import Registration

log = logging.getLogger(__name__)

QUERY_DIRECTORIES = 3  # an owner asks this many at once and uses the first two answers
QUERY_ANSWERS = 2  # one may hide peers, or be gone


async def query_directories(
    reg: Registration, requirements: dict, want: int
) -> list[tuple[str, bytes]]:
    """Signed ads of up to `want` peers fitting `requirements`: three directories
    asked at once (`ask_order`; only those that listed this node, when two or more
    did) under a random seed, the first two answers used
    (all three while those two hold fewer than `want` ads), taken in turn from each
    so that no one directory fills the list; each with the directory it came
    from. The caller checks each ad (`check_ad`)."""
    order = reg.ask_order(time.monotonic())
    listed = [d for d in order if d in reg.listed]
    # directories that listed this node, when two or more did: a third one might
    # answer first with a full list of its friends and take half the candidates
    asked = (listed if len(listed) >= QUERY_ANSWERS else order)[:QUERY_DIRECTORIES]
    query = DirectoryQuery(
        want=max(1, min(want, MAX_WANT)),
        gpu=str(requirements.get("gpu", "preferred")),
        min_gpu_memory_gb=float(requirements.get("min_gpu_memory_gb", 0.0)),
        max_hours=float(requirements.get("max_hours", 1.0)),
        timestamp=time.time(),
        seed=os.urandom(SEED_BYTES),
    )
    request = seal(query, reg.identity.signing_key)
    answers: list[list[tuple[str, bytes]]] = []

    async def ask(directory: str, enough: trio.CancelScope) -> None:
        reg.cost.sent(request, "query")
        try:
            raw = await reg.host.request(
                directory,
                QUERY_PROTOCOL,
                request,
                DIRECTORY_LIMITS.max_bytes,
                REQUEST_TIMEOUT_S,
            )
            reg.cost.received(raw, "query")
            with reg.cost.checking():
                reply = open_reply(raw, directory)
        except (HostError, ProtocolError) as exc:
            pause = reg.failed(directory)
            log.info("query to directory %s failed (again in %g s): %s",
                     directory, pause, exc)  # fmt: skip
            return
        if reply.registered and not reg.heard(directory, reply.registered):
            return
        answers.append([(directory, ad) for ad in reply.ads[:want]])
        # two answers are enough when they hold enough: a directory that hides
        # everyone answers fastest, and must not end the search by it
        if len(answers) >= QUERY_ANSWERS and sum(map(len, answers)) >= want:
            enough.cancel()

    async with trio.open_nursery() as nursery:
        for directory in asked:
            nursery.start_soon(ask, directory, nursery.cancel_scope)
    return _in_turn(answers)[:want]


def _in_turn(answers: list[list[tuple[str, bytes]]]) -> list[tuple[str, bytes]]:
    """The answers' (directory, ad) taken one from each in turn, each ad once."""
    merged: dict[bytes, str] = {}
    for row in itertools.zip_longest(*answers):
        for item in row:
            if item is not None:
                merged.setdefault(item[1], item[0])
    return [(directory, ad) for ad, directory in merged.items()]
