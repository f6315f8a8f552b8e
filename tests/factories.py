"""Builders for test messages (importable from any test: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import time
import tomllib
import urllib.request
from dataclasses import replace
from typing import Any

from nacl.signing import SigningKey

from protocol import CapacityAd, GpuInfo, Policy, peer_id_from_public_key
from training.spec.examples import digits_toml
from training.spec.job import parse_spec, spec_to_plain


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


def rejections(api: str, metric: str) -> dict[str, float]:
    """A node's `<metric>_total{reason=...}` counters from /metrics, by reason."""
    with urllib.request.urlopen(f"{api}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith(f"{metric}_total{{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            counts[reason] = float(line.rsplit(" ", 1)[1])
    return counts


#: the digits job most tests train (the demo's, smaller), as a plain spec
DIGITS_PLAIN = spec_to_plain(parse_spec(tomllib.loads(digits_toml(steps=20, hidden=(32,)))))
