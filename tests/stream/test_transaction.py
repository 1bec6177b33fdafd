"""The partition transaction (transaction.py): slots, the one load, the one cache, the
status and the write plan. Pure: no Kafka."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from processor.core.errors import StateFormatError
from processor.devtools.inmemory import CopyingStore
from processor.stream.model.state import DictStore
from processor.stream.model.transaction import (
    PartitionTransaction,
    Slot,
    StateCache,
    Status,
    TransactionStatusError,
)


class Val:
    """A stored value: its bytes are `data`; encoding sets `saved`."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.saved: bytes | None = None


class Codec:
    """Counts decodes and encodes; refuses bytes that begin with "!" (check) or "?"
    (format)."""

    def __init__(self) -> None:
        self.decoded = 0
        self.encoded = 0

    def decode(self, raw: bytes) -> Val:
        if raw.startswith(b"?"):
            raise StateFormatError("not a value")
        self.decoded += 1
        v = Val(raw)
        v.saved = raw
        return v

    def encode(self, v: Val) -> bytes:
        self.encoded += 1
        v.saved = v.data
        return v.data

    def check(self, ident: str, v: Val) -> None:
        if v.data.startswith(b"!"):
            raise ValueError(f"refused {ident}")


def slot(codec: Codec, prefix: str, rank: int, cache: int | None = None) -> Slot[str, Val]:
    return Slot(prefix, rank, codec.decode, codec.encode, codec.check, cache)


def test_write_plan_goes_by_slot_rank_then_staging_order() -> None:
    """The plan writes every staged value once (its last state), lower slot ranks first,
    in staging order within a slot, whatever the keys; nothing reaches the store before
    the plan is written. Control: the same stages under swapped ranks come out in the
    other slot order."""
    for first, second in ((0, 1), (1, 0)):
        codec = Codec()
        low, high = slot(codec, "z/", first), slot(codec, "a/", second)
        store = DictStore()
        txn = PartitionTransaction(store, (high, low), StateCache())
        b = Val(b"b1")
        txn.stage(high, "0", Val(b"p"))
        txn.stage(low, "y", Val(b"y1"))
        txn.stage(low, "b", b)
        txn.stage(low, "y", Val(b"y2"))
        b.data = b"b2"
        assert store.data == {} and txn.load(low, "b") is b
        plan = txn.prepare()
        # Read into a local: mypy would keep `txn.status` narrowed past complete().
        before = txn.status
        assert codec.encoded == 3 and before is Status.PREPARED
        zs = [("z/y", b"y2"), ("z/b", b"b2")]
        assert plan == ([*zs, ("a/0", b"p")] if first == 0 else [("a/0", b"p"), *zs])
        store.write_many(plan)
        txn.complete()
        assert txn.status is Status.COMPLETE and store.data == dict(plan)


def test_illegal_status_transitions_are_refused() -> None:
    """started -> prepared -> complete, and started or prepared -> failed; anything
    else (a load or stage after the plan, a second plan, completing without one, failing
    a finished transaction) raises and changes nothing."""
    codec = Codec()
    s = slot(codec, "c/", 0)
    txn = PartitionTransaction(DictStore(), (s,), StateCache())
    with pytest.raises(TransactionStatusError, match="started transaction cannot become"):
        txn.complete()
    txn.stage(s, "a", Val(b"a"))
    txn.prepare()
    for act in (lambda: txn.load(s, "a"), lambda: txn.stage(s, "a", Val(b"x")),
                lambda: list(txn.scan(s)), txn.prepare):
        with pytest.raises(TransactionStatusError):
            act()
    before = txn.status  # a local, as above: complete() changes txn.status
    assert before is Status.PREPARED
    txn.complete()
    for act in (txn.fail, txn.complete, txn.prepare):
        with pytest.raises(TransactionStatusError):
            act()
    assert txn.status is Status.COMPLETE
    for prepared in (False, True):
        txn = PartitionTransaction(DictStore(), (s,), StateCache())
        txn.stage(s, "a", Val(b"a"))
        if prepared:
            txn.prepare()
        txn.fail()
        assert txn.status is Status.FAILED
        with pytest.raises(TransactionStatusError):
            txn.fail()
        with pytest.raises(TransactionStatusError):
            txn.load(s, "a")


