"""The bounding stage (processor/stream/model/bounding.py): contribution bounds per unit, a
deterministic kept set, crash safety, replay. Pure: no Kafka (the broker tests are in
test_bounding_kafka.py when present).

Randomised schedules use fixed seeds (no statistical claim, so no false-alarm rate): each
asserts an exact equality. Controls: a stage that re-decides looked-up events (instead of
looking them up) and a stage without the input duplicate filter are each caught by the
same assertions.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import random
from collections.abc import Callable, Iterable, Sequence

import orjson
import pytest

from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.stream.kafka.ingest import InputRecord, Routed, route
from processor.stream.model import bounding
from processor.stream.model.bounding import (
    SEQ_BITS,
    BoundCommit,
    Bounder,
    BoundsChangeError,
    BoundsWatch,
    UnitRow,
    UnitsPartitionState,
    UnitState,
    decode_units,
    encode_units,
    kept_inputs,
    unit_hash,
    unit_key,
    unit_partition,
)
from processor.stream.model.config import Settings, with_overrides, with_unit
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.records import USER_MODE_REASONS, TimelineBatch, decode_timeline
from processor.stream.model.state import DictStore, DuplicateFilter, partition_key, supersedes

NOW = 1_767_225_600_000
K, M = 3, 2
BASE = with_overrides(Settings(), counters={c: NOW - 3_600_000 for c in "abcd"},
                      partitions=2)
S = with_unit(BASE, 4.0, 1e-6, K, M)
UKEY = unit_key(NoiseKey.from_seed(7))


def _row(uid: str, counter: str, in_offset: int, in_partition: int = 0) -> list[object]:
    return [unit_hash(UKEY, uid), counter, NOW, UNIT, in_partition, in_offset]


def _kept(fw: CollectingSink) -> list[tuple[int, int]]:
    """(units partition, seq) of every forwarded event, deduplicated as the operator's
    filter does (per source label, strictly increasing offsets), in forward order."""
    hw: dict[tuple[int, int], int] = {}
    out: list[tuple[int, int]] = []
    for tp, data in fw.timeline:
        batch = decode_timeline(data)
        assert isinstance(batch, TimelineBatch) and batch.source == bounding.UNITS_SOURCE
        for ev in batch.events:
            if ev.src_offset <= hw.get((tp, ev.src_partition), -1):
                continue
            hw[(tp, ev.src_partition)] = ev.src_offset
            out.append((ev.src_partition, ev.src_offset))
    return sorted(out)


def _run(records: Sequence[tuple[int, int, bytes]], settings: Settings = S,
         ) -> tuple[CollectingSink, DictStore]:
    fw, store = CollectingSink(), DictStore()
    bc = BoundCommit(Bounder(settings), store, fw)
    for p, off, raw in records:
        asyncio.run(bc.commit(p, [(off, raw)]))
    return fw, store


def test_bounds_enforced_exactly_at_the_bound() -> None:
    """k events per counter kept, the (k+1)-th dropped; m counters, the (m+1)-th dropped;
    another unit untouched by the first one's excess. Nothing lost: kept + dead = all."""
    rows = ([_row("alice", "a", i) for i in range(K + 1)]            # k kept, 1 over
            + [_row("alice", "b", 10 + i) for i in range(K)]          # 2nd counter: k kept
            + [_row("alice", "c", 20)]                                 # 3rd counter: over m
            + [_row("bob", "c", 30 + i) for i in range(K)])            # bob: all kept
    fw, _ = _run([(0, 0, encode_units(rows))])
    kept = _kept(fw)
    assert len(kept) == 3 * K
    dead = [orjson.loads(d) for d in fw.deadletters]
    assert [(d["reason"], d["offset"]) for d in dead] == [
        ("contribution_bound_exceeded", K), ("contribution_bound_exceeded", 20)]
    assert len(kept) + len(dead) == len(rows)
    # Dead letters carry the input coordinates and the hash, never the raw id.
    assert all(b"alice" not in d and b"bob" not in d for d in fw.deadletters)
    # Control: one more allowed event per counter keeps the (k+1)-th.
    fw2, _ = _run([(0, 0, encode_units(rows))], with_unit(BASE, 4.0, 1e-6, K + 1, M))
    assert len(_kept(fw2)) == 3 * K + 1


