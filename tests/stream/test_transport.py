"""The worker's aiokafka transport (processor/stream/worker/transport.py): its consumer polls
idle partitions for at most FETCH_MAX_WAIT_MS, its message loop hands a message to its
callback as Faust's does (without a task unless the callback waits), and the private
names it relies on have the shape it was checked against (these tests fail when an
upgrade changes them)."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
from typing import Any, cast

import aiokafka
import pytest
from confluent_kafka import Producer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

from processor.stream.worker import transport
from processor.stream.worker.app import WorkerApp
from tests.conftest import create_topics, unique_topic


def _built_consumer() -> tuple[WorkerApp, aiokafka.AIOKafkaConsumer, int]:
    """A WorkerApp's worker consumer as its consumer thread builds it (not started), and
    the wait Faust's own thread would have given it."""
    async def build() -> tuple[WorkerApp, aiokafka.AIOKafkaConsumer, int]:
        app = WorkerApp("transport-probe", broker="kafka://127.0.0.1:1", web_enabled=False)
        consumer = app.consumer
        tr = app.transport
        assert isinstance(consumer, transport.QuickPollConsumer)
        assert isinstance(tr, transport.QuickPollTransport)
        ours = consumer._new_consumer_thread()._create_worker_consumer(tr)
        faust_thread = faust_aiokafka.AIOKafkaConsumerThread(
            consumer, loop=consumer.loop, beacon=consumer.beacon)
        theirs = faust_thread._create_worker_consumer(tr)
        return app, ours, theirs._fetch_max_wait_ms

    return asyncio.run(build())


def test_the_worker_consumer_polls_briefly() -> None:
    _app, consumer, faust_wait = _built_consumer()
    assert consumer._fetch_max_wait_ms == transport.FETCH_MAX_WAIT_MS
    # What it changes: Faust's fixed 1.5 s long-poll (the recovery's look-ups waited
    # behind it, one after the other).
    assert faust_wait == 1500 > transport.FETCH_MAX_WAIT_MS


def test_the_private_names_have_the_checked_shape() -> None:
    """faust.App._new_transport builds the transport from conf.broker_consumer; the
    consumer thread is made by Consumer._new_consumer_thread and builds its aiokafka
    consumer in _create_worker_consumer(transport); aiokafka's start() builds the Fetcher
    from the instance's _fetch_max_wait_ms."""
    import faust

    assert "broker_consumer" in inspect.getsource(faust.App._new_transport)
    assert list(inspect.signature(
        faust_aiokafka.Consumer._new_consumer_thread).parameters) == ["self"]
    assert list(inspect.signature(
        faust_aiokafka.AIOKafkaConsumerThread._create_worker_consumer).parameters) == [
            "self", "transport"]
    assert "fetch_max_wait_ms=self._fetch_max_wait_ms" in inspect.getsource(
        aiokafka.AIOKafkaConsumer.start)


# The message loop's hand-over (transport.deliver, transport.Resumed) against Faust's:
# each scenario's callback records what it did; run through Faust's race (every
# callback in a task, `Service.wait_first` against a suspend_flow event) and through the
# loop's (`deliver`, the race only for a callback that suspended), the records match.

Trace = list[str]
#: Faust's `Consumer._drain_messages` as copied (faust-streaming 0.15.3): sha256 of its source.
FAUST_DRAIN_SHA = "44a2500309e83c63"
#: Faust's `ConductorCompiler.build` (faust-streaming 0.15.3), whose handler
#: `transport.changelog_handler` does at once: sha256 of its source.
FAUST_HANDLER_SHA = "837cf521368c1ee4"


async def _scenario(name: str, trace: Trace, gate: asyncio.Future[None],
                    var: contextvars.ContextVar[str]) -> str:
    trace.append(f"{name}: start, sees {var.get('-')}")
    var.set(name)
    if name == "runs through":
        trace.append(f"{name}: done")
        return "r"
    if name == "raises":
        raise ValueError("decode failed")
    try:
        await gate  # a full queue, a paused flow
        trace.append(f"{name}: resumed, sees {var.get('-')}")
        await asyncio.sleep(0)
        trace.append(f"{name}: done")
        return "r"
    except asyncio.CancelledError:
        trace.append(f"{name}: cancelled")
        raise


SCENARIOS = ("runs through", "raises", "waits, then goes on", "waits, flow suspended")


