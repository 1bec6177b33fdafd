"""The bounding stage of privacy_unit = "user": contribution bounds enforced before any
event reaches the timeline (docs/privacy-unit.md).

    input --ingest--> units topic (partitioned by HMAC(unit key, unit id))
          --bounding stage (this module; a Faust agent in app.py)--> timeline | dead letters

- Ingest replaces each event's unit id by `unit_hash` (HMAC-SHA256 under a key derived
  from the deployment's noise key; 128 bits, hex) and writes batches of rows to the
  units topic partition `unit_partition(hash)`. The raw id never reaches a topic, the
  state or the changelog.
- The stage keeps, per unit, the kept set: counter -> the sequence numbers of its kept
  events (at most k per counter, at most m counters, in first-touch order). An event is
  kept iff its counter is already in the set with fewer than k events, or is new and the
  set has fewer than m counters; otherwise it is dead-lettered
  (`contribution_bound_exceeded`), never counted, never lost (the dead letter names the
  input record's topic, partition and offset).
- **No coupling between units.** Ingest is at-least-once (a batch re-read after a crash
  is written again) and two ingest owners of one input partition may write out of order
  (a zombie: ingest has no fence). Each unit's value carries its own input duplicate
  filter (input partition -> highest input offset of its events applied), so only a
  unit's own events make one of its events a duplicate: a unit's kept set is a function
  of its own events in log order, whatever other units send.
- **Deterministic and crash-safe.** Decisions follow the units topic's log order (a
  sequence number seq = offset * 2^16 + index in the record). Each unit value records
  the last seq applied to it; an event at or before that seq is *looked up* (kept iff
  its seq is in the set: forwarded again; else nothing is sent again, its dead letter
  was acknowledged before the value was written), never re-decided. So re-applying any
  prefix of the log to any state a checkpoint wrote (older or newer, after a kill
  between a state write and a forward, a rebalance, a zombie's late write, replay from
  scratch) yields the same decisions: the kept set is a function of the log alone.
- **Bound to its bounds.** Each units partition value records the (k, m) its kept sets
  were decided under; a restore under others is refused (BoundsChangeError) unless the
  migration is confirmed (processor/stream/model/lifetime.py says what the ledger then states).
- **Forwarding is idempotent.** Kept events go to the timeline with source "units", input
  partition = the units partition and input offset = seq, strictly increasing per units
  partition: the operator's existing duplicate filter drops every re-sent copy.
- The commit protocol is the operator's (`BoundCommit` on commit.CheckpointLoop, as
  commit.BatchCommit): apply in memory, staged in a transaction.PartitionTransaction
  per units partition, and send the forwards (at once, or held back so that those of
  several units records share timeline records: `forward_held`); at a checkpoint send
  any still held and await their acknowledgements, write each changed unit value once
  (monotone: it carries the units offset it reflects, state.UNIT_MAGIC), then the
  partition value, in one write batch per partition, await the changelog, then
  acknowledge to the group.

Pure apart from the `Sink` and `Stores` it is handed; no raw unit id anywhere.
"""

from __future__ import annotations

import collections
import gc
import hashlib
import hmac
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from processor.core.rng import NoiseKey
from processor.errors import RefusedError
from processor.stream.model.commit import CheckpointLoop, Stores
from processor.stream.model.config import Settings
from processor.stream.model.outputs import Output, Sink
from processor.stream.model.records import (
    MAX_BATCH_BYTES,
    MAX_BATCH_EVENTS,
    DeadLetterEncoder,
    Event,
    Rejection,
    TimelineBatch,
    TimelineFormatError,
    decode_timeline,
    encode_batch_rows,
    fit_records,
    partition_for,
)
from processor.stream.model.state import (
    PARTITION_PREFIX,
    UNIT_MAGIC,
    DictStore,
    DuplicateFilter,
    StateStore,
    monotone_header,
    stored_offset,
)
from processor.stream.model.transaction import PartitionTransaction, Slot, StateCache