@pytest.mark.parametrize("make_store", [DictStore, CopyingStore])
def test_the_cache_serves_a_value_only_while_the_store_holds_its_bytes(
        make_store: Callable[[], DictStore | CopyingStore]) -> None:
    """A decoded value is served again while the store holds the very bytes (or equal
    bytes) it was decoded from or encoded to, across transactions; other bytes are
    decoded again, a deleted value is None, nothing after `clear`; the cache keeps the
    `cache` most recently used values of a slot (none at 0, all at None). The same over
    a store that copies what it keeps and returns (RocksDB)."""
    codec = Codec()
    s = slot(codec, "c/", 0, cache=2)
    store = make_store()
    cache = StateCache()
    for name in "abc":
        store.set(f"c/{name}", name.encode())
    txn = PartitionTransaction(store, (s,), cache)
    a = txn.load(s, "a")
    assert a is not None and txn.load(s, "a") is a and codec.decoded == 1
    store.set("c/a", bytes(bytearray(b"a")))  # equal bytes, another object
    assert txn.load(s, "a") is a and codec.decoded == 1
    a.data = b"a2"
    txn.stage(s, "a", a)
    store.write_many(txn.prepare())
    txn.complete()
    txn = PartitionTransaction(store, (s,), cache)
    assert txn.load(s, "a") is a and codec.decoded == 1
    store.set("c/a", b"older")
    assert txn.load(s, "a") is not a and codec.decoded == 2
    txn.load(s, "b")
    txn.load(s, "c")  # evicts the least recently used: a
    assert codec.decoded == 4
    txn.load(s, "b")
    assert codec.decoded == 4
    txn.load(s, "a")
    assert codec.decoded == 5
    store.delete("c/b")
    assert txn.load(s, "b") is None
    cache.clear()  # an open transaction sees it (a failed batch drops every value)
    txn.load(s, "a")
    assert codec.decoded == 6
    for bound, decodes in ((0, 3), (None, 1)):
        codec = Codec()
        s = slot(codec, "c/", 0, cache=bound)
        txn = PartitionTransaction(store, (s,), StateCache())
        for _ in range(3):
            txn.load(s, "c")
        assert codec.decoded == decodes


def test_a_refused_or_corrupt_value_is_not_kept() -> None:
    """The slot's check runs on every decoded value; a refused one raises and is decoded
    (and refused) again next time. Bytes that are no such value raise StateFormatError
    carrying the store key."""
    codec = Codec()
    s = slot(codec, "c/", 0)
    store = DictStore()
    store.set("c/x", b"!bad")
    store.set("c/y", b"?junk")
    txn = PartitionTransaction(store, (s,), StateCache())
    for decodes in (1, 2):
        with pytest.raises(ValueError, match="refused x"):
            txn.load(s, "x")
        assert codec.decoded == decodes
    with pytest.raises(StateFormatError) as info:
        txn.load(s, "y")
    assert info.value.key == "c/y"


def test_scan_gives_staged_values_else_stored_bytes() -> None:
    """scan(slot): each identifier of the slot once, stored ones first, with its staged
    value if any, else its stored bytes; other slots' keys are not in it."""
    codec = Codec()
    s, other = slot(codec, "c/", 0), slot(codec, "p/", 1)
    store = DictStore()
    store.set("c/a", b"a")
    store.set("c/b", b"b")
    store.set("p/0", b"p")
    txn = PartitionTransaction(store, (s, other), StateCache())
    b, n = Val(b"b2"), Val(b"n")
    txn.stage(s, "n", n)
    txn.stage(s, "b", b)
    assert list(txn.scan(s)) == [("a", b"a"), ("b", b), ("n", n)]
    assert codec.decoded == 0


