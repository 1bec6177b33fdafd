"""The standby reader on the broker (worker/standby.py; docs/state.md, "Standby copies").

What it writes into a partition database is the monotone merge of the changelog records
after the database's persisted offset, with the persisted offset of the last record it
read; records held in its buffer are written when it stops; keys whose last record was
refused join the partition's stale set, and leave it when a newer record is written.
A worker's standby copy taken over after a kill is checked end to end by
tests/stream/test_crash.py (test_failed_worker_counters_move_to_the_other).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocksdict import Options as RdictOptions
from rocksdict import Rdict

from processor.stream.kafka import kafka_io
from processor.stream.model.state import UNIT_MAGIC, monotone_header
from processor.stream.worker.stale import OFFSET_KEY
from processor.stream.worker.standby import StandbyPartition, StandbyReader


def _v(offset: int) -> bytes:
    """A stored value that reflects timeline offset `offset`."""
    return monotone_header(UNIT_MAGIC, offset) + b"payload"


def _open(path: Path) -> Any:
    options = RdictOptions(raw_mode=True)
    options.create_if_missing(True)
    return Rdict(str(path), options=options)


def _wait(what: str, done: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_reader_writes_the_merge_after_the_persisted_offset(
        kafka_bootstrap: str, create_topics: Callable[..., None],
        unique_topic: Callable[[str], str], tmp_path: Path) -> None:
    topic = unique_topic("standby")
    create_topics(kafka_bootstrap, [topic], partitions=2)
    conf = {"bootstrap.servers": kafka_bootstrap}
    # Partition 0: offsets 0-2 were applied before (persisted offset 2); their values are
    # deliberately not in the database, so a reader that read them again would show.
    kafka_io.produce_all(conf, topic, [(b"b", _v(10)), (b"c", _v(11)), (b"e", _v(12))],
                         partition=0)
    db0, db1 = _open(tmp_path / "p0.db"), _open(tmp_path / "p1.db")
    try:
        db0[OFFSET_KEY] = b"2"
        db1[b"k"] = _v(50)  # newer than the changelog's record of k below
        stale0: set[bytes] = {b"x"}  # x: found stale by an earlier restore
        stale1: set[bytes] = set()
        taken: list[int] = []
        reader = StandbyReader(conf, 3, taken.append)
        reader.start({(topic, 0): StandbyPartition(db0, 2, stale0),
                      (topic, 1): StandbyPartition(db1, None, stale1)})
        assert reader.running
        p0: list[tuple[bytes | None, bytes | None]] = [
            (b"a", _v(20)), (b"a", _v(15)), (b"d", _v(21)), (b"d", None), (b"x", _v(22))]
        p1: list[tuple[bytes | None, bytes | None]] = [
            (b"k", _v(40)), (b"m", _v(41)), (b"n", _v(42)), (b"m", _v(43)), (None, _v(44))]
        kafka_io.produce_all(conf, topic, p0, partition=0)  # offsets 3-7
        kafka_io.produce_all(conf, topic, p1, partition=1)  # offsets 0-4
        _wait("every record taken", lambda: sum(taken) >= len(p0) + len(p1))
        reader.stop()
        assert not reader.running
        assert sum(taken) == len(p0) + len(p1)  # nothing at or below 2 on partition 0
        got0 = {bytes(k): bytes(v) for k, v in db0.items()}
        got1 = {bytes(k): bytes(v) for k, v in db1.items()}
    finally:
        db0.close()
        db1.close()
    # The newest value of each key wins; an older record and a deletion (which carries
    # no offset) are refused; the offset is that of the last record read.
    assert got0 == {b"a": _v(20), b"d": _v(21), b"x": _v(22), OFFSET_KEY: b"7"}
    # a's and d's last records were refused; x's newer value was written
    assert stale0 == {b"a", b"d"}
    assert got1 == {b"k": _v(50), b"m": _v(43), b"n": _v(42), OFFSET_KEY: b"4"}
    assert stale1 == {b"k"}


def test_a_restarted_reader_goes_on_from_the_persisted_offset(
        kafka_bootstrap: str, create_topics: Callable[..., None],
        unique_topic: Callable[[str], str], tmp_path: Path) -> None:
    """Stopped and started again on the same database (a rebalance that keeps the
    standby copy), the reader reads on after what it wrote: what it held below its
    buffer is written at the stop, and after the start only the record produced since
    is taken, its offset then persisted."""
    topic = unique_topic("standby-restart")
    create_topics(kafka_bootstrap, [topic], partitions=1)
    conf = {"bootstrap.servers": kafka_bootstrap}
    db = _open(tmp_path / "p0.db")
    try:
        taken: list[int] = []
        reader = StandbyReader(conf, 100, taken.append)
        reader.start({(topic, 0): StandbyPartition(db, None, set())})
        kafka_io.produce_all(conf, topic, [(b"a", _v(1)), (b"b", _v(2))])
        _wait("the first records taken", lambda: sum(taken) >= 2)
        reader.stop()  # below its buffer: written only now
        through = int(db[OFFSET_KEY])
        assert through == 1 and db[b"a"] == _v(1)
        kafka_io.produce_all(conf, topic, [(b"a", _v(3))])
        taken.clear()
        reader.start({(topic, 0): StandbyPartition(db, through, set())})
        _wait("the next record taken", lambda: sum(taken) >= 1)
        reader.stop()
        assert sum(taken) == 1
        assert db[b"a"] == _v(3) and db[b"b"] == _v(2) and db[OFFSET_KEY] == b"2"
    finally:
        db.close()