#: Version of the units topic's records.
UNITS_VERSION: Final = 1
#: The label of the unit-id HMAC key under the noise key (NoiseKey.derive).
UNIT_KEY_LABEL: Final = "privacy-unit/id-hmac"
#: Hex digits of a unit hash kept (128 bits: collisions among 2^40 units ~ 2^-49).
UNIT_HASH_HEX: Final = 32
#: seq = offset << SEQ_BITS | index: a units record holds fewer than 2^16 events.
SEQ_BITS: Final = 16
MAX_EVENTS_PER_RECORD: Final = 1 << SEQ_BITS
#: The source identity of forwarded batches (the operator's duplicate filter's label
#: prefix); distinct from any input topic identity (those are topic ids).
UNITS_SOURCE: Final = "units"
UNIT_PREFIX: Final = "u/"
#: Crash points of the kill tests, in order.
CRASH_POINTS: Final = ("unit_after_forward", "unit_between_state_writes", "unit_after_state")
#: The stage's aggregate counts (Output.metrics, folded into the worker's counts
#: under these names; never per unit). Its dead letters count as
#: `deadletter_contribution_bound_exceeded`, beside the ingest stage's reasons.
METRICS: Final = ("unit_records", "unit_records_skipped_duplicates",
                  "unit_records_malformed", "unit_events_kept", "unit_duplicates_dropped",
                  "unit_events_redelivered_dropped")

#: One row of a units record: [unit hash, counter, ts_ms, units, in_partition, in_offset].
UnitRow = list[Any]


#: BoundCommit.apply sends the kept events it holds back once they are this many (a
#: timeline record's worth).
HOLD_EVENTS: Final = MAX_BATCH_EVENTS


class UnitsFormatError(ValueError):
    """A units-topic record this module did not write."""


def unit_key(key: NoiseKey) -> bytes:
    """The HMAC key of unit ids, derived from the deployment's noise key (no new secret)."""
    return key.derive(UNIT_KEY_LABEL)


def unit_hash(ukey: bytes, uid: str) -> str:
    """HMAC-SHA256(ukey, uid), the first 128 bits in hex: what stands for the unit
    everywhere after ingest (key, state, changelog, dead letters)."""
    return hmac.new(ukey, uid.encode("utf-8"), hashlib.sha256).hexdigest()[:UNIT_HASH_HEX]


class UnitHasher:
    """unit_hash with the key's HMAC state prepared once (copied per id: about half the
    cost of hmac.new) and the most recent ids remembered (a unit's events come in runs).
    The cache lives in ingest's memory only, like the raw ids it maps."""

    def __init__(self, ukey: bytes, cache: int = 65_536) -> None:
        self._base = hmac.new(ukey, digestmod=hashlib.sha256)
        self._cache: dict[str, str] = {}
        self._max = cache

    def __call__(self, uid: str) -> str:
        h = self._cache.get(uid)
        if h is None:
            mac = self._base.copy()
            mac.update(uid.encode("utf-8"))
            h = mac.hexdigest()[:UNIT_HASH_HEX]
            if len(self._cache) >= self._max:
                self._cache.clear()
            self._cache[uid] = h
        return h


def unit_partition(h: str, partitions: int) -> int:
    """The units partition of unit hash `h` (its first 64 bits mod P)."""
    return int(h[:16], 16) % partitions


def unit_row(h: str, ev: Event) -> UnitRow:
    return [h, ev.counter, ev.ts_ms, ev.units, ev.src_partition, ev.src_offset]


def encode_units(rows: Sequence[UnitRow], source: str = "") -> bytes:
    """A units-topic record: rows of one units partition, in the order ingest read them."""
    if len(rows) >= MAX_EVENTS_PER_RECORD:
        raise ValueError("a units record holds fewer than 2^16 events")
    return orjson.dumps({"v": UNITS_VERSION, "k": "u", "i": source, "e": list(rows)})


