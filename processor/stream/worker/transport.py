"""Faust's connection to the brokers: their URLs and credentials from the settings
(`broker_urls`, `faust_credentials`, from kafka_io's TLS context), raw-bytes topics
(`raw_topic`), and its aiokafka transport with a shorter fetch long-poll for the
worker's consumer.

Faust builds the worker's aiokafka consumer with `fetch_max_wait_ms=1500`, fixed in its
driver (faust-streaming 0.15.3, `AIOKafkaConsumerThread._create_worker_consumer`; no
setting changes it). A broker answers the requests of one connection in order, so while
a fetch of partitions that have no new records waits out its 1.5 s, every other request
of the consumer to that broker waits behind it. At a rebalance, Faust's recovery makes
three such requests one after the other (the changelogs' highwaters, the active and the
standby earliest offsets) while the stream partitions are paused and the changelogs are
quiet: a worker joining a group started its standby copies about 4.7 s after its
assignment (each look-up 1.5 s), against 0.35 s with a 200 ms poll.

`FETCH_MAX_WAIT_MS` bounds that wait. The cost is more fetch requests while every
partition is idle (at most 1000 / FETCH_MAX_WAIT_MS a second); while markers flow the
fetches return with them anyway.

The consumer's message loop (`QuickPollConsumer._drain_messages`) is Faust's, but for
how it hands a message to its callback (the conductor: into a stream's or the changelog
queue). Faust races each message's callback against the consumer's `suspend_flow`
(set at a rebalance), its stop and its crash (`Service.wait_first`): four tasks, an
`asyncio.wait` and three cancellations per message, whether or not the callback ever
waits. A standby copy reads every changelog record of its peers' partitions one message
at a time, so this was most of its event-loop time per record (a py-spy profile of a
2-worker run: `wait_first` and the tasks it starts about 40% of the event loop's busy
samples, the conductor's own work 13%). Here the callback runs at once up to its first
suspension, as the task Faust creates would run it first (`deliver`, in a copy of the
context, as a task's step is); only a callback that suspends (a full queue, a flow
paused by a rebalance, a full producer buffer) goes through Faust's race, which then
resumes the same coroutine where it stopped (`Resumed`). What the race decides is
unchanged: a callback that does not suspend runs to its end in Faust's loop too (its
task's first step runs before the race is looked at), and one that does is raced and
cancelled exactly as there. The messages are handed over one after the other, in the
order Faust's loop hands them over. What differs is when other tasks run: Faust's loop
gives them the event loop at every message, this one every 100 messages (Faust's own
`yield_every`, kept) and whenever a callback waits, as a busy agent step of a few
milliseconds does anyway; a rebalance's callbacks (from the consumer thread, through
the event loop) may so begin a few messages later.

A changelog record takes a shorter way still (`ChangelogConductor`, `ChangelogHandler`).
Faust's conductor hands a changelog record to the table manager's changelog queue by the
same per-message coroutine as a timeline record: its lock, the flow control, the producer
buffer's check, the schema's decode into an event, the queue. For a partition whose only
channel is that queue's, with raw bytes keys and values (the decode returns the record's
own key and value: `changelog_handler`), the loop first asks `ChangelogConductor.take_now`,
which makes those checks without awaiting and, when none of them would wait, puts the
event Faust would have built into the queue at once: the same event, the same queue, the
same reference count, pressure callbacks that do what Faust's do, in the same order (they
are the handler's own: while the queue is under pressure, Faust's monitor may count a
partition's full buffer once for each). When one of them would
wait (the lock held or awaited, the flow suspended, the producer buffer over its size, the
queue full), nothing has been done yet and the message goes through Faust's handler, from
its start, as before. A standby copy reads only such records (a py-spy profile of the
joining worker of a 2-worker run: the conductor's coroutine and the decode about 22% of
the event loop's busy samples).

Seek back. Around a rebalance Faust's consumer drops records it fetched (those of a batch
still being handed over when the generation changed or the flow was suspended, and those
of a partition paused meanwhile), and relies on the seek that ends each rebalance's
recovery (`seek_to_committed`) to read them again. aiokafka's seek_to_committed seeks
only a partition whose committed offset is above 0: one the group has never committed
stays where the fetch left it, past the dropped records. The agent's gap guard
(acks.GapGuard) re-reads such records when a later one of the partition arrives, but a
partition that receives none (the units topic once its input stops) kept them unapplied
and its commit at 0 for good (the small unit campaign caught it: a drain waited 180 s on
a units partition never committed). `QuickPollConsumer.seek_to_committed` seeks those
partitions to offset 0, where the group starts when it has committed nothing (or the log's
start: `consumer_auto_offset_reset="earliest"`), on the consumer thread as Faust's
recovery seeks; what is read again is applied again, a no-op (each stage skips an offset
it applied), and acknowledged.

Private names used (listed in upstream.py; tests/stream/test_transport.py checks how
they are used): `faust.App._new_transport`, `Consumer._new_consumer_thread`,
`AIOKafkaConsumerThread._create_worker_consumer`, and aiokafka's
`AIOKafkaConsumer._fetch_max_wait_ms`, read when the consumer starts; Faust's
`Consumer._drain_messages` (overridden) and what it reads: `Consumer._read_offset`
(set by the seek too), `ThreadDelegateConsumer._thread` (the consumer thread),
`_commit_every`, `_n_acked`, `_add_gap` and mode's `Service._stopped`; Faust's
`Conductor._build_handler` (extended), `_tp_to_callback`, `_tp_to_callback_lock`
(read), asyncio's `Lock._waiters` and the producer buffer's `pending` queue (read).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine, Generator, Mapping
from typing import Any, Final

import aiokafka
import faust
from faust.transport import conductor as faust_conductor
from faust.transport import consumer as faust_consumer
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from faust.types.auth import CredentialsT

from processor.stream.kafka import kafka_io
from processor.stream.model.config import Settings

#: The longest a fetch waits for records the broker does not have yet, in ms.
FETCH_MAX_WAIT_MS: Final = 250


class QuickPollConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's consumer thread, its aiokafka consumer polling at most FETCH_MAX_WAIT_MS."""

    #: Faust names a service's logger after its module: kept as it was before the
    #: worker package, so that log lines keep their logger names.
    logger = logging.getLogger("processor.stream.transport")

    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS  # the Fetcher is built from it
        return consumer


