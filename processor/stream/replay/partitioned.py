"""Replay one timeline partition at a time: recompute it and compare it with the
published records of its counters, then let it go.

A counter lives in one timeline partition (`records.partition_for`), and every key the
comparison uses, of a release (counter, tick, kind) or of a ledger entry (counter,
creation, fingerprint), names its counter: so the published records split by their
counter's partition, and each partition's verdict is the comparison (`compare`) of its
recomputation with its share. The whole verdict is their union: the tallies add up (no
key is in two partitions), the differences are merged and sorted, and the ledger entries
replay could not use (`LedgerHistory.problems`) are added once. A published value that
names no counter (a tombstone, not JSON) is in no partition: it is compared alone, which
makes it "malformed" as it always is.

Only the tallies, the differences and the recomputed bytes of the missing records (for
the grace period, `snapshot._recheck_missing`) leave a partition: its counters' state,
its recomputed records and its published ones are dropped before the next partition
starts, so replay holds one partition's counters per process (`--jobs` processes at
once), not the deployment's.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from processor.commandline import pool_worker_signals
from processor.core.rng import NoiseKey
from processor.stream.model.config import Settings
from processor.stream.model.records import partition_for
from processor.stream.replay.comparison import (
    KEY_ERRORS,
    Keys,
    Published,
    add_problems,
    compare,
    diff_order,
    family_record,
    ledger_key,
    published_records,
    release_key,
)
from processor.stream.replay.gate_totals import check_totals
from processor.stream.replay.history import LedgerHistory
from processor.stream.replay.recompute import (
    Progress,
    TimelinePart,
    homes_of,
    recompute_partition,
    single_threaded,
    young_collections_only,
)
from processor.stream.replay.report import Difference, RecordKey, Tally


@dataclass
class PartitionVerdict:
    """What one partition's (or all partitions') comparison found: its tallies,
    differences, the recomputed bytes of its missing records (topic, key) -> bytes, and
    how many timeline records it recomputed (duplicates dropped among them)."""

    releases: Tally = field(default_factory=Tally)
    ledger: Tally = field(default_factory=Tally)
    differences: list[Difference] = field(default_factory=list)
    missing: dict[tuple[str, RecordKey], bytes] = field(default_factory=dict)
    records: int = 0
    duplicates_dropped: int = 0

    def add(self, other: PartitionVerdict) -> None:
        for mine, theirs in ((self.releases, other.releases), (self.ledger, other.ledger)):
            for name in vars(mine):
                setattr(mine, name, getattr(mine, name) + getattr(theirs, name))
        self.differences += other.differences
        self.missing.update(other.missing)
        self.records += other.records
        self.duplicates_dropped += other.duplicates_dropped


def split_published(values: Iterable[bytes | None], partitions: int,
                    homes: dict[str, int] | None = None,
                    ) -> tuple[dict[int, list[bytes | None]], list[bytes | None]]:
    """Published values by the timeline partition of the counter each names (as the
    comparison's keys name it), and those that name none (compared on their own: they
    are "malformed"). `homes`: counter -> partition, filled as names are met (one
    `partition_for`, a sha256, per counter across the calls that share it)."""
    parts, _keys, loose = split_keyed(values, partitions, None, homes)
    return parts, loose


def split_keyed(values: Iterable[bytes | None], partitions: int,
                key_of: Callable[[Any], RecordKey] | None,
                homes: dict[str, int] | None = None,
                ) -> tuple[dict[int, list[bytes | None]], dict[int, list[RecordKey | None]],
                           list[bytes | None]]:
    """`split_published`, and with `key_of` (`release_key`, `ledger_key`) the comparison
    key of each value it puts in a partition, in the same order (None: it has none, a
    "malformed" value), from the one decode the split makes: `compare` takes them
    instead of decoding every value again. Equal names and kinds share one object."""
    parts: dict[int, list[bytes | None]] = {}
    keys: dict[int, list[RecordKey | None]] = {}
    if homes is None:
        homes = {}
    shared: dict[Any, Any] = {}
    loose: list[bytes | None] = []
    for raw in values:
        try:
            d = orjson.loads(raw) if raw is not None else None
        except orjson.JSONDecodeError:
            d = None
        if type(d) is not dict or "counter" not in d:
            loose.append(raw)
            continue
        name = str(d["counter"])  # as the comparison's keys name it (`release_key`)
        p = homes.get(name)
        if p is None:
            p = homes[name] = partition_for(name, partitions)
        parts.setdefault(p, []).append(raw)
        if key_of is not None:
            k: RecordKey | None
            try:
                a, b, c = key_of(d)
            except KEY_ERRORS:
                k = None
            else:
                k = (shared.setdefault(a, a), shared.setdefault(b, b),
                     shared.setdefault(c, c))
            keys.setdefault(p, []).append(k)
    return parts, keys, loose


#: The job of the forked processes (set before the fork, read after it: the timeline
#: and the published records are inherited, never pickled).
_JOB: tuple[Settings, NoiseKey, Mapping[int, TimelinePart], Mapping[int, int],
            LedgerHistory, Mapping[int, Mapping[int, int]], Mapping[int, Published],
            Mapping[int, Published], Mapping[int, Keys], Mapping[int, Keys]] | None = None


def _verdict(partition: int) -> PartitionVerdict:
    assert _JOB is not None
    (settings, key, timeline, settled_below, history, stamps, releases, ledger,
     release_keys, ledger_keys) = _JOB
    # Releases kept as keys and bytes (the comparison reads those); ledger entries go
    # after `encoded_only`.
    got = recompute_partition(settings, key, history, partition,
                              timeline.get(partition, ()), settled_below, stamps,
                              keyed=True)
    got.encoded_only()
    mine = got.encoded()
    # A partition's share holds no family record (those name no counter).
    rel, ent, diffs = compare(got, releases.get(partition, ()), ledger.get(partition, ()),
                              totals=False, keys=(release_keys.get(partition, ()),
                                                  ledger_keys.get(partition, ())))
    wanted = {(d.topic, d.key) for d in diffs if d.problem == "missing"}
    # Looked for only when something is missing: a pass over every recomputed record.
    missing = {(topic, k): raw
               for topic, keyed in (("counts", mine[0]), ("counts", mine[1]),
                                    ("ledger", mine[2]), ("ledger", mine[3]))
               for k, raw in keyed if (topic, k) in wanted} if wanted else {}
    return PartitionVerdict(rel, ent, diffs, missing, got.records, got.duplicates_dropped)


def replay_partitions(settings: Settings, key: NoiseKey,
                      timeline: Mapping[int, TimelinePart], settled_below: Mapping[int, int],
                      history: LedgerHistory, stamps: Mapping[int, Mapping[int, int]],
                      published: Iterable[bytes | None], ledger: Sequence[bytes | None],
                      *, jobs: int = 1, progress: Progress | None = None,
                      ) -> PartitionVerdict:
    """The verdict of every timeline partition (module docstring), in `jobs` forked
    processes when there are several partitions and no other thread runs (else here, one
    after the other), the largest partitions first."""
    global _JOB
    P = settings.partitions
    # Every declared counter's partition (what the operators take), and the others met.
    homes = dict(homes_of(settings))
    releases, release_keys, loose_releases = split_keyed(published, P, release_key, homes)
    entries, ledger_keys, loose_entries = split_keyed(ledger, P, ledger_key, homes)
    del homes
    order = sorted(set(timeline) | set(releases) | set(entries),
                   key=lambda p: -len(timeline.get(p, ())))
    total = sum(len(v) for v in timeline.values())
    whole = PartitionVerdict()
    # The entries' totals beside open families need the whole ledger, once; a family's
    # record names no counter and is no counter's entry.
    for who, detail in check_totals(ledger):
        whole.differences.append(Difference("ledger", (who, "", ""), "understated", detail))
    loose_entries = [v for v in loose_entries if not family_record(v)]
    # Values that name no counter: compared with nothing ("malformed" differences).
    for values, topic in ((loose_releases, "counts"), (loose_entries, "ledger")):
        if values:
            published_records(values, topic, whole.differences)
    _JOB = (settings, key, timeline, settled_below, history, stamps, releases, entries,
            release_keys, ledger_keys)
    try:
        with young_collections_only():
            if jobs > 1 and len(order) > 1 and single_threaded():
                with multiprocessing.get_context("fork").Pool(
                        min(jobs, len(order)), initializer=pool_worker_signals) as pool:
                    for got in pool.imap(_verdict, order):
                        whole.add(got)
                        if progress is not None:
                            progress("recomputed", whole.records, total)
            else:
                for p in order:
                    whole.add(_verdict(p))
                    if progress is not None:
                        progress("recomputed", whole.records, total)
    finally:
        _JOB = None
    add_problems(whole.differences, history.problems)
    whole.differences.sort(key=diff_order)
    return whole
