"""A node's work context without a network, on real stores in a folder (importable
from any test: pytest puts tests/ on sys.path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils
from factories import capacity_ad
from nacl.signing import SigningKey

from node.identity import Identity
from node.net.peers import PeerTable
from node.preferences import Preferences
from node.work.blobs import BlobStore
from node.work.context import WorkContext
from node.work.jobs import JobStore
from protocol import Policy

C = TypeVar("C", bound=WorkContext)


def offline_context(folder: Path, cls: type[C] = WorkContext, **changes: Any) -> C:  # type: ignore[assignment]
    """A `WorkContext` whose stores (node.db, blobs) are real files in `folder`, with a
    fresh identity, default policy and preferences, and no host, ledger or gossip:
    what the owner's and worker's parts use when nothing goes over the network."""
    db = sqlite_utils.Database(folder / "node.db")
    identity = changes.pop("identity", None) or Identity(SigningKey.generate())
    own = capacity_ad(identity.peer_id, 1)
    fields: dict[str, Any] = {
        "identity": identity,
        "host": None,
        "peers": PeerTable(db, ttl_s=60.0),
        "jobs": JobStore(db),
        "blobs": BlobStore(folder),
        "data_dir": folder,
        "own_ad": lambda: own,
        "policy": Policy,
        "preferences": Preferences,
        "ledger": None,
        "publish_receipt": None,
        "publish_evidence": None,
    }
    return cls(**{**fields, **changes})
