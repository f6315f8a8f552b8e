"""The event feed: published in one thread, delivered on an asyncio loop, bounded per
subscriber; the node's event sources; and `GET /api/v1/events` as server-sent events,
bad input included."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import sqlite_utils
import trio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from node.net.bridge import EventFeed, FeedClosed, TooManySubscribers
from node.web.events import NodeEvents, PublishingLedger, event_routes, watch_peers
from node.work.jobs import JobStore


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


# -- EventFeed ---------------------------------------------------------------------------


def test_events_published_in_another_thread_arrive_in_order() -> None:
    async def main() -> list[tuple[str, dict]]:
        feed = EventFeed()
        with feed.subscribe() as sub:
            thread = threading.Thread(
                target=lambda: [feed.publish("job", {"n": i}) for i in range(50)]
            )
            thread.start()
            got = []
            while len(got) < 50:
                event = await sub.next(5)
                assert event is not None, "an event did not arrive"
                got.append((event.kind, json.loads(event.data)))
            thread.join()
            return got

    assert run(main()) == [("job", {"n": i}) for i in range(50)]


def test_a_lagging_subscriber_loses_the_oldest_events_and_is_told_how_many() -> None:
    async def main() -> tuple[list[int], int, list[int]]:
        feed = EventFeed(queue_size=4)
        with feed.subscribe() as slow, feed.subscribe() as fast:
            for i in range(10):
                feed.publish("job", {"n": i})
            await asyncio.sleep(0)  # let the loop run the deliveries
            slow_got = [json.loads((await slow.next(1)).data)["n"] for _ in range(4)]
            dropped = slow.take_dropped()
            assert await slow.next(0.01) is None
            fast_got = []
            while (event := await fast.next(0.01)) is not None:
                fast_got.append(json.loads(event.data)["n"])
            return slow_got, dropped, fast_got

    slow_got, dropped, fast_got = run(main())
    assert slow_got == [6, 7, 8, 9]
    assert dropped == 6
    assert fast_got == [6, 7, 8, 9]  # each subscriber has its own bounded queue


def test_publishing_without_subscribers_or_with_bad_data_is_harmless() -> None:
    async def main() -> list[str]:
        feed = EventFeed()
        feed.publish("job", {"n": 0})  # nobody listens
        with feed.subscribe() as sub:
            feed.publish("job", {"loss": float("nan")})  # not JSON: dropped, logged
            feed.publish("job", {"x": object()})  # not JSON-able either
            feed.publish("job", {"ok": True})
            event = await sub.next(1)
            return [event.data]

    assert run(main()) == ['{"ok":true}']


def test_subscribers_are_capped_and_a_closed_feed_ends_them() -> None:
    async def main() -> None:
        feed = EventFeed(max_subscribers=2)
        a, b = feed.subscribe(), feed.subscribe()
        with pytest.raises(TooManySubscribers):
            feed.subscribe()
        b.close()
        c = feed.subscribe()  # a closed subscription frees its place
        waiting = asyncio.ensure_future(a.next(10))
        await asyncio.sleep(0)
        feed.close()
        with pytest.raises(FeedClosed):
            await waiting
        with pytest.raises(FeedClosed):
            await c.next(1)
        with pytest.raises(FeedClosed):
            feed.subscribe()
        assert not feed.has_subscribers

    run(main())


# -- the node's event sources -------------------------------------------------------------


class Recorder:
    has_subscribers = True

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def publish(self, kind: str, data: dict) -> None:
        self.events.append((kind, json.loads(json.dumps(data))))


def test_job_changes_are_published_with_the_newest_loss_point() -> None:
    feed = Recorder()
    jobs = JobStore(sqlite_utils.Database(memory=True), on_change=NodeEvents(feed).job)
    job = jobs.create("j", {"mode": "single"}, "auto", {}, [])
    progress = {"phase": "training", "step": 5, "total_steps": 10, "loss": 0.5}
    jobs.update(job, state="running", progress={**progress, "history": [[5, 0.5, None]]})
    kinds = [k for k, _ in feed.events]
    assert kinds == ["job", "job"]
    created, updated = (d for _, d in feed.events)
    assert created["state"] == "queued" and created["point"] is None
    assert updated["state"] == "running"
    assert updated["point"] == [5, 0.5, None]
    assert updated["progress"]["step"] == 5 and "history" not in updated["progress"]


def test_a_failing_listener_does_not_break_the_job_store() -> None:
    def boom(job: Any) -> None:
        raise RuntimeError("listener bug")

    jobs = JobStore(sqlite_utils.Database(memory=True), on_change=boom)
    job = jobs.create("j", {}, "auto", {}, [])
    jobs.update(job, state="running")
    assert jobs.get(job.id).state == "running"


def test_ledger_appends_are_published_and_refused_appends_are_not() -> None:
    feed = Recorder()
    entry = SimpleNamespace(
        seq=3, kind="rejected", job_id="j", unit_id="u", worker="w", owner="o", credit=0.0
    )

    class FakeLedger:
        calls = 0

        def append_rejected(self, *args: Any) -> Any:
            return entry

        def append_work(self, *args: Any) -> Any:
            raise ValueError("refused")

        def head(self) -> Any:
            return entry

    ledger = PublishingLedger(FakeLedger(), NodeEvents(feed))
    assert ledger.append_rejected("j", "u", "w", "o", "why") is entry
    with pytest.raises(ValueError):
        ledger.append_work("work_done", b"", 0.0, 0.0)
    assert ledger.head() is entry  # everything else passes through
    assert feed.events == [
        (
            "ledger",
            {
                "seq": 3,
                "kind": "rejected",
                "job_id": "j",
                "unit_id": "u",
                "worker": "w",
                "owner": "o",
                "credit": 0.0,
            },
        )
    ]


def _peer_entry(peer_id: str, seq: int, stale: bool = False) -> Any:
    ad = SimpleNamespace(
        peer_id=peer_id, seq=seq, tflops=1.5, load_pct=0, policy=SimpleNamespace(accepting=True)
    )
    return SimpleNamespace(ad=ad, stale=stale)


def test_peer_joins_updates_and_departures_are_published() -> None:
    feed = Recorder()
    table: dict[str, Any] = {"a": _peer_entry("a", 1)}
    peers = SimpleNamespace(entries=lambda: list(table.values()), get=table.get)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(watch_peers, peers, NodeEvents(feed), 0.01)

            async def wait_for_events(n: int) -> None:
                with trio.fail_after(5):
                    while len(feed.events) < n:
                        await trio.sleep(0.01)

            table["b"] = _peer_entry("b", 1)
            await wait_for_events(1)
            table["a"] = _peer_entry("a", 2)
            await wait_for_events(2)
            del table["b"]
            await wait_for_events(3)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert [(d["change"], d["peer_id"]) for _, d in feed.events] == [
        ("joined", "b"),
        ("updated", "a"),
        ("left", "b"),
    ]
    assert feed.events[0][1]["tflops"] == 1.5


# -- GET /api/v1/events ------------------------------------------------------------------


async def _client(feed: EventFeed) -> TestClient:
    app = web.Application()
    event_routes(feed, "12D3KooWpeer", heartbeat_s=30)(app)
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def _read_event(response: Any) -> tuple[str, dict, str]:
    """The next event of an SSE stream: (kind, data, id)."""
    kind, data, ident = "", "", ""
    while True:
        line = (await response.content.readline()).decode()
        assert line, "the stream ended"
        line = line.rstrip("\n")
        if not line:
            if kind:
                return kind, json.loads(data), ident
            continue
        field, _, value = line.partition(": ")
        if field == "event":
            kind = value
        elif field == "data":
            data = value
        elif field == "id":
            ident = value


def test_the_stream_says_hello_then_carries_events_filtered_by_kind() -> None:
    async def main() -> None:
        feed = EventFeed()
        client = await _client(feed)
        try:
            response = await client.get("/api/v1/events?kinds=job,ledger")
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            assert response.headers["Cache-Control"] == "no-cache"
            kind, data, _ = await _read_event(response)
            assert (kind, data) == ("hello", {"peer_id": "12D3KooWpeer", "boot": feed.boot})
            feed.publish("peer", {"change": "joined"})  # filtered out
            feed.publish("job", {"id": "j1"})
            kind, data, ident = await _read_event(response)
            assert (kind, data) == ("job", {"id": "j1"})
            assert ident.startswith(feed.boot + "-")
            response.close()
        finally:
            await client.close()

    run(main())


def test_a_quiet_stream_ticks_and_a_lagging_one_is_told() -> None:
    async def main() -> None:
        feed = EventFeed(queue_size=2)
        client = await _client(feed)
        try:
            response = await client.get("/api/v1/events?heartbeat=1")
            assert (await _read_event(response))[0] == "hello"
            kind, data, _ = await _read_event(response)
            assert kind == "tick" and data["t"] > 0
            # a burst the handler cannot have read yet: the queue keeps the newest two
            feed.publish("status", {"n": 1})
            feed.publish("status", {"n": 2})
            feed.publish("status", {"n": 3})
            kinds = []
            while len(kinds) < 3:
                kind, data, _ = await _read_event(response)
                if kind != "tick":
                    kinds.append((kind, data))
            assert kinds[0][0] == "lagged" and kinds[0][1]["dropped"] >= 1
            assert kinds[-1] == ("status", {"n": 3})
            response.close()
        finally:
            await client.close()

    run(main())


@pytest.mark.parametrize(
    "query, message",
    [
        ("kinds=job,bogus", "'kinds' must be"),
        ("kinds=", "'kinds' must be"),
        ("kinds=<script>", "'kinds' must be"),
        ("heartbeat=0", "'heartbeat' must be 1..60"),
        ("heartbeat=61", "'heartbeat' must be 1..60"),
        ("heartbeat=nan", "'heartbeat' must be 1..60"),
        ("heartbeat=soon", "'heartbeat' must be 1..60"),
    ],
)
def test_bad_parameters_are_refused_and_subscribe_nothing(query: str, message: str) -> None:
    async def main() -> None:
        feed = EventFeed()
        client = await _client(feed)
        try:
            response = await client.get(f"/api/v1/events?{query}")
            assert response.status == 400
            assert message in await response.text()
            assert not feed.has_subscribers
        finally:
            await client.close()

    run(main())


def test_too_many_streams_get_503_and_shutdown_ends_the_open_ones() -> None:
    async def main() -> None:
        feed = EventFeed(max_subscribers=1)
        client = await _client(feed)
        try:
            first = await client.get("/api/v1/events")
            assert (await _read_event(first))[0] == "hello"
            second = await client.get("/api/v1/events")
            assert second.status == 503
            assert "event streams are open already" in await second.text()
            await client.app.shutdown()  # what the server's cleanup runs first
            assert await asyncio.wait_for(first.content.read(), 5) == b""  # ended, not hung
        finally:
            await client.close()

    run(main())
