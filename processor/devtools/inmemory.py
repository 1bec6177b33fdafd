"""An in-memory stand-in for the store seam of the stream layer, for the tests and the
benchmarks (nothing in the runtime path imports this): a store that copies its bytes as
RocksDB does."""

from __future__ import annotations

from collections.abc import Iterable

from processor.stream.model.state import DictStore
from processor.stream.model.transaction import StoreGeneration


class CopyingStore(DictStore):
    """A DictStore that keeps and returns copies of its bytes, as RocksDB does, and
    counts its writes as RocksDB's sequence number does (`sequence`: one per key set or
    deleted), from which it tells its generation as the worker's store does.

    A DictStore shares one bytes object between the store and the state cache's check,
    so the cache keeps no digests over it (transaction.py): this one exercises the
    worker's path in tests and benchmarks."""

    shares_bytes = False

    def __init__(self) -> None:
        super().__init__()
        self.sequence = 0
        self._generation = StoreGeneration()

    def generation(self) -> int | None:
        return self._generation.now(self, self.sequence)

    def get(self, key: str) -> bytes | None:
        got = self.data.get(key)
        return None if got is None else bytes(bytearray(got))

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = bytes(bytearray(value))
        self.sequence += 1

    def delete(self, key: str) -> None:
        super().delete(key)
        self.sequence += 1

    def write_many(self, writes: Iterable[tuple[str, bytes]]) -> None:
        before = self.sequence
        n = 0
        for key, value in writes:
            self.set(key, value)
            n += 1
        self._generation.wrote(self, before, self.sequence, n)
