"""Phase U of the fault campaign: privacy_unit = "user" under kills and rebalances.

One deployment in "user" mode with small bounds (k events per counter, m counters per
unit, so that they bind often), two workers of one group, an input of many events per
unit over several counters mixed with every bad category of the fuzz corpus (each bad
record carries a valid unit id, so that its reason stays the category's) and bad unit ids
(missing, empty, too long, not a string, a lone surrogate). Faults at random moments:
SIGKILL of a worker during startup, after a marker, in a backlog, at the DPC_TEST_CRASH_AT
points of the bounding stage, the operator and ingest; a rebalance (one worker stopped
cleanly, records fed, started again).

The checker (`check_unit_topics`, pure: it is handed the decoded topics) judges what came
out, the records counted (the timeline's events as the operator takes them) and the
dead letters, against a recomputation from the input records themselves:

1. accounting: every input record counted once or dead-lettered with one reason, never
   both, never neither; a bad record dead-lettered with exactly its category's reason;
2. the kept set: the bound recomputed here from first principles (per raw unit id, in
   the units log's order, each input record at its first appearance there) equals the
   set of records counted;
3. no unit has more than k counted events in a counter nor more than m counters;
5. no raw unit id in any topic but the input and the dead-letter topic (keys and values
   of the units, timeline, changelog and public topics, as bytes).

Check 4 (the published counts equal replay's recomputation: the replay command exits 0,
identical; and campaign.check_published) runs in `unit_phase`. Nothing here logs a unit
id: the figures are counts.
"""

from __future__ import annotations

import collections
import json
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from processor.core.grid import to_units
from processor.core.unit import derive
from processor.devtools.campaign import (
    BAD,
    CAMPAIGN_SETTINGS,
    EXAMPLES,
    MID_BATCH_POINTS,
    VALID,
    CorpusContext,
    FuzzRecord,
    KillDriver,
    campaign_counters,
    check_published,
    events_applied,
    replay_cli,
)
from processor.devtools.deployment import Deployment, isolated_deployment
from processor.stream.kafka import kafka_io
from processor.stream.kafka.topics import units_topic
from processor.stream.model.bounding import SEQ_BITS, UNITS_SOURCE
from processor.stream.model.records import (
    UNIT_FIELD,
    TimelineBatch,
    TimelineFormatError,
    decode_timeline,
)

#: The dead-letter reason of an event beyond a bound, and of an event without a unit.
BOUND_REASON: Final = "contribution_bound_exceeded"
MISSING_REASON: Final = "unit_missing"
#: Bad categories whose records carry their own (bad) unit id.
UNIT_CATEGORIES: Final = tuple(name for name in BAD if name.startswith("unit_"))

# ------------------------------------------------------------------------ the corpus


@dataclass(frozen=True)
class UnitRecord(FuzzRecord):
    """A fuzz record of a "user" deployment: `unit` is the raw unit id it carries (a
    valid one, or None). A valid record (reason None) is counted or dead-lettered as
    beyond a bound, as the checker's recomputation decides."""

    unit: str | None = None


def with_unit_field(raw: bytes, uid: str) -> bytes:
    """`raw` with `"user": uid` inserted after its first "{" (unchanged without one):
    the record stays as (in)valid as it was in every other respect."""
    i = raw.find(b"{")
    if i < 0:
        return raw
    return raw[:i + 1] + b'"' + UNIT_FIELD.encode() + b'": ' + orjson.dumps(uid) + b", " \
        + raw[i + 1:]


def unit_ids(n: int, rng: random.Random) -> list[str]:
    """`n` distinct unit ids, each unlikely to occur by chance in any topic (a prefix of
    letters no encoder writes, a random tag; some non-ASCII)."""
    out: list[str] = []
    for i in range(n):
        tag = "".join(rng.choice("GHJKMNPQRSTVWXYZ") for _ in range(8))
        out.append(f"Prsn{'ö' if i % 5 == 0 else 'o'}n-{tag}-{i}")
    return out


