"""In-memory stand-ins for two seams of the stream layer, for the tests and the
benchmarks (nothing in the runtime path imports this): a store that copies its bytes as
RocksDB does, and a bounding-stage forwarder that only collects."""

from __future__ import annotations

from processor.stream.model.bounding import BoundOutput
from processor.stream.model.state import DictStore


class CopyingStore(DictStore):
    """An in-memory state.StateStore that keeps and returns copies of its bytes, as RocksDB
    does (a DictStore shares one bytes object between the store and the state cache's
    check, so the cache keeps no digests over it: transaction.py). Only get and set
    differ from DictStore's."""

    shares_bytes = False

    def get(self, key: str) -> bytes | None:
        got = self.data.get(key)
        return None if got is None else bytes(bytearray(got))

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = bytes(bytearray(value))


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