class Resumed:
    """The rest of a coroutine that suspended at its first step, as an awaitable: it
    hands the awaiting task what the coroutine yielded (the future it waits on) and
    forwards every send and throw to the coroutine, each in the coroutine's context, as
    the coroutine's own task would (`yield from` with a context)."""

    __slots__ = ("_context", "_coro", "_yielded")

    def __init__(self, coro: Coroutine[Any, Any, Any], yielded: Any,
                 context: contextvars.Context) -> None:
        self._coro = coro
        self._yielded = yielded
        self._context = context

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, run, yielded = self._coro, self._context.run, self._yielded
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown in by the task (a cancellation): forward
                try:
                    yielded = run(coro.throw, exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = run(coro.send, sent)
                except StopIteration as stop:
                    return stop.value


def deliver(step: Coroutine[Any, Any, Any]) -> Resumed | None:
    """Run `step` up to its first suspension in a copy of the current context (as a task
    created now would run its first step): None if it ran to its end (its exception, if
    it raised one, propagates), else the rest of it (`Resumed`)."""
    context = contextvars.copy_context()
    try:
        yielded = context.run(step.send, None)
    except StopIteration:
        return None
    return Resumed(step, yielded, context)


class QuickPollConsumer(faust_aiokafka.Consumer):
    """Faust's aiokafka consumer on `QuickPollConsumerThread`, its message loop handing
    each message to its callback without a task unless the callback suspends (the
    module doc)."""

    #: Faust names a service's logger after its module: kept as it was before the
    #: worker package, so that log lines keep their logger names.
    logger = logging.getLogger("processor.stream.transport")

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return QuickPollConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def seek_to_committed(self) -> Mapping[TP, int]:
        """Faust's seek of every assigned partition to the group's committed offset, and
        of each stream partition that has none (or 0) to its first offset (module doc,
        "Seek back"). Returns the committed offsets, as Faust's does."""
        committed = await super().seek_to_committed()
        is_stream = self.app.topics.acks_enabled_for  # agents' topics, not changelogs
        thread = self._thread

        async def seek_start(tp: TP) -> None:
            thread.seek(tp, 0)

        for tp, offset in committed.items():
            # aiokafka's answer holds None where nothing is committed (Faust types it int).
            if (offset is not None and offset > 0) or not is_stream(tp.topic):
                continue  # sought by aiokafka, or the recovery's
            # Offset 0, not aiokafka's seek_to_beginning, which waits for the partition's
            # reset and so for a paused partition's resumption: Faust's fetch loop calls
            # this while the flow is stopped. Below the log's start the fetch resets to
            # it (auto_offset_reset "earliest").
            # On the consumer thread, as Faust's own recovery seeks (`seek_wait`): aiokafka's
            # seek wakes its fetcher through a future of that thread's event loop, which
            # only that thread may complete.
            try:
                await thread.call_thread(seek_start, tp)
            except aiokafka.errors.IllegalStateError:
                continue  # no longer assigned: the next assignment's seek is its own
            self._read_offset[faust_consumer.ensure_TP(tp)] = None  # Faust's seek of 0
        return committed

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover
        """Faust's `Consumer._drain_messages` (faust-streaming 0.15.3) line for line, but
        for the callback: `deliver` first, Faust's `wait_first` race only for a callback
        that suspended (the loop itself in `_drain`)."""
        try:
            await self._drain(fetcher)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                # we're already stopping so ignore
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                # we're already stopping so ignore
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception as exc:
            self.log.exception("Drain messages raised: %r", exc)
            raise
        finally:
            self.diag.unset_flag(faust_consumer.CONSUMER_FETCHING)

    async def _drain(self, fetcher: Any) -> None:  # pragma: no cover
        """The loop of Faust's `_drain_messages`: fetch, hand each message over."""
        callback = self.callback
        getmany = self.getmany
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set

        get_read_offset = self._read_offset.__getitem__
        set_read_offset = self._read_offset.__setitem__
        flag_consumer_fetching = faust_consumer.CONSUMER_FETCHING
        set_flag = self.diag.set_flag
        unset_flag = self.diag.unset_flag
        commit_every = self._commit_every
        acks_enabled_for = self.app.topics.acks_enabled_for
        take_now = getattr(self.app.topics, "take_now", None)

        yield_every = 100
        num_since_yield = 0
        sleep = asyncio.sleep

        while not (consumer_should_stop() or fetcher_should_stop()):
            set_flag(flag_consumer_fetching)
            ait = getmany(timeout=1.0)

            # Sleeping because sometimes getmany is called in a loop
            # never releasing to the event loop (asyncio's sleep(0), one bare yield:
            # mode's Service.sleep(0) made a task and cancelled it, per fetch)
            await sleep(0)
            if not self.should_stop:
                async for tp, message in ait:
                    num_since_yield += 1
                    if num_since_yield > yield_every:
                        await sleep(0)
                        num_since_yield = 0

                    offset = message.offset
                    r_offset = get_read_offset(tp)
                    if r_offset is None or offset >= r_offset:
                        gap = offset - (r_offset or 0)
                        # We have a gap in income messages
                        if gap > 1 and r_offset:
                            acks_enabled = acks_enabled_for(message.topic)
                            if acks_enabled:
                                await self._add_gap(tp, r_offset + 1, offset)
                        if commit_every is not None and self._n_acked >= commit_every:
                            self._n_acked = 0
                            await self.commit()
                        if take_now is None or not take_now(message):
                            step = callback(message)
                            rest = deliver(step) if asyncio.iscoroutine(step) else step
                            if rest is not None:
                                await self.wait_first(rest, self.suspend_flow.wait())
                        set_read_offset(tp, offset)
                    else:
                        # Faust's line named the record's key and value: raw input
                        # never goes to a log here, at any level (operator-channels.md)
                        self.log.dev("DROPPED MESSAGE ROFF %r: %r", offset, tp)
                unset_flag(flag_consumer_fetching)


class ChangelogHandler:
    """Faust's handler of one changelog partition (`faust_handler`, awaited as before),
    and `now`: the same hand-over done at once when nothing in it would wait."""

    __slots__ = ("faust_handler", "now")

    def __init__(self, faust_handler: Any, now: Any) -> None:
        self.faust_handler = faust_handler
        #: (message) -> bool: True if the message is in the queue (the module doc).
        self.now = now

    def __call__(self, message: Any) -> Any:
        return self.faust_handler(message)


def changelog_handler(app: Any, tp: Any, channels: Any, faust_handler: Any
                      ) -> ChangelogHandler | None:
    """A `ChangelogHandler` for `tp` if its only channel is the table manager's changelog
    queue's and decodes raw bytes (key and value as the record has them), else None.

    Faust's handler (`ConductorCompiler.build`, faust-streaming 0.15.3) for one channel,
    when nothing waits: flow control acquired (not suspended), the producer buffer at or
    below its size, the message's reference count up by one, the schema's decode
    (`Schema.compile`: the raw codec and the `bytes` type give the record's own key and
    value, a missing key or value None either way), `app.create_event` (its event class
    read once), the queue not full, then
    `put_nowait_enhanced` with its pressure callbacks (the sensor and the consumer's
    buffer-full, buffer-drop of `tp`)."""
    if len(channels) != 1:
        return None
    (chan,) = channels
    tables = getattr(app, "tables", None)
    if tables is None or chan.queue is not tables.changelog_queue:
        return None
    schema, serializers = chan.schema, app.serializers
    if schema is None:
        return None
    key_codec = schema.key_serializer or serializers.key_serializer
    value_codec = serializers._serializer(schema.value_type, schema.value_serializer,
                                          serializers.value_serializer)
    if (schema.key_type, schema.value_type, key_codec, value_codec) != (
            bytes, bytes, "raw", "raw"):
        return None
    flow_active = app.flow_control.is_active
    buffer = app.producer.buffer
    threaded = bool(app.conf.producer_threaded)
    queue = chan.queue
    full = queue.full
    put = queue.put_nowait_enhanced
    # `App.create_event` is `conf.Event(app, key, value, headers, message)`; the setting
    # is read once here (a settings lookup per record was a third of this hand-over)
    make_event = app.conf.Event
    on_topic_buffer_full = app.sensors.on_topic_buffer_full
    consumer = app.consumer
    consumer_on_buffer_full = consumer.on_buffer_full
    consumer_on_buffer_drop = consumer.on_buffer_drop

    def on_pressure_high() -> None:
        on_topic_buffer_full(tp)
        consumer_on_buffer_full(tp)

    def on_pressure_drop() -> None:
        consumer_on_buffer_drop(tp)

    def buffered() -> int:  # ProducerBuffer.size, its setting read once
        pending = buffer.queue if threaded else buffer.pending
        return 0 if pending is None else pending.qsize()

    def now(message: Any) -> bool:
        if len(channels) != 1:  # a channel added since (Faust's handler reads the set)
            return False
        if not flow_active() or buffered() > buffer.max_messages or full():
            return False
        message.incref(1)
        put(make_event(app, message.key, message.value, message.headers, message),
            on_pressure_high=on_pressure_high, on_pressure_drop=on_pressure_drop)
        return True

    return ChangelogHandler(faust_handler, now)


class ChangelogConductor(faust_conductor.Conductor):
    """Faust's conductor whose changelog partitions' handlers can hand a record over at
    once (`take_now`, the module doc)."""

    def _build_handler(self, tp: Any, channels: Any) -> Any:
        handler = super()._build_handler(tp, channels)
        return changelog_handler(self.app, tp, channels, handler) or handler

    def take_now(self, message: Any) -> bool:
        """Hand `message` over now if its partition's handler is a `ChangelogHandler` and
        nothing would wait (True), else leave it to Faust's `on_message` (False)."""
        lock = self._tp_to_callback_lock
        if lock.locked() or lock._waiters:  # on_message would wait for the lock
            return False
        handler = self._tp_to_callback.get(message.tp)
        if type(handler) is not ChangelogHandler:
            return False
        return bool(handler.now(message))


class QuickPollTransport(faust_aiokafka.Transport):
    """Faust's aiokafka transport with `QuickPollConsumer` and `ChangelogConductor`
    (what WorkerApp uses)."""

    Consumer = QuickPollConsumer
    Conductor = ChangelogConductor


def faust_credentials(settings: Settings) -> CredentialsT | None:
    """Faust's credentials for the configured protocol (None for PLAINTEXT)."""
    sec = settings.security
    ctx = kafka_io.ssl_context(settings)
    if sec.security_protocol.startswith("SASL"):
        return faust.SASLCredentials(username=sec.sasl_username, password=sec.sasl_password,
                                     mechanism=sec.sasl_mechanism, ssl_context=ctx)
    if ctx is not None:
        return faust.SSLCredentials(ctx)
    return None


def broker_urls(settings: Settings) -> list[str]:
    """The bootstrap servers as Faust broker URLs."""
    return [f"kafka://{s.strip()}" for s in settings.bootstrap_servers.split(",")
            if s.strip()]


def raw_topic(app: faust.App, name: str, partitions: int | None = None) -> faust.TopicT:
    """A topic of raw bytes keys and values (our records carry their own encoding)."""
    return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw",
                     value_serializer="raw", partitions=partitions)
