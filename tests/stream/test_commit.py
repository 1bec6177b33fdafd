"""The commit protocol (commit.BatchCommit): a crash at any step of a checkpoint, or
between checkpoints, then re-execution, loses nothing, double-counts nothing and
publishes what an uninterrupted run publishes; the due wheel is never late; each touched
counter is encoded once per checkpoint. Pure: no Kafka (the worker's kill -9 tests are
tests/stream/test_crash.py)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable
from typing import Any
from unittest import mock

import pytest

from processor.core import registry
from processor.core.grid import UNIT
from processor.stream.model import operator
from processor.stream.model.clock import PROBE_RECORD
from processor.stream.model.commit import CRASH_POINTS, INLINE_STEPS, BatchCommit
from processor.stream.model.config import Settings
from processor.stream.model.operator import (
    CATCHUP_HEARTBEAT_TICKS,
    DEFERRED_HEARTBEATS,
    DEFERRED_TICKS_MAX,
    Operator,
    heartbeat_floor,
)
from processor.stream.model.outputs import CollectingSink, Output
from processor.stream.model.records import Event, LedgerEntry, Release, encode_batch, encode_marker
from processor.stream.model.state import CounterState, DictStore, advance_counter_value
from tests.stream.test_operator import (
    KEY,
    TICK,
    StepCounter,
    StepFactory,
    random_timeline,
    settings,
    to_records,
)

Batches = list[list[tuple[int, bytes]]]


class Crash(Exception):
    """Stands for a SIGKILL: nothing after it runs."""


class FailingStore(DictStore):
    """A DictStore whose k-th write (set or delete) raises."""

    def __init__(self, data: dict[str, bytes], fail_at: int) -> None:
        super().__init__()
        self.data = dict(data)
        self.fail_at = fail_at
        self.writes = 0

    def _count(self) -> None:
        self.writes += 1
        if self.writes == self.fail_at:
            raise Crash("store write failed")

    def set(self, key: str, value: bytes) -> None:
        self._count()
        super().set(key, value)

    def delete(self, key: str) -> None:
        self._count()
        super().delete(key)


class Published:
    """What reached the public topics, as a subscriber sees it: records keyed by
    (counter, tick) / counter; a second, different record for a key is a failure."""

    def __init__(self) -> None:
        self.releases: dict[tuple[str, int], Release] = {}
        self.ledger: dict[str, LedgerEntry] = {}
        self.order: list[Release] = []
        #: Every release sent, re-sends included, in order.
        self.sent: list[Release] = []

    def send(self, out: Output) -> None:
        releases = out.decoded_releases()
        self.sent.extend(releases)
        for e in out.ledger:
            assert self.ledger.setdefault(e.counter, e) == e, "ledger entry changed"
        for r in releases:
            got = self.releases.setdefault((r.counter, r.tick), r)
            assert got == r, f"a second, different value for {(r.counter, r.tick)}"
            if got is r:
                self.order.append(r)

    async def flush(self) -> None:
        return None


def canonical(data: dict[str, bytes]) -> dict[str, Any]:
    """The store's content (nothing may differ after a crash and re-execution)."""
    return dict(data)


def batches_of(records: list[bytes], rng: random.Random) -> Batches:
    out: Batches = []
    i = 0
    while i < len(records):
        k = rng.choice([1, 2, 3, 5, 8])
        out.append([(off, records[off]) for off in range(i, min(i + k, len(records)))])
        i += k
    return out


def run_clean(s: Settings, batches: Batches, factory: Any) -> tuple[DictStore, Published]:
    store = DictStore()
    pub = Published()
    bc = BatchCommit(Operator(s, KEY, factory=factory), store, pub)
    for b in batches:
        asyncio.run(bc.commit(0, b))
    return store, pub


def run_with_crashes(s: Settings, batches: Batches, factory: Any, seed: int,
                     crash_above: float, max_crashes: int, full: bool = False,
                     ) -> tuple[DictStore, Published, int]:
    """Apply `batches` through BatchCommit; after each, by a roll of Random(seed): below
    0.3 a checkpoint (`full` or not), above `crash_above` (at most `max_crashes` times,
    with something applied since the last checkpoint) a crash: a new operator on the
    store, the batches since the last checkpoint applied again. Then a full checkpoint.
    Returns the store, what was published and how many crashes there were."""
    schedule = random.Random(seed)
    store, pub = DictStore(), Published()
    bc = BatchCommit(Operator(s, KEY, factory=factory), store, pub)
    i = done = crashes = 0
    while i < len(batches):
        asyncio.run(bc.apply(0, batches[i]))
        roll = schedule.random()
        i += 1
        if roll < 0.3:
            asyncio.run(bc.checkpoint(full=full))
            done = i
        elif roll > crash_above and crashes < max_crashes and i > done:
            crashes += 1
            bc = BatchCommit(Operator(s, KEY, factory=factory), store, pub)
            i = done
    asyncio.run(bc.checkpoint())
    return store, pub, crashes


