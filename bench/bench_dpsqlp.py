"""A scaled-down DP-SQLP synthetic setup through the stream (docs/open-keys.md, "Beside
the nearest peer").

    .venv/bin/python bench/bench_dpsqlp.py --seeds 0 1 2 --json out.json
    .venv/bin/python bench/bench_dpsqlp.py --broker --seeds 0 --json e2e0.json

User mode with an open family: a unit (user) contributes one event (k = 1) to each of at
most m = 32 keys, target (eps, delta) = (6, 1e-9) per user over the whole published
output: delta_u = delta_sel = 5e-10 (releases, then the gate's term for 32 keys, so
unit_delta_total = 1e-9). Each batch (DP-SQLP's micro-batch, `--ticks-per-batch` ticks)
brings `--users-per-batch` new users; each draws 32 keys from Zipf(`--zipf`) over
`--keys` keys, repeats dropped, one event each at a tick of the batch (default one user
per tick: nearly all draw the heaviest key, so it gets about one event per tick, what
the queue passes).

In process (the default): the events go through the stream's stages without a broker:
units rows -> the bounding stage (`bounding.Bounder`) -> its timeline records -> the
operator (`Operator`), one marker per batch.

End to end (`--broker`): a broker (KAFKA_BOOTSTRAP_SERVERS, `--bootstrap`, else a local
one started for the run), an isolated deployment (its topics, key file and worker
configuration: the family in user mode, m = 32, k = 1, `--tick-ms` ticks, the family's
start `--lead-s` seconds ahead so every event is on the input topic before its tick is
sealed, and a declared counter `clock` without events whose heartbeats, every
`--heartbeat-ticks`, tell how far the worker has published); the events are sent by the
project's own command (`python -m processor send`) and the worker, as deployed
(`python -m processor worker`), runs until the clock's release at the last tick; the
private-count topic, the ledger and the dead letters are read back. The same events then
go through the stages in process with the deployment's own settings and key (its noise
identity): the two must publish the same records (every change release: counter, tick,
value) and the ledger must announce exactly the keys released, each at its first
release; the run reports any difference ("agree").

At `--horizons` batches: keys seen, keys retained (admitted), and over the retained keys
the L-infinity and L2 error of the released count (the key's last release at or before
the horizon) against the true count (the key's events stamped up to the horizon). Prints
one JSON line per (seed, horizon); `--json` writes them all, with the parameters and the
retained keys' (true, released) pairs for `bench/plot_dpsqlp.py`.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

from processor.core.grid import UNIT  # noqa: E402
from processor.core.rng import NoiseKey, seed_secret  # noqa: E402
from processor.stream.model.bounding import (  # noqa: E402
    Bounder,
    encode_units,
    unit_hash,
    unit_key,
)
from processor.stream.model.config import Settings, with_overrides, with_unit  # noqa: E402
from processor.stream.model.families import OpenFamily, key_counter  # noqa: E402
from processor.stream.model.operator import Operator  # noqa: E402
from processor.stream.model.outputs import Output  # noqa: E402
from processor.stream.model.records import (  # noqa: E402
    TimelineMarker,
    decode_timeline_rows,
    encode_marker,
)
from processor.stream.model.state import DictStore  # noqa: E402

EPS_U, DELTA_U, DELTA_SEL = 6.0, 5e-10, 5e-10
K, M = 1, 32
TICK_MS = 1000
FAMILY = "f"
CLOCK = "clock"


def _zipf_cum(n: int, s: float) -> list[float]:
    return list(itertools.accumulate(1.0 / (r ** s) for r in range(1, n + 1)))


@dataclass(frozen=True)
class Event:
    user: str
    key: int  # the key's Zipf rank - 1: its name is f"k{key}"
    tick: int  # 0-based from the family's start: local tick tick + 1


def generate(seed: int, keys: int, zipf: float, users_per_batch: int,
             ticks_per_batch: int, batches: int) -> list[list[Event]]:
    """The events of each batch, in time order (ties in drawing order)."""
    rng = random.Random(seed)
    cum = _zipf_cum(keys, zipf)
    out: list[list[Event]] = []
    user = 0
    for batch in range(batches):
        evs: list[Event] = []
        for _ in range(users_per_batch):
            uid = f"u{user}"
            user += 1
            tick = batch * ticks_per_batch + rng.randrange(ticks_per_batch)
            evs.extend(Event(uid, r, tick)
                       for r in sorted(set(rng.choices(range(keys), cum_weights=cum, k=M))))
        evs.sort(key=lambda e: e.tick)
        out.append(evs)
    return out


def settings_for(mechanism: str, calibration: str, eps_u: float = EPS_U,
                 delta_u: float = DELTA_U, delta_sel: float = DELTA_SEL, start_ms: int = 0,
                 **over: Any) -> Settings:
    """User mode, the open family `f` from `start_ms` (and what `over` sets), per-event
    parameters derived from (eps_u, delta_u, K, M)."""
    base: dict[str, Any] = dict(
        counters={}, families={FAMILY: OpenFamily(start_ms, delta_sel)}, partitions=1,
        tick_ms=TICK_MS, heartbeat_ticks=1_000_000, heartbeat_spread=False,
        mechanism=mechanism, calibration=calibration)
    base.update(over)
    return with_unit(with_overrides(Settings(), **base), eps_u, delta_u, K, M)


Rel = tuple[str, int, float, str]  # counter, local tick, value, kind


def in_process(s: Settings, key: NoiseKey, batches: Sequence[Sequence[Event]],
               ticks_per_batch: int, keys: int) -> tuple[list[Rel], list[dict[str, Any]], int]:
    """The events through the bounding stage and the operator in process, one marker per
    batch on every timeline partition; (releases, ledger entries, dead letters)."""
    start_ms = s.families[FAMILY].start_ms
    start_tick = start_ms // s.tick_ms
    names = [key_counter(FAMILY, f"k{r}") for r in range(keys)]
    ukey = unit_key(key)
    bounder = Bounder(s)
    btxn = bounder.transaction(DictStore())
    op = Operator(s, key, cache_size=keys + 16)  # no key evicted between markers
    store = DictStore()
    offsets = [0] * s.partitions
    rels: list[Rel] = []
    ledger: list[dict[str, Any]] = []
    dead = 0
    src = 0

    def apply(partition: int, record: bytes) -> None:
        txn = op.transaction(store)
        out = op.apply(txn, partition, offsets[partition], record)
        op.stage_deferred(txn, partition)
        store.write_many(txn.prepare())
        txn.complete()
        offsets[partition] += 1
        rels.extend((r.counter, r.tick, r.value, r.kind) for r in out.decoded_releases())
        ledger.extend(orjson.loads(e.to_json()) for e in out.ledger)

    for batch, evs in enumerate(batches):
        rows: list[list[object]] = []
        for e in evs:
            src += 1
            rows.append([unit_hash(ukey, e.user), names[e.key],
                         start_ms + e.tick * s.tick_ms + 1, UNIT, 0, src])
        bout = Output()
        bounder.apply(btxn, 0, [(batch, encode_units(rows))], bout)
        dead += len(bout.deadletters)
        for p, data in bout.timeline:
            apply(p, data)
        marker = encode_marker(start_tick + (batch + 1) * ticks_per_batch - 1)
        for p in range(s.partitions):
            apply(p, marker)
    return rels, ledger, dead


def horizon_rows(seed: int, batches: Sequence[Sequence[Event]], rels: Iterable[Rel],
                 ticks_per_batch: int, horizons: Sequence[int], dead: int,
                 cpu_s: float) -> list[dict[str, Any]]:
    """Keys seen and retained, errors of the retained, at each horizon (batches)."""
    ticks: dict[str, list[int]] = {}  # key -> event ticks (0-based), sorted
    for evs in batches:
        for e in evs:
            ticks.setdefault(key_counter(FAMILY, f"k{e.key}"), []).append(e.tick)
    for ts in ticks.values():
        ts.sort()
    by_key: dict[str, list[tuple[int, float]]] = {}
    for counter, tick, value, _kind in rels:
        if counter in ticks:
            by_key.setdefault(counter, []).append((tick, value))
    for v in by_key.values():
        v.sort()
    users = events = 0
    rows = []
    for h in sorted(horizons):
        last = h * ticks_per_batch  # the last local tick of batch h
        seen_events = [e for evs in batches[:h] for e in evs]
        users = len({e.user for e in seen_events})
        events = len(seen_events)
        pairs = []
        seen = 0
        for name, ts in ticks.items():
            n = bisect.bisect_right(ts, last - 1)
            if n == 0:
                continue
            seen += 1
            got = [value for tick, value in by_key.get(name, []) if tick <= last]
            if got:
                pairs.append((n, got[-1]))
        errs = [abs(y - n) for n, y in pairs]
        rows.append({
            "seed": seed, "batches": h, "ticks": last, "users": users, "events": events,
            "dead_letters": dead, "keys_seen": seen, "keys_retained": len(pairs),
            "events_of_retained": sum(n for n, _ in pairs),
            "linf": max(errs, default=0.0),
            "l2": math.sqrt(math.fsum(e * e for e in errs)),
            "max_true_count": max(bisect.bisect_right(ts, last - 1)
                                  for ts in ticks.values()),
            "cpu_s": cpu_s, "pairs": sorted(pairs),
        })
    return rows


def run(seed: int, keys: int, zipf: float, users_per_batch: int, ticks_per_batch: int,
        horizons: list[int], mechanism: str, calibration: str) -> list[dict[str, Any]]:
    """One seed through the stream in process; one result per horizon (in batches)."""
    s = settings_for(mechanism, calibration)
    batches = generate(seed, keys, zipf, users_per_batch, ticks_per_batch, max(horizons))
    t0 = time.process_time()
    rels, _, dead = in_process(s, NoiseKey.from_seed(seed), batches, ticks_per_batch, keys)
    return horizon_rows(seed, batches, rels, ticks_per_batch, horizons, dead,
                        round(time.process_time() - t0, 1))


@dataclass
class EndToEnd:
    """An end-to-end run: its results per horizon, the cross-check, and what it was
    made of (the deployment's settings and key, the events, the records read back)."""

    rows: list[dict[str, Any]]
    check: dict[str, Any]
    settings: Settings
    key: NoiseKey
    batches: list[list[Event]]
    releases: list[Rel]
    ledger: list[dict[str, Any]]
    dead_letters: int
    last: int


def end_to_end(seed: int, keys: int, zipf: float, users_per_batch: int,
               ticks_per_batch: int, horizons: list[int], mechanism: str, calibration: str,
               bootstrap: str, workdir: Path, *, tick_ms: int, lead_s: float,
               heartbeat_ticks: int, partitions: int, eps_u: float = EPS_U,
               delta_u: float = DELTA_U, delta_sel: float = DELTA_SEL,
               timeout_s: float = 1800.0) -> EndToEnd:
    """One seed through a broker and a worker as deployed, then in process with the
    deployment's settings and key."""
    from processor.devtools.deployment import isolated_deployment, worker_env
    from processor.stream.kafka import kafka_io
    from processor.stream.model.identity import key_fingerprint

    batches = generate(seed, keys, zipf, users_per_batch, ticks_per_batch, max(horizons))
    last = max(horizons) * ticks_per_batch  # the last local tick looked at
    start = (int(time.time() * 1000 + lead_s * 1000) // tick_ms + 1) * tick_ms
    span_ms = start - int(time.time() * 1000) + last * tick_ms
    base = settings_for(
        mechanism, calibration, eps_u, delta_u, delta_sel, start, counters={CLOCK: start},
        partitions=partitions,
        tick_ms=tick_ms, lateness_ms=1000, max_future_ms=span_ms + 120_000,
        heartbeat_ticks=heartbeat_ticks, heartbeat_spread=False)
    d = isolated_deployment(bootstrap, {CLOCK: start}, parent=workdir,
                            name=f"dpsqlp{seed}", secret=seed_secret(seed), base=base)
    assert key_fingerprint(d.key) == key_fingerprint(NoiseKey.from_seed(seed))
    events = d.directory / "events.jsonl"
    with events.open("wb") as f:
        for evs in batches:
            for e in evs:
                f.write(orjson.dumps({"counter": FAMILY, "key": f"k{e.key}",
                                      "ts": start + e.tick * tick_ms + 1, "user": e.user})
                        + b"\n")
    t0 = time.monotonic()
    try:
        d.worker.start()
        sent = subprocess.run([sys.executable, "-m", "processor", "send", "--config",
                               str(d.config), str(events)], cwd=ROOT, env=worker_env(),
                              capture_output=True, text=True, check=False)
        sent_ms = int(time.time() * 1000)
        if sent.returncode != 0:
            raise RuntimeError(f"send failed ({sent.returncode}): {sent.stderr[-2000:]}")
        d.wait_releases(lambda rs: any(r["counter"] == CLOCK and r["tick"] >= last
                                       for r in rs), timeout_s=timeout_s)
        code = d.worker.stop()
        if code != 0:
            raise RuntimeError(f"the worker exited {code}:\n{d.worker.log_tail()}")
    finally:
        d.close()
    wall_s = time.monotonic() - t0
    topic_rels: list[Rel] = [(r["counter"], r["tick"], r["value"], r["kind"])
                             for r in d.releases()]
    topic_ledger = [orjson.loads(r.value) for r in
                    kafka_io.iter_topic(d.conf, d.topics.ledger) if r.value]
    dead = sum(1 for _ in kafka_io.iter_topic(d.conf, d.topics.deadletter))
    late, rows_on_timeline = late_events(kafka_io.iter_topic(d.conf, d.topics.timeline),
                                         tick_ms)

    t1 = time.process_time()
    ip_rels, ip_ledger, ip_dead = in_process(d.settings, d.key, batches, ticks_per_batch,
                                             keys)
    ip_cpu = round(time.process_time() - t1, 1)
    check = compare(topic_rels, topic_ledger, dead, ip_rels, ip_ledger, ip_dead, last)
    ip_rows = horizon_rows(seed, batches, ip_rels, ticks_per_batch, horizons, ip_dead, ip_cpu)
    check.update(late_events=late, events_on_timeline=rows_on_timeline,
                 wall_s=round(wall_s, 1), in_process_cpu_s=ip_cpu,
                 sent=sent.stdout.strip().split(" (")[0],
                 sent_before_start_s=(start - sent_ms) / 1000,
                 tick_ms=tick_ms, start_ms=start)
    rows = horizon_rows(seed, batches, topic_rels, ticks_per_batch, horizons, dead, 0.0)
    def figures(row: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(row[k] for k in ("keys_seen", "keys_retained", "linf", "l2", "pairs"))

    check["horizon_figures_same"] = [figures(r) for r in rows] == [figures(r)
                                                                  for r in ip_rows]
    for row in rows:
        row.update(mode="end-to-end", cpu_s=None, wall_s=check["wall_s"],
                   agree=check["agree"] and check["horizon_figures_same"])
    return EndToEnd(rows, check, d.settings, d.key, batches, topic_rels, topic_ledger,
                    dead, last)


def late_events(timeline: Iterable[Any], tick_ms: int) -> tuple[int, int]:
    """(events of the family that reached the timeline after a marker had sealed their
    tick, events of the family on it), read in each partition's order. A late event is
    counted in a later tick than its stamp (docs/time.md): not the run this bench
    measures, so the cross-check names it apart from a difference of the records."""
    sealed: dict[int, int] = {}
    late = total = 0
    for rec in timeline:
        if not rec.value:
            continue
        got = decode_timeline_rows(rec.value)
        if isinstance(got, TimelineMarker):
            sealed[rec.partition] = max(sealed.get(rec.partition, -1), got.sealed_through)
            continue
        floor = sealed.get(rec.partition, -1)
        for counter, ts, *_ in got:
            if counter.startswith(f"{FAMILY}["):
                total += 1
                late += ts // tick_ms <= floor
    return late, total


def _changes(rels: Iterable[Rel], last: int) -> dict[tuple[str, int], float]:
    """(counter, tick) -> value of the change releases through local tick `last`."""
    out: dict[tuple[str, int], float] = {}
    for counter, tick, value, kind in rels:
        if kind == "change" and tick <= last and out.setdefault(
                (counter, tick), value) != value:
            raise AssertionError(f"two values for {counter} at {tick}")
    return out


def _created(ledger: Iterable[dict[str, Any]], last: int) -> dict[str, int]:
    """Key counter -> since_tick of its created entry, for entries through `last`."""
    return {e["counter"]: e["since_tick"] for e in ledger
            if e.get("entry") == "created" and str(e.get("counter", "")).startswith(
                f"{FAMILY}[") and e["since_tick"] <= last}


def compare(topic_rels: list[Rel], topic_ledger: list[dict[str, Any]], dead: int,
            ip_rels: list[Rel], ip_ledger: list[dict[str, Any]], ip_dead: int,
            last: int) -> dict[str, Any]:
    """The end-to-end records against the in-process ones through local tick `last`:
    the same change releases (counter, tick, value), the same keys announced at the same
    tick, each at its first release, the same dead letters (none here)."""
    a, b = _changes(topic_rels, last), _changes(ip_rels, last)
    only_topic = sorted(set(a) - set(b))
    only_ip = sorted(set(b) - set(a))
    differ = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    la, lb = _created(topic_ledger, last), _created(ip_ledger, last)
    first: dict[str, int] = {}
    for (counter, tick) in sorted(a):
        if counter.startswith(f"{FAMILY}["):
            first.setdefault(counter, tick)
    announced_at_first = la == first
    agree = (not only_topic and not only_ip and not differ and la == lb
             and announced_at_first and dead == ip_dead)
    return {
        "agree": agree, "changes_compared": len(a), "only_end_to_end": only_topic[:5],
        "only_in_process": only_ip[:5], "values_differ": [(k, a[k], b[k]) for k in
                                                          differ[:5]],
        "keys_announced": len(la), "ledger_same": la == lb,
        "announced_at_first_release": announced_at_first,
        "dead_letters": dead, "dead_letters_in_process": ip_dead,
        "unit_delta_total": sorted({e.get("unit_delta_total") for e in topic_ledger
                                    if "counter" in e}, key=str),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--ticks-per-batch", type=int, default=10)
    ap.add_argument("--users-per-batch", type=int, default=0,
                    help="default: about one event per tick on the heaviest key")
    ap.add_argument("--horizons", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--mechanism", default="simecc", choices=("simecc", "ecc"))
    ap.add_argument("--calibration", default="paper", choices=("paper", "tight"))
    ap.add_argument("--json", default="")
    e2e = ap.add_argument_group("end to end")
    e2e.add_argument("--broker", action="store_true",
                     help="through a broker and a worker as deployed, cross-checked in "
                     "process")
    e2e.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", ""),
                     help="an existing broker (default: KAFKA_BOOTSTRAP_SERVERS, else a "
                     "local one started for the run)")
    e2e.add_argument("--tick-ms", type=int, default=10)
    e2e.add_argument("--lead-s", type=float, default=90.0,
                     help="the family starts this long after the deployment is made: "
                     "time to send and ingest every event before its tick is sealed")
    e2e.add_argument("--heartbeat-ticks", type=int, default=100)
    e2e.add_argument("--partitions", type=int, default=4)
    a = ap.parse_args()
    # Nearly every user draws the heaviest key (32 draws, its share 1 / H(keys, s)):
    # one user per tick puts about one event per tick on it.
    upb = a.users_per_batch if a.users_per_batch > 0 else a.ticks_per_batch
    horizons = sorted(a.horizons)
    results: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    if a.broker:
        from stream_io import local_kafka

        with local_kafka(a.bootstrap or None, 1) as (bootstrap, _), \
                tempfile.TemporaryDirectory(prefix="dpsqlp-") as tmp:
            for seed in a.seeds:
                got = end_to_end(
                    seed, a.keys, a.zipf, upb, a.ticks_per_batch, horizons, a.mechanism,
                    a.calibration, bootstrap, Path(tmp), tick_ms=a.tick_ms,
                    lead_s=a.lead_s, heartbeat_ticks=a.heartbeat_ticks,
                    partitions=a.partitions)
                rows, check = got.rows, got.check
                print(json.dumps({"seed": seed, **check}), flush=True)
                checks.append({"seed": seed, **check})
                for row in rows:
                    print(json.dumps({k: v for k, v in row.items() if k != "pairs"}),
                          flush=True)
                    results.append(row)
    else:
        for seed in a.seeds:
            for row in run(seed, a.keys, a.zipf, upb, a.ticks_per_batch, horizons,
                           a.mechanism, a.calibration):
                print(json.dumps({k: v for k, v in row.items() if k != "pairs"}),
                      flush=True)
                results.append(row)
    if a.json:
        params = {k: v for k, v in vars(a).items() if k not in ("json", "bootstrap")}
        params.update(users_per_batch=upb, epsilon=EPS_U, delta=DELTA_U + DELTA_SEL,
                      max_counters_per_unit=M, max_events_per_counter=K,
                      loadavg=os.getloadavg()[0])
        with open(a.json, "w") as f:
            json.dump({"parameters": params, "results": results, "checks": checks}, f)
    if checks and not all(c["agree"] and c["horizon_figures_same"] for c in checks):
        print("error: the end-to-end records differ from the in-process ones",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
