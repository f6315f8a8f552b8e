"""Shared fixtures: real node processes on loopback, torn down after each test."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from node.demo.localnet import ONE_THREAD, LocalNetwork

# The nodes the tests start train on one thread; so must every reference the tests
# compare them with bitwise (train_local here, `train-local` in a child): on CPU the
# number of intra-op threads is part of the determinism class (docs/jobspec.md). Set
# before any test module imports torch, which reads it once.
os.environ.update(ONE_THREAD)

# short refresh and TTL so that joins and departures show within seconds
FAST_GOSSIP = ["--publish-interval", "1", "--peer-ttl", "3"]
# test nodes start their runners' fork server with their first task, not with the node
# (`warm_runners`): most never train, and each warm server costs 1-3 s of CPU
# (tests/node/work/run/test_forkserver.py checks the default)
NODE_ARGS = [*FAST_GOSSIP, "--cold-runners"]


@pytest.fixture
def localnet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalNetwork]:
    net = LocalNetwork(tmp_path / "net", NODE_ARGS)
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


# -- `make test-fast`: no processes ------------------------------------------------------
# The inner loop's selection is `-m "not slow and not solo and not browser and not
# process"` under `--no-processes`. A test that starts a subprocess (a node, a runner,
# the CLI), forks, or opens a libp2p host is marked `process` (its module's
# `pytestmark`, or the test); one that does so unmarked fails there, saying so.


STARTS_PROCESSES = ("process", "slow", "browser")  # the marks that say a test may


class StartsProcesses(RuntimeError):
    """A test run under --no-processes started a process or a libp2p host."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-processes",
        action="store_true",
        default=False,
        help="fail a test that starts a subprocess, forks or opens a libp2p host "
        "without being marked `process` (make test-fast)",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ARG001
    marked = any(item.get_closest_marker(name) for name in STARTS_PROCESSES)
    if marked or not item.config.getoption("no_processes"):
        yield
        return
    with _refusing_processes(item.nodeid):
        yield


@contextlib.contextmanager
def _refusing_processes(nodeid: str) -> Iterator[None]:
    def refuse(*args: object, **kwargs: object) -> None:
        raise StartsProcesses(
            f"{nodeid} starts a process or a libp2p host: mark it `process` "
            "(make test-fast runs none)"
        )

    targets: list[tuple[object, str]] = [
        (subprocess.Popen, "__init__"),
        (os, "fork"),
        (os, "posix_spawn"),
        (os, "posix_spawnp"),
    ]
    host = sys.modules.get("node.net.host")
    if host is not None:
        targets.append((host.MeshHost, "start"))
    saved = [(owner, name, vars(owner)[name]) for owner, name in targets if name in vars(owner)]
    try:
        for owner, name, _ in saved:
            setattr(owner, name, refuse)
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
