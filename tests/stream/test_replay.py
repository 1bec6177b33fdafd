"""Replay, the audit (processor/stream/replay/; docs/replay.md).

Against the real broker, one deployment through its life: replay says identical while a
worker runs under load, after a kill -9 (the worker dead), and after a clean stop (the
leader's last marker possibly unapplied: pending, not missing); then a tampered release,
a forged ledger entry and a missing release (deleted from the topic) are each reported
as differences naming the record, and a timeline whose beginning was deleted gives no
verdict (exit 2). Without a broker: the cut (what is due, what is
pending), every kind of difference, the recomputation equal to one BatchCommit pass, the
JSON verdict and the progress lines.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from processor.commands import main as cli
from processor.stream.kafka import kafka_io
from processor.stream.model.commit import BatchCommit
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.records import Release
from processor.stream.model.state import DictStore
from processor.stream.replay import (
    Recomputed,
    ReplayReport,
    Tally,
    compare,
    main_replay,
    recompute_timeline,
)
from processor.stream.replay.cli import StderrProgress


def _now_ms() -> int:
    return int(time.time() * 1000)


def _replay_json(config: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main_replay(["--config", config, "--json", "--quiet"])
    out = capsys.readouterr().out
    return code, orjson.loads(out)


def _produce_steadily(dep: Any, stop: threading.Event, sent: list[int], start: int,
                      tick: int) -> None:
    """About 60 events/s over the counters until `stop`, one in ten late (its tick sealed
    already), so the timeline carries a backlog and late events while replay runs."""
    rng = random.Random(5)
    while not stop.is_set():
        now = _now_ms()
        batch = [orjson.dumps({"counter": rng.choice(["p", "q"]),
                               "ts": (start + tick if rng.random() < 0.1 else now)})
                 for _ in range(6)]
        sent[0] += dep.produce(batch)
        stop.wait(0.1)


@pytest.mark.kafka
def test_replay_live_killed_stopped_then_detects_tampering(
        deployment_factory: Callable[..., Any], capsys: pytest.CaptureFixture[str]) -> None:
    """One deployment: replay is identical during load, after a kill -9 and after a clean
    stop; then each of a tampered release, a forged ledger entry and a missing release is
    reported as a difference naming it (exit 1), and the earlier ones stay reported."""
    tick = 100
    start = (_now_ms() // tick) * tick - 20 * tick
    dep = deployment_factory({"p": start, "q": start, "quiet": start}, name="replay",
                             partitions=2, tick_ms=tick, lateness_ms=300, epsilon=500.0,
                             heartbeat_ticks=10)
    config = str(dep.config)
    dep.worker.start()
    stop = threading.Event()
    sent = [0]
    producer = threading.Thread(target=_produce_steadily,
                                args=(dep, stop, sent, start, tick), daemon=True)
    try:
        dep.wait_releases(lambda rs: len(rs) > 0, timeout_s=90)
        producer.start()
        dep.wait_releases(lambda rs: any(r["kind"] == "change" for r in rs), timeout_s=60)

        # 1. a running worker under load (twice: the backlog moves between the two)
        for _ in range(2):
            code, verdict = _replay_json(config, capsys)
            assert code == 0 and verdict["identical"], verdict["differences"]
            assert verdict["counts"]["releases"]["due"] > 0, verdict

        # 2. kill -9 while events flow: whatever the worker did not finish is pending
        dep.worker.kill()
        code, verdict = _replay_json(config, capsys)
        assert code == 0 and verdict["identical"], verdict["differences"]

        # 3. restarted, then a clean stop (its last marker may stay unapplied)
        dep.worker.start()
        seen = max(r["tick"] for r in dep.releases())
        dep.wait_releases(lambda rs: max((r["tick"] for r in rs), default=-1) >= seen + 10,
                          timeout_s=60)
    finally:
        stop.set()
        producer.join(timeout=30)
    assert dep.worker.stop() == 0, dep.worker.log_tail()
    assert sent[0] > 0
    code, verdict = _replay_json(config, capsys)
    assert code == 0 and verdict["identical"], verdict["differences"]
    counts = verdict["counts"]
    assert counts["releases"]["published"] == counts["releases"]["due"] > 0
    assert counts["ledger"]["published"] == counts["ledger"]["due"] == 3

    published = [orjson.loads(r.value or b"") for r in
                 kafka_io.iter_topic(dep.conf, dep.topics.counts)]

    # 4. a tampered release: a copy of a published one with another value
    victim = next(r for r in published if r["kind"] == "change")
    kafka_io.produce_all(dep.conf, dep.topics.counts,
                         [(victim["counter"].encode(),
                           orjson.dumps(dict(victim, value=victim["value"] + 1.0)))])
    code, verdict = _replay_json(config, capsys)
    diffs = verdict["differences"]
    assert code == 1 and verdict["verdict"] == "different" and diffs["total"] == 1, verdict
    assert diffs["first"][0]["topic"] == "counts"
    assert diffs["first"][0]["key"] == [victim["counter"], victim["tick"], "change"]

    # 5. a forged ledger entry: a counter that was never created
    entry = orjson.loads(next(iter(kafka_io.iter_topic(dep.conf, dep.topics.ledger))).value
                         or b"")
    forged = dict(entry, counter="forged", epsilon=0.01)
    kafka_io.produce_all(dep.conf, dep.topics.ledger, [(b"forged", orjson.dumps(forged))])
    code, verdict = _replay_json(config, capsys)
    diffs = verdict["differences"]
    assert code == 1 and diffs["total"] == 2, verdict
    ledger_diffs = [d for d in diffs["first"] if d["topic"] == "ledger"]
    assert [(d["key"][0], d["problem"]) for d in ledger_diffs] == [("forged", "unexpected")]

    # 6. a missing release: the first records of one private-count partition deleted
    first = next(iter(kafka_io.iter_topic(dep.conf, dep.topics.counts)))
    gone = orjson.loads(first.value or b"")
    admin = AdminClient(dict(dep.conf))
    for fut in admin.delete_records(
            [TopicPartition(dep.topics.counts, first.partition, first.offset + 1)]).values():
        fut.result(timeout=30)
    capsys.readouterr()
    assert main_replay(["--config", config, "--quiet", "--settle", "1"]) == 1
    line = capsys.readouterr().out
    assert line.startswith("DIFFERENT (3 differences"), line
    assert f"counts ('{gone['counter']}', {gone['tick']}, '{gone['kind']}'): missing" in line
    assert "ledger ('forged'" in line

    # 7. no verdict without the timeline's beginning: one error line, exit 2
    for fut in admin.delete_records([TopicPartition(dep.topics.timeline, 0, 1)]).values():
        fut.result(timeout=30)
    assert cli.main(["replay", "--config", config, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: replay: the timeline topic"), err
    assert "no longer starts at offset 0 on partition(s) [0]" in err[0]


# --------------------------------------------------------------------- without a broker


def _two_partition_timeline(
        ticks: int, counters_at: Callable[[int], list[str]]
) -> dict[int, list[tuple[int, bytes | None]]]:
    """A timeline of 2 partitions through tick `ticks` - 1 (100 ms ticks): at tick n one
    event of each counter `counters_at(n)` names (in its home partition, stamped 5 ms
    into the tick), then a marker through n in both partitions."""
    from processor.stream.model.records import Event, encode_batch, encode_marker, partition_for

    timeline: dict[int, list[tuple[int, bytes | None]]] = {0: [], 1: []}
    for n in range(1, ticks):
        per: dict[int, list[Event]] = {}
        for c in counters_at(n):
            per.setdefault(partition_for(c, 2), []).append(Event(c, n * 100 + 5, 65536, 0, n))
        for p in (0, 1):
            if p in per:
                timeline[p].append((len(timeline[p]), encode_batch(per[p])))
            timeline[p].append((len(timeline[p]), encode_marker(n)))
    return timeline


def _release(counter: str, tick: int, value: float = 1.0, kind: str = "heartbeat") -> Release:
    return Release(counter=counter, tick=tick, tick_start_ms=tick * 100, tick_ms=100,
                   value=value, kind=kind,  # type: ignore[arg-type]
                   mechanism="ecc", epsilon=1.0, delta=1e-6, error_bound=3.0, beta=0.05,
                   fingerprint="f")


def _ledger(counter: str, creation: str = "t") -> Any:
    from processor.stream.model.records import LedgerEntry

    return LedgerEntry(counter=counter, mechanism="ecc", epsilon=1.0, delta=1e-6,
                       tick_ms=100, start_ms=0, fingerprint="f", key_id="k",
                       creation=creation)


def _recomputed(settled: list[Release], unsettled: list[Release],
                settled_ledger: list[Any] | None = None,
                unsettled_ledger: list[Any] | None = None) -> Recomputed:
    return Recomputed(settled, unsettled, settled_ledger or [], unsettled_ledger or [], 0, 0)


def test_the_cut_due_pending_and_every_kind_of_difference() -> None:
    """Due: settled (committed) releases, and unsettled ones at or below their counter's
    highest published tick; the rest pending. Ledger entries: due only when settled."""
    a = [_release("a", t) for t in range(1, 6)]
    b = [_release("b", t) for t in range(1, 4)]
    res = _recomputed(a[:2], a[2:] + b, [_ledger("a")], [_ledger("b")])
    ledger = [_ledger("a").to_json()]
    # a published through tick 3, b not at all: a4, a5, b1-b3 pending; b's entry pending.
    pub = [r.to_json() for r in a[:3]]
    rel, led, diffs = compare(res, pub + pub[:1], ledger)  # an identical re-send counts once
    assert diffs == []
    assert rel == Tally(recomputed=8, committed=2, due=3, published=3, pending=5)
    assert led == Tally(recomputed=2, committed=1, due=1, published=1, pending=1)

    # a missing release in the middle of what a counter published: due, so missing
    rel, _led, diffs = compare(res, [a[0].to_json(), a[1].to_json(), a[3].to_json()], ledger)
    assert [(d.key, d.problem) for d in diffs] == [(("a", 3, "heartbeat"), "missing")]
    assert rel.pending == 4
    # a settled release never published: missing (a[1] is committed, nothing published)
    _rel, _led, diffs = compare(res, [a[0].to_json()], ledger)
    assert [(d.key, d.problem) for d in diffs] == [(("a", 2, "heartbeat"), "missing")]
    # a settled ledger entry missing; an unsettled one may be missing
    _rel, _led, diffs = compare(res, pub, [])
    assert [(d.topic, d.key[0], d.problem) for d in diffs] == [("ledger", "a", "missing")]

    # different, conflicting, unexpected, malformed
    tampered = orjson.loads(a[2].to_json())
    tampered["value"] = 9.0
    _rel, _led, diffs = compare(res, [*pub[:2], orjson.dumps(tampered)], ledger)
    assert [(d.key, d.problem) for d in diffs] == [(("a", 3, "heartbeat"), "different")]
    assert "value: replay=1.0 published=9.0" in diffs[0].detail
    _rel, _led, diffs = compare(res, [*pub, orjson.dumps(tampered)], ledger)
    assert [(d.key, d.problem) for d in diffs] == [(("a", 3, "heartbeat"), "conflicting")]
    _rel, _led, diffs = compare(res, [*pub, _release("z", 1).to_json()],
                                [*ledger, _ledger("z").to_json()])
    assert [(d.topic, d.key[0], d.problem) for d in diffs] == [  # z: never recomputed
        ("counts", "z", "unexpected"), ("ledger", "z", "unexpected")]
    _rel, _led, diffs = compare(res, [*pub, b"not json", None], ledger)
    assert [d.problem for d in diffs] == ["malformed", "malformed"]


def test_recompute_splits_at_the_settled_offsets_and_equals_one_pass() -> None:
    """recompute_timeline equals one BatchCommit pass over the partition, record by record
    (the batching does not matter); what records at or past the settled offset produce is
    reported apart; compare finds the recomputation identical to that pass's output."""
    from tests.stream.test_operator import KEY, TICK, StepFactory, random_timeline, settings
    from tests.stream.test_operator import to_records as records_of

    rng = random.Random(8)
    s = settings({"a": 100 * TICK, "b": 100 * TICK}, heartbeat_ticks=3)
    records = records_of(random_timeline(rng, ["a", "b"], 100, 30, 0.5), 3)
    pub = CollectingSink()
    bc = BatchCommit(Operator(s, KEY, factory=StepFactory(2, 3)), DictStore(), pub)
    for off, r in enumerate(records):
        asyncio.run(bc.commit(0, [(off, r)]))
    mark = len(records) // 2
    got = recompute_timeline(s, KEY, {0: list(enumerate(records))}, {0: mark},
                             operator=Operator(s, KEY, factory=StepFactory(2, 3)))
    assert got.settled + got.unsettled == pub.releases and got.records == len(records)
    assert got.settled and got.unsettled
    assert got.settled_ledger + got.unsettled_ledger == pub.ledger
    rel, led, diffs = compare(got, [r.to_json() for r in pub.releases],
                              [e.to_json() for e in pub.ledger])
    assert diffs == [] and rel.pending == 0 and led.due == led.published


