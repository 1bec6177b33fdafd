"""The operator: the pure state machine between the timeline topic and the releases.

It applies timeline records (batches of events, "sealed through tick n" markers) in
offset order, one partition at a time, to a key-value store (`state.py`: a Faust table
online, a `DictStore` in replay and tests). It imports nothing from Kafka or Faust.
`commit.BatchCommit` applies a batch of records in a partition transaction
(`transaction.py`: the operator loads and stages its values there only), publishes,
then writes; `Operator.apply` takes that transaction and nothing else.

Time. Global tick n covers event time [n*tick_ms, (n+1)*tick_ms). A counter declared with
start S (a multiple of tick_ms) has start_tick = S // tick_ms, and its local tick is
t = n - start_tick + 1, so t = 1 is the tick that begins at S.

Events. An event joins its counter's pending arrivals at its tick, or at the earliest
open tick if that one is sealed (a late event). It never seals a tick and never emits a
public record: an event for a counter without state creates that state silently. So the
existence, order and timing of every release and ledger entry depend on markers and the
public configuration only (the rule of docs/privacy-notes.md: a public record's
existence, order and timing never depend on an event).

Markers. A marker through n touches only the counters filed in the due wheel at ticks
<= n (`state.py`): per counter, the first touch emits its ledger entry, then each tick
through n is sealed: its arrivals join the FIFO queue in timeline order, at most one value
leaves as x_t (else ⊥), the mechanism steps; runs of ⊥ ticks with nothing due are one
`Counter.skip`. A counter is then filed at its next due tick, the earliest of: the next
tick if its queue is non-empty, its earliest pending tick, the mechanism's next_due, its
next heartbeat. Counters are processed in name order, never in arrival order.
Releases: a "change" record when y changes, a "heartbeat" otherwise at every tick with
(t + phase) % heartbeat_ticks == 0 (`is_heartbeat_tick`). Public quantities only. A
counter a marker advanced by ⊥ ticks only (no input, heartbeats only) is not staged while
its stored value is at most DEFERRED_HEARTBEATS heartbeat intervals behind (`_keep`); a
full checkpoint stages it (`stage_deferred`; docs/state.md). A counter that took no input
in the last heartbeat interval and has nothing to do before its next heartbeat is idle
(`_idle`): beyond IDLE_DECODED decoded counters it does not stay decoded
(`PartitionTransaction.release`), and a value decoded again is re-sealed to its deferred
progress (`_load_counter`). A released idle counter's deferred entry carries what its
heartbeats need (`IdleEntry`): a marker that only seals quiet ticks of it publishes them
from the entry, and writes it at the deferral bound from its stored bytes
(`_beat_idle`), without decoding it; a full checkpoint writes it from those bytes too
(`_write_idle`). A counter restored from the store (a restore, a takeover, a restart)
gets its entry read off its stored value where that value is idle (`_stored_idle`).

Identity. What a counter runs under is its `provenance.Provenance`'s answer: for the
worker (`ConfiguredProvenance`, the default) a new counter's mechanism is keyed by
`identity.noise_identity` (app id, topics, configuration fingerprint, key fingerprint: the
one definition) and its name; replay answers from the ledger. Its ledger entry names the
key (`key_id`) and this creation (`creation`: `identity.creation_tag`, from markers
only). Given what the ledger announced (`announced`), the operator refuses to make a
counter a second time under another creation (AnnouncedCounterError): its ticks were
published already. The worker reads the ledger on before it publishes a batch that
creates counters and checks the batch against it (`check_ledger`): what the ledger says
is kept apart from the operator's own creations. A counter restored from state keeps
its mechanism, epsilon and delta; when they differ from the settings the operator
refuses (ParameterChangeError, `ConfiguredProvenance.check_parameters`, the one place)
unless on_parameter_change = "keep": at start for every counter the ledger announced
(`app.ledger_at_start`), else at the marker that touches it, never at an event (the
halt's time would reveal the event).
The state is bound to the noise key: the partition and counter values carry the key's
public fingerprint, and a key that is not the stored one is refused
(KeyMismatchError, `_check_key`, the one place) before anything of the record is
published.

Ledger. A counter's ledger entries explain every fingerprint its releases carry: the
"created" entry at the marker that creates it, and a "reconfigured" entry whenever the
configuration fingerprint changed under its state, written just before its first release
under the new fingerprint (`_release`): a function of the public release stream and the
public configuration, like every public record. Such an entry names the parameters the
counter continues under, always its stored ones (`parameters`: "configured" when they
equal the configuration's, "stored" when they differ under on_parameter_change = "keep").

Idempotency. Each counter records the last timeline offset applied to it, the partition
the offset of its last marker: a record is applied to a counter at most once, so
at-least-once redelivery neither loses nor double-counts, and re-execution reproduces the
same noise (positions are in the mechanism state). Ingest re-sends events after a crash:
each counter's duplicate filter (input partition -> highest input offset of its events
applied, in the counter's own value) drops an event whose input offset is at or below
it. Per counter, so that no event is ever dropped because of another counter's (a zombie
ingest may write older offsets late), and a counter's filter is written with it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from typing import Final, Literal

from processor.core.api import Counter
from processor.core.errors import StateFormatError
from processor.core.rng import NoiseKey
from processor.errors import RefusedError
from processor.stream.model.clock import TOLERANCE_MS
from processor.stream.model.config import Settings
from processor.stream.model.families import Admission, family_of
from processor.stream.model.identity import calibration_of, creation_tag, key_fingerprint
from processor.stream.model.lifetime import LifetimeError, UnitClaim
from processor.stream.model.outputs import Output
from processor.stream.model.provenance import CalibratedRegistry, ConfiguredProvenance, Provenance
from processor.stream.model.records import (
    EventRows,
    LedgerEntry,
    Release,
    ReleaseTemplate,
    TimelineFormatError,
    TimelineMarker,
    decode_timeline_rows,
    partition_for,
    source_label,
    unit_ledger_fields,
)
from processor.stream.model.state import (
    COUNTER_PREFIX,
    PARTITION_PREFIX,
    CounterFactory,
    CounterState,
    DueWheel,
    DuplicateFilter,
    PartitionState,
    StateStore,
    advance_counter_value,
    counter_filed_due,
    counter_key,
    partition_key,
    quiet_counter,
    stored_offset,
)
from processor.stream.model.transaction import PartitionTransaction, Slot, StateCache

#: A marker that seals more ticks of a counter than this at once (a start in the past, a
#: long outage) publishes heartbeats for its last max(heartbeat_ticks, this) ticks only;
#: every change is published (docs/downstream.md, catch-up).
CATCHUP_HEARTBEAT_TICKS: Final = 1000

#: A counter a marker advanced by ⊥ ticks only (no input taken, nothing published but
#: heartbeats) is not written at a periodic checkpoint while its stored value is at most
#: this many heartbeat intervals (and DEFERRED_TICKS_MAX ticks) behind: restoring that
#: value and sealing the same ticks again gives the same state and the same records. Each
#: such write of an idle counter costs a read, two JSON round trips and a changelog record
#: (about 30 us of the operator's CPU, against 4-8 us for a heartbeat from its idle
#: entry): 64 intervals write an idle counter once per 66 heartbeats, where 16 wrote it
#: once per 18 (bench/README.md, "The deferral bound").
DEFERRED_HEARTBEATS: Final = 64

#: The deferral bound in ticks, whatever the heartbeat interval (heartbeats of a million
#: ticks turn them off): how far a restore re-seals a counter at most. What the re-seal
#: sends does not depend on how far it goes: a marker sends no heartbeat at or before the
#: partition's frontier it starts from (`heartbeat_floor`), and the catch-up floor counts
#: from the marker's tick, not from the stored value's.
DEFERRED_TICKS_MAX: Final = 4096

#: The store key an error names for a counter that is not declared: declared names are
#: public, an undeclared one is private input until announced.
UNDECLARED_COUNTER_KEY: Final = counter_key("(an undeclared counter)")

#: Default size of the decoded counter-state cache: above 10^4 counters per worker.
DEFAULT_CACHE_SIZE: Final = 1 << 18

#: Idle counters stay decoded while the cache holds at most this many counters (about
#: 7 KB each: about 115 MB at most); beyond it an idle counter is released: its heartbeats
#: come from its idle entry (`_beat_idle`, cheaper than a decoded counter's), its memory
#: is bytes rather than kilobytes, and its next event decodes it again (docs/state.md).
IDLE_DECODED: Final = 1 << 14

#: The bytes of stored counter values a marker that builds its partition's due wheel
#: keeps from that scan for the counters it takes at once (`_wheel`, `_stored_raw`): a
#: restore's first marker reads them there instead of one point read each (at most about
#: 32 MiB, some 30,000 values, dropped at the marker's end; beyond it the rest are read
#: from the store).
SCANNED_BYTES: Final = 1 << 25

#: The stored values of idle counters a marker writes at the deferral bound that it reads
#: at once before it seals them (`_read_bound_writes`: one multi-get in key order, about
#: 1 KB each, at most some 32 MiB); beyond it the rest are read one at a time.
BOUND_READS: Final = 1 << 15

#: The heartbeat templates an `IdleShape` keeps (one per local tick its counters beat at;
#: with heartbeats spread, up to heartbeat_ticks of them are in use).
HEARTBEAT_TEMPLATES: Final = 4096

#: The metric names the operator's Output reports (aggregates only, never per counter).
METRICS: Final = (
    "events_applied",
    "markers_applied",
    "late_events",
    "skipped_duplicates",
    "duplicates_dropped",
    "malformed_records",
    "undeclared_skipped",
    "before_start_skipped",
    "misrouted_skipped",
    "counters_touched",
    "events_queued",
    "events_dequeued",
    "markers_refused",
)


#: The value of most idle counters: one float for all of their entries.
_ZERO: Final = 0.0


def _is_zero(y: float) -> bool:
    """y is +0.0 (the entry may then hold _ZERO: the same float, sign included)."""
    return y == 0.0 and math.copysign(1.0, y) > 0


def _waiting(cs: CounterState) -> bool:
    """Whether `cs` is a key of an open family not admitted yet whose first tick is sealed
    (the gate waits for its next change of y)."""
    adm = cs.admission
    return adm is not None and adm.admitted is None and adm.first is not None


class IdleShape:
    """What the idle entries of counters that run with the same parameters under the same
    configuration share: the release fields, the start tick, the fingerprint their last
    ledger entry named, and one decoded mechanism of those parameters whose
    `error_bound_at(t)` gives every such counter's bound at t (a function of the
    parameters and t only: the Counter contract). `checked`: the provenance's parameter
    check passed for these parameters (it decides by the parameters alone; the name only
    goes into its error). `templates`: the heartbeats' `ReleaseTemplate` at each
    local tick (`Operator._heartbeat_template`)."""

    __slots__ = ("bound_key", "checked", "ledger_fingerprint", "rep", "start_tick",
                 "templates")

    def __init__(self, rep: Counter, start_tick: int, ledger_fingerprint: str) -> None:
        self.rep = rep
        self.bound_key = rep.bound_key()
        self.start_tick = start_tick
        self.ledger_fingerprint = ledger_fingerprint
        self.checked = False
        self.templates: dict[int, ReleaseTemplate] = {}


#: `Operator._deferred`'s entry of a counter: (the tick its stored value is filed under,
#: the tick it is sealed through, the offset it reflects), and for a counter released as
#: idle (`IdleEntry`) also its next heartbeat (local tick), its value y, the global tick
#: its mechanism is next due at (None: never), its `IdleShape`'s index and its heartbeat
#: phase (`heartbeat_phase`).
Deferred = tuple[int, int, int] | tuple[int, int, int, int, float, int | None, int, int]
IdleEntry = tuple[int, int, int, int, float, int | None, int, int]


class AnnouncedCounterError(RefusedError):
    """A counter whose ledger entry was already published but whose state is gone: making
    it again would publish a second, differently noised value for ticks already released.

    Raised by the operator before anything of the record is published. The counter's name
    is public (it is on the ledger), so the message names it, with the remedy."""

    def __init__(self, counter: str) -> None:
        self.counter = counter
        super().__init__(
            f"counter {counter!r} was already announced on the ledger topic, but its state "
            "is gone (or belongs to another configuration or key): re-creating it would "
            "republish its ticks with new values. Restore the state from the changelog "
            "(with the configuration and key it was announced under), or start a new "
            "deployment with a new app_id and new private-count and ledger topics.")


class KeyMismatchError(RefusedError):
    """Stored state made under another noise key than the configured one: its counters'
    noise would continue under a key unrelated to the one it began with (the stream could
    no longer be audited, and fresh noise would mix with old). Raised before anything of
    the record is published. Key fingerprints are public (they are on the ledger)."""

    def __init__(self, store_key: str, stored: str, given: str) -> None:
        self.store_key = store_key
        self.stored = stored
        self.given = given
        super().__init__(
            f"noise key: the state under key {store_key!r} was made with the noise key of "
            f"fingerprint {stored}, but the configured key's fingerprint is {given}. "
            f"Remedy: start the worker with the key file the state was made with "
            f"(fingerprint {stored}); to use the new key, start a new deployment (new "
            "app_id and new private-count and ledger topics). A key is never changed "
            "under existing state.")


def declared_homes(settings: Settings) -> dict[str, int]:
    """The timeline partition of each declared counter (`records.partition_for`)."""
    P = settings.partitions
    return {c: partition_for(c, P) for c in settings.counters}


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


def heartbeat_floor(n: int, start_tick: int, h: int, published: int | None) -> int:
    """The local tick at and before which a marker through global tick n sends no
    heartbeat of a counter starting at `start_tick`; `published`: the partition's
    frontier before the marker when the counter was announced already.

    Catch-up: heartbeats repeat what the changes already say, so a marker that seals a
    long past at once publishes those of its last max(h, CATCHUP_HEARTBEAT_TICKS) ticks
    only. And nothing at or before `published`: those heartbeats were published already.
    A counter re-seals such ticks when its stored value stayed behind (⊥-only progress,
    `Operator._keep`) and was decoded again (a restart, a takeover, an eviction); sending
    them again would make what a restart re-sends depend on which counters had input
    (docs/state.md)."""
    floor = n - start_tick + 1 - max(h, CATCHUP_HEARTBEAT_TICKS)
    if published is not None:
        floor = max(floor, published - start_tick + 1)
    return floor


def is_heartbeat_tick(settings: Settings, counter: str, t: int) -> bool:
    """True when local tick t of `counter` carries a heartbeat (unless y changed there)."""
    return (t + heartbeat_phase(settings, counter)) % settings.heartbeat_ticks == 0


class Operator:
    """Applies timeline records to the state in a store; see the module docstring."""

    def __init__(self, settings: Settings, key: NoiseKey, *,
                 factory: CounterFactory | None = None,
                 cache_size: int = DEFAULT_CACHE_SIZE, idle_decoded: int = IDLE_DECODED,
                 defer_heartbeats: int = DEFERRED_HEARTBEATS,
                 announced: Mapping[str, Collection[str]] | None = None,
                 provenance: Provenance | None = None,
                 unit_claim: UnitClaim | None = None,
                 homes: Mapping[str, int] | None = None) -> None:
        """`announced`: what the ledger topic says was announced (counter -> creation tags
        of its entries, `records.announced_in`). Given (the worker), a counter with a
        ledger entry is made again only as the re-execution of the very creation the entry
        records; anything else raises AnnouncedCounterError. None (replay, tests): no
        ledger to check against. `factory` restores counters from state (default the core
        registry); `provenance` says what a counter runs under (default the configuration,
        with mechanisms of `factory`; replay's comes from the ledger). `unit_claim`: the
        per-unit guarantee the ledger entries state (user mode; lifetime.unit_claim of
        the ledger read at start), by default the configuration's own derivation: the
        default provenance's (`ConfiguredProvenance`). `cache_size`: how many counters
        stay decoded at most (least recently used out); `idle_decoded`: idle counters
        stay decoded while the cache holds at most this many (`_keep`);
        `defer_heartbeats`: the deferral bound in heartbeat intervals (`_defer`; what it
        changes is when idle counters are written, never a record published). `homes`: the
        timeline partition of every declared counter and of nothing else
        (`declared_homes`), if the caller has it (replay: one map for the operators of
        all partitions)."""
        self.settings = settings
        self.key = key
        self.key_id = key_fingerprint(key)
        # The caller's collections of tags as they are (frozen: a set copied per counter
        # costs about 200 bytes a counter, and the worker keeps the ledger's). What the
        # ledger says only: the creations this operator made itself are in `_made`, so
        # that `check_ledger` compares a creation with the ledger alone.
        self._announced: dict[str, Collection[str]] | None = (
            None if announced is None else dict(announced))
        self._made: dict[str, str] = {}
        self.factory: CounterFactory = (
            factory if factory is not None else CalibratedRegistry(settings.calibration))
        self.provenance: Provenance = (
            provenance if provenance is not None
            else ConfiguredProvenance(settings, key, self.factory, unit_claim))
        self.fingerprint = settings.fingerprint()
        self._tick_ms = settings.tick_ms
        # Equal start ticks share one int (most counters of a deployment start together:
        # 32 bytes a counter otherwise).
        shared: dict[int, int] = {}
        self._start_ticks = {c: shared.setdefault(s // settings.tick_ms, s // settings.tick_ms)
                             for c, s in settings.counters.items()}
        self._home = declared_homes(settings) if homes is None else homes
        # Open families: each key's counter starts at its family's start tick; its gate's
        # delta0 (families.py, docs/open-keys.md).
        self._family_starts = {f: fam.start_ms // settings.tick_ms
                               for f, fam in settings.families.items()}
        self._delta0 = {f: settings.gate_delta0(f) for f in settings.families}
        self._phases: dict[str, int] = {}
        # What the operator stores (transaction.Slot): counter values, then the partition
        # value they are guarded by (write plan ranks); every partition value and up to
        # `cache_size` counter values stay decoded between checkpoints (`_cache`), idle
        # counters never (`_keep` releases them).
        self._cache_size = cache_size
        self._idle_decoded = idle_decoded
        self._cache = StateCache()
        self._counters: Slot[str, CounterState] = Slot(
            COUNTER_PREFIX, 0, self._decode_counter, CounterState.to_bytes,
            self._check_counter, cache_size)
        self._cached_counters = self._cache.section(self._counters)
        self._partitions: Slot[int, PartitionState] = Slot(
            PARTITION_PREFIX, 1, PartitionState.from_bytes, PartitionState.to_bytes,
            self._check_partition, None)
        # The due wheel of each loaded partition (state.DueWheel: in memory, rebuilt from
        # the stored counters when a partition is first touched after `forget`).
        self._wheels: dict[int, DueWheel] = {}
        # The stored bytes the scan that built a due wheel read of the counters the
        # marker that built it takes (`_wheel`, `_stored_raw`), and those the marker
        # writes at the deferral bound, read at once (`_read_bound_writes`): for that
        # marker only.
        self._scanned: dict[str, bytes] = {}
        # error_bound(beta) is a function of the mechanism's parameters and t only (the
        # Counter contract: public quantities), so a sweep over many counters at one tick
        # computes it once.
        self._bounds: dict[tuple[tuple[object, ...], float, int], float] = {}
        # The timeline offset of the record being applied (a staged partition value
        # reflects it: PartitionState.applied).
        self._offset = -1
        # Per partition: counters advanced by ⊥ ticks only since their stored value, each
        # with (the tick its stored value is filed under, the tick it is sealed through,
        # the offset it reflects): what `_load_counter` re-seals a value decoded again
        # (released, evicted) to (`_keep`, `stage_deferred`).
        # A counter released as idle (`_keep`) carries in its entry, after those three,
        # what its next heartbeats need without decoding it (`IdleEntry`, `_beat_idle`).
        self._deferred: dict[int, dict[str, Deferred]] = {}
        # The shared part of idle entries: one per (parameters, configuration, start),
        # named in an entry by its index in `_shape_list` (an entry of ints, floats and
        # None only is a tuple the cyclic garbage collector stops tracking: a million
        # of them are not walked at every full collection).
        self._shapes: dict[tuple[object, ...], int] = {}
        self._shape_list: list[IdleShape] = []
        # Equal ticks of idle entries share one int (`_shared`): counters with the same
        # heartbeat phase hold the same ticks (and SimECC's checkpoints fall on few),
        # about 90 bytes a counter otherwise.
        self._ints: dict[int, int] = {}
        # The mechanism classes of the counters decoded so far: whose `idle_view` reads
        # a stored value that no idle entry stands for yet (`_stored_idle`).
        self._views: dict[type[Counter], None] = {}
        self._defer_ticks = min(defer_heartbeats * settings.heartbeat_ticks,
                                DEFERRED_TICKS_MAX)

    # -- public entry points

    def apply(self, txn: PartitionTransaction, partition: int, offset: int,
              record: bytes, out: Output | None = None,
              stamp_ms: int | None = None) -> Output:
        """Apply the timeline record at (`partition`, `offset`) in the partition's
        transaction (`transaction`), where the changes stay staged for the commit, and add
        what it produced to `out` (a new Output if None). Never raises on a well-formed
        record; a malformed one is counted and changes nothing.

        `stamp_ms` is the record's Kafka timestamp (the brokers' log-append time on the
        timeline topic): a marker that seals a tick whose end plus the lateness is later
        than it, beyond the clocks' tolerance, is refused (counted in markers_refused,
        nothing changes): no legitimate worker writes one (clock.next_marker), so it
        came from a clock far ahead or from someone else with write access."""
        if out is None:
            out = Output()
        try:
            rec = decode_timeline_rows(record)
        except TimelineFormatError:
            out.metrics["malformed_records"] += 1
            return out
        self._offset = offset
        try:
            if isinstance(rec, TimelineMarker):
                if stamp_ms is not None and self._ahead_of(rec.sealed_through, stamp_ms):
                    out.metrics["markers_refused"] += 1
                    return out
                self._apply_marker(txn, partition, offset, rec.sealed_through, out)
            else:
                self._apply_events(txn, partition, offset, rec, out)
        except BaseException:
            # Changed objects carry saved=None, so the cache cannot serve them; dropping
            # the cache as well keeps this path obviously safe.
            self.forget()
            raise
        return out

    def transaction(self, store: StateStore) -> PartitionTransaction:
        """A transaction over one partition's store, for `apply` to stage changes in
        until a checkpoint writes its plan (commit.BatchCommit)."""
        return PartitionTransaction(store, (self._counters, self._partitions), self._cache)

    def due_wheel(self, partition: int) -> DueWheel | None:
        """The partition's due wheel as loaded now (None: not loaded): for tests and
        metrics, never to change."""
        return self._wheels.get(partition)

    def _ahead_of(self, n: int, stamp_ms: int) -> bool:
        """Whether sealing through tick n was not yet allowed at `stamp_ms`."""
        s = self.settings
        return (n + 1) * s.tick_ms + s.lateness_ms > stamp_ms + TOLERANCE_MS

    def forget(self) -> None:
        """Drop every decoded state (after a failed batch, or to measure cold starts)."""
        self._cache.clear()
        self._wheels.clear()
        self._scanned.clear()
        self._deferred.clear()

    def deferred_partitions(self) -> list[int]:
        """The partitions with counters whose ⊥-only progress is not staged yet."""
        return sorted(p for p, names in self._deferred.items() if names)

    def stage_deferred(self, txn: PartitionTransaction, partition: int) -> None:
        """Stage every counter of `partition` whose ⊥-only progress was deferred (a full
        checkpoint: a clean stop, a revocation). One released as idle is written from its
        stored bytes where that is exact (`_write_idle`), else decoded, sealed and
        released again at once: a million of them never stay decoded together."""
        deferred = self._deferred.get(partition, {})
        for name in list(deferred):
            entry = deferred[name]
            if len(entry) > 3 and self._write_idle(txn, name, entry):
                continue
            cs = self._load_counter(txn, partition, name)
            if cs is not None:
                self._stage_counter(txn, partition, name, cs)
                if len(entry) > 3:  # released as idle before: released again
                    txn.release(self._counters, name)
        self._deferred.pop(partition, None)

    # -- loading and staging

    def _partition(self, txn: PartitionTransaction, partition: int) -> PartitionState:
        ps = txn.load(self._partitions, partition)
        if ps is None:
            ps = PartitionState()
            ps.key_id = self.key_id
            ps.privacy_unit = self.settings.privacy_unit
        if ps.config_fingerprint != self.fingerprint:
            # First record of this partition, or a new configuration.
            ps.config_fingerprint = self.fingerprint
            self._stage_partition(txn, partition, ps)
        return ps

    def _check_mode(self, txn: PartitionTransaction, partition: int,
                    ps: PartitionState) -> None:
        """The privacy_unit the partition's counters counted under must be the configured
        one (lifetime.py: no migration covers a change; the start refuses it from the
        ledger, this from state the ledger does not reflect yet). Checked at markers, never
        at an event; a value that did not record it takes the configured one."""
        mode = self.settings.privacy_unit
        if ps.privacy_unit == mode:
            return
        if ps.privacy_unit is not None:
            raise LifetimeError("privacy_unit", ps.privacy_unit, mode, migratable=False,
                                source=f"the state of timeline partition {partition}")
        ps.privacy_unit = mode
        self._stage_partition(txn, partition, ps)

    def _stage_partition(self, txn: PartitionTransaction, partition: int,
                         ps: PartitionState) -> None:
        ps.applied = max(ps.applied, self._offset)
        txn.stage(self._partitions, partition, ps)

    def _decode_counter(self, raw: bytes) -> CounterState:
        cs = CounterState.from_bytes(raw, self.factory, self.key)
        self._views[type(cs.mechanism)] = None
        return cs

    def _check_partition(self, partition: int, ps: PartitionState) -> None:
        self._check_key(partition_key(partition), ps.key_id)

    def _check_counter(self, name: str, cs: CounterState) -> None:
        # Declared names are public; an undeclared one is input until announced. The
        # parameters are checked by the marker that touches the counter (`_apply_marker`),
        # never here: a counter is also loaded by its events, and a halt there would time
        # an event.
        self._check_key(counter_key(name) if name in self._start_ticks
                        else UNDECLARED_COUNTER_KEY, cs.key_id)

    def _check_key(self, store_key: str, stored: str | None) -> None:
        """THE check of the noise key against decoded state (partition and counter values
        enter the operator only through here): the fingerprint stored with the state must
        be the configured key's. Raises KeyMismatchError naming both."""
        if stored != self.key_id:
            raise KeyMismatchError(store_key, str(stored), self.key_id)


    def _new_counter(self, name: str, start_tick: int) -> CounterState:
        """A fresh counter state (not announced: its ledger entry waits for a marker)."""
        s = self.settings
        mech = self.provenance.make_mechanism(name)
        return CounterState(mech, start_tick,
                            next_heartbeat(0, self._phase(name), s.heartbeat_ticks),
                            key_id=self.key_id)

    def _phase(self, name: str) -> int:
        """`heartbeat_phase` of counter `name`, kept while it is decoded (bounded)."""
        phase = self._phases.get(name)
        if phase is None:
            if len(self._phases) > 4 * max(self._cache_size, 1024):
                self._phases.clear()
            phase = self._phases[name] = heartbeat_phase(self.settings, name)
        return phase

    def _idle_phase(self, name: str) -> int:
        """`heartbeat_phase` of counter `name` for its idle entry, which keeps it from now
        on (`_phases` keeps the decoded counters'): `_beat_idle` needs it at every
        heartbeat, and at a million counters a lookup in a map of all their names is a
        few cache misses. A counter decoded again gets it again from `_phase`."""
        phase = self._phases.pop(name, None)
        return self._shared(heartbeat_phase(self.settings, name) if phase is None
                            else phase)

    # -- the due wheel

    def _wheel(self, txn: PartitionTransaction, partition: int,
               keep_through: int | None = None) -> DueWheel:
        """The partition's due wheel; built at the first touch after `forget`: every
        counter of the partition with state at its `filed_due`, every declared one
        without state at its start tick (the marker through it creates it). Built for
        a marker through `keep_through`, the stored bytes the scan read of the counters
        filed at or before it (not staged) are kept for that marker (`_stored_raw`), up
        to `SCANNED_BYTES`."""
        wheel = self._wheels.get(partition)
        if wheel is not None:
            return wheel
        wheel = self._wheels[partition] = DueWheel()
        P = self.settings.partitions
        home = self._home
        have: set[str] = set()
        kept = self._scanned
        room = SCANNED_BYTES if keep_through is not None else 0
        for name, got in txn.scan(self._counters):
            if home.get(name, -1) != partition and (
                    name in home or partition_for(name, P) != partition):
                continue
            have.add(name)
            try:
                due = (got.filed_due if isinstance(got, CounterState)
                       else counter_filed_due(got))
            except StateFormatError as exc:
                exc.key = counter_key(name) if name in home else UNDECLARED_COUNTER_KEY
                raise
            if due is not None:
                wheel.file(name, due)
                if (room > 0 and keep_through is not None and due <= keep_through
                        and type(got) is bytes and not txn.is_staged(self._counters, name)):
                    kept[name] = got
                    room -= len(got)
        for name, start in self._start_ticks.items():
            if home[name] == partition and name not in have:
                wheel.file(name, start)
        return wheel

    def due_tick(self, cs: CounterState) -> int | None:
        """A global tick at or before the next one at which `cs` has anything to do;
        None: nothing until its next input (a waiting key filed nowhere)."""
        start = cs.start_tick
        due = start + cs.next_heartbeat - 1
        adm = cs.admission
        if adm is not None and adm.admitted is None and adm.first is None and cs.pending:
            # A key whose first event's tick is not sealed yet: nothing of it can be
            # published before that tick (its admission is at or after it), so the ticks
            # before it are sealed by the marker that seals its first event, at once
            # (`_seal_key`), not one marker at a time.
            return min(cs.pending)
        if adm is not None and adm.admitted is None and adm.first is not None and not cs.queue:
            # A key not admitted publishes no heartbeat: only its next input or a change
            # of y (at next_due: the Counter contract) can admit it.
            nd = self._next_due(cs)
            waits = [min(cs.pending)] if cs.pending else []
            if nd is not None:
                waits.append(start + nd - 1)
            # Never due without input: filed nowhere, in either stored form (its next
            # input files it, and its seal skips the ⊥ ticks since its stored tick
            # exactly: docs/open-keys.md, "Filed nowhere").
            return min(waits) if waits else None
        if cs.queue or not cs.announced:
            due = cs.frontier + 1
        elif cs.pending:
            due = min(due, min(cs.pending))
        if due > cs.frontier + 1:
            nd = self._next_due(cs)
            if nd is not None:
                due = min(due, start + nd - 1)
        return due

    @staticmethod
    def _next_due(cs: CounterState) -> int | None:
        """cs.mechanism.next_due(), remembered until the mechanism takes an input (a skip
        short of next_due changes nothing but t: the Counter contract)."""
        if not cs.next_due_known:
            cs.next_due = cs.mechanism.next_due()
            cs.next_due_known = True
        return cs.next_due

    # -- records

    def _apply_events(self, txn: PartitionTransaction, partition: int, offset: int,
                      rows: EventRows, out: Output) -> None:
        ps = self._partition(txn, partition)
        m = out.metrics
        source = rows.source
        progress = ps.input_offsets
        progress_changed = False
        tick_ms = self._tick_ms
        start_ticks = self._start_ticks
        # Counters this record is applied to, and those it was applied to before a crash.
        applying: dict[str, CounterState] = {}
        done: set[str] = set()
        applied = late = 0
        # Rows, not Event objects: [counter, ts_ms, units, src_partition, src_offset].
        labels: dict[int, str] = {}
        for name, ts_ms, units, src, src_offset in rows:
            label = ""
            if src >= 0:
                label = labels.get(src) or labels.setdefault(src, source_label(source, src))
                # Every row of the record (a function of the log, whatever a crash left).
                if src_offset > progress.get(label, -1):
                    progress[label] = src_offset
                    progress_changed = True
            n_event = ts_ms // tick_ms
            cs = applying.get(name)
            if cs is None:
                cs = self._first_row(txn, partition, offset, name, n_event, ps, done, m)
                if cs is None:
                    continue
                applying[name] = cs
            if src >= 0:
                # The counter's own filter: only its own events make one of its events a
                # duplicate, so a zombie ingest's out-of-order write never drops an event
                # because of another counter's.
                seen = cs.inputs
                assert seen is not None  # `_first_row` starts a value written before it
                if source and label not in seen:
                    seen.adopt(str(src), label)
                if not seen.admit(label, src_offset):
                    m["duplicates_dropped"] += 1
                    continue
            if n_event < cs.start_tick and (name in start_ticks or cs.admission is not None):
                m["before_start_skipped"] += 1
                continue
            open_tick = (cs.frontier if cs.frontier > ps.frontier else ps.frontier) + 1
            if n_event < open_tick:
                late += 1
                n_event = open_tick
            arrivals = cs.pending.get(n_event)
            if arrivals is None:
                cs.pending[n_event] = [units]
            else:
                arrivals.append(units)
            applied += 1
        m["events_applied"] += applied
        m["events_queued"] += applied
        m["late_events"] += late
        m["counters_touched"] += len(applying)
        if applying:
            self._file_applied(txn, partition, applying)
        if progress_changed:
            self._stage_partition(txn, partition, ps)

    def _first_row(self, txn: PartitionTransaction, partition: int, offset: int, name: str,
                   n_event: int, ps: PartitionState, done: set[str],
                   m: dict[str, int]) -> CounterState | None:
        """The state the event record at `offset` is applied to at its first row of
        `name` (made if the counter has none, staged), or None when the record skips the
        counter (counted in `m`; `done`: applied to it before a crash)."""
        if name in done:
            m["skipped_duplicates"] += 1
            return None
        home = self._home
        if home.get(name, partition) != partition or (
                name not in home and partition_for(name, self.settings.partitions)
                != partition):
            m["misrouted_skipped"] += 1
            return None
        cs = self._load_counter(txn, partition, name)
        if cs is None:
            start = self._start_ticks.get(name)
            family = None if start is not None or not self._family_starts else family_of(name)
            if family is not None:
                start = self._family_starts.get(family)
            if start is None:
                if family is not None or not self.settings.allow_undeclared:
                    m["undeclared_skipped"] += 1
                    return None
                # An undeclared counter starts at its first event's tick (or the
                # first open tick): the documented cost of allow_undeclared.
                start = max(n_event, ps.frontier + 1)
            elif n_event < start:
                m["before_start_skipped"] += 1
                return None
            cs = self._new_counter(name, start)
            if family is not None:
                # A key's counter, as if declared at its family's start; published only
                # once admitted (`_seal_key`).
                cs.admission = Admission(self._delta0[family])
                # Its inputs from the start: stored as those while it waits (state.py).
                cs.trail = []
        elif cs.last_offset >= offset:
            done.add(name)
            m["skipped_duplicates"] += 1
            return None
        if cs.inputs is None:
            # Written while the filter was shared by the partition's counters: its own
            # starts where that one stood (what it had applied is at or below it).
            cs.inputs = DuplicateFilter(ps.legacy_inputs)
        cs.last_offset = offset
        self._stage_counter(txn, partition, name, cs)
        return cs

    def _file_applied(self, txn: PartitionTransaction, partition: int,
                      applying: Mapping[str, CounterState]) -> None:
        """File the counters an event record was applied to in the due wheel."""
        wheel = self._wheel(txn, partition)
        for name, cs in applying.items():
            if cs.filed_due is None:
                got = self.due_tick(cs)
                if got is None:  # its events were all duplicates: still filed nowhere
                    continue
                due = got
            else:
                # Events only add pending arrivals, so the new due tick is
                # min(old due, earliest pending), and the counter is already filed
                # at or before its old due: it needs filing only if its earliest
                # pending tick is earlier still (no mechanism.next_due() call).
                due = min(cs.pending) if cs.pending else cs.filed_due
            if cs.filed_due is None or due < cs.filed_due:
                wheel.file(name, due)
                cs.filed_due = due

    def _apply_marker(self, txn: PartitionTransaction, partition: int, offset: int, n: int,
                      out: Output) -> None:
        ps = self._partition(txn, partition)
        self._check_mode(txn, partition, ps)
        m = out.metrics
        if offset <= ps.marker_offset:
            m["skipped_duplicates"] += 1
            return
        if n <= ps.frontier:
            # Markers are idempotent: an already sealed tick changes nothing (not even
            # the stored offset, which only guards against redelivery).
            m["markers_applied"] += 1
            out.sealed_through = max(n, out.sealed_through or n)
            return
        wheel = self._wheel(txn, partition, n)
        names = sorted(wheel.take_through(n))
        # Each name's deferred entry, looked up once for the bound reads and the loop (at
        # a million counters a lookup is a few cache misses). Valid for the whole loop:
        # the loop changes the entry of the name it is at only, and names are distinct.
        deferred = self._deferred.get(partition)
        entries: list[Deferred | None] = (
            [None] * len(names) if not deferred else list(map(deferred.get, names)))
        self._read_bound_writes(txn, names, entries, n)
        touched = 0
        for i, name in enumerate(names):  # name order: never the order events arrived in
            # Taken out of the list: an entry `_beat_idle` replaces is freed at the next
            # name, as when it was looked up here, and the next new entry reuses its
            # memory (a million counters' entries left to the loop's end, each new one
            # took memory of another, about 15% more CPU per heartbeat).
            got, entries[i] = entries[i], None
            entry = self._idle_entry(txn, name, got)
            if entry is not None and self._beat_idle(
                    txn, partition, name, entry, n, offset, ps.frontier, out, wheel):
                touched += 1
                continue
            cs = self._load_counter(txn, partition, name)
            if cs is None:
                start = self._start_ticks.get(name)
                if start is None or self._home[name] != partition:
                    continue  # not declared (any more): nothing to do
                if start > n:
                    wheel.file(name, start)
                    continue
                cs = self._new_counter(name, start)
            elif cs.last_offset >= offset:
                # Sealed by this marker before a crash, filed then; the wheel just gave
                # up every entry <= n, so file it again where its state says.
                if cs.filed_due is not None:
                    wheel.file(name, cs.filed_due)
                continue
            elif cs.admission is None or cs.admission.admitted is not None:
                # A restored counter (the worker checked every announced one at start,
                # from the ledger): a refusal halts at this marker, which would announce
                # it, never at one of its events. Not a key not admitted yet: a halt would
                # reveal that it exists; it goes on under its stored parameters, and its
                # ledger entry, if it is ever admitted, says so (`_ledger_entry`).
                self.provenance.check_parameters(name, cs.mechanism)
            due = self.due_tick(cs)
            if due is None or due > n:
                self._not_due(txn, partition, name, cs, n, offset, wheel, due)
                continue
            filed = cs.filed_due
            quiet = cs.announced
            if cs.admission is not None and cs.admission.admitted is None:
                quiet = self._seal_key(name, cs, n, ps.frontier, out)
            elif self._seal_declared(name, cs, n, ps.frontier, out):
                quiet = False
            cs.last_offset = offset
            due = self.due_tick(cs)
            cs.filed_due = due
            if due is None:
                # Filed nowhere from now on, and so stored (staged: a value filed at a
                # tick would be woken there after a restore); released at once, busy or
                # not: no marker reaches it again before its next input.
                self._keep(txn, partition, name, cs, n, filed, False, True)
            else:
                wheel.file(name, due)
                self._keep(txn, partition, name, cs, n, filed, quiet,
                           self._idle(cs, n, due))
            touched += 1
        self._scanned.clear()
        ps.frontier = n
        ps.marker_offset = offset
        self._stage_partition(txn, partition, ps)
        m["counters_touched"] += touched
        m["markers_applied"] += 1
        out.sealed_through = max(n, out.sealed_through or n)

    def _not_due(self, txn: PartitionTransaction, partition: int, name: str,
                 cs: CounterState, n: int, offset: int, wheel: DueWheel,
                 due: int | None) -> None:
        """The marker through n took `cs` from the wheel, but it is due after n (`due`),
        or never before its next input (None)."""
        if due is None:
            # A waiting key with nothing to do until its next input, taken by a stale
            # entry or filed by a value written before such keys were filed nowhere:
            # its stored value is made to say so (the wheel's rebuild then leaves it
            # out), nothing sealed; released.
            if cs.filed_due is not None:
                cs.filed_due = None
                cs.last_offset = offset
                self._stage_counter(txn, partition, name, cs)
            txn.release(self._counters, name)
            return
        # A stale entry: nothing to do yet. Re-file it only if the entry it is filed
        # under is one this marker took. The marker counts as applied to it (a value
        # changes only with its offset: state.supersedes).
        if cs.filed_due is None or cs.filed_due <= n:
            filed = cs.filed_due
            wheel.file(name, due)
            cs.filed_due = due
            cs.last_offset = offset
            self._keep(txn, partition, name, cs, n, filed, True, self._idle(cs, n, due))

    def _seal_declared(self, name: str, cs: CounterState, n: int, frontier: int,
                       out: Output) -> bool:
        """Announce `cs` if it is not yet, and seal it through n (the partition sealed
        through `frontier` before). Returns whether it published anything but heartbeats
        or took an input."""
        announced = cs.announced
        if not announced:
            self._announce(name, cs, n, frontier, out)
        if cs.frontier >= n:
            return not announced
        first = len(out.releases)
        ledger = len(out.ledger)
        published = frontier if announced else None
        return bool(self._seal(name, cs, n, out, published) or not announced
                    or len(out.ledger) != ledger
                    or any(r.kind != "heartbeat" for r in out.releases[first:]))

    def _seal_key(self, name: str, cs: CounterState, n: int, frontier: int,
                  out: Output) -> bool:
        """Seal a key of an open family that is not admitted yet through n: its records
        go aside, and the gate (families.Admission, core/selection.OpenKey) decides. Not
        admitted: nothing of it is published. Admitted at tick a: its ledger entry
        (effective from a), its release at a, then every record of it after a. Returns
        whether the marker only advanced it by ⊥ ticks with nothing published (`_keep`)."""
        adm = cs.admission
        assert adm is not None
        c = cs.mechanism
        quiet_to = None
        if adm.first is None and cs.pending:
            first = min(cs.pending)
            # Every tick before the key's first event is sealed aside unseen: its
            # admission is at or after that tick, and only its records after the
            # admission are published, so its heartbeats before it are not made.
            quiet_to = min(first - 1, n)
            if first <= n:
                # The key's first event is in these ticks: the gate looks from its tick
                # on (made by an event, the key had pending arrivals until this seal).
                adm.first = first - cs.start_tick + 1
        elif (adm.first is not None and not cs.queue and cs.pending
                and self._next_due(cs) is None):
            # Its first tick sealed, nothing queued and its mechanism never due without
            # input, y stays as it is up to its first pending tick, where any admission
            # is at the earliest: its heartbeats up to then would be set aside unseen,
            # so they are not made, and the ⊥ ticks since its stored tick (a key filed
            # nowhere: `due_tick`) are one exact skip (the Counter contract: the same
            # state).
            quiet_to = min(min(cs.pending) - 1, n)
        before = (c.t, c.y)
        aside = Output()
        dequeued = self._seal(name, cs, n, aside, quiet_to)
        # `_seal` makes Release objects only (`_release`; no idle entry beats here).
        sealed = aside.decoded_releases()
        out.metrics["events_dequeued"] += dequeued
        if adm.first is None:
            return not dequeued
        got = adm.gate(c, before,
                       [(r.tick, r.value) for r in sealed if r.kind == "change"])
        if got is None:
            return not dequeued
        a, y = got
        self._announce(name, cs, n, frontier, out, a)
        self._release(name, cs, a, y, "change", out)
        # The records after a, with the error bound each would have had (a function of
        # the counter's parameters and the tick only: `_error_bound`).
        out.releases += [replace(r, error_bound=self._error_bound(c, r.tick))
                         for r in sealed if r.tick > a]
        return False

    def _stage_counter(self, txn: PartitionTransaction, partition: int, name: str,
                       cs: CounterState) -> None:
        deferred = self._deferred.get(partition)
        if deferred:
            deferred.pop(name, None)
        txn.stage(self._counters, name, cs)

    def _keep(self, txn: PartitionTransaction, partition: int, name: str,
              cs: CounterState, n: int, filed: int | None, quiet: bool, idle: bool) -> None:
        """After a marker through n changed `cs` (filed under `filed` before it): stage
        it, unless the marker only advanced it by ⊥ ticks (`quiet`: no input taken, no
        ledger entry, nothing published but heartbeats) and its stored value is filed at
        most `_defer_ticks` before n. Such progress is not written until a later change
        or a full checkpoint stages it: restoring the stored value and sealing the same
        ticks again gives this very state, and sends none of their heartbeats again
        (`heartbeat_floor`; docs/state.md). `_deferred` records how far: a value decoded
        again (`_load_counter`) is re-sealed to it. An `idle` counter (it took no input
        here or in the last heartbeat interval, nothing queued or pending, nothing due
        before its next heartbeat: `_idle`) is released while the cache holds more than
        `idle_decoded` counters, and a waiting key that is never due without input
        always: it does not stay decoded past the transaction."""
        if not (quiet and cs.saved is not None and self._defer(partition, name, cs, n, filed)):
            self._stage_counter(txn, partition, name, cs)
        # A waiting key whose mechanism is never due without input (ECC's, mostly) is
        # filed nowhere (`due_tick`) and released whatever the cache holds: only its next
        # event decodes it again (a replay where it is stored compact: state.py).
        if idle and (len(self._cached_counters) > self._idle_decoded
                     or (_waiting(cs) and self._next_due(cs) is None)):
            txn.release(self._counters, name)
            self._remember_idle(partition, name, cs)

    def _defer(self, partition: int, name: str, cs: CounterState, n: int,
               filed: int | None) -> bool:
        """Record `cs`'s ⊥-only progress through n in `_deferred` instead of staging it,
        if its stored value (filed under `filed`) is at most `_defer_ticks` behind n;
        returns whether it did."""
        deferred = self._deferred.get(partition)
        if deferred is None:
            deferred = self._deferred[partition] = {}
        got = deferred.get(name)
        since = filed if got is None else got[0]
        if since is None or self._past_defer_bound(since, n):
            return False
        # `n` itself where it is the frontier: one int for every counter it sealed.
        deferred[name] = (since, n if cs.frontier == n else cs.frontier, cs.last_offset)
        return True

    def _past_defer_bound(self, since: int, n: int) -> bool:
        """Whether ⊥-only progress through n of a value stored at tick `since` is beyond
        the deferral bound: then it is written, not deferred (`_defer`, `_beat_idle`,
        `_read_bound_writes` all ask this)."""
        return n - since > self._defer_ticks

    def _remember_idle(self, partition: int, name: str, cs: CounterState) -> None:
        """Give the deferred entry of `cs`, just released as idle, what its heartbeats
        need without decoding it (`IdleEntry`; `_beat_idle`): an announced counter with
        nothing queued or pending, whose mechanism's bound is a function of its
        parameters and the tick (`error_bound_at`). Not a key waiting for admission
        (never announced): it publishes no heartbeat, and a marker that reaches it
        decodes it, so an entry would only hold memory."""
        c = cs.mechanism
        if (not cs.announced or cs.queue or cs.pending
                or type(c).error_bound_at is Counter.error_bound_at):
            return
        deferred = self._deferred.get(partition)
        if deferred is None:
            deferred = self._deferred[partition] = {}
        got = deferred.get(name)
        since = cs.filed_due if got is None else got[0]
        if since is None:
            return
        # A copy: the counter itself may be loaded and changed again.
        shape = self._shape((c.mechanism, c.eps, c.delta, c.bound_key(), cs.start_tick,
                             cs.ledger_fingerprint),
                            lambda: type(c).from_bytes(c.to_bytes(), self.key))
        nd = self._next_due(cs)
        y = c.y
        deferred[name] = (self._shared(since), cs.frontier, cs.last_offset,
                          self._shared(cs.next_heartbeat), _ZERO if _is_zero(y) else y,
                          None if nd is None else self._shared(cs.start_tick + nd - 1), shape,
                          self._idle_phase(name))

    def _idle_entry(self, txn: PartitionTransaction, name: str,
                    entry: Deferred | None) -> IdleEntry | None:
        """The idle entry of counter `name`, whose deferred entry is `entry`: the one
        remembered (`_remember_idle`, `_beat_idle`), else, with no deferred entry at all,
        one read off its stored value."""
        if entry is None:
            return self._stored_idle(txn, name) if self._views else None
        return entry if len(entry) > 3 else None

    def _stored_idle(self, txn: PartitionTransaction, name: str) -> IdleEntry | None:
        """The idle entry of a counter that is not decoded and has none (restored from the
        changelog, taken over from a standby copy, after `forget`), read off its stored
        value without a decode (`state.quiet_counter`, `Counter.idle_view`): the entry
        `_remember_idle` gives that value decoded, where it is idle there; else None
        (the marker decodes it). A value whose noise key is not the configured one, or
        that a decode would refuse, gets none: its decode raises."""
        if counter_key(name) in self._cached_counters or txn.is_staged(self._counters, name):
            return None
        raw = self._stored_raw(txn, name)
        q = None if raw is None else quiet_counter(raw)
        if q is None or q.filed_due is None or q.key_id != self.key_id:
            return None
        # Not a key waiting for admission (`_remember_idle`): its entry would not be used.
        if not q.announced:
            return None
        for cls in self._views:
            view = cls.idle_view(q.mechanism, self.key)
            if view is not None:
                break
        else:
            return None
        # What `from_bytes` checks (mechanism tick against frontier), and a value whose
        # last release is its y (a heartbeat repeats it).
        if view.t != q.frontier - q.start_tick + 1 or view.y != q.last_published:
            return None
        try:
            shape = self._shape((view.mechanism, view.eps, view.delta, view.bound_key,
                                 q.start_tick, q.ledger_fingerprint),
                                lambda: self.factory.restore(q.mechanism, self.key))
        except StateFormatError:
            return None
        nd, y = view.next_due, view.y
        return (self._shared(q.filed_due), q.frontier, q.offset,
                self._shared(q.next_heartbeat), _ZERO if _is_zero(y) else y,
                None if nd is None else self._shared(q.start_tick + nd - 1), shape,
                self._idle_phase(name))

    def _stored_raw(self, txn: PartitionTransaction, name: str) -> bytes | None:
        """`txn.stored` of counter `name`: the bytes the scan that built the wheel read
        for the marker under way, if it kept them (`_wheel`), else read now. The same
        bytes: a marker writes nothing to the store, and a value staged since the scan is
        never read here (`_stored_idle` and `_beat_idle` leave a staged value alone)."""
        raw = self._scanned.get(name)
        return txn.stored(self._counters, name) if raw is None else raw

    def _read_bound_writes(self, txn: PartitionTransaction, names: list[str],
                           entries: list[Deferred | None], n: int) -> None:
        """Read at once, in key order (`txn.stored_many`: one multi-get), the stored
        values of the counters among `names` (in name order; `entries` their deferred
        entries) that the marker through n would write at the deferral bound from their
        idle entries (`_beat_idle`), into the marker's `_scanned` (`_stored_raw`), up to
        BOUND_READS of them. Only reads: a counter `_beat_idle` then declines is decoded
        as it would have been, and its bytes are the store's for the whole marker (a
        marker writes nothing to the store; a staged value is never read here)."""
        past = self._past_defer_bound
        scanned = self._scanned
        slot = self._counters
        want: list[str] = []
        for name, entry in zip(names, entries, strict=True):
            if (entry is not None and len(entry) > 3 and past(entry[0], n)
                    and name not in scanned and not txn.is_staged(slot, name)):
                want.append(name)
                if len(want) >= BOUND_READS:
                    break
        if len(want) < 2:
            return  # one read is one read
        for name, raw in zip(want, txn.stored_many(slot, want), strict=True):
            if raw is not None:
                scanned[name] = raw

    def _shape(self, key: tuple[object, ...], rep: Callable[[], Counter]) -> int:
        """The index of the `IdleShape` of `key` (mechanism, eps, delta, bound key, start
        tick, ledger fingerprint), made with the mechanism `rep()` if new."""
        shape = self._shapes.get(key)
        if shape is None:
            start, fingerprint = key[4], key[5]
            assert isinstance(start, int) and isinstance(fingerprint, str)
            made = IdleShape(rep(), start, fingerprint)
            shape = self._shapes[key] = len(self._shape_list)
            self._shape_list.append(made)
        return shape

    def _shared(self, v: int) -> int:
        """One int object for every equal tick of the idle entries (bounded)."""
        got = self._ints.get(v)
        if got is None:
            if len(self._ints) >= 1 << 16:
                self._ints.clear()
            got = self._ints[v] = v
        return got

    def _beat_idle(self, txn: PartitionTransaction, partition: int, name: str,
                   entry: IdleEntry, n: int, offset: int, frontier: int, out: Output,
                   wheel: DueWheel) -> bool:
        """What the marker through n does to a counter released as idle, from its
        `IdleEntry` alone, when that is all it does: seal ⊥ ticks short of the
        mechanism's next due tick (by the Counter contract they change nothing but t),
        publish the heartbeats among them, defer that progress (`_defer`) and file it
        again. Returns False, changing nothing, whenever the marker would do anything
        else (then the counter is loaded and sealed as usual): its stored value beyond
        the deferral bound, a staged value, a ledger entry due, the mechanism due."""
        since, through, last, nh, y, mdue, index, phase = entry
        shape = self._shape_list[index]
        start = shape.start_tick
        # Entries are made for announced counters only (`_remember_idle`,
        # `_stored_idle`): a key waiting for admission is decoded by its marker.
        if (last >= offset or through >= n or start + nh - 1 > n
                or (mdue is not None and mdue <= n)
                or txn.is_staged(self._counters, name)):
            return False
        h = self.settings.heartbeat_ticks
        # `_seal`'s heartbeats, tick for tick: the floor, then every heartbeat through n.
        floor = heartbeat_floor(n, start, h, frontier)
        if nh <= floor:
            nh = next_heartbeat(floor, phase, h)
        beats: list[int] = []
        fingerprint_at = self.provenance.fingerprint_at
        while start + nh - 1 <= n:
            if fingerprint_at(name, nh) != shape.ledger_fingerprint:
                return False  # a "reconfigured" entry first: `_release`
            beats.append(nh)
            nh = next_heartbeat(nh, phase, h)
        due = self._idle_due(start, nh, mdue, n)
        rep = shape.rep
        written = None
        if self._past_defer_bound(since, n):
            # Beyond the deferral bound the sealed value is written (`_keep`): computed
            # on the stored bytes where the mechanism can (`Counter.advance_state`), read
            # with the marker's others (`_read_bound_writes`).
            raw = self._stored_raw(txn, name)
            written = None if raw is None else advance_counter_value(
                raw, self._advancer(rep), n, nh, offset, due)
            if written is None:
                return False
        if not shape.checked:
            self.provenance.check_parameters(name, rep)
            shape.checked = True
        # Every field of these heartbeats but counter and value is the shape's at t (the
        # fingerprint is the shape's: checked above): encoded from its template.
        templates = shape.templates
        for t in beats:
            template = templates.get(t)
            if template is None:
                template = self._heartbeat_template(shape, t)
            out.releases.append(template.release(name, y))
        wheel.file(name, due)
        if written is not None:
            txn.stage_encoded(self._counters, name, written)
            since = self._shared(due)
        self._deferred.setdefault(partition, {})[name] = (
            since, n, offset, self._shared(nh), y, mdue, index, phase)
        return True

    @staticmethod
    def _idle_due(start: int, nh: int, mdue: int | None, n: int) -> int:
        """`due_tick` of an idle counter sealed through n with next heartbeat `nh` (a
        local tick): that heartbeat, or its mechanism's due tick `mdue` if earlier."""
        due = start + nh - 1
        if due > n + 1 and mdue is not None:
            due = min(due, mdue)
        return due

    def _write_idle(self, txn: PartitionTransaction, name: str, entry: IdleEntry) -> bool:
        """Stage the value of a counter released as idle, sealed through its entry's tick,
        computed on its stored bytes as `_beat_idle` writes it at the deferral bound
        (`Counter.advance_state`): what `stage_deferred` stages decoding it and re-sealing
        it to its entry (`_load_counter`). False, staging nothing, where that is not
        exact here (a decoded or staged value, a stored value at or beyond the entry's
        offset, a mechanism that cannot advance on its bytes): then it is decoded. A
        stored value of the entry's offset is its state already (one offset, one value:
        `state.supersedes`): nothing to stage."""
        _since, through, last, nh, _y, mdue, index, _phase = entry
        if counter_key(name) in self._cached_counters or txn.is_staged(self._counters, name):
            return False
        raw = txn.stored(self._counters, name)
        held = stored_offset(raw)
        if raw is None or held is None or held > last:
            return False
        if held == last:
            return True
        shape = self._shape_list[index]
        written = advance_counter_value(
            raw, self._advancer(shape.rep), through, nh, last,
            self._idle_due(shape.start_tick, nh, mdue, through))
        if written is None:
            return False
        txn.stage_encoded(self._counters, name, written)
        return True

    def _advancer(self, rep: Counter) -> Callable[[bytes, int], bytes | None]:
        """`advance_state` of `rep`'s mechanism with the configured noise key (the one
        every counter an idle entry stands for was checked to carry: `_stored_idle`,
        `_remember_idle` of a decoded value): a value whose partition draws (an ECC SVT
        inside its run's dense prefix) advances without a full decode too."""
        advance = type(rep).advance_state
        key = self.key
        return lambda data, k: advance(data, k, key)

    def _heartbeat_template(self, shape: IdleShape, t: int) -> ReleaseTemplate:
        """The template of the heartbeats of the counters of `shape` at their tick t: the
        fields `_release` gives them, but counter and value (kept per shape, the newest
        HEARTBEAT_TEMPLATES ticks: a marker beats many counters at few ticks)."""
        s = self.settings
        rep = shape.rep
        templates = shape.templates
        if len(templates) >= HEARTBEAT_TEMPLATES:
            templates.clear()
        template = templates[t] = ReleaseTemplate(
            tick=t, tick_start_ms=(shape.start_tick + t - 1) * s.tick_ms,
            tick_ms=s.tick_ms, kind="heartbeat", mechanism=rep.mechanism, epsilon=rep.eps,
            delta=rep.delta, error_bound=self._bound_at(shape, t), beta=s.beta,
            fingerprint=shape.ledger_fingerprint)
        return template

    def _bound_at(self, shape: IdleShape, t: int) -> float:
        """`_error_bound` of a counter of `shape` at its tick t."""
        return self._cached_bound(shape.bound_key, t, shape.rep.error_bound_at)

    def _idle(self, cs: CounterState, n: int, due: int) -> bool:
        """Whether `cs`, filed at `due` after a marker through n, is idle: it took no
        input in the last heartbeat interval (`busy_until`: the hot counters stay
        decoded), has nothing queued or pending, and nothing due before its next
        heartbeat; a key not admitted yet, once its first tick is sealed, publishes
        nothing and waits for its next input or its mechanism's next due tick, so it
        is idle under the first two conditions alone."""
        if n < cs.busy_until or cs.queue or cs.pending:
            return False
        if _waiting(cs):
            return True
        return cs.announced and due == cs.start_tick + cs.next_heartbeat - 1

    def _load_counter(self, txn: PartitionTransaction, partition: int,
                      name: str) -> CounterState | None:
        """The counter's value (`txn.load`), with its deferred ⊥-only progress: a value
        decoded again from the store after it was released or evicted is re-sealed to
        the tick and offset `_keep` recorded (publishing nothing: those ticks were), so
        it is the very object that would have stayed decoded."""
        cs = txn.load(self._counters, name)
        if cs is not None:
            deferred = self._deferred.get(partition)
            if deferred:
                got = deferred.get(name)
                if got is not None and cs.last_offset < got[2]:
                    if cs.frontier < got[1]:
                        self._seal(name, cs, got[1], Output(), got[1])
                    cs.last_offset = got[2]
                    cs.filed_due = self.due_tick(cs)
        return cs

    # -- announcing

    def learn_announced(self, announced: Mapping[str, Collection[str]]) -> None:
        """Add what the ledger announced since the start's read (counter -> creation tags;
        the worker's `LedgerTail`, at each assignment and before a creating batch is
        published, then `check_ledger`): another worker's creations then
        count as the start's do, so a partition taken over without a counter's state
        halts at its creation (AnnouncedCounterError) instead of announcing it again
        under another tag. The same rule a restart would apply to the same ledger. The
        operator's own creations read back (`_made` has them) add nothing: a first start
        that creates a million counters does not hold their tags twice. No-op without a
        ledger to check against (replay, tests)."""
        known = self._announced
        if known is None:
            return
        made = self._made
        for name, tags in announced.items():
            seen = known.get(name)
            if seen is None:
                mine = made.get(name)
                if mine is not None and len(tags) == 1 and mine in tags:
                    continue
                known[name] = frozenset(tags)
            elif not set(tags) <= set(seen):
                known[name] = frozenset(seen) | frozenset(tags)

    def check_ledger(self, entries: Iterable[LedgerEntry]) -> None:
        """Raise AnnouncedCounterError for the first "created" entry of `entries` (a
        batch's, not yet published) whose counter the ledger, as learnt so far (at start
        and by `learn_announced`), announced under other creations only. The worker calls
        it right after reading the ledger on, before it publishes a batch that creates
        counters: a creation another process published after this one's last read is
        then refused as a restart would refuse it (docs/state.md, "A creation is
        published at most once"). No-op without a ledger (replay, tests)."""
        known = self._announced
        if known is None:
            return
        for e in entries:
            if e.entry != "created":
                continue
            seen = known.get(e.counter)
            if seen is not None and e.creation not in seen:
                raise AnnouncedCounterError(e.counter)

    def _announce(self, name: str, cs: CounterState, n: int, frontier: int,
                  out: Output, since_tick: int = 1) -> None:
        """Emit the ledger entry of a counter the marker through `n` brings into being (on
        a partition sealed through `frontier` before it), unless the ledger already
        announced it under another creation (AnnouncedCounterError: raised before anything
        of this record is published, so nothing is republished)."""
        tag = creation_tag(self.provenance.creation_identity(name), name, n, frontier)
        if self._announced is not None:
            seen = self._announced.get(name)
            made = self._made.get(name)
            if (seen is not None and tag not in seen) or (made is not None and made != tag):
                raise AnnouncedCounterError(name)
            if seen is None and made is None:
                self._made[name] = tag
        cs.creation = tag
        out.ledger.append(self._ledger_entry(name, cs, "created", since_tick))
        cs.announced = True

    def _ledger_entry(self, name: str, cs: CounterState,
                      entry: Literal["created", "reconfigured"], since_tick: int) -> LedgerEntry:
        """The ledger entry of `cs` under the current configuration fingerprint (which it
        then records as announced), effective from its local tick `since_tick`. Mechanism,
        eps and delta are those of the running instance: the configured ones for a new
        counter, the stored ones for a restored counter (`parameters` says which)."""
        s = self.settings
        c = cs.mechanism
        fingerprint = self.provenance.fingerprint_at(name, since_tick)
        # A new counter runs with the configured parameters by construction; a key may
        # have been made under an earlier configuration.
        same = (entry == "created" and cs.admission is None) or self.provenance.runs_configured(
            name, c, fingerprint)
        cs.ledger_fingerprint = fingerprint
        return LedgerEntry(
            counter=name, mechanism=c.mechanism, epsilon=c.eps,
            delta=c.delta, tick_ms=s.tick_ms,
            start_ms=cs.start_tick * s.tick_ms, fingerprint=fingerprint,
            key_id=cs.key_id, creation=cs.creation, entry=entry, since_tick=since_tick,
            parameters="configured" if same else "stored", calibration=calibration_of(c),
            **unit_ledger_fields(s, self.provenance.unit_claim(fingerprint)))

    # -- the queue and the ticks

    def _seal(self, name: str, cs: CounterState, n: int, out: Output,
              published: int | None) -> int:
        """Advance `cs` through global tick n: per tick, arrivals join the queue, at most
        one value leaves as x_t; idle runs (empty queue, nothing due) are one skip.
        `published`: for an announced counter, the partition's frontier before this
        marker (every record of it through that tick was published); for a key not
        admitted, the tick through which its records cannot be published (`_seal_key`):
        no heartbeat is made at or before it. Returns how many values left the queue."""
        c = cs.mechanism
        pending = cs.pending
        dequeued = 0
        h = self.settings.heartbeat_ticks
        floor = heartbeat_floor(n, cs.start_tick, h, published)
        if cs.next_heartbeat <= floor:
            cs.next_heartbeat = next_heartbeat(floor, self._phase(name), h)
        while cs.frontier < n:
            g = cs.frontier + 1
            if pending:
                arrivals = pending.pop(g, None)
                if arrivals:
                    cs.push_all(arrivals)
            if cs.queue:  # not cached: push_all and pop may replace the deque
                cs.next_due_known = False
                units = cs.pop()
                c.update_units(units)
                if cs.trail is not None:  # a waiting key's inputs (`state._compact`)
                    cs.trail += (c.t, units)
                dequeued += 1
                cs.frontier = g
                self._emit(name, cs, out)
                continue
            # Skip g..stop-1: up to n, up to and INCLUDING the next heartbeat tick (a ⊥
            # tick short of next_due leaves y as it is, so its record is a heartbeat and
            # next_due stays valid), short of the next arrivals and of next_due.
            stop = min(n + 1, cs.start_tick + cs.next_heartbeat)
            if pending:
                stop = min(stop, min(pending))
            nd = self._next_due(cs)
            if nd is not None:
                stop = min(stop, cs.start_tick + nd - 1)
            if stop > g:
                k = stop - g
                changes = c.skip(k)
                cs.frontier += k
                if changes:
                    cs.next_due_known = False
                # By the next_due() contract a skip short of it changes nothing; if a
                # mechanism reports changes anyway, publish them rather than hide them.
                for t, y in changes:
                    self._release(name, cs, t, y, "change", out)
                cs.last_published = c.y
                t = c.t
                if t >= cs.next_heartbeat:  # the skip ended on the heartbeat tick
                    if not (changes and changes[-1][0] == t):
                        self._release(name, cs, t, c.y, "heartbeat", out)
                    cs.next_heartbeat = next_heartbeat(t, self._phase(name),
                                                       self.settings.heartbeat_ticks)
                continue
            cs.next_due_known = False
            c.update(None)
            cs.frontier = g
            self._emit(name, cs, out)
        if dequeued:
            # It took an input: it stays decoded for a heartbeat interval (`_idle`).
            cs.busy_until = n + h
        out.metrics["events_dequeued"] += dequeued
        return dequeued

    def _emit(self, name: str, cs: CounterState, out: Output) -> None:
        """After one tick: a change record if y moved, else a heartbeat if one is due."""
        c = cs.mechanism
        t, y = c.t, c.y
        kind: Literal["change", "heartbeat"] | None = None
        beat = t >= cs.next_heartbeat
        if y != cs.last_published:
            kind = "change"
        elif beat:
            kind = "heartbeat"
        if beat:
            cs.next_heartbeat = next_heartbeat(t, self._phase(name),
                                               self.settings.heartbeat_ticks)
        cs.last_published = y
        if kind is not None:
            self._release(name, cs, t, y, kind, out)

    def _release(self, name: str, cs: CounterState, t: int, y: float,
                 kind: Literal["change", "heartbeat"], out: Output) -> None:
        s = self.settings
        c = cs.mechanism
        fingerprint = self.provenance.fingerprint_at(name, t)
        # A key not admitted: set aside, its bound computed only if published, and no
        # ledger entry (its admission's comes first: `_seal_key`), so its stored value
        # does not depend on which of its ticks were sealed again (`_load_counter`).
        adm = cs.admission
        aside = adm is not None and adm.admitted is None
        if cs.ledger_fingerprint != fingerprint and not aside:
            # The configuration changed under this counter's state: its first release under
            # the new fingerprint is preceded by the entry that explains it (published
            # first: a sink sends a batch's ledger entries before its releases).
            out.ledger.append(self._ledger_entry(name, cs, "reconfigured", t))
        # Mechanism, eps and delta are those of the running instance (restored from state),
        # which differ from the settings only if the configuration changed under live state.
        out.releases.append(Release(
            counter=name, tick=t, tick_start_ms=(cs.start_tick + t - 1) * s.tick_ms,
            tick_ms=s.tick_ms, value=y, kind=kind, mechanism=c.mechanism,
            epsilon=c.eps, delta=c.delta,
            error_bound=0.0 if aside else self._error_bound(c, t), beta=s.beta,
            fingerprint=fingerprint))

    def _error_bound(self, c: Counter, t: int) -> float:
        beta = self.settings.beta
        if c.t != t:  # a change reported inside a skip: the bound as of that tick (it
            return float(c.error_bound_at(t, beta))  # may decrease in t: bounds.py)
        # mechanism, eps, delta, calibration, base
        return self._cached_bound(c.bound_key(), t, lambda _t, b: c.error_bound(b))

    def _cached_bound(self, bound_key: tuple[object, ...], t: int,
                      compute: Callable[[int, float], float]) -> float:
        """The error bound at tick t of a counter whose `bound_key` it is, `compute(t,
        beta)` computed once per (bound_key, beta, t) (`_bounds`)."""
        beta = self.settings.beta
        k = (bound_key, beta, t)
        bound = self._bounds.get(k)
        if bound is None:
            if len(self._bounds) >= 4096:
                self._bounds.clear()
            bound = self._bounds[k] = float(compute(t, beta))
        return bound
