"""What a stage's apply produces and where its commit sends it, one vocabulary for every
stage: an `Output` (the records for each topic a stage writes, and the batch's aggregate
metrics), the `Sink` a commit hands each Output's records to at once (its checkpoint
awaits `Sink.flush` before it writes any state: commit.CheckpointLoop), and
`CollectingSink`, the sink that keeps what it is given (replay, tests, benchmarks). The
worker's sink is `kafka.producer.KafkaSink`.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from processor.stream.model.records import AnyRelease, EncodedRelease, LedgerEntry, Release

#: The kinds of record an Output holds, in the order a sink sends them.
RecordKind = Literal["ledger", "releases", "timeline", "deadletters"]


def _counts() -> collections.defaultdict[str, int]:
    # A defaultdict: made and counted into in C (an Output is made per applied batch, a
    # lone marker's among them, where a Counter's Python-level __init__ costs ~5%).
    return collections.defaultdict(int)


@dataclass
class Output:
    """What applying records produced. Records, by the topic they go to: ledger entries
    (counters announced) and releases (private counts), the operator's; timeline batch
    records (timeline partition, bytes: kept events) and dead-letter values, the bounding
    stage's. Metric deltas (a stage's own names: operator.METRICS, bounding.METRICS;
    aggregates only, never per counter or unit), and the newest tick a marker applied
    here sealed through (the operator's; None: no marker applied)."""

    ledger: list[LedgerEntry] = field(default_factory=list)
    #: Release objects, or their bytes alone (`EncodedRelease`: idle counters'
    #: heartbeats, `Operator._beat_idle`); a sink sends either the same way.
    releases: list[AnyRelease] = field(default_factory=list)
    timeline: list[tuple[int, bytes]] = field(default_factory=list)
    deadletters: list[bytes] = field(default_factory=list)
    metrics: collections.defaultdict[str, int] = field(default_factory=_counts)
    sealed_through: int | None = None

    def has_records(self) -> bool:
        """Whether it holds a record for any topic (what a sink is handed)."""
        return bool(self.ledger or self.releases or self.timeline or self.deadletters)

    def decoded_releases(self) -> list[Release]:
        """Its releases as Release objects (an `EncodedRelease` decoded), in order."""
        return [r.decoded() if isinstance(r, EncodedRelease) else r for r in self.releases]

    def count(self, kind: RecordKind) -> int:
        """How many records of `kind` it holds."""
        records: Sequence[object] = getattr(self, kind)
        return len(records)


class Sink(Protocol):
    """Where a stage's commit sends its outputs' records (the worker's: their topics)."""

    def send(self, out: Output) -> None:
        """Hand over `out`'s records, kind by kind in RecordKind's order (ledger entries
        before releases), each kind in order: the sink may buffer them, never drop or
        reorder them."""

    async def flush(self) -> None:
        """Return only once every record handed over so far is acknowledged; raise if
        one was not."""


class CollectingSink:
    """A Sink that keeps every record it is given, by kind (replay, tests, benchmarks),
    releases as Release objects (an `EncodedRelease` decoded)."""

    def __init__(self) -> None:
        self.ledger: list[LedgerEntry] = []
        self.releases: list[Release] = []
        self.timeline: list[tuple[int, bytes]] = []
        self.deadletters: list[bytes] = []

    def send(self, out: Output) -> None:
        self.ledger.extend(out.ledger)
        self.releases.extend(out.decoded_releases())
        self.timeline.extend(out.timeline)
        self.deadletters.extend(out.deadletters)

    async def flush(self) -> None:
        return None
