"""Blob requests and who may have a blob: making a signed request, the server's checks
(`authorize`), the replay guard of the direct channel, and the transfer errors.

The server checks, in this order (the first failure is the refusal reason):
the request frame fits `REQUEST_LIMITS` (`oversized`); the request envelope decodes and
its signature verifies (`malformed`, `bad_signature`), on libp2p by the stream's
authenticated remote peer (`signer_mismatch`); its timestamp is within
`REQUEST_MAX_AGE_S` (`stale`); the grant inside decodes and verifies (`bad_grant`), was
sealed by this node with `owner` = this node (`foreign_grant`), has not expired
(`expired`), names the blob (`not_granted`), and names the request's signer as grantee
(`not_grantee`); on the direct channel the request's nonce has not been seen
(`replay`); the node has a job key for the grant's job and unit (`unknown_job`); the
blob is stored (`not_found`) and within the grant's `max_bytes` (`too_large`). A server
at its connection limit answers `busy`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from nacl.exceptions import CryptoError
from nacl.public import SealedBox
from nacl.signing import SigningKey, VerifyKey

from node.work.blobs.store import BlobNotFound, BlobStore
from protocol import ProtocolError, open_envelope, public_key_from_peer_id, seal
from protocol.blobs import GRANT_LIMITS, REQUEST_LIMITS, BlobGrant, BlobRequest

#: a request older than this (or more than CLOCK_SKEW_S in the future) is refused
REQUEST_MAX_AGE_S = 300.0
CLOCK_SKEW_S = 60.0
#: every reason a server may give for refusing a request (see the module docstring)
REFUSAL_REASONS = frozenset(
    {
        "invalid",
        "undecryptable",
        "oversized",
        "malformed",
        "bad_signature",
        "signer_mismatch",
        "stale",
        "bad_grant",
        "foreign_grant",
        "expired",
        "not_granted",
        "not_grantee",
        "replay",
        "unknown_job",
        "not_found",
        "too_large",
        "busy",
    }
)
#: nonces remembered by a direct server (each for REQUEST_MAX_AGE_S + CLOCK_SKEW_S)
MAX_REMEMBERED_NONCES = 65536

JobKeyLookup = Callable[[str, str], "bytes | None"]
#: told of each blob sent whole: the request it answered and the path it took
#: ("direct channel", "direct connection", "through a relay"); called from the
#: data channel's threads too, and must not raise
OnServed = Callable[["Authorized", str], None]


class _HasSigningKey(Protocol):
    @property
    def signing_key(self) -> SigningKey: ...


# -- errors -------------------------------------------------------------------------------


class TransferError(Exception):
    """A blob could not be fetched; nothing was stored. `reason` is a short label."""

    reason = "failed"
    #: how a fetch fails when its peer no longer answers (not: when it sends something wrong)
    GONE = ("unreachable", "timeout", "connection")

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason

    @property
    def peer_gone(self) -> bool:
        """The fetch failed because the serving peer no longer answers."""
        return self.reason in self.GONE


class TransferRefused(TransferError):
    """The serving node refused the request; `reason` is the reason it gave."""


class TransferUnreachable(TransferError):
    """No connection or stream to the serving node could be opened."""

    reason = "unreachable"


class TransferCorrupt(TransferError):
    """The peer sent something other than the blob announced: oversized, truncated,
    undecryptable, malformed, or hashing to another id (`reason` says which)."""

    reason = "corrupt"


class Refusal(Exception):
    """Server side: a request is refused with `reason` (sent to the peer) and `detail`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# -- requests -----------------------------------------------------------------------------


def make_request(identity: _HasSigningKey, grant_envelope: bytes, sha256: str) -> bytes:
    """A fresh signed `BlobRequest` for blob `sha256` under a grant (envelope bytes).

    Each request carries a new nonce, and a direct server accepts a nonce once: make a
    new request for every attempt over the direct channel."""
    request = BlobRequest(
        grant=grant_envelope, sha256=sha256, timestamp=time.time(), nonce=os.urandom(16)
    )
    request.check("BlobRequest")  # a bad sha or an oversized grant is our bug: say so here
    return seal(request, identity.signing_key)


@dataclass(frozen=True)
class Authorized:
    """A request that passed every check: what to send and under which key."""

    grant: BlobGrant
    requester: str
    sha256: str
    size: int
    job_key: bytes