def test_over_a_copying_store_the_cache_keeps_digests_and_refuses_changed_bytes() -> None:
    """Over a store that returns copies, a cached value keeps a 16-byte digest of its
    bytes, not a second copy of them, whether it was decoded or encoded; the value is
    served while the store holds equal bytes and decoded again as soon as one byte of
    them changes under the cache (same length, same header). Control: over a DictStore,
    `saved` is the very bytes object the store holds."""
    codec = Codec()
    s = slot(codec, "c/", 0)
    store = CopyingStore()
    body = b"DPC\x04" + bytes(200)
    store.set("c/a", body)
    cache = StateCache()
    txn = PartitionTransaction(store, (s,), cache)
    a = txn.load(s, "a")
    assert a is not None and a.saved is not None and len(a.saved) == 16
    assert txn.load(s, "a") is a and codec.decoded == 1
    store.set("c/a", body[:-1] + b"\x01")
    b = txn.load(s, "a")
    assert b is not a and b is not None and b.data == body[:-1] + b"\x01"
    assert codec.decoded == 2
    b.data = body
    txn.stage(s, "a", b)
    store.write_many(txn.prepare())
    txn.complete()
    assert b.saved is not None and len(b.saved) == 16
    txn = PartitionTransaction(store, (s,), cache)
    assert txn.load(s, "a") is b and codec.decoded == 2
    store.set("c/a", body[:100] + b"\x02" + body[101:])
    assert txn.load(s, "a") is not b and codec.decoded == 3
    plain = DictStore()
    plain.set("c/a", body)
    c = PartitionTransaction(plain, (s,), StateCache()).load(s, "a")
    assert c is not None and c.saved is plain.data["c/a"]


def test_a_slot_that_caches_nothing_keeps_its_codecs_bytes_and_reads_the_store() -> None:
    """Over a copying store, a slot with cache 0 keeps in `saved` the bytes its codec set
    (no digest: the value is gone after the transaction), and every transaction reads the
    store again and decodes afresh; a staged value is still served until the plan."""
    codec = Codec()
    s = slot(codec, "u/", 0, cache=0)
    store = CopyingStore()
    body = b"DPU\x04" + bytes(60)
    store.set("u/a", body)
    cache = StateCache()
    txn = PartitionTransaction(store, (s,), cache)
    a = txn.load(s, "a")
    assert a is not None and a.saved == body and codec.decoded == 1
    b = txn.load(s, "a")
    assert b is not None and b is not a and codec.decoded == 2
    txn.stage(s, "a", b)
    assert txn.load(s, "a") is b
    plan = txn.prepare()
    assert plan == [("u/a", body)] and b.saved == body
    store.write_many(plan)
    txn.complete()
    txn = PartitionTransaction(store, (s,), cache)
    c = txn.load(s, "a")
    assert c is not b and c is not None and codec.decoded == 3


def test_a_released_value_leaves_the_cache_and_keeps_its_place_in_the_plan() -> None:
    """`release`: a staged value is encoded at once and leaves the cache; the plan writes
    those bytes in the value's staging place, and a load before the plan decodes them
    into a staged object again (whose later changes count). An unstaged value stays
    served until the plan, then leaves the cache; the next transaction decodes it from
    the store. Control: without the release, both stay cached."""
    for release in (True, False):
        codec = Codec()
        values = slot(codec, "v/", 0)
        store, cache = DictStore(), StateCache()
        store.data.update({"v/a": b"a0", "v/b": b"b0", "v/c": b"c0"})
        txn = PartitionTransaction(store, (values,), cache)
        a, b = txn.load(values, "a"), txn.load(values, "b")
        assert a is not None and b is not None
        a.data = b"a1"
        txn.stage(values, "a", a)
        txn.stage(values, "c", Val(b"c1"))
        if release:
            txn.release(values, "a")
            txn.release(values, "b")
            assert codec.encoded == 1 and "v/a" not in cache.section(values)
            assert list(txn.scan(values)) == [("a", b"a1"), ("b", b"b0"),
                                              ("c", txn.load(values, "c"))]
            again = txn.load(values, "a")
            assert again is not None and again is not a and again.data == b"a1"
            again.data = b"a2"
            assert txn.load(values, "b") is b  # still served until the plan
        plan = txn.prepare()
        assert plan == [("v/a", b"a2" if release else b"a1"), ("v/c", b"c1")]
        assert sorted(cache.section(values)) == (
            ["v/c"] if release else ["v/a", "v/b", "v/c"])


