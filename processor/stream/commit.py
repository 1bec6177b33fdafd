"""The one commit protocol: apply timeline records in memory, publish their releases at
once, and make the state durable at checkpoints, releases first.

Used by the Faust worker (per-partition RocksDB stores with the changelog, a librdkafka
publisher) and by replay and tests (one `DictStore`, a collecting publisher) alike, so
both run the very same steps.

Between checkpoints the applied state lives in one `transaction.PartitionTransaction` per
partition (decoded values, each encoded once per checkpoint however many records touched
it). A crash loses
that state and nothing else: the worker acknowledges a timeline record to the consumer
group only after the checkpoint that covers it, so the next owner re-applies it from the
last checkpoint with the same keyed noise, and re-sends byte-identical releases.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from processor.stream.operator import Operator, Output
from processor.stream.records import LedgerEntry, Release, marker_tick
from processor.stream.state import StateStore, write_all
from processor.stream.transaction import PartitionTransaction

#: The names `crash_point` is called with, in order (a test hook; see BatchCommit).
CRASH_POINTS = ("after_acks", "between_state_writes", "after_state")


class Publisher(Protocol):
    """Where the public records go (the ledger and private-count topics)."""

    def send(self, ledger: Sequence[LedgerEntry], releases: Sequence[Release]) -> None:
        """Hand the records over, ledger entries before releases, in order (the
        publisher may buffer them; it must not drop or reorder them)."""

    async def flush(self) -> None:
        """Return only once the broker acknowledged every record sent so far; raise if
        any was not."""


class CollectingPublisher:
    """A Publisher that keeps what it is given (replay, tests, benchmarks)."""

    def __init__(self) -> None:
        self.ledger: list[LedgerEntry] = []
        self.releases: list[Release] = []

    def send(self, ledger: Sequence[LedgerEntry], releases: Sequence[Release]) -> None:
        self.ledger.extend(ledger)
        self.releases.extend(releases)

    async def flush(self) -> None:
        return None


class Stores(Protocol):
    """Each partition's StateStore, and when what was written to them is durable."""

    def of(self, partition: int) -> StateStore: ...

    async def flush(self) -> None:
        """Return only once every write made so far is durable (its changelog records
        acknowledged); raise if one was not."""