def decode_units(raw: bytes) -> tuple[str, list[UnitRow]]:
    """(input identity, rows) of a units record; UnitsFormatError if it is not one."""
    try:
        obj = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        raise UnitsFormatError("units record is not JSON") from None
    if (type(obj) is not dict or obj.get("v") != UNITS_VERSION or obj.get("k") != "u"
            or type(obj.get("i")) is not str or type(obj.get("e")) is not list):
        raise UnitsFormatError("not a units record of version 1")
    rows = obj["e"]
    if len(rows) >= MAX_EVENTS_PER_RECORD:
        raise UnitsFormatError("units record too long")
    for row in rows:
        if type(row) is not list or len(row) != 6:
            raise UnitsFormatError("units row is not [unit, c, ts, units, p, o]")
        h, c, ts, u, p, o = row
        if (type(h) is not str or len(h) != UNIT_HASH_HEX or type(c) is not str or not c
                or type(ts) is not int or type(u) is not int or type(p) is not int
                or type(o) is not int or ts < 0 or u < 0):
            raise UnitsFormatError("units row has a field of the wrong type")
    return obj["i"], rows


# ---------------------------------------------------------------------- the unit's state


@dataclass(slots=True)
class UnitState:
    """One unit's kept set: counter -> seqs of its kept events (first-touch order), the
    last seq applied to this unit, and the units offset that seq belongs to (the offset
    the stored value reflects: the monotone rule of docs/state.md). `saved` (not
    encoded): the bytes it equals in the store (transaction.Stored).

    `decide` keeps a counter's seqs in a tuple (a decoded value has lists): a tuple of
    ints leaves the cyclic collector's lists at its next pass, a list never does, so a
    unit held until the checkpoint is two objects it walks (the value and its dict), not
    three."""

    last_seq: int = -1
    kept: dict[str, Sequence[int]] = field(default_factory=dict)
    #: The unit's input duplicate filter: "<input identity index>/<input partition>"
    #: (UnitsPartitionState.sources) -> the highest input offset of this unit's events
    #: applied (`Bounder.apply`). Per unit, so that no
    #: other unit's events (a zombie ingest's late write of older offsets included) ever
    #: make one of this unit's a duplicate.
    inputs: DuplicateFilter = field(default_factory=DuplicateFilter)
    saved: bytes | None = field(default=None, compare=False, repr=False)

    @property
    def offset(self) -> int:
        return self.last_seq >> SEQ_BITS if self.last_seq >= 0 else -1

    def to_bytes(self) -> bytes:
        last = self.last_seq
        # orjson writes the (counter, seqs) tuples as the arrays from_bytes reads.
        raw = monotone_header(UNIT_MAGIC, last >> SEQ_BITS if last >= 0 else -1) + orjson.dumps(
            (last, tuple(self.kept.items()), self.inputs))
        self.saved = raw
        return raw

    @classmethod
    def from_bytes(cls, data: bytes) -> UnitState:
        # The magic and the 8-byte offset state.stored_offset reads (a value per unit
        # touched is decoded: the header is checked here, without a call per value).
        if len(data) < 12 or bytes(data[:4]) != UNIT_MAGIC:
            raise UnitsFormatError("not a unit value")
        # Written by to_bytes only (the magic says so): orjson gives back its str and
        # int types as they were, with nothing to convert.
        body = orjson.loads(data[12:])
        # A value written before the per-unit filter has no third element.
        return cls(body[0], dict(body[1]),
                   DuplicateFilter(body[2]) if len(body) > 2 else DuplicateFilter(), data)


