"""restore.ChangelogTracker: where this process's own changelog writes land tells whether
anything else wrote between them (a worker that lost the partition without noticing).
Pure: the delivery reports are calls here."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from processor.stream.model.restore import ChangelogTracker


def test_back_to_back_writes_move_the_read_point_a_foreign_one_stops_it() -> None:
    """Loaded after reading through offset 9: own writes at 10, 11, 12 keep it clean (the
    database holds everything through 12); a write landing at 14 means something else
    wrote 13: a gap is reported once, and the read point stays unknown until the
    partition is loaded again, however the writes go on. Control: an untracked
    partition reports nothing."""
    t = ChangelogTracker()
    t.begin(0, 9)
    for offset in (10, 11, 12):
        t.delivered(0, offset)
    assert t.read_through(0) == 12 and t.take_gaps() == set()
    t.delivered(0, 14)
    assert t.take_gaps() == {0} and t.read_through(0) is None
    t.delivered(0, 15)  # back to back again: no new gap, still not clean
    assert t.take_gaps() == set() and t.read_through(0) is None
    t.delivered(0, 20)  # another foreign write in between: another gap
    assert t.take_gaps() == {0}
    t.begin(0, 20)
    t.delivered(0, 21)
    assert t.read_through(0) == 21
    t.delivered(3, 5)
    assert t.take_gaps() == set()  # never begun: not tracked


def test_an_empty_changelog_expects_offset_zero() -> None:
    t = ChangelogTracker()
    t.begin(1, None)
    t.delivered(1, 0)
    assert t.read_through(1) == 0
    t.end(1)
    t.delivered(1, 5)  # a gap, were it still tracked
    assert t.read_through(1) is None and t.take_gaps() == set()


class _FakeData:
    """The parts of Faust's RocksDB store WorkerStores touches, over a dict per partition
    (rocksdict's `items(from_key=)` order: sorted keys)."""

    def __init__(self, dbs: dict[int, _FakeDb]) -> None:
        self.dbs = dbs
        self.persisted: dict[object, int] = {}

    def _db_for_partition(self, partition: int) -> _FakeDb:
        return self.dbs[partition]

    def set_persisted_offset(self, tp: object, offset: int) -> None:
        self.persisted[tp] = offset


class _FakeDb(dict[bytes, bytes]):
    def put(self, key: bytes, value: bytes) -> None:
        self[key] = value

    def items(self, from_key: bytes = b"") -> list[tuple[bytes, bytes]]:  # type: ignore[override]
        return sorted((k, v) for k, v in super().items() if k >= from_key)


class _FakeTable:
    def __init__(self, data: _FakeData) -> None:
        self.data = data
        self.stale: dict[int, set[bytes]] = {}

    def persisted_offset(self, tp: object) -> int | None:
        return None


class _FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes, int]] = []

    def produce(self, topic: str, value: bytes | None, key: bytes, partition: int) -> None:
        self.sent.append((topic, value, key, partition))

    async def flush(self) -> None:
        return None


def test_a_gap_rewrites_every_stored_kind_of_the_stage() -> None:
    """After a foreign write among this process's, flush writes again every value under
    the stage's prefixes (unit values too, for the bounding stage: compaction keeps the
    last record of a key, so an unlisted kind would keep a zombie's older value), and
    nothing else of the database (Faust's own offset key). Control: the operator's
    prefixes leave the unit values out."""
    import asyncio

    from processor.stream.worker.table import WorkerStores

    def run(prefixes: tuple[str, ...]) -> set[bytes]:
        db = _FakeDb({b"u/aa": b"1", b"u/bb": b"2", b"p/0": b"3", b"c/x": b"4",
                      b"__faust\x00offset__": b"9"})
        table: Any = _FakeTable(_FakeData({0: db}))
        producer: Any = _FakeProducer()
        tracker = ChangelogTracker()
        stores = WorkerStores(table, producer, "cl", tracker, prefixes)
        stores.of(0)
        tracker.delivered(0, 0)
        tracker.delivered(0, 5)  # something else wrote 1..4
        asyncio.run(stores.flush())
        return {key for _t, _v, key, _p in producer.sent}

    assert run(("u/", "p/")) == {b"u/aa", b"u/bb", b"p/0"}
    assert run(("c/", "p/")) == {b"c/x", b"p/0"}


def _value(applied: int) -> bytes:
    """A stored partition value reflecting the timeline through `applied`."""
    from processor.stream.model.state import PartitionState
    from tests.stream.test_state import KID

    ps = PartitionState()
    ps.key_id, ps.applied = KID, applied
    return ps.to_bytes()