def _run(name: str, hand_over: str, resumed: type[transport.Resumed] = transport.Resumed
         ) -> Trace:
    """One scenario through Faust's hand-over ("faust") or the loop's ("deliver")."""
    import mode

    var: contextvars.ContextVar[str] = contextvars.ContextVar("probe")

    async def main() -> Trace:
        trace: Trace = []
        service = mode.Service()
        suspend_flow = asyncio.Event()
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def rebalance() -> None:
            await asyncio.sleep(0.01)
            if name == "waits, flow suspended":
                suspend_flow.set()
            else:
                gate.set_result(None)

        side = asyncio.ensure_future(rebalance())
        step = _scenario(name, trace, gate, var)
        try:
            if hand_over == "faust":
                await service.wait_first(step, suspend_flow.wait())
            else:
                first = transport.deliver(step)
                trace.append("handed over at once" if first is None else "raced")
                if first is not None:
                    rest = resumed(first._coro, first._yielded, first._context)
                    await service.wait_first(rest, suspend_flow.wait())
        except ValueError as exc:
            trace.append(f"raised {exc}")
        await side
        await asyncio.sleep(0.02)
        trace.append(f"loop sees {var.get('-')}")
        return [t for t in trace if t not in ("handed over at once", "raced")]

    return asyncio.run(main())


def test_deliver_hands_over_as_faust_does() -> None:
    for name in SCENARIOS:
        assert _run(name, "deliver") == _run(name, "faust"), name
    # what each scenario shows
    assert _run("waits, flow suspended", "deliver")[-2:] == [
        "waits, flow suspended: cancelled", "loop sees -"]
    assert "waits, then goes on: resumed, sees waits, then goes on" in _run(
        "waits, then goes on", "deliver")


def test_deliver_runs_a_callback_that_does_not_wait_without_a_task() -> None:
    done: list[str] = []

    async def callback() -> None:
        done.append("ran")

    async def main() -> None:
        before = len(asyncio.all_tasks())
        assert transport.deliver(callback()) is None
        assert done == ["ran"] and len(asyncio.all_tasks()) == before

    asyncio.run(main())


class _Swallowing(transport.Resumed):
    """Control: a hand-over that does not forward the race's cancellation."""

    def __await__(self):  # type: ignore[no-untyped-def]
        coro, yielded = self._coro, self._yielded
        while True:
            try:
                sent = yield yielded
            except BaseException:
                return None
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value


class _ContextFree(transport.Resumed):
    """Control: a hand-over that resumes the coroutine in the awaiting task's context."""

    def __await__(self):  # type: ignore[no-untyped-def]
        coro, yielded = self._coro, self._yielded
        while True:
            sent = yield yielded
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value


def test_the_controls_differ_from_faust() -> None:
    assert _run("waits, flow suspended", "deliver", _Swallowing) != _run(
        "waits, flow suspended", "faust")
    assert _run("waits, then goes on", "deliver", _ContextFree) != _run(
        "waits, then goes on", "faust")


def test_the_loop_is_fausts_but_for_the_hand_over() -> None:
    """The message loop copied from Faust (`_drain`, `_drain_messages`) differs from
    Faust's only where the callback is handed over: Faust's source is the checked one."""
    from faust.transport.consumer import Consumer

    source = inspect.getsource(Consumer._drain_messages)
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == FAUST_DRAIN_SHA
    assert "await self.wait_first(\n" in source
    assert "callback(message), self.suspend_flow.wait()" in source


def test_the_changelog_hand_over_follows_fausts_handler_source() -> None:
    """`changelog_handler` repeats what Faust's per-partition handler does when nothing
    waits; the tests below compare the two on this version only, so a Faust whose
    handler changed must be checked again before this hash is."""
    from faust.transport.conductor import ConductorCompiler

    source = inspect.getsource(ConductorCompiler.build)
    assert hashlib.sha256(source.encode()).hexdigest()[:16] == FAUST_HANDLER_SHA


# The changelog hand-over (transport.ChangelogConductor.take_now) against Faust's handler
# of the same partition: the same events in the same queue, or nothing done at all.