def every_third_checkpoint(s: Settings, batches: Batches, store: DictStore, full: bool,
                           crash_at: Iterable[int] = (),
                           checked: Callable[[DictStore, int], None] | None = None,
                           at_crash: Callable[[DictStore], None] | None = None) -> Published:
    """Apply `batches` through BatchCommit on `store`: a checkpoint (`full` or not) after
    every third, `checked(store, i)` after each; a crash after each batch i of `crash_at`
    that no checkpoint follows (`at_crash(store)` first; a cold operator on the store,
    the batches since the last checkpoint again). Then a full checkpoint. Returns what
    was published."""
    pub = Published()
    bc = BatchCommit(Operator(s, KEY, factory=registry), store, pub)
    i = done = 0
    crashes = set(crash_at)
    while i < len(batches):
        asyncio.run(bc.apply(0, batches[i]))
        i += 1
        if i % 3 == 0:
            asyncio.run(bc.checkpoint(full=full))
            done = i
            if checked is not None:
                checked(store, i)
        elif i in crashes:
            crashes.discard(i)
            if at_crash is not None:
                at_crash(store)
            bc = BatchCommit(Operator(s, KEY, factory=registry), store, pub)
            i = done
    asyncio.run(bc.checkpoint())
    return pub


def run_with_crash(s: Settings, batches: Batches, factory: Any, at: int,
                   crash_point: Callable[[str], None] | None, fail_at: int,
                   redeliver_from: int, warm: bool) -> tuple[DictStore, Published]:
    """Run batches[:at], crash inside batch `at` (at a crash point, or at the store's
    fail_at-th write), then re-execute from batch `redeliver_from` <= at (at-least-once
    redelivery from an older committed offset), with a warm or a cold operator."""
    store = DictStore()
    pub = Published()
    op = Operator(s, KEY, factory=factory)
    for b in batches[:at]:
        asyncio.run(BatchCommit(op, store, pub).commit(0, b))
    failing = FailingStore(store.data, fail_at if crash_point is None else 0)
    with pytest.raises(Crash):
        asyncio.run(BatchCommit(op, failing, pub, crash_point).commit(0, batches[at]))
    store.data = failing.data
    if not warm:
        op = Operator(s, KEY, factory=factory)
    for b in batches[redeliver_from:]:
        asyncio.run(BatchCommit(op, store, pub).commit(0, b))
    return store, pub


def crash_at(name: str, k: int) -> Callable[[str], None]:
    calls = {"n": 0}

    def point(p: str) -> None:
        assert p in CRASH_POINTS
        if p == name:
            calls["n"] += 1
            if calls["n"] == k:
                raise Crash(f"{name}:{k}")

    return point


def writes_of_each_batch(s: Settings, batches: Batches, factory: Any) -> list[int]:
    counts = []
    store = FailingStore({}, 0)
    bc = BatchCommit(Operator(s, KEY, factory=factory), store, CollectingSink())
    for b in batches:
        before = store.writes
        asyncio.run(bc.commit(0, b))
        counts.append(store.writes - before)
    return counts


@pytest.mark.parametrize("seed,mechanism", [(1, "step"), (2, "step"), (3, "ecc"),
                                            (4, "simecc")])
def test_a_crash_at_every_step_of_a_batch_loses_and_duplicates_nothing(
        seed: int, mechanism: str) -> None:
    """For a sample of batches, a crash at every crash point (after the acks, after the
    state; one partition, so one write batch and no point between two) and at every
    single state write of the store (a kill inside the write batch's changelog records);
    re-execution from that batch or an earlier one, with a warm or a cold operator.
    Published records (keyed by (counter, tick), so a redrawn noise value would show as
    a second, different record) and the final state equal those of one uninterrupted
    run. Events carry input offsets, so the duplicate filter is in play. With the real
    ECC and SimECC too (their noise positions live in the state)."""
    rng = random.Random(seed)
    kw: dict[str, Any] = {"heartbeat_ticks": 5}
    factory: Any = StepFactory(2, 3)
    if mechanism != "step":
        factory = registry
        kw.update(mechanism=mechanism, epsilon=200.0)
    s = settings({"a": 100 * TICK, "b": 100 * TICK, "c": 103 * TICK}, **kw)
    recs = (random_timeline(rng, ["a", "b", "c"], 100, 40, 0.4) if mechanism == "step"
            else random_timeline(rng, ["a", "b", "c"], 100, 90, 0.6))
    records = to_records(recs, 4)
    batches = batches_of(records, rng)
    clean_store, clean_pub = run_clean(s, batches, factory)
    assert len(clean_pub.releases) > 20 and len(clean_pub.ledger) == 3
    if mechanism != "step":
        assert any(r.kind == "change" for r in clean_pub.releases.values())
    writes = writes_of_each_batch(s, batches, factory)
    tried = 0
    for at in [*sorted(rng.sample(range(len(batches)), 10)), 0, len(batches) - 1]:
        points: list[tuple[Callable[[str], None] | None, int]] = [
            (crash_at("after_acks", 1), 0), (crash_at("after_state", 1), 0)]
        points += [(None, k) for k in range(1, writes[at] + 1)]
        for point, fail_at in points:
            back = rng.randrange(max(at - 2, 0), at + 1)
            store, pub = run_with_crash(s, batches, factory, at, point, fail_at, back,
                                        warm=rng.random() < 0.5)
            assert pub.releases == clean_pub.releases
            assert pub.ledger == clean_pub.ledger
            assert canonical(store.data) == canonical(clean_store.data)
            tried += 1
    assert tried >= 60


