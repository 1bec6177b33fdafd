"""A partition transaction: what one checkpoint reads from and changes in one partition's
store, through typed slots. No Kafka, no Faust.

A `Slot` is one kind of stored value: its key function (a prefix and an identifier), its
codec (decode, encode), the check every decoded value passes before anyone uses it, its
rank in the write plan and how many decoded values the cache keeps. The operator declares
its slots (state.py's codecs, its own checks); everything else is generic.

`PartitionTransaction`: `load(slot, ident)` returns the staged value, else the cached
decoded value while the store still holds exactly the bytes it was decoded from or
encoded to (`saved`), else the value decoded from the store (checked, then cached);
`stage(slot, ident, value)` makes `value` the new value of its key, encoded once when the
plan is made, however many records changed it meanwhile; `scan(slot)` lists a slot's
identifiers with their staged values or stored bytes, decoding nothing;
`release(slot, ident)` says the value need not stay decoded: a staged one is encoded at
once and only its bytes wait for the plan (a load decodes them again); any other leaves
the cache when the plan is made.
`prepare()`
returns the write plan: every staged value, encoded, by slot rank (a partition value
after the counter values it guards), in staging order within a slot.
The caller writes the plan, makes it durable, then calls `complete()`; on any failure
`fail()`, and drops the cache (`StateCache.clear`): a value changed in memory but never
written must not be served again.

Status: started (loads and stages) -> prepared (the plan is out) -> complete; started or
prepared -> failed. Anything else raises `TransactionStatusError`.

`StateCache` holds the decoded values across transactions (one per operator): a section
per slot, LRU-bounded by the slot's `cache` (None: unbounded, no LRU bookkeeping). It is
never the truth: a value is served only while the store holds its `saved` bytes.
Restoring from bytes and continuing equals never stopping (the Counter contract), so
reusing the object equals decoding the stored bytes again.

What `saved` holds depends on the store (`StateStore.shares_bytes`). A `DictStore` keeps
the very bytes objects it is given and returns them: `saved` is those bytes (shared with
the store, so free, and an `is` answers the check). Any other store (RocksDB) returns a
fresh copy at every get, so bytes in `saved` would be a second copy of every cached value
(about 1 KB a counter): the transaction replaces them by a 16-byte digest (SHA-256,
truncated) when it decodes or encodes a value of a slot that caches values, and a load
compares the digest of the stored bytes (equal digests: equal bytes, but for a collision
of a 128-bit hash). The codecs
always set `saved` to the bytes; a slot that caches nothing (cache 0) keeps them there.

Reading the stored bytes to compare them costs a RocksDB get and a digest per load (about
10 us of CPU in the worker, twice per event at a steady load). A store that can say
whether anything reached it since (`StateStore.generation`: RocksDB's sequence number,
which every write to the database moves, whoever writes) lets a load skip the read: the
cache notes, per value, the store's generation when the value was last checked against
the stored bytes or prepared for a plan (`StateCache.checked`), and a load serves the
cached value without reading while the store's generation is still that one. A store
keeps its generation only across its own `write_many` calls, which write the plans of
transactions over this cache, and only when the sequence number moved by exactly the
plan's writes (nothing else landed meanwhile); any other write, by anyone (a restore,
a standby copy, a `set`, a database reopened), moves the generation, and the loads after
it compare the bytes again. A store that cannot tell returns None: every load reads.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NoReturn, Protocol, TypeVar

from processor.core.errors import StateFormatError
from processor.stream.model.state import StateStore


class Stored(Protocol):
    """A decoded value: `saved` is the bytes it equals in the store, or their digest (the
    module doc; None: changed since, or never stored); encoding it sets `saved` to the
    bytes."""

    saved: bytes | None


Id = TypeVar("Id", str, int)  # the identifier of a value within its slot
V = TypeVar("V", bound=Stored)


@dataclass(frozen=True, eq=False)
class Slot(Generic[Id, V]):
    """One kind of stored value. Its key is `prefix` + the identifier; `decode` raises
    StateFormatError on bytes that are not such a value; `check(ident, value)` runs on
    every decoded value before it is used or cached (it raises to refuse it); `encode`
    returns the bytes and sets the value's `saved`. `rank`: the write plan writes lower
    ranks first. `cache`: how many decoded values to keep (LRU), None for all."""

    prefix: str
    rank: int
    decode: Callable[[bytes], V]
    encode: Callable[[V], bytes]
    check: Callable[[Id, V], None]
    cache: int | None

    def key(self, ident: Id) -> str:
        return f"{self.prefix}{ident}"


class TransactionStatusError(RuntimeError):
    """A transaction used out of order (a load after its plan was made, a second plan, a
    completion without a plan, anything after it completed or failed)."""


class Status(enum.Enum):
    STARTED = "started"
    PREPARED = "prepared"
    COMPLETE = "complete"
    FAILED = "failed"


_ALLOWED: dict[Status, frozenset[Status]] = {
    Status.STARTED: frozenset({Status.PREPARED, Status.FAILED}),
    Status.PREPARED: frozenset({Status.COMPLETE, Status.FAILED}),
    Status.COMPLETE: frozenset(),
    Status.FAILED: frozenset(),
}


def digest(raw: bytes) -> bytes:
    """What `saved` holds of a value's bytes when the store does not keep them itself.
    SHA-256 rather than BLAKE2b: about 1 us for a 1 KB counter instead of 1.4-2 (the CPU's
    SHA extensions); a load pays it once per counter and checkpoint."""
    return hashlib.sha256(raw).digest()[:16]


#: Generation numbers, never reused within a process: a store made anew (a new
#: assignment) never repeats an old store's number.
_GENERATIONS = itertools.count(1)


class StoreGeneration:
    """A store's generation from its database's write sequence number (`now`), kept
    across the store's own plan writes (`wrote`), moved by anything else.

    `handle` is the open database (a reopened one is another object: a new generation);
    `seq` its sequence number, which every write to the database moves by the number of
    keys it wrote, whoever wrote them (RocksDB's `latest_sequence_number`)."""

    __slots__ = ("_handle", "_seq", "value")

    def __init__(self) -> None:
        self._handle: object = None
        self._seq: int | None = None
        self.value = next(_GENERATIONS)

    def now(self, handle: object, seq: int) -> int:
        """The generation while the database is `handle` at sequence number `seq`: the
        same as at the last call if neither moved since but by `wrote`, else a new one."""
        if handle is not self._handle or seq != self._seq:
            self._handle = handle
            self._seq = seq
            self.value = next(_GENERATIONS)
        return self.value

    def wrote(self, handle: object, before: int, after: int, n: int) -> None:
        """The store wrote `n` keys in one batch: `before` and `after` are the sequence
        numbers read just before and just after. The generation stays only if nothing
        had moved the database before (`now`) and the batch alone moved it after."""
        self.now(handle, before)
        if after == before + n:
            self._seq = after
        else:
            self.now(handle, after)


class StateCache:
    """Decoded values across transactions, a section per slot (see the module doc).
    `checked`: store key -> the store generation at which its cached value was last
    known to equal the stored bytes (only for values that are in a section)."""

    def __init__(self) -> None:
        self._sections: dict[Slot[Any, Any], OrderedDict[str, Any]] = {}
        self.checked: dict[str, int] = {}

    def section(self, slot: Slot[Id, V]) -> OrderedDict[str, V]:
        got = self._sections.get(slot)
        if got is None:
            got = self._sections[slot] = OrderedDict()
        return got

    def remember(self, slot: Slot[Id, V], key: str, value: V,
                 checked: int | None = None) -> None:
        """Keep `value` as the decoded value of `key`; `checked`: the store generation
        at which it equals the stored bytes (None: not known)."""
        bound = slot.cache
        if bound is not None and bound <= 0:
            return
        entries = self.section(slot)
        entries[key] = value
        if checked is None:
            self.checked.pop(key, None)
        else:
            self.checked[key] = checked
        if bound is not None:
            entries.move_to_end(key)
            if len(entries) > bound:
                evicted, _value = entries.popitem(last=False)
                self.checked.pop(evicted, None)

    def clear(self) -> None:
        # In place: open transactions hold their sections.
        for entries in self._sections.values():
            entries.clear()
        self.checked.clear()


class PartitionTransaction:
    """The loads and staged changes of one partition's store until a checkpoint (see the
    module doc). `slots`: every slot a value may be staged under."""

    __slots__ = ("_cache", "_checked", "_digests", "_order", "_released", "_slots", "_status",
                 "_store")

    def __init__(self, store: StateStore, slots: Sequence[Slot[Any, Any]],
                 cache: StateCache) -> None:
        self._store = store
        # Whether `saved` holds digests rather than the bytes (the module doc).
        self._digests = not store.shares_bytes
        self._cache = cache
        self._checked = cache.checked
        self._order = sorted(slots, key=lambda s: s.rank)
        # Per slot: its staged values (key -> value) and its cache section.
        self._slots: dict[Slot[Any, Any], tuple[dict[str, Any], OrderedDict[str, Any]]] = {
            s: ({}, cache.section(s)) for s in slots}
        # Values released unstaged (`release`): key -> its cache section, which the plan
        # drops them from.
        self._released: dict[str, OrderedDict[str, Any]] = {}
        self._status = Status.STARTED

    @property
    def status(self) -> Status:
        return self._status

    @property
    def staged(self) -> bool:
        """Whether any value is staged (the write plan would not be empty)."""
        return any(staged for staged, _entries in self._slots.values())

    def load(self, slot: Slot[Id, V], ident: Id) -> V | None:
        """The value of `ident` in `slot` as this transaction sees it (None: none stored
        or staged). A decoded value that fails its slot's check raises, and is not kept;
        a StateFormatError carries the store key."""
        if self._status is not Status.STARTED:
            self._refuse("load")
        key = slot.key(ident)
        staged, entries = self._slots[slot]
        value: V | bytes | None = staged.get(key)
        if value is not None:
            if type(value) is not bytes:
                return value  # type: ignore[return-value]
            # Released after it was staged: still staged, as an object again.
            value = slot.decode(value)
            slot.check(ident, value)
            value.saved = None
            staged[key] = value
            return value
        cached: V | None = entries.get(key)
        # Read before the get: a write landing between the two moves the generation
        # after this one, and the next load compares again. A slot that caches nothing
        # has no use for it (the units' values: one load per event).
        generation = self._store.generation() if slot.cache != 0 else None
        if (cached is not None and generation is not None and cached.saved is not None
                and self._checked.get(key) == generation):
            if slot.cache is not None:
                entries.move_to_end(key)
            return cached
        raw = self._store.get(key)
        if raw is None:
            entries.pop(key, None)
            self._checked.pop(key, None)
            return None
        # A slot that caches nothing keeps the bytes its codec set in `saved`: the value
        # lives until the checkpoint at most, so no digest is worth computing.
        held = digest(raw) if self._digests and slot.cache != 0 else raw
        if cached is not None:
            saved = cached.saved
            if saved is not None and (saved is held or saved == held):
                if generation is not None:
                    self._checked[key] = generation
                if slot.cache is not None:
                    entries.move_to_end(key)
                return cached
        try:
            value = slot.decode(raw)
        except StateFormatError as exc:
            exc.key = key
            raise
        slot.check(ident, value)
        if held is not raw and value.saved is not None:
            value.saved = held
        self._cache.remember(slot, key, value,
                             None if value.saved is None else generation)
        return value

    def stage(self, slot: Slot[Id, V], ident: Id, value: V) -> None:
        """`value` is the new value of `ident` in `slot`: encoded when the plan is made
        (later changes to it count), and served by `load` until then."""
        if self._status is not Status.STARTED:
            self._refuse("stage")
        key = slot.key(ident)
        value.saved = None
        staged, entries = self._slots[slot]
        staged[key] = value
        if entries.get(key) is not value:
            self._cache.remember(slot, key, value)

    def is_staged(self, slot: Slot[Id, V], ident: Id) -> bool:
        """Whether a value of `ident` in `slot` is staged (released or not)."""
        return slot.key(ident) in self._slots[slot][0]

    def stored(self, slot: Slot[Id, V], ident: Id) -> bytes | None:
        """The bytes the store holds for `ident` in `slot` (None: none), not decoded."""
        if self._status is not Status.STARTED:
            self._refuse("stored")
        raw = self._store.get(slot.key(ident))
        return None if raw is None else bytes(raw)

    def stored_many(self, slot: Slot[Id, V], idents: Sequence[Id]) -> list[bytes | None]:
        """`stored` of each of `idents`, in their order, read at once (`StateStore.get_many`)."""
        if self._status is not Status.STARTED:
            self._refuse("stored")
        got = self._store.get_many([slot.key(i) for i in idents])
        return [None if raw is None else bytes(raw) for raw in got]

    def stage_encoded(self, slot: Slot[Id, V], ident: Id, raw: bytes) -> None:
        """Stage `raw`, the encoded new value of `ident` in `slot`, as a released value
        is (`release`): the plan writes these bytes, a load decodes them, and any decoded
        value of it leaves the cache."""
        if self._status is not Status.STARTED:
            self._refuse("stage")
        key = slot.key(ident)
        staged, entries = self._slots[slot]
        staged[key] = bytes(raw)
        entries.pop(key, None)
        self._checked.pop(key, None)

    def release(self, slot: Slot[Id, V], ident: Id) -> None:
        """The value of `ident` in `slot` need not stay decoded: staged, it is encoded now
        and leaves the cache (the plan writes those bytes: it must not change after
        this call but through a new load); otherwise the plan drops it from the cache. A
        later load decodes its bytes again."""
        if self._status is not Status.STARTED:
            self._refuse("release")
        key = slot.key(ident)
        staged, entries = self._slots[slot]
        value = staged.get(key)
        if value is None:
            self._released[key] = entries
        elif type(value) is not bytes:
            staged[key] = slot.encode(value)
            if entries.get(key) is value:
                del entries[key]
                self._checked.pop(key, None)

    def scan(self, slot: Slot[str, V]) -> Iterator[tuple[str, V | bytes]]:
        """Every identifier of `slot` with a stored or staged value, the stored ones
        first: (ident, its staged value, else its stored bytes; the bytes of a staged
        value released). Nothing is decoded (what a caller reads from the bytes is its
        business)."""
        if self._status is not Status.STARTED:
            self._refuse("scan")
        staged = self._slots[slot][0]
        cut = len(slot.prefix)
        stored: set[str] = set()
        for key, raw in self._store.scan(slot.prefix):
            stored.add(key)
            value = staged.get(key)
            yield key[cut:], raw if value is None else value
        for key, value in list(staged.items()):
            if key not in stored:
                yield key[cut:], value

    def prepare(self) -> list[tuple[str, bytes]]:
        """The write plan: every staged value encoded once, by slot rank, in staging order
        within a slot. Started -> prepared."""
        self._move(Status.PREPARED)
        plan: list[tuple[str, bytes]] = []
        # The plan's values equal the stored bytes at this generation once the store's
        # `write_many` has written them (it moves the generation if anything else
        # lands first); a failed write drops the cache.
        generation = self._store.generation()
        checked = self._checked
        for slot in self._order:
            digests = self._digests and slot.cache != 0
            entries = self._slots[slot][1]
            for key, value in self._slots[slot][0].items():
                if type(value) is bytes:  # released: encoded then
                    plan.append((key, value))
                    continue
                raw = slot.encode(value)
                if digests:
                    value.saved = digest(raw)
                if generation is not None and entries.get(key) is value:
                    checked[key] = generation
                plan.append((key, raw))
        for key, entries in self._released.items():
            entries.pop(key, None)
            checked.pop(key, None)
        self._drop_staged()
        return plan

    def complete(self) -> None:
        """The plan is written and durable. Prepared -> complete."""
        self._move(Status.COMPLETE)

    def fail(self) -> None:
        """Drop every staged value. Started or prepared -> failed; the caller drops the
        cache as well."""
        self._move(Status.FAILED)
        self._drop_staged()

    def _drop_staged(self) -> None:
        for staged, _entries in self._slots.values():
            staged.clear()
        self._released.clear()

    def _move(self, to: Status) -> None:
        if to not in _ALLOWED[self._status]:
            raise TransactionStatusError(
                f"a {self._status.value} transaction cannot become {to.value}")
        self._status = to

    def _refuse(self, what: str) -> NoReturn:
        raise TransactionStatusError(f"{what} in a {self._status.value} transaction")
