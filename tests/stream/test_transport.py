"""The worker's aiokafka transport (processor/stream/worker/transport.py): its consumer polls
idle partitions for at most FETCH_MAX_WAIT_MS, and the private names it relies on have
the shape it was checked against (these tests fail when an upgrade changes them)."""

from __future__ import annotations

import asyncio
import inspect

import aiokafka
from faust.transport.drivers import aiokafka as faust_aiokafka

from processor.stream.worker import transport
from processor.stream.worker.app import WorkerApp


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
