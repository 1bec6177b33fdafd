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

Private names used (listed in upstream.py; tests/stream/test_transport.py checks how
they are used): `faust.App._new_transport`, `Consumer._new_consumer_thread`,
`AIOKafkaConsumerThread._create_worker_consumer`, and aiokafka's
`AIOKafkaConsumer._fetch_max_wait_ms`, read when the consumer starts.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import aiokafka
import faust
from faust.transport.drivers import aiokafka as faust_aiokafka
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


class QuickPollConsumer(faust_aiokafka.Consumer):
    """Faust's aiokafka consumer on `QuickPollConsumerThread`."""

    #: Faust names a service's logger after its module: kept as it was before the
    #: worker package, so that log lines keep their logger names.
    logger = logging.getLogger("processor.stream.transport")

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return QuickPollConsumerThread(self, loop=self.loop, beacon=self.beacon)


class QuickPollTransport(faust_aiokafka.Transport):
    """Faust's aiokafka transport with `QuickPollConsumer` (what WorkerApp uses)."""

    Consumer = QuickPollConsumer


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
