"""The operator state machine: ticks, the FIFO queue, markers, the due wheel,
idempotency, the duplicate filter, heartbeats, ledger entries (only at markers) and what a
release may carry. Pure: no Kafka.

Most tests run the operator with a tiny deterministic fake counter (`StepCounter`) whose
output reveals exactly which x_t it received, so queue semantics can be read off the
releases; one test runs the real ECC from the registry.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
from collections import Counter as Counter_
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Self

import orjson
import pytest

from processor.core import registry
from processor.core.api import Counter, check_skip
from processor.core.grid import UNIT, to_units
from processor.core.rng import NoiseKey
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.identity import counter_id, noise_identity
from processor.stream.model.lifetime import ledger_objects
from processor.stream.model.operator import (
    DEFAULT_CACHE_SIZE,
    AnnouncedCounterError,
    Operator,
    is_heartbeat_tick,
)
from processor.stream.model.outputs import CollectingSink, Output
from processor.stream.model.records import (
    Event,
    LedgerEntry,
    Release,
    announced_in,
    encode_batch,
    encode_marker,
    partition_for,
)
from processor.stream.model.state import CounterState, DictStore
from processor.stream.model.transaction import PartitionTransaction
from tests.stream.helpers import apply_now

TICK = 1000
KEY = NoiseKey.from_seed(7)


# --------------------------------------------------------------------------- fakes


class StepCounter(Counter):
    """A deterministic, NON-private fake: y jumps to (true sum + jitter) at every
    `period`-th tick; jitter is a keyed hash of (id, t) in {0..jitter-1} units.

    With period=1 and jitter=1 it is the exact running sum, so x_t = y_t - y_{t-1}.
    `next_due()` is the next checkpoint (only there can ⊥ ticks change y), and `skip`
    jumps in O(1), exercising the operator's idle path.
    """

    mechanism = "step-test"
    edit_private = False

    def __init__(self, counter_id: str, period: int, jitter: int, key: NoiseKey,
                 eps: float = 1.0, delta: float = 1e-6) -> None:
        self.counter_id = counter_id
        self.period = period
        self.jitter = jitter
        self.eps, self.delta = eps, delta
        self._salt = key.derive("test/" + counter_id)
        self._t = 0
        self._s = 0  # units
        self._y = 0  # units

    @property
    def t(self) -> int:
        return self._t

    @property
    def y(self) -> float:
        return self._y / UNIT

    def _jit(self, t: int) -> int:
        if self.jitter <= 1:
            return 0
        return hashlib.sha256(self._salt + t.to_bytes(8, "big")).digest()[0] % self.jitter

    def update(self, x: float | None) -> float:
        u = to_units(x)
        self._t += 1
        self._s += u
        if self._t % self.period == 0:
            self._y = self._s + self._jit(self._t)
        return self.y

    def skip(self, n: int) -> list[tuple[int, float]]:
        check_skip(n)
        changes: list[tuple[int, float]] = []
        first = (self._t // self.period + 1) * self.period
        for cp in range(first, self._t + n + 1, self.period):
            new = self._s + self._jit(cp)
            if new != self._y:
                self._y = new
                changes.append((cp, self.y))
        self._t += n
        return changes

    def next_due(self) -> int | None:
        if self.jitter <= 1 and self._y == self._s:
            return None  # nothing left to reveal: ⊥ ticks can never change y
        return (self._t // self.period + 1) * self.period

    def to_bytes(self) -> bytes:
        return orjson.dumps({"id": self.counter_id, "p": self.period, "j": self.jitter,
                             "e": self.eps, "d": self.delta,
                             "t": self._t, "s": self._s, "y": self._y})

    @classmethod
    def from_bytes(cls, data: bytes, key: NoiseKey) -> Self:
        d = orjson.loads(data)
        c = cls(d["id"], d["p"], d["j"], key, d["e"], d["d"])
        c._t, c._s, c._y = d["t"], d["s"], d["y"]
        return c

    def error_bound(self, beta: float = 0.05) -> float:
        return 0.5 + self._t / 1024  # a public function of t only


class StepFactory:
    """CounterFactory for StepCounter (the operator's registry in these tests)."""

    def __init__(self, period: int = 1, jitter: int = 1) -> None:
        self.period, self.jitter = period, jitter
        self.made = 0

    def make(self, name: str, eps: float, delta: float, key: NoiseKey,
             counter_id: str) -> Counter:
        self.made += 1
        return StepCounter(counter_id, self.period, self.jitter, key, eps, delta)

    def restore(self, data: bytes, key: NoiseKey) -> Counter:
        return StepCounter.from_bytes(data, key)


class CountingStore(DictStore):
    """A DictStore that counts loads and stores (to check what a marker touches)."""

    def __init__(self) -> None:
        super().__init__()
        self.gets = 0
        self.sets = 0
        self.bytes_set = 0

    def get(self, key: str) -> bytes | None:
        self.gets += 1
        return super().get(key)

    def set(self, key: str, value: bytes) -> None:
        self.sets += 1
        self.bytes_set += len(value)
        super().set(key, value)


def settings(counters: dict[str, int], **kw: Any) -> Settings:
    # Heartbeats aligned (phase 0) so tests can name heartbeat ticks literally; spreading
    # has its own test.
    base = dict(partitions=1, tick_ms=TICK, heartbeat_ticks=1_000_000, mechanism="ecc",
                epsilon=1.0, delta=1e-6, heartbeat_spread=False)
    base.update(kw)
    return with_overrides(Settings(), counters=counters, **base)


class Run:
    """Feeds timeline records to one partition at increasing offsets; collects outputs."""

    def __init__(self, s: Settings, factory: Any, store: DictStore | None = None,
                 partition: int = 0, cache_size: int = 4096) -> None:
        self.op = Operator(s, KEY, factory=factory, cache_size=cache_size)
        self.store = store if store is not None else DictStore()
        self.partition = partition
        self.offset = 0
        self.records: list[bytes] = []
        self.releases: list[Release] = []
        self.ledger: list[LedgerEntry] = []
        self.metrics: dict[str, int] = {}

    def feed(self, record: bytes) -> Output:
        out = apply_now(self.op, self.store, self.partition, self.offset, record)
        self.records.append(record)
        self.offset += 1
        self.releases += out.decoded_releases()
        self.ledger += out.ledger
        for k, v in out.metrics.items():
            self.metrics[k] = self.metrics.get(k, 0) + v
        return out

    def event(self, counter: str, tick: int, value: float = 1.0, ms: int = 0,
              src: tuple[int, int] = (-1, -1)) -> Output:
        return self.feed(encode_batch([Event(counter, tick * TICK + ms, to_units(value),
                                             *src)]))

    def marker(self, n: int) -> Output:
        return self.feed(encode_marker(n))


def ys(releases: Iterable[Release], counter: str) -> dict[int, float]:
    return {r.tick: r.value for r in releases if r.counter == counter}


# --------------------------------------------------------------------------- reference


def reference_x(records: list[tuple[str, Any]], counter: str, start_tick: int,
                through: int) -> list[int | None]:
    """Direct simulation of the spec for one counter: each event lands in its tick, or in
    the earliest open tick (partition frontier + 1) if that is sealed; per sealed tick the
    arrivals join a FIFO in record order and at most one value leaves. Returns x_1..x_T in
    units (None for ⊥; an event of value 0 is 0, not ⊥), T = through - start_tick + 1."""
    frontier = -1
    arrivals: dict[int, list[int]] = {}
    for kind, payload in records:
        if kind == "m":
            frontier = max(frontier, payload)
        elif payload[0] == counter:
            _, tick, units = payload
            tick = max(tick, frontier + 1, start_tick)
            arrivals.setdefault(tick, []).append(units)
    q: deque[int] = deque()
    xs: list[int | None] = []
    for g in range(start_tick, through + 1):
        q.extend(arrivals.get(g, []))
        xs.append(q.popleft() if q else None)
    return xs


def expected_releases(factory: StepFactory | Any, s: Settings, counter: str,
                      xs: list[int | None]) -> list[tuple[int, float, str, float]]:
    """Run a fresh core counter directly on x_1..x_T; a record where y changes, a
    heartbeat at is_heartbeat_tick ticks otherwise (the offline count), each with
    the counter's own error bound at that tick."""
    c = factory.make(s.mechanism, s.epsilon, s.delta, KEY,
                     counter_id(noise_identity(s, KEY), counter))
    out = []
    last = 0.0
    for t, u in enumerate(xs, start=1):
        y = c.update(None if u is None else u / UNIT)
        if y != last:
            out.append((t, y, "change", c.error_bound(s.beta)))
        elif is_heartbeat_tick(s, counter, t):
            out.append((t, y, "heartbeat", c.error_bound(s.beta)))
        last = y
    return out


def random_timeline(rng: random.Random, counters: list[str], start: int, n_ticks: int,
                    rate: float) -> list[tuple[str, Any]]:
    """Events with jittered (sometimes late, sometimes early) ticks and a marker per tick."""
    recs: list[tuple[str, Any]] = []
    for now in range(start, start + n_ticks):
        for c in counters:
            k = 0
            while rng.random() < rate and k < 6:
                k += 1
                tick = now + rng.choice([-3, -1, 0, 0, 0, 1, 2])
                units = rng.choice([UNIT, UNIT, UNIT // 2, 1, 0, rng.randrange(UNIT + 1)])
                recs.append(("e", (c, max(tick, start), units)))
        if rng.random() < 0.85:
            recs.append(("m", now - rng.choice([0, 0, 1])))
    recs.append(("m", start + n_ticks + 20))
    return recs


def to_bytes(rec: tuple[str, Any]) -> bytes:
    kind, p = rec
    if kind == "m":
        return encode_marker(p)
    c, tick, units = p
    return encode_batch([Event(c, tick * TICK + 17, units)])


def to_records(recs: list[tuple[str, Any]], batch: int) -> list[bytes]:
    """Timeline records: markers as they are, runs of consecutive events in batch records
    of at most `batch` events (in order), with increasing input offsets."""
    out: list[bytes] = []
    run: list[Event] = []
    src = 0
    for kind, p in recs:
        if kind == "e":
            c, tick, units = p
            run.append(Event(c, tick * TICK + 17, units, 0, src))
            src += 1
        if run and (kind == "m" or len(run) == batch):
            out.append(encode_batch(run))
            run = []
        if kind == "m":
            out.append(encode_marker(p))
    if run:
        out.append(encode_batch(run))
    return out


# --------------------------------------------------------------------------- queue


def test_burst_leaves_one_per_tick() -> None:
    """k events in one tick come out as x = 1 on k consecutive ticks, then ⊥."""
    run = Run(settings({"a": 10 * TICK}), StepFactory())
    for _ in range(5):
        run.event("a", 10)
    run.marker(20)
    # t=1..5 each add one event; nothing changes afterwards.
    assert ys(run.releases, "a") == {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0, 5: 5.0}
    assert [r.kind for r in run.releases] == ["change"] * 5
    # Queue length is reported only as aggregate deltas (in minus out), never per counter.
    assert (run.metrics["events_queued"], run.metrics["events_dequeued"]) == (5, 5)


def test_extra_event_shift_is_absorbed_by_first_empty_tick() -> None:
    """Adding one event gives an insertion neighbour (Definition 3.11): equal before i,
    the new value at i, the old values shifted by one tick up to the first ⊥, equal after.
    Control: the same check rejects a stream where the extra event is simply added."""
    def xs_of(events: list[tuple[int, float]]) -> list[int]:
        run = Run(settings({"a": 0}, heartbeat_ticks=1), StepFactory())
        for tick, v in events:
            run.event("a", tick, v)
        run.marker(19)
        y = [0.0] + [ys(run.releases, "a")[t] for t in range(1, 21)]
        return [round((y[t] - y[t - 1]) * UNIT) for t in range(1, 21)]

    base = [(0, 0.5), (0, 0.25), (1, 0.125), (2, 0.75), (6, 0.375)]
    x = xs_of(base)
    x2 = xs_of([*base[:2], (0, 1.0), *base[2:]])  # one more event in tick 0, after two

    def is_insertion(new: list[int], old: list[int]) -> bool:
        for i in range(len(old)):
            if new[:i] != old[:i]:
                return False
            j = next((k for k in range(i, len(old)) if old[k] == 0), len(old))
            if new[i + 1:j + 1] == old[i:j] and new[j + 1:] == old[j + 1:]:
                return True
        return False

    assert x[:5] == [to_units(0.5), to_units(0.25), to_units(0.125), to_units(0.75), 0]
    assert x2[:5] == [to_units(0.5), to_units(0.25), UNIT, to_units(0.125), to_units(0.75)]
    assert x2[5] == 0 and x2[6:] == x[6:]  # the ⊥ at t=5 absorbed the shift
    assert is_insertion(x2, x)
    # Control: "one more event at its own tick, nothing shifted" is not what the queue does.
    naive = list(x)
    naive[2] += UNIT
    assert not is_insertion(naive, x)


@pytest.mark.parametrize("seed,period,jitter,h,cache,batch", [
    (1, 1, 1, 1, 4096, 1), (2, 3, 4, 5, 4096, 1), (3, 1, 3, 7, 4096, 1),
    (4, 4, 1, 3, 4096, 1), (2, 3, 4, 5, 0, 1), (5, 2, 3, 4, 1, 1),
    (1, 1, 1, 1, 4096, 1000), (2, 3, 4, 5, 4096, 7), (5, 2, 3, 4, 1, 1000),
    (6, 1, 2, 3, 0, 3)])
def test_matches_reference_queue_and_offline_count(seed: int, period: int, jitter: int,
                                                   h: int, cache: int, batch: int) -> None:
    """Random timelines (late, early and future events, irregular markers, 3 counters
    sharing a partition, one starting later): the releases equal those of the core
    counter run directly on the x sequence a plain FIFO simulation implies. With and
    without the operator's decoded-state cache (0: off, 1: constantly evicting), one
    event per timeline record or batches of several."""
    rng = random.Random(seed)
    starts = {"a": 100, "b": 100, "c": 108}
    s = settings({k: v * TICK for k, v in starts.items()}, heartbeat_ticks=h)
    recs = random_timeline(rng, list(starts), 100, 60, 0.5)
    recs = [r for r in recs if r[0] == "m" or r[1][1] >= starts[r[1][0]]]
    run = Run(s, StepFactory(period, jitter), cache_size=cache)
    for r in to_records(recs, batch):
        run.feed(r)
    through = max(p for k, p in recs if k == "m")
    assert run.metrics["late_events"] > 0
    for c, st in starts.items():
        xs = reference_x(recs, c, st, through)
        got = [(r.tick, r.value, r.kind, r.error_bound) for r in run.releases
               if r.counter == c]
        assert got == expected_releases(StepFactory(period, jitter), s, c, xs)
    # Control: a reference that ignored lateness (events kept their own tick) disagrees.
    xs_wrong = reference_x([r if r[0] == "e" else ("m", -1) for r in recs], "a", 100, through)
    assert xs_wrong != reference_x(recs, "a", 100, through)


def test_late_event_joins_earliest_open_tick_and_is_counted() -> None:
    run = Run(settings({"a": 0}), StepFactory())
    run.marker(4)  # ticks 0..4 sealed (t = 1..5)
    out = run.event("a", 2)  # tick 2 is sealed: goes to tick 5 (t = 6)
    assert out.metrics["late_events"] == 1
    run.event("a", 5)  # on time, same tick, after the late one
    assert out.releases == []
    run.marker(5)
    run.marker(6)
    assert ys(run.releases, "a") == {6: 1.0, 7: 2.0}
    assert run.metrics["late_events"] == 1


def test_future_ticks_wait_for_their_marker() -> None:
    run = Run(settings({"a": 0}), StepFactory())
    run.event("a", 8)
    run.marker(6)
    assert run.releases == []
    run.marker(8)
    assert ys(run.releases, "a") == {9: 1.0}


# --------------------------------------------------------------------------- idempotency


def _clean(recs: list[bytes], s: Settings) -> tuple[DictStore, list[Release]]:
    run = Run(s, StepFactory(2, 3))
    for r in recs:
        run.feed(r)
    return run.store, run.releases


def test_replaying_any_prefix_or_duplicate_changes_nothing() -> None:
    """At-least-once redelivery: apply records[:j], then again from i <= j. Final state
    and the release stream equal one clean pass; the redelivered part emits nothing.
    Control: without the offset check (a fresh Operator on a fresh store for the second
    part), the same comparison fails."""
    rng = random.Random(11)
    s = settings({"a": 100 * TICK, "b": 100 * TICK}, heartbeat_ticks=4)
    recs = [to_bytes(r) for r in random_timeline(rng, ["a", "b"], 100, 30, 0.6)]
    clean_store, clean_rel = _clean(recs, s)
    for _ in range(12):
        j = rng.randrange(len(recs) + 1)
        i = rng.randrange(j + 1)
        op = Operator(s, KEY, factory=StepFactory(2, 3))
        store = DictStore()
        rel: list[Release] = []
        for off in range(j):
            rel += apply_now(op, store, 0, off, recs[off]).decoded_releases()
        # A duplicate of one record, then redelivery from i, with a cold operator cache.
        op = Operator(s, KEY, factory=StepFactory(2, 3))
        if j:
            assert apply_now(op, store, 0, j - 1, recs[j - 1]).releases == []
        for off in range(i, len(recs)):
            out = apply_now(op, store, 0, off, recs[off])
            if off < j:
                assert out.releases == [] and out.ledger == []
                assert out.metrics["events_applied"] == 0
                assert out.metrics["counters_touched"] == 0
            rel += out.decoded_releases()
        assert store.data == clean_store.data
        assert rel == clean_rel
    # Control: re-applying the tail to a store that forgot offsets double-counts.
    store = DictStore()
    op = Operator(s, KEY, factory=StepFactory(2, 3))
    for off, r in enumerate(recs):
        apply_now(op, store, 0, off, r)
    for off, r in enumerate(recs):
        apply_now(op, store, 0, off + len(recs), r)  # same records under new offsets
    assert store.data != clean_store.data


# --------------------------------------------------------------------------- markers


def test_marker_touches_only_due_counters() -> None:
    """10,000 declared counters: after the first marker (which creates them all), a
    marker with nothing due loads O(1) store values and writes O(1) small ones (never an
    O(counters) value); an event for an idle counter loads and writes O(1) values of O(1)
    size; the marker at its tick touches only that counter. Control: an operator whose
    due index says "always due" touches all 10,000 on the same marker."""
    names = {f"k{i:05d}": 0 for i in range(10_000)}
    s = settings(names, heartbeat_ticks=1000)
    factory = StepFactory()
    store = CountingStore()
    run = Run(s, factory, store)
    run.marker(0)
    assert factory.made == 10_000 and len(run.ledger) == 10_000
    for n in (1, 2):
        store.gets = store.sets = store.bytes_set = 0
        run.marker(n)
        assert store.gets <= 4 and store.sets <= 3 and store.bytes_set < 300
    store.gets = store.sets = store.bytes_set = 0
    run.event("k00042", 4)
    assert store.gets <= 4 and store.sets <= 3 and store.bytes_set < 2000
    store.gets = store.sets = store.bytes_set = 0
    run.marker(3)
    assert store.gets <= 4 and store.sets <= 3 and store.bytes_set < 300
    run.marker(4)  # k00042 is due here
    assert store.gets <= 8 and store.sets <= 6 and store.bytes_set < 2000
    assert ys(run.releases, "k00042") == {5: 1.0}
    assert run.metrics["counters_touched"] == 10_000 + 1 + 1  # marker 0, event, marker 4

    class AlwaysDue(Operator):
        def due_tick(self, cs: CounterState) -> int:
            return cs.frontier + 1

    store2 = CountingStore()
    run2 = Run(s, StepFactory(), store2)
    run2.op = AlwaysDue(s, KEY, factory=StepFactory())
    run2.marker(0)
    store2.gets = 0
    run2.marker(1)
    assert store2.gets > 10_000


def test_markers_are_idempotent_and_heartbeats_come_from_markers_alone() -> None:
    """A silent counter gets a heartbeat at every t % h == 0 from markers only; an old
    marker changes nothing; heartbeats carry the unchanged value."""
    run = Run(settings({"a": 0}, heartbeat_ticks=4), StepFactory())
    run.event("a", 1)
    run.marker(13)  # t = 1..14
    before = dict(run.store.data)
    out = run.marker(5)
    assert out.releases == [] and run.store.data == before
    assert [(r.tick, r.value, r.kind) for r in run.releases] == [
        (2, 1.0, "change"), (4, 1.0, "heartbeat"), (8, 1.0, "heartbeat"),
        (12, 1.0, "heartbeat")]


def test_output_reports_the_tick_its_applied_markers_sealed() -> None:
    """What readiness and marker age are computed from: an applied marker (also an old,
    idempotent one) reports its tick, an event or a redelivered marker reports none; a
    batch of several markers reports the newest."""
    run = Run(settings({"a": 0}), StepFactory())
    assert run.event("a", 1).sealed_through is None
    marker_offset = run.offset
    assert run.marker(7).sealed_through == 7
    assert run.marker(5).sealed_through == 5  # already sealed: applied, changes nothing
    # The marker through 7 delivered again (its offset is at or below the stored one).
    redelivered = apply_now(run.op, run.store, run.partition, marker_offset, encode_marker(7))
    assert redelivered.sealed_through is None
    assert redelivered.metrics["skipped_duplicates"] == 1
    out = Output()
    for n in (8, 11, 10):
        apply_now(run.op, run.store, run.partition, run.offset, encode_marker(n), out)
        run.offset += 1
    assert out.sealed_through == 11


def test_ledger_entry_once_per_counter_at_the_first_marker() -> None:
    """Ledger entries come from markers only: an event creates a counter's state
    silently; the marker through its start announces it, once."""
    s = settings({"a": 5 * TICK, "b": 0}, epsilon=0.5, delta=1e-7)
    run = Run(s, StepFactory())
    out = run.event("a", 6)
    assert out.ledger == [] and out.releases == []
    assert run.marker(4).ledger == [e for e in run.ledger if e.counter == "b"]
    out = run.marker(10)
    assert [e.counter for e in out.ledger] == ["a"]
    e = out.ledger[0]
    assert (e.mechanism, e.epsilon, e.delta, e.tick_ms, e.start_ms) == (
        "step-test", 0.5, 1e-7, TICK, 5 * TICK)
    assert (e.privacy_unit, e.contribution_bound, e.fingerprint) == (
        "one event", 1, s.fingerprint())
    run.event("a", 11)
    run.marker(20)
    assert [x.counter for x in run.ledger] == ["b", "a"]
    assert orjson.loads(e.to_json())["privacy_unit"] == "one event"


def test_newly_declared_counter_is_indexed_after_a_config_change() -> None:
    """State written under one configuration, then a counter is declared: the next marker
    creates it (ledger entry, heartbeats) without any event. Releases name the eps of the
    running instance (the changed epsilon needs on_parameter_change = "keep"); the
    existing counter's first release under the new fingerprint is preceded by an entry
    that says so: its stored parameters, from that tick on."""
    s1 = settings({"a": 0}, heartbeat_ticks=2)
    run = Run(s1, StepFactory())
    run.marker(3)
    s2 = with_overrides(s1, counters={"a": 0, "b": 2 * TICK}, epsilon=3.0,
                        on_parameter_change="keep")
    run2 = Run(s2, StepFactory(), store=run.store)
    run2.offset = run.offset
    run2.marker(5)
    assert [(e.counter, e.entry, e.since_tick, e.parameters, e.epsilon, e.fingerprint)
            for e in run2.ledger] == [("a", "reconfigured", 6, "stored", 1.0, s2.fingerprint()),
                                      ("b", "created", 1, "configured", 3.0, s2.fingerprint())]
    assert {(r.counter, r.tick, r.epsilon) for r in run2.releases} == {
        ("a", 6, 1.0), ("b", 2, 3.0), ("b", 4, 3.0)}


def unexplained(ledger: list[LedgerEntry], releases: list[Release]) -> list[Release]:
    """Releases whose fingerprint no ledger entry of their counter explains: an entry with
    that fingerprint, effective (since_tick) at or before the release's tick."""
    return [r for r in releases
            if not any(e.counter == r.counter and e.fingerprint == r.fingerprint
                       and e.since_tick <= r.tick for e in ledger)]


def test_a_changed_fingerprint_gets_a_ledger_entry_before_its_first_release() -> None:
    """Whenever the configuration fingerprint changes under a counter's
    state, a "reconfigured" entry precedes its first release under the new fingerprint,
    in the same output (the publisher sends a batch's entries before its releases), naming
    the parameters it continues under: its stored ones ("configured" when they equal the
    configuration's, "stored" under on_parameter_change = "keep"). Written once per change,
    not at every restart. Control: without the reconfigured entries the checker finds the
    releases no entry explains."""
    s1 = settings({"a": 0, "b": 0}, heartbeat_ticks=3)
    run = Run(s1, StepFactory())
    for n in range(6):
        run.event("a", n)
        run.marker(n)
    assert [e.entry for e in run.ledger] == ["created", "created"]
    # Another counter declared: a's and b's parameters are those configured, the
    # fingerprint is not.
    s2 = with_overrides(s1, counters={"a": 0, "b": 0, "c": 0})
    # Then epsilon changed, stated explicitly: a, b and c continue under their stored eps.
    s3 = with_overrides(s2, epsilon=2.0, on_parameter_change="keep")
    ledger, releases = list(run.ledger), list(run.releases)
    offset = run.offset
    for s, ticks, restarts in ((s2, range(6, 12), 1), (s3, range(12, 18), 2)):
        for _ in range(restarts):  # a restart under the same settings writes nothing new
            nxt = Run(s, StepFactory(), store=run.store)
            nxt.offset = offset
            for n in ticks:
                out = nxt.event("a", n)
                assert out.ledger == []  # never at an event
                out = nxt.marker(n)
                ledger += out.ledger
                assert unexplained(ledger, out.decoded_releases()) == []
            releases += nxt.releases
            offset = nxt.offset
            ticks = range(ticks.stop, ticks.stop + 3)
    changed = [(e.counter, e.entry, e.parameters, e.epsilon, e.fingerprint)
               for e in ledger[2:]]
    # In order of the first release under each fingerprint (b is idle: its heartbeat).
    assert sorted(changed, key=lambda c: (c[4] != s2.fingerprint(), c[0])) == [
        ("a", "reconfigured", "configured", 1.0, s2.fingerprint()),
        ("b", "reconfigured", "configured", 1.0, s2.fingerprint()),
        ("c", "created", "configured", 1.0, s2.fingerprint()),
        ("a", "reconfigured", "stored", 1.0, s3.fingerprint()),
        ("b", "reconfigured", "stored", 1.0, s3.fingerprint()),
        ("c", "reconfigured", "stored", 1.0, s3.fingerprint())]
    for e in ledger[2:]:
        first = min(r.tick for r in releases
                    if r.counter == e.counter and r.fingerprint == e.fingerprint)
        assert e.since_tick == (1 if e.entry == "created" else first)
        assert e.key_id == KEY.fingerprint() and len(e.creation) == 32
        # A reconfigured entry names the creation it continues.
        assert e.creation == next(x.creation for x in ledger if x.counter == e.counter)
    assert {r.epsilon for r in releases} == {1.0}
    assert unexplained(ledger, releases) == []
    # Control: the checker is not vacuous.
    created_only = [e for e in ledger if e.entry == "created"]
    assert {r.counter for r in unexplained(created_only, releases)} == {"a", "b", "c"}


def test_undeclared_counter_needs_the_option() -> None:
    s = settings({"a": 0})
    run = Run(s, StepFactory())
    out = run.event("zz", 3)
    assert out.metrics["undeclared_skipped"] == 1 and "c/zz" not in run.store.data
    s2 = with_overrides(s, allow_undeclared=True)
    run2 = Run(s2, StepFactory())
    run2.marker(4)
    out = run2.event("zz", 3)  # late: starts at the first open tick, 5
    assert out.ledger == [] and out.metrics["late_events"] == 1
    out = run2.event("zz", 1)  # stamped before that start: late, not dropped
    assert out.metrics["late_events"] == 1 and out.metrics["before_start_skipped"] == 0
    out = run2.marker(6)
    assert [(e.counter, e.start_ms) for e in out.ledger] == [("zz", 5 * TICK)]
    assert ys(run2.releases, "zz") == {1: 1.0, 2: 2.0}


def test_releases_carry_no_true_sums_queue_lengths_or_offsets() -> None:
    """Fields are an allow-list of public quantities; and on a burst of 37 events of 0.25
    no numeric field of any release equals that tick's true sum, queue length or any
    timeline offset (the fake's y is a constant sentinel, so only a leak could match)."""
    allowed = {"schema_version", "counter", "tick", "tick_start_ms", "tick_ms", "value",
               "kind", "mechanism", "epsilon", "delta", "error_bound", "beta", "fingerprint"}
    assert {f.name for f in dataclasses.fields(Release)} == allowed
    assert {f.name for f in dataclasses.fields(LedgerEntry)} == {
        "schema_version", "counter", "mechanism", "epsilon", "delta", "tick_ms", "start_ms",
        "privacy_unit", "contribution_bound", "fingerprint", "grid_bits", "key_id",
        "creation", "entry", "since_tick", "parameters", "calibration",
        # privacy_unit = "user" only: public configuration (docs/privacy-unit.md).
        "unit_field", "max_counters_per_unit", "unit_epsilon", "unit_delta",
        "unit_derivation",
        # an admitted key of an open family in user mode: public parameters composed
        # (docs/open-keys.md).
        "unit_delta_total"}

    class Sentinel(StepCounter):
        @property
        def y(self) -> float:
            return -999.0

        def error_bound(self, beta: float = 0.05) -> float:
            return 0.3

    class SentinelFactory(StepFactory):
        def make(self, name: str, eps: float, delta: float, key: NoiseKey,
                 counter_id: str) -> Counter:
            return Sentinel(counter_id, 1, 1, key, eps, delta)

        def restore(self, data: bytes, key: NoiseKey) -> Counter:
            return Sentinel.from_bytes(data, key)

    s = settings({"a": 0}, heartbeat_ticks=1, epsilon=0.7)
    run = Run(s, SentinelFactory())
    run.offset = 700_001
    for _ in range(37):
        run.event("a", 0, 0.25)
    run.marker(39)
    assert len(run.releases) == 40
    offsets = set(range(700_001, run.offset))
    for r in run.releases:
        d = orjson.loads(r.to_json())
        assert set(d) == allowed
        t = r.tick
        true_sum, qlen = 0.25 * min(t, 37), max(37 - t, 0)
        # The tick and the schema version (a constant) are public by definition.
        nums = {v for k, v in d.items()
                if isinstance(v, int | float) and k != "schema_version"} - {d["tick"]}
        assert true_sum not in nums and (qlen == 0 or qlen not in nums)
        assert not nums & offsets


def test_release_json_is_deterministic() -> None:
    r = Release("a", 3, 3000, 1000, 2.5, "change", "ecc", 1.0, 1e-6, 4.25, 0.05, "ff")
    assert r.to_json() == (b'{"schema_version":1,"counter":"a","tick":3,"tick_start_ms":3000,'
                           b'"tick_ms":1000,"value":2.5,"kind":"change","mechanism":"ecc","epsilon":1.0,'
                           b'"delta":1e-6,"error_bound":4.25,"beta":0.05,"fingerprint":"ff"}')
    assert r.key() == b"a"


def test_counters_are_routed_by_partition() -> None:
    """Two partitions: a marker on partition p creates only the counters of p."""
    names = {f"c{i}": 0 for i in range(20)}
    s = settings(names, partitions=2)
    for p in (0, 1):
        run = Run(s, StepFactory(), partition=p)
        run.marker(0)
        assert sorted(e.counter for e in run.ledger) == sorted(
            n for n in names if partition_for(n, 2) == p)


def test_malformed_timeline_record_is_counted_not_raised() -> None:
    run = Run(settings({"a": 0}), StepFactory())
    for bad in (b'{"k":"x"}', b'{"k":"m","n":3}', b"\xff"):  # (a v1 marker is foreign)
        out = run.feed(bad)
        assert out.metrics["malformed_records"] == 1 and run.store.data == {}


@pytest.mark.parametrize("mechanism", ["ecc", "simecc"])
def test_real_mechanism_offline_equivalence(mechanism: str) -> None:
    """The real ECC / SimECC through the operator (restored from the store at every
    record, cache off) equals the mechanism run directly on the queue's x_t."""
    rng = random.Random(5)
    s = settings({"a": 0, "b": 3 * TICK}, heartbeat_ticks=10, epsilon=200.0,
                 mechanism=mechanism)
    recs = random_timeline(rng, ["a", "b"], 3, 90, 0.9)
    run = Run(s, registry, cache_size=0)
    for r in recs:
        run.feed(to_bytes(r))
    through = max(p for k, p in recs if k == "m")
    for c, st in (("a", 0), ("b", 3)):
        xs = reference_x(recs, c, st, through)
        got = [(r.tick, r.value, r.kind, r.error_bound) for r in run.releases
               if r.counter == c]
        assert got == expected_releases(registry, s, c, xs)
    assert all(r.error_bound > 0 and r.mechanism == mechanism for r in run.releases)
    # Not only heartbeats: the mechanism did publish checkpoints.
    assert any(r.kind == "change" for r in run.releases)


def test_heartbeats_are_spread_by_a_public_phase() -> None:
    """With heartbeat_spread, counters that start together heartbeat every h ticks each, on
    the ticks is_heartbeat_tick names, but not all on the same tick (the phase is a hash of
    the name; deterministic, so no false alarms). Control: without spreading, every
    counter's heartbeat falls on the same tick, and the same check fails."""
    names = {f"c{i}": 0 for i in range(200)}
    h = 20

    def per_tick(spread: bool) -> tuple[Counter_[int], Settings, list[Release]]:
        s = settings(names, heartbeat_ticks=h, heartbeat_spread=spread)
        run = Run(s, StepFactory())
        for n in range(1, 60):
            run.marker(n)
        beats = [r for r in run.releases if r.kind == "heartbeat"]
        return Counter_(r.tick for r in beats), s, beats

    spread, s, beats = per_tick(True)
    assert max(spread.values()) <= 3 * len(names) // h  # mean is len(names) / h
    for name in names:
        ticks = sorted(r.tick for r in beats if r.counter == name)
        assert ticks == [t for t in range(1, 61) if is_heartbeat_tick(s, name, t)]
        assert len(ticks) == 3 and ticks[1] - ticks[0] == h == ticks[2] - ticks[1]
    aligned, _, _ = per_tick(False)
    assert max(aligned.values()) == len(names)  # the control: one burst per interval


# ----------------------------------------------------- public timing: markers, never events


def public_trace(s: Settings, records: list[bytes],
                 op_class: type[Operator] = Operator) -> list[tuple[int, list[bytes]]]:
    """Per timeline record that is a MARKER, the public records it produced (ledger
    entries then releases, as bytes); and, for any other record, its public records with
    index -1 (there must be none)."""
    run = Run(s, StepFactory(2, 3))
    run.op = op_class(s, KEY, factory=StepFactory(2, 3))
    trace: list[tuple[int, list[bytes]]] = []
    markers = 0
    for r in records:
        out = run.feed(r)
        public = [e.to_json() for e in out.ledger] + [x.to_json() for x in out.releases]
        if r.startswith(b'{"v":2,"k":"m"'):
            trace.append((markers, public))
            markers += 1
        elif public:
            trace.append((-1, public))
    return trace


class EagerAnnounce(Operator):
    """The control: a counter's ledger entry goes out when an event creates its state (an
    event's time would show in the ledger)."""

    def apply(self, txn: PartitionTransaction, partition: int, offset: int, record: bytes,
              out: Output | None = None, stamp_ms: int | None = None) -> Output:
        out = super().apply(txn, partition, offset, record, out, stamp_ms)
        if not record.startswith(b'{"v":2,"k":"m"'):
            for name, _value in sorted(txn.scan(self._counters)):
                cs = txn.load(self._counters, name)
                if cs is not None and not cs.announced:
                    cs.announced = True
                    txn.stage(self._counters, name, cs)
                    out.ledger.append(LedgerEntry(name, "step-test", 1.0, 1e-6, TICK, 0))
        return out


def test_no_public_record_depends_on_an_event_before_its_marker() -> None:
    """Counters a and b: the ledger entries and releases (existence, order, content, and
    the marker that emits them) are the same whether or not an event for a arrives
    before the first marker (stamped after the ticks compared), and the event itself
    emits nothing. The same for a counter declared by a configuration change with a
    start in the past: no ledger entry and no catch-up heartbeat at its event.
    Control: announcing a counter when an event creates it (EagerAnnounce) fails."""
    s = settings({"a": 2 * TICK, "b": 2 * TICK}, heartbeat_ticks=2)
    markers = [encode_marker(n) for n in range(0, 9)]
    ev = encode_batch([Event("a", 20 * TICK, UNIT, 0, 0)])
    quiet = public_trace(s, markers)
    eager = public_trace(s, [ev, *markers])
    assert quiet == eager
    assert [i for i, _ in quiet] == list(range(9))
    assert b'"counter":"a"' in quiet[2][1][0] and b'"counter":"b"' in quiet[2][1][1]
    assert public_trace(s, [*markers[:4], ev, *markers[4:]]) == quiet
    # A counter declared later, with a start in the past.
    s2 = with_overrides(s, counters={"a": 2 * TICK, "b": 2 * TICK, "c": 0})
    store = DictStore()
    first = Run(s, StepFactory(2, 3), store)
    for m in markers[:5]:
        first.feed(m)

    def later(records: list[bytes]) -> list[list[bytes]]:
        run = Run(s2, StepFactory(2, 3), store=DictStore())
        run.store.data = dict(store.data)
        run.offset = first.offset
        return [[e.to_json() for e in o.ledger] + [x.to_json() for x in o.releases]
                for o in map(run.feed, records)]

    ev_c = encode_batch([Event("c", 30 * TICK, UNIT, 0, 1)])
    plain = later(markers[5:])
    with_event = later([ev_c, *markers[5:]])
    assert with_event[0] == [] and with_event[1:] == plain
    assert any(b'"counter":"c"' in x and b'"kind":"heartbeat"' in x for x in plain[0])
    # Control: the old, eager announcement changes the trace.
    assert public_trace(s, [ev, *markers], EagerAnnounce) != quiet


# --------------------------------------------------------------------------- filter, cache


def test_duplicate_filter_drops_re_sent_events_and_survives_restart() -> None:
    """Ingest re-sends events after a crash (a later timeline record, the same input
    offsets): they are dropped and counted, also by a fresh operator on the same store
    (the filter lives in the partition value). Control: without a source the re-sent
    events count twice."""
    s = settings({"a": 0, "b": 0})
    evs = [Event("a", 1 * TICK, UNIT, 3, 10), Event("b", 1 * TICK, UNIT, 3, 11),
           Event("a", 1 * TICK, UNIT, 5, 2)]
    run = Run(s, StepFactory())
    run.feed(encode_batch(evs))
    run.op = Operator(s, KEY, factory=StepFactory())
    out = run.feed(encode_batch([*evs[1:], Event("a", 1 * TICK, UNIT, 3, 12)]))
    assert out.metrics["duplicates_dropped"] == 2 and out.metrics["events_applied"] == 1
    run.marker(5)
    assert ys(run.releases, "a") == {2: 1.0, 3: 2.0, 4: 3.0}
    assert ys(run.releases, "b") == {2: 1.0}
    blind = Run(s, StepFactory())
    plain = [dataclasses.replace(e, src_partition=-1, src_offset=-1) for e in evs]
    blind.feed(encode_batch(plain))
    blind.feed(encode_batch(plain[1:]))
    blind.marker(5)
    assert ys(blind.releases, "b") == {2: 1.0, 3: 2.0}


def test_a_batch_record_is_applied_to_a_counter_at_most_once() -> None:
    """A batch with several events of one counter, redelivered at the same offset: the
    counter skips the whole record (even after a fresh operator)."""
    s = settings({"a": 0})
    run = Run(s, StepFactory())
    rec = encode_batch([Event("a", TICK, UNIT), Event("a", TICK, UNIT // 2)])
    apply_now(run.op, run.store, 0, 7, rec)
    fresh = Operator(s, KEY, factory=StepFactory())
    out = apply_now(fresh, run.store, 0, 7, rec)
    assert out.metrics["events_applied"] == 0 and out.metrics["skipped_duplicates"] == 2
    out = apply_now(fresh, run.store, 0, 8, encode_marker(3))
    assert [r.value for r in out.decoded_releases()] == [1.0, 1.5]


class CountingFactory(StepFactory):
    def __init__(self) -> None:
        super().__init__()
        self.restored = 0

    def restore(self, data: bytes, key: NoiseKey) -> Counter:
        self.restored += 1
        return super().restore(data, key)


def test_decoded_state_cache_holds_ten_thousand_counters_with_input() -> None:
    """With the default cache size, markers that step an input of each of 10^4 counters
    decode no state from bytes; a cold operator (or a small cache) does, and so does
    every marker for counters that took no input (idle ones are released). A store value
    changed behind the operator's back is decoded again (the cache is never the
    truth)."""
    assert DEFAULT_CACHE_SIZE >= 10_000
    names = {f"k{i:05d}": 0 for i in range(10_000)}
    s = settings(names, heartbeat_ticks=1)

    def busy(run: Run, n: int) -> None:
        run.feed(encode_batch([Event(c, n * TICK, UNIT) for c in names]))
        run.marker(n)

    factory = CountingFactory()
    run = Run(s, factory, cache_size=DEFAULT_CACHE_SIZE)
    run.op = Operator(s, KEY, factory=factory)
    busy(run, 0)
    busy(run, 1)
    assert factory.restored == 0 and len(run.releases) == 20_000
    small = CountingFactory()
    run.op = Operator(s, KEY, factory=small, cache_size=100)
    busy(run, 2)
    assert small.restored == 20_000  # each at its event, and evicted, at the marker
    idle = CountingFactory()
    run.op = Operator(s, KEY, factory=idle, idle_decoded=0)
    run.marker(3)
    run.marker(4)
    assert idle.restored == 20_000
    # Behind its back: k00007's state replaced by an older copy.
    old = run.store.data["c/k00007"]
    run.op = Operator(s, KEY, factory=factory)
    busy(run, 5)
    run.store.data["c/k00007"] = old
    before = factory.restored
    busy(run, 6)
    assert factory.restored == before + 1


def test_due_wheel_stays_small_with_spread_heartbeats() -> None:
    """1,000 counters, heartbeats spread over h = 50 ticks, 300 markers with a few events:
    the due wheel never files more than h + a few ticks, no tick holds more than a
    small multiple of 1000 / h names, and no marker touches a counter with nothing due
    (touched counters per marker <= heartbeats due + counters with events)."""
    names = {f"k{i:04d}": 0 for i in range(1000)}
    h = 50
    s = settings(names, heartbeat_ticks=h, heartbeat_spread=True)
    run = Run(s, StepFactory())
    rng = random.Random(3)
    run.marker(0)
    longest = largest = 0
    for n in range(1, 300):
        for _ in range(3):
            run.event(f"k{rng.randrange(1000):04d}", n + 1)
        out = run.marker(n)
        assert out.metrics["counters_touched"] <= 3 * len(names) // h + 6
        wheel = run.op.due_wheel(0)
        assert wheel is not None
        longest = max(longest, len(wheel.ticks()))
        largest = max(largest, wheel.largest())
    assert longest <= h + 5
    assert largest <= 3 * (len(names) // h) * 2


# ------------------------------------------------------ noise identity and announced creations


def _commit_markers(op: Operator, store: DictStore, offsets_and_ticks: list[tuple[int, int]],
                    crash_after_acks: bool = False) -> CollectingSink:
    """Commit one marker record per (offset, n) with BatchCommit; the publisher keeps what
    was acknowledged. With crash_after_acks, the first batch dies once its records are
    acknowledged, before any state write (the commit protocol's re-execution window)."""
    pub = CollectingSink()

    def crash(point: str) -> None:
        if crash_after_acks and point == "after_acks":
            raise KeyboardInterrupt("crash")

    bc = BatchCommit(op, store, pub, crash_point=crash)
    for off, n in offsets_and_ticks:
        asyncio.run(bc.commit(0, [(off, encode_marker(n))]))
    return pub


def test_announced_counter_without_state_is_refused_and_nothing_is_published() -> None:
    """A first life announces a and b; their state is lost (a fresh store); a worker that
    knows the ledger resumes at a later marker: refused with AnnouncedCounterError naming
    the counter and the remedy, nothing published, nothing written. Control: without the
    ledger (announced=None, today's behaviour) the same resumption republishes a's ticks."""
    s = settings({"a": 2 * TICK, "b": 2 * TICK}, heartbeat_ticks=2)
    first = _commit_markers(Operator(s, KEY, factory=StepFactory(2, 3)), DictStore(),
                            [(0, 3), (1, 5)])
    assert [e.counter for e in first.ledger] == ["a", "b"]
    announced = announced_in(ledger_objects(e.to_json() for e in first.ledger))
    assert set(announced) == {"a", "b"}

    store = DictStore()
    op = Operator(s, KEY, factory=StepFactory(2, 3), announced=announced)
    pub = CollectingSink()
    bc = BatchCommit(op, store, pub)
    with pytest.raises(AnnouncedCounterError) as err:
        asyncio.run(bc.commit(0, [(7, encode_marker(6))]))
    assert err.value.counter == "a"
    msg = str(err.value)
    assert "'a'" in msg and "changelog" in msg and "new app_id" in msg
    assert pub.ledger == [] and pub.releases == [] and store.data == {}
    # The same state loss under a changed configuration (offsets reset to the start):
    # another noise identity, refused too.
    s2 = with_overrides(s, epsilon=2.0)
    with pytest.raises(AnnouncedCounterError):
        _commit_markers(Operator(s2, KEY, factory=StepFactory(2, 3), announced=announced),
                        DictStore(), [(0, 3)])
    # Control: an operator that does not know the ledger publishes a second life of a.
    again = _commit_markers(Operator(s, KEY, factory=StepFactory(2, 3)), DictStore(),
                            [(7, 6)])
    assert {r.counter for r in again.releases} == {"a", "b"}
    assert {(r.counter, r.tick) for r in again.releases} & {
        (r.counter, r.tick) for r in first.releases}


def test_re_executing_the_creating_marker_after_a_crash_is_allowed() -> None:
    """Ledger entries acknowledged, then a crash before any state write: the restarted
    worker knows them from the ledger and re-executes the same marker on the same stored
    state: the same creation (tag), identical ledger entries and releases, no refusal.
    Replaying the whole timeline from scratch is the same creation too."""
    s = settings({"a": 2 * TICK, "b": 2 * TICK}, heartbeat_ticks=2)
    store = DictStore()
    with pytest.raises(KeyboardInterrupt):
        _commit_markers(Operator(s, KEY, factory=StepFactory(2, 3)), store, [(0, 3)],
                        crash_after_acks=True)
    assert store.data == {}
    clean = _commit_markers(Operator(s, KEY, factory=StepFactory(2, 3)), DictStore(),
                            [(0, 3), (1, 5)])
    announced = announced_in(ledger_objects(e.to_json() for e in clean.ledger))
    again = _commit_markers(Operator(s, KEY, factory=StepFactory(2, 3), announced=announced),
                            store, [(0, 3), (1, 5)])
    assert again.ledger == clean.ledger and again.releases == clean.releases
    e = clean.ledger[0]
    assert len(e.key_id) == 16 and len(e.creation) == 32 and e.key_id == KEY.fingerprint()
    # An entry written before creation tags existed announces the counter for good.
    legacy = announced_in(ledger_objects([orjson.dumps({"counter": "a"}), None, b"not json"]))
    assert legacy == {"a": frozenset({""})}
    with pytest.raises(AnnouncedCounterError):
        _commit_markers(Operator(s, KEY, factory=StepFactory(2, 3), announced=legacy),
                        DictStore(), [(0, 3)])


def test_a_running_worker_refuses_what_another_worker_announced_after_its_start() -> None:
    """Two workers of one group read an empty ledger at start. The first creates a and b
    on partition 0; the second takes the partition over without their state (a fresh
    store: what a restore that did not bring it back leaves) at a later marker. Knowing
    only its start's read, it announces a and b a second time under other tags (the
    control: what the fault campaign's phase B once published); given the ledger read on
    at the assignment (`learn_announced`), it refuses, nothing published. The very
    creation re-executed (the same marker on the same stored state) is still allowed."""
    s = settings({"a": 2 * TICK, "b": 2 * TICK}, heartbeat_ticks=2)
    first = _commit_markers(Operator(s, KEY, factory=StepFactory(2, 3), announced={}),
                            DictStore(), [(0, 3), (1, 5)])
    since = announced_in(ledger_objects(e.to_json() for e in first.ledger))
    assert set(since) == {"a", "b"}

    # Control: the start's read alone lets a second creation through, silently.
    blind = _commit_markers(Operator(s, KEY, factory=StepFactory(2, 3), announced={}),
                            DictStore(), [(7, 6)])
    assert {e.counter for e in blind.ledger} == {"a", "b"}
    assert {e.creation for e in blind.ledger}.isdisjoint(e.creation for e in first.ledger)

    op = Operator(s, KEY, factory=StepFactory(2, 3), announced={})
    op.learn_announced(since)
    store = DictStore()
    pub = CollectingSink()
    with pytest.raises(AnnouncedCounterError) as err:
        asyncio.run(BatchCommit(op, store, pub).commit(0, [(7, encode_marker(6))]))
    assert err.value.counter == "a"
    assert pub.ledger == [] and pub.releases == [] and store.data == {}

    # The same marker re-executed on the same (empty) stored state: the same creation.
    again = Operator(s, KEY, factory=StepFactory(2, 3), announced={})
    again.learn_announced(since)
    same = _commit_markers(again, DictStore(), [(0, 3), (1, 5)])
    assert same.ledger == first.ledger and same.releases == first.releases
    # Learning adds tags, never drops one; without a ledger to check (replay) a no-op.
    more = Operator(s, KEY, factory=StepFactory(2, 3), announced=since)
    more.learn_announced({"a": frozenset({"other"})})
    assert _commit_markers(more, DictStore(), [(0, 3)]).ledger == first.ledger
    unchecked = Operator(s, KEY, factory=StepFactory(2, 3))
    unchecked.learn_announced(since)
    assert _commit_markers(unchecked, DictStore(), [(7, 6)]).ledger



def test_a_creation_the_ledger_learnt_after_it_contradicts_is_refused_before_publishing(
        ) -> None:
    """The worker's check right before a creating batch is published (BatchCommit.vet,
    app.OperatorStage.vet): a worker that took a partition over without a and b's state
    creates them before its read of the ledger learnt another worker's creation of them
    (an assignment's read that lost the race with the first batch, or a creation that
    landed after every read). The check learns it then, and refuses: nothing published,
    nothing written. The operator's own creations are not the ledger's word: had they
    been merged into what it learnt (the rule before), the check would have passed.
    Controls: the same batch without the check publishes the second creation; the very
    creation re-executed passes the check."""
    s = settings({"a": 2 * TICK, "b": 2 * TICK}, heartbeat_ticks=2)
    first = _commit_markers(Operator(s, KEY, factory=StepFactory(2, 3), announced={}),
                            DictStore(), [(0, 3), (1, 5)])
    since = announced_in(ledger_objects(e.to_json() for e in first.ledger))

    def vetting(op: Operator, checked: list[list[str]]) -> Callable[[Output], Awaitable[None]]:
        async def vet(out: Output) -> None:
            checked.append([e.counter for e in out.ledger])
            op.learn_announced(since)  # the ledger read on: first's entries are there now
            op.check_ledger(out.ledger)
        return vet

    op = Operator(s, KEY, factory=StepFactory(2, 3), announced={})
    checked: list[list[str]] = []
    store, pub = DictStore(), CollectingSink()
    bc = BatchCommit(op, store, pub, vet=vetting(op, checked))
    with pytest.raises(AnnouncedCounterError) as err:
        asyncio.run(bc.commit(0, [(7, encode_marker(6))]))
    assert err.value.counter == "a" and checked == [["a", "b"]]
    assert pub.ledger == [] and pub.releases == [] and store.data == {}

    # Control: without the check, the second creation is published.
    blind = _commit_markers(Operator(s, KEY, factory=StepFactory(2, 3), announced={}),
                            DictStore(), [(7, 6)])
    assert {e.counter for e in blind.ledger} == {"a", "b"}
    assert {e.creation for e in blind.ledger}.isdisjoint(since["a"] | since["b"])
    # Control: the very creation re-executed (same marker, same stored state) passes.
    again = Operator(s, KEY, factory=StepFactory(2, 3), announced={})
    pub2 = CollectingSink()
    bc2 = BatchCommit(again, DictStore(), pub2, vet=vetting(again, []))
    for off, n in [(0, 3), (1, 5)]:
        asyncio.run(bc2.commit(0, [(off, encode_marker(n))]))
    assert pub2.ledger == first.ledger and pub2.releases == first.releases
    # A batch without ledger entries is not handed to the check.
    quiet: list[list[str]] = []
    bc3 = BatchCommit(Operator(s, KEY, factory=StepFactory(2, 3), announced=since),
                      DictStore(), CollectingSink())
    bc3.vet = vetting(bc3.operator, quiet)
    asyncio.run(bc3.commit(0, [(0, encode_marker(1))]))
    assert quiet == []

def _first_life(s: Settings) -> tuple[DictStore, list[Release]]:
    """Counter a created, announced and sealed through tick 4 under `s`."""
    store = DictStore()
    run = Run(s, StepFactory(2, 3), store=store)
    run.event("a", 1)
    run.marker(4)
    assert run.ledger and run.releases
    return store, run.releases


@pytest.mark.parametrize("change", [{"epsilon": 2.0}, {"delta": 1e-7}])
def test_changed_parameters_under_existing_state_are_refused_in_one_place(
        change: dict[str, float]) -> None:
    """A counter restored from state with another epsilon or delta than
    the settings stops the operator (ParameterChangeError naming the field and the
    counter), before anything of the record is published or written. Control: with
    on_parameter_change = "keep" the counter continues and its releases and the ledger
    entry carry the stored parameters, never the configured ones."""
    from processor.stream.model.provenance import ParameterChangeError

    s = settings({"a": 0}, heartbeat_ticks=2)
    store, first = _first_life(s)
    field_name = next(iter(change))
    changed = with_overrides(s, **change)
    before = dict(store.data)
    pub = CollectingSink()
    bc = BatchCommit(Operator(changed, KEY, factory=StepFactory(2, 3)), store, pub)
    with pytest.raises(ParameterChangeError) as err:
        asyncio.run(bc.commit(0, [(10, encode_marker(8))]))
    assert err.value.counter == "a" and err.value.field == field_name
    msg = str(err.value)
    assert msg.startswith(f"{field_name}:") and "'a'" in msg and "keep" in msg
    assert pub.releases == [] and pub.ledger == [] and store.data == before

    kept = with_overrides(changed, on_parameter_change="keep")
    run = Run(kept, StepFactory(2, 3), store=store)
    run.offset = 10
    run.marker(8)
    assert run.releases
    assert {(r.epsilon, r.delta) for r in run.releases} == {(s.epsilon, s.delta)}
    assert {(r.epsilon, r.delta) for r in first} == {(s.epsilon, s.delta)}


def test_unchanged_parameters_restore_without_refusal() -> None:
    """Control: the same settings (a new Operator, cache cold) restore and continue."""
    s = settings({"a": 0}, heartbeat_ticks=2)
    store, _ = _first_life(s)
    run = Run(s, StepFactory(2, 3), store=store)
    run.offset = 10
    run.marker(8)
    assert run.releases


@pytest.mark.parametrize("key", ["c/a", "p/0"])
def test_corrupt_state_names_its_key(key: str) -> None:
    """A value that does not decode raises StateFormatError carrying its
    store key (the worker's error line names it, with the remedy)."""
    from processor.core.errors import StateFormatError

    s = settings({"a": 0}, heartbeat_ticks=2)
    store, _ = _first_life(s)
    assert key in store.data
    store.data[key] = b"\x00corrupt"
    run = Run(s, StepFactory(2, 3), store=store)
    run.offset = 10
    with pytest.raises(StateFormatError) as err:
        run.event("a", 9)
        run.marker(9)
    assert err.value.key == key


def test_corrupt_state_error_line_names_the_key_and_the_remedy() -> None:
    """The worker's message: the key (a declared counter's name is public; an undeclared
    one is not shown), the changelog topic and state dir to rebuild from, and a new
    deployment when the changelog itself is corrupt."""
    from processor.core.errors import StateFormatError
    from processor.stream.kafka.topics import changelog_topic
    from processor.stream.worker.app import CorruptStateError

    s = settings({"a": 0}, allow_undeclared=True)
    exc = StateFormatError("operator counter state is corrupt")
    exc.key = "c/a"
    msg = str(CorruptStateError(exc, s))
    assert "'c/a'" in msg and changelog_topic(s) in msg and s.state_dir in msg
    assert "new deployment" in msg
    exc.key = "c/secret-undeclared"
    msg = str(CorruptStateError(exc, s))
    assert "secret-undeclared" not in msg and "undeclared" in msg


def test_catch_up_publishes_the_changes_and_only_the_last_heartbeats() -> None:
    """A counter declared 200,000 ticks in the past with a heartbeat every 10: the first
    marker seals them all at once and publishes every change but heartbeats of its last
    CATCHUP_HEARTBEAT_TICKS ticks only (about 100, not 20,000), each y still readable
    from the change records (the same changes as when sealed 100 at a time). Control:
    the same ticks sealed 100 at a time publish every heartbeat (over 50 times more)."""
    from processor.stream.model.operator import CATCHUP_HEARTBEAT_TICKS

    past = 200_000
    s = settings({"a": 0}, heartbeat_ticks=10)
    run = Run(s, StepFactory(2, 3))
    out = run.marker(past - 1)
    beats = [r for r in out.releases if r.kind == "heartbeat"]
    assert 0 < len(beats) <= CATCHUP_HEARTBEAT_TICKS // 10 + 1
    assert min(r.tick for r in beats) > past - CATCHUP_HEARTBEAT_TICKS
    changes = {r.tick: r.value for r in out.decoded_releases() if r.kind == "change"}
    stepped = Run(s, StepFactory(2, 3))
    total = 0
    for n in range(99, past, 100):
        got = stepped.marker(n).decoded_releases()
        total += sum(r.kind == "heartbeat" for r in got)
        for r in got:  # the same changes, whatever the markers
            if r.kind == "change":
                assert changes[r.tick] == r.value
    assert total > 50 * len(beats)