@dataclass
class UnitsPartitionState:
    """One units partition's value: the last units offset applied and the bounds (k, m)
    its kept sets were decided under (None: a value written before they were recorded).
    A restore under other bounds is refused (BoundsChangeError) unless the migration is
    confirmed: a kept set decided under other bounds says nothing the configured ledger
    entries could state (docs/privacy-unit.md)."""

    last_offset: int = -1
    bounds: tuple[int, int] | None = None
    #: The input identities its units records named, in log order: a unit's filter names
    #: an input partition by the index of its identity here (a few bytes per unit, not a
    #: topic id), and a recreated input topic (a new identity) starts afresh.
    sources: list[str] = field(default_factory=list)
    saved: bytes | None = field(default=None, compare=False, repr=False)

    def source_index(self, source: str) -> int:
        """The index of `source` (appended if new)."""
        try:
            return self.sources.index(source)
        except ValueError:
            self.sources.append(source)
            return len(self.sources) - 1

    def to_bytes(self) -> bytes:
        raw = (monotone_header(UNIT_MAGIC, self.last_offset)
               + orjson.dumps({"b": self.bounds, "s": self.sources}))
        self.saved = raw
        return raw

    @classmethod
    def from_bytes(cls, data: bytes) -> UnitsPartitionState:
        off = stored_offset(data)
        if off is None or bytes(data[:4]) != UNIT_MAGIC:
            raise UnitsFormatError("not a units partition value")
        # "i", the shared input filter of earlier values, is not read: the filter is per
        # unit (UnitState.inputs).
        body = orjson.loads(data[12:])
        b = body.get("b")
        return cls(off, None if b is None else (int(b[0]), int(b[1])),
                   [str(x) for x in body.get("s", [])], data)


class BoundsChangeError(RefusedError):
    """A units partition's state decided under other contribution bounds than the
    configuration's, restored without a confirmed migration (raised before anything of
    the record is forwarded). Bounds and partition numbers are public."""

    def __init__(self, partition: int, field_name: str, stored: int,
                 configured: int) -> None:
        self.field = f"unit.{field_name}"
        super().__init__(
            f"{self.field}: the bounding stage's state of units partition {partition} was "
            f"decided under {field_name} = {stored} but the configuration says "
            f"{configured}; the ledger's per-unit guarantee would not hold. Set it back "
            f"to {stored}, or start a new deployment (new app_id and new private-count "
            "and ledger topics), or confirm the migration ([unit] confirm_migration = "
            "true: the ledger then states the guarantee composed over every "
            "configuration, docs/privacy-unit.md).")


class BoundsWatch:
    """When the stage halts on restored state decided under other bounds: at a round of
    its timer, never at a units record. A record that meets such state is held (`held`)
    and the stage stops applying; each timer round (`round`) raises the held refusal, or
    reads the value of every assigned units partition not checked yet and checks its
    bounds. The first round after a partition's state is restored finds it whether or
    not a record came, so the halt's time depends on the assignment and the timer, not
    on an event (the halt's time would otherwise reveal one)."""

    def __init__(self, bounder: Bounder) -> None:
        self._bounder = bounder
        #: Assigned units partitions whose stored value has not been read yet.
        self._unchecked: set[int] = set()
        self._held: RefusedError | None = None

    def assigned(self, partitions: Iterable[int]) -> None:
        """The units partitions this worker now holds: each is read at the next round."""
        self._unchecked = set(partitions)

    def held(self, exc: RefusedError) -> None:
        """A record met refused state: the next round raises it."""
        self._held = exc

    def round(self, read: Callable[[int, str], bytes | None]) -> None:
        """One timer round: raises the refusal held or found (BoundsChangeError). A
        partition with no value yet is read again at the next round (its restore may
        still run; a value the stage writes itself carries the configured bounds)."""
        if self._held is not None:
            raise self._held
        for partition in sorted(self._unchecked):
            raw = read(partition, self._bounder.partition_key(partition))
            if raw is None:
                continue
            self._unchecked.discard(partition)
            self._bounder.check_stored(partition, raw)


def decide(st: UnitState, seq: int, counter: str, k: int, m: int) -> bool:
    """Keep the event at `seq` of this unit for `counter`? Updates `st`. An event at or
    before the unit's last applied seq is looked up, never re-decided (crash safety)."""
    if seq <= st.last_seq:
        return seq in st.kept.get(counter, ())
    st.last_seq = seq
    seqs = st.kept.get(counter)
    if seqs is None:
        if len(st.kept) >= m:
            return False
        st.kept[counter] = (seq,)
        return True
    if len(seqs) >= k:
        return False
    st.kept[counter] = (*seqs, seq)
    return True


