"""Does a directory list this node? Both ends of the check: the order a directory
answers a query in, and the volunteer's question to it as a stranger.

A directory can accept a registration and then leave the volunteer out of every
answer (silent drop), or answer only with its friends' ads: the volunteer is then
registered and unfindable, and nothing it hears says so. So after registering with
a directory a node asks it, from a fresh identity on a fresh connection (the
directory cannot tell it from an owner's first query), for peers fitting a job this
node fits, with a seed ground so that this node ranks among the first few of the
answer. A directory that leaves it out is hiding it: the node registers elsewhere.

A query's answer is the fitting registrants ordered by `rank_key(seed, peer id)`
(GPUs first when the job prefers one): owners send a random seed, so the order is a
fresh random sample for each query, and a volunteer can pick a seed that puts itself
near the front without knowing who else is registered. What this does not catch: a
directory that tells the check apart from an owner's query by the asking IP address
([threat-model.md](../../../docs/threat-model.md#not-promised-yet)).
"""

from __future__ import annotations

import hashlib
import os
import time

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import info_from_p2p_addr
from nacl.signing import SigningKey

from node.identity import Identity
from node.net.host import HostError, read_frame, write_frame
from node.net.relay import is_circuit
from protocol import AD_LIMITS, ProtocolError, open_envelope, seal
from protocol.capacity import CapacityAd
from protocol.directory import DIRECTORY_LIMITS, MAX_WANT, DirectoryQuery, DirectoryReply
from protocol.names import QUERY_PROTOCOL

REQUEST_TIMEOUT_S = 3.0  # a dial (>= 250 ms in py-libp2p) and one request, on a busy machine
SEED_BYTES = 16
EXPECTED_RANK = 8  # the ground seed puts this node about this far down the answer
MAX_GRIND = 1 << 16  # seeds tried at most (a registrant count of 16,384 needs ~1,024)


def rank_key(seed: bytes, peer_id: str) -> bytes:
    """Where `peer_id` stands in the answer to a query with `seed` (lowest first)."""
    return hashlib.sha256(seed + peer_id.encode()).digest()


def ground_seed(peer_id: str, registered: int, rank: int = EXPECTED_RANK) -> bytes:
    """A seed under which `peer_id` ranks about `rank`-th among `registered` peers: its
    key falls evenly in the lowest `2 rank / registered` of the key space, below which
    about `2 rank` of the others' keys fall too, half of them below it on average (one
    answer of `MAX_WANT` then holds it unless the directory hides it: P(rank > 64) is
    below 10^-15)."""
    share = min(1.0, 2 * rank / max(1, registered))
    bound = int(share * (1 << 64))
    for _ in range(MAX_GRIND):
        seed = os.urandom(SEED_BYTES)
        if int.from_bytes(rank_key(seed, peer_id)[:8], "big") < bound:
            return seed
    return seed  # unreachable for counts a directory may report (<= 16,384)


def check_query(ad: CapacityAd, registered: int) -> DirectoryQuery | None:
    """The query a job this node fits would send, with a seed ground for this node;
    None while the node fits no job (not accepting, paused, at its load limit: a
    directory rightly leaves it out then)."""
    policy = ad.policy
    if not policy.accepting or ad.paused or ad.load_pct >= policy.load_limit_pct:
        return None
    has_gpu = any(g.kind == "cuda" for g in ad.gpus)
    return DirectoryQuery(
        want=MAX_WANT,
        gpu="required" if has_gpu else "none",
        max_hours=min(1.0, policy.max_job_hours),
        timestamp=time.time(),
        seed=ground_seed(ad.peer_id, registered),
    )


def dialable(addrs: list[str], peer_id: str) -> list[str]:
    """The addresses of `peer_id` a stranger can dial directly (no relay circuits)."""
    suffix = f"/p2p/{peer_id}"
    return [a for a in addrs if not is_circuit(a) and a.endswith(suffix)]


async def lists_me(
    directory: str, addrs: list[str], own_peer_id: str, query: DirectoryQuery, timeout: float
) -> bool:
    """Ask `directory` `query` as a stranger (a fresh identity, a fresh connection);
    True if its answer holds `own_peer_id`. Raises `HostError` when the directory
    cannot be reached or its answer does not open (it is then treated as one that
    did not answer)."""
    stranger = Identity(SigningKey.generate())
    request = seal(query, stranger.signing_key)
    raw = await ask_as(stranger, directory, addrs, QUERY_PROTOCOL, request, timeout)
    try:
        reply = open_reply(raw, directory)
    except ProtocolError as exc:
        raise HostError(f"directory {directory} answered the listing check badly: {exc}") from exc
    return any(_signed_by(ad, own_peer_id) for ad in reply.ads)


def open_reply(raw: bytes, directory: str) -> DirectoryReply:
    """A directory's answer, signed by it; raises `ProtocolError`."""
    return open_envelope(
        raw, DirectoryReply, expected_signer=directory, limits=DIRECTORY_LIMITS
    ).message


def _signed_by(envelope: bytes, peer_id: str) -> bool:
    """An ad really signed by `peer_id` (a directory cannot make one up)."""
    try:
        open_envelope(envelope, CapacityAd, expected_signer=peer_id, limits=AD_LIMITS)
    except ProtocolError:
        return False
    return True


async def ask_as(
    identity: Identity, peer_id: str, addrs: list[str], protocol: str, data: bytes, timeout: float
) -> bytes:
    """One request to `peer_id` from a host of `identity`'s own, which lives for this
    request only; raises `HostError`."""
    dial = dialable(addrs, peer_id)
    if not dial:
        raise HostError(f"{peer_id} has no address a stranger can dial")
    host = new_host(key_pair=create_new_key_pair(identity.seed), listen_addrs=[])
    try:
        with trio.fail_after(timeout):
            async with host.run(listen_addrs=[]):
                try:
                    info = info_from_p2p_addr(multiaddr.Multiaddr(dial[0]))
                    await host.connect(info)
                    stream = await host.new_stream(info.peer_id, [TProtocol(protocol)])
                    await write_frame(stream, data)
                    return await read_frame(stream, DIRECTORY_LIMITS.max_bytes)
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(2):
                        await host.close()
    except HostError:
        raise
    except Exception as exc:
        raise HostError(
            f"{protocol} request to {peer_id} failed: {type(exc).__name__}: {exc}"
        ) from exc