def _handover(messages: list[tuple[bytes | None, bytes | None]], way: str,
              block: str = "") -> tuple[list[tuple[object, ...]], list[bool]]:
    """Hand `messages` (key, value) of changelog partition 1 over through Faust's handler
    ("faust") or `take_now` ("now"), with `block` ("flow", "lock", "waiter", "queue",
    "producer") making Faust's handler wait: the queue's events (type, key, value, headers,
    the message, its reference count) and take_now's answers."""
    from faust.types import TP, Message

    from processor.stream.worker.table import MonotoneTable

    async def main() -> tuple[list[tuple[object, ...]], list[bool]]:
        app = WorkerApp("changelog-probe", broker="kafka://127.0.0.1:1",
                        web_enabled=False, stream_buffer_maxsize=8)
        table = MonotoneTable(app, name="state", default=None, partitions=2,
                              key_type=bytes, value_type=bytes)
        app.tables.add(table)
        tables: Any = app.tables
        queue = tables.changelog_queue
        conductor: Any = app.topics
        assert isinstance(conductor, transport.ChangelogConductor)
        conductor.add(cast(Any, table.changelog_topic.clone_using_queue(queue)))
        timeline = app.topic("timeline", key_type=bytes, value_type=bytes,
                             key_serializer="raw", value_serializer="raw")
        conductor.add(timeline)
        changelog_name = table.changelog_topic.get_topic_name()
        tp = TP(changelog_name, 1)
        conductor._update_tp_index({tp, TP("timeline", 1)})
        conductor._update_callback_map()
        handler = conductor._tp_to_callback[tp]
        assert isinstance(handler, transport.ChangelogHandler)
        assert not isinstance(conductor._tp_to_callback[TP("timeline", 1)],
                              transport.ChangelogHandler)
        app.flow_control.resume()
        lock = conductor._tp_to_callback_lock
        if block == "flow":
            app.flow_control.suspend()
        elif block == "lock":
            await lock.acquire()
        elif block == "waiter":
            await lock.acquire()
            waiter = asyncio.ensure_future(lock.acquire())
            await asyncio.sleep(0)
            lock.release()  # unlocked, but the waiter takes it first
            assert not lock.locked()
        elif block == "queue":
            while not queue.full():
                queue.put_nowait(None)
        elif block == "producer":
            for _ in range(app.producer.buffer.max_messages + 1):
                app.producer.buffer.pending.put_nowait(None)
        elif block == "channel":  # a second channel of the partition, handler not rebuilt
            conductor._tp_index[tp].add(timeline)
        answers: list[bool] = []
        sent = []
        for offset, (key, value) in enumerate(messages):
            msg = Message(changelog_name, 1, offset, 0.0, 0, [("h", b"1")], key, value,
                          None, tp=tp)
            sent.append(msg)
            if way == "faust":
                await handler(msg)
            else:
                answers.append(conductor.take_now(msg))
        # the timeline's partition is never handed over here
        other = Message("timeline", 1, 0, 0.0, 0, None, b"k", b"v", None,
                        tp=TP("timeline", 1))
        assert conductor.take_now(other) is False
        if block == "waiter":
            await waiter
        got: list[tuple[object, ...]] = []
        while not queue.empty():
            event = queue.get_nowait()
            if event is not None:
                got.append((type(event), event.key, event.value, event.headers,
                            sent.index(event.message), event.message.refcount))
        return got, answers

    return asyncio.run(main())


CHANGELOG_RECORDS: list[tuple[bytes | None, bytes | None]] = [
    (b"c:1", b"\x04\x00\x01"), (b"p", b"\xff\x00"), (b"c:2", None), (None, b"x")]


def test_a_changelog_record_is_handed_over_as_fausts_handler_does() -> None:
    faust_events, _ = _handover(CHANGELOG_RECORDS, "faust")
    now_events, answers = _handover(CHANGELOG_RECORDS, "now")
    assert answers == [True] * len(CHANGELOG_RECORDS)
    assert now_events == faust_events
    assert [e[1:3] for e in now_events] == CHANGELOG_RECORDS  # raw bytes, as written
    assert {e[5] for e in now_events} == {1}


def test_a_hand_over_that_would_wait_is_left_to_faust() -> None:
    # controls: wherever Faust's handler would wait, take_now does nothing at all
    for block in ("flow", "lock", "waiter", "queue", "producer", "channel"):
        events, answers = _handover(CHANGELOG_RECORDS[:1], "now", block)
        assert answers == [False] and events == [], block


def test_a_changelog_that_decodes_is_left_to_faust() -> None:
    """A channel whose schema decodes (not raw bytes) keeps Faust's handler."""
    from faust.types import TP

    async def main(value_type: type | None, codec: str) -> object:
        app = WorkerApp("changelog-probe", broker="kafka://127.0.0.1:1",
                        web_enabled=False)
        chan = app.topic("state-changelog", key_type=bytes, value_type=value_type,
                         key_serializer="raw", value_serializer=codec
                         ).clone_using_queue(cast(Any, app.tables).changelog_queue)
        return transport.changelog_handler(app, TP("state-changelog", 0), {chan}, None)

    assert asyncio.run(main(None, "json")) is None
    assert asyncio.run(main(bytes, "json")) is None
    assert isinstance(asyncio.run(main(bytes, "raw")), transport.ChangelogHandler)


