"""What the operator stores, and how a stored value says how new it is: the store
protocol, the codecs of every stored value and the in-memory due wheel (what a
checkpoint reads and writes goes through `transaction.py`). No Kafka, no Faust.

Key layout (all values bytes, each codec with its own magic and version):

- `c/<counter>`   CounterState: the mechanism, its FIFO queue, pending arrivals, ...,
                  the fingerprint of the noise key its mechanism draws from, and what
                  its last ledger entry said (configuration fingerprint, creation tag).
- `p/<partition>` PartitionState: sealed frontier, last marker offset, the duplicate
                  filter (input source -> highest input offset applied), the noise key
                  fingerprint the partition's state was made under.

A key of an open family not admitted yet is stored in format 5 while it has few inputs
(`_compact`): the same header, then its inputs instead of its mechanism's state; its
decode replays the mechanism (`selection.replay`), the very state format 4 would hold.

Monotone values. Every value of format 4 (and 5) begins with the timeline offset it reflects
(`stored_offset`): a counter's, the last timeline record applied to that counter; a
partition's, the last timeline record applied to the partition. Applying the timeline is
deterministic (keyed noise, positions in state), so two values of one key with the same
offset are the same bytes, and a value with a higher offset is a later state of the same
computation. `supersedes` is THE rule by which a store takes a value it did not compute
itself (the changelog, at restore and on standbys): never a lower offset than the one it
holds, never a deletion of a value that carries one. So a worker that lost its partitions
without noticing (a network partition) may still write its state to the changelog after
the new owner's: nobody restores or continues from it (docs/state.md).

The due wheel (which counters a marker must look at) is not stored: it is rebuilt from
the counters' own `filed_due` when a partition is loaded (`counter_filed_due` reads it
from the value's header without decoding the mechanism). A stored index would be one
more value whose deletions a late writer could replay out of order.

The noise key is bound to the state: both the partition value (read first by every
timeline record, so a wrong key is caught before any counter is touched) and each counter
value carry the key's public fingerprint, and the operator refuses a key that is not the
stored one (`operator.KeyMismatchError`). Values of format 2, written before the
fingerprint was stored, are refused with `StateVersionError`; values of format 3 (no
offset header; the same fields) are read and written back as format 4.

Write order of a checkpoint (the operator's slots in `transaction.PartitionTransaction`:
its write plan goes by slot rank): counter states, then the partition value: a partition
value never reflects more of the timeline than the counters it guards (its duplicate
filter drops input the counters must already hold).
"""

from __future__ import annotations

import heapq
import struct
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final, NamedTuple, Protocol

import orjson

from processor.core import registry
from processor.core.api import Counter
from processor.core.cc import DEFAULT_BASE
from processor.core.ecc import ECC, SimECC
from processor.core.errors import InvalidInputError, InvalidParameterError, StateFormatError
from processor.core.rng import NoiseKey
from processor.core.selection import replay
from processor.stream.model.families import Admission

#: The queue of every counter with nothing queued (most of them, most of the time): an
#: empty deque costs about 600 bytes. Only push_all and pop change a queue, and they
#: replace this one, never add to it.
_NO_QUEUE: Final[deque[list[int]]] = deque()

_COUNTER_MAGIC: Final = b"DPC\x04"
_PARTITION_MAGIC: Final = b"DPP\x04"
#: A privacy unit's value (processor/stream/model/bounding.py): magic, offset, then its kept set.
UNIT_MAGIC: Final = b"DPU\x04"
#: Format 5, the compact form of a key of an open family not admitted yet (`_compact`):
#: the same header as format 4 (magic, offset, filed_due), then the key's inputs instead
#: of its mechanism's state, which a decode replays (`selection.replay`).
_COUNTER_COMPACT: Final = b"DPC\x05"
#: A waiting key is stored compact while it has at most this many inputs and its counter
#: at most COMPACT_CHECKPOINTS partition checkpoints (what its replay steps through one
#: by one); beyond either, and once admitted, in format 4 for good.
COMPACT_EVENTS: Final = 8
COMPACT_CHECKPOINTS: Final = 16
#: Format 3: the same fields, without the offset header (read, converted on write).
_COUNTER_V3: Final = b"DPC\x03"
_PARTITION_V3: Final = b"DPP\x03"
#: Format 2: the same values without the noise key's fingerprint (refused).
_COUNTER_V2: Final = b"DPC\x02"
_PARTITION_V2: Final = b"DPP\x02"
#: `filed_due` None in the header.
_NOT_FILED: Final = -(1 << 63)
#: Bytes before a format-4 counter's mechanism: magic, offset, filed_due, mechanism length.
_COUNTER_HEAD: Final = 24

_ORJSON_ERRORS = (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError,
                  AttributeError)


