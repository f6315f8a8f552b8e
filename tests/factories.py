"""Builders for test messages (importable from any test: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from nacl.signing import SigningKey

from protocol import CapacityAd, GpuInfo, Policy, peer_id_from_public_key


def peer_id_of(key: SigningKey) -> str:
    return peer_id_from_public_key(bytes(key.verify_key))


def capacity_ad(peer_id: str, seq: int, *, age_s: float = 0.0, **changes: Any) -> CapacityAd:
    """A valid CPU-only ad for `peer_id`, dated `age_s` seconds ago."""
    ad = CapacityAd(
        peer_id=peer_id,
        addrs=[],
        gpus=[GpuInfo(name="test cpu", kind="cpu")],
        tflops=1.0,
        torch_version="2.13.0",
        cuda_version="",
        policy=Policy(),
        load_pct=0,
        seq=seq,
        timestamp=time.time() - age_s,
    )
    return replace(ad, **changes)
