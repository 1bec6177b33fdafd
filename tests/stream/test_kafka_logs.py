"""librdkafka's own log lines go through Python logging not raw to stderr.

No broker needed: a client pointed at a closed port logs its connection failures. The
control builds the same client without the logger and sees librdkafka's raw `%3|...|FAIL|`
lines on the process's stderr, so the test can fail.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from processor.stream.kafka import kafka_io

#: A port nothing listens on (connections are refused at once).
CLOSED = {"bootstrap.servers": "127.0.0.1:9", "reconnect.backoff.ms": "50",
          "reconnect.backoff.max.ms": "100"}


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _poll_until(producer: Producer, done: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        producer.poll(0.1)


def test_client_log_lines_reach_the_rdkafka_logger_not_stderr(
        capfd: pytest.CaptureFixture[str]) -> None:
    handler = Collect()
    kafka_io.RDKAFKA_LOGGER.addHandler(handler)
    try:
        producer = kafka_io.make_producer(CLOSED)
        _poll_until(producer, lambda: any(r.levelno >= logging.WARNING
                                          for r in handler.records))
        del producer
    finally:
        kafka_io.RDKAFKA_LOGGER.removeHandler(handler)
    assert any("127.0.0.1:9" in r.getMessage() for r in handler.records), \
        [r.getMessage() for r in handler.records]
    assert "|FAIL|" not in capfd.readouterr().err


def test_control_without_the_logger_librdkafka_writes_to_stderr(
        capfd: pytest.CaptureFixture[str]) -> None:
    producer = Producer(CLOSED)
    seen: list[str] = []

    def err_seen() -> bool:
        seen.append(capfd.readouterr().err)
        return "|FAIL|" in "".join(seen)

    _poll_until(producer, err_seen)
    del producer
    assert "|FAIL|" in "".join(seen)