def test_json_verdict_and_progress_lines(capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON verdict names the verdict, the cut, the counts and the first differences;
    the progress printer writes at most one line per interval, to stderr only."""
    res = _recomputed([_release("a", 1)], [_release("a", 2)])
    rel, led, diffs = compare(res, [], [])
    report = ReplayReport(5, 0, rel, led, {0: (1, 5), 1: (0, 0)}, diffs)
    j = orjson.loads(orjson.dumps(report.to_json()))
    assert j["verdict"] == "different" and j["identical"] is False
    assert j["cut"]["timeline"] == {"0": {"committed": 1, "end": 5},
                                    "1": {"committed": 0, "end": 0}}
    assert "committed offset" in j["cut"]["definition"]
    assert j["counts"]["releases"] == {"recomputed": 2, "committed": 1, "due": 1,
                                       "published": 0, "pending": 1}
    assert report.recomputed == 1  # of committed records
    assert j["differences"]["first"] == [{"topic": "counts", "key": ["a", 1, "heartbeat"],
                                          "problem": "missing",
                                          "detail": "due but not published"}]
    assert report.summary().startswith("DIFFERENT (1 differences")

    progress = StderrProgress(every_s=0.0)
    progress("read", 10, 100)
    progress("recomputed", 100, 100)
    quiet = StderrProgress(every_s=3600.0)
    quiet("read", 1, 100)
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["replay: 10/100 timeline records read",
                                "replay: 100/100 timeline records recomputed"]


def test_parallel_recomputation_equals_the_sequential_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Partitions recomputed in forked processes give the very records of one process
    (the registry's real mechanisms, two partitions, a committed split in each)."""
    from processor.stream.replay import recompute as replay_module

    forked: list[int] = []
    parallel = replay_module._recompute_parallel

    def counting(*args: Any) -> Recomputed:
        forked.append(1)
        return parallel(*args)

    monkeypatch.setattr(replay_module, "_recompute_parallel", counting)
    from processor.core.rng import NoiseKey
    from processor.stream.model.config import Settings, with_overrides

    s = with_overrides(Settings(), counters={f"c{i}": 0 for i in range(6)}, partitions=2,
                       tick_ms=100, mechanism="ecc", epsilon=50.0, delta=1e-6,
                       heartbeat_ticks=5)
    key = NoiseKey.from_seed(3)
    rng = random.Random(4)
    timeline = _two_partition_timeline(
        80, lambda n: [f"c{rng.randrange(6)}" for _ in range(3)])
    settled = {0: 50, 1: 70}
    one = recompute_timeline(s, key, timeline, settled, jobs=1)
    two = recompute_timeline(s, key, timeline, settled, jobs=2)
    assert forked == [1] or threading.active_count() > 1  # forks only single-threaded
    assert one == two
    # The forked processes encoded their records (compare's input) where they made them:
    # the same keys and bytes as encoding the merged records here.
    assert two._encoded is not None or not forked
    assert two.encoded() == one.encoded()
    assert one.encoded() == (
        [((r.counter, r.tick, r.kind), r.to_json()) for r in one.settled],
        [((r.counter, r.tick, r.kind), r.to_json()) for r in one.unsettled],
        [((e.counter, e.creation, e.fingerprint), e.to_json()) for e in one.settled_ledger],
        [((e.counter, e.creation, e.fingerprint), e.to_json())
         for e in one.unsettled_ledger])
    assert one.settled and one.unsettled and len(one.settled_ledger) == 6


def test_young_collections_only_inside_and_restored_after() -> None:
    """Replay suppresses full collections of the cyclic GC while it holds every counter
    (young ones still run), and restores the thresholds on the way out, also when the
    recomputation raises."""
    import gc

    from processor.stream.replay.recompute import young_collections_only

    before = gc.get_threshold()
    with young_collections_only():
        young, middle, old = gc.get_threshold()
        assert (young, middle) == before[:2] and old >= 1 << 30
    assert gc.get_threshold() == before
    with pytest.raises(ZeroDivisionError), young_collections_only():
        _ = 1 / 0
    assert gc.get_threshold() == before


def test_the_recomputation_runner_never_formats_its_result() -> None:
    """asyncio.run in the main thread formats the repr of its main task, result included,
    when it restores the SIGINT handler (Python 3.11): with 100,000 counters every
    recomputed record, twice. Replay's runner returns the result without it. Control:
    asyncio.run does format it (in the main thread with the default handler)."""
    import signal

    from processor.stream.replay.recompute import _run

    formatted: list[int] = []

    class Loud:
        def __repr__(self) -> str:
            formatted.append(1)
            return "Loud()"

    async def result() -> Any:
        return Loud()

    assert isinstance(_run(result()), Loud) and formatted == []
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        asyncio.run(result())
        assert formatted


def test_keyed_recomputation_keeps_the_bytes_of_idle_heartbeats(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept as keys and bytes (`KeyedSink`, what replay's comparison reads), a
    recomputation is the encoding of the one kept as objects, record for record, and the
    heartbeats the operator beats from idle entries (bytes from a template) are kept as
    those bytes, never decoded. Control: the same run kept as objects decodes them."""
    from processor.core.rng import NoiseKey
    from processor.stream.model import records as records_module
    from processor.stream.model.config import Settings, with_overrides
    from processor.stream.replay.recompute import _recompute, _run

    s = with_overrides(Settings(), counters={f"c{i}": 0 for i in range(12)}, partitions=2,
                       tick_ms=100, mechanism="ecc", epsilon=1.0, heartbeat_ticks=5)
    key = NoiseKey.from_seed(8)
    rng = random.Random(9)
    timeline = _two_partition_timeline(
        400, lambda n: [f"c{rng.randrange(12)}"] if n % 40 == 0 else [])
    settled = {0: 300, 1: 500}
    decoded = []
    real = records_module.EncodedRelease.decoded

    def counting(self: Any) -> Release:
        decoded.append(self.counter)
        return real(self)

    monkeypatch.setattr(records_module.EncodedRelease, "decoded", counting)

    def run(keyed: bool) -> Any:
        # idle_decoded=0: every idle counter is released and beats from its idle entry.
        op = Operator(s, key, idle_decoded=0)
        return _run(_recompute(op, timeline, settled, None, keyed=keyed))

    objects = run(False)
    beaten = len(decoded)
    keyed = run(True)
    assert beaten > 100 and len(decoded) == beaten  # the control decoded them; keyed not
    assert keyed.encoded() == objects.encoded()
    assert not keyed.settled and not keyed.unsettled
    assert keyed.settled_ledger == objects.settled_ledger and len(objects.settled_ledger) == 12
    assert objects.unsettled  # both sides of the cut are kept