def _i64(value: int) -> bytes:
    return value.to_bytes(8, "big", signed=True)


#: The 12-byte header every monotone value starts with: its magic (4 bytes), then the
#: offset it reflects (big-endian int64), which `stored_offset` reads. Written here only.
monotone_header: Final = struct.Struct(">4sq").pack


def _read_i64(data: bytes, at: int) -> int:
    return int.from_bytes(data[at:at + 8], "big", signed=True)


class StateVersionError(StateFormatError):
    """A stored value of an older format version that this version will not adopt (a
    StateFormatError, so it carries its store key the same way). `version` is the stored
    version, `current` the one this version writes."""

    def __init__(self, what: str, version: int, current: int) -> None:
        self.version = version
        self.current = current
        super().__init__(
            f"{what} of format version {version}, written by an older release that did "
            f"not record the noise key's fingerprint (version {current} does): this "
            "release cannot verify that the configured key is the one the state was "
            "made with, so it does not adopt the state")


# ------------------------------------------------------------------------ keys

COUNTER_PREFIX: Final = "c/"
PARTITION_PREFIX: Final = "p/"


def counter_key(counter: str) -> str:
    return f"{COUNTER_PREFIX}{counter}"


def partition_key(partition: int) -> str:
    return f"{PARTITION_PREFIX}{partition}"


# ------------------------------------------------------------------------ monotone values


def stored_offset(value: bytes | None) -> int | None:
    """The timeline offset a stored value reflects; None for a value that carries none
    (a deletion, a value of format 3 or older, a foreign value)."""
    if value is None or len(value) < 12:
        return None
    magic = bytes(value[:4])
    if magic in (_COUNTER_MAGIC, _PARTITION_MAGIC, UNIT_MAGIC, _COUNTER_COMPACT):
        return _read_i64(value, 4)
    return None


def supersedes(new: bytes | None, old: bytes | None) -> bool:
    """Whether a store holding `old` takes `new` (None: a deletion) from outside, the
    changelog: unless `old` carries an offset, always; else only a value whose offset is
    at least as high. THE monotone rule (docs/state.md)."""
    held = stored_offset(old)
    if held is None:
        return True
    got = stored_offset(new)
    return got is not None and got >= held


def counter_filed_due(value: bytes) -> int | None:
    """The tick a stored counter is filed under in the due wheel (None: not filed), read
    without decoding its mechanism. StateFormatError if the value is not a counter."""
    data = (bytes(value[:_COUNTER_HEAD]) if value[:4] in (_COUNTER_MAGIC, _COUNTER_COMPACT)
            else bytes(value))
    if data[:4] in (_COUNTER_MAGIC, _COUNTER_COMPACT) and len(data) >= _COUNTER_HEAD:
        due = _read_i64(data, 12)
        return None if due == _NOT_FILED else due
    if data[:4] == _COUNTER_V3 and len(data) >= 8:
        n = int.from_bytes(data[4:8], "big")
        try:
            due = orjson.loads(data[8 + n:])[8]
        except _ORJSON_ERRORS:
            raise StateFormatError("operator counter state is corrupt") from None
        return None if due is None else int(due)
    if data[:4] == _COUNTER_V2:
        raise StateVersionError("an operator counter state", 2, _COUNTER_MAGIC[3])
    raise StateFormatError("not an operator counter state (magic/version)")


def _counter_bytes(offset: int, filed_due: int, mech: bytes, meta: bytes) -> bytes:
    """A format-4 counter value: magic and offset (the monotone header), filed_due, the
    mechanism's state with its length, then the counter's fields as JSON."""
    return b"".join((monotone_header(_COUNTER_MAGIC, offset), _i64(filed_due),
                     len(mech).to_bytes(4, "big"), mech, meta))


def _counter_parts(data: bytes) -> tuple[bytes, bytes]:
    """The mechanism's state and the fields' JSON of a format-4 counter value (its magic
    and length checked by the caller)."""
    n = int.from_bytes(data[20:_COUNTER_HEAD], "big")
    return data[_COUNTER_HEAD:_COUNTER_HEAD + n], data[_COUNTER_HEAD + n:]


