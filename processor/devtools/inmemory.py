"""An in-memory stand-in for the store seam of the stream layer, for the tests and the
benchmarks (nothing in the runtime path imports this): a store that copies its bytes as
RocksDB does."""

from __future__ import annotations

from processor.stream.model.state import DictStore


class CopyingStore(DictStore):
    """A DictStore that keeps and returns copies of its bytes, as RocksDB does.

    A DictStore shares one bytes object between the store and the state cache's check,
    so the cache keeps no digests over it (transaction.py): this one exercises the
    worker's path in tests and benchmarks. Only get and set differ from DictStore's."""

    shares_bytes = False

    def get(self, key: str) -> bytes | None:
        got = self.data.get(key)
        return None if got is None else bytes(bytearray(got))

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = bytes(bytearray(value))
