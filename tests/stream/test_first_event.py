"""The first event of a counter does not leak through public timing,
against the real broker and worker.

Two declared counters `a` and `b` start at the same future tick. One event for `a`, stamped
inside that tick, reaches the timeline long before the marker that seals the tick. The
ledger entries of both counters must then be appended after that marker, together and in
name order: the existence, order and timing of a public record depend on markers and the
public configuration, never on an event before the marker that seals its tick. (The old
operator created `a`, and sent its ledger entry, at the event.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from processor.stream.kafka import kafka_io
from processor.stream.model.records import TimelineBatch, TimelineMarker, decode_timeline


@dataclass(frozen=True)
class Appended:
    """A public record as the check sees it: counter, topic offset, append time (ms)."""

    counter: str
    offset: int
    timestamp_ms: int


def announcement_violations(ledger: Sequence[Appended], sealing_marker_ms: int,
                            counters: Sequence[str], tick_ms: int) -> list[str]:
    """What is wrong with the ledger entries of `counters`, whose start tick was sealed by
    a marker appended at `sealing_marker_ms`: each counter announced once, none before that
    marker, in name order on consecutive offsets, all within one tick of each other."""
    problems: list[str] = []
    names = [r.counter for r in ledger]
    if sorted(names) != sorted(counters):
        problems.append(f"ledger lists {names}, expected each of {sorted(counters)} once")
    early = [r.counter for r in ledger if r.timestamp_ms < sealing_marker_ms]
    if early:
        problems.append(f"announced before the sealing marker: {early}")
    ordered = sorted(ledger, key=lambda r: r.offset)
    if [r.counter for r in ordered] != sorted(counters):
        problems.append(f"not in name order: {[r.counter for r in ordered]}")
    offsets = [r.offset for r in ordered]
    if offsets and offsets != list(range(offsets[0], offsets[0] + len(offsets))):
        problems.append(f"not on consecutive offsets: {offsets}")
    times = [r.timestamp_ms for r in ledger]
    if times and max(times) - min(times) > tick_ms:
        problems.append(f"announcements {max(times) - min(times)} ms apart (> one tick)")
    return problems


def test_the_check_rejects_the_old_announcement_at_the_event() -> None:
    """Control: the rejected order (a announced at its event, 10 s before the marker that
    sealed the start tick; b at the marker) and two other broken orders must be rejected;
    the intended behaviour must pass."""
    marker = 1_000_000
    good = [Appended("a", 7, marker + 20), Appended("b", 8, marker + 20)]
    assert announcement_violations(good, marker, ["a", "b"], 500) == []
    old = [Appended("a", 0, marker - 10_000), Appended("b", 1, marker + 20)]
    assert announcement_violations(old, marker, ["a", "b"], 500)
    swapped = [Appended("b", 7, marker + 20), Appended("a", 8, marker + 20)]
    assert announcement_violations(swapped, marker, ["a", "b"], 500)
    apart = [Appended("a", 7, marker + 20), Appended("b", 9, marker + 20)]
    assert announcement_violations(apart, marker, ["a", "b"], 500)


def _append_times(conf: dict[str, str], topic: str) -> None:
    """Set message.timestamp.type=LogAppendTime on `topic` (incrementally: its retention
    stays) and wait until the brokers report it."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    admin = kafka_io.make_admin(conf)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[ConfigEntry(
        "message.timestamp.type", "LogAppendTime",
        incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        got = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
        entries = next(iter(got.values())).result(timeout=30)
        if entries["message.timestamp.type"].value == "LogAppendTime":
            return
        assert time.monotonic() < deadline, "the brokers never reported LogAppendTime"
        time.sleep(0.2)


@pytest.mark.kafka
def test_an_event_before_the_first_seal_does_not_move_any_ledger_entry(
        deployment_factory: Callable[..., Any]) -> None:
    tick = 500
    start = (int(time.time() * 1000) // tick + 20) * tick  # about 10 s ahead
    dep = deployment_factory({"a": start, "b": start}, name="first", partitions=1,
                             tick_ms=tick, lateness_ms=500, heartbeat_ticks=10,
                             epsilon=500.0)
    # The check needs append times: the ledger's own record timestamps are the ends of
    # their ticks (public fields, records.py), so this test has the brokers stamp them.
    _append_times(dep.conf, dep.topics.ledger)
    # The event exists before the worker does: it reaches the timeline first thing.
    dep.produce([orjson.dumps({"counter": "a", "ts": start + 100})])
    dep.worker.start()
    start_tick = start // tick

    def both_announced(recs: list[kafka_io.KafkaRecord]) -> bool:
        return len(recs) >= 2

    try:
        kafka_io.wait_for(dep.conf, dep.topics.ledger, both_announced, timeout_s=120)
    except TimeoutError:
        pytest.fail("no ledger entries; worker log:\n" + dep.worker.log_tail())
    assert dep.worker.stop() == 0, dep.worker.log_tail()

    timeline = kafka_io.read_topic(dep.conf, dep.topics.timeline)[0]
    # Batches with events only: each worker start appends an empty batch (its clock probe).
    event_offsets = [r.offset for r in timeline
                     if isinstance(b := decode_timeline(r.value or b""), TimelineBatch)
                     and b.events]
    sealing = next(r for r in timeline
                   if isinstance(m := decode_timeline(r.value or b""), TimelineMarker)
                   and m.sealed_through >= start_tick)
    # Precondition: the event was on the timeline before the marker sealing its tick.
    assert event_offsets and event_offsets[0] < sealing.offset

    ledger = [Appended(str(orjson.loads(r.value or b"")["counter"]), r.offset, r.timestamp_ms)
              for r in kafka_io.iter_topic(dep.conf, dep.topics.ledger)]
    assert announcement_violations(ledger, sealing.timestamp_ms, ["a", "b"], tick) == []