def advance_counter_value(raw: bytes, advance: Callable[[bytes, int], bytes | None],
                          frontier: int, next_heartbeat: int, offset: int,
                          filed_due: int) -> bytes | None:
    """The stored counter value `raw` sealed on through global tick `frontier` by ⊥ ticks
    that publish nothing but heartbeats, without decoding it: its mechanism moved by
    `advance` (`Counter.advance_state`), its frontier, next heartbeat, offset and
    filed_due set; what `CounterState.to_bytes` of the decoded, sealed value gives. None
    where that is not exact here (another format, a value with events queued or pending,
    a mechanism that cannot advance without its noise key). A compact value (format 5)
    needs no `advance`: its inputs and its tick are its counter (`_advance_compact`)."""
    data = bytes(raw)
    if data[:4] == _COUNTER_COMPACT:
        return _advance_compact(data, frontier, next_heartbeat, offset, filed_due)
    if data[:4] != _COUNTER_MAGIC or len(data) < _COUNTER_HEAD:
        return None
    body, fields = _counter_parts(data)
    try:
        meta = orjson.loads(fields)
    except orjson.JSONDecodeError:
        return None
    # The fields to_bytes writes: eleven, and a key's admission (which quiet ticks keep).
    if (not isinstance(meta, list) or len(meta) not in (11, 12) or type(meta[1]) is not int
            or meta[2] or meta[3] or frontier < meta[1]
            or (len(meta) == 12 and not isinstance(meta[11], list))):
        return None
    mech = advance(body, frontier - meta[1])
    if mech is None:
        return None
    meta[1] = frontier
    meta[5] = next_heartbeat
    return _counter_bytes(offset, filed_due, mech, orjson.dumps(meta))


class QuietCounter(NamedTuple):
    """A stored counter value with nothing queued or pending, read without decoding its
    mechanism (`quiet_counter`): the fields `CounterState.from_bytes` would give, the
    mechanism's state still encoded. `admission`: (delta0, first, admitted) of a key
    of an open family, None for every other counter."""

    offset: int
    filed_due: int | None
    mechanism: bytes
    start_tick: int
    frontier: int
    last_published: float
    next_heartbeat: int
    announced: bool
    key_id: str
    ledger_fingerprint: str
    admission: tuple[float, int | None, int | None] | None


def quiet_counter(raw: bytes) -> QuietCounter | None:
    """The fields of the format-4 counter value `raw` when nothing is queued or pending
    in it, its mechanism not decoded; None for anything else (another format, events
    waiting, a value `from_bytes` would refuse: the caller decodes, which says why)."""
    data = bytes(raw)
    if data[:4] != _COUNTER_MAGIC or len(data) < _COUNTER_HEAD:
        return None
    mech, fields = _counter_parts(data)
    try:
        meta = orjson.loads(fields)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(meta, list) or len(meta) not in (11, 12):
        return None
    start, frontier, queue, pending, last_published, next_hb, announced = meta[:7]
    key_id, ledger_fp = meta[7], meta[8]
    if (queue or pending or type(start) is not int or type(frontier) is not int
            or type(next_hb) is not int or type(announced) is not bool
            or type(last_published) not in (int, float)
            or type(key_id) is not str or not key_id or type(ledger_fp) is not str):
        return None
    admission = None
    if len(meta) == 12 and meta[11] is not None:
        got = meta[11]
        if not (isinstance(got, list) and len(got) == 3
                and type(got[0]) in (int, float)
                and all(v is None or type(v) is int for v in got[1:])):
            return None
        admission = (float(got[0]), got[1], got[2])
    due = _read_i64(data, 12)
    return QuietCounter(_read_i64(data, 4), None if due == _NOT_FILED else due, mech,
                        start, frontier, float(last_published), next_hb, announced,
                        sys.intern(key_id), sys.intern(ledger_fp), admission)


# ------------------------------------------------------------------------ the compact form

#: Bytes of a format-5 value's header: magic, offset, filed_due (format 4's, without the
#: mechanism's length).
_COMPACT_HEAD: Final = 20
#: After the header: the noise identity and the key fingerprint (raw bytes of their hex),
#: eps, delta, the gate's delta0, the last published value, and the mechanism's code.
_COMPACT_FIXED: Final = struct.Struct(">16s8sddddB")
_COMPACT_MECHANISMS: Final = ("ecc", "simecc")
_COMPACT_CALIBRATIONS: Final = ("paper", "tight")
_HEX: Final = frozenset("0123456789abcdef")


def _varints(values: Iterable[int]) -> bytes:
    out = bytearray()
    for v in values:
        if v < 0:
            raise ValueError("a varint is non-negative")
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        b = data[at]
        at += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v, at
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _is_hex(text: str, n: int) -> bool:
    return len(text) == n and _HEX.issuperset(text)