def test_a_batch_merges_as_if_applied_one_by_one() -> None:
    """merge_changelog keeps, per key, what applying the records one at a time by
    state.supersedes keeps, reading each key once: a newer record wins over the store and
    over an earlier record of the same batch; a stale record after a newer one in the
    same batch loses (the key's write stays the newer value, and the key is reported
    stale: the owner writes it again); a deletion of a value with an offset loses; a key
    the store lacks takes any value. Control: the one-by-one apply over a dict gives the
    same store."""
    from processor.stream.model.restore import merge_changelog
    from processor.stream.model.state import supersedes
    from tests.stream.test_zombie import restore

    store = {b"a": _value(10), b"b": _value(10), b"c": _value(10), b"d": _value(10)}
    records: list[tuple[bytes, bytes | None]] = [
        (b"a", _value(12)), (b"a", _value(11)),  # stale after newer, same batch: loses
        (b"b", _value(9)), (b"b", _value(13)),  # stale first, then newer: takes the newer
        (b"c", None),  # deletion of a value that carries an offset: refused
        (b"d", _value(10)),  # equal offset: taken
        (b"e", _value(1)),  # absent: taken
    ]
    reads: list[bytes] = []

    def get(key: bytes) -> bytes | None:
        reads.append(key)
        return store.get(key)

    writes, stale = merge_changelog(records, get)
    assert sorted(reads) == [b"a", b"b", b"c", b"d", b"e"]
    assert writes == {b"a": _value(12), b"b": _value(13), b"d": _value(10), b"e": _value(1)}
    assert stale == {b"a", b"c"}
    one_by_one = restore([*store.items(), *records], supersedes)
    assert {**store, **{k: v for k, v in writes.items() if v is not None}} == one_by_one
    # control: a stale record alone against the store is refused and reported
    assert merge_changelog([(b"a", _value(9))], store.get) == ({}, {b"a"})


def test_the_table_apply_writes_the_merge_and_the_offsets(tmp_path: Path) -> None:
    """MonotoneTable.apply_changelog_batch on real RocksDB databases, two partitions in
    one buffer: each database gets its partition's merge (a stale record later in the
    batch loses to the newer one before it), the stale set names the refused key (and a
    later newer record of a key clears it), the persisted offset is the highest read,
    and a record without a key moves the offset only. Control: the newer value of the
    same key in the other partition is untouched by the first's stale record."""
    from types import SimpleNamespace

    from faust.types import TP
    from rocksdict import Options, Rdict

    from processor.stream.worker.table import MonotoneTable

    dbs = {p: Rdict(str(tmp_path / f"db{p}"), Options(raw_mode=True)) for p in (0, 1)}
    dbs[0][b"k"] = _value(5)
    dbs[1][b"k"] = _value(5)
    persisted: dict[TP, int] = {}
    data = SimpleNamespace(_db_for_partition=dbs.__getitem__,
                           set_persisted_offset=persisted.__setitem__)
    table: Any = SimpleNamespace(data=data, stale=defaultdict(set, {0: {b"x"}}))

    def event(partition: int, offset: int, key: bytes | None,
              value: bytes | None) -> SimpleNamespace:
        return SimpleNamespace(message=SimpleNamespace(
            tp=TP("cl", partition), partition=partition, offset=offset, key=key, value=value))

    batch = [event(0, 100, b"k", _value(20)), event(1, 50, b"k", _value(30)),
             event(0, 101, b"k", _value(6)),  # stale after the newer one: loses
             event(0, 102, b"x", _value(1)),  # clears x's stale mark
             event(0, 103, None, None), event(1, 51, b"j", _value(2))]
    MonotoneTable.apply_changelog_batch(table, batch)
    assert dbs[0][b"k"] == _value(20) and dbs[0][b"x"] == _value(1)
    assert dbs[1][b"k"] == _value(30) and dbs[1][b"j"] == _value(2)
    assert table.stale[0] == {b"k"} and table.stale[1] == set()
    assert persisted == {TP("cl", 0): 103, TP("cl", 1): 51}
    for db in dbs.values():
        db.close()


