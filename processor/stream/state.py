"""What the operator stores, and where: the store protocol, the buffered overlay a batch
is applied to, and the codecs of every stored value. No Kafka, no Faust.

Key layout (all values bytes, each codec with its own magic and version):

- `c/<counter>`       CounterState: the mechanism, its FIFO queue, pending arrivals, ...,
                      the fingerprint of the noise key its mechanism draws from, and what
                      its last ledger entry said (configuration fingerprint, creation tag).
- `p/<partition>`     PartitionState: sealed frontier, last marker offset, the
                      configuration fingerprint the declared counters were filed under,
                      the duplicate filter (input partition -> highest input offset), and
                      the noise key fingerprint the partition's state was made under.
- `u/<partition>/<g>` DueBucket: counters that may have something to do at global tick g.
- `w/<partition>`     DueDirectory: sorted ticks that may have a non-empty bucket.

The buckets and the directory are the due wheel: a marker through n reads the buckets
of the directory's ticks <= n, and nothing rewrites an O(counters) value. The directory
is its own value, not part of `p/`, because it must be saved before the counters it
indexes while `p/` is saved last; it may still list a tick whose bucket a marker
consumed (the next marker drops it), never a bucket that is not saved yet.

The noise key is bound to the state (issue 11 item 1): both the partition value (read
first by every timeline record, so a wrong key is caught before any counter is touched)
and each counter value (what the key actually keys: its mechanism's noise positions; it
also covers a counter written before its partition value, a crash inside the first batch)
carry the key's public fingerprint, and the operator refuses a key that is not the
stored one (`operator.KeyMismatchError`). Values of version 2, written before the
fingerprint was stored, are refused with `StateVersionError`: no key can be verified
against them, and adopting whichever key comes first would let exactly the silent key
change through that the binding exists to stop.

Write order of one batch (`BufferedStore.writes`; see commit.BatchCommit): the due-wheel
values first (an index entry may be early, never late), then the counter states, then
the deletions of consumed buckets and the partition value last.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import pairwise
from typing import Final, Protocol

import orjson

from processor.core.api import Counter
from processor.core.errors import StateFormatError
from processor.core.rng import NoiseKey

_COUNTER_MAGIC: Final = b"DPC\x03"
_PARTITION_MAGIC: Final = b"DPP\x03"
#: Version 2 of both: the same values without the noise key's fingerprint.
_COUNTER_V2: Final = b"DPC\x02"
_PARTITION_V2: Final = b"DPP\x02"
_BUCKET_MAGIC: Final = b"DPU\x01"
_DIRECTORY_MAGIC: Final = b"DPW\x01"

_ORJSON_ERRORS = (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError)


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


def counter_key(counter: str) -> str:
    return f"c/{counter}"


def partition_key(partition: int) -> str:
    return f"p/{partition}"


def bucket_key(partition: int, tick: int) -> str:
    return f"u/{partition}/{tick}"


def directory_key(partition: int) -> str:
    return f"w/{partition}"


# ------------------------------------------------------------------------ stores


class StateStore(Protocol):
    """The key-value store the operator keeps all its state in (a Faust table online)."""

    def get(self, key: str) -> bytes | None: ...

    def set(self, key: str, value: bytes) -> None: ...

    def delete(self, key: str) -> None: ...


class DictStore:
    """An in-memory StateStore (replay, tests, benchmarks)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: str) -> None:
        self.data.pop(key, None)


class Encodable(Protocol):
    """A decoded value that encodes itself (CounterState, PartitionState, ...)."""

    def to_bytes(self) -> bytes: ...


