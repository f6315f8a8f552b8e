"""Unit keys kept across restarts, sealed at rest.

Each unit has its own secretstream key: the owner serves the unit's data blobs under
it and fetches the weights under it. An owner that lost the keys on a restart could
neither serve a still-training worker nor take its result, and had to train the job
again. So the keys live in `node.db`, each sealed with a key derived from the node's
identity (XSalsa20-Poly1305), in a database the node creates mode 0600: a copy of
node.db alone reveals none of them.

`WorkContext.grant_keys` stays the in-memory view the blob server's thread reads;
this module is its durable twin, kept in step by `remember` and `forget`.
"""

from __future__ import annotations

import hashlib

import sqlite_utils
from nacl.exceptions import CryptoError
from nacl.secret import SecretBox
from nacl.utils import random

_PERSON = b"mm-unit-keys"


class UnitKeys:
    def __init__(self, db: sqlite_utils.Database, seed: bytes) -> None:
        self._db = db
        key = hashlib.blake2b(seed, digest_size=32, person=_PERSON).digest()
        self._box = SecretBox(key)
        db["unit_keys"].create(
            {"job_id": str, "unit_id": str, "sealed": bytes}, pk="unit_id", if_not_exists=True
        )

    def remember(self, job_id: str, unit_id: str, key: bytes) -> None:
        sealed = bytes(self._box.encrypt(key, random(SecretBox.NONCE_SIZE)))
        with self._db.conn:
            self._db["unit_keys"].upsert(
                {"job_id": job_id, "unit_id": unit_id, "sealed": sealed}, pk="unit_id"
            )

    def forget(self, unit_id: str) -> None:
        with self._db.conn:
            self._db.execute("DELETE FROM unit_keys WHERE unit_id = ?", [unit_id])

    def load(self) -> dict[tuple[str, str], bytes]:
        """Every stored key that opens with this identity, by (job_id, unit_id)."""
        keys = {}
        for row in self._db["unit_keys"].rows:
            try:
                keys[(row["job_id"], row["unit_id"])] = self._box.decrypt(row["sealed"])
            except CryptoError:  # sealed by another identity: useless here
                continue
        return keys
