"""The node's one Ed25519 key: it signs ads, results, receipts and ledger entries, and
the libp2p peer ID is derived from it, so a restarted node keeps its identity.

The key file holds the 32-byte seed, mode 0600. A key file others can read is
refused rather than used: it is the node's whole identity and credit.
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from nacl.signing import SigningKey

from protocol import peer_id_from_public_key

KEY_FILE = "identity.key"
TOKEN_FILE = "api.token"
MIN_TOKEN_CHARS = 32


class IdentityError(Exception):
    """The key file is missing, malformed or unsafe; the message says how to fix it."""


@dataclass(frozen=True)
class Identity:
    signing_key: SigningKey

    @property
    def seed(self) -> bytes:
        return bytes(self.signing_key)

    @property
    def public_key(self) -> bytes:
        return bytes(self.signing_key.verify_key)

    @property
    def peer_id(self) -> str:
        return peer_id_from_public_key(self.public_key)


def load_or_create_identity(data_dir: Path) -> Identity:
    """Load `identity.key` from `data_dir`, creating it (mode 0600) on first run."""
    key = SigningKey.generate()
    seed = _read_or_create_secret(data_dir / KEY_FILE, bytes(key), "this node's private key")
    if len(seed) != 32:
        raise IdentityError(
            f"{data_dir / KEY_FILE} should hold a 32-byte Ed25519 seed but has {len(seed)} "
            "bytes; restore it from a backup or move it away to create a new identity"
        )
    return Identity(SigningKey(seed))


def load_or_create_api_token(data_dir: Path) -> str:
    """The bearer token every HTTP request needs when the API is not bound to loopback."""
    fresh = secrets.token_urlsafe(32).encode()
    path = data_dir / TOKEN_FILE
    token = (
        _read_or_create_secret(path, fresh, "this node's API token")
        .decode("ascii", errors="replace")
        .strip()
    )
    if len(token) < MIN_TOKEN_CHARS:
        raise IdentityError(
            f"{path} holds a token of {len(token)} characters; it needs at least "
            f"{MIN_TOKEN_CHARS} (about 128 bits or more). Delete the file to have a new one "
            "made at the next start, or write a longer random token into it"
        )
    return token


def _read_or_create_secret(path: Path, fresh: bytes, what: str) -> bytes:
    """Create `path` with `fresh` (mode 0600) or read it, refusing group/world access."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise IdentityError(
                f"{path} is readable by other users (mode {mode:o}); "
                f"it holds {what}. Run: chmod 600 {path}"
            ) from None
        return path.read_bytes()
    with os.fdopen(fd, "wb") as f:
        f.write(fresh)
    return fresh