def _log(seed: int, n_records: int = 30, partitions: int = 2
         ) -> list[tuple[int, int, bytes]]:
    """A units log: records of random units / counters per units partition, as ingest
    writes them (rows of one input partition in offset order), with one re-sent batch."""
    rng = random.Random(seed)
    units = [f"user-{i}" for i in range(12)]
    offsets = [0] * partitions
    next_in = 0
    log: list[tuple[int, int, bytes]] = []
    for _ in range(n_records):
        by_p: dict[int, list[list[object]]] = {}
        for _ in range(rng.randint(1, 12)):
            uid = rng.choice(units)
            h = unit_hash(UKEY, uid)
            by_p.setdefault(unit_partition(h, partitions), []).append(
                [h, rng.choice("abcd"), NOW, UNIT, 0, next_in])
            next_in += 1
        for p, rows in sorted(by_p.items()):
            log.append((p, offsets[p], encode_units(rows)))
            offsets[p] += 1
    # Ingest re-sends a batch after a crash before its commit: the same input offsets.
    p, _, raw = log[len(log) // 2]
    log.append((p, offsets[p], raw))
    return log


class Killed(Exception):
    pass


def _crashing(point: str, nth: int) -> Callable[[str], None]:
    calls = {"n": 0}

    def crash(name: str) -> None:
        if name == point:
            calls["n"] += 1
            if calls["n"] == nth:
                raise Killed(point)
    return crash


def _dead(fw: CollectingSink) -> set[tuple[int, int]]:
    return {(d["partition"], d["offset"]) for d in map(orjson.loads, fw.deadletters)}


def _inputs(log: Sequence[tuple[int, int, bytes]], kept: list[tuple[int, int]]
            ) -> set[tuple[int, int]]:
    """The input coordinates of forwarded (units partition, seq)."""
    of: dict[tuple[int, int], tuple[int, int]] = {}
    for p, off, raw in log:
        for i, row in enumerate(decode_units(raw)[1]):
            of[(p, off << SEQ_BITS | i)] = (row[4], row[5])
    return {of[k] for k in kept}


def _crash_run(log: Sequence[tuple[int, int, bytes]], point: str, nth: int,
               hold: int = 1, counts: collections.Counter[str] | None = None,
               store: DictStore | None = None
               ) -> tuple[CollectingSink, DictStore, bool]:
    """Run `log` with a kill at the nth passage of `point`, a checkpoint every two records,
    the restarted stage re-applying from the last acknowledged record. `hold`: the kept
    events are sent with every hold-th record only (held back in between, as the worker
    does while more units messages wait), and by the checkpoints. `counts` sums every
    apply's metrics; `store` (default a DictStore) may raise Killed itself."""
    fw = CollectingSink()
    store = DictStore() if store is None else store
    acked = 0  # records acknowledged to the group (after a checkpoint)
    bc = BoundCommit(Bounder(S), store, fw, crash_point=_crashing(point, nth))
    killed = False
    i = 0
    while i < len(log):
        p, off, raw = log[i]
        try:
            out = asyncio.run(bc.apply(p, [(off, raw)], forward=(i + 1) % hold == 0))
            if counts is not None:
                counts.update(out.metrics)
            if i % 2 == 1 or i == len(log) - 1:
                asyncio.run(bc.checkpoint())
                acked = i + 1
            i += 1
        except Killed:
            killed = True
            bc = BoundCommit(Bounder(S), store, fw)  # the restarted worker
            i = acked
    return fw, store, killed


class DyingStore(DictStore):
    """A DictStore whose nth single write raises Killed (once): a kill while a
    partition's write batch is half written (its changelog records go out one by one, so
    a new owner may restore a prefix of them)."""

    def __init__(self, nth: int) -> None:
        super().__init__()
        self.left = nth

    def set(self, key: str, value: bytes) -> None:
        self.left -= 1
        if self.left == 0:
            raise Killed("write")
        super().set(key, value)


def test_every_count_the_stage_makes_has_an_exported_name() -> None:
    """A run with bounds reached, re-sent batches and a kill inside a write batch (so
    re-deliveries of decided events) makes only counts of bounding.METRICS and
    dead-letter reasons: the names the worker's /metrics exports (a count outside them
    would be folded into the metrics line and never reach /metrics)."""
    counts: collections.Counter[str] = collections.Counter()
    _crash_run(_log(1), "unit_between_state_writes", 0, counts=counts, store=DyingStore(40))
    made = {name for name, n in counts.items() if n}
    assert {"unit_events_kept", "unit_events_redelivered_dropped",
            "deadletter_contribution_bound_exceeded"} <= made, made
    assert made <= set(bounding.METRICS) | {f"deadletter_{r}" for r in USER_MODE_REASONS}


@pytest.mark.parametrize("point", bounding.CRASH_POINTS)
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("hold", [1, 3])
def test_kept_set_is_the_same_after_a_kill_anywhere(point: str, seed: int, hold: int
                                                     ) -> None:
    """Kill at the n-th passage of each crash point (forwards acknowledged, before any
    state write / between two state writes / state durable, group not acknowledged),
    restart on the stored state and re-apply from the last acknowledged record: the same
    kept set and dead letters as without a kill, no event both kept and dead-lettered,
    none lost, and the same final state; also with forwards held back over several
    records (the held ones die with the process)."""
    log = _log(seed)
    ref, ref_store = _run(log)
    n_events = len({(r[4], r[5]) for _, _, raw in log for r in decode_units(raw)[1]})
    assert len(_inputs(log, _kept(ref))) + len(_dead(ref)) == n_events
    for nth in (1, 3, 7):
        fw, store, killed = _crash_run(log, point, nth, hold)
        assert killed
        assert _kept(fw) == _kept(ref), (point, nth)
        assert _dead(fw) == _dead(ref) and not _dead(fw) & _inputs(log, _kept(fw))
        assert store.data == ref_store.data


def test_rebalance_and_a_zombies_late_write_change_nothing() -> None:
    """Worker A applies and checkpoints part of the log, B takes over from the stored
    state and re-applies from A's last acknowledged record; A's late write of an older
    value is refused by the monotone rule (state.supersedes). Same kept set and state as
    one worker."""
    log = _log(9)
    ref, ref_store = _run(log)
    shared = DictStore()
    fw = CollectingSink()
    a = BoundCommit(Bounder(S), shared, fw)
    half = len(log) // 2
    for p, off, raw in log[:half]:
        asyncio.run(a.commit(p, [(off, raw)]))
    stale = dict(shared.data)  # what A holds when it is cut off
    # A applies two more records it never acknowledges (cut off); B re-applies them.
    for p, off, raw in log[half:half + 2]:
        asyncio.run(a.apply(p, [(off, raw)]))
    b = BoundCommit(Bounder(S), shared, fw)
    for p, off, raw in log[half:]:
        asyncio.run(b.commit(p, [(off, raw)]))
    for key, old in stale.items():  # the zombie's late writes
        if supersedes(old, shared.data.get(key)):
            shared.data[key] = old
    assert shared.data == ref_store.data
    assert _kept(fw) == _kept(ref)


def test_controls_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control 1: re-deciding instead of looking up (a restored unit forgets which seqs
    and inputs it applied) changes the kept set after a kill between state writes.
    Control 2: without the input filter a re-sent ingest batch counts twice."""
    log = _log(2)
    ref, _ = _run(log)
    real = UnitState.from_bytes

    def forgetful(data: bytes) -> UnitState:
        st = real(data)
        st.last_seq, st.inputs = -1, DuplicateFilter()  # every event decided afresh
        return st

    with monkeypatch.context() as patched:
        patched.setattr(UnitState, "from_bytes", forgetful)
        caught = 0
        for nth in (1, 3, 7):
            fw, _, _ = _crash_run(log, "unit_between_state_writes", nth)
            caught += _kept(fw) != _kept(ref) or _dead(fw) != _dead(ref)
        assert caught
    # Control 2: the filter off (every row gets a fresh input label).
    p, off, raw = log[-1]
    source, rows = decode_units(raw)
    fresh = encode_units([[*r[:4], -1, r[5]] for r in rows], source)
    fw2, _ = _run([*log[:-1], (p, off, fresh)])
    assert len(_kept(fw2)) + len(fw2.deadletters) > len(_kept(ref)) + len(ref.deadletters)


def test_replay_recomputes_the_kept_set() -> None:
    log = _log(4)
    fw, _ = _run(log)
    seq_to_input: dict[tuple[int, int], tuple[int, int]] = {}
    for p, off, raw in log:
        for i, row in enumerate(decode_units(raw)[1]):
            seq_to_input[(p, off << SEQ_BITS | i)] = (row[4], row[5])
    live = {seq_to_input[k] for k in _kept(fw)}
    assert kept_inputs(S, log) == live
    # Control: replay under other bounds disagrees.
    assert kept_inputs(with_unit(BASE, 4.0, 1e-6, 1, 1), log) != live


def test_state_is_keyed_by_hash_and_small() -> None:
    _fw, store = _run(_log(5))
    assert all(k.startswith(("u/", "p/")) for k in store.data)
    assert not any(b"user-" in v or "user-" in k for k, v in store.data.items())
    sizes = [len(k) + len(v) for k, v in store.data.items() if k.startswith("u/")]
    assert max(sizes) < 34 + 12 + 2 * (20 + K * 16)


def test_ingest_routes_user_events_to_the_units_topic_by_hash() -> None:
    raws = [orjson.dumps({"counter": "a", "ts": NOW, "user": u}) for u in
            ("alice", "bob", "alice")] + [orjson.dumps({"counter": "a", "ts": NOW})]
    recs = [InputRecord(0, i, r) for i, r in enumerate(raws)]
    routed = route(recs, S, NOW, unit_key=UKEY)
    assert routed.timeline == [] and len(routed.deadletters) == 1
    assert orjson.loads(routed.deadletters[0])["reason"] == "unit_missing"
    rows = [r for _, data in routed.units for r in decode_units(data)[1]]
    assert sorted(r[5] for r in rows) == [0, 1, 2]
    for up, data in routed.units:
        assert b"alice" not in data and b"bob" not in data
        assert all(unit_partition(r[0], S.partitions) == up for r in decode_units(data)[1])
    ha = unit_hash(UKEY, "alice")
    assert [r[5] for r in rows if r[0] == ha] == [0, 2]
    # Event mode routes to the timeline exactly as before.
    assert route(recs[:1], BASE, NOW).units == []


def test_ingest_splits_units_records_by_count_and_by_size_without_reordering() -> None:
    """A units partition's rows split into records of <= max_events rows and <= max_bytes
    bytes, concatenating back to the same rows; `ingested` counts every row once.
    Control: without limits, one record per units partition."""
    raws = [orjson.dumps({"counter": "a", "ts": NOW, "user": "alice"}) for _ in range(50)]
    recs = [InputRecord(0, i, r) for i, r in enumerate(raws)]
    whole = route(recs, S, NOW, unit_key=UKEY)
    assert len(whole.units) == 1

    def rows(routed: Routed) -> list[UnitRow]:
        return [r for _, data in routed.units for r in decode_units(data)[1]]

    by_count = route(recs, S, NOW, unit_key=UKEY, max_events=7)
    assert [len(decode_units(d)[1]) for _, d in by_count.units] == [7] * 7 + [1]
    by_size = route(recs, S, NOW, unit_key=UKEY, max_bytes=600)
    assert len(by_size.units) > 4 and all(len(d) <= 600 for _, d in by_size.units)
    assert rows(by_count) == rows(by_size) == rows(whole)
    assert {u for u, _ in by_size.units} == {u for u, _ in whole.units}
    assert whole.metrics["ingested"] == by_count.metrics["ingested"] == \
        by_size.metrics["ingested"] == 50


def test_replay_check_of_the_kept_set_and_its_controls() -> None:
    """bounding.check_kept_set (what replay runs): no difference on a live run's
    timeline; controls: a forged forward of a dead-lettered event is "unexpected", a
    dropped forward of a committed units record is "missing"."""
    from processor.stream.model.bounding import check_kept_set
    from processor.stream.model.records import Event, encode_batch

    log = _log(6)
    fw, _ = _run(log)
    timeline = [data for _, data in fw.timeline]
    committed = {0: 10**9, 1: 10**9}
    assert check_kept_set(S, log, timeline, committed) == []
    # Control 1: forge a forward of a dead-lettered event (its seq, after every other).
    dead = orjson.loads(fw.deadletters[0])
    p, off, raw = next((p, off, raw) for p, off, raw in log
                       for r in decode_units(raw)[1] if r[5] == dead["offset"])
    i = next(i for i, r in enumerate(decode_units(raw)[1]) if r[5] == dead["offset"])
    row = decode_units(raw)[1][i]
    forged = encode_batch([Event(row[1], row[2], row[3], p, off << SEQ_BITS | i)],
                          bounding.UNITS_SOURCE)
    got = check_kept_set(S, log, [forged, *timeline], committed)
    assert ("unexpected", (dead["partition"], dead["offset"])) in got
    # Control 2: the last forward lost, its units record committed.
    got = check_kept_set(S, log, timeline[:-1], committed)
    assert got and all(problem == "missing" for problem, _ in got)
    # ... and not reported while its units record is not committed.
    assert check_kept_set(S, log, timeline[:-1], {0: 0, 1: 0}) == []


def test_unit_hasher_is_the_hmac() -> None:
    """The prepared, caching hasher ingest uses gives unit_hash exactly (and keeps doing
    so across its cache's reset)."""
    from processor.stream.model.bounding import UnitHasher

    hasher = UnitHasher(UKEY, cache=3)
    for uid in ["a", "b", "a", "é", "c", "d", "a", "x" * 256]:
        assert hasher(uid) == unit_hash(UKEY, uid)
    assert UnitHasher(b"other key " * 4)("a") != unit_hash(UKEY, "a")  # control


class BatchStore(DictStore):
    """A DictStore that takes many writes at once (StateStore.write_many), counting the
    calls, as table.PartitionStore's one RocksDB write batch per checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    def write_many(self, writes: Iterable[tuple[str, bytes]]) -> None:
        batch = list(writes)
        self.batches.append([k for k, _ in batch])
        for key, value in batch:
            self.set(key, value)


@pytest.mark.parametrize("every", [1, 3, 1000])
def test_checkpoint_cadence_changes_nothing(every: int) -> None:
    """Checkpoints after every record, every 3, or once at the end (units touched by
    several batches in between are carried over as decoded values, never re-read): the
    same timeline records, dead letters and final state, byte for byte. A store that
    takes a checkpoint's writes at once gets them in one call per partition, the
    partition value last."""
    log = _log(5, n_records=40)
    ref, ref_store = _run(log)
    fw, store = CollectingSink(), BatchStore()
    bc = BoundCommit(Bounder(S), store, fw)
    for i, (p, off, raw) in enumerate(log):
        asyncio.run(bc.apply(p, [(off, raw)]))
        if (i + 1) % every == 0:
            asyncio.run(bc.checkpoint())
    asyncio.run(bc.checkpoint())
    assert fw.timeline == ref.timeline and fw.deadletters == ref.deadletters
    assert store.data == ref_store.data
    assert store.batches and all(b[-1].startswith("p/") for b in store.batches)
    assert all(not k.startswith("p/") for b in store.batches for k in b[:-1])


def test_crash_points_sit_between_the_write_batches() -> None:
    """With a crash point the writes are those of production, one batch per partition,
    and the crash point sits between two partitions' batches: b batches in a checkpoint,
    b - 1 crash points between them, the same store as without crash points."""
    log = _log(6)
    calls: list[str] = []
    ref, store = BatchStore(), BatchStore()
    plain = BoundCommit(Bounder(S), ref, CollectingSink())
    bc = BoundCommit(Bounder(S), store, CollectingSink(), crash_point=calls.append)
    for i in range(0, 12, 3):
        asyncio.run(plain.apply(*log[i][:1], [log[i][1:]]))
        asyncio.run(plain.commit(*log[i + 1][:1], [log[i + 1][1:]]))
        asyncio.run(bc.apply(*log[i][:1], [log[i][1:]]))
        asyncio.run(bc.commit(*log[i + 1][:1], [log[i + 1][1:]]))
    assert store.data == ref.data and store.batches == ref.batches
    assert calls.count("unit_after_state") == 4
    assert calls.count("unit_between_state_writes") == len(store.batches) - 4 > 0


def test_gc_deferred_restores_the_collector() -> None:
    """The collector is off inside and back as it was after, also after an exception; a
    collector someone else turned off stays off."""
    assert gc.isenabled()
    with bounding.gc_deferred():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(Killed), bounding.gc_deferred():
        raise Killed("inside")
    assert gc.isenabled()
    gc.disable()
    try:
        with bounding.gc_deferred():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_unit_is_read_from_the_store_once_per_checkpoint() -> None:
    """Between two checkpoints a unit's value is decoded once (then carried in the
    transaction), however many batches touch it; the partition value stays decoded
    across checkpoints while the store holds the bytes it was written as. Control: a
    checkpoint after every batch reads the units again."""
    log = _log(7, n_records=40)
    reads: list[str] = []

    class Counting(DictStore):
        def get(self, key: str) -> bytes | None:
            reads.append(key)
            return super().get(key)

    def unit_reads(every: int) -> int:
        reads.clear()
        store = Counting()
        bc = BoundCommit(Bounder(S), store, CollectingSink())
        for i, (p, off, raw) in enumerate(log):
            asyncio.run(bc.apply(p, [(off, raw)]))
            if (i + 1) % every == 0:
                asyncio.run(bc.checkpoint())
        asyncio.run(bc.checkpoint())
        return sum(k.startswith("u/") for k in reads)

    units = {r[0] for _, _, raw in log for r in decode_units(raw)[1]}
    assert unit_reads(1000) == len(units)
    assert unit_reads(1) > len(units)
    ps_reads = [k for k in reads if k.startswith("p/")]
    assert len(ps_reads) == len(log)  # one read (compared, not decoded) per batch


def test_a_failed_batch_forgets_every_unwritten_change() -> None:
    """A batch that raises (a corrupt stored unit value) fails the open transactions
    and drops what was applied since the last checkpoint: once the value is repaired,
    re-applying from the last acknowledged record gives the reference run's state,
    forwards and dead letters."""
    log = _log(8)
    ref, ref_store = _run(log)
    fw, store = CollectingSink(), DictStore()
    bc = BoundCommit(Bounder(S), store, fw)
    half = len(log) // 2
    for p, off, raw in log[:half]:
        asyncio.run(bc.commit(p, [(off, raw)]))
    p, off, raw = log[half]
    h = decode_units(raw)[1][0][0]
    good = store.data.get(f"u/{h}")
    store.data[f"u/{h}"] = b"DPU\x04" + (0).to_bytes(8, "big") + b"not json"
    # Staged but unwritten changes of an earlier batch of the other partition.
    other = next(i for i in range(half + 1, len(log)) if log[i][0] != p)
    asyncio.run(bc.apply(log[other][0], [(log[other][1], log[other][2])]))
    with pytest.raises(ValueError):
        asyncio.run(bc.apply(p, [(off, raw)]))
    assert bc.dirty_since is None
    asyncio.run(bc.checkpoint())  # nothing left to write
    if good is None:
        del store.data[f"u/{h}"]
    else:
        store.data[f"u/{h}"] = good
    for p, off, raw in log[half:]:
        asyncio.run(bc.commit(p, [(off, raw)]))
    assert store.data == ref_store.data
    assert _kept(fw) == _kept(ref) and _dead(fw) == _dead(ref)


def test_held_forwards_share_timeline_records() -> None:
    """Forwards held back over many units records (of both units partitions) and sent
    by one `forward_held`, and by a checkpoint: the same events, in each (timeline
    partition, units partition) in strictly increasing seq order (the operator's
    duplicate filter drops none of them), in fewer timeline records; the same dead
    letters and state. A failure drops the held events with the unwritten state, and
    re-applying sends them."""
    log = _log(4, n_records=40)
    ref, ref_store = _run(log)
    fw, store = CollectingSink(), DictStore()
    bc = BoundCommit(Bounder(S), store, fw)
    half = len(log) // 2
    for p, off, raw in log[:half]:
        asyncio.run(bc.apply(p, [(off, raw)], forward=False))
    assert fw.timeline == [] and bc.bounder.pending_events
    bc.forward_held()
    assert bc.bounder.pending_events == 0
    for p, off, raw in log[half:]:
        asyncio.run(bc.apply(p, [(off, raw)], forward=False))
    asyncio.run(bc.checkpoint())
    assert bc.bounder.pending_events == 0
    assert _kept(fw) == _kept(ref) and _dead(fw) == _dead(ref)
    assert store.data == ref_store.data
    assert len(fw.timeline) <= 2 * S.partitions < len(ref.timeline)
    last: dict[tuple[int, int], int] = {}
    n = 0
    for tp, data in fw.timeline:
        batch = decode_timeline(data)
        assert isinstance(batch, TimelineBatch)
        for ev in batch.events:
            assert ev.src_offset > last.get((tp, ev.src_partition), -1)
            last[(tp, ev.src_partition)] = ev.src_offset
            n += 1
    assert n == len(_kept(ref))
    # A failure: the held events go with the unwritten state, and come back.
    fw2, store2 = CollectingSink(), DictStore()
    bc2 = BoundCommit(Bounder(S), store2, fw2)
    for p, off, raw in log[:half]:
        asyncio.run(bc2.apply(p, [(off, raw)], forward=False))
    bc2.forget()
    assert bc2.bounder.pending_events == 0 and fw2.timeline == []
    for p, off, raw in log:
        asyncio.run(bc2.apply(p, [(off, raw)], forward=False))
    asyncio.run(bc2.checkpoint())
    assert _kept(fw2) == _kept(ref) and _dead(fw2) == _dead(ref)
    assert store2.data == ref_store.data


def test_held_forwards_are_split_at_the_record_limits(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """Held forwards beyond a record's event or byte limit go in several records, in
    order, none above the limits."""
    monkeypatch.setattr(bounding, "MAX_BATCH_EVENTS", 7)
    monkeypatch.setattr(bounding, "MAX_BATCH_BYTES", 300)
    log = _log(5, n_records=40)
    ref, _ = _run(log)
    fw, store = CollectingSink(), DictStore()
    bc = BoundCommit(Bounder(S), store, fw)
    for p, off, raw in log:
        asyncio.run(bc.apply(p, [(off, raw)], forward=False))
    asyncio.run(bc.checkpoint())
    assert _kept(fw) == _kept(ref)
    for _, data in fw.timeline:
        batch = decode_timeline(data)
        assert isinstance(batch, TimelineBatch)
        assert len(batch.events) <= 7 and (len(data) <= 300 or len(batch.events) == 1)


def test_forwards_are_held_back_a_fraction_of_the_lateness() -> None:
    """The worker holds kept events back for at most a quarter of the lateness (an event
    stamped now reaches the timeline long before the marker that seals its tick), and
    never more than HOLD_MAX_S; with no lateness, not at all."""
    from processor.stream.worker.unit_stage import HOLD_MAX_S, hold_s

    assert hold_s(with_overrides(S, lateness_ms=100)) == pytest.approx(0.025)
    assert hold_s(with_overrides(S, lateness_ms=60_000)) == HOLD_MAX_S
    assert hold_s(with_overrides(S, lateness_ms=0)) == 0.0


def test_unit_value_bytes_are_pinned() -> None:
    """A unit value's bytes: the magic, the units offset of its last seq (big-endian
    int64, -1 before any), then [last seq, [[counter, [seqs]], ...] in first-touch
    order, {input label: highest input offset}]; a value decoded from them encodes to the
    same bytes, one that decides again keeps the format, and a value written before the
    per-unit filter (no third element) decodes with an empty one."""
    seq = 5 << SEQ_BITS | 3
    st = UnitState()
    assert st.to_bytes() == b"DPU\x04" + (-1).to_bytes(8, "big", signed=True) + b"[-1,[],{}]"
    assert bounding.decide(st, seq, "b", K, M)
    assert bounding.decide(st, seq + 1, "a", K, M)
    assert bounding.decide(st, seq + 2, "b", K, M)
    st.inputs["in:0"] = 7
    raw = st.to_bytes()
    assert raw == (b"DPU\x04" + (5).to_bytes(8, "big")
                   + b"[%d,[[\"b\",[%d,%d]],[\"a\",[%d]]],{\"in:0\":7}]"
                   % (seq + 2, seq, seq + 2, seq + 1))
    back = UnitState.from_bytes(raw)
    assert back.to_bytes() == raw
    assert bounding.decide(back, seq + 3, "b", K, M)
    assert not bounding.decide(back, seq + 4, "c", K, M)
    assert back.to_bytes() == (b"DPU\x04" + (5).to_bytes(8, "big")
                               + b"[%d,[[\"b\",[%d,%d,%d]],[\"a\",[%d]]],{\"in:0\":7}]"
                               % (seq + 4, seq, seq + 2, seq + 3, seq + 1))
    legacy = UnitState.from_bytes(b"DPU\x04" + (5).to_bytes(8, "big") + b"[%d,[]]" % seq)
    assert (legacy.last_seq, legacy.kept, legacy.inputs) == (seq, {}, {})


def _shared_filter() -> Callable[..., bool]:
    """The broken variant of the controls below: one input filter for every unit of the
    units partition (what the stage had before the filter was made per unit)."""
    shared: dict[str, int] = {}

    def fresh(st: UnitState, labels: dict[int, str], epoch: int, in_p: int,
              in_o: int) -> bool:
        label = f"{epoch}/{in_p}"
        if in_o <= shared.get(label, -1):
            return False
        shared[label] = in_o
        return True

    return fresh


def test_no_unit_is_a_duplicate_of_another_units_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ingest owners of input partition 0 write out of order (a zombie's late write of
    older offsets): alice's event at input offset 20, then bob's at 10 and a re-sent copy
    of alice's. Bob's event is kept (only alice's own events filter hers), alice's copy is
    dropped (the filter still filters), replay agrees. Control: a filter shared by the
    units partition drops bob's event because of alice's."""
    log = [(0, 0, encode_units([_row("alice", "a", 20)], "in")),
           (0, 1, encode_units([_row("bob", "a", 10), _row("alice", "a", 20)], "in"))]
    fw, _ = _run(log)
    assert _kept(fw) == [(0, 0), (0, 1 << SEQ_BITS)]
    assert not fw.deadletters
    assert kept_inputs(S, log) == {(0, 20), (0, 10)}
    monkeypatch.setattr(bounding, "_fresh", _shared_filter())
    fw2, _ = _run(log)
    assert _kept(fw2) == [(0, 0)]


