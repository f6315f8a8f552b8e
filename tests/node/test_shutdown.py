"""A stop ends within a bound (node/shutdown.py): each step under its own deadline, a
watchdog behind them; and a real node stops on SIGTERM while every core is busy."""

from __future__ import annotations

import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import trio
import trio.testing
from processes import gone, training_process_in

from node.client import request_json
from node.demo.localnet import LocalNetwork, wait_for
from node.shutdown import SHUTDOWN_S, Shutdown, kill_process_groups
from training.spec.examples import digits_toml

EXIT_WAIT_S = 60  # the test's patience; the node's own deadline (SHUTDOWN_S) is well inside
HOGS = 4  # busy processes: two per core here
HOG = "import time\nprint('spinning', flush=True)\nend = time.monotonic() + 300\n" + (
    "while time.monotonic() < end: pass"
)


def _run(fn) -> object:  # noqa: ANN001
    """`fn()` under a clock that jumps ahead whenever every task waits."""
    return trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_step_that_outlives_its_deadline_is_abandoned_and_the_next_one_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = Shutdown()
    ran: list[str] = []

    async def main() -> list[bool]:
        async def stuck() -> None:
            await trio.sleep_forever()

        async def quick(what: str) -> None:
            await trio.sleep(0.1)
            ran.append(what)

        return [
            await stop.step("waiting forever", 2.0, stuck),
            await stop.step("closing", 2.0, quick, "closed"),
        ]

    assert _run(main) == [False, True]
    assert ran == ["closed"]
    assert "shutdown: waiting forever abandoned after 2.0 s" in caplog.text
    assert stop.doing == "closing"


def test_a_step_still_runs_when_the_scope_around_it_is_cancelled() -> None:
    """After a crash the stop's `finally` runs in a cancelled scope: its steps (the HTTP
    server's stop) must still run, each bounded by its own deadline only."""
    stop = Shutdown()
    ran: list[str] = []

    async def main() -> None:
        async def work() -> None:
            await trio.sleep(1.0)
            ran.append("stopped")

        with trio.CancelScope() as outer:
            outer.cancel()
            await stop.step("stopping", 5.0, work)

    _run(main)
    assert ran == ["stopped"]


def test_the_first_signal_requests_the_stop_and_later_ones_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="node.shutdown")
    stop = Shutdown()
    stop.exit = lambda code: None  # the watchdog must not end the test process

    async def main() -> None:
        send, receive = trio.open_memory_channel[int](4)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop.watch, receive)
            await send.send(signal.SIGTERM)
            await stop.requested.wait()
            stop.doing = "closing the libp2p host"
            await send.send(signal.SIGINT)
            await trio.testing.wait_all_tasks_blocked()  # `watch` has read and logged it
            stop.finished()  # also ends `watch`, so the nursery can close

    _run(main)
    assert "received SIGTERM, shutting down" in caplog.text
    assert "received SIGINT; already shutting down (closing the libp2p host)" in caplog.text


def test_the_watchdog_ends_a_stop_that_overruns_and_names_what_it_waited_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = Shutdown(deadline_s=0.01)
    exited: list[int] = []
    gone = threading.Event()
    stop.exit = lambda code: (exited.append(code), gone.set())
    stop.doing = "closing the libp2p host"
    stop.request()
    assert gone.wait(EXIT_WAIT_S), "the watchdog never fired"
    assert exited == [0]
    assert "shutdown was cut short after 0 s while closing the libp2p host" in caplog.text


def test_a_finished_stop_disarms_the_watchdog() -> None:
    stop = Shutdown(deadline_s=SHUTDOWN_S)
    exited: list[int] = []
    stop.exit = exited.append
    stop.request()
    stop.finished()
    assert stop._watchdog is not None
    stop._watchdog.join(EXIT_WAIT_S)
    assert not stop._watchdog.is_alive() and exited == []


def test_killing_runner_groups_skips_the_gone_and_survives_a_changing_set() -> None:
    assert kill_process_groups(lambda: [2**22 + 12345]) == 0  # no such process group

    def changing() -> set[int]:
        raise RuntimeError("Set changed size during iteration")

    assert kill_process_groups(changing) == 0


# -- a real node under load ------------------------------------------------------------


def _listenable(port: int) -> bool:
    """Whether a new listener can take `port` on loopback, as a restarted node would."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            probe.listen()
        except OSError:
            return False
    return True


@pytest.mark.slow
@pytest.mark.solo  # it loads every core: alone, after the parallel part of `make test`
def test_sigterm_stops_a_training_node_while_every_core_is_busy(
    localnet: LocalNetwork,
) -> None:
    """The node trains a unit when the machine gets busy and SIGTERM comes: it exits
    with code 0 and its `node stopped` line, its runner and fork server die with it,
    and its ports (libp2p, HTTP, blob data) are free for the next start. The bound is
    that it exits at all; how long it took is printed."""
    node = localnet.add()
    spec = 'placement = "local"\n' + digits_toml("long", steps=200_000, hidden=(64,))
    request_json(node.api, "POST", "/api/v1/jobs", {"spec": spec})
    runner = wait_for(
        lambda: training_process_in(node.data_dir / "units"), 60, "the runner to start"
    )
    server = training_process_in(node.data_dir / "runners")  # absent when it started fresh
    found = re.search(r"blob data channel on port (\d+)", node.log_tail(200))
    assert found, node.log_tail()
    ports = {"libp2p": node.p2p_port, "HTTP": node.http_port, "blob data": int(found[1])}

    assert node.proc is not None
    hogs: list[subprocess.Popen] = []
    try:
        for _ in range(HOGS):
            hogs.append(subprocess.Popen([sys.executable, "-c", HOG], stdout=subprocess.PIPE))
        for hog in hogs:
            assert hog.stdout is not None and hog.stdout.readline() == b"spinning\n"
        started = time.monotonic()
        node.proc.send_signal(signal.SIGTERM)
        try:
            code = node.proc.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {EXIT_WAIT_S} s after SIGTERM; log:\n{node.log_tail()}")
        print(f"SIGTERM to exit with {HOGS} busy processes: {time.monotonic() - started:.2f} s")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()

    log = node.log_tail(200)
    assert code == 0, log
    assert "node stopped" in log
    for pid in (p for p in (runner, server) if p is not None):
        wait_for(lambda p=pid: gone(p), EXIT_WAIT_S, f"training process {pid} to die")
    for name, port in ports.items():
        wait_for(lambda p=port: _listenable(p), EXIT_WAIT_S, f"the {name} port {port} to be free")