def test_wrong_write_order_is_caught() -> None:
    """Control for the test above: a checkpoint that writes the partition value (its
    duplicate filter) BEFORE the counters, and dies before the counters are written,
    loses events at re-execution for some crash point: the filter drops them."""
    rng = random.Random(4)
    s = settings({"a": 100 * TICK, "b": 100 * TICK}, heartbeat_ticks=1_000_000)
    recs = random_timeline(rng, ["a", "b"], 100, 30, 0.3)
    batches = batches_of(to_records(recs, 3), rng)
    factory = StepFactory()
    _, clean_pub = run_clean(s, batches, factory)

    class PartitionFirst:
        """Writes partition values through, holds counter values back (lost at a crash);
        its own Stores, as a DictStore is."""

        shares_bytes = True

        def __init__(self, store: DictStore) -> None:
            self.store = store
            self.held: list[tuple[str, bytes]] = []

        generation = DictStore.generation  # None: it cannot tell

        def get(self, key: str) -> bytes | None:
            return self.store.get(key)

        get_many = DictStore.get_many  # its get, key by key

        def scan(self, prefix: str) -> Any:
            return self.store.scan(prefix)

        def set(self, key: str, value: bytes) -> None:
            if key.startswith("c/"):
                self.held.append((key, value))
            else:
                self.store.set(key, value)

        def delete(self, key: str) -> None:
            self.store.delete(key)

        def write_many(self, writes: Iterable[tuple[str, bytes]]) -> None:
            for key, value in writes:
                self.set(key, value)

        def of(self, partition: int) -> PartitionFirst:
            return self

        async def flush(self) -> None:
            return None

    bad = 0
    for at in range(len(batches)):
        store = DictStore()
        pub = Published()
        op = Operator(s, KEY, factory=factory)
        for b in batches[:at]:
            asyncio.run(BatchCommit(op, store, pub).commit(0, b))
        with pytest.raises(Crash):
            asyncio.run(BatchCommit(op, PartitionFirst(store), pub,
                                    crash_at("after_state", 1)).commit(0, batches[at]))
        op = Operator(s, KEY, factory=factory)
        try:
            for b in batches[at:]:
                asyncio.run(BatchCommit(op, store, pub).commit(0, b))
        except AssertionError:  # Published saw a second, different record
            bad += 1
            continue
        bad += pub.releases != clean_pub.releases
    assert bad > 0


@pytest.mark.parametrize("full,rate", [(True, 0.6), (False, 0.6), (False, 0.05)])
def test_checkpoints_between_batches_equal_a_checkpoint_per_batch(full: bool,
                                                                  rate: float) -> None:
    """Batches applied with checkpoints at random intervals, a crash (all unwritten state
    lost) at random points between them, and re-delivery from the batch after the last
    checkpoint (what the consumer group re-delivers: acks follow checkpoints): the
    published records and the final state equal those of one checkpoint per batch, with
    the real ECC. Not `full`: the checkpoints leave counters that markers advanced by ⊥
    ticks only behind in the store (the last one is full; sparse events leave them some).
    Control: re-delivering from one batch too late loses something."""
    rng = random.Random(7)
    s = settings({"a": 100 * TICK, "b": 100 * TICK, "c": 102 * TICK}, mechanism="ecc",
                 epsilon=200.0, heartbeat_ticks=5)
    recs = random_timeline(rng, ["a", "b", "c"], 100, 80 if rate > 0.5 else 200, rate)
    batches = batches_of(to_records(recs, 4), rng)
    clean_store, clean_pub = run_clean(s, batches, registry)

    def run(skip_one: bool) -> tuple[DictStore, Published]:
        store, pub = DictStore(), Published()
        bc = BatchCommit(Operator(s, KEY, factory=registry), store, pub)
        done = i = 0  # batches[:done] are covered by a checkpoint
        crashes = 0
        while i < len(batches):
            asyncio.run(bc.apply(0, batches[i]))
            i += 1
            roll = rng.random()
            if roll < 0.3:
                deferred["n"] += bool(bc.operator.deferred_partitions())
                asyncio.run(bc.checkpoint(full=full))
                done = i
            elif roll < 0.4 and crashes < 6:
                crashes += 1
                bc = BatchCommit(Operator(s, KEY, factory=registry), store, pub)
                i = done + (1 if skip_one and done < i else 0)
        asyncio.run(bc.checkpoint())
        return store, pub

    deferred = {"n": 0}
    store, pub = run(skip_one=False)
    assert pub.releases == clean_pub.releases and pub.ledger == clean_pub.ledger
    assert store.data == clean_store.data
    assert (deferred["n"] > 0) is (rate < 0.5)
    try:
        lost_store, lost = run(skip_one=True)
        caught = lost.releases != clean_pub.releases or lost_store.data != clean_store.data
    except AssertionError:  # Published saw a second, different record
        caught = True
    assert caught


def test_idle_counters_stay_behind_in_the_store_within_the_bound() -> None:
    """Markers only (idle counters, heartbeats every 5 ticks): periodic checkpoints that
    are not full write a counter at most once per DEFERRED_HEARTBEATS + 1 heartbeats,
    none further behind than the bound; a crash then (the store's values, a cold
    operator, re-delivery after the last checkpoint) publishes nothing new but identical
    heartbeats, and the final state after a full checkpoint equals a checkpoint per
    marker. Every counter is written at every heartbeat with full checkpoints."""
    names = [f"k{i:02d}" for i in range(20)]
    s = settings(dict.fromkeys(names, 100 * TICK), mechanism="ecc", epsilon=1.0,
                 heartbeat_ticks=5)
    # Over 800 ticks: the bound (DEFERRED_HEARTBEATS intervals, 320 ticks) is reached
    # twice.
    batches: Batches = [[(i, encode_marker(n))] for i, n in enumerate(range(100, 900))]
    assert len(batches) > 2 * DEFERRED_HEARTBEATS * 5
    clean_store, clean_pub = run_clean(s, batches, registry)

    def within_bound(store: DictStore, i: int) -> None:
        for raw in (v for k, v in store.data.items() if k.startswith("c/")):
            cs = CounterState.from_bytes(raw, registry, KEY)
            assert cs.frontier >= 100 + i - 1 - 5 * (DEFERRED_HEARTBEATS + 2)

    def run(full: bool, crash_at: int | None) -> tuple[DictStore, Published, int]:
        store = FailingStore({}, 0)
        pub = every_third_checkpoint(s, batches, store, full,
                                     () if crash_at is None else (crash_at,), within_bound)
        return store, pub, store.writes

    _, _, every = run(True, None)
    store, pub, deferred = run(False, None)
    assert every >= 20 * 800 // 5 // 2 and deferred * 3 < every
    assert pub.releases == clean_pub.releases and store.data == clean_store.data
    store, pub, _ = run(False, 650)
    assert pub.releases == clean_pub.releases and pub.ledger == clean_pub.ledger
    assert store.data == clean_store.data