class _SeekThread:
    """The consumer thread's seeks, recorded: seek_to_committed answers `committed`; a
    seek of a partition in `unassigned` raises as aiokafka's does; a seek made other than
    through `call_thread` (on the consumer thread, as mode runs it) is an error."""

    def __init__(self, committed: dict[aiokafka.TopicPartition, int | None],
                 unassigned: set[aiokafka.TopicPartition]) -> None:
        self.committed = committed
        self.unassigned = unassigned
        self.seeks: list[tuple[aiokafka.TopicPartition, int]] = []
        self._on_thread = False

    async def seek_to_committed(self) -> dict[aiokafka.TopicPartition, int | None]:
        return dict(self.committed)

    async def call_thread(self, fun: Any, *args: Any) -> Any:
        # mode's method queue: the call, awaited if it returns an awaitable
        self._on_thread = True
        try:
            got = fun(*args)
            return (await got) if inspect.isawaitable(got) else got
        finally:
            self._on_thread = False

    def seek(self, partition: aiokafka.TopicPartition, offset: int) -> None:
        if not self._on_thread:
            raise AssertionError("aiokafka's seek called off the consumer thread")
        if partition in self.unassigned:
            raise aiokafka.errors.IllegalStateError("not assigned")
        self.seeks.append((partition, offset))


def test_the_seek_also_takes_a_never_committed_stream_partition_to_its_start() -> None:
    """The seek that ends a rebalance's recovery: aiokafka seeks only committed offsets
    above 0, so the worker's consumer seeks the stream partitions with none (or 0) to
    their first offset, and no changelog partition (the recovery's). Faust's consumer
    alone seeks none of them (the small unit campaign's stalled drain)."""
    tl = [aiokafka.TopicPartition("tl", p) for p in range(5)]
    changelog = aiokafka.TopicPartition("app-dpc-state-changelog", 1)
    committed: dict[aiokafka.TopicPartition, int | None] = {
        tl[0]: 7, tl[1]: None, tl[2]: 0, tl[3]: 1, tl[4]: None, changelog: None}

    async def seek() -> tuple[object, list[tuple[aiokafka.TopicPartition, int]],
                              dict[TP, int | None]]:
        app = WorkerApp("seek-probe", broker="kafka://127.0.0.1:1", web_enabled=False)
        consumer = app.consumer
        assert isinstance(consumer, transport.QuickPollConsumer)
        app.topics.acks_enabled_for = lambda topic: topic == "tl"  # type: ignore[method-assign]
        # tl[4] was revoked meanwhile: skipped, the others still sought.
        thread = _SeekThread(committed, unassigned={tl[4]})
        consumer._thread = cast(Any, thread)
        consumer._read_offset.clear()
        got = await consumer.seek_to_committed()
        return got, thread.seeks, dict(consumer._read_offset)

    got, seeks, read = asyncio.run(seek())
    assert got == committed
    assert sorted(seeks) == [(tl[1], 0), (tl[2], 0)]
    # Faust's own seek of offset 0 forgets the last offset read: the same here.
    assert read == {TP("tl", 1): None, TP("tl", 2): None}


@pytest.mark.kafka
def test_aiokafka_leaves_a_never_committed_partition_past_what_it_fetched(
        kafka_bootstrap: str) -> None:
    """Why the seek above is needed, on a real broker: after a fetch, aiokafka's
    seek_to_committed leaves a partition the group never committed where the fetch left
    it (records fetched and then dropped are never read again); a seek to 0 (what the
    worker's consumer adds) reads them again."""
    topic = unique_topic("seek-back")
    create_topics(kafka_bootstrap, [topic], partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(5):
        producer.produce(topic, value=b"%d" % i, partition=0)
    assert producer.flush(30) == 0
    tp = aiokafka.TopicPartition(topic, 0)

    async def run() -> tuple[int, int, list[int]]:
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=kafka_bootstrap, group_id=unique_topic("seek-group"),
            enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([tp])
            fetched: list[int] = []
            while len(fetched) < 5:
                batch = await consumer.getmany(tp, timeout_ms=5000)
                fetched += [r.offset for r in batch.get(tp, [])]
            await consumer.seek_to_committed(tp)
            after_committed = await consumer.position(tp)
            consumer.seek(tp, 0)
            after_beginning = await consumer.position(tp)
            again = await consumer.getmany(tp, timeout_ms=5000)
            return after_committed, after_beginning, [r.offset for r in again.get(tp, [])]
        finally:
            await consumer.stop()

    after_committed, after_beginning, again = asyncio.run(run())
    assert after_committed == 5
    assert after_beginning == 0
    assert again == [0, 1, 2, 3, 4]
