"""The one commit protocol: apply a batch of timeline records, publish, then write state.

Used by the Faust worker (with its table and its producer) and by replay (with a
`DictStore` and a collecting publisher) alike, so both run the very same steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from processor.stream.operator import Operator, Output
from processor.stream.records import LedgerEntry, Release
from processor.stream.state import BufferedStore, StateStore

#: The names `crash_point` is called with, in order (a test hook; see BatchCommit).
CRASH_POINTS = ("after_acks", "between_state_writes", "after_state")


class Publisher(Protocol):
    """Where the public records of a batch go (the ledger and private-count topics)."""

    async def publish(self, ledger: Sequence[LedgerEntry],
                      releases: Sequence[Release]) -> None:
        """Send, and return only once the broker acknowledged every record."""


class CollectingPublisher:
    """A Publisher that keeps what it is given (replay, tests, benchmarks)."""

    def __init__(self) -> None:
        self.ledger: list[LedgerEntry] = []
        self.releases: list[Release] = []

    async def publish(self, ledger: Sequence[LedgerEntry],
                      releases: Sequence[Release]) -> None:
        self.ledger.extend(ledger)
        self.releases.extend(releases)


class BatchCommit:
    """Applies batches of timeline records of one partition and makes them durable.

    `crash_point(name)` is a test hook: it is called "after_acks" once per batch, then
    "between_state_writes" between every two state writes, then "after_state"; the worker
    turns DPC_TEST_CRASH_AT=<name>:<k> into a SIGKILL at the k-th call. It has no other use.

    `fence()` is called before the publish and before the first state write; it does not
    return when this process may have lost its partitions meanwhile (the worker's
    `fencing.SuspensionFence`: a suspension past the session timeout), so a worker that
    another one has replaced neither publishes nor writes from its outdated state.
    """

    def __init__(self, operator: Operator, store: StateStore, publisher: Publisher,
                 crash_point: Callable[[str], None] | None = None,
                 fence: Callable[[], None] | None = None) -> None:
        self.operator = operator
        self.store = store
        self.publisher = publisher
        self.crash_point = crash_point
        self.fence = fence

    async def commit(self, partition: int, records: Sequence[tuple[int, bytes]]) -> Output:
        """Apply one batch of timeline records of one partition and make it durable.

        1. apply each record in offset order to a BufferedStore over `store` (nothing
           written);
        2. publish the ledger entries, then the releases, and await every ack;
        3. write the due-index values (buckets, then the directory);
        4. write each touched counter state once;
        5. delete the consumed buckets, and write the partition value (frontier, marker
           offset, duplicate filter) last.

        A crash before 3 re-executes the batch with identical noise (identical records,
        idempotent by (counter, tick)); a crash inside 3-5 leaves an index that is early,
        never late (buckets are deleted only after the counters they name are written),
        and counters that skip what they already applied (their last applied offset).
        Returns the batch's releases, ledger entries and aggregate metrics.
        """
        out = Output()
        buf = BufferedStore(self.store)
        try:
            for offset, record in sorted(records, key=lambda r: r[0]):
                self.operator.apply(buf, partition, offset, record, out)
            if out.ledger or out.releases:
                self._fence()
                await self.publisher.publish(out.ledger, out.releases)
            self._crash("after_acks")
            self._fence()
            store = self.store
            for i, (key, value) in enumerate(buf.writes()):
                if i:
                    self._crash("between_state_writes")
                if value is None:
                    store.delete(key)
                else:
                    store.set(key, value)
            self._crash("after_state")
        except BaseException:
            # Whatever was not written must be decoded again from the store next time.
            self.operator.forget()
            raise
        return out

    def _fence(self) -> None:
        if self.fence is not None:
            self.fence()

    def _crash(self, name: str) -> None:
        if self.crash_point is not None:
            self.crash_point(name)
