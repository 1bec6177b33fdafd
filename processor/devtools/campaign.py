"""The fault and bad-input campaign as code: a fuzz corpus, a kill-at-random-moments
driver and the checkers.

- `fuzz_corpus` makes input records of every `CATEGORIES` entry: bad ones (each names the
  dead-letter reason ingest must give it: malformed JSON, wrong types, NaN and infinities,
  out-of-range values, unencodable and oversize counter names, undeclared counters,
  timestamps missing, before the start or too far ahead, ...) and valid but awkward ones
  (late timestamps, duplicates, ISO times, duplicate keys), each with the counter and
  value it must count as.
- `KillDriver` runs the worker(s) of a `Deployment` and kills them with SIGKILL at the
  moments that matter: during startup, right after the leader appended a marker, while a
  backlog drains, inside a batch commit (the DPC_TEST_CRASH_AT hook); it pauses one of two
  workers past the session timeout (SIGSTOP) and kills brokers of a `LocalKafka` cluster.
- `check` reads the deployment's topics after a clean stop and counts what went wrong:
  valid records lost or counted twice, (counter, tick, kind) published with two values,
  bad records not dead-lettered, dead-lettered with another reason or counted, and whether
  replay finds the published stream identical.
- The network-partition phase: `partition_phase` runs two workers of
  one deployment, one of them reaching the brokers only through a `proxy.TcpProxy`
  (`proxy.ProxiedKafka`), and cuts it off (blackholes and resets, `PARTITION_FAULTS`);
  `check_published` compares every published release with a recomputation from the
  timeline (values short of it, ahead of it, unexpected, missing; (counter, tick) with two
  values) and `check_changelog` flags state values whose timeline offset goes back
  (`value_offset`).

The test suite runs it small (tests/reliability/); reliability/campaign.py at full size.
Nothing here logs a record's content: the figures are counts.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson
from confluent_kafka import Consumer, TopicPartition

from processor.core.grid import to_units
from processor.devtools.deployment import (
    ROOT,
    Deployment,
    WorkerProcess,
    isolated_deployment,
    worker_env,
)
from processor.devtools.kafka.cluster import LocalKafka
from processor.devtools.proxy import ProxiedKafka, ProxyStats
from processor.stream.kafka import kafka_io
from processor.stream.kafka.topics import units_topic
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import MAX_COUNTER_NAME, Settings
from processor.stream.model.faults import CRASH_ENV, INGEST_DELIVERED
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.records import (
    Release,
    TimelineBatch,
    TimelineFormatError,
    TimelineMarker,
    decode_timeline,
)
from processor.stream.model.state import DictStore, stored_offset
from processor.stream.replay import recompute_timeline, replay
from processor.stream.worker.fencing import FENCED_EXIT

# ------------------------------------------------------------------------ the corpus


@dataclass(frozen=True)
class CorpusContext:
    """What the records are made against: the declared counters (all starting at
    `start_ms`), the wall clock and the deployment's max_future_ms."""

    counters: tuple[str, ...]
    start_ms: int
    now_ms: int
    max_future_ms: int


@dataclass(frozen=True)
class FuzzRecord:
    """One input record and what ingest must do with it: dead-letter it with `reason`,
    or (reason None) count it for `counter` with `units` (grid units, 0..UNIT)."""

    category: str
    raw: bytes
    reason: str | None
    counter: str | None = None
    units: int = 0


#: A bad category's builder: (context, rng, a counter it may name) -> the raw record.
BadMaker = Callable[[CorpusContext, random.Random, str], bytes]
#: A valid category's builder: -> (raw record, the counter it counts for, its value).
ValidMaker = Callable[[CorpusContext, random.Random, str], tuple[bytes, str, float]]


def _j(obj: object) -> bytes:
    return orjson.dumps(obj)


