"""The ingest stage: routing of a consumed batch (pure) and at-least-once on a real broker.

Pure: valid events grouped by timeline partition in read order, one batch record per
partition, split by count and by size without reordering; every rejected record, and every
record whose handling raises, dead-lettered with a reason and its raw bytes (a record is
never lost); the offsets to commit. Broker: the stage alone as a child process, SIGKILLed
after a batch was delivered but before its input offsets were committed, then restarted:
every valid input record is on the timeline (the killed batch twice), the "\\ud800"
counter is in the dead-letter topic, and the group ends committed at the end of the input.
"""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from processor.devtools.deployment import write_config
from processor.stream.kafka import ingest, kafka_io
from processor.stream.kafka.ingest import InputRecord, committable, route
from processor.stream.model.config import Settings, TopicSettings, with_overrides
from processor.stream.model.families import OpenFamily
from processor.stream.model.records import (
    REASONS,
    USER_MODE_REASONS,
    Event,
    Rejection,
    TimelineBatch,
    decode_timeline,
    encode_batch,
    parse_input,
    partition_for,
)

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000_000
START = NOW - 60_000
LONE_SURROGATE = b'{"counter":"\\ud800","ts":%d}' % NOW


def _settings(**kw: Any) -> Settings:
    fields: dict[str, Any] = dict(counters={"a": START, "b": START, "c": START}, tick_ms=100,
                                  partitions=3, max_future_ms=10_000)
    fields.update(kw)
    return with_overrides(Settings(), **fields)


def _valid(counter: str, i: int) -> bytes:
    return orjson.dumps({"counter": counter, "ts": NOW - i, "value": (i % 3) / 2})


def _bad(now: int) -> dict[str, bytes]:
    """One input record for every dead-letter reason."""
    return {
        "unparsable": b"\xff\xfe this is not json",
        "schema_violation": orjson.dumps({"counter": "a", "ts": now, "colour": "red"}),
        "value_out_of_range": orjson.dumps({"counter": "a", "ts": now, "value": 1.5}),
        "value_not_finite": b'{"counter": "a", "ts": %d, "value": NaN}' % now,
        "undeclared_counter": orjson.dumps({"counter": "nobody-declared-me", "ts": now}),
        "timestamp_missing": orjson.dumps({"counter": "a", "value": 1}),
        "timestamp_too_far_in_future": orjson.dumps({"counter": "a", "ts": now + 600_000}),
        "before_start": orjson.dumps({"counter": "a", "ts": START - 5_000}),
        "invalid_unit": orjson.dumps({"counter": "a", "ts": now, "user": ["x"]}),
        # An open family's event without a key, and with a key too long.
        "key_missing": orjson.dumps({"counter": "pages", "ts": now}),
        "invalid_key": orjson.dumps({"counter": "pages", "ts": now, "key": "k" * 129}),
    }


def _events(timeline: list[tuple[int, bytes]]) -> dict[int, list[Event]]:
    """Timeline partition -> its events, records concatenated in order."""
    out: dict[int, list[Event]] = {}
    for tp, data in timeline:
        rec = decode_timeline(data)
        assert isinstance(rec, TimelineBatch)
        out.setdefault(tp, []).extend(rec.events)
    return out