class ReplayGuard:
    """Nonces of accepted direct-channel requests, each kept until its request would be
    stale anyway. Thread-safe. The direct channel is plain TCP, so a request seen on
    the wire could be sent again by anyone; its answer would be encrypted, but the
    server would still spend the bandwidth."""

    def __init__(self, max_entries: int = MAX_REMEMBERED_NONCES) -> None:
        self._max = max_entries
        self._seen: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def remember(self, nonce: bytes, timestamp: float, now: float) -> None:
        """Record `nonce`, or raise `Refusal` (`replay`, or `busy` when full)."""
        with self._lock:
            if nonce in self._seen:
                raise Refusal("replay", "this request was already used")
            if len(self._seen) >= self._max:
                self._seen = {n: t for n, t in self._seen.items() if t > now}
                if len(self._seen) >= self._max:
                    raise Refusal("busy", "too many recent requests; retry later")
            self._seen[nonce] = timestamp + REQUEST_MAX_AGE_S + CLOCK_SKEW_S


def authorize(
    request_envelope: bytes,
    *,
    our_peer_id: str,
    store: BlobStore,
    job_key_for: JobKeyLookup,
    remote_peer_id: str | None = None,
    replay_guard: ReplayGuard | None = None,
    now: float | None = None,
) -> Authorized:
    """Check a blob request against everything the module docstring lists; raises
    `Refusal` naming the first rule that fails."""
    now = time.time() if now is None else now
    try:
        signed = open_envelope(
            request_envelope, BlobRequest, expected_signer=remote_peer_id, limits=REQUEST_LIMITS
        )
    except ProtocolError as exc:
        raise Refusal(exc.reason, f"blob request: {exc}") from exc
    request, requester = signed.message, signed.signer
    if not now - REQUEST_MAX_AGE_S <= request.timestamp <= now + CLOCK_SKEW_S:
        raise Refusal("stale", f"request made {now - request.timestamp:.0f} s ago")
    try:
        granted = open_envelope(request.grant, BlobGrant, limits=GRANT_LIMITS)
    except ProtocolError as exc:
        raise Refusal("bad_grant", f"grant: {exc}") from exc
    grant = granted.message
    if granted.signer != our_peer_id or grant.owner != our_peer_id:
        raise Refusal("foreign_grant", f"the grant was sealed by {granted.signer}, not this node")
    if grant.expires_at <= now:
        raise Refusal("expired", f"the grant expired {now - grant.expires_at:.0f} s ago")
    if request.sha256 not in grant.blobs:
        raise Refusal("not_granted", f"the grant does not name blob {request.sha256}")
    if requester != grant.grantee:
        raise Refusal("not_grantee", f"the grant is for {grant.grantee}, not {requester}")
    if replay_guard is not None:
        replay_guard.remember(request.nonce, request.timestamp, now)
    job_key = job_key_for(grant.job_id, grant.unit_id)
    if job_key is None:
        raise Refusal("unknown_job", f"no job key for {grant.job_id}/{grant.unit_id}")
    try:
        size = store.size(request.sha256)
    except BlobNotFound:
        raise Refusal("not_found", f"blob {request.sha256} is not stored here") from None
    if size > grant.max_bytes:
        raise Refusal("too_large", f"blob is {size} bytes; the grant allows {grant.max_bytes}")
    return Authorized(grant, requester, request.sha256, size, job_key)


def _fetch_cap(request_envelope: bytes, sha256: str, max_bytes: int) -> tuple[int, str]:
    """The most bytes the fetcher accepts (its own cap and the grant's, whichever is
    less), and the server's peer id (the grant's owner). The request is our own, so a
    bad one is a `ValueError`, not a peer's fault."""
    try:
        request = open_envelope(request_envelope, BlobRequest, limits=REQUEST_LIMITS).message
        grant = open_envelope(request.grant, BlobGrant, limits=GRANT_LIMITS).message
    except ProtocolError as exc:
        raise ValueError(f"not a valid blob request: {exc}") from exc
    if request.sha256 != sha256:
        raise ValueError(f"the request is for blob {request.sha256}, not {sha256}")
    return min(grant.max_bytes, max_bytes), grant.owner


#: what sealing adds to a request on the direct channel (an ephemeral key and a MAC)
SEALED_OVERHEAD = 48


def seal_request(request_envelope: bytes, server_peer: str) -> bytes:
    """The request as it crosses the direct channel: sealed (anonymous crypto_box) to
    the server's key, so an observer of the TCP stream learns neither the grant (job,
    unit, peers) nor which blob is asked for. The signed request inside still says who
    asks."""
    server = VerifyKey(public_key_from_peer_id(server_peer)).to_curve25519_public_key()
    return SealedBox(server).encrypt(request_envelope)


def open_request(sealed: bytes, signing_key: SigningKey) -> bytes:
    """The server's side of `seal_request`; `Refusal` when it is not sealed to us."""
    try:
        return SealedBox(signing_key.to_curve25519_private_key()).decrypt(sealed)
    except (CryptoError, ValueError) as exc:
        raise Refusal("undecryptable", "the request is not sealed to this node") from exc
