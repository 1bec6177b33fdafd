"""Replay one timeline partition at a time (`replay.partitioned`): its verdict is the
whole comparison's, tallies and differences alike, on a clean publication and on every
kind of tampering, which it must flag (the controls). Deterministic: fixed seeds, no
broker, no false alarm possible (an exact comparison)."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from processor.stream.model.config import Settings
from processor.stream.model.records import partition_for
from processor.stream.replay import compare, ledger_history, recompute_timeline
from processor.stream.replay.partitioned import replay_partitions, split_published
from tests.stream.test_operator import KEY, TICK, random_timeline, settings, to_records

NAMES = [f"c{i}" for i in range(8)]


def _deployment() -> tuple[Settings, dict[int, list[tuple[int, bytes | None]]],
                           dict[int, int], list[bytes], list[bytes]]:
    """Four partitions fed one timeline (each keeps its own counters), all committed, and
    what the worker's code published for it."""
    s = settings(dict.fromkeys(NAMES, 100 * TICK), partitions=4, heartbeat_ticks=3)
    records = to_records(random_timeline(random.Random(5), NAMES, 100, 25, 0.4), 3)
    timeline: dict[int, list[tuple[int, bytes | None]]] = {
        p: list(enumerate(records)) for p in range(4)}
    committed = {p: len(records) for p in range(4)}
    got = recompute_timeline(s, KEY, timeline, committed)
    return (s, timeline, committed, [r.to_json() for r in got.settled],
            [e.to_json() for e in got.settled_ledger])


def _verdicts(s: Settings, timeline: Any, committed: dict[int, int], published: list[Any],
              ledger: list[Any], jobs: int) -> tuple[Any, Any]:
    history = ledger_history(s, KEY, ledger, published)
    whole = recompute_timeline(s, KEY, timeline, committed, history=history)
    rel, led, diffs = compare(whole, published, ledger, history)
    parts = replay_partitions(s, KEY, timeline, committed, history, {}, published, ledger,
                              jobs=jobs)
    return ((rel, led, diffs, whole.records),
            (parts.releases, parts.ledger, parts.differences, parts.records))


def _tampered(published: list[bytes], ledger: list[bytes]) -> dict[str, tuple[Any, Any]]:
    altered = orjson.loads(published[3])
    altered["value"] += 1.0
    forged_entry = orjson.loads(ledger[0])
    forged_entry["counter"] = "zz"
    forged_release = orjson.loads(published[0])
    forged_release["counter"] = "zz"
    return {
        "dropped release": (published[:5] + published[6:], ledger),
        "dropped ledger entry": (published, ledger[1:]),
        "altered value": ([*published[:3], orjson.dumps(altered), *published[4:]], ledger),
        "conflicting re-send": ([*published, orjson.dumps(altered)], ledger),
        "forged counter": ([*published, orjson.dumps(forged_release)],
                           [*ledger, orjson.dumps(forged_entry)]),
        "malformed and tombstone": ([*published, b"not json", None], [*ledger, b"[1]"]),
        "a counter that is a number": (
            [*published, orjson.dumps({**forged_release, "counter": 3})],
            [*ledger, orjson.dumps({**forged_entry, "counter": 3})]),
        # In a counter's partition, but without a release's key: "malformed" there.
        "a counter's record without a key": (
            [*published, orjson.dumps({"counter": NAMES[0], "tick": "x", "kind": "change"}),
             orjson.dumps({"counter": NAMES[1], "tick": 3})],
            [*ledger, orjson.dumps({"counter": NAMES[2]})]),
    }


@pytest.mark.parametrize("jobs", [1, 2])
def test_partitioned_verdict_is_the_whole_comparison_and_flags_every_tampering(
        jobs: int) -> None:
    s, timeline, committed, published, ledger = _deployment()
    assert len({partition_for(n, 4) for n in NAMES}) > 1  # the counters are spread out
    whole, parts = _verdicts(s, timeline, committed, published, ledger, jobs)
    assert whole == parts and whole[2] == [] and whole[0].due == len(published) > 10
    for name, (pub, led) in _tampered(published, ledger).items():
        whole, parts = _verdicts(s, timeline, committed, pub, led, jobs)
        assert whole == parts, name
        assert whole[2], f"{name}: not flagged"


def test_split_published_by_the_counters_partition() -> None:
    """Each value goes to its counter's timeline partition; a value naming no counter to
    none (it is compared alone: "malformed")."""
    values: list[bytes | None] = [orjson.dumps({"counter": n, "tick": 1}) for n in NAMES]
    parts, loose = split_published([*values, None, b"{", b"[3]", b'{"tick": 3}'], 4)
    assert loose == [None, b"{", b"[3]", b'{"tick": 3}']
    assert sorted(v for vs in parts.values() for v in vs if v) == sorted(
        v for v in values if v)
    assert all(partition_for(orjson.loads(v or b"")["counter"], 4) == p
               for p, vs in parts.items() for v in vs)


def test_operators_of_every_partition_share_the_declared_counters_homes() -> None:
    """Replay's operators take one map of the declared counters' partitions, made once
    per configuration (not per partition), equal to the one each operator made itself:
    every declared counter's `partition_for`, and nothing else (an undeclared name in it
    would read as declared)."""
    from processor.stream.replay.history import LedgerHistory
    from processor.stream.replay.recompute import _without, homes_of, ledger_operator

    s = settings(dict.fromkeys(NAMES, 100 * TICK), partitions=4)
    one, two = ledger_operator(s, KEY, LedgerHistory()), ledger_operator(s, KEY, LedgerHistory())
    assert one._home is two._home
    assert dict(one._home) == {n: partition_for(n, 4) for n in NAMES}
    fewer = _without(s, {NAMES[0]})
    assert dict(homes_of(fewer)) == {n: partition_for(n, 4) for n in NAMES[1:]}