# ---------------------------------------------------------------------- the stage


def _unchecked(ident: str, value: UnitState) -> None:
    """A unit value is checked through its partition's (`Bounder._check_partition`): a
    unit's value is loaded only after the partition value that guards it."""


class Bounder:
    """Applies units records to the per-unit state of one units partition, staged in a
    transaction (`transaction`) until a checkpoint writes its plan: every unit value
    changed, then the partition value (its last offset and bounds) that guards them (a
    kill between two writes leaves it older). A unit's decoded value lives in the
    transaction, staged, from its first new decision to the checkpoint (a look-up decodes
    it from the store); the partition values stay decoded between checkpoints (a few per
    worker). The transaction's state cache is the only one."""

    def __init__(self, settings: Settings) -> None:
        p = settings.unit_parameters()
        if p is None:
            raise ValueError('the bounding stage runs with privacy_unit = "user" only')
        self.settings = settings
        self.k = p.max_events_per_counter
        self.m = p.max_counters_per_unit
        self._beyond = DeadLetterEncoder(
            Rejection("contribution_bound_exceeded",
                      f"beyond max_events_per_counter={self.k} or "
                      f"max_counters_per_unit={self.m} for its unit"),
            settings.topics.input)
        #: counter -> its timeline partition (sha256 per counter once, not per event)
        self._tp: dict[str, int] = {}
        self._cache = StateCache()
        #: Kept events not yet handed over: timeline partition -> rows (counter, ts_ms,
        #: units, units partition, seq), in the order decided (`take_forwards`).
        self._pending: dict[int, list[tuple[Any, ...]]] = {}
        self.pending_events = 0
        # A unit's value stays decoded only while staged (cache 0): there is a value per
        # unit ever seen, and keeping them past the checkpoint would hold the table in
        # memory twice (decoded, and the bytes each equals).
        self._units: Slot[str, UnitState] = Slot(
            UNIT_PREFIX, 0, UnitState.from_bytes, UnitState.to_bytes, _unchecked, 0)
        self._partitions: Slot[int, UnitsPartitionState] = Slot(
            PARTITION_PREFIX, 1, UnitsPartitionState.from_bytes,
            UnitsPartitionState.to_bytes, self._check_partition, None)

    def _check_partition(self, partition: int, ps: UnitsPartitionState) -> None:
        """THE check of a restored units partition's bounds (BoundsChangeError); the
        worker refuses the same change at start from the ledger (lifetime.unit_claim)."""
        if ps.bounds is None or self.settings.unit_confirm_migration:
            return
        for name, stored, configured in zip(
                ("max_events_per_counter", "max_counters_per_unit"), ps.bounds,
                (self.k, self.m), strict=True):
            if stored != configured:
                raise BoundsChangeError(partition, name, stored, configured)

    def partition_key(self, partition: int) -> str:
        """The store key of a units partition's value."""
        return self._partitions.key(partition)

    def check_stored(self, partition: int, raw: bytes) -> None:
        """`_check_partition` on a stored units partition value (BoundsWatch). Bytes that
        are no such value are left to the load that meets them (UnitsFormatError there)."""
        try:
            ps = UnitsPartitionState.from_bytes(raw)
        except Exception:  # the load that meets it raises the typed error
            return
        self._check_partition(partition, ps)

    def transaction(self, store: StateStore) -> PartitionTransaction:
        """A transaction over one units partition's store, for `apply` to stage changes
        in until a checkpoint writes its plan (BoundCommit)."""
        return PartitionTransaction(store, (self._units, self._partitions), self._cache)

    def forget(self) -> None:
        """Drop every decoded value and every kept event not handed over (after a
        failure, or when the partitions change hands: their records are applied again)."""
        self._cache.clear()
        self._pending.clear()
        self.pending_events = 0

    def take_forwards(self, out: Output) -> None:
        """Hand every kept event not yet handed over to `out.timeline`: per timeline
        partition in order, as few records as the size limits allow. Events of several
        units records (and units partitions) share a record; per (timeline partition,
        units partition) their seqs still only grow, as the operator's duplicate filter
        needs."""
        for tp in sorted(self._pending):
            out.timeline.extend((tp, data) for data in fit_records(
                self._pending[tp], _encode_forward, MAX_BATCH_EVENTS, MAX_BATCH_BYTES))
        self._pending.clear()
        self.pending_events = 0

    def apply(self, txn: PartitionTransaction, partition: int,
              records: Sequence[tuple[int, bytes]], out: Output,
              forward: bool = True) -> None:
        """Apply units records (offset, bytes) of `partition`, in offset order. The kept
        events are handed to `out.timeline` if `forward`, else held for a later call
        (`take_forwards`): the operator's cost grows with the number of timeline records,
        so a caller with more units records waiting lets their forwards share records."""
        # Timeline rows ([counter, ts_ms, units, partition, seq]) by timeline partition.
        pending = self._pending
        k, m, parts = self.k, self.m, self.settings.partitions
        keep = decide
        fresh = _fresh
        dumps = orjson.dumps
        beyond = self._beyond
        tp_of = self._tp
        units = self._units
        ps = txn.load(self._partitions, partition)
        if ps is None:
            ps = UnitsPartitionState()
        # Written with the next staged value: the bounds these records are decided under.
        ps.bounds = (k, m)
        kept = dropped = duplicates = redelivered = 0
        for offset, raw in sorted(records, key=lambda r: r[0]):
            if offset <= ps.last_offset:
                # Applied, forwarded and acknowledged before the state was written.
                out.metrics["unit_records_skipped_duplicates"] += 1
                continue
            ps.last_offset = offset
            txn.stage(self._partitions, partition, ps)
            try:
                source, rows = decode_units(raw)
            except UnitsFormatError:
                # Ingest writes only well-formed records: a foreign one counts nothing.
                out.metrics["unit_records_malformed"] += 1
                continue
            labels: dict[int, str] = {}
            epoch = ps.source_index(source)
            base = offset << SEQ_BITS
            for i, row in enumerate(rows):
                h, counter, ts, weight, in_p, in_o = row
                seq = base | i
                loaded = txn.load(units, h)  # the staged value once staged
                st = UnitState() if loaded is None else loaded
                if seq <= st.last_seq:
                    # Applied to this unit before its stored value was written, which a
                    # checkpoint does only once the forwards and dead letters of what it
                    # reflects are acknowledged: a kept event is sent again (the
                    # operator's filter drops the copy), nothing else is.
                    if seq not in st.kept.get(counter, ()):
                        redelivered += 1
                        continue
                else:
                    if in_p >= 0 and not fresh(st, labels, epoch, in_p, in_o):
                        duplicates += 1
                        continue
                    if loaded is None or st.saved is not None:
                        # A new decision changes the value (a look-up does not): staged
                        # (which clears `saved`), written at the next checkpoint, once
                        # however many events touched it.
                        txn.stage(units, h, st)
                if keep(st, seq, counter, k, m):
                    tp = tp_of.get(counter)
                    if tp is None:
                        tp = tp_of[counter] = partition_for(counter, parts)
                    fw = pending.get(tp)
                    if fw is None:
                        fw = pending[tp] = []
                    fw.append((counter, ts, weight, partition, seq))
                    kept += 1
                else:
                    out.deadletters.append(beyond(dumps(row), in_p, in_o))
                    dropped += 1
            out.metrics["unit_records"] += 1
        self.pending_events += kept
        _count(out.metrics, unit_events_kept=kept, unit_duplicates_dropped=duplicates,
               unit_events_redelivered_dropped=redelivered,
               deadletter_contribution_bound_exceeded=dropped)
        if forward:
            self.take_forwards(out)