@dataclass
class UnitPopulation:
    """The units of a run: ids, how often each sends (a long tail: a few send many), and
    the counters each prefers (1 to 5 of them, so that m binds for some)."""

    ids: list[str]
    weights: list[float]
    counters: dict[str, list[str]]

    @classmethod
    def make(cls, n: int, counters: Sequence[str], rng: random.Random) -> UnitPopulation:
        ids = unit_ids(n, rng)
        weights = [1.0 / (1 + i % 17) for i in range(n)]
        prefs = {u: rng.sample(list(counters), k=rng.randint(1, min(5, len(counters))))
                 for u in ids}
        return cls(ids, weights, prefs)

    def pick(self, rng: random.Random) -> tuple[str, str]:
        """(unit, counter) of the next valid event."""
        uid = rng.choices(self.ids, self.weights)[0]
        return uid, rng.choice(self.counters[uid])


def unit_corpus(ctx: CorpusContext, rng: random.Random, pop: UnitPopulation, *, bad: int,
                valid: int, every_category: bool = True) -> list[UnitRecord]:
    """`bad` bad and `valid` valid records of a "user" deployment, shuffled: every
    category of the fuzz corpus (with `every_category`, each at least once), bad ones
    given a valid unit id (the unit_* categories keep their bad one), plus records
    without a unit (unit_missing); valid ones from `pop`, sometimes sent twice."""
    bad_names = [*BAD, MISSING_REASON] if every_category else []
    pool = [*BAD, MISSING_REASON]
    bad_names += [rng.choice(pool) for _ in range(max(0, bad - len(bad_names)))]
    valid_names = list(VALID) if every_category else []
    valid_names += [rng.choice(list(VALID)) for _ in range(max(0, valid - len(valid_names)))]
    out: list[UnitRecord] = []
    for name in bad_names:
        uid, counter = pop.pick(rng)
        if name == MISSING_REASON:
            raw, _, _ = VALID["plain"](ctx, rng, counter)
            out.append(UnitRecord(name, raw, MISSING_REASON))
            continue
        reason, make = BAD[name]
        raw = make(ctx, rng, counter)
        marked = raw if name in UNIT_CATEGORIES else with_unit_field(raw, uid)
        out.append(UnitRecord(name, marked, reason, unit=uid if marked != raw else None))
    for name in valid_names:
        uid, counter = pop.pick(rng)
        raw, counter, value = VALID[name](ctx, rng, counter)
        out.append(UnitRecord(name, with_unit_field(raw, uid), None, counter,
                              to_units(value), uid))
    valid_out = [r for r in out if r.reason is None]
    for rec in rng.sample(valid_out, k=min(len(valid_out), max(1, valid // 50))):
        out.append(UnitRecord("duplicate_record", rec.raw, None, rec.counter, rec.units,
                              rec.unit))
    rng.shuffle(out)
    return out


def unit_expectations(corpus: Iterable[UnitRecord]) -> dict[bytes, UnitRecord]:
    """raw bytes -> its record (ValueError if two records share bytes with different
    outcomes: the checks could not tell them apart)."""
    out: dict[bytes, UnitRecord] = {}
    for rec in corpus:
        old = out.get(rec.raw)
        if old is not None and (old.reason, old.counter, old.units, old.unit) != (
                rec.reason, rec.counter, rec.units, rec.unit):
            raise ValueError(f"categories {old.category} and {rec.category} collide")
        out.setdefault(rec.raw, rec)
    return out


# ------------------------------------------------------------------------ the checker


Coord = tuple[int, int]  # (partition, offset) of an input record


@dataclass
class UnitTopics:
    """What the checker reads, decoded only as far as bytes: input records by
    (partition, offset), the units log ((partition, offset, bytes)), the timeline, the
    dead letters, and every other topic's keys and values by name (the scan of check 5)."""

    inputs: dict[Coord, bytes]
    units_log: list[tuple[int, int, bytes]]
    timeline: list[tuple[int, int, bytes]]
    deadletters: list[bytes]
    others: dict[str, list[bytes]] = field(default_factory=dict)


#: The counts of a UnitReport that are violations (with every raw id leak).
UNIT_VIOLATIONS: Final = (
    "lost", "both", "counted_twice", "bad_counted", "wrong_reason", "phantom_events",
    "misrouted", "counted_not_kept", "kept_not_counted", "not_in_units_log",
    "bad_in_units_log", "units_rows_mismatched", "units_rows_unknown", "units_split",
    "hash_inconsistent", "over_k", "over_m")


@dataclass
class UnitReport:
    """The four checks of `check_unit_topics`, as counts (`ok` when every violation is 0)."""

    input_records: int = 0
    valid_records: int = 0
    bad_records: int = 0
    units: int = 0
    # 1. accounting
    counted: int = 0
    dead_lettered: int = 0
    lost: int = 0
    both: int = 0
    counted_twice: int = 0
    bad_counted: int = 0
    wrong_reason: int = 0
    #: Counted events that are no input record's (not from the stage, no units row).
    phantom_events: int = 0
    #: Counted events whose counter or value is not their input record's.
    misrouted: int = 0
    dead_letter_resends: int = 0
    dead_letters_by_reason: dict[str, int] = field(default_factory=dict)
    # 2. the kept set
    recomputed_kept: int = 0
    recomputed_dropped: int = 0
    #: Counted, but the recomputation drops it (a forged or extra kept event).
    counted_not_kept: int = 0
    #: Kept by the recomputation, not counted (dead-lettered or lost).
    kept_not_counted: int = 0
    #: Valid records never in the units log; bad ones in it; rows whose counter or value
    #: differ from their input record; rows of no input record.
    not_in_units_log: int = 0
    bad_in_units_log: int = 0
    units_rows_mismatched: int = 0
    units_rows_unknown: int = 0
    #: A raw unit id in two units partitions, or under two hashes; a hash for two ids.
    units_split: int = 0
    hash_inconsistent: int = 0
    # 3. the bounds in what was counted
    max_events_per_counter_seen: int = 0
    max_counters_per_unit_seen: int = 0
    over_k: int = 0
    over_m: int = 0
    # 5. raw ids
    ids_scanned: int = 0
    topics_scanned: int = 0
    bytes_scanned: int = 0
    raw_id_leaks: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        counts: list[int] = [getattr(self, name) for name in UNIT_VIOLATIONS]
        return sum(counts) + sum(self.raw_id_leaks.values())

    @property
    def ok(self) -> bool:
        return not self.violations

    def note(self, text: str) -> None:
        if len(self.examples) < EXAMPLES:
            self.examples.append(text)

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "violations": self.violations, "ok": self.ok}


@dataclass
class _Recomputed:
    """The units log read independently of the stage: where each seq came from, the
    first appearance of each input record, and the kept set decided from it."""

    seq_to_input: dict[Coord, Coord] = field(default_factory=dict)
    kept: set[Coord] = field(default_factory=set)
    dropped: set[Coord] = field(default_factory=set)
    in_log: set[Coord] = field(default_factory=set)


def _units_rows(raw: bytes) -> list[list[Any]]:
    """The rows of a units record ({"v": 1, "k": "u", "i": source, "e": [[hash, counter,
    ts, units, in_partition, in_offset], ...]}); [] for anything else."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    if type(obj) is not dict or obj.get("k") != "u" or type(obj.get("e")) is not list:
        return []
    return [r for r in obj["e"] if type(r) is list and len(r) == 6]


def recompute_bound(topics: UnitTopics, want: Mapping[Coord, UnitRecord], k: int, m: int,
                    rep: UnitReport) -> _Recomputed:
    """The bound from first principles: walk each units partition in offset order, each
    record's rows in order; an input record counts at its first appearance (later ones
    are ingest's re-sends); per raw unit id (from the input record, not the hash), an
    event is kept iff its counter has fewer than k kept events of the unit, or is new
    to the unit and the unit has fewer than m counters."""
    out = _Recomputed()
    per_unit: dict[str, dict[str, int]] = {}
    unit_part: dict[str, int] = {}
    id_hash: dict[str, str] = {}
    hash_id: dict[str, str] = {}
    for p, off, raw in sorted(topics.units_log, key=lambda r: (r[0], r[1])):
        for i, row in enumerate(_units_rows(raw)):
            h, counter, _ts, units, in_p, in_o = row
            coord = (int(in_p), int(in_o))
            out.seq_to_input[(p, off << SEQ_BITS | i)] = coord
            if coord in out.in_log:
                continue
            out.in_log.add(coord)
            exp = want.get(coord)
            if exp is None:
                rep.units_rows_unknown += 1
                continue
            if exp.reason is not None or exp.unit is None:
                rep.bad_in_units_log += 1
                rep.note(f"{exp.category} input {coord} in the units log")
                continue
            if exp.counter is None or (counter, units) != (exp.counter, exp.units):
                rep.units_rows_mismatched += 1
                continue
            uid, counter = exp.unit, exp.counter
            if unit_part.setdefault(uid, p) != p:
                rep.units_split += 1
            if id_hash.setdefault(uid, str(h)) != h or hash_id.setdefault(str(h), uid) != uid:
                rep.hash_inconsistent += 1
            kept = per_unit.setdefault(uid, {})
            n = kept.get(counter)
            if (n is not None and n < k) or (n is None and len(kept) < m):
                kept[counter] = (n or 0) + 1
                out.kept.add(coord)
            else:
                out.dropped.add(coord)
    return out


def _counted(topics: UnitTopics, rec: _Recomputed, want: Mapping[Coord, UnitRecord],
             rep: UnitReport) -> collections.Counter[Coord]:
    """Input record -> how many distinct timeline events count it (each forwarded seq
    once: copies of one seq are re-sends the operator drops)."""
    seen: set[Coord] = set()
    counted: collections.Counter[Coord] = collections.Counter()
    for _p, _off, raw in topics.timeline:
        try:
            tl = decode_timeline(raw)
        except TimelineFormatError:
            continue  # the clock probe, or nothing of ours
        if not isinstance(tl, TimelineBatch):
            continue
        for ev in tl.events:
            if tl.source != UNITS_SOURCE:
                rep.phantom_events += 1
                continue
            key = (ev.src_partition, ev.src_offset)
            if key in seen:
                continue
            seen.add(key)
            coord = rec.seq_to_input.get(key)
            exp = want.get(coord) if coord is not None else None
            if coord is None or exp is None:
                rep.phantom_events += 1
                continue
            counted[coord] += 1
            if (ev.counter, ev.units) != (exp.counter, exp.units):
                rep.misrouted += 1
    return counted


def _dead(topics: UnitTopics, rep: UnitReport) -> dict[Coord, set[str]]:
    """Input record -> the reasons of its dead letters (re-sent copies counted apart)."""
    dead: dict[Coord, set[str]] = {}
    copies: collections.Counter[tuple[Coord, str]] = collections.Counter()
    by_reason: collections.Counter[str] = collections.Counter()
    for value in topics.deadletters:
        d = orjson.loads(value)
        coord = (int(d["partition"]), int(d["offset"]))
        reason = str(d["reason"])
        dead.setdefault(coord, set()).add(reason)
        copies[(coord, reason)] += 1
        by_reason[reason] += 1
    rep.dead_letter_resends = sum(n - 1 for n in copies.values())
    rep.dead_letters_by_reason = dict(sorted(by_reason.items()))
    return dead


def _account(want: Mapping[Coord, UnitRecord], counted: Mapping[Coord, int],
             dead: Mapping[Coord, set[str]], rep: UnitReport) -> None:
    """Check 1: each input record's fate."""
    for coord, exp in sorted(want.items()):
        n, reasons = counted.get(coord, 0), dead.get(coord, set())
        rep.counted += n > 0
        rep.dead_lettered += bool(reasons)
        if not n and not reasons:
            rep.lost += 1
            rep.note(f"{exp.category} input {coord}: neither counted nor dead-lettered")
        elif n and reasons:
            rep.both += 1
            rep.note(f"{exp.category} input {coord}: counted and dead-lettered")
        rep.counted_twice += n > 1
        if exp.reason is not None:
            rep.bad_counted += n > 0
            if reasons and reasons != {exp.reason}:
                rep.wrong_reason += 1
                rep.note(f"{exp.category} input {coord}: {sorted(reasons)}, "
                         f"not {exp.reason}")
        elif reasons and reasons != {BOUND_REASON}:
            rep.wrong_reason += 1
            rep.note(f"{exp.category} input {coord}: valid, dead-lettered {sorted(reasons)}")
    stray = set(dead) - set(want)
    rep.wrong_reason += len(stray)  # a dead letter naming no input record


def _bounds(want: Mapping[Coord, UnitRecord], counted: Mapping[Coord, int], k: int, m: int,
            rep: UnitReport) -> None:
    """Check 3: per raw unit id, the counted events per counter and the counters."""
    per: dict[str, collections.Counter[str]] = {}
    for coord, n in counted.items():
        exp = want[coord]
        if exp.unit is not None and exp.counter is not None:
            per.setdefault(exp.unit, collections.Counter())[exp.counter] += n
    for counters in per.values():
        top = max(counters.values())
        rep.max_events_per_counter_seen = max(rep.max_events_per_counter_seen, top)
        rep.max_counters_per_unit_seen = max(rep.max_counters_per_unit_seen, len(counters))
        rep.over_k += sum(1 for c in counters.values() if c > k)
        rep.over_m += len(counters) > m


def id_needles(uid: str) -> set[bytes]:
    """The byte strings a raw id would appear as: UTF-8, and JSON-escaped (non-ASCII as
    \\u escapes); empty for an id no encoder can write (a lone surrogate)."""
    try:
        plain = uid.encode("utf-8")
    except UnicodeEncodeError:
        return set()
    return {plain, json.dumps(uid)[1:-1].encode("ascii"), orjson.dumps(uid)[1:-1]}


#: Ids shorter than this are not scanned for (they could occur by chance).
MIN_SCANNED_ID: Final = 8


def scan_raw_ids(ids: Iterable[str], others: Mapping[str, Sequence[bytes]],
                 rep: UnitReport) -> None:
    """Check 5: each topic's bytes searched for every id; a topic with a hit counts its
    ids found in `raw_id_leaks`."""
    needles = sorted({n for uid in ids if len(uid) >= MIN_SCANNED_ID
                      for n in id_needles(uid)})
    rep.ids_scanned = len({uid for uid in ids if len(uid) >= MIN_SCANNED_ID})
    for name, values in sorted(others.items()):
        blob = b"\x00".join(values)
        rep.topics_scanned += 1
        rep.bytes_scanned += len(blob)
        hits = sum(1 for n in needles if n in blob)
        if hits:
            rep.raw_id_leaks[name] = hits
            rep.note(f"{hits} raw id form(s) in topic {name}")


def check_unit_topics(topics: UnitTopics, expected: Mapping[bytes, UnitRecord], k: int,
                      m: int, applied: int | None = None) -> UnitReport:
    """Checks 1, 2, 3 and 5 (see the module doc) of a stopped, drained "user" deployment's
    topics against `expected` (every input record's bytes must be there). `applied`, if
    given, is how many events the operator applies over the timeline (the worker's own
    code): more than the records counted is counting twice, fewer is losing."""
    rep = UnitReport()
    want: dict[Coord, UnitRecord] = {}
    for coord, raw in topics.inputs.items():
        exp = expected.get(raw)
        if exp is None:
            raise ValueError(f"input {coord} is not from the corpus")
        want[coord] = exp
    rep.input_records = len(want)
    rep.valid_records = sum(1 for e in want.values() if e.reason is None)
    rep.bad_records = rep.input_records - rep.valid_records
    rep.units = len({e.unit for e in want.values() if e.reason is None})

    rec = recompute_bound(topics, want, k, m, rep)
    rep.recomputed_kept, rep.recomputed_dropped = len(rec.kept), len(rec.dropped)
    rep.not_in_units_log = sum(1 for c, e in want.items()
                               if e.reason is None and c not in rec.in_log)
    counted = _counted(topics, rec, want, rep)
    _account(want, counted, _dead(topics, rep), rep)
    valid_counted = {c for c in counted if want[c].reason is None}
    rep.counted_not_kept = len(valid_counted - rec.kept)
    rep.kept_not_counted = len(rec.kept - valid_counted)
    for c in sorted(valid_counted ^ rec.kept)[:EXAMPLES]:
        rep.note(f"input {c}: {'counted' if c in valid_counted else 'kept'} only")
    if applied is not None:
        total = sum(counted.values())
        rep.counted_twice += max(0, applied - total)
        rep.lost += max(0, total - applied)
    _bounds(want, counted, k, m, rep)
    scan_raw_ids({e.unit for e in expected.values() if isinstance(e.unit, str)}
                 | _bad_ids(expected.values()), topics.others, rep)
    return rep


def _bad_ids(records: Iterable[UnitRecord]) -> set[str]:
    """The string unit ids of the unit_* categories (too long ones, say): they must not
    leave ingest either."""
    out: set[str] = set()
    for r in records:
        if r.category in UNIT_CATEGORIES:
            try:
                obj = orjson.loads(r.raw)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get(UNIT_FIELD), str):
                out.add(obj[UNIT_FIELD])
    return out


def read_unit_topics(dep: Deployment, timeout_s: float = 300.0) -> UnitTopics:
    """Every topic of a stopped deployment: input, units log, timeline, dead letters, and
    the keys and values of every other topic whose name carries the deployment's id
    (internal, changelogs, public)."""
    conf, t, s = dep.conf, dep.topics, dep.settings
    inputs = {(r.partition, r.offset): r.value or b""
              for r in kafka_io.iter_topic(conf, t.input, timeout_s=timeout_s)}
    units = [(r.partition, r.offset, r.value or b"")
             for r in kafka_io.iter_topic(conf, units_topic(s), timeout_s=timeout_s)]
    timeline = [(r.partition, r.offset, r.value or b"")
                for r in kafka_io.iter_topic(conf, t.timeline, timeout_s=timeout_s)]
    dead = [r.value or b"" for r in kafka_io.iter_topic(conf, t.deadletter,
                                                           timeout_s=timeout_s)]
    uid = s.app_id.rsplit("-", 1)[-1]
    names = sorted(n for n in kafka_io.make_admin(conf).list_topics(timeout=30).topics
                   if uid in n and n not in (t.input, t.deadletter))
    others: dict[str, list[bytes]] = {}
    for name in names:
        values: list[bytes] = []
        for r in kafka_io.iter_topic(conf, name, timeout_s=timeout_s):
            values += [r.key or b"", r.value or b"", *(v for _, v in r.headers)]
        others[name] = values
    return UnitTopics(inputs, units, timeline, dead, others)


# ------------------------------------------------------------------------ the driver


#: DPC_TEST_CRASH_AT points of phase U's mid-batch kills: the bounding stage's (its
#: checkpoint every 2 s), the operator's and ingest's (campaign.MID_BATCH_POINTS).
UNIT_CRASH_POINTS: Final = (("unit_after_forward", 1, 6), ("unit_between_state_writes", 2, 8),
                            ("unit_after_state", 1, 6), *MID_BATCH_POINTS)
#: Timeline and units partitions of phase U: each of its two workers owns two, so that
#: a checkpoint writes two partitions' batches and the kills between them can fire.
UNIT_PARTITIONS: Final = 4
#: Fault kinds of phase U: campaign.KILL_MOMENTS, and a rebalance.
UNIT_FAULTS: Final = ("startup", "marker", "backlog", "mid_batch", "rebalance")


def unit_settings(k: int, m: int, unit_epsilon: float, unit_delta: float = 1e-6
                  ) -> dict[str, Any]:
    """The campaign's settings in "user" mode: the [unit] target, its derived per-event
    parameters, and UNIT_PARTITIONS partitions."""
    p = derive(unit_epsilon, unit_delta, k, m, mechanism=CAMPAIGN_SETTINGS["mechanism"],
               calibration=CAMPAIGN_SETTINGS.get("calibration", "paper"))
    base = {name: v for name, v in CAMPAIGN_SETTINGS.items() if name != "epsilon"}
    return {**base, "partitions": UNIT_PARTITIONS, "privacy_unit": "user",
            "unit_epsilon": unit_epsilon,
            "unit_delta": unit_delta, "max_events_per_counter": k,
            "max_counters_per_unit": m, "epsilon": p.event_epsilon, "delta": p.event_delta}


class UnitDriver(KillDriver):
    """campaign.KillDriver for a "user" deployment: feeds `unit_corpus` records, kills at
    UNIT_CRASH_POINTS too, waits for the bounding stage in a drain, and rebalances."""

    def __init__(self, dep: Deployment, rng: random.Random, *, bad_share: float,
                 units: int, backlog: tuple[int, int] = (300, 800),
                 crash_points: Sequence[tuple[str, int, int]] = UNIT_CRASH_POINTS) -> None:
        super().__init__(dep, rng, bad_share=bad_share, backlog=backlog,
                         mid_batch_points=crash_points)
        self.population = UnitPopulation.make(units, sorted(dep.settings.counters), rng)
        self.records: dict[bytes, UnitRecord] = {}
        self._fresh = True

    def feed(self, n: int, timeout_s: float | None = None) -> int:
        bad = max(0, round(n * self.bad_share))
        valid = max(0, n - bad)
        if self._fresh:
            bad, valid = max(bad, len(BAD) + 1), max(valid, len(VALID))
        corpus = unit_corpus(self.context(), self.rng, self.population, bad=bad,
                             valid=valid, every_category=self._fresh)
        self._fresh = False
        self.records = unit_expectations([*self.records.values(), *corpus])
        values = [(None, r.raw) for r in corpus]
        if timeout_s is None:
            sent = self.dep.produce(v for _, v in values)
        else:
            sent = kafka_io.produce_all(self.dep.conf, self.dep.topics.input, values,
                                        timeout_s=timeout_s)
        self.counts["records_fed"] += sent
        return sent

    def rebalance(self, seconds: float) -> None:
        """Stop one worker cleanly (its partitions move to the other), feed meanwhile,
        start it again after `seconds` (they are shared again)."""
        w = self.rng.choice(self.dep.workers)
        if not w.alive():
            w.start()
        self.counts[f"rebalance_stop_exit_{w.stop()}"] += 1
        self.feed(self.rng.randint(50, 200))
        time.sleep(max(0.0, seconds))  # the campaign's schedule, not a synchronisation
        w.start()
        self.counts["rebalances"] += 1


def unit_fault_plan(kills: int, rebalances: int, rng: random.Random) -> list[str]:
    """`kills` SIGKILL moments spread over campaign.KILL_MOMENTS (mid-batch ones twice as
    often: they reach the stage's crash points) and `rebalances` rebalances, shuffled."""
    moments = ("mid_batch", "startup", "mid_batch", "marker", "backlog")
    plan = [moments[i % len(moments)] for i in range(kills)] + ["rebalance"] * rebalances
    rng.shuffle(plan)
    return plan


def unit_phase(bootstrap: str, parent: str | Path, rng: random.Random, *, records: int,
               kills: int, rebalances: int, k: int = 2, m: int = 3, counters: int = 6,
               unit_epsilon: float = 300.0, bad_share: float = 0.3,
               units: int | None = None, name: str = "campU",
               plan: Sequence[str] | None = None,
               crash_points: Sequence[tuple[str, int, int]] = UNIT_CRASH_POINTS,
               drain_timeout_s: float = 600.0) -> dict[str, Any]:
    """Phase U: one "user" deployment with two workers of one group, `records` records
    (about `bad_share` bad) from `units` units (default records / 8), `kills` SIGKILLs and
    `rebalances` rebalances at random moments (or the fault kinds of `plan`, in order;
    mid-batch kills at `crash_points`); then drain, clean stop and the checks:
    check_unit_topics (1, 2, 3, 5), and 4: the replay command (exit 0, identical) and
    campaign.check_published. Returns the figures; "ok" is every checker's verdict."""
    started = time.monotonic()
    dep = isolated_deployment(bootstrap, campaign_counters(counters, int(time.time() * 1000)),
                              parent=parent, name=name,
                              **unit_settings(k, m, unit_epsilon))
    try:
        other = dep.add_worker("worker-b")
        driver = UnitDriver(dep, rng, bad_share=bad_share,
                            units=units or max(8, records // 8), crash_points=crash_points)
        dep.worker.start()
        other.start()
        plan = list(plan) if plan is not None else unit_fault_plan(kills, rebalances, rng)
        chunk = max(50, records // (len(plan) + 2))
        driver.feed(chunk)
        dep.wait_releases(lambda rs: len(rs) > 0, timeout_s=180)
        for step in plan:
            driver.feed(min(chunk, max(0, records - driver.counts["records_fed"])) or 50)
            if step == "rebalance":
                driver.rebalance(rng.uniform(3.0, 8.0))
            else:
                driver.kill(step, rng.choice(dep.workers))
        while (left := records - driver.counts["records_fed"]) > 0:
            driver.feed(min(left, 2000))
        caught_up = driver.drain_and_stop(dep.workers, timeout_s=drain_timeout_s)
        topics = read_unit_topics(dep)
        timeline = kafka_io.read_topic(dep.conf, dep.topics.timeline, timeout_s=300)
        applied = events_applied(dep.settings, dep.key, timeline)
        report = check_unit_topics(topics, driver.records, k, m, applied=applied)
        published = check_published(dep)
        cli = replay_cli(dep.config)
        replay_ok = cli.get("exit") == 0 and cli.get("verdict") == "identical"
        ok = report.ok and published.ok and replay_ok and caught_up
        return {"phase": "U: privacy_unit = user, two workers, kills and rebalances",
                "k": k, "m": m, "counters": counters, "units_pool": len(driver.population.ids),
                "faults": plan, "caught_up": caught_up,
                "driver": dict(sorted(driver.counts.items())), "events_applied": applied,
                "units": report.as_dict(), "published": published.as_dict(),
                "replay_cli": cli, "ok": ok, "wall_s": round(time.monotonic() - started, 1)}
    finally:
        dep.close()
