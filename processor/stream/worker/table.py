"""The operator's state table on Faust: a RocksDB database per partition, restored and
kept on standbys by Faust from a compacted changelog topic, written by the operator's
checkpoints through librdkafka.

Three things differ from a plain Faust table, each for one reason (docs/state.md):

- `MonotoneTable.apply_changelog_batch` (restore and standby) keeps, per key, the value
  `state.supersedes` picks: never one that reflects less of the timeline than the value
  held. A worker cut off from the brokers while it keeps running may write its state
  after the new owner's; nobody then restores or continues from it.
- Checkpoints write the local database and produce the changelog records themselves
  (`PartitionStore`), through the worker's `AsyncProducer`: one record per changed value
  per checkpoint, in C, not one Faust send per write on the event loop.
- Faust marks a database "up to date through offset X" (its persisted offset, where the
  next restore starts reading) at every acknowledged write of its own. That is wrong
  when another writer's records sit between this process's (the case above: this
  process's late writes land after the new owner's, and the restore would skip the new
  owner's). `ChangelogTracker` (model/restore.py, pure) moves the persisted offset over
  this process's own writes only while their acknowledged offsets follow each other
  without a gap; after any gap it leaves it where the last read ended, so the next
  restore reads, and merges, every record in between.
- Compaction keeps the LAST record of each key, not the newest state: a late, older
  write that lands after the owner's newer value would survive compaction and become
  what a restore from scratch reads. So the owner writes its values again wherever an
  older one may have landed last: every value of a partition after a gap among its own
  writes (it cannot see what landed), and each key a restore found stale
  (`MonotoneTable.stale`), at the end of the next checkpoint (`WorkerStores.flush`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import faust
from faust.types import TP
from rocksdict import WriteBatch

from processor.stream.kafka.producer import AsyncProducer
from processor.stream.model.restore import ChangelogTracker, merge_changelog, persist_after
from processor.stream.model.state import StateStore
from processor.stream.model.transaction import StoreGeneration
from processor.stream.worker.heap import HeapTrim
from processor.stream.worker.stale import OFFSET_KEY

#: RocksDB options of the state tables (one database per partition). Faust's default
#: memtable is 64 MiB, and the write-ahead log is kept until the memtable is flushed: with
#: counter states rewritten at every batch, the WAL alone grew to 10x the table's live
#: size. A small memtable is flushed (and its WAL dropped) often; flushing keeps only the
#: latest value of each key, so the files stay near the live size. Faust's default block
#: cache is 2 GiB per database, so it ends up holding every value once read (the whole
#: state, about 1 KB a counter: 87 MiB for 100,000 counters in 4 partitions); the operator
#: keeps its own cache of decoded counters, and reads past a small block cache cost no
#: measurable CPU more (the blocks are in the page cache).
ROCKSDB_OPTIONS: Final = {"write_buffer_size": 4 << 20, "max_write_buffer_number": 2,
                          "block_cache_size": 8 << 20}
#: Rounds of rewriting per checkpoint while foreign writes keep landing among them (the
#: rest waits for the next checkpoint).
REWRITE_ROUNDS = 3
#: Changelog records of a partition a standby copy holds before it writes them (Faust's
#: default is 1,000): a key's records repeat across checkpoints, and one write batch
#: writes each key once, so a buffer spanning several checkpoints writes a fraction of
#: the records. The standby reader (standby.py) writes what it holds when it stops, at
#: every rebalance, and moves the persisted offset only over what it wrote: a crash
#: loses nothing but re-reading.
STANDBY_BUFFER = 10_000


def merged_batch(writes: dict[bytes, bytes | None], through: int | None = None) -> WriteBatch:
    """One RocksDB write batch of a changelog merge's `writes` (None: delete the key) and,
    when `through` is given, the persisted offset of the last record they cover: values
    and offset land together or not at all (the bulk load, the standby reader)."""
    wb = WriteBatch(raw_mode=True)
    for key, value in writes.items():
        if value is None:
            wb.delete(key)
        else:
            wb.put(key, value)
    if through is not None:
        wb.put(OFFSET_KEY, str(through).encode())
    return wb


class MonotoneTable(faust.Table[bytes, bytes]):
    """A Faust table of raw bytes whose changelog apply never lets a value go back."""

    #: Faust names a service's logger after its module: kept as it was before the
    #: worker package, so that log lines keep their logger names.
    logger = logging.getLogger("processor.stream.table")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("standby_buffer_size", STANDBY_BUFFER)
        super().__init__(*args, **kwargs)
        #: partition -> keys whose last changelog record read here was older than the
        #: value held: the owner writes them again (WorkerStores.flush).
        self.stale: dict[int, set[bytes]] = defaultdict(set)

    def apply_changelog_batch(self, batch: Iterable[Any]) -> None:
        """Faust's restore and standby apply (a buffer of changelog events): per
        partition, the monotone merge (`merge_changelog`) and one write batch; then the
        persisted offsets."""
        store: Any = self.data  # faust's RocksDB store: one database per partition
        records: dict[int, list[tuple[bytes, bytes | None]]] = defaultdict(list)
        offsets: dict[TP, int] = {}
        for event in batch:
            msg = event.message
            if msg.offset > offsets.get(msg.tp, -1):
                offsets[msg.tp] = msg.offset
            if msg.key is not None:
                records[msg.partition].append((msg.key, msg.value))
        for partition, recs in records.items():
            db = store._db_for_partition(partition)
            writes, stale = merge_changelog(recs, db.get)
            stale_keys = self.stale[partition]
            stale_keys.difference_update(writes)
            stale_keys.update(stale)
            if writes:
                db.write(merged_batch(writes))
        for tp, offset in offsets.items():
            store.set_persisted_offset(tp, offset)


class PartitionStore:
    """The worker's state.StateStore: one partition's RocksDB database, each write also
    a changelog record of the same partition, sent through the producer."""

    shares_bytes = False

    def __init__(self, table: MonotoneTable, partition: int, producer: AsyncProducer,
                 changelog: str, heap: HeapTrim | None = None) -> None:
        self._table = table
        self._partition = partition
        self._producer = producer
        self._changelog = changelog
        self._heap = heap
        self._generation = StoreGeneration()

    def db(self) -> Any:
        """The partition's rocksdict database (raw bytes keys and values)."""
        store: Any = self._table.data
        return store._db_for_partition(self._partition)

    def generation(self) -> int | None:
        """From the database's sequence number, which any write to it moves: a restore's,
        a standby copy's, this store's own `set` (transaction.StoreGeneration)."""
        db = self.db()
        return self._generation.now(db, db.latest_sequence_number())

    def set_persisted_offset(self, offset: int) -> None:
        """Persist the changelog offset this partition's database reflects (Faust's
        offset key, one write): it writes no value a cache holds, so it keeps the
        generation."""
        db = self.db()
        before = db.latest_sequence_number()
        self._table.data.set_persisted_offset(TP(self._changelog, self._partition), offset)
        self._generation.wrote(db, before, db.latest_sequence_number(), 1)

    def get(self, key: str) -> bytes | None:
        value = self.db().get(key.encode("utf-8"))
        return None if value is None else bytes(value)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """One rocksdict multi-get (RocksDB's MultiGet: one call into the database for
        every key, instead of one Python call and lookup each)."""
        if not keys:
            return []
        got = self.db().get([k.encode("utf-8") for k in keys])
        return [None if v is None else bytes(v) for v in got]

    def set(self, key: str, value: bytes) -> None:
        raw = key.encode("utf-8")
        self.db().put(raw, value)
        self._producer.produce(self._changelog, value, key=raw, partition=self._partition)

    def delete(self, key: str) -> None:
        raw = key.encode("utf-8")
        self.db().delete(raw)
        self._producer.produce(self._changelog, None, key=raw, partition=self._partition)

    def write_many(self, writes: Iterable[tuple[str, bytes]]) -> None:
        """Several writes in one RocksDB write batch, then their changelog records in
        order: one database write per checkpoint and partition instead of one per value
        (a checkpoint's plan, a value per counter or unit touched)."""
        wb = WriteBatch(raw_mode=True)
        records: list[tuple[bytes, bytes]] = []
        for key, value in writes:
            raw = key.encode("utf-8")
            wb.put(raw, value)
            records.append((raw, value))
        db = self.db()
        before = db.latest_sequence_number()
        db.write(wb)
        self._generation.wrote(db, before, db.latest_sequence_number(), len(records))
        self._producer.produce_many(self._changelog, records, self._partition)
        if self._heap is not None:
            self._heap.written(len(records))

    def scan(self, prefix: str) -> Iterator[tuple[str, bytes]]:
        start = prefix.encode("utf-8")
        for key, value in self.db().items(from_key=start):
            if not key.startswith(start):
                return
            yield key.decode("utf-8"), bytes(value)