def test_what_a_restart_re_sends_does_not_depend_on_which_counters_had_input() -> None:
    """Sparse events on some counters, periodic checkpoints and crashes at the same points:
    with checkpoints that leave heartbeat-only counters behind in the store, every record
    sent, re-sends included and in order, is what full checkpoints send (a re-send's
    existence would otherwise tell the counters that had input from those that had none),
    and the final state is the same. Control: without the published frontier (re-sealed
    ticks send their heartbeats again) the re-sends differ."""
    names = [f"k{i:02d}" for i in range(12)]
    s = settings(dict.fromkeys(names, 100 * TICK), mechanism="ecc", epsilon=1.0,
                 heartbeat_ticks=5)
    rng = random.Random(11)
    recs = random_timeline(rng, names[:3], 100, 300, 0.05)
    batches = batches_of(to_records(recs, 4), rng)

    def run(full: bool) -> tuple[DictStore, Published]:
        # The same seed: the same checkpoints and crashes in every run.
        store, pub, _crashes = run_with_crashes(s, batches, registry, 5, 0.95, 8, full)
        return store, pub

    full_store, full_pub = run(True)
    store, pub = run(False)
    assert len(pub.sent) > len(pub.order)  # the crashes re-sent something
    assert pub.sent == full_pub.sent
    assert store.data == full_store.data
    with mock.patch.object(operator, "heartbeat_floor", lambda n, start, h, published:
                           heartbeat_floor(n, start, h, None)):
        _, leaky = run(False)
    assert leaky.sent != full_pub.sent