def _get_many_agrees(store: Any) -> int:
    """How many of a fixed set of multi-key reads `store.get_many` answers otherwise than
    `get` key by key (values and their order, missing keys as None, every value bytes):
    the store contract of `StateStore.get_many`. The store holds c/k000..c/k099, written
    with `write_many`, each a value of its own length."""
    import random

    store.write_many([(f"c/k{i:03d}", bytes([i]) * (i + 1)) for i in range(100)])
    rng = random.Random(4)
    keys = [f"c/k{i:03d}" for i in range(130)]  # 100..129 missing
    reads = [[], ["c/k005"], ["c/k120"], sorted(keys), keys[::-1],
             ["c/k007", "c/k007", "c/k120", "c/k007"]]
    reads += [rng.sample(keys, rng.randint(2, 60)) for _ in range(20)]
    bad = 0
    for read in reads:
        got = store.get_many(read)
        want = [store.get(k) for k in read]
        if got != want or not all(v is None or type(v) is bytes for v in got):
            bad += 1
    return bad


class _SortedAnswers:
    """Control: a store whose batch read answers in key order, not in the order asked."""

    def __init__(self) -> None:
        from processor.stream.model.state import DictStore

        self.inner = DictStore()
        self.get, self.write_many = self.inner.get, self.inner.write_many

    def get_many(self, keys: Any) -> list[bytes | None]:
        return [self.inner.get(k) for k in sorted(keys)]


def test_the_batch_read_is_get_key_by_key_on_every_store(tmp_path: Path) -> None:
    """`StateStore.get_many` (the operator's reads of the values a marker writes at the
    deferral bound) on each store: a DictStore, a CopyingStore, and the worker's
    `table.PartitionStore` on a RocksDB database opened as Faust opens the worker's
    (`table.ROCKSDB_OPTIONS`), its changelog records kept aside. Control: a store that
    answers a batch in key order fails the same check on every unsorted read."""
    from types import SimpleNamespace

    from faust.stores.rocksdb import RocksDBOptions

    from processor.devtools.inmemory import CopyingStore
    from processor.stream.model.state import DictStore
    from processor.stream.worker.table import ROCKSDB_OPTIONS, PartitionStore

    options: Any = ROCKSDB_OPTIONS
    db = RocksDBOptions(**options).open(tmp_path / "db")
    changelog: list[tuple[Any, ...]] = []
    table: Any = SimpleNamespace(data=SimpleNamespace(_db_for_partition=lambda _p: db))
    producer: Any = SimpleNamespace(produce_many=lambda *a: changelog.append(a))
    try:
        for store in (DictStore(), CopyingStore(), PartitionStore(table, 0, producer, "cl")):
            assert _get_many_agrees(store) == 0
        assert len(changelog) == 1 and len(changelog[0][1]) == 100  # the one write_many
    finally:
        db.close()
    # the control: every read but the empty one, the two of one key and the sorted one
    assert _get_many_agrees(_SortedAnswers()) == 26 - 4


def test_the_worker_store_generation_moves_on_every_write_but_its_own(tmp_path: Path) -> None:
    """`PartitionStore.generation` on a RocksDB database opened as Faust opens the
    worker's: the same across the store's own plan writes (`write_many`) and its
    persisted offset, a new one after a write by anyone else (a value put straight into
    the database, a restore's or standby copy's write batch, the store's own `set`), and
    after the database was reopened (Faust closes and opens it at rebalances)."""
    from types import SimpleNamespace

    from faust.stores.rocksdb import RocksDBOptions

    from processor.stream.worker.table import ROCKSDB_OPTIONS, PartitionStore, merged_batch

    options: Any = ROCKSDB_OPTIONS
    dbs = [RocksDBOptions(**options).open(tmp_path / "db")]

    def persist(_tp: object, offset: int) -> None:
        dbs[0].put(b"__faust\x00offset__", str(offset).encode())

    table: Any = SimpleNamespace(data=SimpleNamespace(_db_for_partition=lambda _p: dbs[0],
                                                      set_persisted_offset=persist))
    producer: Any = SimpleNamespace(produce_many=lambda *a: None, produce=lambda *a, **k: None)
    store = PartitionStore(table, 0, producer, "cl")
    try:
        first = store.generation()
        store.write_many([("c/a", b"1"), ("c/b", b"2"), ("p/0", b"3")])
        store.set_persisted_offset(7)
        assert store.generation() == first
        others: list[Callable[[], object]] = [
            lambda: dbs[0].put(b"c/a", b"9"),
            lambda: dbs[0].write(merged_batch({b"c/b": b"8", b"c/z": None}, 3)),
            lambda: store.set("c/a", b"7")]
        seen = {first}
        for write in others:
            write()
            now = store.generation()
            assert now not in seen and store.generation() == now
            seen.add(now)
        dbs[0].close()
        dbs[0] = RocksDBOptions(**options).open(tmp_path / "db")
        assert store.generation() not in seen
    finally:
        dbs[0].close()