class BufferedStore:
    """An overlay over a StateStore that writes nothing until the commit does.

    `unsaved` holds encoded values (None: deleted); `staged` holds decoded values the
    operator changed in this batch, encoded once, when the commit asks for `writes()`.
    Reads see staged, then unsaved values, then the store below.
    """

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner
        self.unsaved: dict[str, bytes | None] = {}
        self.staged: dict[str, Encodable] = {}
        #: partition -> ticks whose buckets this overlay deletes (the operator keeps it:
        #: a marker skips them without building their keys).
        self.consumed: dict[int, set[int]] = {}

    def get(self, key: str) -> bytes | None:
        obj = self.staged.get(key)
        if obj is not None:
            return obj.to_bytes()
        if key in self.unsaved:
            return self.unsaved[key]
        return self.inner.get(key)

    def set(self, key: str, value: bytes) -> None:
        self.staged.pop(key, None)
        self.unsaved[key] = value

    def delete(self, key: str) -> None:
        self.staged.pop(key, None)
        self.unsaved[key] = None

    def stage(self, key: str, obj: Encodable) -> None:
        """`obj` is the new value of `key` (encoded at commit; later changes to it count)."""
        self.unsaved.pop(key, None)
        self.staged[key] = obj

    def writes(self) -> list[tuple[str, bytes | None]]:
        """Every unsaved value in the crash-safe write order (None: delete): due-wheel
        values, then counter states, then deletions, then partition values. Encodes each
        staged value once."""
        for key, obj in self.staged.items():
            self.unsaved[key] = obj.to_bytes()
        self.staged.clear()
        index: list[tuple[str, bytes | None]] = []
        counters: list[tuple[str, bytes | None]] = []
        last: list[tuple[str, bytes | None]] = []
        deletes: list[tuple[str, bytes | None]] = []
        directory: list[tuple[str, bytes | None]] = []
        for key, value in self.unsaved.items():
            if value is None:
                deletes.append((key, None))
            elif key[0] == "u":
                index.append((key, value))
            elif key[0] == "w":
                directory.append((key, value))
            elif key[0] == "c":
                counters.append((key, value))
            else:
                last.append((key, value))
        # Buckets before the directory that lists them, so a listed tick whose bucket is
        # missing was consumed (a marker may drop it), never "not written yet".
        return index + directory + counters + deletes + last

    def clear(self) -> None:
        self.unsaved.clear()
        self.staged.clear()
        self.consumed.clear()


def write_all(store: StateStore, writes: list[tuple[str, bytes | None]]) -> None:
    """Apply `BufferedStore.writes()` to `store` in order (no crash points)."""
    for key, value in writes:
        if value is None:
            store.delete(key)
        else:
            store.set(key, value)


# ------------------------------------------------------------------------ codecs


class CounterFactory(Protocol):
    """Builds and restores core counters: `processor.core.registry` fulfils it."""

    def make(self, name: str, eps: float, delta: float, key: NoiseKey,
             counter_id: str) -> Counter: ...

    def restore(self, data: bytes, key: NoiseKey) -> Counter: ...


