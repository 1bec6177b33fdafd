"""The one commit protocol: apply timeline records in memory, publish their releases at
once, and make the state durable at checkpoints, releases first.

Used by the Faust worker (per-partition RocksDB stores with the changelog, a librdkafka
sink) and by replay and tests (one `DictStore`, a collecting sink) alike, so
both run the very same steps. `CheckpointLoop` is the protocol (outputs acknowledged,
state written, changelog acknowledged; its crash points and fence), shared with the
bounding stage of privacy_unit = "user" (bounding.BoundCommit).

Between checkpoints the applied state lives in one `transaction.PartitionTransaction` per
partition, the operator's and the bounding stage's alike (decoded values, each encoded
once per checkpoint however many records touched it). A crash loses that state and
nothing else: the worker acknowledges a timeline record to the consumer group only after
the checkpoint that covers it, so the next owner re-applies it from the last checkpoint
with the same keyed noise, and re-sends byte-identical releases.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Protocol

from processor.stream.model.operator import Operator
from processor.stream.model.outputs import Output, Sink
from processor.stream.model.records import marker_tick
from processor.stream.model.state import StateStore
from processor.stream.model.transaction import PartitionTransaction

#: A lone marker record is applied on the event loop itself when it can step at most this
#: many counter ticks (the counters due through its tick times the ticks it seals, each
#: step ~10-50 us): a thread hand-off per marker costs more CPU than such a seal (every
#: tick, on every partition). A larger seal, or one of unknown size, runs in a thread.
INLINE_STEPS = 256

#: The names BatchCommit's `crash_point` is called with, in order (a test hook; see
#: CheckpointLoop).
CRASH_POINTS = ("after_acks", "between_state_writes", "after_state")


class Stores(Protocol):
    """Each partition's StateStore and when writes to them are durable: what a commit
    writes through (the worker's `table.WorkerStores`; a `DictStore` in replay and tests)."""

    def of(self, partition: int) -> StateStore: ...

    async def flush(self) -> None:
        """Return only once every write made so far is durable (its changelog records
        acknowledged); raise if one was not."""


class CheckpointLoop:
    """The commit protocol, whatever is applied (the operator's timeline records:
    BatchCommit; the bounding stage's units records: bounding.BoundCommit), each
    partition's changes staged in a `PartitionTransaction` until a checkpoint.

    A subclass opens a partition's transaction (`open_buffer`), applies records to
    `buffer(partition)` inside `applying(partition)` and hands the Output they produce
    to its sink there (`send`, after `fence`); nothing is durable until `checkpoint()`:

    1. await `sink.flush()`: every record handed over is acknowledged;
    2. `write_state()`: each transaction's write plan, partition by partition, in one
       `write_many` call each (each changed value once, in its slots' rank order; on the
       worker's stores one RocksDB write batch);
    3. await the stores' durability (changelog acknowledgements); the transactions
       complete (`written`).

    Only then may the caller acknowledge the records applied before it to the consumer
    group. A failure in `applying` or in a checkpoint fails every transaction, dropping
    every unwritten change (`forget`; a subclass drops its decoded values as well): the
    records are re-applied from the last acknowledged one.

    `crash_point(name)` is a test hook, called with `crash_names`: [0] once per
    checkpoint after step 1, [1] between any two partitions' write batches of step 2
    (the earlier ones made durable first: `between_writes`), [2] after step 3; the
    worker turns DPC_TEST_CRASH_AT=<name>:<k> into a SIGKILL at the k-th call. The
    writes are the same with or without it: one batch per partition.

    `fence()` is called before anything is handed to the outputs and before a
    checkpoint flushes or writes; it does not return when this process may have lost its
    partitions meanwhile (the worker's `fencing.SuspensionFence`). Safety does not rest
    on it (a value never replaces a newer one, and re-sent records are identical:
    docs/state.md); it keeps a process that knows it is stale from adding work.
    """

    #: The names `crash_point` is called with: after the acks, between two state
    #: writes, after the state.
    crash_names: tuple[str, str, str] = CRASH_POINTS

    def __init__(self, stores: Stores, sink: Sink,
                 crash_point: Callable[[str], None] | None = None,
                 fence: Callable[[], None] | None = None, offload: bool = False) -> None:
        #: Run the heavy steps in a thread, so that the event loop of a worker keeps its
        #: group heartbeats going meanwhile. One step at a time still: the caller awaits
        #: each.
        self.offload = offload
        self.stores = stores
        self.sink = sink
        self.crash_point = crash_point
        self.fence = fence
        self._buffers: dict[int, PartitionTransaction] = {}
        #: Monotonic time of the first apply since the last checkpoint (None: clean).
        self.dirty_since: float | None = None

    def open_buffer(self, partition: int) -> PartitionTransaction:
        """A fresh transaction over the partition's store (the subclass's slots)."""
        raise NotImplementedError

    def buffer(self, partition: int) -> PartitionTransaction:
        """The partition's applied, unwritten state."""
        buf = self._buffers.get(partition)
        if buf is None:
            buf = self._buffers[partition] = self.open_buffer(partition)
        return buf

    @contextmanager
    def applying(self, partition: int) -> Iterator[PartitionTransaction]:
        """Around one apply: yields the partition's transaction; a failure forgets every
        unwritten change (and is raised), a success leaves the state to checkpoint."""
        try:
            yield self.buffer(partition)
        except BaseException:
            self.forget()
            raise
        if self.dirty_since is None:
            self.dirty_since = time.monotonic()

    def changed(self, partition: int) -> bool:
        """Whether the partition has a change for the next checkpoint to write (its
        transaction staged a value). A record that changed nothing (a clock probe, a
        marker through a tick the partition already sealed, a duplicate) leaves it
        False."""
        buf = self._buffers.get(partition)
        return buf is not None and buf.staged

    def send(self, out: Output) -> None:
        """Hand `out`'s records to the sink at once (after `fence`), if it has any."""
        if out.has_records():
            self._fence()
            self.sink.send(out)

    async def between_writes(self) -> None:
        """Between two partitions' write batches when `crash_point` is set: the earlier
        ones made durable, then the crash point (a kill there leaves exactly a prefix of
        the batches)."""
        await self.stores.flush()
        self._crash(self.crash_names[1])

    def _write_partition(self, partition: int) -> bool:
        """Write the partition's transaction's plan in one batch; False if it had none."""
        plan = self._buffers[partition].prepare()
        if not plan:
            return False
        self.stores.of(partition).write_many(plan)
        return True

    def _write_all(self) -> None:
        """Every partition's batch, in partition order (`write_state` without a crash
        point, in one thread hop)."""
        for partition in sorted(self._buffers):
            self._write_partition(partition)

    async def write_state(self) -> None:
        """Step 2: write each changed value of every transaction once, one batch per
        partition in partition order (in a thread when `offload`: all of them in one
        hop, as nothing runs between two of them), calling `between_writes` between two
        batches when `crash_point` is set."""
        if self.offload and self.crash_point is None:
            await asyncio.to_thread(self._write_all)
            return
        written = False
        for partition in sorted(self._buffers):
            if written and self.crash_point is not None and self._buffers[partition].staged:
                await self.between_writes()
            if self.offload:
                written = await asyncio.to_thread(self._write_partition, partition) or written
            else:
                written = self._write_partition(partition) or written

    async def checkpoint(self) -> None:
        """Make everything applied so far durable (see the class doc). With nothing
        applied since the last one, there is nothing to do (and no crash point)."""
        if self.dirty_since is None:
            return
        try:
            self._fence()
            await self.sink.flush()
            self._crash(self.crash_names[0])
            self._fence()
            await self.write_state()
            await self.stores.flush()
            self._crash(self.crash_names[2])
        except BaseException:
            self.forget()
            raise
        self.written()
        self.dirty_since = None

    def written(self) -> None:
        """After a checkpoint made every transaction's plan durable: they complete, and
        the next record of a partition opens a new one."""
        for txn in self._buffers.values():
            txn.complete()
        self._buffers.clear()

    def forget(self) -> None:
        """Fail every open transaction, dropping every applied but unwritten change: the
        next record of a partition reloads it from its store (after a failure, or when
        the partitions change hands). A subclass drops its decoded values as well."""
        for txn in self._buffers.values():
            txn.fail()
        self._buffers.clear()
        self.dirty_since = None

    def _fence(self) -> None:
        if self.fence is not None:
            self.fence()

    def _crash(self, name: str) -> None:
        if self.crash_point is not None:
            self.crash_point(name)


class BatchCommit(CheckpointLoop):
    """Applies batches of timeline records and makes them durable at checkpoints, by
    the CheckpointLoop protocol (crash points: CRASH_POINTS).

    `apply(partition, records)` applies records in offset order to the partition's
    buffered state and hands the releases they produce to the sink at once (their
    existence, order and timing follow the markers, never the checkpoints).
    `checkpoint()`:

    1. await the sink's acknowledgement of every release and ledger entry sent;
    2. write each changed value once per partition, by its transaction's write plan:
       counter states, then the partition value (transaction.PartitionTransaction); on
       the worker's stores a partition's plan is one RocksDB write batch. A checkpoint
       that is not `full` leaves out counters that markers advanced by ⊥ ticks only,
       within the operator's bound (`Operator.stage_deferred`);
    3. await the stores' durability (changelog acknowledgements).

    Only then may the caller acknowledge the records applied before it to the consumer
    group. A crash anywhere re-applies from the last acknowledged record: before 2 with
    identical noise (identical records: idempotent by (counter, tick)); inside 2 or 3
    onto values that skip what they reflect already (their offset), so nothing is lost
    or counted twice; a failure fails the transactions and forgets every decoded value.
    `commit(partition, records)` is apply and checkpoint in one. A batch that holds
    ledger entries is first handed to `vet` (the worker's: it reads the ledger on and
    refuses a creation the ledger announced under another), which raises to keep all of
    it from being published.
    """

    def __init__(self, operator: Operator, stores: Stores, sink: Sink,
                 crash_point: Callable[[str], None] | None = None,
                 fence: Callable[[], None] | None = None, offload: bool = False,
                 vet: Callable[[Output], Awaitable[None]] | None = None) -> None:
        # offload: a batch with a marker (it may create or seal thousands of counters)
        # and a checkpoint's encoding and writes run in a thread.
        super().__init__(stores, sink, crash_point, fence, offload)
        self.operator = operator
        #: Awaited with a batch's Output before it is sent when it holds ledger entries
        #: (None: nothing to check). It raises to keep the batch from being published:
        #: the worker reads the ledger on and refuses a creation it announced under
        #: another (`Operator.check_ledger`; docs/state.md).
        self.vet = vet
        #: Partition -> the newest tick a marker applied here sealed (what `_heavy` counts
        #: the ticks of the next marker from); emptied by `forget`.
        self._sealed: dict[int, int] = {}

    def open_buffer(self, partition: int) -> PartitionTransaction:
        return self.operator.transaction(self.stores.of(partition))

    async def apply(self, partition: int, records: Sequence[tuple[int, bytes]],
                    stamps: Mapping[int, int] | None = None) -> Output:
        """Apply one batch of timeline records of one partition and send what it
        publishes; nothing is durable until `checkpoint`. `stamps`: offset -> the record's
        Kafka timestamp, where known (Operator.apply). Returns the batch's releases,
        ledger entries and aggregate metrics."""
        out = Output()
        with self.applying(partition) as txn:
            if self.offload and self._heavy(partition, records):
                await asyncio.to_thread(self._apply_all, txn, partition, records, stamps, out)
            else:
                self._apply_all(txn, partition, records, stamps, out)
            if out.ledger and self.vet is not None:
                await self.vet(out)
            self.send(out)
        if out.sealed_through is not None:
            self._sealed[partition] = max(out.sealed_through,
                                          self._sealed.get(partition, out.sealed_through))
        return out

    def _heavy(self, partition: int, records: Sequence[tuple[int, bytes]]) -> bool:
        """Whether a batch may seal more than INLINE_STEPS counter ticks: any marker with
        other records (their events file counters first), a marker before this partition's
        due wheel is loaded or its last seal known, or one whose due counters times its
        ticks exceed INLINE_STEPS."""
        tick = next((n for _o, r in records if (n := marker_tick(r)) is not None), None)
        if tick is None:
            return False
        wheel = self.operator.due_wheel(partition)
        last = self._sealed.get(partition)
        if len(records) > 1 or wheel is None or last is None:
            return True
        span = max(1, tick - last)
        return wheel.due_through(tick, INLINE_STEPS // span) * span > INLINE_STEPS

    def _apply_all(self, txn: PartitionTransaction, partition: int,
                   records: Sequence[tuple[int, bytes]], stamps: Mapping[int, int] | None,
                   out: Output) -> None:
        for offset, record in sorted(records, key=lambda r: r[0]):
            self.operator.apply(txn, partition, offset, record, out,
                                None if stamps is None else stamps.get(offset))

    async def checkpoint(self, full: bool = True) -> None:
        """The CheckpointLoop checkpoint. `full` (a clean stop, a revocation, a commit)
        writes every counter as it is; otherwise counters that markers advanced by ⊥ ticks
        only may stay behind in the store, within the operator's bound
        (`Operator.stage_deferred`, docs/state.md)."""
        if full:
            for partition in self.operator.deferred_partitions():
                with self.applying(partition) as txn:
                    if self.offload:
                        # Thousands of counters may be sealed and encoded here (a
                        # million idle ones: a minute of CPU) as in a large marker.
                        await asyncio.to_thread(self.operator.stage_deferred, txn, partition)
                    else:
                        self.operator.stage_deferred(txn, partition)
        await super().checkpoint()

    async def commit(self, partition: int, records: Sequence[tuple[int, bytes]],
                     stamps: Mapping[int, int] | None = None) -> Output:
        """`apply` then `checkpoint`: one batch made durable on its own."""
        out = await self.apply(partition, records, stamps)
        await self.checkpoint()
        return out

    def forget(self) -> None:
        """Fail every open transaction and drop every decoded value (the operator's)."""
        super().forget()
        self.operator.forget()
        self._sealed.clear()

