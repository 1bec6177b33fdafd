"""The provenance seam (processor/stream/model/provenance.py): the Operator asks its Provenance
what a counter runs under, and nothing else differs between the worker and replay.

Without a broker: the default provenance is the configured one (identical records and
state bytes); a provenance that answers otherwise is what the operator's ledger entries,
releases and mechanisms follow; the creation tag is the public function replay uses.
"""

from __future__ import annotations

import asyncio

from processor.core.api import Counter
from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.identity import creation_tag, noise_identity
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.provenance import ConfiguredProvenance, Parameters
from processor.stream.model.records import Event, encode_batch, encode_marker
from processor.stream.model.state import DictStore, PartitionState

KEY = NoiseKey.from_seed(21)
TICK = 100


def _settings() -> Settings:
    return with_overrides(Settings(), counters={"a": 0, "b": 0}, partitions=1, tick_ms=TICK,
                          mechanism="ecc", epsilon=50.0, delta=1e-6, heartbeat_ticks=4)


def _records() -> list[tuple[int, bytes]]:
    recs: list[bytes] = []
    for n in range(1, 30):
        recs.append(encode_batch([Event(c, n * TICK + 5, UNIT, 0, 2 * n + i)
                                  for i, c in enumerate(("a", "b")) if (n + i) % 3]))
        recs.append(encode_marker(n - 1))
    return list(enumerate(recs))


def _run(op: Operator) -> tuple[CollectingSink, DictStore]:
    pub, store = CollectingSink(), DictStore()
    asyncio.run(BatchCommit(op, store, pub).commit(0, _records()))
    return pub, store


class Relabelled(ConfiguredProvenance):
    """The configuration's answers, but counter "b" carries another fingerprint from its
    tick 10 on and is tagged under another identity: what replay's LedgerProvenance does
    for a counter the ledger says was reconfigured."""

    def creation_identity(self, name: str) -> str:
        return "elsewhere" if name == "b" else super().creation_identity(name)

    def fingerprint_at(self, name: str, t: int) -> str:
        return "f" * 16 if name == "b" and t >= 10 else super().fingerprint_at(name, t)

    def runs_configured(self, name: str, c: Counter, fingerprint: str) -> bool:
        return name != "b"


def test_the_default_provenance_is_the_configured_one() -> None:
    s = _settings()
    pub, store = _run(Operator(s, KEY))
    pub2, store2 = _run(Operator(s, KEY, provenance=ConfiguredProvenance(s, KEY)))
    assert pub.releases and pub.ledger
    assert (pub2.releases, pub2.ledger, store2.data) == (pub.releases, pub.ledger, store.data)
    created = {e.counter: e.creation for e in pub.ledger}
    # The tag on the ledger is the public function of the identity and the creating marker
    # (the first marker, through tick 0, on a partition that had sealed nothing).
    assert created["a"] == creation_tag(noise_identity(s, KEY), "a", 0, PartitionState().frontier)


def test_the_operator_follows_its_provenance() -> None:
    s = _settings()
    pub, _ = _run(Operator(s, KEY))
    other, _ = _run(Operator(s, KEY, provenance=Relabelled(s, KEY)))
    assert [r for r in other.releases if r.counter == "a"] == [
        r for r in pub.releases if r.counter == "a"]
    b = [(e.entry, e.since_tick, e.fingerprint, e.parameters) for e in other.ledger
         if e.counter == "b"]
    assert b[0][:3] == ("created", 1, s.fingerprint())
    first = min(r.tick for r in other.releases if r.counter == "b" and r.tick >= 10)
    assert b[1] == ("reconfigured", first, "f" * 16, "stored")
    assert {r.fingerprint for r in other.releases if r.counter == "b" and r.tick >= 10} == {
        "f" * 16}
    tag_b = next(e.creation for e in other.ledger if e.counter == "b")
    assert tag_b == creation_tag("elsewhere", "b", 0, PartitionState().frontier)
    # Control: the configured provenance gives b neither.
    assert all(e.fingerprint == s.fingerprint() for e in pub.ledger)


def test_configured_parameters_come_from_the_factory() -> None:
    s = _settings()
    got: Parameters = ConfiguredProvenance(s, KEY).configured_parameters()
    assert got == ("ecc", 50.0, 1e-6, "paper")
