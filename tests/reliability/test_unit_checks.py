"""Phase U's corpus and checkers without a broker (processor/devtools/unit_campaign.py).

The corpus: in a "user" deployment every category gets the outcome it names from
parse_input. The checkers: topics made by ingest's validation and the bounding stage's
own code (bounding.Bounder) over a units log with ingest's re-sends pass every check, and
the controls, forged from them, fail the check they target: an extra kept event beyond a
bound, a kept set of the right size but the wrong members, a lost record (a kept event or
a dead letter missing), a record both counted and dead-lettered, a raw id in the
timeline (plain and JSON-escaped).
"""

from __future__ import annotations

import collections
import json
import random
import time
from dataclasses import dataclass

import orjson

from processor.core.rng import NoiseKey
from processor.devtools.campaign import BAD, VALID, CorpusContext, campaign_counters
from processor.devtools.unit_campaign import (
    BOUND_REASON,
    MISSING_REASON,
    UNIT_VIOLATIONS,
    UnitPopulation,
    UnitRecord,
    UnitReport,
    UnitTopics,
    check_unit_topics,
    scan_raw_ids,
    unit_corpus,
    unit_expectations,
    unit_settings,
    with_unit_field,
)
from processor.stream.model.bounding import (
    SEQ_BITS,
    UNITS_SOURCE,
    Bounder,
    encode_units,
    unit_hash,
    unit_key,
    unit_partition,
    unit_row,
)
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.outputs import Output
from processor.stream.model.records import (
    Event,
    Rejection,
    deadletter_record,
    decode_timeline,
    encode_batch_rows,
    parse_input,
)
from processor.stream.model.state import DictStore

K, M = 2, 3


def _settings() -> tuple[Settings, int]:
    now = int(time.time() * 1000)
    counters = campaign_counters(6, now)
    return with_overrides(Settings(), counters=counters, **unit_settings(K, M, 300.0)), now


def _corpus(seed: int, bad: int, valid: int, units: int) -> tuple[Settings, list[UnitRecord]]:
    settings, now = _settings()
    rng = random.Random(seed)
    ctx = CorpusContext(tuple(sorted(settings.counters)), min(settings.counters.values()),
                        now, settings.max_future_ms)
    pop = UnitPopulation.make(units, ctx.counters, rng)
    return settings, unit_corpus(ctx, rng, pop, bad=bad, valid=valid)


def test_every_category_gets_its_outcome_in_user_mode() -> None:
    """Each bad category (with a unit id added where it had none) is rejected for its
    own reason, a record without a unit for unit_missing, and each valid one parses to
    its counter, value and unit."""
    settings, corpus = _corpus(5, bad=3000, valid=1000, units=60)
    now = int(time.time() * 1000)
    wrong: set[str] = set()
    for rec in corpus:
        got = parse_input(rec.raw, settings, now)
        if rec.reason is None:
            ok = isinstance(got, Event) and (got.counter, got.units, got.unit) == (
                rec.counter, rec.units, rec.unit)
        else:
            ok = isinstance(got, Rejection) and got.reason == rec.reason
        if not ok:
            wrong.add(rec.category)
    assert wrong == set()
    assert {r.category for r in corpus} >= {*BAD, *VALID, MISSING_REASON}
    # many events per unit: the bounds bind
    per_unit = collections.Counter(r.unit for r in corpus if r.reason is None)
    assert max(per_unit.values()) > K * M
    assert with_unit_field(b"[1]", "x") == b"[1]"


@dataclass
class World:
    """Topics as a correct system writes them, and what the test needs to forge."""

    settings: Settings
    expected: dict[bytes, UnitRecord]
    topics: UnitTopics
    #: (units partition, seq) -> (input coordinate, timeline row) of each forwardable row
    rows: dict[tuple[int, int], tuple[tuple[int, int], list[object]]]


