"""The bulk load: the local partition databases filled from their changelog topics before
the worker joins its group, in large batches, so that Faust's recovery at the assignment
reads only what was written since.

Faust's recovery takes one changelog record per turn of the event loop (a few thousand a
second); this load reads each changelog partition with one confluent-kafka consumer
(read_committed, large fetches) from just after the database's persisted offset (or the
partition's first record) up to the high watermark it had when the load began
(`restore.load_span`), merges every record by the monotone rule
(`restore.PartitionLoad`, `state.supersedes`) and writes the values and the persisted
offset of the last record they cover in ONE RocksDB write batch per chunk: a crash at any
point leaves a database whose persisted offset says exactly what it applied. Nothing
here runs while the worker is in its group: no rebalance can move a partition under the
load. Every partition of each changelog is loaded (the worker does not know yet which it
will own or keep a standby copy of); the completeness argument is in docs/state.md,
"Restore".

The load stops early, without error, when the brokers do not deliver the span within
LOAD_TIMEOUT_S: what it applied is persisted, and Faust's recovery reads the rest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from confluent_kafka import KafkaException
from rocksdict import Options as RdictOptions
from rocksdict import Rdict

from processor.stream.kafka import kafka_io
from processor.stream.model.restore import Chunk, PartitionLoad, load_span
from processor.stream.worker.stale import OFFSET_KEY
from processor.stream.worker.table import merged_batch

log = logging.getLogger("processor.stream.bulkload")

#: The crash point (faults.py) reached after each write batch of the load.
CHUNK_WRITTEN: Final = "bulk_chunk_written"

#: Records of one partition per database write batch: large enough that a batch's fixed
#: cost vanishes, small enough that a crash repeats little and memory stays small.
CHUNK_RECORDS: Final = 20_000
#: How long the load waits for the brokers to deliver its spans before it leaves the
#: rest to Faust's recovery.
LOAD_TIMEOUT_S: Final = 300.0
#: The memtable of a database being loaded: a load writes each partition's whole state
#: at once, in few large flushes.
_WRITE_BUFFER: Final = 16 << 20


class LocalDatabaseError(Exception):
    """A local partition database could not be opened or written (the cause attached,
    the database's path or partition the argument)."""


@dataclass
class LoadResult:
    """What the load applied: changelog records read, partitions read, seconds, whether
    every span was read to its end, and per table and partition the keys whose last
    record read was older than the value held (MonotoneTable.stale)."""

    records: int = 0
    partitions: int = 0
    seconds: float = 0.0
    complete: bool = True
    stale: dict[str, dict[int, set[bytes]]] = field(default_factory=dict)


def bulk_load(conf: Mapping[str, str], tabledir: Path, tables: Mapping[str, str], *,
              timeout_s: float = LOAD_TIMEOUT_S, chunk: int = CHUNK_RECORDS,
              crash_point: Callable[[str], None] | None = None) -> LoadResult:
    """Load every partition of each changelog `tables` names (table name -> changelog
    topic) into `tabledir/<table>-<partition>.db` (Faust's file names). A topic the
    brokers do not have has nothing to load. `crash_point` is the kill -9 tests' hook
    (faults.py; None: none), called with CHUNK_WRITTEN after each write batch."""
    began = time.monotonic()
    result = LoadResult()
    tabledir.mkdir(parents=True, exist_ok=True)
    for table, topic in tables.items():
        try:
            marks = kafka_io.end_offsets(conf, topic)
        except RuntimeError:  # no such topic yet
            continue
        except KafkaException as exc:  # the brokers went away since the start's checks
            result.complete = False
            log.warning("bulk load of %s skipped (%s): the recovery reads it all", topic,
                        type(exc).__name__)
            continue
        _load_topic(conf, tabledir, table, topic, marks, timeout_s, chunk, result,
                    crash_point)
    result.seconds = time.monotonic() - began
    return result


def _open(path: Path) -> Any:
    options = RdictOptions(raw_mode=True)
    options.create_if_missing(True)
    options.set_write_buffer_size(_WRITE_BUFFER)
    try:
        return Rdict(str(path), options=options)
    except Exception as exc:  # rocksdict raises plain Exception("Corruption: ...")
        raise LocalDatabaseError(str(path)) from exc


def _load_topic(conf: Mapping[str, str], tabledir: Path, table: str, topic: str,
                marks: Mapping[int, tuple[int, int]], timeout_s: float, chunk: int,
                result: LoadResult, crash_point: Callable[[str], None] | None) -> None:
    dbs: dict[int, Any] = {}
    loads: dict[int, PartitionLoad] = {}
    try:
        for partition, (low, high) in sorted(marks.items()):
            db = dbs[partition] = _open(tabledir / f"{table}-{partition}.db")
            raw = db.get(OFFSET_KEY)
            span = load_span(partition, None if raw is None else int(raw), low, high)
            if span is not None:
                loads[partition] = PartitionLoad(span)
        pending: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {
            p: [] for p in loads}
        spans = {p: (load.span.first, load.span.end) for p, load in loads.items()}
        try:
            for msg in kafka_io.messages(conf, topic, spans, timeout_s):
                partition = msg.partition()
                buf = pending[partition]
                buf.append((msg.offset(), msg.key(), msg.value()))
                if len(buf) >= chunk:
                    result.records += _apply(dbs[partition], loads[partition], buf)
                    buf.clear()
                    if crash_point is not None:
                        crash_point(CHUNK_WRITTEN)
        except (TimeoutError, RuntimeError, KafkaException) as exc:
            # Whatever was read is a run of consecutive records of its partition: it is
            # applied below; the rest is Faust's recovery's.
            result.complete = False
            log.warning("bulk load of %s stopped early (%s): the recovery reads the rest",
                        topic, type(exc).__name__)
        for partition, buf in pending.items():
            if buf:
                result.records += _apply(dbs[partition], loads[partition], buf)
                if crash_point is not None:
                    crash_point(CHUNK_WRITTEN)
        result.partitions += len(loads)
        stale = {p: load.stale for p, load in loads.items() if load.stale}
        if stale:
            result.stale.setdefault(table, {}).update(stale)
    finally:
        for db in dbs.values():
            db.close()


def _apply(db: Any, load: PartitionLoad,
           records: list[tuple[int, bytes | None, bytes | None]]) -> int:
    """Merge `records` into `db` and persist the offset of the last of them, in one write
    batch; returns how many records were read."""
    got: Chunk | None = load.take(records, db.get)
    if got is None:
        return 0
    try:
        db.write(merged_batch(got.writes, got.through))
    except Exception as exc:  # rocksdict raises plain Exception (disk full, I/O error)
        raise LocalDatabaseError(load.span.partition) from exc
    return len(records)