class CounterState:
    """The value `c/<counter>`: one counter's mechanism and everything around it.

    `frontier` is the global tick through which this counter is sealed (its mechanism has
    processed local ticks 1..frontier - start_tick + 1); `pending` maps a global tick not
    yet sealed to its arrivals in timeline order; `queue` is the FIFO, run-length encoded
    as [units, run]; `next_heartbeat` is a local tick; `announced` says whether its ledger
    entry went out (at a marker, never at an event); `filed_due` is the earliest tick of
    the due wheel it is filed under (None: not filed); `key_id` is the public fingerprint
    of the noise key its mechanism was made with; `ledger_fingerprint` is the configuration
    fingerprint its last ledger entry named ("" before its first), `creation` that entry's
    creation tag ("" before it was announced); `saved` (not encoded) is the bytes
    this object equals in the store, None once changed and not yet encoded;
    `next_due`/`next_due_known` (not encoded) remember mechanism.next_due() for the
    operator until the mechanism takes an input.
    """

    __slots__ = ("announced", "creation", "filed_due", "frontier", "key_id", "last_offset",
                 "last_published", "ledger_fingerprint", "mechanism", "next_due",
                 "next_due_known", "next_heartbeat", "pending", "queue", "saved",
                 "start_tick")

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
        self.queue: deque[list[int]] = deque()
        self.pending: dict[int, list[int]] = {}
        self.last_published = 0.0
        self.next_heartbeat = next_heartbeat
        self.announced = False
        self.filed_due: int | None = None
        self.saved: bytes | None = None
        self.next_due: int | None = None
        self.next_due_known = False

    def to_bytes(self) -> bytes:
        mech = self.mechanism.to_bytes()
        meta = orjson.dumps([
            self.start_tick, self.frontier, self.last_offset, list(self.queue),
            sorted(self.pending.items()), self.last_published, self.next_heartbeat,
            self.announced, self.filed_due, self.key_id, self.ledger_fingerprint,
            self.creation])
        raw = b"".join((_COUNTER_MAGIC, len(mech).to_bytes(4, "big"), mech, meta))
        self.saved = raw
        return raw

    @classmethod
    def from_bytes(cls, data: bytes, factory: CounterFactory, key: NoiseKey) -> CounterState:
        data = bytes(data)
        if data[:4] == _COUNTER_V2:
            raise StateVersionError("an operator counter state", 2, _COUNTER_MAGIC[3])
        if data[:4] != _COUNTER_MAGIC or len(data) < 8:
            raise StateFormatError("not an operator counter state (magic/version)")
        n = int.from_bytes(data[4:8], "big")
        mech, rest = data[8:8 + n], data[8 + n:]
        try:
            (start, frontier, last_offset, queue, pending, last_published, next_hb,
             announced, filed_due, key_id, ledger_fp, creation) = orjson.loads(rest)
            if not (type(key_id) is str and key_id and type(ledger_fp) is str
                    and type(creation) is str):
                raise TypeError
            self = cls(factory.restore(mech, key), int(start), int(next_hb), key_id=key_id)
            self.ledger_fingerprint = ledger_fp
            self.creation = creation
            self.frontier = int(frontier)
            self.last_offset = int(last_offset)
            self.queue = deque([int(u), int(k)] for u, k in queue)
            self.pending = {int(g): [int(u) for u in us] for g, us in pending}
            self.last_published = float(last_published)
            self.announced = bool(announced)
            self.filed_due = None if filed_due is None else int(filed_due)
        except StateFormatError:
            raise
        except _ORJSON_ERRORS:
            raise StateFormatError("operator counter state is corrupt") from None
        if self.mechanism.t != self.frontier - self.start_tick + 1:
            raise StateFormatError("operator counter state: mechanism tick != frontier")
        self.saved = data
        return self

    def push(self, units: int) -> None:
        self.push_all((units,))

    def push_all(self, arrivals: Iterable[int]) -> None:
        """Queue `arrivals` in order (run-length: equal neighbours share one entry); one
        call per tick's arrivals keeps the per-event cost to the loop itself."""
        queue = self.queue
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
        return head[0]