class _Counted(CopyingStore):
    """A CopyingStore counting its reads (`get`)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, key: str) -> bytes | None:
        self.reads += 1
        return super().get(key)


class _Blind(_Counted):
    """A store that cannot tell its generation: every load reads."""

    def generation(self) -> int | None:
        return None


class _Trusting(_Counted):
    """Control: a store that claims nothing ever reached it (one generation for good)."""

    def generation(self) -> int | None:
        return 1


def _interleavings(make_store: Callable[[], _Counted], seed: int,
                   others: float = 0.1) -> tuple[int, int, int]:
    """Random loads, changes, plans written, failed plans and writes by others (a restore,
    a standby copy: `set` and `delete` straight to the store, also between a plan's
    preparation and its write) over one cache; returns (loads that served other bytes
    than the store holds, loads, reads of the store). `others`: about how often such
    writes and failed plans come."""
    import random

    rng = random.Random(seed)
    codec = Codec()
    slots = (slot(codec, "c/", 0, cache=6), slot(codec, "p/", 1))
    store = make_store()
    cache = StateCache()
    txn = PartitionTransaction(store, slots, cache)
    wrong = loads = 0
    for step in range(600):
        s = rng.choice(slots)
        ident = f"k{rng.randrange(8)}"
        key = s.key(ident)
        what = rng.random()
        if what < 0.5:
            got = txn.load(s, ident)
            loads += 1
            held = None if got is None else got.data
            if not txn.is_staged(s, ident) and held != store.data.get(key):
                wrong += 1
        elif what < 0.7:
            got = txn.load(s, ident)
            loads += 1
            value = got if got is not None else Val(b"")
            value.data = f"{step}".encode()
            txn.stage(s, ident, value)
        elif what < 1 - others:
            plan = txn.prepare()
            if rng.random() < others:
                store.set(key, f"between {step}".encode())
            if rng.random() < others:
                txn.fail()
                cache.clear()
            else:
                store.write_many(plan)
                txn.complete()
            txn = PartitionTransaction(store, slots, cache)
        elif what < 1 - others / 5:
            store.set(key, f"other {step}".encode())
        else:
            store.delete(key)
    return wrong, loads, store.reads


def test_a_cached_value_is_served_without_a_read_only_while_nothing_else_wrote() -> None:
    """The store's generation (transaction.py): under random interleavings of loads,
    changes, plans written or failed, and writes by others (also between a plan's
    preparation and its write), every load of a value not staged returns the bytes the
    store holds, over 20 seeds; and where such writes are rare, the loads read the store
    less than half as often as over a store that cannot tell its generation. Control: a
    store that claims one generation for good serves stale values in every seed."""
    for seed in range(20):
        assert _interleavings(_Counted, seed)[0] == 0, seed
        assert _interleavings(_Trusting, seed)[0] > 0, seed
        # Writes by others and failed plans are rare in a worker (no writes by others
        # between two rebalances).
        wrong, loads, reads = _interleavings(_Counted, seed, others=0.01)
        blind = _interleavings(_Blind, seed, others=0.01)
        assert wrong == 0 and blind[0] == 0 and blind[1] == loads, seed
        assert reads < 0.5 * blind[2], (seed, reads, blind)


def test_a_store_generation_stays_across_its_own_batches_only() -> None:
    """`StoreGeneration`: the same number while the database and its sequence number
    stay, and across a batch that moved the sequence by exactly its own writes; a new one
    after a write by anyone else (before, during or after the batch) or on another
    database handle; numbers are never reused by a new tracker."""
    from processor.stream.model.transaction import StoreGeneration

    g, db = StoreGeneration(), object()
    first = g.now(db, 5)
    assert g.now(db, 5) == first
    g.wrote(db, 5, 8, 3)
    assert g.now(db, 8) == first
    g.wrote(db, 8, 12, 3)  # one more write landed with the batch
    second = g.now(db, 12)
    assert second != first
    g.wrote(db, 13, 14, 1)  # one landed before the batch
    third = g.now(db, 14)
    assert third not in (first, second)
    assert g.now(object(), 14) not in (first, second, third)  # reopened
    assert StoreGeneration().now(db, 14) not in (first, second, third)
