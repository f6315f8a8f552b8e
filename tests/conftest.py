"""Shared fixtures: real node processes on loopback, torn down after each test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.localnet import ONE_THREAD, LocalNetwork

# The nodes the tests start train on one thread; so must every reference the tests
# compare them with bitwise (train_local here, `train-local` in a child): on CPU the
# number of intra-op threads is part of the determinism class (docs/jobspec.md). Set
# before any test module imports torch, which reads it once.
os.environ.update(ONE_THREAD)

# short refresh and TTL so that joins and departures show within seconds
FAST_GOSSIP = ["--publish-interval", "1", "--peer-ttl", "3"]


@pytest.fixture
def localnet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalNetwork]:
    net = LocalNetwork(tmp_path / "net", FAST_GOSSIP)
    try:
        yield net
    finally:
        net.stop()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            for node in net.nodes:
                print(f"--- {node.name} ({node.peer_id}) log ---\n{node.log_tail(60)}")


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ARG001
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first (in their own order), so that the run does not end with one
    worker in a long test while the other sits idle. (`make test` hands tests out with
    `--dist worksteal`: under xdist's default, one worker's first batch would hold
    every slow test and the other could take none of them.)"""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