def _fresh(st: UnitState, labels: dict[int, str], epoch: int, in_p: int,
           in_o: int) -> bool:
    """Whether a new event of the unit, read at (input partition `in_p`, offset `in_o`)
    of the input whose identity has index `epoch` (UnitsPartitionState.sources), is not a
    re-sent copy: the unit's own filter, which only its own events move
    (UnitState.inputs). Records it if so. `labels` memoises the labels of one units
    record."""
    label = labels.get(in_p)
    if label is None:
        label = labels[in_p] = f"{epoch}/{in_p}"
    return st.inputs.admit(label, in_o)


def _encode_forward(rows: Sequence[tuple[Any, ...]]) -> bytes:
    return encode_batch_rows(rows, UNITS_SOURCE)


@contextmanager
def gc_deferred() -> Iterator[None]:
    """No cyclic garbage collection inside: at most one after. A units record allocates a
    few containers per event (its decoded rows, forwards, unit states that live until the
    checkpoint), so the collector would otherwise run every few hundred events and, as
    they survive, walk the older generations (the worker's whole heap) again and again;
    nothing a batch allocates is cyclic garbage."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _count(metrics: collections.defaultdict[str, int], **counts: int) -> None:
    """Add the non-zero counts (a metric appears once it happened)."""
    for name, n in counts.items():
        if n:
            metrics[name] += n


class BoundCommit(CheckpointLoop):
    """The commit protocol (commit.CheckpointLoop) for the bounding stage: `apply`
    applies in memory and sends the forwards at once; `checkpoint` awaits their
    acknowledgements, writes each changed unit value once, then the partition value (a
    partition's plan in one write batch where the store takes one), awaits the stores,
    and only then may the caller acknowledge the units records to the group.
    `crash_point` names: CRASH_POINTS."""

    crash_names = CRASH_POINTS

    def __init__(self, bounder: Bounder, stores: Stores, sink: Sink,
                 crash_point: Callable[[str], None] | None = None,
                 fence: Callable[[], None] | None = None) -> None:
        super().__init__(stores, sink, crash_point, fence)
        self.bounder = bounder

    def open_buffer(self, partition: int) -> PartitionTransaction:
        return self.bounder.transaction(self.stores.of(partition))

    async def apply(self, partition: int, records: Sequence[tuple[int, bytes]],
                    forward: bool = True) -> Output:
        """Apply `records` and send what they give; their kept events are held back
        unless `forward` or HOLD_EVENTS are held (sent by a later apply, `forward_held`
        or the next checkpoint, whichever comes first)."""
        out = Output()
        with self.applying(partition) as txn:
            with gc_deferred():
                self.bounder.apply(txn, partition, records, out, forward=forward)
                if self.bounder.pending_events >= HOLD_EVENTS:
                    self.bounder.take_forwards(out)
            self.send(out)
        return out

    def forward_held(self) -> Output:
        """Send the kept events held back (nothing if none)."""
        out = Output()
        try:
            self.bounder.take_forwards(out)
            self.send(out)
        except BaseException:
            self.forget()
            raise
        return out

    async def checkpoint(self) -> None:
        """commit.CheckpointLoop.checkpoint, the kept events held back sent first (its
        first step awaits their acknowledgements)."""
        if self.bounder.pending_events:
            self.forward_held()
        await super().checkpoint()

    async def write_state(self) -> None:
        with gc_deferred():  # a value per unit touched, encoded and written
            await super().write_state()

    def forget(self) -> None:
        """Fail every open transaction and drop every decoded value (the bounder's)."""
        super().forget()
        self.bounder.forget()

    async def commit(self, partition: int, records: Sequence[tuple[int, bytes]]) -> Output:
        out = await self.apply(partition, records)
        await self.checkpoint()
        return out


def kept_inputs(settings: Settings, units_log: Iterable[tuple[int, int, bytes]]
                ) -> set[tuple[int, int]]:
    """The kept set recomputed from the units topic alone: the (input partition, input
    offset) of every kept event, applying `units_log` ((partition, offset, bytes), any
    interleaving of partitions, each partition in offset order) to empty state. What
    replay compares the timeline's forwarded events with."""
    bounder = Bounder(settings)
    txns: dict[int, PartitionTransaction] = {}
    by_seq: dict[tuple[int, int], tuple[int, int]] = {}
    kept: set[tuple[int, int]] = set()
    for partition, offset, raw in units_log:
        txn = txns.get(partition)
        if txn is None:
            txn = txns[partition] = bounder.transaction(DictStore())
        out = Output()
        try:
            _, rows = decode_units(raw)
        except UnitsFormatError:
            continue
        for i, row in enumerate(rows):
            by_seq[(partition, offset << SEQ_BITS | i)] = (row[4], row[5])
        bounder.apply(txn, partition, [(offset, raw)], out)
        for _, data in out.timeline:
            batch = decode_timeline(data)
            assert isinstance(batch, TimelineBatch)
            for ev in batch.events:
                kept.add(by_seq[(ev.src_partition, ev.src_offset)])
    return kept


def forwarded_inputs(units_log: Iterable[tuple[int, int, bytes]],
                     timeline: Iterable[bytes | None]) -> list[tuple[int, int]]:
    """The input coordinates of every event the timeline records (bytes) carry from the
    bounding stage (source UNITS_SOURCE), in order, deduplicated as the operator's filter
    does (per units partition, strictly increasing seq). Events whose units record is not
    in `units_log` are returned as (-1, seq): nothing the stage could have kept."""
    # Copies share (units partition, seq): a set, since one units partition's events are
    # spread over several timeline partitions and their order across them is not kept.
    seq_to_input: dict[tuple[int, int], tuple[int, int]] = {}
    for p, off, raw in units_log:
        try:
            rows = decode_units(raw)[1]
        except UnitsFormatError:
            continue
        for i, row in enumerate(rows):
            seq_to_input[(p, off << SEQ_BITS | i)] = (row[4], row[5])
    sent: set[tuple[int, int]] = set()
    out: list[tuple[int, int]] = []
    for value in timeline:
        if not value:
            continue
        try:
            rec = decode_timeline(value)
        except TimelineFormatError:
            continue
        if not isinstance(rec, TimelineBatch) or rec.source != UNITS_SOURCE:
            continue
        for ev in rec.events:
            if (ev.src_partition, ev.src_offset) in sent:
                continue  # a re-sent copy (the operator's filter drops it)
            sent.add((ev.src_partition, ev.src_offset))
            out.append(seq_to_input.get((ev.src_partition, ev.src_offset),
                                        (-1, ev.src_offset)))
    return out


def check_kept_set(settings: Settings, units_log: Sequence[tuple[int, int, bytes]],
                   timeline: Iterable[bytes | None], committed: dict[int, int]
                   ) -> list[tuple[str, tuple[int, int]]]:
    """What replay reports about the bounding stage: ("unexpected", input) for a forwarded
    event the recomputed kept set does not hold (counted beyond a bound), and
    ("missing", input) for a kept event of a units record the stage committed (offset <
    committed[p]: its forwards were acknowledged before) that the timeline lacks."""
    kept = kept_inputs(settings, units_log)
    forwarded = forwarded_inputs(units_log, timeline)
    out: list[tuple[str, tuple[int, int]]] = []
    seen: set[tuple[int, int]] = set()
    for coord in forwarded:
        if coord not in kept or coord in seen:
            out.append(("unexpected", coord))
        seen.add(coord)
    due: set[tuple[int, int]] = set()
    for p, off, raw in units_log:
        if off < committed.get(p, 0):
            try:
                due.update((r[4], r[5]) for r in decode_units(raw)[1])
            except UnitsFormatError:
                continue
    out += [("missing", c) for c in sorted((kept & due) - seen)]
    return out
