"""In-memory stand-ins for two seams of the stream layer, for the tests and the
benchmarks (nothing in the runtime path imports this): a store that copies its bytes as
RocksDB does, and a bounding-stage forwarder that only collects."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from processor.stream.model.bounding import BoundOutput


class CopyingStore:
    """An in-memory state.StateStore that keeps and returns copies of its bytes, as RocksDB
    does (a DictStore shares one bytes object between the store and the state cache's
    check, so the cache keeps no digests over it: transaction.py)."""

    shares_bytes = False

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        got = self.data.get(key)
        return None if got is None else bytes(bytearray(got))

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = bytes(bytearray(value))

    def delete(self, key: str) -> None:
        self.data.pop(key, None)

    def write_many(self, writes: Iterable[tuple[str, bytes]]) -> None:
        for key, value in writes:
            self.set(key, value)

    def scan(self, prefix: str) -> Iterator[tuple[str, bytes]]:
        return iter([(k, v) for k, v in self.data.items() if k.startswith(prefix)])


class CollectingForwarder:
    """A bounding.Forwarder that keeps what it is given."""

    def __init__(self) -> None:
        self.timeline: list[tuple[int, bytes]] = []
        self.deadletters: list[bytes] = []

    def send(self, out: BoundOutput) -> None:
        self.timeline.extend(out.timeline)
        self.deadletters.extend(out.deadletters)

    async def flush(self) -> None:
        return None
