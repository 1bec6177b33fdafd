"""table.ChangelogTracker: where this process's own changelog writes land tells whether
anything else wrote between them (a worker that lost the partition without noticing).
Pure: the delivery reports are calls here."""

from __future__ import annotations

from processor.stream.table import ChangelogTracker


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
    assert t.take_gaps() == set() and not t.tracks(3)


def test_an_empty_changelog_expects_offset_zero() -> None:
    t = ChangelogTracker()
    t.begin(1, None)
    t.delivered(1, 0)
    assert t.read_through(1) == 0
    t.end(1)
    assert not t.tracks(1) and t.read_through(1) is None


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
    from typing import Any

    from processor.stream.table import WorkerStores

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