class SharedStore:
    """One StateStore for every partition, durable as soon as written (replay, tests)."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def of(self, partition: int) -> StateStore:
        return self.store

    async def flush(self) -> None:
        return None


class BatchCommit:
    """Applies batches of timeline records and makes them durable at checkpoints.

    `apply(partition, records)` applies records in offset order to the partition's
    buffered state and hands the releases they produce to the publisher at once (their
    existence, order and timing follow the markers, never the checkpoints).
    `checkpoint()`:

    1. await the publisher's acknowledgement of every release and ledger entry sent;
    2. write each changed value once per partition: counter states, then the partition
       value (each partition transaction's write plan: `PartitionTransaction.prepare`);
    3. await the stores' durability (changelog acknowledgements), then complete the
       transactions.

    Only then may the caller acknowledge the records applied before it to the consumer
    group. A crash anywhere re-applies from the last acknowledged record: before 2 with
    identical noise (identical records: idempotent by (counter, tick)); inside 2 or 3
    onto values that skip what they reflect already (their offset), so nothing is lost
    or counted twice; a failure fails the transactions and forgets every decoded value.
    `commit(partition, records)` is apply and checkpoint in one.

    `crash_point(name)` is a test hook: called "after_acks" once per checkpoint, then
    "between_state_writes" between every two state writes (each write made durable
    first, so that a kill there leaves exactly a prefix of them), then "after_state";
    the worker turns DPC_TEST_CRASH_AT=<name>:<k> into a SIGKILL at the k-th call.

    `fence()` is called before a checkpoint publishes or writes; it does not return when
    this process may have lost its partitions meanwhile (the worker's
    `fencing.SuspensionFence`). Safety does not rest on it (a value never replaces a
    newer one, and re-sent releases are identical: docs/state.md); it keeps a process
    that knows it is stale from adding work.
    """

    def __init__(self, operator: Operator, store: StateStore | Stores, publisher: Publisher,
                 crash_point: Callable[[str], None] | None = None,
                 fence: Callable[[], None] | None = None, offload: bool = False) -> None:
        self.operator = operator
        #: Run the heavy steps (a batch with a marker: it may create or seal thousands of
        #: counters; a checkpoint's encoding and writes) in a thread, so that the event
        #: loop of a worker keeps its group heartbeats going meanwhile. One step at a time
        #: still: the caller awaits each.
        self.offload = offload
        self.stores: Stores = _stores(store)
        self.publisher = publisher
        self.crash_point = crash_point
        self.fence = fence
        #: The open transaction of each partition applied to since the last checkpoint.
        self._transactions: dict[int, PartitionTransaction] = {}
        #: Monotonic time of the first apply since the last checkpoint (None: clean).
        self.dirty_since: float | None = None

    async def apply(self, partition: int, records: Sequence[tuple[int, bytes]],
                    stamps: Mapping[int, int] | None = None) -> Output:
        """Apply one batch of timeline records of one partition and send what it
        publishes; nothing is durable until `checkpoint`. `stamps`: offset -> the record's
        Kafka timestamp, where known (Operator.apply). Returns the batch's releases,
        ledger entries and aggregate metrics."""
        out = Output()
        txn = self._transactions.get(partition)
        if txn is None:
            txn = self._transactions[partition] = self.operator.transaction(
                self.stores.of(partition))
        try:
            if self.offload and any(marker_tick(r) is not None for _o, r in records):
                await asyncio.to_thread(self._apply_all, txn, partition, records, stamps, out)
            else:
                self._apply_all(txn, partition, records, stamps, out)
            if out.ledger or out.releases:
                self._fence()
                self.publisher.send(out.ledger, out.releases)
        except BaseException:
            self.forget()
            raise
        if self.dirty_since is None:
            self.dirty_since = time.monotonic()
        return out

    def _apply_all(self, txn: PartitionTransaction, partition: int,
                   records: Sequence[tuple[int, bytes]], stamps: Mapping[int, int] | None,
                   out: Output) -> None:
        for offset, record in sorted(records, key=lambda r: r[0]):
            self.operator.apply(txn, partition, offset, record, out,
                                None if stamps is None else stamps.get(offset))

    def _write_all(self) -> None:
        """Step 2 without crash points: every transaction's write plan, in order."""
        for partition in sorted(self._transactions):
            plan = self._transactions[partition].prepare()
            if plan:
                write_all(self.stores.of(partition), plan)

    async def _write_each(self) -> None:
        """Step 2 in test mode: each write acknowledged before the next, a crash point
        between any two (a kill there leaves exactly a prefix of them)."""
        first = True
        for partition in sorted(self._transactions):
            plan = self._transactions[partition].prepare()
            if not plan:
                continue
            store = self.stores.of(partition)
            for key, value in plan:
                if not first:
                    await self.stores.flush()
                    self._crash("between_state_writes")
                first = False
                store.set(key, value)

    async def checkpoint(self) -> None:
        """Make everything applied so far durable (see the class doc). With nothing
        applied since the last one, there is nothing to do (and no crash point)."""
        if self.dirty_since is None:
            return
        try:
            self._fence()
            await self.publisher.flush()
            self._crash("after_acks")
            self._fence()
            if self.crash_point is not None:
                await self._write_each()
            elif self.offload:
                await asyncio.to_thread(self._write_all)
            else:
                self._write_all()
            await self.stores.flush()
            self._crash("after_state")
        except BaseException:
            self.forget()
            raise
        for txn in self._transactions.values():
            txn.complete()
        self._transactions.clear()
        self.dirty_since = None

    async def commit(self, partition: int, records: Sequence[tuple[int, bytes]],
                     stamps: Mapping[int, int] | None = None) -> Output:
        """`apply` then `checkpoint`: one batch made durable on its own."""
        out = await self.apply(partition, records, stamps)
        await self.checkpoint()
        return out

    def forget(self) -> None:
        """Fail every open transaction, dropping every applied but unwritten change and
        every decoded value: the next record of a partition reloads it from its store
        (after a failure, or when the partitions change hands)."""
        for txn in self._transactions.values():
            txn.fail()
        self._transactions.clear()
        self.operator.forget()
        self.dirty_since = None

    def _fence(self) -> None:
        if self.fence is not None:
            self.fence()

    def _crash(self, name: str) -> None:
        if self.crash_point is not None:
            self.crash_point(name)


def _stores(store: StateStore | Stores) -> Stores:
    if callable(getattr(store, "of", None)) and callable(getattr(store, "flush", None)):
        return store  # type: ignore[return-value]
    return SharedStore(store)  # type: ignore[arg-type]