def _world(seed: int = 11) -> World:
    """Input records on two partitions; ingest's validation (dead letters, units rows by
    the unit's hash, batches of 7 rows per units partition, one batch re-sent as after a
    crash); the bounding stage's own code over the units log; timeline records re-sent
    once (the operator's filter drops such copies)."""
    settings, corpus = _corpus(seed, bad=200, valid=400, units=30)
    now = int(time.time() * 1000)
    ukey = unit_key(NoiseKey(b"k" * 32))
    inputs: dict[tuple[int, int], bytes] = {}
    deadletters: list[bytes] = []
    pending: dict[int, list[list[object]]] = collections.defaultdict(list)
    units_log: list[tuple[int, int, bytes]] = []
    next_off: collections.Counter[int] = collections.Counter()

    def flush(p: int) -> None:
        units_log.append((p, next_off[p], encode_units(pending.pop(p), "input-id")))
        next_off[p] += 1

    for i, rec in enumerate(corpus):
        coord = (i % 2, i // 2)
        inputs[coord] = rec.raw
        got = parse_input(rec.raw, settings, now, *coord)
        if isinstance(got, Rejection):
            deadletters.append(deadletter_record(got, rec.raw, "in", *coord))
            continue
        assert got.unit is not None
        h = unit_hash(ukey, got.unit)
        p = unit_partition(h, settings.partitions)
        pending[p].append(unit_row(h, got))
        if len(pending[p]) == 7:
            flush(p)
    for p in sorted(pending):
        flush(p)
    p, _, raw = units_log[len(units_log) // 2]
    units_log.append((p, next_off[p], raw))  # ingest's re-send of a batch
    bounder = Bounder(settings)
    stores = {p: bounder.transaction(DictStore()) for p in range(settings.partitions)}
    timeline: list[tuple[int, int, bytes]] = []
    rows: dict[tuple[int, int], tuple[tuple[int, int], list[object]]] = {}
    for p, off, raw in units_log:
        out = Output()
        bounder.apply(stores[p], p, [(off, raw)], out)
        deadletters += out.deadletters
        for i, row in enumerate(orjson.loads(raw)["e"]):
            rows[(p, off << SEQ_BITS | i)] = ((row[4], row[5]),
                                              [row[1], row[2], row[3], p, off << SEQ_BITS | i])
        for tp, data in out.timeline:
            timeline.append((tp, len(timeline), data))
    timeline.append(timeline[3])  # a re-sent timeline record
    expected = unit_expectations(corpus)
    others = {"tl": [raw for _, _, raw in timeline], "units": [raw for _, _, raw in units_log]}
    return World(settings, expected, UnitTopics(inputs, units_log, timeline, deadletters,
                                                others), rows)


def _check(w: World) -> UnitReport:
    return check_unit_topics(w.topics, w.expected, K, M)


def _violations(rep: UnitReport) -> dict[str, int]:
    d = rep.as_dict()
    return {k: d[k] for k in UNIT_VIOLATIONS if d[k]}


def _dead_reason(w: World) -> dict[tuple[int, int], str]:
    return {(d["partition"], d["offset"]): d["reason"]
            for d in map(orjson.loads, w.topics.deadletters)}


def test_a_correct_run_passes_every_check() -> None:
    w = _world()
    rep = _check(w)
    print("correct run:", rep.as_dict())
    assert rep.ok, (_violations(rep), rep.examples)
    assert rep.recomputed_dropped > 20 and rep.recomputed_kept > 50
    assert rep.max_events_per_counter_seen == K and rep.max_counters_per_unit_seen == M
    assert rep.counted == rep.recomputed_kept
    assert rep.dead_lettered == rep.bad_records + rep.recomputed_dropped
    assert rep.dead_letters_by_reason[BOUND_REASON] == rep.recomputed_dropped
    assert rep.ids_scanned >= rep.units and rep.topics_scanned == 2
    # the operator applied exactly the records counted
    assert check_unit_topics(w.topics, w.expected, K, M, applied=rep.counted).ok


def _forge_kept(w: World, coord: tuple[int, int]) -> None:
    """Count the input at `coord` (beyond a bound): its dead letter removed, a timeline
    event for its seq added."""
    key = next(k for k, (c, _) in w.rows.items() if c == coord)
    w.topics.deadletters = [d for d in w.topics.deadletters
                            if (orjson.loads(d)["partition"], orjson.loads(d)["offset"])
                            != coord]
    w.topics.timeline.append((0, 10_000, encode_batch_rows([w.rows[key][1]], UNITS_SOURCE)))


def test_control_an_extra_kept_event_beyond_the_bound_is_caught() -> None:
    w = _world()
    dropped = [c for c, r in _dead_reason(w).items() if r == BOUND_REASON]
    _forge_kept(w, dropped[0])
    rep = _check(w)
    assert rep.counted_not_kept == 1 and rep.over_k + rep.over_m == 1, _violations(rep)
    assert not rep.ok and rep.lost == 0


def test_control_the_wrong_members_of_a_right_sized_kept_set_are_caught() -> None:
    """One kept event of a (unit, counter) swapped for a later dropped one of the same
    pair: the bounds (check 3) still hold, only the recomputation (check 2) sees it."""
    w = _world()
    dead = _dead_reason(w)
    want = {c: w.expected[raw] for c, raw in w.topics.inputs.items()}
    pair: dict[tuple[str | None, str | None], tuple[int, int]] = {}  # (unit, counter) -> c
    for c, r in dead.items():
        if r == BOUND_REASON:
            e = want[c]
            pair.setdefault((e.unit, e.counter), c)
    key, c, late = next((k, c, pair[(want[c].unit, want[c].counter)])
                        for k, (c, _) in w.rows.items()
                        if c not in dead and (want[c].unit, want[c].counter) in pair)
    # drop the kept event from the timeline (and dead-letter it), count the late one
    w.topics.timeline = [(p, o, _without(raw, key)) for p, o, raw in w.topics.timeline]
    w.topics.deadletters.append(orjson.dumps({"partition": c[0], "offset": c[1],
                                              "reason": BOUND_REASON}))
    _forge_kept(w, late)
    rep = _check(w)
    assert rep.over_k == 0 and rep.over_m == 0
    assert rep.counted_not_kept == 1 and rep.kept_not_counted == 1, _violations(rep)


def _without(raw: bytes, key: tuple[int, int]) -> bytes:
    """A timeline record without the forwarded event (units partition, seq) `key`."""
    obj = orjson.loads(raw)
    if obj.get("k") != "b":
        return raw
    obj["e"] = [e for e in obj["e"] if (e[3], e[4]) != key]
    return orjson.dumps(obj)


def test_control_a_lost_record_is_caught() -> None:
    w = _world()
    dead = _dead_reason(w)
    key = next(k for k, (c, _) in w.rows.items() if c not in dead)
    w.topics.timeline = [(p, o, _without(raw, key)) for p, o, raw in w.topics.timeline]
    rep = _check(w)
    assert rep.lost == 1 and rep.kept_not_counted == 1, _violations(rep)
    # a bad record's dead letter missing
    w = _world()
    bad = next(i for i, d in enumerate(w.topics.deadletters)
               if orjson.loads(d)["reason"] != BOUND_REASON)
    del w.topics.deadletters[bad]
    rep = _check(w)
    assert rep.lost == 1 and _violations(rep) == {"lost": 1}
    # the operator applying one event fewer than the timeline counts
    w = _world()
    rep = _check(w)
    assert check_unit_topics(w.topics, w.expected, K, M, applied=rep.counted - 1).lost == 1


def test_control_a_record_both_counted_and_dead_lettered_is_caught() -> None:
    w = _world()
    dead = _dead_reason(w)
    c = next(c for _, (c, _) in w.rows.items() if c not in dead)
    w.topics.deadletters.append(orjson.dumps({"partition": c[0], "offset": c[1],
                                              "reason": BOUND_REASON}))
    rep = _check(w)
    assert rep.both == 1 and not rep.ok


def test_control_a_raw_id_in_the_timeline_is_caught() -> None:
    w = _world()
    uid = next(r.unit for r in w.expected.values() if r.unit and "ö" in r.unit)
    w.topics.others["tl"].append(encode_batch_rows([[f"c-{uid}", 1, 1, 0, 0]]))
    rep = _check(w)
    assert rep.raw_id_leaks == {"tl": 1} and not rep.ok
    # JSON-escaped (\\u00f6) as a stdlib encoder writes it
    rep = UnitReport()
    scan_raw_ids([uid], {"tl": [json.dumps({"x": uid}).encode()]}, rep)
    assert rep.raw_id_leaks == {"tl": 1}
    # and the hashes that stand for the ids are no leak
    rep = UnitReport()
    scan_raw_ids([uid], {"units": w.topics.others["units"]}, rep)
    assert rep.raw_id_leaks == {}


def test_forwarded_rows_decode_as_the_operator_reads_them() -> None:
    """The forged events are real timeline batches (source units)."""
    w = _world()
    key = next(iter(w.rows))
    batch = decode_timeline(encode_batch_rows([w.rows[key][1]], UNITS_SOURCE))
    assert batch.source == UNITS_SOURCE  # type: ignore[union-attr]
