"""A directory says when it holds more registrations than it serves comfortably, since
nothing but an operator adds a directory to a network."""

from __future__ import annotations

import logging

import pytest
import trio
from factories import capacity_ad
from nacl.signing import SigningKey
from trio.testing import MockClock

from node.net.discovery import directory as directory_module
from node.net.discovery.directory import Directory
from protocol import peer_id_from_public_key, seal


def _register(directory: Directory, count: int) -> None:
    for _ in range(count):
        key = SigningKey.generate()
        ad = capacity_ad(peer_id_from_public_key(bytes(key.verify_key)), 1)
        directory.table.accept(ad, seal(ad, key))


def test_a_crowded_directory_says_the_network_needs_another(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(directory_module, "COMFORTABLE_REGISTRATIONS", 3)
    directory = Directory(None, None, None, None, ttl_s=90)  # type: ignore[arg-type]
    _register(directory, 3)
    assert not directory.crowded()
    _register(directory, 1)
    assert directory.crowded()

    async def watch() -> None:
        with trio.move_on_after(3.5):  # three of its once-a-second looks, on a mock clock
            await directory.run()

    with caplog.at_level(logging.WARNING, logger="node.net.discovery.directory"):
        trio.run(watch, clock=MockClock(autojump_threshold=0))
    (warning,) = [r.getMessage() for r in caplog.records]  # once, not every second
    assert "4 registrations, more than the 3" in warning
    assert "needs another directory" in warning