def _compact_label(cs: CounterState) -> tuple[str, str] | None:
    """(noise identity, name) of the label of `cs` where it is stored compact when
    encoded now (`_compact`), else None."""
    trail, adm, c = cs.trail, cs.admission, cs.mechanism
    if (trail is None or adm is None or adm.admitted is not None or cs.announced
            or cs.ledger_fingerprint or cs.creation or cs.inputs is None
            or len(trail) > 2 * COMPACT_EVENTS or not isinstance(c, ECC | SimECC)
            or c.checkpoints > COMPACT_CHECKPOINTS or c.base != DEFAULT_BASE
            or c.calibration not in _COMPACT_CALIBRATIONS):
        return None
    identity, slash, name = c.counter_id.partition("/")
    if not (slash and name and _is_hex(identity, 32) and _is_hex(cs.key_id, 16)):
        return None
    if (c.t != cs.frontier - cs.start_tick + 1 or cs.start_tick < 0
            or cs.next_heartbeat < 0):
        return None
    return identity, name


def _compact(cs: CounterState) -> bytes | None:
    """The format-5 value of `cs` (a key of an open family not admitted yet, with its
    inputs known: `trail`), or None where the key is not stored so (format 4 then). The
    mechanism is left out: its label, parameters and inputs determine it
    (`selection.replay`), so what is stored is the header format 4 has (offset,
    filed_due), the fields the counter value holds besides its mechanism, and the key's
    inputs as (tick gap, units) pairs, in varints."""
    got = _compact_label(cs)
    if got is None:
        return None
    identity, name = got
    trail, adm, c = cs.trail, cs.admission, cs.mechanism
    assert trail is not None and adm is not None and isinstance(c, ECC | SimECC)
    t = c.t
    code = _COMPACT_MECHANISMS.index(c.mechanism) + 2 * _COMPACT_CALIBRATIONS.index(
        c.calibration)
    pairs: list[int] = []
    last = 0
    for i in range(0, len(trail), 2):
        pairs += (trail[i] - last, trail[i + 1])
        last = trail[i]
    label = name.encode("utf-8")
    tail = orjson.dumps([list(cs.queue), sorted(cs.pending.items()), cs.inputs])
    due = _NOT_FILED if cs.filed_due is None else cs.filed_due
    return b"".join((
        monotone_header(_COUNTER_COMPACT, cs.last_offset), _i64(due),
        _COMPACT_FIXED.pack(bytes.fromhex(identity), bytes.fromhex(cs.key_id), c.eps,
                            c.delta, adm.delta0, cs.last_published, code),
        _varints((cs.start_tick, t, cs.next_heartbeat,
                  0 if adm.first is None else adm.first, len(trail) // 2, *pairs,
                  len(label))),
        label, tail))


class _Compact(NamedTuple):
    """The fields of a format-5 value, as `_compact` writes them (`trail` its inputs as
    [tick, units, ...]; `rest` the name's bytes and the JSON of queue, pending, inputs)."""

    start: int
    t: int
    next_heartbeat: int
    first: int
    trail: list[int]
    pairs: bytes
    rest: bytes


def _compact_fields(data: bytes) -> _Compact:
    """The varint fields after the fixed part of a format-5 value (ValueError,
    IndexError where they are cut short)."""
    at = _COMPACT_HEAD + _COMPACT_FIXED.size
    start, at = _read_varint(data, at)
    t, at = _read_varint(data, at)
    next_hb, at = _read_varint(data, at)
    first, at = _read_varint(data, at)
    pairs_at = at
    n, at = _read_varint(data, at)
    trail: list[int] = []
    tick = 0
    for _ in range(n):
        gap, at = _read_varint(data, at)
        units, at = _read_varint(data, at)
        tick += gap
        trail += (tick, units)
    return _Compact(start, t, next_hb, first, trail, data[pairs_at:at], data[at:])


def _advance_compact(data: bytes, frontier: int, next_heartbeat: int, offset: int,
                     filed_due: int) -> bytes | None:
    """`advance_counter_value` of a format-5 value: its frontier (the tick its counter is
    replayed through), next heartbeat, offset and filed_due set. Exact for any ⊥ ticks its
    caller seals publishing nothing (short of the mechanism's next due tick): the stored
    inputs and the new tick determine the counter those ticks leave. None for a value
    with events queued or pending, or that does not parse."""
    try:
        f = _compact_fields(data)
        size, at = _read_varint(f.rest, 0)
        queue, pending, _inputs = orjson.loads(f.rest[at + size:])
    except (IndexError, ValueError, TypeError, *_ORJSON_ERRORS):
        return None
    t = frontier - f.start + 1
    if queue or pending or t < f.t or next_heartbeat < 0:
        return None
    return b"".join((monotone_header(_COUNTER_COMPACT, offset), _i64(filed_due),
                     data[_COMPACT_HEAD:_COMPACT_HEAD + _COMPACT_FIXED.size],
                     _varints((f.start, t, next_heartbeat, f.first)), f.pairs, f.rest))


