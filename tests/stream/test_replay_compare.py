"""The comparison's bulk paths (comparison.FAST: the identical case by dict equality,
distinct keys by the dicts' sizes) agree with its per-record loops on every verdict."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from processor.stream.replay import comparison
from processor.stream.replay.comparison import compare, ledger_key, release_key
from processor.stream.replay.partitioned import split_keyed
from processor.stream.replay.recompute import Keyed, Recomputed
from processor.stream.replay.report import RecordKey

CASES = 400


def _release(c: str, t: int, kind: str, v: int) -> tuple[RecordKey, bytes]:
    return (c, t, kind), orjson.dumps({"counter": c, "tick": t, "kind": kind, "value": v})


def _entry(c: str, creation: str, fp: str) -> tuple[RecordKey, bytes]:
    return (c, creation, fp), orjson.dumps({"counter": c, "entry": "created",
                                            "creation": creation, "fingerprint": fp})


def _tamper(rng: random.Random, records: Keyed, fresh: Keyed) -> list[bytes | None]:
    """The published values of `records`, in a random order, left alone (half the cases)
    or with some dropped, changed, published twice (equal or not), and foreign,
    malformed or tombstone values added."""
    out: list[bytes | None] = [raw for _k, raw in records]
    rng.shuffle(out)
    if rng.random() < 0.5:
        return out
    for _ in range(rng.randint(1, 4)):
        what = rng.choice(["drop", "change", "twice", "twice-changed", "foreign",
                           "malformed", "keyless", "tombstone"])
        if what == "drop" and out:
            out.pop(rng.randrange(len(out)))
        elif what == "change" and out:
            i = rng.randrange(len(out))
            out[i] = (out[i] or b"")[:-1] + b',"x":1}'
        elif what == "twice" and out:
            out.append(rng.choice(out))
        elif what == "twice-changed" and out:
            out.append((rng.choice(out) or b"{}")[:-1] + b',"y":2}')
        elif what == "foreign":
            out.append(rng.choice(fresh)[1])
        elif what == "malformed":
            out.append(b"not json")
        elif what == "keyless":
            out.append(b'{"counter":"c0"}')
        elif what == "tombstone":
            out.append(None)
    return out


def _case(rng: random.Random) -> tuple[Recomputed, list[bytes | None], list[bytes | None]]:
    names = [f"c{i}" for i in range(rng.randint(1, 6))]
    releases = [_release(c, t, rng.choice(["change", "heartbeat"]), rng.randint(0, 9))
                for c in names for t in sorted(rng.sample(range(1, 30), rng.randint(1, 5)))]
    releases = list(dict(releases).items())  # one record per key
    entries = [_entry(c, f"cr{rng.randint(0, 1)}", f"fp{rng.randint(0, 2)}") for c in names]
    entries = list(dict(entries).items())
    # All committed in about half the cases (a clean stop), else a random cut.
    cut = 1.0 if rng.random() < 0.5 else rng.random()
    settled = [r for r in releases if rng.random() < cut]
    unsettled = [r for r in releases if r not in settled]
    settled_ledger = [e for e in entries if rng.random() < cut]
    unsettled_ledger = [e for e in entries if e not in settled_ledger]
    if rng.random() < 0.1 and settled:  # replay itself made a key twice, differently
        k, raw = rng.choice(settled)
        unsettled.append((k, raw[:-1] + b',"z":3}'))
    fresh = [_release("c9", 99, "change", 1), _entry("c9", "cr9", "fp9")]
    result = Recomputed([], [], [], [], 0, 0, _encoded=(settled, unsettled, settled_ledger,
                                                          unsettled_ledger))
    return (result, _tamper(rng, releases, fresh[:1]), _tamper(rng, entries, fresh[1:]))


def _both(result: Recomputed, published: list[bytes | None],
          ledger: list[bytes | None], keyed: bool) -> tuple[Any, Any]:
    """compare's verdict with the bulk paths and with the per-record loops only, on the
    whole topics or (`keyed`) on the values that have a counter, with their keys as a
    timeline partition's share gets them."""
    args: dict[str, Any] = {}
    if keyed:
        parts, rkeys, _loose = split_keyed(published, 1, release_key)
        lparts, lkeys, _lloose = split_keyed(ledger, 1, ledger_key)
        published, ledger = parts.get(0, []), lparts.get(0, [])
        args = {"totals": False, "keys": (rkeys.get(0, []), lkeys.get(0, []))}
    got = []
    for fast in (True, False):
        comparison.FAST = fast
        try:
            got.append(compare(result, published, ledger, **args))
        finally:
            comparison.FAST = True
    return got[0], got[1]


@pytest.mark.parametrize("keyed", [False, True])
def test_bulk_paths_agree_with_the_per_record_loops(keyed: bool) -> None:
    """400 random cases (fixed seed): identical topics, a cut before the end, and
    records dropped, changed, published twice, foreign, malformed or tombstones, on
    both topics; the tallies and differences agree, and both kinds of case occur."""
    rng = random.Random(20261207 + keyed)
    identical = 0
    for _ in range(CASES):
        result, published, ledger = _case(rng)
        fast, reference = _both(result, published, ledger, keyed)
        assert fast == reference
        identical += not fast[2]
    assert 0.2 * CASES < identical < 0.8 * CASES


def test_a_wrong_bulk_path_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: a bulk path that calls any topics of equal sizes identical disagrees with
    the per-record loops on some case."""
    monkeypatch.setattr(comparison, "_identical",
                        lambda mine, committed, theirs: comparison.FAST
                        and len(mine) == len(theirs) == len(committed))
    rng = random.Random(7)
    assert any(a != b for a, b in (_both(*_case(rng), keyed=False) for _ in range(CASES)))