class PartitionState:
    """The value `p/<partition>`: `frontier` (global tick through which the partition is
    sealed), `marker_offset` (timeline offset of the last marker applied),
    `config_fingerprint` (the configuration whose declared counters are filed in the due
    wheel; None: none filed yet), `input_offsets` (the duplicate filter: input partition ->
    highest input offset applied), `key_id` (the public fingerprint of the noise key the
    partition's state was made under; None only before the operator first stages it)."""

    __slots__ = ("config_fingerprint", "frontier", "input_offsets", "key_id", "marker_offset",
                 "saved")

    def __init__(self) -> None:
        self.frontier = -(1 << 62)
        self.marker_offset = -1
        self.config_fingerprint: str | None = None
        self.input_offsets: dict[int, int] = {}
        self.key_id: str | None = None
        self.saved: bytes | None = None

    def to_bytes(self) -> bytes:
        if not self.key_id:
            raise ValueError("a partition state is bound to a noise key fingerprint")
        raw = _PARTITION_MAGIC + orjson.dumps(
            [self.frontier, self.marker_offset, self.config_fingerprint,
             sorted(self.input_offsets.items()), self.key_id])
        self.saved = raw
        return raw

    @classmethod
    def from_bytes(cls, data: bytes) -> PartitionState:
        data = bytes(data)
        if data[:4] == _PARTITION_V2:
            raise StateVersionError("an operator partition state", 2, _PARTITION_MAGIC[3])
        if data[:4] != _PARTITION_MAGIC:
            raise StateFormatError("not an operator partition state (magic/version)")
        self = cls()
        try:
            frontier, marker_offset, fingerprint, offsets, key_id = orjson.loads(data[4:])
            if type(key_id) is not str or not key_id:
                raise TypeError
            self.key_id = key_id
            self.frontier = int(frontier)
            self.marker_offset = int(marker_offset)
            self.config_fingerprint = None if fingerprint is None else str(fingerprint)
            self.input_offsets = {int(p): int(o) for p, o in offsets}
        except _ORJSON_ERRORS:
            raise StateFormatError("operator partition state is corrupt") from None
        self.saved = data
        return self


class DueBucket:
    """The value `u/<partition>/<tick>`: names of counters that may be due at the tick
    (insertion order, no repeats; a stale name is harmless, the marker re-checks it)."""

    __slots__ = ("names",)

    def __init__(self, names: dict[str, None] | None = None) -> None:
        self.names: dict[str, None] = names if names is not None else {}

    def to_bytes(self) -> bytes:
        return _BUCKET_MAGIC + orjson.dumps(list(self.names))

    @classmethod
    def from_bytes(cls, data: bytes) -> DueBucket:
        data = bytes(data)
        if data[:4] != _BUCKET_MAGIC:
            raise StateFormatError("not an operator due bucket (magic/version)")
        try:
            names = orjson.loads(data[4:])
            if not all(isinstance(n, str) for n in names):
                raise TypeError
            return cls(dict.fromkeys(names))
        except _ORJSON_ERRORS:
            raise StateFormatError("operator due bucket is corrupt") from None


class DueDirectory:
    """The value `w/<partition>`: sorted ticks that may have a non-empty bucket; `saved`
    as in CounterState (the operator caches the decoded directory)."""

    __slots__ = ("saved", "ticks")

    def __init__(self, ticks: list[int] | None = None) -> None:
        self.ticks: list[int] = ticks if ticks is not None else []
        self.saved: bytes | None = None

    def add(self, tick: int) -> bool:
        """File `tick`; False if it was there already."""
        ticks = self.ticks
        if ticks:
            last = ticks[-1]
            if last < tick:
                ticks.append(tick)
                return True
            if last == tick:  # the common refile: every counter a marker seals, at n + 1
                return False
        i = bisect_left(ticks, tick)
        if i < len(ticks) and ticks[i] == tick:
            return False
        insort(ticks, tick)
        return True

    def through(self, n: int) -> Iterator[int]:
        """The filed ticks <= n, ascending."""
        for t in self.ticks:
            if t > n:
                return
            yield t

    def to_bytes(self) -> bytes:
        raw = _DIRECTORY_MAGIC + orjson.dumps(self.ticks)
        self.saved = raw
        return raw

    @classmethod
    def from_bytes(cls, data: bytes) -> DueDirectory:
        data = bytes(data)
        if data[:4] != _DIRECTORY_MAGIC:
            raise StateFormatError("not an operator due directory (magic/version)")
        try:
            ticks = orjson.loads(data[4:])
        except orjson.JSONDecodeError:
            raise StateFormatError("operator due directory is corrupt") from None
        if type(ticks) is not list or not all(type(t) is int for t in ticks):
            raise StateFormatError("operator due directory is corrupt")
        if any(a >= b for a, b in pairwise(ticks)):
            raise StateFormatError("operator due directory is not sorted")
        self = cls(ticks)
        self.saved = data
        return self