class WorkerStores:
    """The worker's commit.Stores: a PartitionStore per partition of a stage's table.

    `flush` awaits the changelog acknowledgements, then moves each partition's persisted
    offset over this process's own writes where the tracker saw no gap."""

    def __init__(self, table: MonotoneTable, producer: AsyncProducer, changelog: str,
                 tracker: ChangelogTracker, prefixes: Sequence[str]) -> None:
        self._table = table
        #: The key prefixes of every value the stage stores (what a rewrite covers: all
        #: of them, or a zombie's older value of an unlisted kind outlives compaction).
        self._prefixes = tuple(prefixes)
        self._producer = producer
        self._changelog = changelog
        self._tracker = tracker
        self._stores: dict[int, PartitionStore] = {}
        #: Values written again over older ones that may have landed last (_rewrite).
        self.rewritten = 0
        #: The heap handed back after checkpoints that wrote many values (heap.py).
        self.heap = HeapTrim()

    def read(self, partition: int, key: str) -> bytes | None:
        """A stored value, read without opening the partition for writes (no changelog
        tracking begins: its restore may still run)."""
        return PartitionStore(self._table, partition, self._producer, self._changelog).get(key)

    def of(self, partition: int) -> StateStore:
        store = self._stores.get(partition)
        if store is None:
            tp = TP(self._changelog, partition)
            self._tracker.begin(partition, self._table.persisted_offset(tp))
            store = self._stores[partition] = PartitionStore(
                self._table, partition, self._producer, self._changelog, self.heap)
        return store

    async def flush(self) -> None:
        await self._producer.flush()
        for _ in range(REWRITE_ROUNDS):
            if not self._rewrite():
                break
            await self._producer.flush()
        for partition in self._stores:
            through = self._tracker.read_through(partition)
            if through is None:
                continue  # unknown: no read of the persisted offset either
            tp = TP(self._changelog, partition)
            moved = persist_after(through, self._table.persisted_offset(tp))
            if moved is not None:
                self._stores[partition].set_persisted_offset(moved)
        self.heap.after_flush()

    def _rewrite(self) -> int:
        """Write again, as they are now, every value of each owned partition where a
        foreign write landed among this process's, and each key a restore found stale;
        returns how many records that produced."""
        gaps = self._tracker.take_gaps()
        n = 0
        for partition, store in self._stores.items():
            if partition in gaps:
                keys: list[bytes] = [k.encode("utf-8") for prefix in self._prefixes
                                     for k, _v in store.scan(prefix)]
            else:
                keys = sorted(self._table.stale.get(partition, ()))
            if not keys:
                continue
            db = store.db()
            for key in keys:
                value = db.get(key)
                if value is not None:
                    self._producer.produce(self._changelog, bytes(value), key=key,
                                           partition=partition)
                    n += 1
            self._table.stale.pop(partition, None)
        self.rewritten += n
        return n

    def release(self) -> None:
        """Forget every partition (they changed hands, or the worker stops): the next use
        of one starts tracking anew from its database's persisted offset."""
        for partition in self._stores:
            self._tracker.end(partition)
        self._stores.clear()
