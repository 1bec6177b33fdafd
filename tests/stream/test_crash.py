"""Crash tests: the worker is killed with SIGKILL while events flow, at random moments and
inside a batch commit (via the test hook DPC_TEST_CRASH_AT=<point>:<k>, see
`faults.FaultPlan` and the points named by `commit.BatchCommit`).

After every kill the worker is restarted at once. At the end the published stream must show
no lost event, no event counted twice, no (counter, tick) with two values, and values equal
to an uninterrupted run (the pure Operator replayed over the timeline).
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time
from collections.abc import Callable, Sequence

import orjson
import pytest

from processor.core.rng import NoiseKey
from processor.stream.kafka import kafka_io
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.records import Event, Release, encode_batch, encode_marker
from processor.stream.model.state import DictStore
from processor.stream.replay import ReplayReport, replay
from tests.stream.test_app_e2e import (
    Live,
    committed_prefix,
    live_factory,  # noqa: F401  (the fixture, re-exported for this module)
    now_ms,
    published_map,
    spec_expectation,
    timeline_events,
)
from tests.stream.test_metrics import free_port, get, parsed, wait_until
from tests.stream.test_metrics import value as metric_value

COUNTERS = ("a", "b", "c", "d")


def _produce_steadily(live: Live, seconds: float, seed: int, stop: threading.Event,
                      sent: list[int]) -> None:
    """About 40 events per second over `seconds`, stamped with the wall clock."""
    rng = random.Random(seed)
    producer = kafka_io.make_producer(live.conf)
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end and not stop.is_set():
        for _ in range(rng.randint(1, 3)):
            c = COUNTERS[rng.randrange(len(COUNTERS))]
            producer.produce(live.topics.input,
                             value=orjson.dumps({"counter": c, "ts": now_ms(),
                                                 "value": rng.choice((1, 1, 0.5))}))
            sent[0] += 1
        producer.poll(0)
        stop.wait(0.05)
    assert producer.flush(30) == 0


def _commit_all(settings: Settings, key: NoiseKey,
                timeline: dict[int, list[tuple[int, bytes]]]) -> tuple[list[Release], int]:
    """BatchCommit over a timeline (partition -> [(offset, value)]), one record per batch
    as the worker does; returns (releases, events applied)."""
    async def run() -> tuple[list[Release], int]:
        publisher = CollectingSink()
        commit = BatchCommit(Operator(settings, key), DictStore(), publisher)
        applied = 0
        for p, rs in sorted(timeline.items()):
            for offset, value in rs:
                out = await commit.commit(p, [(offset, value)])
                applied += out.metrics.get("events_applied", 0)
        return publisher.releases, applied
    return asyncio.run(run())


def _events_applied(live: Live, timeline: dict[int, list[kafka_io.KafkaRecord]]) -> int:
    """How many events the operator applies when run over the whole timeline."""
    records = {p: [(r.offset, r.value or b"") for r in rs] for p, rs in timeline.items()}
    return _commit_all(live.settings, live.key, records)[1]


def _wait_caught_up(live: Live, timeout_s: float) -> bool:
    """Until the worker has committed every timeline record that existed when we began.

    Returns False at the deadline instead of failing: after rebalances Faust sometimes stops
    committing a partition it got back (faust-streaming issue #318). The checks below do not
    depend on it: replay compares through whatever is committed and checks every published
    record against the full recomputation."""
    end = {p: hi for p, (_lo, hi) in
           kafka_io.end_offsets(live.conf, live.topics.timeline).items()}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = kafka_io.committed_offsets(live.conf, live.settings.app_id, live.topics.timeline)
        if all(done.get(p, 0) >= hi for p, hi in end.items()):
            return True
        time.sleep(0.5)  # polling interval of a deadline loop, not a synchronisation sleep
    return False


@pytest.mark.kafka
def test_kill_nine_while_events_flow(live_factory: Callable[..., Live]) -> None:  # noqa: F811
    """Three SIGKILLs at seeded random moments while ~40 events/s flow, then a clean stop:
    every input event is on the timeline, applied exactly once (duplicates from re-ingest
    dropped), no (counter, tick) has two values, and the published stream equals the
    Operator run without interruption over the same timeline and the spec re-derivation."""
    tick = 100
    start = (now_ms() // tick) * tick
    live = live_factory(dict.fromkeys(COUNTERS, start), name="crash", epsilon=500.0,
                        lateness_ms=400)
    live.worker.start()
    live.wait_releases(lambda rs: len(rs) > 0, timeout_s=90)
    rng = random.Random(20261129)
    seconds = 16.0
    stop = threading.Event()
    sent = [0]
    producer = threading.Thread(target=_produce_steadily,
                                args=(live, seconds, 7, stop, sent), daemon=True)
    t0 = time.monotonic()
    producer.start()
    kill_at = sorted(rng.uniform(1.0, seconds - 1.0) for _ in range(3))
    try:
        for at in kill_at:
            delay = t0 + at - time.monotonic()
            if delay > 0:
                stop.wait(delay)  # the kill schedule itself, not a synchronisation wait
            live.worker.kill()
            live.worker.start()
    finally:
        producer.join(timeout=seconds + 60)
        stop.set()
    assert not producer.is_alive()
    report = _drain_and_check(live, start, tick, sent[0])
    print(f"crash test: {sent[0]} events, {live.worker.starts} starts, "
          f"{report.duplicates_dropped} re-ingested duplicates dropped, "
          f"{report.recomputed} releases identical")


def _drain_and_check(live: Live, start: int, tick: int, sent: int) -> ReplayReport:
    """After the last input record: let the worker drain, stop it cleanly, then check that
    nothing was lost, nothing counted twice, one value per (counter, tick), equal to the
    uninterrupted run (replay) and to the spec re-derivation."""
    # Queues drain at one event per tick per counter: wait until every counter is past
    # the last event's tick plus its backlog, then until the worker has committed it all.
    last_tick = (now_ms() + 60 * tick) // tick - start // tick + 1
    # ... and until every counter has published a change: releases are scheduled (BCC) some
    # ticks after their checkpoint, so this also waits for the values to move.
    live.wait_releases(lambda rs: {r["counter"] for r in rs if r["tick"] >= last_tick}
                       == set(COUNTERS)
                       and {r["counter"] for r in rs if r["kind"] == "change"} == set(COUNTERS),
                       timeout_s=180)
    _wait_caught_up(live, 30)
    assert live.worker.stop() == 0, live.worker.log_tail()

    # No event lost at ingest: every input offset is on the timeline.
    inputs = {(r.partition, r.offset) for r in
              kafka_io.iter_topic(live.conf, live.topics.input)}
    assert len(inputs) == sent
    timeline = kafka_io.read_topic(live.conf, live.topics.timeline)
    on_timeline = {(ev.src_partition, ev.src_offset) for _p, _o, ev in timeline_events(timeline)}
    assert on_timeline == inputs

    # None counted twice: the operator applies each input offset exactly once.
    assert _events_applied(live, timeline) == sent

    # One value per (counter, tick); equal to the uninterrupted run and to the spec.
    published = published_map(live.releases())
    report = replay(live.settings, live.key)
    assert report.identical, report.summary()
    expected = spec_expectation(live.settings, live.key, committed_prefix(live))
    assert {k: v for k, v in published.items() if k in expected} == expected
    # The values do move (the test is not vacuous): counted over everything published, each
    # record of which replay has just checked against the uninterrupted recomputation.
    assert sum(1 for k in published if k[2] == "change") >= 2
    return report


@pytest.mark.kafka
@pytest.mark.parametrize(("point", "k"), [("after_acks", 12), ("between_state_writes", 8)])
def test_kill_nine_mid_batch(live_factory: Callable[..., Live],  # noqa: F811
                             point: str, k: int) -> None:
    """The worker SIGKILLs itself inside a checkpoint while ~40 events/s flow: after the
    broker acknowledged every release sent but before any state write ("after_acks"), or
    between the two partitions' write batches of one checkpoint ("between_state_writes",
    the first batch acknowledged); it is restarted at once. The same checks as after
    random kills: nothing lost, nothing counted twice, one value per (counter, tick),
    equal to replay and the spec. Control: the log shows the crash point was reached and
    the process died of SIGKILL."""
    tick = 100
    start = (now_ms() // tick) * tick
    live = live_factory(dict.fromkeys(COUNTERS, start), name=f"mid-{point[:7]}",
                        epsilon=500.0, lateness_ms=400, checkpoint_ms=500)
    # A checkpoint about every 0.5 s (commit.BatchCommit, checkpoint_ms), each writing
    # both partitions (markers seal ticks on each): the k-th call of either point falls
    # a few seconds into the flow.
    sent = _fault_then_restart(live, f"{point}:{k}", seconds=16.0, seed=13, exit_code=-9,
                               expected=(f"test crash point {point} reached",),
                               while_flowing=True)
    report = _drain_and_check(live, start, tick, sent)
    print(f"mid-batch crash ({point}): {sent} events, {report.recomputed} releases "
          "identical")


@pytest.mark.kafka
def test_failed_worker_counters_move_to_the_other(
        live_factory: Callable[..., Live]) -> None:  # noqa: F811
    """Two workers in one group share the partitions; one is killed for good while events
    flow. The survivor takes over its partitions with their state (from the changelog or
    its standby copy), the markers keep coming (the leader role moves if needed), and the
    published stream has no loss, no double count and equals the uninterrupted replay.

    The survivor keeps a standby copy of the other's partitions once the group assigned
    it one and its recovery started it: the kill comes after 4 s of events AND after the
    survivor's /metrics shows standby records read, not at a fixed time. The first
    release may come from a worker alone in the group, before the other one joined, and
    a joining worker's standby starts only after its recovery's look-ups, so "4 s after
    the first release" was not a moment at which the product promises a standby copy.
    Its closing metrics line must still count those standby records (none lost)."""
    tick = 100
    start = (now_ms() // tick) * tick
    live = live_factory(dict.fromkeys(COUNTERS, start), name="failover", epsilon=500.0,
                        lateness_ms=400, partitions=4)
    port = free_port()
    # same app, its own state dir
    other = live.add_worker("worker-b", loglevel="info", metrics_port=port)
    live.worker.start()
    other.start()

    def standby_read() -> bool:
        try:
            families = parsed(get(f"http://127.0.0.1:{port}/metrics")[1])
        except OSError:
            return False  # not serving yet
        return metric_value(families, "dpc_changelog_records_read", copy="standby") > 0

    try:
        live.wait_releases(lambda rs: len(rs) > 0, timeout_s=90)
        stop = threading.Event()
        sent = [0]
        producer = threading.Thread(target=_produce_steadily,
                                    args=(live, 12.0, 11, stop, sent), daemon=True)
        producer.start()
        stop.wait(4.0)  # let both workers process for a while
        wait_until("the survivor's standby copy reading the other's changelog",
                   standby_read, 60, live)
        live.worker.kill()
        producer.join(timeout=120)
        assert not producer.is_alive()
        last_tick = (now_ms() + 60 * tick) // tick - start // tick + 1
        live.wait_releases(lambda rs: {r["counter"] for r in rs if r["tick"] >= last_tick}
                           == set(COUNTERS), timeout_s=120)
        _wait_caught_up(live, 30)
        assert other.stop() == 0, other.log_tail()
    finally:
        other.stop()
    stopped = [line for line in other.log_tail(400).splitlines()
               if "worker stopped: metrics" in line]
    standby = re.search(r"changelog_standby_records=(\d+)", stopped[-1]) if stopped else None
    assert standby is not None and int(standby.group(1)) > 0, other.log_tail()
    inputs = {(r.partition, r.offset) for r in
              kafka_io.iter_topic(live.conf, live.topics.input)}
    assert len(inputs) == sent[0]
    report = replay(live.settings, live.key)
    assert report.identical, report.summary()
    timeline = kafka_io.read_topic(live.conf, live.topics.timeline)
    assert _events_applied(live, timeline) == sent[0]
    published_map(live.releases())


@pytest.mark.kafka
def test_ingest_failure_stops_the_worker_cleanly(
        live_factory: Callable[..., Live]) -> None:  # noqa: F811
    """The ingest thread fails (an injected fault after its 3rd batch was delivered, before
    its input offsets were committed): the worker stops itself the way SIGTERM does, exit
    code 1, the error type named, no traceback, and the batch is not committed. Restarted,
    it re-reads that batch: nothing lost, nothing counted twice, equal to replay."""
    tick = 100
    start = (now_ms() // tick) * tick
    live = live_factory(dict.fromkeys(COUNTERS, start), name="ingfail", epsilon=500.0,
                        lateness_ms=400)

    def failing_batch_not_committed() -> None:
        done = kafka_io.committed_offsets(live.conf, f"{live.settings.app_id}-ingest",
                                          live.topics.input)
        delivered = timeline_events(kafka_io.read_topic(live.conf, live.topics.timeline))
        assert any(ev.src_offset >= done.get(ev.src_partition, 0) for _p, _o, ev in delivered)

    sent = _fault_then_restart(
        live, "ingest_delivered:3:raise", seconds=10.0, seed=17,
        expected=("ingest stage failed (InjectedFault)",
                  "worker stopped after a failure (ingest: InjectedFault)"),
        before_restart=failing_batch_not_committed)
    _drain_and_check(live, start, tick, sent)


@pytest.mark.kafka
def test_operator_failure_exits_without_committing_past(
        live_factory: Callable[..., Live]) -> None:  # noqa: F811
    """The batch commit raises after the releases were acknowledged (an injected fault at
    the 80th "after_acks", standing for corrupt state or a bug): the worker exits at once
    with code 1, naming only the error type, without committing the failing timeline
    record (a clean Faust stop would ack it); restarted, it applies that record again:
    nothing lost, nothing counted twice, one value per (counter, tick), equal to replay."""
    tick = 100
    start = (now_ms() // tick) * tick
    live = live_factory(dict.fromkeys(COUNTERS, start), name="opfail", epsilon=500.0,
                        lateness_ms=400)
    sent = _fault_then_restart(
        live, "after_acks:80:raise", seconds=12.0, seed=19,
        expected=("operator failed (InjectedFault); stopping the worker",))
    _drain_and_check(live, start, tick, sent)


def _fault_then_restart(live: Live, crash_at: str, *, seconds: float, seed: int,
                        expected: Sequence[str], exit_code: int = 1,
                        while_flowing: bool = False,
                        before_restart: Callable[[], None] | None = None) -> int:
    """Run the worker with the injected fault DPC_TEST_CRASH_AT=`crash_at` while events
    flow; it must exit with `exit_code` (1: a failure it handles; -9: it SIGKILLed
    itself), log every line of `expected` and no traceback, and (`while_flowing`) die
    while the producer still sends; then `before_restart()`, a restart without the
    fault, and the producer's end. Returns the number of events sent."""
    live.worker.env["DPC_TEST_CRASH_AT"] = crash_at
    stop = threading.Event()
    sent = [0]
    producer = threading.Thread(target=_produce_steadily,
                                args=(live, seconds, seed, stop, sent), daemon=True)
    live.worker.start()
    try:
        live.wait_releases(lambda rs: len(rs) > 0, timeout_s=90)
        producer.start()
        code, log = live.worker.wait_exit(tail=400)
        assert code == exit_code, log
        for line in expected:
            assert line in log, log
        assert "Traceback" not in log, log
        if while_flowing:
            assert sent[0] > 0 and producer.is_alive(), "the fault came after the events"
        if before_restart is not None:
            before_restart()
        del live.worker.env["DPC_TEST_CRASH_AT"]
        live.worker.start()
    finally:
        producer.join(timeout=seconds + 60)
        stop.set()
    assert not producer.is_alive()
    return sent[0]