def _from_compact(data: bytes, key: NoiseKey) -> CounterState:
    """The counter state of a format-5 value: its mechanism replayed from a fresh one
    through its inputs (`selection.replay`), the very state format 4 would have held.
    StateFormatError for a value that is not one."""
    try:
        offset, due = _read_i64(data, 4), _read_i64(data, 12)
        (identity, key_id, eps, delta, delta0, last_published,
         code) = _COMPACT_FIXED.unpack_from(data, _COMPACT_HEAD)
        start, t, next_hb, first, trail, _pairs, rest = _compact_fields(data)
        size, at = _read_varint(rest, 0)
        name = rest[at:at + size].decode("utf-8")
        if len(name.encode("utf-8")) != size or not name:
            raise ValueError("name cut short")
        queue, pending, inputs = orjson.loads(rest[at + size:])
        mechanism = _COMPACT_MECHANISMS[code % 2]
        calibration = _COMPACT_CALIBRATIONS[code // 2]
        counter_id = f"{identity.hex()}/{name}"
        made = registry.make(mechanism, eps, delta, key, counter_id, calibration=calibration)
        assert isinstance(made, ECC | SimECC)
        mech = replay(made, trail, t)
    except (struct.error, IndexError, ValueError, TypeError, InvalidInputError,
            InvalidParameterError, AssertionError, *_ORJSON_ERRORS):
        raise StateFormatError("operator counter state is corrupt") from None
    cs = CounterState(mech, start, next_hb, key_id=sys.intern(key_id.hex()))
    cs.frontier = start + t - 1
    cs.last_offset = offset
    cs.filed_due = None if due == _NOT_FILED else due
    cs.last_published = last_published
    try:
        if queue:
            cs.queue = deque([int(u), int(k)] for u, k in queue)
        cs.pending = {int(g): [int(u) for u in us] for g, us in pending}
        cs.inputs = DuplicateFilter((sys.intern(str(lb)), int(o)) for lb, o in inputs.items())
    except _ORJSON_ERRORS:
        raise StateFormatError("operator counter state is corrupt") from None
    cs.admission = Admission(delta0, first or None)
    cs.trail = trail
    cs.saved = data
    return cs


# ------------------------------------------------------------------------ stores


class StateStore(Protocol):
    """One partition's key-value store of state values, what a transaction reads and a
    checkpoint writes (the worker's `table.PartitionStore`, a `DictStore` offline)."""

    #: Whether `get` returns the very bytes object `set` was given (a dict does; RocksDB
    #: returns a fresh copy): what the state cache's check may keep (transaction.py).
    shares_bytes: bool

    def generation(self) -> int | None:
        """A number that stays the same between two calls only if nothing but this
        store's own `write_many` calls wrote it meanwhile (transaction.py: a cached value
        checked at a generation still equals the stored bytes while it lasts); None: the
        store cannot tell, and every load reads the stored bytes."""
        ...

    def get(self, key: str) -> bytes | None: ...

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """`get` of each key, in the order given, at once where the store can (one
        RocksDB multi-get: the values a marker writes at the deferral bound, read in key
        order)."""
        ...

    def set(self, key: str, value: bytes) -> None: ...

    def delete(self, key: str) -> None: ...

    def write_many(self, writes: Iterable[tuple[str, bytes]]) -> None:
        """Set each (key, value) in order, at once where the store can (a checkpoint's
        write plan for one partition: one RocksDB write batch). Only a transaction's
        plan (`PartitionTransaction.prepare`) is written so: it keeps the generation."""
        ...

    def scan(self, prefix: str) -> Iterator[tuple[str, bytes]]:
        """Every (key, value) whose key starts with `prefix`."""
        ...


class DictStore:
    """An in-memory StateStore that is its own commit.Stores: every partition's, durable
    as soon as written (replay, tests, benchmarks)."""

    shares_bytes = True

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def generation(self) -> int | None:
        # It keeps the very bytes: a load's check is an `is` (transaction.py).
        return None

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        get = self.get  # a subclass's get (CopyingStore's copies)
        return [get(k) for k in keys]

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: str) -> None:
        self.data.pop(key, None)

    def write_many(self, writes: Iterable[tuple[str, bytes]]) -> None:
        for key, value in writes:
            self.set(key, value)

    def scan(self, prefix: str) -> Iterator[tuple[str, bytes]]:
        return iter([(k, v) for k, v in self.data.items() if k.startswith(prefix)])

    def of(self, partition: int) -> DictStore:
        """The store of `partition`: this one (one store holds every partition's keys)."""
        return self

    async def flush(self) -> None:
        """Every write is durable once made."""


# ------------------------------------------------------------------------ codecs


class CounterFactory(Protocol):
    """Builds and restores core counters: `processor.core.registry` fulfils it."""

    def make(self, name: str, eps: float, delta: float, key: NoiseKey,
             counter_id: str) -> Counter: ...

    def restore(self, data: bytes, key: NoiseKey) -> Counter: ...