def _ts(ctx: CorpusContext, rng: random.Random) -> int:
    # A valid time: anywhere from the counters' start to a little ahead of now (a sealed
    # tick is not an error: the event joins the first open tick).
    return rng.randint(ctx.start_ms, ctx.now_ms + ctx.max_future_ms // 4)


def _iso(ms: int) -> str:
    secs, rest = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{rest:03d}Z"


#: Bad categories: name -> (the dead-letter reason ingest must give, builder).
BAD: Final[dict[str, tuple[str, BadMaker]]] = {
    # Not a UTF-8 JSON document at all.
    "not_json": ("unparsable", lambda x, r, c: b"not json %d" % r.getrandbits(40)),
    "invalid_utf8": ("unparsable",
                     lambda x, r, c: b'\xff\xfe{"counter": "%d"}' % r.getrandbits(20)),
    "truncated_json": ("unparsable", lambda x, r, c: _j({"counter": c, "ts": x.now_ms})[:-3]),
    "empty_record": ("unparsable", lambda x, r, c: b""),
    "trailing_garbage": ("unparsable",
                         lambda x, r, c: _j({"counter": c, "ts": x.now_ms}) + b" }x"),
    "single_quotes": ("unparsable",
                      lambda x, r, c: b"{'counter': '%s', 'ts': %d}" % (c.encode(), x.now_ms)),
    "json_comment": ("unparsable", lambda x, r, c: b'{"counter": "%s", /* x */ "ts": %d}'
                     % (c.encode(), x.now_ms)),
    "deep_nesting": ("unparsable", lambda x, r, c: b"[" * 5000 + b"]" * 5000),
    "nul_bytes": ("unparsable", lambda x, r, c: b"\x00" * r.randint(1, 64)),
    "utf16_json": ("unparsable", lambda x, r, c: _j({"counter": c, "ts": x.now_ms})
                   .decode().encode("utf-16")),
    "cesu_surrogate_bytes": ("unparsable",
                             lambda x, r, c: b'{"counter": "\xed\xa0\x80", "ts": %d}' % x.now_ms),
    "oversize_garbage": ("unparsable", lambda x, r, c: b"x" * r.randint(5000, 300_000)),
    # JSON, but not an event.
    "json_array": ("schema_violation", lambda x, r, c: _j([c, x.now_ms, 1])),
    "json_string": ("schema_violation", lambda x, r, c: _j(c)),
    "json_number": ("schema_violation", lambda x, r, c: _j(r.randint(0, 10**9))),
    "json_null": ("schema_violation", lambda x, r, c: b"null"),
    "unknown_field": ("schema_violation",
                      lambda x, r, c: _j({"counter": c, "ts": x.now_ms, "colour": "red"})),
    "counter_missing": ("schema_violation", lambda x, r, c: _j({"ts": x.now_ms, "value": 1})),
    "counter_empty": ("schema_violation", lambda x, r, c: _j({"counter": "", "ts": x.now_ms})),
    "counter_number": ("schema_violation",
                       lambda x, r, c: _j({"counter": r.randint(0, 99), "ts": x.now_ms})),
    "counter_null": ("schema_violation", lambda x, r, c: _j({"counter": None, "ts": x.now_ms})),
    "counter_list": ("schema_violation", lambda x, r, c: _j({"counter": [c], "ts": x.now_ms})),
    "counter_lone_surrogate": ("schema_violation", lambda x, r, c: b'{"counter": "%s\\ud800",'
                               b' "ts": %d}' % (c.encode(), x.now_ms)),
    "counter_too_long": ("schema_violation", lambda x, r, c: _j(
        {"counter": "n" * (MAX_COUNTER_NAME + r.randint(1, 50)), "ts": x.now_ms})),
    "counter_oversize": ("schema_violation", lambda x, r, c: _j(
        {"counter": "o" * r.randint(50_000, 200_000), "ts": x.now_ms})),
    "ts_bool": ("schema_violation", lambda x, r, c: _j({"counter": c, "ts": True})),
    "ts_negative": ("schema_violation",
                    lambda x, r, c: _j({"counter": c, "ts": -r.randint(1, 10**12)})),
    "ts_float": ("schema_violation", lambda x, r, c: _j({"counter": c, "ts": x.now_ms + 0.5})),
    "ts_garbage_string": ("schema_violation", lambda x, r, c: _j({"counter": c,
                                                                 "ts": "yesterday"})),
    "ts_iso_without_zone": ("schema_violation", lambda x, r, c: _j(
        {"counter": c, "ts": _iso(x.now_ms)[:-1]})),
    "ts_iso_before_1970": ("schema_violation", lambda x, r, c: _j(
        {"counter": c, "ts": "1969-12-31T23:59:59Z"})),
    "ts_object": ("schema_violation", lambda x, r, c: _j({"counter": c, "ts": {"ms": 1}})),
    "value_string": ("schema_violation", lambda x, r, c: _j({"counter": c, "ts": x.now_ms,
                                                             "value": "1"})),
    "value_bool": ("schema_violation", lambda x, r, c: _j({"counter": c, "ts": x.now_ms,
                                                           "value": True})),
    "value_null": ("schema_violation", lambda x, r, c: _j({"counter": c, "ts": x.now_ms,
                                                           "value": None})),
    "value_list": ("schema_violation", lambda x, r, c: _j({"counter": c, "ts": x.now_ms,
                                                           "value": [1]})),
    "value_nan_string": ("schema_violation", lambda x, r, c: _j({"counter": c, "ts": x.now_ms,
                                                                 "value": "NaN"})),
    # Missing time.
    "ts_missing": ("timestamp_missing", lambda x, r, c: _j({"counter": c, "value": 1})),
    "ts_null": ("timestamp_missing", lambda x, r, c: _j({"counter": c, "ts": None})),
    # Not a finite value (stdlib JSON literals orjson refuses).
    "value_nan": ("value_not_finite", lambda x, r, c: b'{"counter": "%s", "ts": %d, '
                  b'"value": NaN}' % (c.encode(), x.now_ms)),
    "value_infinity": ("value_not_finite", lambda x, r, c: b'{"counter": "%s", "ts": %d, '
                       b'"value": Infinity}' % (c.encode(), x.now_ms)),
    "value_minus_infinity": ("value_not_finite", lambda x, r, c: b'{"counter": "%s", '
                             b'"ts": %d, "value": -Infinity}' % (c.encode(), x.now_ms)),
    "value_overflow": ("value_not_finite", lambda x, r, c: b'{"counter": "%s", "ts": %d, '
                       b'"value": 1e400}' % (c.encode(), x.now_ms)),
    # Out of [0, 1].
    "value_above_one": ("value_out_of_range", lambda x, r, c: _j(
        {"counter": c, "ts": x.now_ms, "value": 1 + r.uniform(1e-9, 100)})),
    "value_negative": ("value_out_of_range", lambda x, r, c: _j(
        {"counter": c, "ts": x.now_ms, "value": -r.uniform(1e-9, 100)})),
    "value_huge_int": ("value_out_of_range", lambda x, r, c: _j(
        {"counter": c, "ts": x.now_ms, "value": r.randint(2, 10**15)})),
    "value_tiny_negative": ("value_out_of_range", lambda x, r, c: _j(
        {"counter": c, "ts": x.now_ms, "value": -1e-300})),
    # Not declared.
    "undeclared": ("undeclared_counter", lambda x, r, c: _j(
        {"counter": f"nobody-{r.getrandbits(32)}", "ts": x.now_ms})),
    "undeclared_unicode": ("undeclared_counter", lambda x, r, c: _j(
        {"counter": f"zähler-ü-{r.getrandbits(16)}", "ts": x.now_ms})),
    "undeclared_near_miss": ("undeclared_counter", lambda x, r, c: _j(
        {"counter": c + " ", "ts": x.now_ms})),
    # Too far ahead (an hour past max_future_ms: robust to how late ingest reads it).
    "ts_far_future": ("timestamp_too_far_in_future", lambda x, r, c: _j(
        {"counter": c, "ts": x.now_ms + x.max_future_ms + 3_600_000})),
    "ts_beyond_64_bits": ("schema_violation", lambda x, r, c: b'{"counter": "%s", '
                          b'"ts": 1%s}' % (c.encode(), b"0" * r.randint(20, 40))),
    "ts_in_30_years": ("timestamp_too_far_in_future", lambda x, r, c: _j(
        {"counter": c, "ts": x.now_ms + 10**12})),
    "ts_iso_year_2999": ("timestamp_too_far_in_future", lambda x, r, c: _j(
        {"counter": c, "ts": "2999-01-01T00:00:00Z"})),
    # Before the counter's start.
    "before_start": ("before_start", lambda x, r, c: _j(
        {"counter": c, "ts": x.start_ms - r.randint(1, 10**6)})),
    "ts_zero": ("before_start", lambda x, r, c: _j({"counter": c, "ts": 0})),
    "ts_iso_before_start": ("before_start", lambda x, r, c: _j(
        {"counter": c, "ts": _iso(x.start_ms - 1000)})),
    # The privacy unit's field (validated in every mode; docs/privacy-unit.md).
    "unit_empty": ("invalid_unit", lambda x, r, c: _j({"counter": c, "ts": _ts(x, r),
                                                        "user": ""})),
    "unit_not_string": ("invalid_unit", lambda x, r, c: _j(
        {"counter": c, "ts": _ts(x, r), "user": r.choice([7, True, ["u"], {"u": 1}])})),
    "unit_too_long": ("invalid_unit", lambda x, r, c: _j(
        {"counter": c, "ts": _ts(x, r), "user": "u" * r.randint(257, 400)})),
    "unit_lone_surrogate": ("invalid_unit", lambda x, r, c: b'{"counter": "%s", "ts": %d, '
                            b'"user": "a\\ud800"}' % (c.encode(), _ts(x, r))),
}

#: Valid but awkward categories: each must be counted once per record.
VALID: Final[dict[str, ValidMaker]] = {
    "plain": lambda x, r, c: (_j({"counter": c, "ts": _ts(x, r)}), c, 1.0),
    "value_half": lambda x, r, c: (_j({"counter": c, "ts": _ts(x, r), "value": 0.5}), c, 0.5),
    "value_zero": lambda x, r, c: (_j({"counter": c, "ts": _ts(x, r), "value": 0}), c, 0.0),
    "value_exponent": lambda x, r, c: (b'{"counter": "%s", "ts": %d, "value": 2.5e-1}'
                                       % (c.encode(), _ts(x, r)), c, 0.25),
    "iso_timestamp": lambda x, r, c: (_j({"counter": c, "ts": _iso(_ts(x, r))}), c, 1.0),
    "late_at_start": lambda x, r, c: (_j({"counter": c, "ts": x.start_ms}), c, 1.0),
    "whitespace_padded": lambda x, r, c: (b"  \n" + _j({"counter": c, "ts": _ts(x, r)})
                                          + b" " * r.randint(1, 2000), c, 1.0),
    "duplicate_key": lambda x, r, c: (b'{"counter": "ignored", "counter": "%s", "ts": %d}'
                                      % (c.encode(), _ts(x, r)), c, 1.0),
}

#: Every category: bad ones first, then the valid ones.
CATEGORIES: Final = (*BAD, *VALID)
#: Relative frequency of the large bad categories in a random draw (others: 1), so that
#: 10^5 records stay some megabytes on the broker rather than a gigabyte.
_RARE: Final = {"oversize_garbage": 0.02, "counter_oversize": 0.02, "deep_nesting": 0.2}


def fuzz_corpus(ctx: CorpusContext, rng: random.Random, *, bad: int, valid: int,
                every_category: bool = True) -> list[FuzzRecord]:
    """`bad` bad and `valid` valid records in a random order; with `every_category`
    each category appears at least once (so `bad` >= len(BAD), `valid` >= len(VALID)).
    A valid record is sometimes sent twice (the duplicate counts twice: two records)."""
    if every_category and (bad < len(BAD) or valid < len(VALID)):
        raise ValueError(f"every category needs bad >= {len(BAD)}, valid >= {len(VALID)}")
    bad_names = list(BAD) if every_category else []
    weights = [_RARE.get(name, 1.0) for name in BAD]
    bad_names += rng.choices(list(BAD), weights, k=bad - len(bad_names))
    valid_names = list(VALID) if every_category else []
    valid_names += [rng.choice(list(VALID)) for _ in range(valid - len(valid_names))]
    out: list[FuzzRecord] = []
    for name in bad_names:
        reason, make = BAD[name]
        out.append(FuzzRecord(name, make(ctx, rng, rng.choice(ctx.counters)), reason))
    for name in valid_names:
        raw, counter, value = VALID[name](ctx, rng, rng.choice(ctx.counters))
        rec = FuzzRecord(name, raw, None, counter, to_units(value))
        out.append(rec)
    # Exact duplicates of some valid records (a producer's retry or a replayed file).
    valid_out = [r for r in out if r.reason is None]
    for rec in rng.sample(valid_out, k=min(len(valid_out), max(1, valid // 50))):
        out.append(FuzzRecord("duplicate_record", rec.raw, None, rec.counter, rec.units))
    rng.shuffle(out)
    return out


#: Settings of a campaign deployment: short ticks (many pass during a run) and a large
#: epsilon (released values follow the data, so a wrong count would show).
CAMPAIGN_SETTINGS: Final[dict[str, Any]] = dict(
    partitions=2, tick_ms=200, lateness_ms=400, max_future_ms=3000, heartbeat_ticks=10,
    mechanism="simecc", epsilon=500.0)


def campaign_counters(n: int, now_ms: int) -> dict[str, int]:
    """`n` declared counters c0, c1, ..., starting a minute before `now_ms` (on a tick)."""
    tick = int(CAMPAIGN_SETTINGS["tick_ms"])
    start = (now_ms - 60_000) // tick * tick
    return {f"c{i}": start for i in range(n)}


# ------------------------------------------------------------------------ the checks


@dataclass
class CampaignReport:
    """What the checks found (all counts; the campaign passes when `ok`)."""

    input_records: int = 0
    valid_records: int = 0
    bad_records: int = 0
    #: Valid records not on the timeline, or counted fewer times than sent.
    lost: int = 0
    #: Events the operator applied beyond the valid records (counted twice).
    counted_twice: int = 0
    #: Valid records on the timeline under another counter or value.
    misrouted: int = 0
    #: (counter, tick, kind) published with two different values.
    conflicting: int = 0
    #: Bad records with no dead letter, with another reason, or on the timeline.
    bad_not_dead_lettered: int = 0
    bad_wrong_reason: int = 0
    bad_counted: int = 0
    #: Valid records dead-lettered.
    valid_dead_lettered: int = 0
    #: Further identical dead letters of one input record (re-ingested after a kill:
    #: the ingest stage is at-least-once; a run without kills must have none).
    dead_letter_resends: int = 0
    dead_letters_by_reason: dict[str, int] = field(default_factory=dict)
    events_applied: int = 0
    releases: int = 0
    replay_identical: bool = False
    replay_summary: str = ""

    @property
    def ok(self) -> bool:
        return (self.replay_identical and not self.lost and not self.counted_twice
                and not self.misrouted and not self.conflicting
                and not self.bad_not_dead_lettered and not self.bad_wrong_reason
                and not self.bad_counted and not self.valid_dead_lettered)

    def as_dict(self) -> dict[str, Any]:
        return {**{k: v for k, v in vars(self).items()}, "ok": self.ok}


def expectations(corpus: Iterable[FuzzRecord]) -> dict[bytes, FuzzRecord]:
    """raw bytes -> what ingest must do with them (ValueError if two categories made the
    same bytes with different outcomes: the checks could not tell them apart)."""
    out: dict[bytes, FuzzRecord] = {}
    for rec in corpus:
        old = out.get(rec.raw)
        if old is not None and (old.reason, old.counter, old.units) != (
                rec.reason, rec.counter, rec.units):
            raise ValueError(f"categories {old.category} and {rec.category} collide")
        out.setdefault(rec.raw, rec)
    return out


def events_applied(settings: Settings, key: Any,
                   timeline: Mapping[int, Sequence[kafka_io.KafkaRecord]]) -> int:
    """How many events the operator applies over the whole timeline (re-sent copies are
    dropped by its duplicate filter), run with the worker's own commit code."""
    async def run() -> int:
        commit = BatchCommit(Operator(settings, key), DictStore(), CollectingSink())
        applied = 0
        for p in sorted(timeline):
            recs = sorted(timeline[p], key=lambda r: r.offset)
            for i in range(0, len(recs), 500):
                out = await commit.commit(p, [(r.offset, r.value or b"")
                                              for r in recs[i:i + 500]])
                applied += out.metrics.get("events_applied", 0)
        return applied
    return asyncio.run(run())


def _timeline_events(timeline: Mapping[int, Sequence[kafka_io.KafkaRecord]]
                     ) -> dict[tuple[int, int], tuple[str, int]]:
    """(input partition, input offset) -> (counter, units) of every event on the timeline."""
    seen: dict[tuple[int, int], tuple[str, int]] = {}
    for recs in timeline.values():
        for r in recs:
            try:
                rec = decode_timeline(r.value or b"")
            except TimelineFormatError:
                continue
            if isinstance(rec, TimelineBatch):
                for ev in rec.events:
                    seen[(ev.src_partition, ev.src_offset)] = (ev.counter, ev.units)
    return seen


def _check_dead_letters(dep: Deployment, want: Mapping[tuple[int, int], FuzzRecord],
                        rep: CampaignReport) -> dict[tuple[int, int], set[str]]:
    """The dead-letter topic: reasons per input record, re-sends, by reason; a dead letter
    that is not its input record counts as a wrong reason."""
    dead: dict[tuple[int, int], set[str]] = {}
    copies: collections.Counter[tuple[int, int]] = collections.Counter()
    by_reason: collections.Counter[str] = collections.Counter()
    for r in kafka_io.iter_topic(dep.conf, dep.topics.deadletter, timeout_s=300):
        d = orjson.loads(r.value or b"{}")
        where = (int(d["partition"]), int(d["offset"]))
        dead.setdefault(where, set()).add(str(d["reason"]))
        copies[where] += 1
        by_reason[str(d["reason"])] += 1
        if base64.b64decode(d["raw"]) != want.get(where, FuzzRecord("", b"", None)).raw[:4096]:
            rep.bad_wrong_reason += 1  # a dead letter that is not its input record
    rep.dead_letter_resends = sum(n - 1 for n in copies.values())
    rep.dead_letters_by_reason = dict(sorted(by_reason.items()))
    return dead


def _check_records(want: Mapping[tuple[int, int], FuzzRecord],
                   seen: Mapping[tuple[int, int], tuple[str, int]],
                   dead: Mapping[tuple[int, int], set[str]], rep: CampaignReport) -> None:
    """Each input record's fate: a valid one on the timeline once, as itself, never dead
    lettered; a bad one dead lettered for its reason, never counted."""
    for where, exp in want.items():
        if exp.reason is None:
            got = seen.get(where)
            if got is None:
                rep.lost += 1
            elif got != (exp.counter, exp.units):
                rep.misrouted += 1
            if where in dead:
                rep.valid_dead_lettered += 1
        else:
            reasons = dead.get(where)
            if not reasons:
                rep.bad_not_dead_lettered += 1
            elif reasons != {exp.reason}:
                rep.bad_wrong_reason += 1
            if where in seen:
                rep.bad_counted += 1


def check(dep: Deployment, expected: Mapping[bytes, FuzzRecord], *,
          with_replay: bool = True) -> CampaignReport:
    """Read a stopped deployment's topics and check them against `expected` (every input
    record's raw bytes must be there); `with_replay=False` leaves the replay out (it is
    then reported as not identical)."""
    rep = CampaignReport()
    conf, topics = dep.conf, dep.topics
    inputs = list(kafka_io.iter_topic(conf, topics.input, timeout_s=300))
    want: dict[tuple[int, int], FuzzRecord] = {}
    for r in inputs:
        exp = expected.get(r.value or b"")
        if exp is None:
            raise ValueError(f"input {r.partition}:{r.offset} is not from the corpus")
        want[(r.partition, r.offset)] = exp
    rep.input_records = len(want)
    rep.valid_records = sum(1 for e in want.values() if e.reason is None)
    rep.bad_records = rep.input_records - rep.valid_records

    timeline = kafka_io.read_topic(conf, topics.timeline, timeout_s=300)
    seen = _timeline_events(timeline)
    dead = _check_dead_letters(dep, want, rep)
    _check_records(want, seen, dead, rep)
    rep.events_applied = events_applied(dep.settings, dep.key, timeline)
    on_timeline = sum(1 for w, e in want.items() if e.reason is None and w in seen)
    rep.counted_twice = max(0, rep.events_applied - on_timeline)
    rep.lost += max(0, on_timeline - rep.events_applied)
    values: dict[tuple[str, int, str], float] = {}
    conflicts: set[tuple[str, int, str]] = set()
    releases = dep.releases()
    for d in releases:
        k = (str(d["counter"]), int(d["tick"]), str(d["kind"]))
        if k in values and values[k] != d["value"]:
            conflicts.add(k)
        values[k] = float(d["value"])
    rep.releases = len(releases)
    rep.conflicting = len(conflicts)
    if with_replay:
        # One process: replay's forked jobs can deadlock in a process that has Kafka
        # client threads (the driver's), as this one does.
        result = replay(dep.settings, dep.key, timeout_s=300, jobs=1)
        rep.replay_identical = result.identical
        rep.replay_summary = result.summary()
    return rep


# ------------------------------------------------------------------------ the driver


#: The moments a single worker is killed at (see KillDriver).
KILL_MOMENTS: Final = ("startup", "marker", "backlog", "mid_batch")
#: How long a resumed worker is given to fence itself (it does within a beat, 0.2 s).
FENCE_WAIT_S: Final = 10.0
#: How long a worker restarted after a fenced pause is left alone (startup and join).
RESTART_SETTLE_S: Final = 12.0
#: DPC_TEST_CRASH_AT points of a mid-batch kill, and the call ranges they fire at (about
#: one call of each commit point per checkpoint, every 1.2 s: between_state_writes sits
#: between the two partitions' write batches).
MID_BATCH_POINTS: Final = (("after_acks", 5, 60), ("between_state_writes", 2, 8),
                           ("after_state", 5, 60), (INGEST_DELIVERED, 1, 8))


class KillDriver:
    """Kills, pauses and broker faults against one deployment, with a corpus source.

    `feed(n)` produces the next `n` records of the corpus (made at the current wall clock
    so that time-dependent categories keep their meaning) and remembers what each must
    become; `expected` is everything fed so far. Figures go to `counts`.
    """

    def __init__(self, dep: Deployment, rng: random.Random, *, bad_share: float,
                 backlog: tuple[int, int] = (6000, 12000),
                 mid_batch_points: Sequence[tuple[str, int, int]] = MID_BATCH_POINTS) -> None:
        self.dep = dep
        self.rng = rng
        self.bad_share = bad_share
        #: The DPC_TEST_CRASH_AT points a mid-batch kill picks from, with their call ranges.
        self.mid_batch_points = tuple(mid_batch_points)
        #: How many records a backlog kill produces while the worker is down (range).
        self.backlog = backlog
        self.expected: dict[bytes, FuzzRecord] = {}
        self.counts: collections.Counter[str] = collections.Counter()
        self._first = True
        self._start_ms = min(dep.settings.counters.values())

    # -- input

    def context(self) -> CorpusContext:
        s = self.dep.settings
        return CorpusContext(tuple(sorted(s.counters)), self._start_ms,
                             int(time.time() * 1000), s.max_future_ms)

    def feed(self, n: int, timeout_s: float | None = None) -> int:
        """Produce `n` corpus records (the first call includes every category); wait up to
        `timeout_s` for the acks (default: the deployment's producer's own wait)."""
        bad = max(0, round(n * self.bad_share))
        valid = max(0, n - bad)
        if self._first:
            bad, valid = max(bad, len(BAD)), max(valid, len(VALID))
        corpus = fuzz_corpus(self.context(), self.rng, bad=bad, valid=valid,
                             every_category=self._first)
        self._first = False
        merged = expectations([*self.expected.values(), *corpus])
        self.expected = merged
        if timeout_s is None:
            sent = self.dep.produce(r.raw for r in corpus)
        else:
            sent = kafka_io.produce_all(self.dep.conf, self.dep.topics.input,
                                        ((None, r.raw) for r in corpus), timeout_s=timeout_s)
        self.counts["records_fed"] += sent
        return sent

    # -- single-worker kills

    def kill(self, moment: str, worker: WorkerProcess | None = None) -> None:
        """One SIGKILL of `worker` (default the first) at `moment` (KILL_MOMENTS); the
        worker is running again afterwards."""
        w = worker or self.dep.worker
        if moment == "startup":
            w.kill()
            w.start()
            _pause(self.rng.uniform(0.2, 4.0))
            self._sigkill(w, moment)
        elif moment == "marker":
            if not w.alive():
                w.start()
            if wait_for_marker(self.dep.conf, self.dep.topics.timeline, 90.0):
                self._sigkill(w, moment)
            else:
                self.counts["marker_kill_no_marker"] += 1
                self._sigkill(w, moment)
        elif moment == "backlog":
            w.kill()
            self.feed(self.rng.randint(*self.backlog))
            before = _high(self.dep.conf, self.dep.topics.deadletter)
            w.start()
            # Kill once ingest has delivered its first batch of the backlog (dead letters
            # grow): with more than one consume batch (MAX_CONSUME) of backlog, the input is
            # then not yet all committed.
            deadline = time.monotonic() + 90.0
            while (_high(self.dep.conf, self.dep.topics.deadletter) <= before
                   and time.monotonic() < deadline and w.alive()):
                _pause(0.1)
            drained = self._input_drained()
            self._sigkill(w, moment)
            self.counts["backlog_kills_mid_drain"] += 0 if drained else 1
        elif moment == "mid_batch":
            point, lo, hi = self.rng.choice(self.mid_batch_points)
            w.kill()
            w.env[CRASH_ENV] = f"{point}:{self.rng.randint(lo, hi)}"
            w.start()
            assert w.proc is not None
            # Records keep flowing until the worker kills itself (ingest_delivered counts
            # input batches, which only a feed makes); not reached in 2 minutes: the
            # driver kills it, and that is no mid-batch kill.
            code: int | None = None
            deadline = time.monotonic() + 120.0
            while code is None and time.monotonic() < deadline:
                try:
                    code = w.proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:
                    self.feed(50)
            w.kill()  # reaps, closes the log
            del w.env[CRASH_ENV]
            if code == -signal.SIGKILL:
                self.counts[f"mid_batch_point_{point}"] += 1
                self.counts["kills_mid_batch"] += 1
            else:
                self.counts["mid_batch_not_reached"] += 1
        else:
            raise ValueError(f"unknown kill moment {moment!r}")
        if not w.alive():
            w.start()

    def _sigkill(self, w: WorkerProcess, moment: str) -> None:
        if w.alive():
            w.kill()
            self.counts[f"kills_{moment}"] += 1
        else:
            # It exited by itself: how (a refusal exits 2) must not be lost.
            self.counts[f"{moment}_already_dead"] += 1
            self.counts[f"{moment}_found_exit_{exit_label(w, w.stop())}"] += 1
        w.start()

    def _input_drained(self) -> bool:
        group = f"{self.dep.settings.app_id}-ingest"
        done = kafka_io.committed_offsets(self.dep.conf, group, self.dep.topics.input)
        ends = kafka_io.end_offsets(self.dep.conf, self.dep.topics.input)
        return all(done.get(p, 0) >= hi for p, (_lo, hi) in ends.items())

    # -- two workers

    def pause(self, worker: WorkerProcess, seconds: float) -> None:
        """SIGSTOP `worker` for `seconds` (past the 10 s session timeout: its partitions
        move to the other worker), then SIGCONT. A worker resumed after that long exits
        before it writes anything (app.Worker.fenced, exit code FENCED_EXIT); it is
        restarted here, as a supervisor would, and counted as `pauses_fenced`."""
        if not worker.alive():
            worker.start()
        assert worker.proc is not None
        worker.proc.send_signal(signal.SIGSTOP)
        try:
            _pause(seconds)
        finally:
            worker.proc.send_signal(signal.SIGCONT)
        self.counts["pauses"] += 1
        deadline = time.monotonic() + FENCE_WAIT_S
        while worker.alive() and time.monotonic() < deadline:
            _pause(0.1)
        if not worker.alive():
            code = worker.stop()
            self.counts["pauses_fenced" if code == FENCED_EXIT
                        else f"pause_exit_{exit_label(worker, code)}"] += 1
            worker.start()
            # Let it start up and join before the next fault: a pause of a worker still
            # importing its modules has no partitions to lose and tests nothing.
            _pause(RESTART_SETTLE_S)

    # -- brokers

    def kill_broker(self, cluster: LocalKafka, down_s: float) -> None:
        """SIGKILL one node of `cluster` (chosen at random), restart it after `down_s`."""
        i = self.rng.randrange(cluster.nodes)
        cluster.kill_node(i)
        self.counts["broker_kills"] += 1
        _pause(down_s)
        cluster.restart_node(i)

    def broker_outage(self, cluster: LocalKafka, down: int, down_s: float,
                      feed: int) -> None:
        """SIGKILL `down` nodes of `cluster` at once (chosen at random), feed `feed` records
        meanwhile from another thread (their acks wait for the brokers), restart the
        nodes after `down_s`. With two of three nodes down the controller quorum and
        min ISR 2 are lost: producers, ingest and the worker can only wait."""
        nodes = self.rng.sample(range(cluster.nodes), down)
        for i in nodes:
            cluster.kill_node(i)
        self.counts["broker_outages"] += 1
        self.counts["broker_kills"] += down
        fed: list[int] = []
        failed: list[BaseException] = []

        def feeder() -> None:
            try:
                for _ in range(10):
                    fed.append(self.feed(max(1, feed // 10), timeout_s=down_s + 300.0))
            except Exception as exc:  # raised again in the calling thread
                failed.append(exc)

        thread = threading.Thread(target=feeder, name="outage-feeder", daemon=True)
        thread.start()
        _pause(down_s)
        # A worker that gave up is no stall; drain_and_stop restarts it, so the checks
        # alone would not show it.
        self.counts["workers_dead_in_outage"] += sum(not w.alive() for w in self.dep.workers)
        for i in nodes:
            cluster.restart_node(i)
        thread.join()
        if failed:
            raise failed[0]
        self.counts["records_fed_in_outages"] += sum(fed)
        self.counts["workers_dead_after_outage"] += sum(
            not w.alive() for w in self.dep.workers)

    # -- the end

    def drain_stages(self) -> list[tuple[str, str, str]]:
        """(role, consumer group, topic) of each stage a drain waits for, upstream first:
        ingest on the input, in privacy_unit = "user" the bounding stage on the units
        topic, the operator on the timeline."""
        s = self.dep.settings
        topics, app = s.topics, s.app_id
        units = ([("units", app, units_topic(s))] if s.privacy_unit == "user" else [])
        return [("input", f"{app}-ingest", topics.input), *units,
                ("timeline", app, topics.timeline)]

    def drain_and_stop(self, workers: Sequence[WorkerProcess], timeout_s: float = 600.0) -> bool:
        """Wait until each of `drain_stages` committed its topic as it was once the stage
        before it had (ingest the whole input, then the operator the timeline), then stop
        every worker cleanly. False if that did not happen in time
        (the checks still run: they judge whatever is committed); `counts` then says how
        many records each group's commit was short of, per partition."""
        for w in workers:
            if not w.alive():
                # It exited by itself since the last fault: how (a refusal exits 2) must
                # not be lost by the restart.
                self.counts[f"drain_found_exit_{exit_label(w, w.stop())}"] += 1
                w.start()
        deadline = time.monotonic() + timeout_s
        behind: dict[tuple[str, int], int] = {}
        for role, group, topic in self.drain_stages():
            behind = {(role, p): n for p, n in
                      _wait_committed(self.dep.conf, group, topic, deadline).items()}
            if behind:
                break
        for (role, p), n in behind.items():
            self.counts[f"drain_short_{role}_p{p}"] = n
        for w in workers:
            code = w.stop()
            self.counts[f"clean_stop_exit_{code}"] += 1
        return not behind


#: The start's one line when the brokers did not answer its probe in time
#: (kafka_io.probe): a worker paused during its start meets it when resumed, and its
#: exit code is 2 as a refusal's. The campaign's faults cause it; it refuses no state.
_UNREACHABLE = b"do not answer"


def exit_label(worker: WorkerProcess, code: int | None) -> str:
    """How `worker` exited, for the driver's counts: its code, or "2_brokers_unreachable"
    when its last `error:` line is the start's probe failing (`_UNREACHABLE`), which is
    no refusal (`refusals`)."""
    if code != 2:
        return str(code)
    try:
        lines = [ln for ln in worker.log_path.read_bytes().splitlines()
                 if ln.startswith(b"error:")]
    except OSError:
        return "2"
    return "2_brokers_unreachable" if lines and _UNREACHABLE in lines[-1] else "2"


def refusals(counts: Mapping[str, int]) -> list[str]:
    """The driver's counts of workers found exited with code 2 (`*_exit_2`): a refusal of
    their state (AnnouncedCounterError and the like, docs/privacy-notes.md, "Refusal")
    or a start error other than brokers that did not answer a paused start's probe
    (`exit_label`), which no campaign fault may cause. The driver restarts such a
    worker, so the published topics' checks alone would not show it."""
    return sorted(k for k, n in counts.items() if n and k.endswith("_exit_2"))


def _pause(seconds: float) -> None:
    # The campaign's own schedule (when to strike), not a synchronisation wait.
    time.sleep(max(0.0, seconds))


def _high(conf: Mapping[str, str], topic: str) -> int:
    return sum(hi for _lo, hi in kafka_io.end_offsets(conf, topic).values())


def _wait_committed(conf: Mapping[str, str], group: str, topic: str,
                    deadline: float) -> dict[int, int]:
    """Wait until `group` committed `topic` up to its end offsets as they are now; {} then,
    else at the deadline partition -> records short."""
    ends = {p: hi for p, (_lo, hi) in kafka_io.end_offsets(conf, topic).items()}
    while True:
        done = kafka_io.committed_offsets(conf, group, topic)
        short = {p: hi - done.get(p, 0) for p, hi in ends.items()
                 if done.get(p, 0) < hi}
        if not short or time.monotonic() >= deadline:
            return short
        _pause(0.5)


def wait_for_marker(conf: Mapping[str, str], topic: str, timeout_s: float) -> bool:
    """Return as soon as a marker is appended to `topic` after this call (True), or False
    after `timeout_s`."""
    consumer = Consumer({**conf, "group.id": f"campaign-{uuid.uuid4().hex}",
                         "enable.auto.commit": "false", "log_level": "0"})
    try:
        ends = kafka_io.end_offsets(conf, topic)
        consumer.assign([TopicPartition(topic, p, hi) for p, (_lo, hi) in ends.items()])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = consumer.poll(0.05)
            if msg is None or msg.error() is not None:
                continue
            with contextlib.suppress(TimelineFormatError):
                if isinstance(decode_timeline(msg.value() or b""), TimelineMarker):
                    return True
        return False
    finally:
        consumer.close()


def kill_plan(kills: int, rng: random.Random) -> list[str]:
    """`kills` moments, as even a spread over KILL_MOMENTS as the count allows, shuffled."""
    plan = [KILL_MOMENTS[i % len(KILL_MOMENTS)] for i in range(kills)]
    rng.shuffle(plan)
    return plan



# ------------------------------------------------------------ the network-partition phase


#: Faults of the network-partition phase: kind -> range of its duration (s). The long
#: blackhole and the reset outlast the 10 s session timeout (the group moves the cut-off
#: worker's partitions to the other), the short blackhole does not.
PARTITION_FAULTS: Final[dict[str, tuple[float, float]]] = {
    "blackhole_long": (12.0, 20.0), "blackhole_short": (6.0, 8.0), "reset": (12.0, 20.0)}
#: Settings of its deployment: the campaign's, with four timeline partitions.
PARTITION_SETTINGS: Final[dict[str, Any]] = {**CAMPAIGN_SETTINGS, "partitions": 4}
#: After a heal: time for the cut-off worker to notice, rejoin and get partitions back
#: before the next fault (a rebalance takes a few seconds; its session 10 s).
PARTITION_SETTLE_S: Final = 20.0
#: Worker log lines counted as figures (how the cut-off worker learnt it was out).
_LOG_SIGNS: Final = {"unknown_member": "UnknownMemberId",
                     "member_not_recognized": "member_id was not recognized",
                     "critical": "CRITICAL"}


def partition_plan(faults: int, rng: random.Random,
                   kinds: Sequence[str] = tuple(PARTITION_FAULTS)) -> list[str]:
    """`faults` fault kinds, as even a spread over `kinds` as the count allows, shuffled."""
    plan = [kinds[i % len(kinds)] for i in range(faults)]
    rng.shuffle(plan)
    return plan


@dataclass
class PublishedReport:
    """The published private-count stream against a recomputation from the timeline
    (`check_published`). Keys are (counter, tick, kind); a key is counted once per
    problem however many copies were published."""

    releases: int = 0
    #: Distinct published keys compared with a recomputed value.
    compared: int = 0
    #: Published below / above the recomputed value (a key published with two values can
    #: be both).
    short: int = 0
    ahead: int = 0
    #: Published but not recomputed at all.
    unexpected: int = 0
    #: Recomputed and due (its timeline record committed, or a later tick of its counter
    #: published: replay's cut) but not published.
    missing: int = 0
    #: (counter, tick) published with two or more different values (any kind).
    conflicting_ticks: int = 0
    #: Counters with at least one violation.
    counters_affected: int = 0
    max_abs_error: float = 0.0
    examples: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return self.short + self.ahead + self.unexpected + self.missing

    @property
    def ok(self) -> bool:
        return not self.violations and not self.conflicting_ticks

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "violations": self.violations, "ok": self.ok}


#: How many examples a report keeps.
EXAMPLES: Final = 5


def compare_published(recomputed: Iterable[Release], due_keys: Iterable[tuple[str, int, str]],
                      published: Iterable[Mapping[str, Any]]) -> PublishedReport:
    """The comparison behind `check_published`: `recomputed` releases (all of the
    timeline), the keys among them that are due whatever was published (`due_keys`: those
    of committed timeline records) and the published releases, decoded."""
    rep = PublishedReport()
    mine: dict[tuple[str, int, str], float] = {}
    for r in recomputed:
        mine.setdefault((r.counter, r.tick, r.kind), float(r.value))
    theirs: dict[tuple[str, int, str], set[float]] = {}
    by_tick: dict[tuple[str, int], set[float]] = {}
    top: dict[str, int] = {}  # the highest published tick of each counter
    for d in published:
        k = (str(d["counter"]), int(d["tick"]), str(d["kind"]))
        v = float(d["value"])
        rep.releases += 1
        theirs.setdefault(k, set()).add(v)
        by_tick.setdefault(k[:2], set()).add(v)
        top[k[0]] = max(top.get(k[0], k[1]), k[1])
    bad_counters: set[str] = set()

    def note(text: str, counter: str) -> None:
        bad_counters.add(counter)
        if len(rep.examples) < EXAMPLES:
            rep.examples.append(text)

    for k, values in sorted(theirs.items()):
        want = mine.get(k)
        if want is None:
            rep.unexpected += 1
            note(f"{k}: published {sorted(values)}, not recomputed", k[0])
            continue
        rep.compared += 1
        low = any(v < want for v in values)
        high = any(v > want for v in values)
        rep.short += low
        rep.ahead += high
        if low or high:
            rep.max_abs_error = max(rep.max_abs_error, *(abs(v - want) for v in values))
            note(f"{k}: published {sorted(values)}, recomputed {want}", k[0])
    due = set(due_keys)
    for k in sorted(mine):
        if k not in theirs and (k in due or k[1] <= top.get(k[0], -1)):
            rep.missing += 1
            note(f"{k}: recomputed {mine[k]}, due, not published", k[0])
    rep.conflicting_ticks = sum(1 for vs in by_tick.values() if len(vs) > 1)
    rep.counters_affected = len(bad_counters)
    return rep


def check_published(dep: Deployment) -> PublishedReport:
    """Recompute the whole timeline (the worker's own commit code, `replay.
    recompute_timeline`) and compare every published release with it, value by value:
    the published stream of a correct system is a prefix of the recomputation (replay's
    cut), so any published value short of or ahead of the recomputed one, any published
    key not recomputed, and any due key not published is a violation."""
    conf, topics = dep.conf, dep.topics
    committed = kafka_io.committed_offsets(conf, dep.settings.app_id, topics.timeline)
    timeline = kafka_io.read_topic(conf, topics.timeline, timeout_s=300)
    parts = {p: [(r.offset, r.value) for r in recs] for p, recs in timeline.items()}
    result = recompute_timeline(dep.settings, dep.key, parts, committed, jobs=1)
    return compare_published([*result.settled, *result.unsettled],
                             ((r.counter, r.tick, r.kind) for r in result.settled),
                             dep.releases())


def value_offset(key: bytes, value: bytes | None) -> int | None:
    """The timeline offset a stored state value reflects, or None when it carries none:
    state.stored_offset, the worker's own rule (a value of format 4 begins with it)."""
    return stored_offset(value)


@dataclass
class ChangelogReport:
    """The state changelog read in offset order (`check_changelog`)."""

    records: int = 0
    keys: int = 0
    #: Values `value_offset` could read / could not (tombstones and due-wheel values
    #: carry no offset and are in neither).
    decoded: int = 0
    undecoded: int = 0
    #: Writes whose offset is below the highest earlier one of their key (a late write of
    #: a worker that had lost the partition): harmless while a newer value follows, since
    #: no store takes them (state.supersedes). Not a violation by itself.
    stale_writes: int = 0
    #: Keys whose LAST record, the one compaction keeps and a restore from scratch reads,
    #: is older than an earlier one: the state would go back. The violation.
    went_back: int = 0
    keys_went_back: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.went_back

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "ok": self.ok}


def changelog_went_back(records: Iterable[kafka_io.KafkaRecord]) -> ChangelogReport:
    """Per key, in each partition's offset order: a write whose `value_offset` is below
    the highest one written before it is a stale write; a key whose last such write is
    one went back (compaction keeps it, a restore from scratch reads it: a stale owner's
    write that nobody wrote over, or a restore that continued from older state)."""
    rep = ChangelogReport()
    high: dict[bytes, tuple[int, int, int]] = {}  # key -> (offset, partition, log offset)
    last: dict[bytes, int] = {}  # key -> the offset of its last decoded write
    back: set[bytes] = set()
    keys: set[bytes] = set()
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        rep.records += 1
        if r.key is None:
            continue
        keys.add(r.key)
        if r.value is None:
            continue
        off = value_offset(r.key, r.value)
        if off is None:
            if r.key.startswith((b"c/", b"p/")):
                rep.undecoded += 1
            continue
        rep.decoded += 1
        seen = high.get(r.key)
        last[r.key] = off
        if seen is not None and off < seen[0]:
            rep.stale_writes += 1
            if len(rep.examples) < EXAMPLES:
                rep.examples.append(
                    f"{r.key.decode(errors='replace')}: timeline offset {seen[0]} at "
                    f"changelog {seen[1]}:{seen[2]}, then {off} at {r.partition}:{r.offset}")
        if seen is None or off > seen[0]:
            high[r.key] = (off, r.partition, r.offset)
    for key, off in last.items():
        if off < high[key][0]:
            back.add(key)
    rep.keys = len(keys)
    rep.went_back = rep.keys_went_back = len(back)
    return rep


def check_changelog(dep: Deployment) -> ChangelogReport:
    """`changelog_went_back` over the deployment's state changelog topic."""
    from processor.stream.kafka.topics import changelog_topic  # Faust: only when needed

    return changelog_went_back(kafka_io.iter_topic(dep.conf, changelog_topic(dep.settings),
                                                   timeout_s=300))


def replay_cli(config: str | Path, timeout_s: float = 900.0) -> dict[str, Any]:
    """`python -m processor replay --config F --json` as the operator runs it: its exit
    code, verdict and number of differences."""
    proc = subprocess.run(
        [sys.executable, "-m", "processor", "replay", "--config", str(config), "--json",
         "--quiet", "--jobs", "1"],
        capture_output=True, cwd=str(ROOT), env=worker_env(), timeout=timeout_s, check=False)
    out: dict[str, Any] = {"exit": proc.returncode}
    try:
        doc = orjson.loads(proc.stdout.strip().splitlines()[-1])
        out["verdict"] = doc["verdict"]
        out["differences"] = int(doc["differences"]["total"])
        out["first"] = [f"{d['key']}: {d['problem']}: {d['detail']}"
                        for d in doc["differences"]["first"][:EXAMPLES]]
    except (IndexError, KeyError, TypeError, orjson.JSONDecodeError):
        out["error"] = proc.stderr.decode(errors="replace")[-500:]
    return out


class Feeder:
    """Feeds a `KillDriver`'s corpus at about `rate` records a second from a thread of its
    own (its own random stream), until stop()."""

    def __init__(self, driver: KillDriver, rate: float, every_s: float = 0.5) -> None:
        self.driver = driver
        self.per_call = max(1, round(rate * every_s))
        self.every_s = every_s
        self._stop = threading.Event()
        self._failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, name="partition-feeder", daemon=True)

    def start(self) -> Feeder:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                self.driver.feed(self.per_call)
                self._stop.wait(max(0.0, self.every_s - (time.monotonic() - began)))
        except BaseException as exc:  # raised again by stop()
            self._failed.append(exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120.0)
        if self._failed:
            raise self._failed[0]


def _log_signs(worker: WorkerProcess) -> dict[str, int]:
    try:
        text = worker.log_path.read_text(errors="replace")
    except OSError:
        return {}
    return {name: text.count(sign) for name, sign in _LOG_SIGNS.items()}


def partition_phase(kafka: ProxiedKafka, parent: Path, rng: random.Random, *,
                    plan: Sequence[str], counters: int = 400, rate: float = 200.0,
                    settle_s: float = PARTITION_SETTLE_S, name: str = "campE",
                    durations: Mapping[str, tuple[float, float]] | None = None,
                    ) -> dict[str, Any]:
    """Two workers of one deployment on `kafka`, worker A through its proxy, valid records
    fed at `rate` a second; each fault of `plan` (PARTITION_FAULTS kinds) cuts A off for a
    random duration of its range, heals and leaves `settle_s`; then drain, clean stop and
    every checker: `check` (lost, counted twice, conflicting, bad records),
    `check_published`, `check_changelog` and the replay command. Returns the figures;
    "ok" is every checker's verdict."""
    assert kafka.proxy is not None
    proxy = kafka.proxy
    proxy.stats = ProxyStats()  # this phase's figures alone
    ranges = {**PARTITION_FAULTS, **(durations or {})}
    started = time.monotonic()
    dep = isolated_deployment(kafka.bootstrap_servers,
                              campaign_counters(counters, int(time.time() * 1000)),
                              parent=parent, name=name, **PARTITION_SETTINGS)
    try:
        worker_b = dep.worker
        worker_a = dep.add_worker("worker-a", bootstrap_servers=kafka.proxied_bootstrap)
        driver = KillDriver(dep, random.Random(rng.getrandbits(64)), bad_share=0.0)
        worker_a.start()
        worker_b.start()
        feeder = Feeder(driver, rate).start()
        try:
            dep.wait_releases(lambda rs: len(rs) > 0, timeout_s=180)
            _pause(settle_s)  # both joined, partitions shared
            cut_s: dict[str, float] = {}
            for kind in plan:
                lo, hi = ranges[kind]
                seconds = rng.uniform(lo, hi)
                if kind == "reset":
                    proxy.reset()
                else:
                    proxy.blackhole()
                _pause(seconds)
                proxy.heal()
                driver.counts[f"faults_{kind}"] += 1
                cut_s[kind] = round(cut_s.get(kind, 0.0) + seconds, 1)
                _pause(settle_s)
                for label, w in (("a", worker_a), ("b", worker_b)):
                    if not w.alive():  # a worker that gave up: counted, restarted
                        driver.counts[f"worker_{label}_exit_{w.stop()}"] += 1
                        w.start()
        finally:
            feeder.stop()
        caught_up = driver.drain_and_stop(dep.workers)
        report = check(dep, driver.expected, with_replay=False)
        published = check_published(dep)
        changelog = check_changelog(dep)
        cli = replay_cli(dep.config)
        report.replay_identical = cli.get("verdict") == "identical"
        report.replay_summary = f"{cli.get('verdict')}: {cli.get('differences')} differences"
        ok = report.ok and published.ok and changelog.ok and caught_up
        return {"phase": "E: two workers, one behind a proxy, network partitions",
                "faults": list(plan), "cut_s": dict(cut_s), "counters": counters,
                "rate": rate, "caught_up": caught_up,
                "driver": dict(sorted(driver.counts.items())),
                "proxy": vars(proxy.stats).copy(),
                "worker_a_log": _log_signs(worker_a), "worker_b_log": _log_signs(worker_b),
                **report.as_dict(), "published": published.as_dict(),
                "changelog": changelog.as_dict(), "replay_cli": cli, "ok": ok,
                "wall_s": round(time.monotonic() - started, 1)}
    finally:
        dep.close()
