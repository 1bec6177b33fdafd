"""Compare a recomputation with the published snapshots under the cut (the package
docstring): every published record recomputed byte for byte, every due recomputed record
published; what replay could not use of the ledger and releases no ledger entry explains
become differences too."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any, cast

import orjson

from processor.stream.replay.gate_totals import check_totals
from processor.stream.replay.history import LedgerHistory, ledger_dicts
from processor.stream.replay.recompute import Recomputed
from processor.stream.replay.report import Difference, RecordKey, Tally

#: The published values of a topic (or of a partition's counters on it).
Published = Sequence[bytes | None]
#: The comparison keys of published values, in their order (None: a value without one).
Keys = Sequence[RecordKey | None]
#: What taking a key from a decoded value may raise (then it is "malformed").
KEY_ERRORS = (TypeError, ValueError, AttributeError, KeyError)


def published_records(values: Iterable[bytes | None], topic: str, diffs: list[Difference],
                      keys: Keys | None = None) -> dict[RecordKey, bytes]:
    """Published values of `topic` ("counts" or "ledger") by key; malformed and
    conflicting ones become differences. `keys`: the key of each value, in order, as
    `release_key` or `ledger_key` took it from the value decoded (None: it raised), from
    the decode that split the values by partition (`partitioned.split_keyed`)."""
    if (FAST and keys is not None and isinstance(values, Sequence)
            and len(keys) == len(values) and None not in keys and None not in values):
        # No tombstone, nothing malformed: the loop below would add a difference only
        # for a key published twice, and there is none if every key is distinct.
        distinct = dict(zip(keys, values, strict=True))
        if len(distinct) == len(values):
            return cast(dict[RecordKey, bytes], distinct)
    key_of: Callable[[Any], RecordKey] = release_key if topic == "counts" else ledger_key
    theirs: dict[RecordKey, bytes] = {}
    conflicting: set[RecordKey] = set()
    given = iter(keys) if keys is not None else None
    for raw in values:
        k: RecordKey | None
        if given is not None:
            k = next(given)
        if raw is None:
            diffs.append(Difference(topic, ("", -1, ""), "malformed", "a tombstone"))
            continue
        if given is None:
            try:
                k = key_of(orjson.loads(raw))
            except (orjson.JSONDecodeError, *KEY_ERRORS):
                k = None
        if k is None:
            diffs.append(Difference(topic, ("", -1, ""), "malformed",
                                    f"not a {topic} record ({len(raw)} bytes)"))
            continue
        seen = theirs.get(k)
        if seen is None:
            theirs[k] = raw
        elif seen != raw and k not in conflicting:
            conflicting.add(k)
            diffs.append(Difference(topic, k, "conflicting",
                                    "published twice with different contents"))
    return theirs


def family_record(raw: bytes | None) -> bool:
    """A family's record on the ledger (lifetime.family_entries): no counter's entry."""
    try:
        d = orjson.loads(raw or b"")
    except orjson.JSONDecodeError:
        return False
    return type(d) is dict and d.get("entry") == "family" and "counter" not in d


def release_key(d: Any) -> RecordKey:
    return (str(d["counter"]), int(d["tick"]), str(d["kind"]))


def ledger_key(d: Any) -> RecordKey:
    return (str(d["counter"]), str(d.get("creation", "")), str(d.get("fingerprint", "")))


def field_detail(mine: bytes, theirs: bytes) -> str:
    a, b = orjson.loads(mine), orjson.loads(theirs)
    fields = sorted(f for f in a.keys() | b.keys() if a.get(f) != b.get(f))
    return ", ".join(f"{f}: replay={a.get(f)!r} published={b.get(f)!r}"
                     for f in fields) or "byte encoding differs"


def _check(topic: str, mine: Mapping[RecordKey, bytes], committed: Collection[RecordKey],
           due: Callable[[RecordKey], bool], theirs: Mapping[RecordKey, bytes],
           diffs: list[Difference]) -> Tally:
    """Compare one topic: every published record recomputed byte for byte, every due
    recomputed record published. `due(k)` is True for every committed k."""
    tally = Tally(recomputed=len(mine), committed=len(committed), published=len(theirs))
    if _identical(mine, committed, theirs):
        tally.due = len(mine)
        return tally
    for k, raw in theirs.items():
        expected = mine.get(k)
        if expected is None:
            diffs.append(Difference(topic, k, "unexpected", "published but not recomputed"))
        elif expected != raw:
            diffs.append(Difference(topic, k, "different", field_detail(expected, raw)))
    for k in mine:
        if due(k):
            tally.due += 1
            if k not in theirs:
                diffs.append(Difference(topic, k, "missing", "due but not published"))
        elif k not in theirs:
            tally.pending += 1
    return tally


#: Whether the comparison takes its bulk paths: the identical case decided by dict
#: equality, distinct keys by the dicts' sizes (C loops instead of a Python loop per
#: record, a few microseconds each at millions of records). False: every record through
#: the per-record loops, the reference the bulk paths must agree with
#: (tests/stream/test_replay_compare.py).
FAST = True


def _identical(mine: Mapping[RecordKey, bytes], committed: Collection[RecordKey],
               theirs: Mapping[RecordKey, bytes]) -> bool:
    """Every recomputed record is committed (so due) and published byte for byte, and
    nothing else is published: `_check` finds no difference, and every record due."""
    return FAST and len(committed) == len(mine) and mine == theirs


def compare(result: Recomputed, published: Iterable[bytes | None],
            ledger: Iterable[bytes | None], history: LedgerHistory | None = None,
            totals: bool = True, keys: tuple[Keys, Keys] | None = None,
            ) -> tuple[Tally, Tally, list[Difference]]:
    """Compare a recomputation with the published snapshots under the cut (package docstring),
    adding the ledger entries `history` could not use. `totals`: also check the entries'
    totals beside open families (`check_totals`), which needs the whole ledger (a
    timeline partition's share has no family records: `partitioned` checks them once).
    `keys`: the keys of the published releases and ledger entries (`published_records`),
    given for a timeline partition's share only: it holds no family record (a family's
    record names no counter). Returns the release and ledger tallies and every
    difference, sorted by topic, key."""
    diffs: list[Difference] = []
    ledger = list(ledger)
    settled_releases, unsettled_releases, settled_entries, unsettled_entries = (
        result.encoded())
    mine, settled = _recomputed("counts", settled_releases, unsettled_releases, diffs)
    theirs = published_records(published, "counts", diffs,
                               None if keys is None else keys[0])
    # T_c: the highest published tick of each counter, made at the first `release_due`
    # (`_check` asks none when every record is identical and committed).
    covered: dict[str, int] | None = None

    def release_due(k: RecordKey) -> bool:
        nonlocal covered
        if covered is None:
            covered = {}
            for c, tick, _kind in theirs:
                if isinstance(tick, int) and tick > covered.get(c, -1):
                    covered[c] = tick
        t = k[1]
        return k in settled or (isinstance(t, int) and t <= covered.get(k[0], -1))

    releases = _check("counts", mine, settled, release_due, theirs, diffs)
    _unexplained(theirs, ledger, diffs)

    mine_ledger, settled_ledger = _recomputed("ledger", settled_entries, unsettled_entries,
                                              diffs)
    # A family's record (lifetime.family_entries) is written at start, not by the
    # operator: replay recomputes none, and the totals check reads them.
    if totals:
        for who, detail in check_totals(ledger):
            diffs.append(Difference("ledger", (who, "", ""), "understated", detail))
    if keys is None:
        entries = [v for v in ledger if not family_record(v)]
        theirs_ledger = published_records(entries, "ledger", diffs)
    else:
        theirs_ledger = published_records(ledger, "ledger", diffs, keys[1])
    entries_tally = _check("ledger", mine_ledger, settled_ledger, settled_ledger.__contains__,
                           theirs_ledger, diffs)
    if history is not None:
        add_problems(diffs, history.problems)
    diffs.sort(key=diff_order)
    return releases, entries_tally, diffs


def add_problems(diffs: list[Difference], problems: Iterable[Difference]) -> None:
    """Add the ledger entries replay could not use (`LedgerHistory.problems`) to `diffs`:
    an entry replay does not recompute at all (a forged counter) is one difference,
    "unexpected", with the reason it could not be used."""
    unexpected = {d.key: i for i, d in enumerate(diffs)
                  if d.topic == "ledger" and d.problem == "unexpected"}
    for p in problems:
        i = unexpected.get(p.key)
        if i is None:
            diffs.append(p)
        else:
            diffs[i] = dataclasses.replace(diffs[i], detail=f"{diffs[i].detail}; {p.detail}")


def _unexplained(theirs: Mapping[RecordKey, bytes], ledger: Iterable[bytes | None],
                 diffs: list[Difference]) -> None:
    """The reason behind a published release that differs or is unexpected: its
    fingerprint is not that of an entry of its counter in force by its tick (an entry with
    that fingerprint and since_tick <= tick, docs/downstream.md)."""
    suspects = [d.key for d in diffs if d.topic == "counts"
                and d.problem in ("different", "unexpected") and d.key in theirs]
    if not suspects:
        return
    announced: dict[str, list[tuple[str, int]]] = {}
    for e in ledger_dicts(ledger):
        since = e.get("since_tick")
        if type(since) is int:
            announced.setdefault(e["counter"], []).append((str(e.get("fingerprint")), since))
    for k in suspects:
        counter, tick, _kind = k
        fp = orjson.loads(theirs[k]).get("fingerprint")
        if not any(f == fp and isinstance(tick, int) and since <= tick
                   for f, since in announced.get(counter, ())):
            diffs.append(Difference("counts", k, "unexplained",
                                    f"fingerprint {fp!r} is not announced by a ledger entry "
                                    f"of {counter!r} in force by tick {tick}"))


def _recomputed(topic: str, settled: Sequence[tuple[RecordKey, bytes]],
                unsettled: Sequence[tuple[RecordKey, bytes]], diffs: list[Difference],
                ) -> tuple[dict[RecordKey, bytes], set[RecordKey]]:
    """The recomputed records of one topic by key (settled first), and the keys of the
    settled ones; a key recomputed with two different values is a difference."""
    if FAST:
        every = dict(settled)
        every.update(unsettled)
        if len(every) == len(settled) + len(unsettled):  # no key twice: no conflict
            return every, set(map(itemgetter(0), settled))
    mine: dict[RecordKey, bytes] = {}
    for k, raw in (*settled, *unsettled):
        if mine.setdefault(k, raw) != raw:
            diffs.append(Difference(topic, k, "conflicting",
                                    "replay itself produced two different records"))
    return mine, {k for k, _raw in settled}


def diff_order(d: Difference) -> tuple[str, str, str, str]:
    return (d.topic, str(d.key[0]), str(d.key[1]).zfill(20), str(d.key[2]))
