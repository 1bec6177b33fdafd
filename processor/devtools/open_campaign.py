"""The campaign's open-key phase (reliability/campaign.py, phase K; docs/open-keys.md).

One worker of a deployment with an open family counts keys drawn from a Zipf law (a few
heavy keys, a long tail of keys with a handful of events) fed at the wall clock, while it
is SIGKILLed and restarted at random moments; with a proxied broker, a second worker
reaches it through the proxy and is cut off from it (network partitions, as phase E).
Checked against the timeline by
`check_open_keys`, independently of the operator's code: per key, its input as the design
implies it (each event at max(its tick, the partition's first open tick), one a tick out
of a FIFO queue, re-ingested copies dropped by input offset per key), its counter as if declared
at the family's start (the core mechanism under its name's noise identity), and the core
gate (`OpenKey`) on it: a key the gate does not admit has no record and no ledger entry;
an admitted key's first record is its admission (tick, value), its changes after it are
its counter's, and its one ledger entry starts at the admission tick. Replay must find
everything identical too, and no stored value may go back (`check_changelog`, the
monotone state rule).

In user mode (`user=True`: privacy_unit = "user", each event from a unit drawn at random,
so that many units reach past k events of a key or m counters) the events reach the
timeline through the bounding stage, and two more checks, also apart from the worker's
code, come first: the kept set recomputed from the units topic by the rule itself
(`kept_events`: per unit, in the units log's order, an event is kept iff its counter has
fewer than k kept events of the unit, or is new and the unit has fewer than m counters;
a re-ingested copy, an input offset the unit already had from that input partition,
decides nothing) must be exactly the events the timeline carries from the stage, and the
gate's delta0 is the one for m keys at the unit's epsilon (`gate_delta`).
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from processor.core import registry
from processor.core.ecc import ECC, SimECC
from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.core.selection import OpenKey, gate_delta0
from processor.core.unit import derive
from processor.devtools.campaign import PARTITION_FAULTS, KillDriver, check_changelog
from processor.devtools.deployment import Deployment, isolated_deployment
from processor.devtools.proxy import ProxiedKafka
from processor.stream.kafka import kafka_io
from processor.stream.kafka.topics import units_topic
from processor.stream.model.bounding import SEQ_BITS, UNITS_SOURCE, UnitsFormatError, decode_units
from processor.stream.model.config import Settings
from processor.stream.model.families import OpenFamily
from processor.stream.model.identity import counter_id, noise_identity
from processor.stream.model.records import (
    TimelineBatch,
    TimelineMarker,
    decode_timeline,
    partition_for,
)

#: The phase's settings: short ticks and a large epsilon, so that the Zipf head is
#: admitted within a minute (the gate's threshold is about 100 events then).
OPEN_SETTINGS: Final[dict[str, Any]] = dict(
    partitions=2, tick_ms=100, lateness_ms=300, max_future_ms=3000, heartbeat_ticks=10,
    mechanism="simecc", epsilon=200.0)
FAMILY: Final = "pages"
#: User mode's bounds and target: small bounds, so that many units reach past them, and
#: a target epsilon whose per-event epsilon admits the Zipf head within a minute too.
USER_K: Final = 2
USER_M: Final = 2
USER_EPSILON: Final = 600.0
USER_DELTA: Final = 1e-6


@dataclass
class OpenKeyReport:
    """What `check_open_keys` found: keys seen, admitted, and every violation."""

    keys_seen: int = 0
    keys_admitted: int = 0
    records_checked: int = 0
    #: user mode: the events the bounds keep (`kept_events`)
    events_kept: int | None = None
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_dict(self) -> dict[str, Any]:
        kept = {} if self.events_kept is None else {"events_kept": self.events_kept}
        return {"keys_seen": self.keys_seen, "keys_admitted": self.keys_admitted, **kept,
                "records_checked": self.records_checked,
                "violations": len(self.violations), "first_violations": self.violations[:10]}


def implied_inputs(settings: Settings, starts: Mapping[str, int],
                   timeline: Mapping[int, Sequence[kafka_io.KafkaRecord]],
                   ) -> dict[str, list[float | None]]:
    """Per counter of `starts` (name -> start tick) with events, x_1, x_2, ... through its
    partition's last marker (None: ⊥), from the timeline alone."""
    arrivals: dict[str, dict[int, list[int]]] = {}
    final: dict[int, int] = {}
    for p, recs in timeline.items():
        frontier = -1
        # Per counter and input partition: a zombie ingest may write older offsets late,
        # and an event is a re-sent copy only if its own counter had its offset.
        seen: dict[tuple[str, int], int] = {}
        for r in sorted(recs, key=lambda r: r.offset):
            rec = decode_timeline(r.value or b"")
            if isinstance(rec, TimelineMarker):
                frontier = max(frontier, rec.sealed_through)
                continue
            assert isinstance(rec, TimelineBatch)
            for ev in rec.events:
                if ev.src_offset <= seen.get((ev.counter, ev.src_partition), -1):
                    continue  # a copy re-sent by ingest after a crash
                seen[ev.counter, ev.src_partition] = ev.src_offset
                start = starts.get(ev.counter)
                if start is None:
                    continue
                g = max(ev.ts_ms // settings.tick_ms, frontier + 1, start)
                arrivals.setdefault(ev.counter, {}).setdefault(g, []).append(ev.units)
        final[p] = frontier
    out: dict[str, list[float | None]] = {}
    for c, ticks in arrivals.items():
        queue: deque[int] = deque()
        xs: list[float | None] = []
        for g in range(starts[c], final.get(partition_for(c, settings.partitions), -1) + 1):
            queue.extend(ticks.get(g, []))
            xs.append(queue.popleft() / UNIT if queue else None)
        out[c] = xs
    return out


def gate_delta(settings: Settings) -> float:
    """The gate's delta0 from the core's rule alone: selection_delta over (1 + e^eps) keys,
    with one key at the per-event epsilon in event mode, m keys at the unit's epsilon in
    user mode (docs/open-keys.md, "The accounting")."""
    sel = settings.families[FAMILY].selection_delta
    if settings.privacy_unit == "user":
        assert settings.unit_epsilon is not None
        return gate_delta0(settings.unit_epsilon, sel, settings.max_counters_per_unit)
    return gate_delta0(settings.epsilon, sel)


def expected_key(settings: Settings, key: NoiseKey, name: str,
                 xs: Sequence[float | None]
                 ) -> tuple[tuple[int, float] | None, list[tuple[int, float]]]:
    """The core gate on the key's as-if-declared counter: its admission (tick, value) or
    None, and its counter's changes after the admission tick."""
    c = registry.make(settings.mechanism, settings.epsilon, settings.delta, key,
                      counter_id(noise_identity(settings, key), name))
    assert isinstance(c, ECC | SimECC)
    first = next((t for t, x in enumerate(xs, start=1) if x is not None), None)
    if first is None:
        return None, []  # its events are in ticks no marker sealed: nothing is due
    gate = OpenKey.first_seen(c, gate_delta(settings), first)
    admitted: tuple[int, float] | None = None
    changes: list[tuple[int, float]] = []
    for x in xs[first - 1:]:
        before = c.y
        got = gate.update(x)
        if admitted is None:
            admitted = got[0] if got else None
        elif c.y != before:
            changes.append((c.t, c.y))
    return admitted, changes


def kept_events(units: Mapping[int, Sequence[kafka_io.KafkaRecord]], k: int, m: int
                ) -> dict[tuple[int, int], str]:
    """(units partition, seq) -> counter of every event the bounds keep, recomputed from
    the units topic by the rule itself (module docstring), apart from the stage's code."""
    kept: dict[tuple[int, int], str] = {}
    counts: dict[str, dict[str, int]] = {}  # unit -> counter -> kept events
    highest: dict[tuple[str, str, int], int] = {}  # (unit, input identity, partition)
    for p, recs in units.items():
        for r in sorted(recs, key=lambda r: r.offset):
            try:
                source, rows = decode_units(r.value or b"")
            except UnitsFormatError:
                continue
            for i, (h, counter, _ts, _units, in_p, in_o) in enumerate(rows):
                if in_o <= highest.get((h, source, in_p), -1):
                    continue  # a copy ingest sent again after a crash
                highest[h, source, in_p] = in_o
                mine = counts.setdefault(h, {})
                n = mine.get(counter)
                if (n is None and len(mine) >= m) or (n is not None and n >= k):
                    continue  # beyond a bound: a dead letter
                mine[counter] = (n or 0) + 1
                kept[p, r.offset << SEQ_BITS | i] = counter
    return kept


def check_kept(units: Mapping[int, Sequence[kafka_io.KafkaRecord]],
               timeline: Mapping[int, Sequence[kafka_io.KafkaRecord]], k: int, m: int
               ) -> tuple[int, list[str]]:
    """The events the timeline carries from the bounding stage against `kept_events`
    (each once, copies aside): (events kept, violations). Every units record counts as
    committed: the phase reads the topics after a drained, clean stop."""
    kept = kept_events(units, k, m)
    forwarded: dict[tuple[int, int], str] = {}
    for recs in timeline.values():
        for r in recs:
            rec = decode_timeline(r.value or b"")
            if isinstance(rec, TimelineBatch) and rec.source == UNITS_SOURCE:
                for ev in rec.events:
                    forwarded[ev.src_partition, ev.src_offset] = ev.counter
    violations = [f"units event {c} of {forwarded[c]!r} counted beyond its unit's bounds"
                  for c in sorted(forwarded.keys() - kept.keys())]
    violations += [f"units event {c} of {kept[c]!r} kept but not on the timeline"
                   for c in sorted(kept.keys() - forwarded.keys())]
    violations += [f"units event {c} forwarded as {forwarded[c]!r}, sent as {kept[c]!r}"
                   for c in sorted(kept.keys() & forwarded.keys()) if kept[c] != forwarded[c]]
    return len(kept), violations


def committed_frontiers(timeline: Mapping[int, Sequence[kafka_io.KafkaRecord]],
                        committed: Mapping[int, int]) -> dict[int, int]:
    """Per timeline partition, the last tick a marker below the operator's committed
    offset sealed (-1: none): every record through it was applied and published."""
    out: dict[int, int] = {}
    for p, recs in timeline.items():
        frontier = -1
        for r in recs:
            if r.offset < committed.get(p, 0):
                rec = decode_timeline(r.value or b"")
                if isinstance(rec, TimelineMarker):
                    frontier = max(frontier, rec.sealed_through)
        out[p] = frontier
    return out


def check_open_keys(settings: Settings, key: NoiseKey,
                    timeline: Mapping[int, Sequence[kafka_io.KafkaRecord]],
                    releases: Sequence[Mapping[str, Any]],
                    ledger: Sequence[Mapping[str, Any]],
                    units: Mapping[int, Sequence[kafka_io.KafkaRecord]] | None = None,
                    committed: Mapping[int, int] | None = None) -> OpenKeyReport:
    """Every key's published records and ledger entries against the core gate on its
    input implied by the timeline (module docstring). `releases`/`ledger`: the decoded
    public records (a worker stopped cleanly after draining: everything is due).
    `units`: the units topic, in user mode (its kept set checked first). `committed`:
    the operator's committed timeline offsets (default: the whole timeline). Records
    through a partition's committed frontier (`committed_frontiers`) must all be
    published; past it (applied and sent, not committed when the worker stopped, or
    never applied) each published record must still be the recomputation's."""
    report = OpenKeyReport()
    # A family's record (written at start, public configuration) names no counter.
    ledger = [e for e in ledger if e.get("entry") != "family"]
    if settings.privacy_unit == "user":
        assert units is not None, "user mode: the units topic is checked too"
        report.events_kept, report.violations = check_kept(
            units, timeline, settings.max_events_per_counter, settings.max_counters_per_unit)
    start_tick = settings.families[FAMILY].start_ms // settings.tick_ms
    names: set[str] = set()
    for recs in timeline.values():
        for r in recs:
            rec = decode_timeline(r.value or b"")
            if isinstance(rec, TimelineBatch):
                names.update(e.counter for e in rec.events if e.counter.startswith(FAMILY + "["))
    inputs = implied_inputs(settings, dict.fromkeys(names, start_tick), timeline)
    frontiers = None if committed is None else committed_frontiers(timeline, committed)
    report.keys_seen = len(inputs)
    published = {str(r["counter"]) for r in releases} | {str(e["counter"]) for e in ledger}
    for stray in sorted(published - inputs.keys() - set(settings.counters)):
        report.violations.append(f"{stray!r} published without an event on the timeline")
    for name, xs in sorted(inputs.items()):
        mine = sorted((r for r in releases if r["counter"] == name), key=lambda r: r["tick"])
        entries = [e for e in ledger if e["counter"] == name]
        report.records_checked += len(mine) + len(entries)
        admitted, changes = expected_key(settings, key, name, xs)
        if admitted is None:
            if mine or entries:
                report.violations.append(f"{name!r}: published, but the gate admits it not")
            continue
        report.keys_admitted += 1
        a, y = admitted
        # The last local tick every record of which must be published.
        horizon = (len(xs) if frontiers is None else
                   frontiers.get(partition_for(name, settings.partitions), -1)
                   - start_tick + 1)
        if not mine:
            if a <= horizon or entries:
                report.violations.append(f"{name!r}: admitted at {a}, not published")
            continue
        if (mine[0]["tick"], mine[0]["value"], mine[0]["kind"]) != (a, y, "change"):
            report.violations.append(f"{name!r}: its first record is not its admission "
                                     f"({a}, {y})")
        got = {(r["tick"], r["value"]) for r in mine if r["kind"] == "change"
               and r["tick"] > a}
        if not got <= set(changes) or not {c for c in changes if c[0] <= horizon} <= got:
            report.violations.append(f"{name!r}: its changes after admission are not its "
                                     "counter's")
        if sorted({(e["since_tick"], e["entry"]) for e in entries}) != [(a, "created")]:
            report.violations.append(f"{name!r}: its ledger entries do not start at {a}")
    return report


def _feed(dep: Deployment, rng: random.Random, stop: threading.Event, rate: float,
          keys: int, sent: list[int], users: int = 0) -> None:
    """Keyed events at about `rate` a second, keys Zipf(1.1) over `keys`, at the clock;
    with `users`, each from a unit drawn uniformly from that many."""
    weights = [1.0 / (i + 1) ** 1.1 for i in range(keys)]
    producer = kafka_io.make_producer(dep.conf)
    while not stop.is_set():
        for k in rng.choices(range(keys), weights, k=max(1, int(rate / 10))):
            event: dict[str, Any] = {"counter": FAMILY, "key": f"k{k}",
                                     "ts": int(time.time() * 1000)}
            if users:
                event["user"] = f"u{rng.randrange(users)}"
            producer.produce(dep.topics.input, value=orjson.dumps(event))
            sent[0] += 1
        producer.poll(0)
        stop.wait(0.1)  # the feeding rate, not a synchronisation wait
    assert producer.flush(60) == 0


def _partitions(kafka: ProxiedKafka, dep: Deployment, rng: random.Random,
                faults: Sequence[str], settle_s: float, counts: Any) -> None:
    """Each fault cuts the proxied worker off (a blackhole keeps its connections open, a
    reset drops them) for a random duration of its range, then heals and settles; a
    worker that gave up meanwhile is counted and restarted."""
    proxy = kafka.proxy
    assert proxy is not None
    for kind in faults:
        lo, hi = PARTITION_FAULTS[kind]
        if kind == "reset":
            proxy.reset()
        else:
            proxy.blackhole()
        time.sleep(rng.uniform(lo, hi))  # the fault's duration, not a synchronisation wait
        proxy.heal()
        counts[f"faults_{kind}"] += 1
        time.sleep(settle_s)  # the cut-off worker rejoins before the next fault
        for i, w in enumerate(dep.workers):
            if not w.alive():
                counts[f"worker_{i}_exit_{w.stop()}"] += 1
                w.start()


def open_key_phase(bootstrap: str, parent: Path, rng: random.Random, *, seconds: float,
                   rate: float, keys: int, kills: int, workers: int = 1,
                   kafka: ProxiedKafka | None = None, faults: Sequence[str] = (),
                   settle_s: float = 20.0, user: bool = False) -> dict[str, Any]:
    """Phase K (module docstring): returns its figures and the check's verdict. With
    `workers` = 2, two workers of one group, each kill striking one of them at random
    (its partitions, keys included, move to the other and back). With `kafka` (a proxied
    broker: `bootstrap` is then ignored), the second worker goes through its proxy, and
    after the kills each of `faults` (PARTITION_FAULTS kinds) cuts it off for a random
    duration of its range, heals, and leaves `settle_s`, while keyed events flow. With
    `user`, privacy_unit = "user" (USER_K, USER_M; events from 2 x `keys` units), the
    kept set checked too."""
    started = time.monotonic()
    now = int(time.time() * 1000)
    tick = int(OPEN_SETTINGS["tick_ms"])
    start = now // tick * tick
    if kafka is not None:
        bootstrap, workers = kafka.bootstrap_servers, 2
    mode: dict[str, Any] = {}
    if user:
        p = derive(USER_EPSILON, USER_DELTA, USER_K, USER_M,
                   mechanism=str(OPEN_SETTINGS["mechanism"]))
        mode = dict(privacy_unit="user", unit_epsilon=USER_EPSILON, unit_delta=USER_DELTA,
                    max_events_per_counter=USER_K, max_counters_per_unit=USER_M,
                    epsilon=p.event_epsilon, delta=p.event_delta)
    dep = isolated_deployment(bootstrap, {"declared": start}, parent=parent, name="campK",
                              families={FAMILY: OpenFamily(start, 1e-7)},
                              **{**OPEN_SETTINGS, **mode})
    try:
        driver = KillDriver(dep, rng, bad_share=0.0)
        for i in range(1, workers):
            if kafka is not None:
                dep.add_worker(f"w{i}", bootstrap_servers=kafka.proxied_bootstrap)
            else:
                dep.add_worker(f"w{i}")
        for w in dep.workers:
            w.start()
        dep.wait_releases(lambda rs: len(rs) > 0, timeout_s=180)
        stop, sent = threading.Event(), [0]
        feeder = threading.Thread(
            target=_feed, args=(dep, rng, stop, rate, keys, sent, 2 * keys if user else 0),
            daemon=True)
        t0 = time.monotonic()
        feeder.start()
        try:
            for at in sorted(rng.uniform(1.0, seconds - 1.0) for _ in range(kills)):
                stop.wait(max(0.0, t0 + at - time.monotonic()))  # the kill schedule
                victim = rng.choice(dep.workers)
                victim.kill()
                victim.start()
            stop.wait(max(0.0, t0 + seconds - time.monotonic()))
            if faults:
                assert kafka is not None and kafka.proxy is not None
                _partitions(kafka, dep, rng, faults, settle_s, driver.counts)
        finally:
            stop.set()
            feeder.join(timeout=120)
        # The last events' queues drain at one a tick: let the markers pass them.
        last = max(r["tick"] for r in dep.releases() if r["counter"] == "declared")
        dep.wait_releases(lambda rs: any(r["counter"] == "declared"
                                         and r["tick"] > last + 50 for r in rs), timeout_s=120)
        caught_up = driver.drain_and_stop(dep.workers)
        timeline = kafka_io.read_topic(dep.conf, dep.topics.timeline)
        ledger = [orjson.loads(r.value or b"") for r in
                  kafka_io.iter_topic(dep.conf, dep.topics.ledger)]
        units = (kafka_io.read_topic(dep.conf, units_topic(dep.settings)) if user
                 else None)
        # What the operator committed was applied and published; past it, ingest may
        # have sealed ticks nobody applied, or the operator sent records of a marker its
        # last checkpoint did not cover (a re-applying owner re-sends the same).
        committed = kafka_io.committed_offsets(dep.conf, dep.settings.app_id,
                                               dep.topics.timeline)
        report = check_open_keys(dep.settings, dep.key, timeline, dep.releases(), ledger,
                                 units, committed)
        changelog = check_changelog(dep)
        from processor.stream.replay import replay  # the audit, the worker's own code

        replayed = replay(dep.settings, dep.key)
        unit = ", user mode" if user else ""
        return {"phase": f"K: open keys (Zipf){unit}, {workers} worker(s), kills",
                "events_sent": sent[0],
                "driver": {**dict(sorted(driver.counts.items())), "kills_sigkill": kills},
                "starts": sum(w.starts for w in dep.workers), "caught_up": caught_up,
                **report.as_dict(), "replay_identical": replayed.identical,
                "changelog": changelog.as_dict(),
                "ok": report.ok and replayed.identical and changelog.ok,
                "wall_s": round(time.monotonic() - started, 1)}
    finally:
        dep.close()