def test_a_restart_re_sealing_beyond_the_catch_up_window_re_sends_what_full_checkpoints_send(
        ) -> None:
    """Heartbeats every 20 ticks, so the deferral bound (DEFERRED_HEARTBEATS intervals)
    is longer than the catch-up window (CATCHUP_HEARTBEAT_TICKS): crashes where counters'
    stored values are further behind than that window re-seal more ticks at once than
    a catch-up publishes heartbeats of. Every record sent, re-sends included and in
    order, is still what full checkpoints send, and the final state is the same: what a
    re-seal sends does not depend on how far behind the stored value was
    (`heartbeat_floor` counts from the marker and the partition's frontier). Control:
    without the partition's frontier the re-sends differ."""
    h = 20
    assert CATCHUP_HEARTBEAT_TICKS < DEFERRED_HEARTBEATS * h <= DEFERRED_TICKS_MAX
    names = [f"k{i:02d}" for i in range(8)]
    s = settings(dict.fromkeys(names, 100 * TICK), mechanism="ecc", epsilon=1.0,
                 heartbeat_ticks=h, heartbeat_spread=True)
    rng = random.Random(5)
    recs = random_timeline(rng, names[:2], 100, 2700, 0.01)
    batches = batches_of(to_records(recs, 4), rng)
    # Not after a checkpoint: batches since it are applied again.
    crash_at = {k + (k % 3 == 0) for k in (len(batches) * 45 // 100, len(batches) * 95 // 100)}

    def run(full: bool) -> tuple[DictStore, Published, int]:
        """The store, what was published and the most ticks a stored counter value was
        behind another at a crash."""
        lag = [0]

        def behind(store: DictStore) -> None:
            frontiers = [CounterState.from_bytes(v, registry, KEY).frontier
                         for k, v in store.data.items() if k.startswith("c/")]
            lag[0] = max(lag[0], max(frontiers) - min(frontiers))

        store = DictStore()
        pub = every_third_checkpoint(s, batches, store, full, crash_at, at_crash=behind)
        return store, pub, lag[0]

    full_store, full_pub, _ = run(True)
    store, pub, lag = run(False)
    assert lag > CATCHUP_HEARTBEAT_TICKS  # the crashes re-sealed beyond the window
    assert len(pub.sent) > len(pub.order)  # and re-sent something
    assert pub.sent == full_pub.sent
    assert store.data == full_store.data
    with mock.patch.object(operator, "heartbeat_floor", lambda n, start, h, published:
                           heartbeat_floor(n, start, h, None)):
        _, leaky, _ = run(False)
    assert leaky.sent != full_pub.sent


class CountingRegistry:
    """The core registry, counting the counter states it decodes."""

    def __init__(self) -> None:
        self.restored = 0

    def make(self, *args: Any) -> Any:
        return registry.make(*args)

    def restore(self, data: bytes, key: Any) -> Any:
        self.restored += 1
        return registry.restore(data, key)


#: The bounds compared: a cache that evicts at every load beyond one counter, and one
#: that never fills.
TINY, UNBOUNDED = 1, 1 << 30


def cache_run(s: Settings, batches: Batches, cache_size: int, seed: int,
              crashes: int = 0, idle_decoded: int = 0
              ) -> tuple[list[dict[str, bytes]], Published, int]:
    """Apply `batches` with random checkpoints that are not full (the worker's periodic
    ones), at most `crashes` crashes between them (a cold operator on the store, the
    batches after the last checkpoint delivered again), then a full checkpoint. Returns
    the store's bytes after every checkpoint, what was published and how many counter
    states were decoded. The schedule depends on `seed` only."""
    schedule = random.Random(seed)
    store, pub, factory = DictStore(), Published(), CountingRegistry()
    bc = BatchCommit(Operator(s, KEY, factory=factory, cache_size=cache_size,
                              idle_decoded=idle_decoded), store, pub)
    snapshots: list[dict[str, bytes]] = []
    i = done = 0
    while i < len(batches):
        asyncio.run(bc.apply(0, batches[i]))
        i += 1
        roll = schedule.random()
        if roll < 0.3:
            asyncio.run(bc.checkpoint(full=False))
            snapshots.append(dict(store.data))
            done = i
        elif roll > 0.97 and crashes and i > done:
            crashes -= 1
            bc = BatchCommit(Operator(s, KEY, factory=factory, cache_size=cache_size,
                                      idle_decoded=idle_decoded), store, pub)
            i = done
    asyncio.run(bc.checkpoint())
    snapshots.append(dict(store.data))
    return snapshots, pub, factory.restored


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_cache_bound_changes_no_byte_published_or_stored(seed: int) -> None:
    """A seeded workload (ECC, heartbeats every 5 ticks, sparse events on a third of the
    counters, idle ones, periodic checkpoints that are not full and leave heartbeat-only
    counters behind): with a cache of one entry (evicting at nearly every load) and with
    one that never fills (and keeps idle counters decoded), every release and ledger
    entry, in order and re-sends included, and the store's bytes after every checkpoint
    are identical; the tiny cache decoded several times as many states. Restore and
    continue (crashes between the checkpoints) under eviction equals the unbounded run
    that never stopped. The tiny cache releases every idle counter, whose heartbeats
    then come from its idle entry (`Operator._beat_idle`): it decodes fewer states than
    the same run without that path. Control: without re-sealing a value decoded again
    to its deferred progress (`Operator._load_counter` reduced to the bare load) the
    tiny cache's stored bytes differ."""
    names = [f"k{i:02d}" for i in range(24)]
    s = settings(dict.fromkeys(names, 100 * TICK), mechanism="ecc", epsilon=1.0,
                 heartbeat_ticks=5)
    rng = random.Random(seed)
    recs = random_timeline(rng, names[:8], 100, 240, 0.1)
    batches = batches_of(to_records(recs, 4), rng)
    states, pub, decoded = cache_run(s, batches, UNBOUNDED, seed, idle_decoded=UNBOUNDED)
    tiny_states, tiny_pub, tiny_decoded = cache_run(s, batches, TINY, seed)
    assert tiny_pub.sent == pub.sent and tiny_pub.ledger == pub.ledger
    assert tiny_states == states
    assert len(states) > 20 and tiny_decoded > 3 * max(decoded, 1)
    with mock.patch.object(Operator, "_beat_idle", lambda *a: False):
        slow_states, slow_pub, slow_decoded = cache_run(s, batches, TINY, seed)
    assert slow_pub.sent == pub.sent and slow_states == states
    assert slow_decoded > tiny_decoded + 50
    # Restore and continue under eviction, the crashes re-sending what the never-stopped
    # run sent (Published refuses a second, different record for a key).
    crashed_states, crashed_pub, _ = cache_run(s, batches, TINY, seed, crashes=4)
    assert len(crashed_pub.sent) > len(pub.sent)
    assert crashed_pub.releases == pub.releases and crashed_pub.ledger == pub.ledger
    assert crashed_states[-1] == states[-1]

    def bare(self: Operator, txn: Any, partition: int, name: str) -> Any:
        return txn.load(self._counters, name)

    with mock.patch.object(Operator, "_load_counter", bare):
        broken, _, _ = cache_run(s, batches, TINY, seed)
    assert broken != states


def test_an_idle_counter_is_released_and_one_with_input_stays_decoded() -> None:
    """After a marker, a counter that took no input there and has nothing queued,
    pending or due before its next heartbeat leaves the decoded-value cache (the next
    marker decodes it again) while the cache holds more than `idle_decoded` counters;
    one that took an input stays decoded while the cache has room. Control: with the
    default `idle_decoded` (more than these 20 counters) nothing is decoded again."""
    names = [f"k{i:02d}" for i in range(20)]
    s = settings(dict.fromkeys(names, 100 * TICK), mechanism="ecc", epsilon=1.0,
                 heartbeat_ticks=5)
    advance = advance_counter_value
    for idle_decoded in (0, operator.IDLE_DECODED):
        factory = CountingRegistry()
        op = Operator(s, KEY, factory=factory, idle_decoded=idle_decoded)
        pub = CollectingSink()
        bc = BatchCommit(op, DictStore(), pub)
        cached = op._cache.section(op._counters)
        off = 0
        written = [0]

        def counted(*a: Any, written: list[int] = written) -> bytes | None:
            got = advance(*a)
            written[0] += got is not None
            return got

        with mock.patch.object(operator, "advance_counter_value", counted):
            # Past the deferral bound (DEFERRED_HEARTBEATS intervals of 5 ticks).
            for n in range(100, 110 + 5 * DEFERRED_HEARTBEATS):
                events = [Event(name, n * TICK, UNIT) for name in names[:5]]
                asyncio.run(bc.apply(0, [(off, encode_batch(events)),
                                         (off + 1, encode_marker(n))]))
                asyncio.run(bc.checkpoint(full=False))
                off += 2
                assert len(cached) == (5 if idle_decoded == 0 else 20)
                assert all(f"c/{name}" in cached for name in names[:5])
        # The busy five never decoded again; the idle ones send their heartbeats from
        # their idle entries, and when their stored value reaches the deferral bound
        # (DEFERRED_HEARTBEATS intervals) it is written from its bytes, with the noise
        # key where their SVT is inside its dense prefix (`Counter.advance_state`): none
        # is decoded again.
        beats = [r for r in pub.releases if r.counter not in names[:5]]
        assert len(beats) > 15 * 4
        assert factory.restored == 0
        if idle_decoded == 0:
            assert written[0] >= 15  # each idle counter at least once


class AlwaysDue(Operator):
    """The reference: every counter is due at every marker (seals everything)."""

    def due_tick(self, cs: CounterState) -> int:
        return cs.frontier + 1


@pytest.mark.parametrize("seed,mechanism", [(1, "step"), (2, "step"), (3, "step"),
                                            (4, "ecc"), (5, "simecc")])
def test_due_wheel_is_never_late(seed: int, mechanism: str) -> None:
    """Random timelines (5 counters, starts spread, spread heartbeats, late and future
    events, irregular markers, random batch sizes): the releases and ledger entries,
    in order, equal those of a reference operator that seals every counter at every
    marker. With the real ECC and SimECC (their own next_due) as well."""
    rng = random.Random(seed)
    names = ["a", "b", "c", "d", "e"]
    starts = {n: (100 + rng.randrange(6)) * TICK for n in names}
    kw: dict[str, Any] = dict(heartbeat_ticks=rng.choice([3, 7, 11]), heartbeat_spread=True)
    if mechanism == "step":
        factory: Any = StepFactory(rng.choice([1, 2, 5]), rng.choice([1, 3]))
    else:
        factory = registry
        kw.update(mechanism=mechanism, epsilon=200.0)
    s = settings(starts, **kw)
    recs = random_timeline(rng, names, 100, 90, 0.35 if mechanism == "step" else 0.6)
    recs = [r for r in recs if r[0] == "m" or r[1][1] * TICK >= starts[r[1][0]]]
    recs += [("m", 210 + k) for k in range(0, 120, rng.choice([1, 3]))]  # a quiet tail
    batches = batches_of(to_records(recs, rng.choice([1, 4, 50])), rng)

    def run(op_class: type[Operator]) -> tuple[list[LedgerEntry], list[Release], int]:
        pub = CollectingSink()
        bc = BatchCommit(op_class(s, KEY, factory=factory), DictStore(), pub)
        touched = 0
        for b in batches:
            touched += asyncio.run(bc.commit(0, b)).metrics["counters_touched"]
        return pub.ledger, pub.releases, touched

    ledger, releases, touched = run(Operator)
    ref_ledger, ref_releases, ref_touched = run(AlwaysDue)
    assert releases == ref_releases and ledger == ref_ledger
    assert len(ledger) == 5 and any(r.kind == "change" for r in releases)
    assert touched < ref_touched  # the wheel did skip counters with nothing due


def test_each_touched_counter_is_encoded_once_per_checkpoint() -> None:
    """Six records (300 events of two counters, markers between), applied as one batch
    or as six with one checkpoint after them: each counter state is encoded once, and
    the store gets one write per touched counter."""
    encoded = {"n": 0}

    class Counting(StepCounter):
        def to_bytes(self) -> bytes:
            encoded["n"] += 1
            return super().to_bytes()

    class Factory(StepFactory):
        def make(self, *a: Any, **k: Any) -> Any:
            base = super().make(*a, **k)
            c = Counting.__new__(Counting)
            c.__dict__.update(base.__dict__)
            return c

    s = settings({"a": 0, "b": 0}, heartbeat_ticks=2)
    store = DictStore()
    bc = BatchCommit(Operator(s, KEY, factory=Factory()), store, CollectingSink())
    records = []
    src = 0
    for n in range(3):
        evs = []
        for _ in range(100):
            evs.append(Event("ab"[src % 2], (n + 1) * TICK, 65536, 0, src))
            src += 1
        records += [encode_batch(evs), encode_marker(n)]
    out = asyncio.run(bc.commit(0, list(enumerate(records))))
    assert out.metrics["events_applied"] == 300 and len(out.releases) > 0
    assert encoded["n"] == 2
    assert sorted(k for k in store.data if k.startswith("c/")) == ["c/a", "c/b"]
    encoded["n"] = 0
    store = DictStore()
    bc = BatchCommit(Operator(s, KEY, factory=Factory()), store, CollectingSink())
    for offset, record in enumerate(records):
        asyncio.run(bc.apply(0, [(offset, record)]))
    assert encoded["n"] == 0 and not store.data
    asyncio.run(bc.checkpoint())
    assert encoded["n"] == 2 and sorted(store.data) == ["c/a", "c/b", "p/0"]


def test_commit_publishes_ledger_then_releases_before_any_state_write() -> None:
    events: list[str] = []

    class Store(DictStore):
        def set(self, key: str, value: bytes) -> None:
            events.append("write")
            super().set(key, value)

    class Pub:
        def send(self, out: Output) -> None:
            events.append(f"publish {len(out.ledger)} {len(out.releases)}")

        async def flush(self) -> None:
            events.append("flushed")

    s = settings({"a": 0}, heartbeat_ticks=1)
    bc = BatchCommit(Operator(s, KEY, factory=StepFactory()), Store(), Pub(),
                     crash_point=events.append)
    asyncio.run(bc.commit(0, [(1, encode_marker(2)), (0, encode_batch([Event("a", 0, 1)]))]))
    assert events[:3] == ["publish 1 3", "flushed", "after_acks"]
    assert events[-1] == "after_state"
    assert set(events[3:-1]) == {"write"}  # one partition: one batch, no point between


def test_work_per_batch_is_one_write_per_touched_counter() -> None:
    """The write budget: an event batch writes each touched counter once and the
    partition value (duplicate filter) once, nothing else; a marker with nothing due
    writes the partition value only; a marker through the counters' due tick writes
    each of them once and the partition value."""
    names = {f"k{i:03d}": 0 for i in range(100)}
    s = settings(names, heartbeat_ticks=1_000_000)
    store = FailingStore({}, 0)
    bc = BatchCommit(Operator(s, KEY, factory=StepFactory()), store, CollectingSink())
    off = 0

    def commit(records: list[bytes]) -> list[str]:
        nonlocal off
        before = dict(store.data)
        asyncio.run(bc.commit(0, [(off + i, r) for i, r in enumerate(records)]))
        off += len(records)
        return sorted(k for k in store.data.keys() | before.keys()
                      if store.data.get(k) != before.get(k))

    commit([encode_marker(0)])
    evs = [Event(f"k{i:03d}", 5 * TICK, 65536, 0, i) for i in range(10)]
    first = commit([encode_batch(evs)])
    assert first == sorted([*(f"c/k{i:03d}" for i in range(10)), "p/0"])
    again = commit([encode_batch([Event(e.counter, 5 * TICK, 1, 0, e.src_offset + 10)
                                  for e in evs])])
    assert again == sorted([*(f"c/k{i:03d}" for i in range(10)), "p/0"])
    assert commit([encode_marker(1)]) == ["p/0"]
    assert commit([encode_marker(2)]) == ["p/0"]
    due = commit([encode_marker(5)])
    assert set(due) == {*(f"c/k{i:03d}" for i in range(10)), "p/0"}


class BatchStore(DictStore):
    """A DictStore that takes a plan at once (state.StateStore.write_many, as table.PartitionStore:
    one RocksDB write batch), keeping each call's keys and counting single writes."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []
        self.single = 0

    def write_many(self, writes: Iterable[tuple[str, bytes]]) -> None:
        batch = list(writes)
        self.batches.append([k for k, _ in batch])
        for key, value in batch:
            super().set(key, value)

    def set(self, key: str, value: bytes) -> None:
        self.single += 1
        super().set(key, value)


def test_a_checkpoint_writes_each_plan_in_one_batch() -> None:
    """On a store that takes many writes at once, a checkpoint writes a partition's plan
    in one call (counter values, then the partition value), and the store ends byte for
    byte as with one write at a time. With crash points the writes are the same (one
    partition: no point between two batches)."""
    names = [f"k{i:02d}" for i in range(20)]
    s = settings(dict.fromkeys(names, 0), heartbeat_ticks=1)
    records = [encode_marker(0),
               encode_batch([Event(c, 5 * TICK, 65536, 0, i) for i, c in enumerate(names)]),
               encode_marker(6)]

    def run(store: DictStore, crash_point: Callable[[str], None] | None = None) -> None:
        bc = BatchCommit(Operator(s, KEY, factory=StepFactory()), store,
                         CollectingSink(), crash_point)
        for offset, record in enumerate(records):
            asyncio.run(bc.commit(0, [(offset, record)]))

    ref, batched, each = DictStore(), BatchStore(), BatchStore()
    run(ref)
    run(batched)
    assert batched.data == ref.data
    assert batched.single == 0 and len(batched.batches) == len(records)
    for keys in batched.batches:
        assert keys[-1] == "p/0" and all(k.startswith("c/") for k in keys[:-1])
    assert len(batched.batches[1]) == len(names) + 1
    calls: list[str] = []
    run(each, calls.append)
    assert each.data == ref.data and each.batches == batched.batches and each.single == 0
    assert calls.count("after_state") == len(records)
    assert "between_state_writes" not in calls


def test_a_lone_small_marker_is_applied_inline_and_a_large_seal_in_a_thread() -> None:
    """With offload, a batch goes to a thread when it may seal more than INLINE_STEPS
    counter ticks: a marker with other records, the first marker of a partition (its last
    seal unknown), a lone marker through the tick of more than INLINE_STEPS counters with
    events; a lone marker with few counters due is applied on the event loop. Control:
    the releases equal a run without offload."""
    names = {f"k{i:03d}": 0 for i in range(INLINE_STEPS + 44)}
    s = settings(names, heartbeat_ticks=1_000_000)
    few = [Event(f"k{i:03d}", 3 * TICK + 5, 1) for i in range(3)]
    many = [Event(n, 5 * TICK + 5, 1) for n in names]
    batches: Batches = [[(0, encode_marker(1))], [(1, encode_marker(2))],
                        [(2, encode_batch(few))], [(3, encode_marker(3))],
                        [(4, encode_marker(4))], [(5, encode_batch(many))],
                        [(6, encode_marker(5))], [(7, encode_batch(few[:1])),
                                                  (8, encode_marker(6))]]
    threaded: list[int] = []
    real = asyncio.to_thread

    async def counting(fn: Callable[..., Any], *args: Any) -> Any:
        if getattr(fn, "__name__", "") == "_apply_all":  # not a checkpoint's writes
            threaded.append(len(args[2]))  # the batch's records
        return await real(fn, *args)

    def run(offload: bool) -> list[Release]:
        pub = CollectingSink()
        bc = BatchCommit(Operator(s, KEY, factory=StepFactory()), DictStore(), pub,
                         offload=offload)
        for b in batches:
            asyncio.run(bc.commit(0, b))
        return list(pub.releases)

    with mock.patch("processor.stream.model.commit.asyncio.to_thread", counting):
        got = run(True)
    # first marker (last seal unknown), the lone marker sealing every counter's tick 5,
    # the marker that comes with an event batch; markers 2, 3 and 4 inline
    assert threaded == [1, 1, 2]
    assert got == run(False) and got


def test_with_offload_a_full_checkpoint_stages_deferred_counters_in_a_thread() -> None:
    """A full checkpoint's deferred counters (a million idle ones take a minute) are
    staged in a thread with offload, on the event loop without; the stored state is the
    same either way."""
    names = {f"k{i:02d}": 0 for i in range(20)}
    s = settings(names, heartbeat_ticks=3)
    staged: list[str] = []
    real = asyncio.to_thread

    async def counting(fn: Callable[..., Any], *args: Any) -> Any:
        staged.append(getattr(fn, "__name__", ""))
        return await real(fn, *args)

    def run(offload: bool) -> dict[str, bytes]:
        store = DictStore()
        bc = BatchCommit(Operator(s, KEY, idle_decoded=0), store, CollectingSink(),
                         offload=offload)
        for t in range(1, 30):
            asyncio.run(bc.apply(0, [(t, encode_marker(t))]))
            if t % 4 == 0:
                asyncio.run(bc.checkpoint(full=False))
        assert bc.operator.deferred_partitions() == [0]
        asyncio.run(bc.checkpoint())
        return dict(store.data)

    with mock.patch("processor.stream.model.commit.asyncio.to_thread", counting):
        threaded = run(True)
    assert "stage_deferred" in staged
    staged.clear()
    with mock.patch("processor.stream.model.commit.asyncio.to_thread", counting):
        assert run(False) == threaded
    assert "stage_deferred" not in staged


def test_a_partition_has_a_change_to_write_only_after_a_record_that_changed_it() -> None:
    """`CheckpointLoop.changed`, what a worker's first checkpoint after an assignment
    waits for on each partition (acks.PendingAcks): True after a marker that seals a new
    tick, until the checkpoint writes it; False before any record, after a re-delivered
    marker, after a marker through a tick the partition already sealed (a taken-over
    partition re-read from the group's committed offset), after either on a restored
    store, and after a clock probe (an empty event batch: the worker does not even apply
    it). Counting those made the takeover's checkpoint run before a partition had
    anything to write, which then waited the checkpoint interval."""
    s = settings({"a": 100 * TICK, "b": 101 * TICK})
    store = DictStore()
    bc = BatchCommit(Operator(s, KEY, factory=registry), store, CollectingSink())
    assert not bc.changed(0)
    asyncio.run(bc.apply(0, [(0, encode_marker(100))]))
    assert bc.changed(0)
    asyncio.run(bc.checkpoint(full=False))
    assert not bc.changed(0)
    for batch in ([(0, encode_marker(100))], [(1, encode_marker(100))],
                  [(1, encode_marker(99))], [(2, PROBE_RECORD)]):
        asyncio.run(bc.apply(0, batch))
        assert not bc.changed(0), batch
    restored = BatchCommit(Operator(s, KEY, factory=registry), store, CollectingSink())
    asyncio.run(restored.apply(0, [(0, encode_marker(100)), (1, encode_marker(100))]))
    assert not restored.changed(0)
    asyncio.run(restored.apply(0, [(3, encode_marker(101))]))
    assert restored.changed(0)  # control: a new tick


def test_with_offload_a_checkpoint_writes_every_partition_in_one_thread_hop() -> None:
    """With offload and no crash point, a checkpoint's writes of every partition go to the
    thread in one hop (`_write_all`), still one batch per partition in partition order,
    and the store ends byte for byte as without offload. Control: with a crash point
    (the kill -9 tests), one hop per partition, the earlier ones made durable between
    two (`between_writes`), and the same batches."""
    names = {f"k{i:02d}": 0 for i in range(12)}
    s = settings(names, heartbeat_ticks=1)
    hops: list[str] = []
    real = asyncio.to_thread

    async def counting(fn: Callable[..., Any], *args: Any) -> Any:
        hops.append(getattr(fn, "__name__", ""))
        return await real(fn, *args)

    def run(offload: bool, crash_point: Callable[[str], None] | None = None
            ) -> tuple[dict[str, bytes], list[list[str]]]:
        store = BatchStore()
        bc = BatchCommit(Operator(s, KEY, factory=StepFactory()), store, CollectingSink(),
                         crash_point, offload=offload)
        for t in (1, 2):
            for p in (2, 0, 3, 1):  # applied out of partition order
                asyncio.run(bc.apply(p, [(t, encode_marker(t))]))
        hops.clear()
        asyncio.run(bc.checkpoint())
        return dict(store.data), store.batches[-4:]

    with mock.patch("processor.stream.model.commit.asyncio.to_thread", counting):
        data, batches = run(True)
        assert hops == ["_write_all"]
        calls: list[str] = []
        crash_data, crash_batches = run(True, calls.append)
        assert hops == ["_write_partition"] * 4
        assert calls.count("between_state_writes") == 3
    assert [b[-1] for b in batches] == ["p/0", "p/1", "p/2", "p/3"]
    assert crash_batches == batches and crash_data == data
    assert run(False) == (data, batches)