class DuplicateFilter(dict[str, int]):
    """An input duplicate filter: input source label -> the highest input offset of its
    owner's events applied. Ingest is at-least-once, so an event at or below it is a
    re-sent copy. One per counter (CounterState.inputs) and one per unit
    (bounding.UnitState.inputs): only the owner's own events make one of its events a
    duplicate. Stored as this mapping, a JSON object inside its owner's value."""

    __slots__ = ()

    def admit(self, label: str, offset: int) -> bool:
        """Whether the event at input `offset` of source `label` is new; records it if so."""
        if offset <= self.get(label, -1):
            return False
        self[label] = offset
        return True

    def adopt(self, unnamed: str, label: str) -> None:
        """The entry of a source named by its input partition alone (`unnamed`, written
        before timeline records named the input topic's identity) becomes `label`'s, the
        first identity named: re-sent events stay duplicates. A later identity (the
        topic recreated) starts afresh."""
        legacy = self.pop(unnamed, None)
        if legacy is not None:
            self[label] = legacy


class CounterState:
    """The value `c/<counter>`: one counter's mechanism and everything around it.

    `frontier` is the global tick through which this counter is sealed (its mechanism has
    processed local ticks 1..frontier - start_tick + 1); `last_offset` the last timeline
    offset applied to it (the value's offset, `stored_offset`); `pending` maps a global
    tick not yet sealed to its arrivals in timeline order; `queue` is the FIFO, run-length
    encoded as [units, run]; `next_heartbeat` is a local tick; `announced` says whether its
    ledger entry went out (at a marker, never at an event); `filed_due` is the earliest
    tick of the due wheel it is filed under (None: not filed); `key_id` is the public
    fingerprint of the noise key its mechanism was made with; `ledger_fingerprint` is the
    configuration fingerprint its last ledger entry named ("" before its first),
    `creation` that entry's creation tag ("" before it was announced); `inputs` the
    counter's input duplicate filter (input source -> highest input offset of its events
    applied, as PartitionState.input_offsets names sources; None in a value written
    before the filter was per counter: the operator then starts it from the partition's
    `legacy_inputs`); `admission` the gate's state of an open family's key
(families.Admission; None for every other counter, and then not encoded, so a declared
counter's value is what it always was); `saved` (not
    encoded) is the bytes this object equals in the store (or their digest, which the
    transaction puts in their place: transaction.py), None once changed and not yet
    encoded; `next_due`/`next_due_known` (not encoded) remember mechanism.next_due() for
    the operator until the mechanism takes an input; `busy_until` (not encoded) is the
    global tick until which the operator keeps it decoded since it last took an input;
    `trail`, a key's inputs since its counter was made ([local tick, units, ...], what
    the operator dequeued into its mechanism), while it can be stored compact (format 5:
    `_compact`), None for every other counter and once it cannot (more inputs or
    checkpoints, an admission, a value decoded from format 4): encoded only as format 5.
    """

    __slots__ = ("admission", "announced", "busy_until", "creation", "filed_due", "frontier",
                 "inputs", "key_id", "last_offset", "last_published", "ledger_fingerprint",
                 "mechanism", "next_due", "next_due_known", "next_heartbeat", "pending",
                 "queue", "saved", "start_tick", "trail")

    def __init__(self, mechanism: Counter, start_tick: int, next_heartbeat: int, *,
                 key_id: str) -> None:
        if not key_id:
            raise ValueError("a counter state is bound to a noise key fingerprint")
        self.mechanism = mechanism
        self.key_id = key_id
        self.ledger_fingerprint = ""
        self.creation = ""
        self.start_tick = start_tick
        self.frontier = start_tick - 1
        self.last_offset = -1
        self.queue: deque[list[int]] = _NO_QUEUE
        self.pending: dict[int, list[int]] = {}
        self.last_published = 0.0
        self.next_heartbeat = next_heartbeat
        self.announced = False
        self.filed_due: int | None = None
        self.inputs: DuplicateFilter | None = DuplicateFilter()
        self.saved: bytes | None = None
        self.next_due: int | None = None
        self.next_due_known = False
        self.admission: Admission | None = None
        self.busy_until = 0
        self.trail: list[int] | None = None

    def to_bytes(self) -> bytes:
        if self.trail is not None:
            compact = _compact(self)
            if compact is not None:
                self.saved = compact
                return compact
            # Not compact now, never again (more inputs or checkpoints, an admission):
            # its inputs need not be kept.
            self.trail = None
        mech = self.mechanism.to_bytes()
        fields: list[object] = [
            self.start_tick, self.frontier, list(self.queue),
            sorted(self.pending.items()), self.last_published, self.next_heartbeat,
            self.announced, self.key_id, self.ledger_fingerprint, self.creation,
            self.inputs]
        if self.admission is not None:
            a = self.admission
            fields.append([a.delta0, a.first, a.admitted])
        meta = orjson.dumps(fields)
        due = _NOT_FILED if self.filed_due is None else self.filed_due
        raw = _counter_bytes(self.last_offset, due, mech, meta)
        self.saved = raw
        return raw

    @classmethod
    def from_bytes(cls, data: bytes, factory: CounterFactory, key: NoiseKey) -> CounterState:
        data = bytes(data)
        magic = data[:4]
        if magic == _COUNTER_V2:
            raise StateVersionError("an operator counter state", 2, _COUNTER_MAGIC[3])
        if magic == _COUNTER_COMPACT:
            return _from_compact(data, key)
        try:
            if magic == _COUNTER_MAGIC and len(data) >= _COUNTER_HEAD:
                last_offset, due = _read_i64(data, 4), _read_i64(data, 12)
                filed_due: int | None = None if due == _NOT_FILED else due
                mech, rest = _counter_parts(data)
                meta = orjson.loads(rest)
                # Values written before the per-counter filter have ten fields.
                if len(meta) == 10:
                    meta.append(None)
                if len(meta) == 11:
                    meta.append(None)
                (start, frontier, queue, pending, last_published, next_hb, announced,
                 key_id, ledger_fp, creation, inputs, admission) = meta
            elif magic == _COUNTER_V3 and len(data) >= 8:
                n = int.from_bytes(data[4:8], "big")
                mech, rest = data[8:8 + n], data[8 + n:]
                (start, frontier, last_offset, queue, pending, last_published, next_hb,
                 announced, filed_due, key_id, ledger_fp, creation) = orjson.loads(rest)
                inputs = admission = None
            else:
                raise StateFormatError("not an operator counter state (magic/version)")
            if not (type(key_id) is str and key_id and type(ledger_fp) is str
                    and type(creation) is str):
                raise TypeError
            # Interned: every counter of a worker names the same few fingerprints, and a
            # copy each costs about 180 bytes a counter.
            self = cls(factory.restore(mech, key), int(start), int(next_hb),
                       key_id=sys.intern(key_id))
            self.ledger_fingerprint = sys.intern(ledger_fp)
            self.creation = creation
            self.frontier = int(frontier)
            self.last_offset = int(last_offset)
            if queue:
                self.queue = deque([int(u), int(k)] for u, k in queue)
            self.pending = {int(g): [int(u) for u in us] for g, us in pending}
            self.last_published = float(last_published)
            self.announced = bool(announced)
            self.filed_due = None if filed_due is None else int(filed_due)
            # Interned: a worker's counters name the same few input partitions.
            self.inputs = (None if inputs is None else DuplicateFilter(
                (sys.intern(str(lb)), int(o)) for lb, o in inputs.items()))
            if admission is not None:
                delta0, first, admitted = admission
                self.admission = Admission(float(delta0), None if first is None else int(first),
                                           None if admitted is None else int(admitted))
        except StateFormatError:
            raise
        except _ORJSON_ERRORS:
            raise StateFormatError("operator counter state is corrupt") from None
        if self.mechanism.t != self.frontier - self.start_tick + 1:
            raise StateFormatError("operator counter state: mechanism tick != frontier")
        # A format-3 value is not what this object encodes to: leave `saved` unset so
        # that the cache re-reads, and a write converts it.
        self.saved = data if magic == _COUNTER_MAGIC else None
        return self

    def push_all(self, arrivals: Iterable[int]) -> None:
        """Queue `arrivals` in order (run-length: equal neighbours share one entry); one
        call per tick's arrivals keeps the per-event cost to the loop itself."""
        queue = self.queue
        if queue is _NO_QUEUE:
            queue = self.queue = deque()
        for units in arrivals:
            if queue and queue[-1][0] == units:
                queue[-1][1] += 1
            else:
                queue.append([units, 1])

    def pop(self) -> int:
        head = self.queue[0]
        head[1] -= 1
        if head[1] == 0:
            self.queue.popleft()
            if not self.queue:
                self.queue = _NO_QUEUE
        return head[0]


