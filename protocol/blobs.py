"""Blob grants and requests: who may fetch which content-addressed blobs from whom.

A blob (dataset shard, initial or result weights) is named by its sha256 and served
only against a `BlobGrant` sealed by the node that serves it: the job's owner for its
data, a worker for the weights it produced. The grant names the one peer allowed to
fetch (`grantee`), the blobs, a size cap and an expiry, and says whether the serving
node has a direct data channel (`data_port`; 0 = libp2p stream only).

The fetching node sends a `BlobRequest`, signed with its own key, that carries the
grant envelope as received. Because the direct channel is plain TCP, the request's
signature (by the grantee) is what authenticates it there; its timestamp and nonce
let the server refuse a request that was captured and replayed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from protocol.checks import require
from protocol.codec import Limits
from protocol.ids import check_id, check_peer

MAX_ID_LEN = 128
#: the most blobs one grant may name (a unit's dataset shards plus its weights)
MAX_GRANT_BLOBS = 256
#: no single blob may be granted beyond this (64 GiB)
MAX_BLOB_BYTES = 64 * 1024**3
NONCE_MIN_BYTES = 16
NONCE_MAX_BYTES = 32

#: the largest valid grant envelope (256 blobs, 128-char ids) is 17.6 KB
GRANT_LIMITS = Limits(
    max_bytes=20 * 1024,
    max_depth=2,
    max_container_len=MAX_GRANT_BLOBS,
    max_str_len=MAX_ID_LEN,
    max_bin_len=20 * 1024,
)
#: a request carries one grant envelope plus ~270 bytes of its own
REQUEST_LIMITS = Limits(
    max_bytes=GRANT_LIMITS.max_bytes + 1024,
    max_depth=1,
    max_container_len=8,
    max_str_len=MAX_ID_LEN,
    max_bin_len=GRANT_LIMITS.max_bytes + 512,
)

_HEX = frozenset("0123456789abcdef")


def is_sha256_hex(value: str) -> bool:
    """True for a lowercase 64-character hex digest (the only spelling of a blob id)."""
    return isinstance(value, str) and len(value) == 64 and _HEX.issuperset(value)


@dataclass(frozen=True)
class BlobGrant:
    """Permission for `grantee` to fetch `blobs` from `owner`, sealed by `owner`.

    `owner` is the node that holds and serves these blobs and seals the grant; a
    server accepts only grants it sealed itself, with `owner` equal to its peer id."""

    TYPE: ClassVar[str] = "blob_grant"
    VERSION: ClassVar[int] = 1

    job_id: str
    unit_id: str
    owner: str  # peer id of the serving node (the grant's signer)
    grantee: str  # peer id allowed to fetch
    blobs: list[str]  # sha256 hex of each blob that may be fetched
    max_bytes: int  # the largest any one of them may be
    expires_at: float  # unix seconds
    data_port: int = 0  # the owner's direct data channel port; 0 = none (libp2p only)

    def check(self, path: str) -> None:
        check_id(self.job_id, f"{path}.job_id")
        check_id(self.unit_id, f"{path}.unit_id")
        check_peer(self.owner, f"{path}.owner")
        check_peer(self.grantee, f"{path}.grantee")
        require(
            0 < len(self.blobs) <= MAX_GRANT_BLOBS,
            f"{path}.blobs",
            f"must name 1..{MAX_GRANT_BLOBS} blobs",
        )
        for i, sha in enumerate(self.blobs):
            require(is_sha256_hex(sha), f"{path}.blobs[{i}]", "must be a lowercase sha256 hex")
        require(
            0 <= self.max_bytes <= MAX_BLOB_BYTES,
            f"{path}.max_bytes",
            f"must be 0..{MAX_BLOB_BYTES}",
        )
        require(
            math.isfinite(self.expires_at) and self.expires_at > 0,
            f"{path}.expires_at",
            "must be a positive unix time",
        )
        require(0 <= self.data_port <= 65535, f"{path}.data_port", "must be 0..65535")


@dataclass(frozen=True)
class BlobRequest:
    """A grantee's signed request for one blob of a grant."""

    TYPE: ClassVar[str] = "blob_request"
    VERSION: ClassVar[int] = 1

    grant: bytes  # the BlobGrant envelope, exactly as received
    sha256: str  # the blob wanted (must be named by the grant)
    timestamp: float  # unix seconds, when the request was made
    nonce: bytes  # random, so the server can refuse a replay

    def check(self, path: str) -> None:
        require(
            0 < len(self.grant) <= GRANT_LIMITS.max_bytes,
            f"{path}.grant",
            f"must be 1..{GRANT_LIMITS.max_bytes} bytes",
        )
        require(is_sha256_hex(self.sha256), f"{path}.sha256", "must be a lowercase sha256 hex")
        require(
            math.isfinite(self.timestamp) and self.timestamp > 0,
            f"{path}.timestamp",
            "must be a positive unix time",
        )
        require(
            NONCE_MIN_BYTES <= len(self.nonce) <= NONCE_MAX_BYTES,
            f"{path}.nonce",
            f"must be {NONCE_MIN_BYTES}..{NONCE_MAX_BYTES} bytes",
        )