def _unit_of(log: Sequence[tuple[int, int, bytes]]) -> dict[tuple[int, int], str]:
    return {(r[4], r[5]): r[0] for _, _, raw in log for r in decode_units(raw)[1]}


def _without(log: Sequence[tuple[int, int, bytes]], h: str
             ) -> list[tuple[int, int, bytes]]:
    out = []
    for p, off, raw in log:
        source, rows = decode_units(raw)
        out.append((p, off, encode_units([r for r in rows if r[0] != h], source)))
    return out


def _independent(log: list[tuple[int, int, bytes]]) -> bool:
    """Whether every unit's kept events are the same with and without any one other
    unit's events in the log."""
    unit_of = _unit_of(log)
    kept = kept_inputs(S, log)
    for h in sorted(set(unit_of.values())):
        others = {c for c in kept if unit_of[c] != h}
        if kept_inputs(S, _without(log, h)) != others:
            return False
    return True


def test_kept_sets_are_independent_of_other_units_under_out_of_order_writes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed seeds (an exact property, no false alarms): a units log in which a zombie
    ingest writes one earlier batch again, late (its input offsets below those already
    written: the copies, and out of order); removing any one unit's events leaves every
    other unit's kept events unchanged. Control: with a filter shared by the units
    partition some seed's log fails the same check."""
    logs = []
    for seed in range(4):
        log = _log(seed, n_records=12, partitions=1)
        rng = random.Random(seed)
        p, _, raw = log[rng.randrange(len(log) // 2)]
        log.append((p, log[-1][1] + 1, raw))  # the zombie's late write
        logs.append(log)
    assert all(_independent(log) for log in logs)
    monkeypatch.setattr(bounding, "_fresh", _shared_filter())
    assert not all(_independent(log) for log in logs)


def _copy(data: dict[str, bytes]) -> DictStore:
    store = DictStore()
    store.data.update(data)
    return store


def test_the_state_records_its_bounds_and_a_restore_under_others_is_refused() -> None:
    """The units partition value records the bounds its kept sets were decided under; a
    stage under other bounds refuses it (BoundsChangeError naming the field, before it
    forwards anything), as the operator refuses a counter's other parameters. Controls:
    the same bounds go on; a confirmed migration goes on; a value written before bounds
    were recorded is taken."""
    log = _log(5, n_records=6, partitions=1)
    _, store = _run(log[:3])
    stored = UnitsPartitionState.from_bytes(store.data[partition_key(0)])
    assert stored.bounds == (K, M)
    for k, m, name in ((K + 1, M, "unit.max_events_per_counter"),
                       (K, M - 1, "unit.max_counters_per_unit")):
        other = with_unit(BASE, 4.0, 1e-6, k, m)
        fw = CollectingSink()
        bc = BoundCommit(Bounder(other), _copy(store.data), fw)
        p, off, raw = log[3]
        with pytest.raises(BoundsChangeError) as err:
            asyncio.run(bc.commit(p, [(off, raw)]))
        assert err.value.field == name and str(err.value).startswith(f"{name}:")
        assert "confirm_migration" in str(err.value)
        assert not fw.timeline and not fw.deadletters
        confirmed = with_overrides(other, unit_confirm_migration=True)
        asyncio.run(BoundCommit(Bounder(confirmed), _copy(store.data),
                                CollectingSink()).commit(p, [(off, raw)]))
    same = CollectingSink()
    asyncio.run(BoundCommit(Bounder(S), _copy(store.data), same).commit(
        *log[3][:1], [log[3][1:]]))
    legacy = dict(store.data)
    for key, value in legacy.items():
        if key.startswith("p/"):
            legacy[key] = value[:12] + b'{"i":{}}'
    asyncio.run(BoundCommit(Bounder(with_unit(BASE, 4.0, 1e-6, K + 1, M)), _copy(legacy),
                            CollectingSink()).commit(*log[3][:1], [log[3][1:]]))


def test_a_bounds_refusal_halts_at_a_timer_round_never_at_a_record() -> None:
    """Restored state decided under other bounds: the watch's first round after the
    assignment refuses it whether or not a units record met it first (a record that does
    is held, not refused at its time), so the halt's time does not depend on an event. A
    partition whose value is not restored yet is read again at the next round. Controls:
    the same bounds pass every round; a partition not assigned is never read."""
    _, store = _run(_log(5, n_records=3, partitions=1))
    other = Bounder(with_unit(BASE, 4.0, 1e-6, K + 1, M))

    def reader(data: dict[str, bytes]) -> Callable[[int, str], bytes | None]:
        return lambda partition, key: data.get(key)

    halts = []
    for with_record in (False, True):
        watch = BoundsWatch(other)
        watch.assigned({0})
        if with_record:
            bc = BoundCommit(other, _copy(store.data), CollectingSink())
            p, off, raw = _log(5, n_records=4, partitions=1)[3]
            with pytest.raises(BoundsChangeError) as met:
                asyncio.run(bc.commit(p, [(off, raw)]))
            watch.held(met.value)
        rounds = 0
        with pytest.raises(BoundsChangeError) as err:
            for rounds in range(1, 4):  # noqa: B007 - the round that raised is the result
                watch.round(reader(store.data))
        assert err.value.field == "unit.max_events_per_counter"
        halts.append(rounds)
    assert halts == [1, 1]

    restoring: dict[str, bytes] = {}
    watch = BoundsWatch(other)
    watch.assigned({0})
    watch.round(reader(restoring))
    restoring.update(store.data)
    with pytest.raises(BoundsChangeError):
        watch.round(reader(restoring))

    same = BoundsWatch(Bounder(S))
    same.assigned({0})
    for _ in range(3):
        same.round(reader(store.data))
    read: list[int] = []

    def logged(partition: int, key: str) -> bytes | None:
        read.append(partition)
        return None

    elsewhere = BoundsWatch(other)
    elsewhere.assigned({1})
    elsewhere.round(logged)
    elsewhere.assigned(())
    elsewhere.round(logged)
    assert read == [1]


def test_a_recreated_input_topic_starts_each_units_filter_afresh() -> None:
    """The unit's filter names an input partition by the index of its input identity in
    the units partition value: a recreated input topic (a new identity, offsets from 0)
    is not taken for copies. Control: the same identity at offset 0 is a copy."""
    first = (0, 0, encode_units([_row("alice", "a", 20)], "topic-1"))
    fw, store = _run([first, (0, 1, encode_units([_row("alice", "a", 0)], "topic-2"))])
    assert _kept(fw) == [(0, 0), (0, 1 << SEQ_BITS)]
    ps = UnitsPartitionState.from_bytes(store.data[partition_key(0)])
    assert ps.sources == ["topic-1", "topic-2"]
    fw2, _ = _run([first, (0, 1, encode_units([_row("alice", "a", 0)], "topic-1"))])
    assert _kept(fw2) == [(0, 0)]
