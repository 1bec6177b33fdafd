"""The operator: the pure state machine between the timeline topic and the releases.

It consumes timeline records (events and "sealed through tick n" markers) in offset order,
one partition at a time, and keeps all state in a key-value `StateStore` (a Faust table
online, a `DictStore` in replay and tests). It imports nothing from Kafka or Faust.

Time. Global tick n covers event time [n*tick_ms, (n+1)*tick_ms). A counter declared with
start S (a multiple of tick_ms) has start_tick = S // tick_ms, and its local tick is
t = n - start_tick + 1, so t = 1 is the tick that begins at S.

Per counter, one store value `c/<counter>` holds: the mechanism state (Counter.to_bytes),
the FIFO queue (run-length encoded values in grid units), pending arrivals for ticks not
yet sealed, the counter's sealed frontier (a global tick), the last timeline offset it
applied, the last published value and the next heartbeat tick.

Per partition, one store value `p/<partition>` holds: the partition's sealed frontier, the
offset of the last marker applied, and the due index (counter -> a global tick at or before
the next tick at which the counter has anything to do). A marker touches only counters whose
due tick has been reached; the index may be early (a spurious touch is harmless) but never
late (that would delay a release). An event that makes an idle counter due earlier does not
rewrite that O(counters) value: it records the earlier due tick in a small second value
`n/<partition>` ("newly due"), which the next marker merges into the index and empties. So
an event costs O(1) store values of O(1) size, and a marker O(1) values plus the counters
it touches.

Sealing a tick: its arrivals join the queue in offset order, at most one value leaves as
x_t (else ⊥), the counter steps. Runs of ⊥ ticks with nothing due are one `Counter.skip`.
Releases: a "change" record when y changes, a "heartbeat" record otherwise at every tick
with (t + phase) % heartbeat_ticks == 0 (`is_heartbeat_tick`; the phase is a public hash of
the counter's name, or 0 with heartbeat_spread off). Releases carry public quantities
only: no true sums, no queue lengths, no offsets.

Idempotency: every record at or below the last applied offset (the counter's for events,
the partition's for markers) is skipped, so at-least-once redelivery neither loses nor
double-counts anything, and re-execution reproduces the same noise (positions are in the
mechanism state).
"""

from __future__ import annotations

import hashlib
import importlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

import orjson

from processor.core.api import Counter
from processor.core.errors import StateFormatError
from processor.core.grid import GRID_BITS, UNIT
from processor.core.rng import NoiseKey
from processor.stream.config import Settings
from processor.stream.records import (
    TimelineEvent,
    TimelineFormatError,
    TimelineMarker,
    decode_timeline,
    partition_for,
)

_COUNTER_MAGIC: Final = b"DPQ"
_PARTITION_MAGIC: Final = b"DPP"
_VERSION: Final = 1

#: The metric names an Output reports (deltas for one applied record).
METRICS: Final = (
    "events_applied",
    "markers_applied",
    "late_events",
    "skipped_duplicates",
    "malformed_records",
    "undeclared_skipped",
    "before_start_skipped",
    "counters_touched",
    "events_queued",
    "events_dequeued",
)


class StateStore(Protocol):
    """The key-value store the operator keeps all its state in."""

    def get(self, key: str) -> bytes | None: ...

    def set(self, key: str, value: bytes) -> None: ...