def _settings() -> Settings:
    return with_overrides(Settings(), counters={"x": 0}, tick_ms=100, partitions=1,
                          mechanism="simecc", epsilon=500.0, heartbeat_ticks=10)


def _timeline_with_duplicate(with_source: bool) -> list[bytes]:
    """Batches of two events at input offsets 0..39, each followed by a marker, then one
    re-sent batch of offsets 30..39 (what a crash of ingest between delivering and
    committing produces), then markers. Without the source, events carry -1 (unknown),
    which the duplicate filter cannot recognise."""
    def ev(i: int) -> Event:
        return Event("x", 100 * (i // 2), 65536, 0 if with_source else -1,
                     i if with_source else -1)

    recs: list[bytes] = []
    for i in range(0, 40, 2):
        recs.append(encode_batch([ev(i), ev(i + 1)]))
        recs.append(encode_marker(i // 2 - 1))
    recs.append(encode_batch([ev(i) for i in range(30, 40)]))
    recs.extend(encode_marker(n) for n in range(20, 120))
    return recs


def _run(recs: list[bytes]) -> list[bytes]:
    releases, _ = _commit_all(_settings(), NoiseKey.from_seed(3),
                              {0: list(enumerate(recs))})
    return [r.to_json() for r in releases]


def test_reingested_duplicates_are_dropped_control() -> None:
    """The duplicate filter is what prevents double counting: with sources the re-sent
    copies change nothing (same releases as the timeline without them); the control, the
    same timeline without sources, counts them twice and the releases differ."""
    clean = _timeline_with_duplicate(True)
    no_dups = [r for i, r in enumerate(clean) if i != 40]
    assert _run(clean) == _run(no_dups)
    assert _run(_timeline_with_duplicate(False)) != _run(no_dups)


@pytest.mark.kafka
def test_gap_guard_returns_exactly_the_skipped_records(kafka_bootstrap: str) -> None:
    """GapGuard (the defence against Faust skipping messages around a rebalance): for a
    partition first seen at offset 5 with nothing committed it returns offsets 0..4, then
    nothing for the next offset, then exactly the records of a later forward gap; a
    redelivery (an offset below the expected one) returns nothing. Control: the records it
    returns are the topic's own, byte for byte."""
    from processor.stream.worker.acks import GapGuard
    from processor.stream.worker.metrics import WorkerMetrics

    conf = {"bootstrap.servers": kafka_bootstrap}
    topic = f"gapguard-{now_ms()}"
    kafka_io.create_topics(conf, [topic], 1)
    kafka_io.produce_all(conf, topic, [(None, b"rec-%d" % i) for i in range(12)], partition=0)
    metrics = WorkerMetrics()
    guard = GapGuard(conf, f"gapguard-group-{now_ms()}", topic, metrics)

    async def run() -> list[list[int]]:
        got = []
        for off in (5, 6, 9, 3, 10):
            recs = await guard.missing(0, off)
            assert all(r.value == b"rec-%d" % r.offset for r in recs)
            got.append([r.offset for r in recs])
        return got

    assert asyncio.run(run()) == [[0, 1, 2, 3, 4], [], [7, 8], [], []]
    assert metrics.counts[f"gap_records_refetched_{topic}"] == 7