def test_route_groups_by_partition_in_read_order() -> None:
    """Two input partitions interleaved: one batch record per timeline partition, each
    holding exactly its counters' events, in read order (so one input partition's offsets
    only increase within a timeline partition), each event with its input coordinates.
    Control: the routing matches partition_for, and parse_input on each record."""
    s = _settings()
    recs = [InputRecord(i % 2, 100 + i // 2, _valid("abc"[i % 3], i)) for i in range(60)]
    routed = route(recs, s, NOW)
    assert routed.deadletters == []
    assert len(routed.timeline) == len({tp for tp, _ in routed.timeline})
    got = _events(routed.timeline)
    want: dict[int, list[Event]] = {}
    for r in recs:
        ev = parse_input(r.value, s, NOW, r.partition, r.offset)
        assert isinstance(ev, Event)
        want.setdefault(partition_for(ev.counter, s.partitions), []).append(ev)
    assert got == want
    for evs in got.values():
        for p in (0, 1):
            offsets = [e.src_offset for e in evs if e.src_partition == p]
            assert offsets == sorted(offsets)
    assert routed.metrics["ingested"] == 60
    assert routed.metrics["timeline_batches"] == len(routed.timeline)


def test_route_splits_by_count_and_by_size_without_reordering() -> None:
    """A partition's events split into records of <= max_events events and <= max_bytes
    bytes, concatenating back to the same sequence. Control: without limits, one record."""
    s = _settings(counters={"x" * 150: START}, partitions=1)
    recs = [InputRecord(0, i, _valid("x" * 150, i)) for i in range(50)]
    whole = route(recs, s, NOW)
    assert len(whole.timeline) == 1
    by_count = route(recs, s, NOW, max_events=7)
    assert [len(_events([r])[0]) for r in by_count.timeline] == [7] * 7 + [1]
    by_size = route(recs, s, NOW, max_bytes=2_000)
    assert len(by_size.timeline) > 4
    assert all(len(data) <= 2_000 for _, data in by_size.timeline)
    assert _events(by_count.timeline) == _events(by_size.timeline) == _events(whole.timeline)


def test_every_bad_record_is_dead_lettered_with_its_reason_and_bytes() -> None:
    """Every reason, plus a counter named by a lone surrogate: one dead
    letter each, with its reason, raw bytes and input coordinates; valid events around
    them are routed. Nothing is lost: events + dead letters = records."""
    s = _settings(allow_undeclared=False, families={"pages": OpenFamily(START, 1e-7)})
    bad = _bad(NOW)
    keyed = orjson.dumps({"counter": "pages", "ts": NOW, "key": "/home"})
    raws = [_valid("a", 1), *bad.values(), LONE_SURROGATE, _valid("b", 2), keyed]
    recs = [InputRecord(0, i, raw) for i, raw in enumerate(raws)]
    routed = route(recs, s, NOW)
    dead = [orjson.loads(d) for d in routed.deadletters]
    assert sorted(d["reason"] for d in dead) == sorted(
        [*(set(REASONS) - set(USER_MODE_REASONS)), "schema_violation"])
    for d in dead:
        raw = base64.b64decode(d["raw"])
        assert (d["topic"], d["partition"], d["offset"]) == (s.topics.input, 0,
                                                             raws.index(raw))
    routed_events = [e for v in _events(routed.timeline).values() for e in v]
    assert sorted(e.counter for e in routed_events) == ["a", "b", "pages[/home]"]
    assert len(dead) + 3 == len(recs)
    # With undeclared counters allowed, the surrogate is still rejected (not encodable).
    loose = route([InputRecord(0, 0, LONE_SURROGATE)], _settings(allow_undeclared=True), NOW)
    assert [orjson.loads(d)["reason"] for d in loose.deadletters] == ["schema_violation"]
    assert loose.timeline == []


def test_a_record_whose_handling_raises_is_dead_lettered_not_lost(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A parse that raises, and an event the batch encoder cannot encode: each such record
    becomes a schema_violation dead letter naming the exception type only; every other
    event of the batch still reaches the timeline, in order. Control: the same batch
    without the faults routes every record."""
    s = _settings(partitions=1)
    recs = [InputRecord(0, i, _valid("abc"[i % 3], i)) for i in range(12)]

    def flaky_parse(raw: bytes, settings: Settings, now_ms: int, partition: int,
                    offset: int) -> Event | Rejection:
        if offset == 4:
            raise RuntimeError("secret-value-in-message")
        return parse_input(raw, settings, now_ms, partition, offset)

    real_encode = encode_batch  # the object ingest imported; the patch goes on ingest's name

    def picky_encode(events: Any, source: str = "") -> bytes:
        if any(e.src_offset == 9 for e in events):
            raise ValueError("cannot encode")
        return real_encode(events, source)

    monkeypatch.setattr(ingest, "encode_batch", picky_encode)
    routed = route(recs, s, NOW, parse=flaky_parse)
    dead = [orjson.loads(d) for d in routed.deadletters]
    assert [(d["offset"], d["reason"]) for d in dead] == [(4, "schema_violation"),
                                                          (9, "schema_violation")]
    assert "RuntimeError" in dead[0]["detail"] and "secret" not in dead[0]["detail"]
    assert "ValueError" in dead[1]["detail"]
    assert [e.src_offset for e in _events(routed.timeline)[0]] == [
        i for i in range(12) if i not in (4, 9)]
    monkeypatch.setattr(ingest, "encode_batch", real_encode)
    assert sum(len(v) for v in _events(route(recs, s, NOW).timeline).values()) == 12


def test_committable_offsets() -> None:
    recs = [InputRecord(0, 5, b""), InputRecord(1, 2, b""), InputRecord(0, 7, b""),
            InputRecord(1, 3, b"")]
    assert committable(recs) == {0: 8, 1: 4}
    assert committable([]) == {}


# --------------------------------------------------------------------------- broker


def _ingest_proc(cfg: Path, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "processor.stream.kafka.ingest", "--config", str(cfg),
             "--max-consume", "400"],
            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(ROOT),
            env=env)


def _wait_committed(conf: dict[str, str], group: str, topic: str, timeout_s: float,
                    proc: subprocess.Popen[bytes], log: Path) -> None:
    end = {p: hi for p, (_lo, hi) in kafka_io.end_offsets(conf, topic).items()}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        done = kafka_io.committed_offsets(conf, group, topic)
        if all(done.get(p, 0) >= hi for p, hi in end.items()):
            return
        time.sleep(0.3)  # polling interval of a deadline loop
    raise AssertionError("ingest did not commit the whole input in time:\n"
                         + log.read_text(errors="replace")[-3000:])


@pytest.mark.kafka
def test_ingest_at_least_once_across_a_kill(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The stage alone (its own process, batches of 400), SIGKILLed right after the 3rd
    batch was acknowledged by the broker and before its input offsets were committed, then
    restarted: every valid input record is on the timeline at least once, in its counter's
    partition, and only the killed batch's records twice; the bad records (the lone
    surrogate among them) are in the dead-letter topic with their reasons; the group ends
    committed at the end of the input; the log carries no record and no traceback."""
    uid = hashlib.sha256(f"{tmp_path}{time.time_ns()}".encode()).hexdigest()[:10]
    topics = TopicSettings(input=f"ing-in-{uid}", timeline=f"ing-tl-{uid}",
                           counts=f"ing-counts-{uid}", ledger=f"ing-ledger-{uid}",
                           deadletter=f"ing-dead-{uid}")
    now = int(time.time() * 1000)
    start = (now // 100) * 100 - 60_000
    counters = {f"k{i}": start for i in range(20)}
    s = with_overrides(Settings(), app_id=f"ing-{uid}", bootstrap_servers=kafka_bootstrap,
                       topics=topics, partitions=3, tick_ms=100, max_future_ms=600_000,
                       counters=counters, allow_undeclared=True)
    conf = kafka_io.base_config(s)
    kafka_io.create_topics(conf, [topics.input, topics.timeline, topics.deadletter], 3)
    cfg = write_config(s, tmp_path / "ingest.toml")
    bad = [LONE_SURROGATE.replace(b"%d" % NOW, b"%d" % now), b"not json",
           orjson.dumps({"counter": "k1", "ts": now, "value": 2})]
    valid = [orjson.dumps({"counter": f"k{i % 20}", "ts": now + i}) for i in range(3000)]
    kafka_io.produce_all(conf, topics.input, [(None, v) for v in bad], partition=0)
    kafka_io.produce_all(conf, topics.input, [(b"%d" % i, v) for i, v in enumerate(valid)])

    log = tmp_path / "ingest.log"
    env = dict(os.environ, DPC_TEST_CRASH_AT="ingest_delivered:3")
    first = _ingest_proc(cfg, log, env)
    try:
        code = first.wait(120)
    finally:
        if first.poll() is None:
            first.kill()
    assert code == -signal.SIGKILL, log.read_text(errors="replace")[-3000:]
    env.pop("DPC_TEST_CRASH_AT")
    second = _ingest_proc(cfg, log, env)
    try:
        _wait_committed(conf, f"{s.app_id}-ingest", topics.input, 120, second, log)
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        if second.poll() is None:
            second.kill()

    inputs = {(r.partition, r.offset): r.value or b""
              for r in kafka_io.iter_topic(conf, topics.input)}
    timeline = kafka_io.read_topic(conf, topics.timeline)
    seen: Counter[tuple[int, int]] = Counter()
    for tp, recs in timeline.items():
        for r in recs:
            rec = decode_timeline(r.value or b"")
            assert isinstance(rec, TimelineBatch)
            for e in rec.events:
                assert partition_for(e.counter, s.partitions) == tp
                assert orjson.loads(inputs[(e.src_partition, e.src_offset)])["counter"] == \
                    e.counter
                seen[(e.src_partition, e.src_offset)] += 1
    valid_set = set(valid)
    valid_coords = {c for c, v in inputs.items() if v in valid_set}
    assert set(seen) == valid_coords  # every valid record, nothing else
    twice = [c for c, n in seen.items() if n > 1]
    assert 0 < len(twice) <= 400 and max(seen.values()) == 2
    dead = [orjson.loads(r.value or b"") for r in kafka_io.iter_topic(conf, topics.deadletter)]
    letters = Counter((d["reason"], base64.b64decode(d["raw"])) for d in dead)
    assert set(letters) == {("schema_violation", bad[0]), ("unparsable", bad[1]),
                            ("value_out_of_range", bad[2])}
    assert max(letters.values()) <= 2  # twice only if they were in the killed batch
    text = log.read_text(errors="replace")
    assert "ud800" not in text and "Traceback" not in text


@pytest.mark.kafka
def test_ingest_failure_commits_nothing_and_reports(kafka_bootstrap: str) -> None:
    """A batch that cannot be delivered (the configuration says 3 timeline partitions, the
    topic has 1, so events of partitions 1 and 2 have nowhere to go): the loop stops on its
    own, reports the failure type to `on_failure` (the worker then stops), and commits no
    input offset, so the next start re-reads everything. Control: the same input with a
    matching topic is delivered and committed."""
    import threading

    uid = hashlib.sha256(str(time.time_ns()).encode()).hexdigest()[:10]

    def settings(tag: str, partitions: int) -> Settings:
        t = TopicSettings(input=f"fail-in-{tag}-{uid}", timeline=f"fail-tl-{tag}-{uid}",
                          counts=f"fail-counts-{tag}-{uid}",
                          ledger=f"fail-ledger-{tag}-{uid}",
                          deadletter=f"fail-dead-{tag}-{uid}")
        s = with_overrides(Settings(), app_id=f"fail-{tag}-{uid}",
                           bootstrap_servers=kafka_bootstrap, topics=t, partitions=3,
                           counters={f"k{i}": 0 for i in range(12)}, max_future_ms=600_000)
        conf = kafka_io.base_config(s)
        kafka_io.create_topics(conf, [t.input, t.deadletter], 1)
        kafka_io.create_topics(conf, [t.timeline], partitions)
        now = int(time.time() * 1000)
        kafka_io.produce_all(conf, t.input, [(None, orjson.dumps({"counter": f"k{i}",
                                                                  "ts": now}))
                                             for i in range(12)])
        return s

    for tag, partitions in (("bad", 1), ("good", 3)):
        s = settings(tag, partitions)
        failed = threading.Event()
        reported: list[BaseException] = []

        def on_failure(exc: BaseException, reported: list[BaseException] = reported,
                       failed: threading.Event = failed) -> None:
            reported.append(exc)
            failed.set()

        stage = ingest.Ingest(s, on_failure=on_failure, delivery_timeout_s=20.0)
        stage.start()
        conf = kafka_io.base_config(s)
        try:
            if tag == "bad":
                assert failed.wait(60), "the ingest loop did not report its failure"
                stage.stop()
                assert stage.failure is reported[0]
                assert kafka_io.committed_offsets(conf, f"{s.app_id}-ingest",
                                                  s.topics.input) == {0: 0}
            else:
                deadline = time.monotonic() + 60
                while kafka_io.committed_offsets(conf, f"{s.app_id}-ingest",
                                                 s.topics.input) != {0: 12}:
                    assert time.monotonic() < deadline and not failed.is_set(), reported
                    time.sleep(0.2)  # polling interval of a deadline loop
                stage.stop()
                assert stage.failure is None and stage.metrics()["ingested"] == 12
        finally:
            stage.stop()