class DictStore(StateStore):
    """An in-memory StateStore (replay, tests, benchmarks)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value


class CounterFactory(Protocol):
    """Builds and restores core counters: `processor.core.registry` fulfils it."""

    def make(self, name: str, eps: float, delta: float, key: NoiseKey,
             counter_id: str) -> Counter: ...

    def restore(self, data: bytes, key: NoiseKey) -> Counter: ...


@dataclass(frozen=True)
class Release:
    """One published value of one counter at one tick (the private-counts topic).

    `value` is y_t; `error_bound` bounds |y_t - s_t| with probability >= 1 - beta and is
    computed from public quantities only. Keyed and idempotent by (counter, tick).
    """

    counter: str
    tick: int
    tick_start_ms: int
    tick_ms: int
    value: float
    kind: Literal["change", "heartbeat"]
    mechanism: str
    epsilon: float
    delta: float
    error_bound: float
    beta: float
    fingerprint: str

    def key(self) -> bytes:
        return self.counter.encode("utf-8")

    def to_json(self) -> bytes:
        # orjson serialises dataclasses in field order: deterministic bytes.
        return orjson.dumps(self)


@dataclass(frozen=True)
class LedgerEntry:
    """The privacy ledger record of one counter, written when its state is created."""

    counter: str
    mechanism: str
    epsilon: float
    delta: float
    tick_ms: int
    start_ms: int
    privacy_unit: str = "one event"
    contribution_bound: int = 1
    fingerprint: str = ""
    grid_bits: int = GRID_BITS

    def key(self) -> bytes:
        return self.counter.encode("utf-8")

    def to_json(self) -> bytes:
        return orjson.dumps(self)


@dataclass
class Output:
    """What applying one timeline record produced: releases, ledger entries (new
    counters) and metric deltas (names in METRICS; aggregates only, never per counter)."""

    releases: list[Release] = field(default_factory=list)
    ledger: list[LedgerEntry] = field(default_factory=list)
    metrics: dict[str, int] = field(default_factory=lambda: dict.fromkeys(METRICS, 0))


def counter_id_for(settings: Settings, counter: str) -> str:
    """The identity a counter's noise is keyed by: its name under the configuration
    fingerprint, so a changed (eps, delta, ...) never reuses the noise of another
    configuration on the same data (two releases sharing noise could cancel it)."""
    return f"{settings.fingerprint()[:16]}/{counter}"


# ------------------------------------------------------------------------ state records


def heartbeat_phase(settings: Settings, counter: str) -> int:
    """The public offset of a counter's heartbeats, from its (declared, public) name only."""
    h = settings.heartbeat_ticks
    if not settings.heartbeat_spread or h <= 1:
        return 0
    digest = hashlib.sha256(b"dpc/heartbeat/" + counter.encode()).digest()
    return int.from_bytes(digest[:8], "big") % h


def next_heartbeat(t: int, phase: int, h: int) -> int:
    """The first local tick after t with (tick + phase) % h == 0."""
    return t + h - (t + phase) % h


def is_heartbeat_tick(settings: Settings, counter: str, t: int) -> bool:
    """True when local tick t of `counter` carries a heartbeat (unless y changed there)."""
    return (t + heartbeat_phase(settings, counter)) % settings.heartbeat_ticks == 0