class PartitionState:
    """The value `p/<partition>`: `applied` (the last timeline offset applied to the
    partition: the value's offset, `stored_offset`), `frontier` (global tick through
    which the partition is sealed), `marker_offset` (timeline offset of the last marker
    applied), `config_fingerprint` (the configuration the partition last ran under; None:
    none yet), `input_offsets` (input source -> highest input offset applied to any
    counter: the partition's progress, no filter; a source is an input partition, under
    the input topic's identity when the timeline record names it, so a recreated topic is
    a new source), `legacy_inputs` (the partition's duplicate filter as it stood when it
    was shared by all its counters: where a counter's own filter, CounterState.inputs,
    starts for a value written before it), `key_id` (the public fingerprint of the noise
    key the partition's state was made under; None only before the operator first stages
    it), `privacy_unit` (the mode its counters counted under, "event" or "user"; None in a
    value written before it was recorded)."""

    __slots__ = ("applied", "config_fingerprint", "frontier", "input_offsets", "key_id",
                 "legacy_inputs", "marker_offset", "privacy_unit", "saved")

    def __init__(self) -> None:
        self.applied = -1
        self.frontier = -(1 << 62)
        self.marker_offset = -1
        self.config_fingerprint: str | None = None
        self.input_offsets: dict[str, int] = {}
        self.legacy_inputs: dict[str, int] = {}
        self.privacy_unit: str | None = None
        self.key_id: str | None = None
        self.saved: bytes | None = None

    def to_bytes(self) -> bytes:
        if not self.key_id:
            raise ValueError("a partition state is bound to a noise key fingerprint")
        raw = monotone_header(_PARTITION_MAGIC, self.applied) + orjson.dumps(
            [self.frontier, self.marker_offset, self.config_fingerprint,
             sorted(self.input_offsets.items()), self.key_id,
             sorted(self.legacy_inputs.items()), self.privacy_unit])
        self.saved = raw
        return raw

    @classmethod
    def from_bytes(cls, data: bytes) -> PartitionState:
        data = bytes(data)
        magic = data[:4]
        if magic == _PARTITION_V2:
            raise StateVersionError("an operator partition state", 2, _PARTITION_MAGIC[3])
        self = cls()
        try:
            if magic == _PARTITION_MAGIC and len(data) >= 12:
                self.applied = _read_i64(data, 4)
                body = data[12:]
            elif magic == _PARTITION_V3:
                body = data[4:]
            else:
                raise StateFormatError("not an operator partition state (magic/version)")
            fields = orjson.loads(body)
            if len(fields) == 5:
                # Written while the filter was shared: it is where the counters' own
                # filters start.
                fields.append(fields[3])
            if len(fields) == 6:
                fields.append(None)  # the mode not recorded
            frontier, marker_offset, fingerprint, offsets, key_id, legacy, mode = fields
            if type(key_id) is not str or not key_id:
                raise TypeError
            self.key_id = key_id
            self.frontier = int(frontier)
            self.marker_offset = int(marker_offset)
            if magic == _PARTITION_V3:
                self.applied = self.marker_offset
            self.config_fingerprint = None if fingerprint is None else str(fingerprint)
            self.input_offsets = {str(p): int(o) for p, o in offsets}
            self.legacy_inputs = {str(p): int(o) for p, o in legacy}
            if mode is not None and type(mode) is not str:
                raise TypeError
            self.privacy_unit = mode
        except StateFormatError:
            raise
        except _ORJSON_ERRORS:
            raise StateFormatError("operator partition state is corrupt") from None
        self.saved = data if magic == _PARTITION_MAGIC else None
        return self


