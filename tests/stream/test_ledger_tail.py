"""The worker's ledger read at each assignment (worker/ledger_tail.py) on a broker: it
reads what was written since the start's read, only that, and again what a failed read
missed."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from processor.stream.kafka import kafka_io
from processor.stream.worker.ledger_tail import LedgerTail

pytestmark = pytest.mark.kafka


def entry(counter: str, creation: str) -> bytes:
    return orjson.dumps({"counter": counter, "entry": "created", "creation": creation})


def test_the_tail_reads_what_was_announced_since_the_start(
        kafka_bootstrap: str, unique_topic: Callable[[str], str]) -> None:
    topic = unique_topic("ledger-tail")
    conf = {"bootstrap.servers": kafka_bootstrap}
    kafka_io.create_topics(conf, [topic], 2)
    kafka_io.produce_all(conf, topic, [(b"a", entry("a", "t1"))], partition=0)
    ends = {p: hi for p, (_lo, hi) in kafka_io.end_offsets(conf, topic).items()}
    assert ends == {0: 1, 1: 0}  # the start's read ended here

    tail = LedgerTail(conf, topic, ends, timeout_s=30.0)
    assert tail.read() == {}  # nothing since the start
    kafka_io.produce_all(conf, topic, [(b"b", entry("b", "t2")), (None, b"not json")],
                         partition=1)
    kafka_io.produce_all(conf, topic, [(b"a", entry("a", "t3"))], partition=0)
    assert tail.read() == {"a": frozenset({"t3"}), "b": frozenset({"t2"})}
    assert tail.read() == {}  # read once

    # Control: a tail from no position reads the whole ledger, the start's part too.
    whole = LedgerTail(conf, topic, {}, timeout_s=30.0)
    assert whole.read() == {"a": frozenset({"t1", "t3"}), "b": frozenset({"t2"})}


def test_a_failed_read_is_read_again(kafka_bootstrap: str,
                                     unique_topic: Callable[[str], str]) -> None:
    """A read that raises (here: the topic does not exist yet) keeps the position."""
    topic = unique_topic("ledger-tail-missing")
    conf = {"bootstrap.servers": kafka_bootstrap}
    tail = LedgerTail(conf, topic, {0: 0}, timeout_s=5.0)
    with pytest.raises((RuntimeError, TimeoutError)):
        tail.read()
    kafka_io.create_topics(conf, [topic], 1)
    kafka_io.produce_all(conf, topic, [(b"a", entry("a", "t1"))], partition=0)
    assert tail.read() == {"a": frozenset({"t1"})}
