"""Replay against the brokers: take the cut's snapshots in its order (committed offsets,
the published topics, the timeline), read them, recompute and compare, and give due
records missing from the snapshot their grace period (the package docstring).

Replay is inconclusive (ReplayError, exit 2) when the brokers do not answer, a topic is
missing, or the timeline no longer starts at offset 0 (retention deleted its beginning:
nothing can be recomputed from there). The private-count topic must be retained at least
as long as the timeline: a release deleted by retention is missing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import orjson
from confluent_kafka import KafkaException

from processor.core.rng import NoiseKey
from processor.errors import StreamError
from processor.stream.kafka import kafka_io
from processor.stream.kafka.topics import topic_name, units_topic
from processor.stream.model.bounding import check_kept_set
from processor.stream.model.config import Settings
from processor.stream.model.records import marker_tick
from processor.stream.replay.comparison import diff_order, field_detail, ledger_key, release_key
from processor.stream.replay.configured import ledger_mismatch
from processor.stream.replay.history import ledger_history
from processor.stream.replay.partitioned import replay_partitions
from processor.stream.replay.recompute import Progress, default_jobs, young_collections_only
from processor.stream.replay.report import Difference, RecordKey, ReplayReport, Tally


class ReplayError(StreamError, RuntimeError):
    """Replay cannot reach a verdict (exit 2): the brokers do not answer or refuse this
    client, a topic does not exist, or the timeline no longer starts at offset 0."""

    error_prefix = "replay: "


def replay(settings: Settings, key: NoiseKey, *, timeout_s: float = 120.0,
           progress: Progress | None = None, jobs: int | None = None,
           settle_s: float = 5.0) -> ReplayReport:
    """Snapshot the topics in the cut's order (package docstring), recompute the timeline
    (in `jobs` processes, default `default_jobs`) and compare both public topics; due
    records missing from the snapshot get `settle_s` seconds to arrive (`_recheck_missing`).
    ReplayError if the brokers do not answer or refuse this client (within
    `kafka_io.PROBE_TIMEOUT_S`, the worker's start rule), a topic is missing, or the
    timeline was truncated."""
    # librdkafka's own log lines (one per failed connection attempt) stay off stderr: a
    # broker that does not answer is reported once, by the error this raises.
    conf = {**kafka_io.base_config(settings), "log_level": "0"}
    try:
        kafka_io.require_brokers(conf, min(timeout_s, kafka_io.PROBE_TIMEOUT_S))
    except kafka_io.BrokerUnavailable as exc:
        raise ReplayError(str(exc)) from None
    topics = [topic_name(settings, t) for t in ("timeline", "counts", "ledger")]
    try:
        missing = kafka_io.missing_topics(conf, topics, timeout_s)
        if missing:
            raise ReplayError(f"no topic {', '.join(map(repr, missing))} on the brokers at "
                              f"{settings.bootstrap_servers}: check [topics] in the "
                              "configuration")
        with young_collections_only():
            return _replay(settings, key, conf, timeout_s, progress, jobs, settle_s)
    except KafkaException as exc:
        raise ReplayError(kafka_io.broker_failure(conf, exc)) from None


def _recheck_missing(conf: Mapping[str, str], diffs: list[Difference],
                     mine: Mapping[tuple[str, RecordKey], bytes],
                     topics: Mapping[str, tuple[str, Mapping[int, tuple[int, int]]]],
                     settle_s: float, timeout_s: float) -> list[Difference]:
    """Give due records missing from the snapshot `settle_s` seconds to arrive.

    One case makes a committed offset run ahead of what was published: around a rebalance
    Faust may commit past records it skipped, which the worker's GapGuard re-reads and
    applies at its next record. Whatever the topics received since the snapshot is read
    (only for the missing keys): one that arrives identical is no difference, one that
    arrives with other contents is "different"; the rest stay missing."""
    wanted = {(d.topic, d.key) for d in diffs if d.problem == "missing"}
    since = {t: {p: hi for p, (_lo, hi) in marks.items()} for t, (_n, marks) in topics.items()}
    found: dict[tuple[str, RecordKey], bytes] = {}
    deadline = time.monotonic() + settle_s
    while wanted - found.keys() and time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        for t, (name, _marks) in topics.items():
            now = kafka_io.end_offsets(conf, name, timeout_s)
            marks = {p: (since[t].get(p, 0), hi) for p, (_lo, hi) in now.items()}
            key_of = release_key if t == "counts" else ledger_key
            for recs in kafka_io.read_values(conf, name, marks, timeout_s=timeout_s).values():
                for _off, raw in recs:
                    try:
                        k = (t, key_of(orjson.loads(raw or b"")))
                    except (orjson.JSONDecodeError, TypeError, ValueError, KeyError):
                        continue  # after the snapshot: not part of this verdict
                    if k in wanted and k not in found and raw is not None:
                        found[k] = raw
            since[t] = {p: hi for p, (_lo, hi) in now.items()}
    kept = [d for d in diffs if not (d.problem == "missing" and (d.topic, d.key) in found)]
    kept += [Difference(t, k, "different", field_detail(mine[t, k], raw))
             for (t, k), raw in found.items() if raw != mine[t, k]]
    kept.sort(key=diff_order)
    return kept


def _replay(settings: Settings, key: NoiseKey, conf: Mapping[str, str], timeout_s: float,
            progress: Progress | None, jobs: int | None, settle_s: float) -> ReplayReport:
    tl_topic = topic_name(settings, "timeline")
    counts_topic = topic_name(settings, "counts")
    ledger_topic = topic_name(settings, "ledger")
    # privacy_unit = "user": the bounding stage's committed offsets come before the
    # timeline's snapshot (its forwards were acknowledged before it committed).
    units_committed = (None if settings.privacy_unit != "user" else
                       kafka_io.committed_offsets(conf, settings.app_id,
                                                  units_topic(settings), timeout_s))
    # 1. committed offsets, 2. the public snapshot, 3. the timeline: this order is the cut.
    committed, (counts_marks, ledger_marks, tl_marks) = kafka_io.snapshot_offsets(
        conf, settings.app_id, tl_topic, [counts_topic, ledger_topic, tl_topic], timeout_s)
    truncated = sorted(p for p, (lo, _hi) in tl_marks.items() if lo > 0)
    if truncated:
        raise ReplayError(f"the timeline topic {tl_topic!r} no longer starts at offset 0 on "
                          f"partition(s) {truncated} (retention or a deletion): the counts "
                          "cannot be recomputed; keep the timeline for the audit window")
    total = sum(hi for _lo, hi in tl_marks.values())

    def read_progress(n: int) -> None:
        if progress is not None:
            progress("read", n, total)

    cut = {p: (committed.get(p, 0), hi) for p, (_lo, hi) in tl_marks.items()}
    # The ledger first (within the cut's marks, so the order of reading is free): a
    # configuration or key it contradicts makes any recomputation moot, and is said at
    # once (configured.py), not after minutes of recomputing what the worker never ran.
    ledger = [v for recs in kafka_io.read_values(conf, ledger_topic, ledger_marks,
                                                 timeout_s=timeout_s).values()
              for _o, v in recs]
    configuration = ledger_mismatch(settings, key, ledger, int(time.time() * 1000))
    if configuration:
        return ReplayReport(0, 0, Tally(), Tally(), cut, [], configuration)
    stamps: dict[int, dict[int, int]] = {}
    timeline = kafka_io.read_values(conf, tl_topic, tl_marks, timeout_s=timeout_s,
                                    progress=read_progress, stamps=stamps,
                                    stamp_if=lambda v: marker_tick(v) is not None)
    # The published releases: the ledger says what each counter ran under
    # (LedgerHistory), the releases place a restart the timeline does not record.
    published = [v for recs in kafka_io.read_values(conf, counts_topic, counts_marks,
                                                    timeout_s=timeout_s).values()
                 for _o, v in recs]
    history = ledger_history(settings, key, ledger, published)
    got = replay_partitions(settings, key, timeline, committed, history, stamps, published,
                            ledger, jobs=default_jobs(settings) if jobs is None else jobs,
                            progress=progress)
    diffs = got.differences
    if settle_s > 0 and got.missing:
        diffs = _recheck_missing(conf, diffs, got.missing,
                                 {"counts": (counts_topic, counts_marks),
                                  "ledger": (ledger_topic, ledger_marks)},
                                 settle_s, timeout_s)
    if units_committed is not None:
        diffs += _kept_set_differences(settings, conf, timeline, units_committed, timeout_s)
    return ReplayReport(got.records, got.duplicates_dropped, got.releases, got.ledger, cut,
                        diffs)


def _kept_set_differences(settings: Settings, conf: Mapping[str, str],
                          timeline: Mapping[int, Sequence[tuple[int, bytes | None]]],
                          committed: dict[int, int], timeout_s: float) -> list[Difference]:
    """privacy_unit = "user": recompute the bounding stage's kept set from the units topic
    (read after the timeline: every forwarded event's units record is in it) and compare
    it with the events the timeline carries from the stage (bounding.check_kept_set)."""
    topic = units_topic(settings)
    marks = kafka_io.end_offsets(conf, topic, timeout_s)
    log = [(p, o, v or b"") for p, recs in sorted(kafka_io.read_values(
        conf, topic, {p: (0, hi) for p, (_lo, hi) in marks.items()},
        timeout_s=timeout_s).items()) for o, v in recs]
    values = [v for _p, recs in sorted(timeline.items()) for _o, v in recs]
    return [Difference("units", ("kept", p, str(o)), problem,
                       "forwarded to the timeline but not in the kept set recomputed from "
                       "the units topic" if problem == "unexpected" else
                       "in the recomputed kept set of a committed units record, not on "
                       "the timeline")
            for problem, (p, o) in check_kept_set(settings, log, values, committed)]