class DueWheel:
    """Which counters of one partition a marker through n must look at: names filed by
    global tick, in memory only (rebuilt from the counters' `filed_due` at load). A name
    may be filed at several ticks (a stale entry is harmless: the marker re-checks it)."""

    __slots__ = ("_buckets", "_ticks")

    def __init__(self) -> None:
        self._buckets: dict[int, dict[str, None]] = {}
        self._ticks: list[int] = []  # a heap of the keys of _buckets

    def file(self, name: str, tick: int) -> None:
        bucket = self._buckets.get(tick)
        if bucket is None:
            self._buckets[tick] = {name: None}
            heapq.heappush(self._ticks, tick)
        else:
            bucket[name] = None

    def take_through(self, n: int) -> set[str]:
        """Remove and return every name filed at a tick <= n."""
        names: set[str] = set()
        ticks, buckets = self._ticks, self._buckets
        while ticks and ticks[0] <= n:
            names.update(buckets.pop(heapq.heappop(ticks)))
        return names

    def due_through(self, n: int, limit: int) -> int:
        """How many names are filed at ticks <= n (a name filed at several counts at
        each), counted until the count exceeds `limit`."""
        count = 0
        for tick, bucket in self._buckets.items():
            if tick <= n:
                count += len(bucket)
                if count > limit:
                    break
        return count

    def ticks(self) -> list[int]:
        """The filed ticks, ascending."""
        return sorted(self._ticks)

    def largest(self) -> int:
        """The most names filed at one tick (0 if none)."""
        return max(map(len, self._buckets.values()), default=0)

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())
