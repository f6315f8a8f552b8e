"""Blobs: content-addressed files and their transfer under a grant, both paths.

This package never sees jobs or the work context (what grants need of a node is the
`GrantParty` protocol); it is the public face of blob storage and transfer, with the
code in one module per idea:

    store     `BlobStore`: content-addressed files under `<root>/blobs/<ab>/<sha256>`
    grants    issuing a grant, and fetching what it allows (direct channel, relay,
              libp2p), with caps on the fetches in flight
    auth      requests, the server's checks (`authorize`), the replay guard,
              `Refusal` and the `Transfer*` errors
    frames    the exchange's bounds and timeouts, the answer frames, and the two ends
              of a stream of encrypted chunks
    sockets   blocking socket frames and the thread pipeline (`_Ahead`) of the direct
              channel
    server    `BlobServer`, the direct channel's server
    fetch     `fetch_blob_direct`, the direct channel's client
    libp2p    `serve_blobs_libp2p` and `fetch_blob_libp2p`, the fallback
    rate      `RateCap`: the volunteer's caps on transfer rates, one per direction;
              `DailyBytes`: what was moved today, for the daily cap

py-libp2p streams move bulk bytes at about 0.1 of raw TCP and burn a core doing it
(the project notes), so blobs go over a **direct data channel** where the serving
node is reachable: plain TCP to the grant's `data_port`, served by `BlobServer` from
its own threads with blocking sockets, so bulk I/O, encryption and hashing never block
the trio loop (PyNaCl and hashlib release the GIL on large buffers). Relayed or
firewalled peers use the **libp2p fallback**, protocol `/meshminer/blob/1` on a
`MeshHost` stream. Both speak the same exchange:

    fetcher -> server   frame: BlobRequest envelope, signed by the grantee
    server  -> fetcher  frame: msgpack {"size": int, "stream": 24-byte secretstream header}
                        or     msgpack {"error": reason, "detail": text}, then the end
    server  -> fetcher  frames: the blob as secretstream chunks (<= CHUNK_SIZE bytes of
                        plaintext each) under the job key; the last is tagged FINAL
                        (an empty blob is one empty FINAL chunk)

A frame is a 4-byte big-endian length and that many bytes; every reader refuses a
length over its bound before reading the body. Every chunk is authenticated with the
blob's raw sha256 as additional data, and the fetcher hashes what it stores: a
truncated, altered, oversized or wrong blob raises and leaves nothing stored.

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

All of blob transfer logs to the logger `node.work.blobs`.
"""

from __future__ import annotations

from node.work.blobs.auth import (
    CLOCK_SKEW_S,
    MAX_REMEMBERED_NONCES,
    REFUSAL_REASONS,
    REQUEST_MAX_AGE_S,
    Authorized,
    JobKeyLookup,
    Refusal,
    ReplayGuard,
    TransferCorrupt,
    TransferError,
    TransferRefused,
    TransferUnreachable,
    authorize,
    make_request,
)
from node.work.blobs.fetch import CONNECT_TIMEOUT_S, fetch_blob_direct
from node.work.blobs.frames import (
    CHUNK_SIZE,
    IO_TIMEOUT_S,
    MAX_CHUNK_FRAME,
    MAX_HEADER_FRAME,
    REQUEST_TIMEOUT_S,
)
from node.work.blobs.grants import (
    MAX_FETCHES,
    MAX_FETCHES_PER_PEER,
    GrantParty,
    fetch_granted,
    fetch_slots,
    issue_grant,
)
from node.work.blobs.libp2p import fetch_blob_libp2p, serve_blobs_libp2p
from node.work.blobs.rate import DailyBytes, RateCap, mbit_s
from node.work.blobs.server import MAX_CONNECTIONS, BlobServer
from node.work.blobs.sockets import PIPELINE_DEPTH
from node.work.blobs.store import BlobNotFound, BlobStore, BlobStoreError, size_text

__all__ = [
    "MAX_FETCHES",
    "MAX_FETCHES_PER_PEER",
    "BlobNotFound",
    "BlobStore",
    "BlobStoreError",
    "DailyBytes",
    "GrantParty",
    "RateCap",
    "fetch_granted",
    "fetch_slots",
    "issue_grant",
    "size_text",
    "CHUNK_SIZE",
    "CLOCK_SKEW_S",
    "CONNECT_TIMEOUT_S",
    "IO_TIMEOUT_S",
    "MAX_CHUNK_FRAME",
    "MAX_CONNECTIONS",
    "MAX_HEADER_FRAME",
    "MAX_REMEMBERED_NONCES",
    "PIPELINE_DEPTH",
    "REFUSAL_REASONS",
    "REQUEST_MAX_AGE_S",
    "REQUEST_TIMEOUT_S",
    "Authorized",
    "BlobServer",
    "JobKeyLookup",
    "Refusal",
    "ReplayGuard",
    "TransferCorrupt",
    "TransferError",
    "TransferRefused",
    "TransferUnreachable",
    "authorize",
    "fetch_blob_direct",
    "fetch_blob_libp2p",
    "make_request",
    "mbit_s",
    "serve_blobs_libp2p",
]