class _CounterState:
    """The decoded `c/<counter>` value (mutable while one record is applied)."""

    __slots__ = ("counter", "frontier", "hb", "last_y", "offset", "pending", "queue",
                 "start_tick")

    def __init__(self, counter: Counter, start_tick: int, first_heartbeat: int) -> None:
        self.counter = counter
        self.start_tick = start_tick
        self.frontier = start_tick - 1  # global tick through which this counter is sealed
        self.offset = -1  # last applied timeline offset
        self.queue: deque[list[int]] = deque()  # [value_units, run_length], FIFO
        self.pending: dict[int, list[int]] = {}  # global tick -> arrivals in offset order
        self.last_y = 0.0
        self.hb = first_heartbeat  # next local tick with a heartbeat

    def to_bytes(self) -> bytes:
        mech = self.counter.to_bytes()
        meta = {
            "st": self.start_tick,
            "f": self.frontier,
            "o": self.offset,
            "q": list(self.queue),
            "p": sorted(self.pending.items()),
            "ly": self.last_y,
            "hb": self.hb,
        }
        return (_COUNTER_MAGIC + bytes([_VERSION]) + len(mech).to_bytes(4, "big") + mech
                + orjson.dumps(meta))

    @classmethod
    def from_bytes(cls, data: bytes, factory: CounterFactory, key: NoiseKey) -> _CounterState:
        data = bytes(data)
        if data[:3] != _COUNTER_MAGIC or len(data) < 8 or data[3] != _VERSION:
            raise StateFormatError("not an operator counter state (magic/version)")
        n = int.from_bytes(data[4:8], "big")
        mech, rest = data[8:8 + n], data[8 + n:]
        try:
            meta = orjson.loads(rest)
            self = cls.__new__(cls)
            self.counter = factory.restore(mech, key)
            self.start_tick = int(meta["st"])
            self.frontier = int(meta["f"])
            self.offset = int(meta["o"])
            self.queue = deque([int(u), int(c)] for u, c in meta["q"])
            self.pending = {int(g): [int(u) for u in us] for g, us in meta["p"]}
            self.last_y = float(meta["ly"])
            self.hb = int(meta["hb"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, StateFormatError):
                raise
            raise StateFormatError("operator counter state is corrupt") from None
        if self.counter.t != self.frontier - self.start_tick + 1:
            raise StateFormatError("operator counter state: mechanism tick != frontier")
        return self

    def push(self, units: int) -> None:
        if self.queue and self.queue[-1][0] == units:
            self.queue[-1][1] += 1
        else:
            self.queue.append([units, 1])

    def pop(self) -> int:
        head = self.queue[0]
        head[1] -= 1
        if head[1] == 0:
            self.queue.popleft()
        return head[0]


class _PartitionState:
    """The decoded `p/<partition>` value."""

    __slots__ = ("declared", "due", "fresh", "frontier", "min_due", "offset")

    def __init__(self, due: dict[str, int], declared: str) -> None:
        self.frontier = -1  # global tick through which the partition is sealed
        self.offset = -1  # offset of the last marker applied
        self.due = due
        # Fingerprint of the configuration whose declared counters were indexed: when it
        # changes, newly declared counters are added to the index (see _load_partition).
        self.declared = declared
        self.fresh = True  # not in the store yet (not persisted)
        # min(due.values()) or None if unknown; in memory only, lets an idle marker skip
        # the scan of the index.
        self.min_due: int | None = None

    def to_bytes(self) -> bytes:
        return _PARTITION_MAGIC + bytes([_VERSION]) + orjson.dumps(
            {"f": self.frontier, "o": self.offset, "fp": self.declared, "d": self.due})

    @classmethod
    def from_bytes(cls, data: bytes) -> _PartitionState:
        data = bytes(data)
        if data[:3] != _PARTITION_MAGIC or len(data) < 5 or data[3] != _VERSION:
            raise StateFormatError("not an operator partition state (magic/version)")
        try:
            body = orjson.loads(data[4:])
            self = cls(dict(body["d"]), str(body["fp"]))
            self.frontier = int(body["f"])
            self.offset = int(body["o"])
            self.fresh = False
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise StateFormatError("operator partition state is corrupt") from None
        return self


# ------------------------------------------------------------------------ the operator


class Operator:
    """Applies timeline records to the state in a StateStore; see the module docstring."""

    def __init__(self, settings: Settings, key: NoiseKey, *,
                 factory: CounterFactory | None = None, cache_size: int = 4096) -> None:
        self.settings = settings
        self.key = key
        # The registry is imported lazily so that tests can inject a fake factory.
        self.factory: CounterFactory = (
            factory if factory is not None
            else importlib.import_module("processor.core.registry"))
        self.fingerprint = settings.fingerprint()
        self._start_ticks = {c: s // settings.tick_ms for c, s in settings.counters.items()}
        # Decoded partition states by partition, with the exact bytes they came from:
        # reused only while the store still holds those bytes (a cache, never the truth).
        self._pcache: dict[int, tuple[bytes, _PartitionState]] = {}
        # The same for counter states (LRU, at most cache_size): restoring a mechanism
        # costs far more than applying an event. Restoring from bytes and continuing equals
        # never stopping (the Counter contract), so reusing the object we serialised is
        # exactly equivalent to decoding the stored bytes again.
        self._ccache: OrderedDict[str, tuple[bytes, _CounterState]] = OrderedDict()
        self._cache_size = cache_size
        # error_bound(beta) is a function of the mechanism's parameters and t only (the
        # Counter contract: public quantities), and every counter here has the same
        # parameters, so a heartbeat sweep over many counters at one tick computes it once.
        self._bounds: dict[tuple[str, float, float, float, int], float] = {}

    # -- public entry point

    def apply(self, store: StateStore, partition: int, offset: int, record: bytes) -> Output:
        """Apply the timeline record at (`partition`, `offset`). Never raises on a
        well-formed record; a malformed one is counted (metric malformed_records) and
        changes nothing. Records at or below the last applied offset are skipped."""
        out = Output()
        try:
            rec = decode_timeline(record)
        except TimelineFormatError:
            out.metrics["malformed_records"] += 1
            return out
        try:
            if isinstance(rec, TimelineMarker):
                self._apply_marker(store, partition, offset, rec, out)
            else:
                self._apply_event(store, partition, offset, rec, out)
        except BaseException:
            # State is written only at the end of a successful apply; drop the cache so
            # that a half-mutated decoded object is never reused.
            self._pcache.pop(partition, None)
            self._ccache.clear()
            raise
        return out

    # -- partition state

    def _load_partition(self, store: StateStore, partition: int) -> _PartitionState:
        raw = store.get(f"p/{partition}")
        if raw is None:
            self._pcache.pop(partition, None)
            # Every declared counter of this partition is due at its first tick, so the
            # first marker past it creates the counter (and its ledger entry) on time.
            return _PartitionState(self._declared_due(partition), self.fingerprint)
        cached = self._pcache.get(partition)
        if cached is not None and (cached[0] is raw or cached[0] == raw):
            return cached[1]
        ps = _PartitionState.from_bytes(raw)
        if ps.declared != self.fingerprint:
            # The configuration changed under existing state: index counters declared
            # since (existing entries stay; a counter no longer declared is dropped when
            # it next comes due). Persisted with the next write of this partition.
            for c, st in self._declared_due(partition).items():
                ps.due.setdefault(c, st)
            ps.declared = self.fingerprint
            ps.fresh = True
            ps.min_due = None
        else:
            self._pcache[partition] = (bytes(raw), ps)
        return ps

    def _load_newly(self, store: StateStore, partition: int) -> dict[str, int]:
        """The small "newly due" value: counter -> earlier due tick, since the last marker."""
        raw = store.get(f"n/{partition}")
        if not raw:
            return {}
        try:
            newly = orjson.loads(raw)
            return {str(c): int(d) for c, d in newly.items()}
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            raise StateFormatError("operator newly-due state is corrupt") from None

    def _declared_due(self, partition: int) -> dict[str, int]:
        P = self.settings.partitions
        return {c: st for c, st in self._start_ticks.items() if partition_for(c, P) == partition}

    def _partition_write(self, partition: int, ps: _PartitionState) -> tuple[str, bytes]:
        raw = ps.to_bytes()
        ps.fresh = False
        self._pcache[partition] = (raw, ps)
        return f"p/{partition}", raw

    # -- counter state

    def _new_counter(self, name: str, start_tick: int, out: Output) -> _CounterState:
        s = self.settings
        c = self.factory.make(s.mechanism, s.epsilon, s.delta, self.key,
                              counter_id_for(s, name))
        out.ledger.append(LedgerEntry(
            counter=name, mechanism=s.mechanism, epsilon=s.epsilon, delta=s.delta,
            tick_ms=s.tick_ms, start_ms=start_tick * s.tick_ms, fingerprint=self.fingerprint))
        return _CounterState(c, start_tick,
                             next_heartbeat(0, heartbeat_phase(s, name), s.heartbeat_ticks))

    def _load_counter(self, store: StateStore, name: str) -> _CounterState | None:
        raw = store.get(f"c/{name}")
        if raw is None:
            self._ccache.pop(name, None)
            return None
        cached = self._ccache.get(name)
        if cached is not None and (cached[0] is raw or cached[0] == raw):
            self._ccache.move_to_end(name)
            return cached[1]
        cs = _CounterState.from_bytes(raw, self.factory, self.key)
        self._remember(name, bytes(raw), cs)
        return cs

    def _counter_write(self, name: str, cs: _CounterState) -> tuple[str, bytes]:
        raw = cs.to_bytes()
        self._remember(name, raw, cs)
        return f"c/{name}", raw

    def _remember(self, name: str, raw: bytes, cs: _CounterState) -> None:
        if self._cache_size <= 0:
            return
        self._ccache[name] = (raw, cs)
        self._ccache.move_to_end(name)
        while len(self._ccache) > self._cache_size:
            self._ccache.popitem(last=False)

    def _due(self, cs: _CounterState) -> int:
        """A global tick at or before the next one at which `cs` has anything to do."""
        due = cs.start_tick + cs.hb - 1
        if cs.queue:
            due = min(due, cs.frontier + 1)
        if cs.pending:
            due = min(due, min(cs.pending))
        nd = cs.counter.next_due()
        if nd is not None:
            due = min(due, cs.start_tick + nd - 1)
        return due

    # -- records

    def _apply_event(self, store: StateStore, partition: int, offset: int,
                     ev: TimelineEvent, out: Output) -> None:
        ps = self._load_partition(store, partition)
        cs = self._load_counter(store, ev.counter)
        if cs is not None and offset <= cs.offset:
            out.metrics["skipped_duplicates"] += 1
            return
        tick_ms = self.settings.tick_ms
        n_event = ev.ts_ms // tick_ms
        if cs is None:
            start_tick = self._start_ticks.get(ev.counter)
            if start_tick is None:
                if not self.settings.allow_undeclared:
                    out.metrics["undeclared_skipped"] += 1
                    return
                # An undeclared counter starts at its first event's tick (or the first
                # open tick if that one is already sealed).
                start_tick = max(n_event, ps.frontier + 1)
            elif n_event < start_tick:
                out.metrics["before_start_skipped"] += 1
                return
            cs = self._new_counter(ev.counter, start_tick, out)
        elif n_event < cs.start_tick and ev.counter in self._start_ticks:
            # (An undeclared counter's start is its first event's tick: an event stamped
            # earlier but arriving later is a late event, not one before the start.)
            out.metrics["before_start_skipped"] += 1
            return
        # Bring the counter up to the partition's frontier first: a marker skipped it
        # because nothing was due, so this is a pure skip (no releases in practice).
        if cs.frontier < ps.frontier:
            self._seal(ev.counter, cs, ps.frontier, out)
        open_tick = cs.frontier + 1
        if n_event < open_tick:
            out.metrics["late_events"] += 1
            n_event = open_tick
        cs.pending.setdefault(n_event, []).append(ev.value_units)
        cs.offset = offset
        out.metrics["events_applied"] += 1
        out.metrics["events_queued"] += 1
        out.metrics["counters_touched"] += 1
        due = self._due(cs)
        writes: list[tuple[str, bytes]] = []
        old = ps.due.get(ev.counter)
        if ps.fresh:
            # First write of this partition (or first under a new configuration).
            ps.due[ev.counter] = due if old is None else min(old, due)
            ps.min_due = None
            writes.append(self._partition_write(partition, ps))
        elif old is None or due < old:
            newly = self._load_newly(store, partition)
            if ev.counter not in newly or due < newly[ev.counter]:
                newly[ev.counter] = due
                # The due index is written BEFORE the counter: if we crash in between,
                # the event is re-applied and the index is merely early, never late.
                writes.append((f"n/{partition}", orjson.dumps(newly)))
        writes.append(self._counter_write(ev.counter, cs))
        for k, v in writes:
            store.set(k, v)

    def _apply_marker(self, store: StateStore, partition: int, offset: int,
                      mk: TimelineMarker, out: Output) -> None:
        ps = self._load_partition(store, partition)
        if offset <= ps.offset:
            out.metrics["skipped_duplicates"] += 1
            return
        n = mk.sealed_through
        if n <= ps.frontier:
            # Markers are idempotent: an already sealed tick changes nothing (not even
            # the stored offset, which only guards against redelivery).
            out.metrics["markers_applied"] += 1
            return
        newly = self._load_newly(store, partition)
        for name, d in newly.items():
            old = ps.due.get(name)
            if old is None or d < old:
                ps.due[name] = d
                if ps.min_due is not None:
                    ps.min_due = min(ps.min_due, d)
        if ps.min_due is None:
            ps.min_due = min(ps.due.values(), default=n + 1)
        due_now = sorted(c for c, d in ps.due.items() if d <= n) if ps.min_due <= n else []
        writes: list[tuple[str, bytes]] = []
        new_due: dict[str, int] = {}
        for name in due_now:
            cs = self._load_counter(store, name)
            if cs is None:
                start_tick = self._start_ticks.get(name)
                if start_tick is None:
                    # Not declared any more (configuration changed): forget it.
                    new_due[name] = -1
                    continue
                cs = self._new_counter(name, start_tick, out)
            if cs.offset >= offset:
                # Already sealed by this marker before a crash: only re-index it.
                new_due[name] = self._due(cs)
                continue
            if cs.frontier < n:
                self._seal(name, cs, n, out)
            cs.offset = offset
            new_due[name] = self._due(cs)
            writes.append(self._counter_write(name, cs))
            out.metrics["counters_touched"] += 1
        for name, d in new_due.items():
            if d < 0:
                ps.due.pop(name, None)
            else:
                ps.due[name] = d
        if due_now:
            ps.min_due = None  # recomputed (once) by the next marker
        ps.frontier = n
        ps.offset = offset
        # Counters first, the partition next: a crash in between replays the marker (its
        # offset is not yet recorded), and the counters already sealed skip it. The merged
        # "newly due" value is emptied last: a crash before that merges it once more,
        # which only makes some entries early.
        writes.append(self._partition_write(partition, ps))
        if newly:
            writes.append((f"n/{partition}", b"{}"))
        for k, v in writes:
            store.set(k, v)
        out.metrics["markers_applied"] += 1

    # -- the queue and the ticks

    def _seal(self, name: str, cs: _CounterState, n: int, out: Output) -> None:
        """Advance `cs` through global tick n: per tick, arrivals join the queue, at most
        one value leaves as x_t; idle runs (empty queue, nothing due) are one skip."""
        c = cs.counter
        while cs.frontier < n:
            g = cs.frontier + 1
            arrivals = cs.pending.pop(g, None)
            if arrivals:
                for u in arrivals:
                    cs.push(u)
            if cs.queue:
                c.update(cs.pop() / UNIT)  # units / 2^16 is exact; the core re-quantises
                out.metrics["events_dequeued"] += 1
                cs.frontier = g
                self._emit(name, cs, out)
                continue
            stop = min(n + 1, cs.start_tick + cs.hb - 1)
            if cs.pending:
                stop = min(stop, min(cs.pending))
            nd = c.next_due()
            if nd is not None:
                stop = min(stop, cs.start_tick + nd - 1)
            if stop > g:
                k = stop - g
                changes = c.skip(k)
                cs.frontier += k
                # By the next_due() contract a skip short of it changes nothing; if a
                # mechanism reports changes anyway, publish them rather than hide them.
                for t, y in changes:
                    self._release(name, cs, t, y, "change", out)
                cs.last_y = c.y
                continue
            c.update(None)
            cs.frontier = g
            self._emit(name, cs, out)

    def _emit(self, name: str, cs: _CounterState, out: Output) -> None:
        """After one tick: a change record if y moved, else a heartbeat if one is due."""
        c = cs.counter
        t, y = c.t, c.y
        kind: Literal["change", "heartbeat"] | None = None
        if y != cs.last_y:
            kind = "change"
        elif t >= cs.hb:
            kind = "heartbeat"
        if t >= cs.hb:
            h = self.settings.heartbeat_ticks
            cs.hb = next_heartbeat(t, heartbeat_phase(self.settings, name), h)
        cs.last_y = y
        if kind is not None:
            self._release(name, cs, t, y, kind, out)

    def _release(self, name: str, cs: _CounterState, t: int, y: float,
                 kind: Literal["change", "heartbeat"], out: Output) -> None:
        s = self.settings
        c = cs.counter
        # Mechanism, eps and delta are those of the running instance (restored from state),
        # which differ from the settings only if the configuration changed under live state.
        out.releases.append(Release(
            counter=name, tick=t, tick_start_ms=(cs.start_tick + t - 1) * s.tick_ms,
            tick_ms=s.tick_ms, value=y, kind=kind, mechanism=c.mechanism,
            epsilon=c.eps, delta=c.delta,
            error_bound=self._error_bound(c, t), beta=s.beta,
            fingerprint=self.fingerprint))

    def _error_bound(self, c: Counter, t: int) -> float:
        beta = self.settings.beta
        if c.t != t:  # a change reported inside a skip: the bound at the current tick
            return float(c.error_bound(beta))  # (larger t, so conservative)
        k = (c.mechanism, c.eps, c.delta, beta, t)
        bound = self._bounds.get(k)
        if bound is None:
            if len(self._bounds) >= 4096:
                self._bounds.clear()
            bound = self._bounds[k] = float(c.error_bound(beta))
        return bound
