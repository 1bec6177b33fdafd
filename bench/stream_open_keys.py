"""Phase open-keys of `bench_stream.py`: an open key set at scale (issue 30 item 4;
docs/open-keys.md, "At scale").

One deployment per run (`SteadyRun`'s README configuration but the tick, `--tick-ms`,
100 ms by default here, and the epsilon, `--epsilon`, 10 by default: at 1 s ticks or
epsilon 1 no ECC key can be admitted within 10 minutes, one event per tick leaving its
queue): one open family `f` in event mode (ECC, the deployment's epsilon and delta,
selection_delta `SELECTION_DELTA`, starting at the deployment's creation) and one declared
counter without events. The load, `--rate` events/s for a warm-up then `--seconds`:
`{"counter": "f", "key": ..., "ts": now}`, event i alternating between a Zipf(`ZIPF`) draw
over `--head-keys` head keys (`head-00000` the heaviest) and a key never seen before
(`new-<i>`), so about rate x seconds / 2 distinct keys.

Reported, for one worker:

- kept up: phase many's figures (markers committed p95 within one tick + the checkpoint
  interval; seal-to-release p50/p95 over the window's releases: the admitted keys' and
  the declared counter's; target p95 <= 1 s), the catch-up after the load;
- work done: events stepped = the growth of `dpc_operator_events_dequeued_total` over the
  window (an event counts once its key's mechanism has stepped it, one per key per tick,
  inside a batch commit that returned, so its release, if its tick made one, is
  acknowledged); CPU per stepped event and per produced event (user + system of the
  worker's processes over the window);
- RSS at the end of the window and its peak (target <= 2 GiB); memory per seen key =
  (RSS at the window's end - RSS before the load) / keys seen;
- keys seen (distinct keys sent; the worker's: its live state values `c/f[...]` on the
  changelog, which must agree), keys admitted (the ledger's `created` entries of the
  family);
- the error of the admitted keys: per key, its last release (tick T, value y) against the
  truth computed from what was sent: the events stamped at or before T ("sent"), and the
  events its queue had passed into the mechanism by T ("stepped": each event steps at the
  later of its tick and one tick after the event before it; `stepped_by`): mean, max and
  L2 of |y - truth|, and the mean of |y - truth| / truth;
- bytes per seen-but-not-admitted key in RocksDB: the live changelog value of each such key
  (key + value bytes; the value's format byte: 5 the compact form, 4 the mechanism's
  whole state), and the RocksDB directory / keys seen;
- the restore: every worker stopped, a fresh worker with an empty state dir (phase idle's
  restore: first commit on every timeline partition, /readyz, target <= 60 s; its bulk
  load's records/s; its RSS).

Then (`--workers`, default 1 3) the same load on a fresh deployment of N workers of one
group (phase scaleout's join, settle pause and idle window): CPU per stepped event of all
workers together, and its ratio to one worker's (target <= 1.3).
"""

from __future__ import annotations

import bisect
import itertools
import os
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psutil
from stream_procs import Children, scrape_metrics
from stream_steady import (
    IDLE_S,
    SETTLE_S,
    SteadyRun,
    _cpu_lines,
    _log_lines,
    _mib,
)

from processor.stream.kafka import kafka_io
from processor.stream.model.config import load_settings
from processor.stream.model.families import OpenFamily

FAMILY = "f"
ZIPF = 1.1
SELECTION_DELTA = 1e-7
DEQUEUED = "dpc_operator_events_dequeued_total"
LATE = "dpc_operator_late_events_total"
PREFIX = f"c/{FAMILY}[".encode()


def head_name(rank: int) -> str:
    return f"head-{rank:05d}"


def new_name(i: int) -> str:
    return f"new-{i:08d}"


def stepped_by(ticks: Sequence[int], t: int) -> int:
    """How many of a key's events (their ticks, sorted) its queue has passed into the
    mechanism by tick `t` (inclusive): one per tick, first in first out, an event
    stepping at the later of its own tick and one tick after the event before it."""
    free = None
    n = 0
    for a in ticks:
        at = a if free is None or a > free else free
        if at > t:
            break
        n += 1
        free = at + 1
    return n


@dataclass(frozen=True)
class KeyFigure:
    """One admitted key's last release against the truth."""

    counter: str
    tick: int
    value: float
    sent: int
    stepped: int


def key_errors(releases: Iterable[Mapping[str, Any]], truth: Mapping[str, Sequence[int]],
               tick_ms: int) -> list[KeyFigure]:
    """Per key of the family released (in `truth`: key counter name -> its events' ticks,
    sorted), its last release (highest tick) against the truth at that tick."""
    last: dict[str, tuple[int, float]] = {}
    for r in releases:
        c = str(r["counter"])
        if not c.startswith(f"{FAMILY}["):
            continue
        t = int(r["tick_start_ms"]) // tick_ms
        if c not in last or t >= last[c][0]:
            last[c] = (t, float(r["value"]))
    out = []
    for c, (t, y) in sorted(last.items()):
        ticks = truth.get(c, ())
        out.append(KeyFigure(c, t, y, bisect.bisect_right(ticks, t), stepped_by(ticks, t)))
    return out


def error_summary(errs: Sequence[KeyFigure], which: str) -> dict[str, float]:
    """mean, max and L2 of |value - truth| and the mean relative error, truth = the
    `which` field ("sent" or "stepped")."""
    if not errs:
        return {}
    d = [abs(e.value - getattr(e, which)) for e in errs]
    rel = [x / max(1, getattr(e, which)) for x, e in zip(d, errs, strict=True)]
    return {"mean": sum(d) / len(d), "max": max(d), "l2": sum(x * x for x in d) ** 0.5,
            "mean_rel": sum(rel) / len(rel)}


class KeyStream:
    """The load's keys: event i alternates between the Zipf head and a new key; the
    truth of the head keys (each event's tick) is kept, a new key has one event."""

    def __init__(self, head_keys: int, seed: int, tick_ms: int) -> None:
        self.cum = list(itertools.accumulate(1.0 / r ** ZIPF for r in range(1, head_keys + 1)))
        self.rng = random.Random(seed)
        self.tick_ms = tick_ms
        self.head: dict[int, list[int]] = {}
        self.new = 0

    def event(self, i: int, ts: int) -> bytes:
        if i % 2 == 0:
            r = bisect.bisect_left(self.cum, self.rng.random() * self.cum[-1])
            self.head.setdefault(r, []).append(ts // self.tick_ms)
            key = head_name(r)
        else:
            key = new_name(i)
            self.new += 1
        return orjson.dumps({"counter": FAMILY, "key": key, "ts": ts})

    def truth(self) -> dict[str, list[int]]:
        return {f"{FAMILY}[{head_name(r)}]": sorted(ts) for r, ts in self.head.items()}

    @property
    def keys_seen(self) -> int:
        return len(self.head) + self.new


class OpenKeysRun(SteadyRun):
    """A deployment with the open family and one declared counter; the key stream."""

    def __init__(self, conf: Mapping[str, str], bootstrap: str, tmp: Path,
                 children: Children, label: str, standby: int,
                 worker_settings: Mapping[str, Any], head_keys: int, seed: int) -> None:
        tick = int(worker_settings.get("tick_ms", 1000))
        start = (int(time.time() * 1000) // tick) * tick
        ws = dict(worker_settings)
        ws["families"] = {FAMILY: OpenFamily(start, SELECTION_DELTA)}
        super().__init__(conf, bootstrap, tmp, children, 1, label, standby, ws)
        self.keys = KeyStream(head_keys, seed, self.dep.settings.tick_ms)
        self.res.update(head_keys=head_keys, zipf=ZIPF, seed=seed,
                        epsilon=self.dep.settings.epsilon, delta=self.dep.settings.delta,
                        selection_delta=SELECTION_DELTA,
                        mechanism=self.dep.settings.mechanism)
        self.edges: list[list[dict[str, float]]] = []

    def event(self, i: int, ts: int) -> bytes:
        return self.keys.event(i, ts)

    def ports(self) -> list[int]:
        return [load_settings(w.config_path, env={}).metrics_port for w in self.procs]

    def window_edge(self, start: bool) -> None:
        self.edges.append([scrape_metrics(p, timeout_s=30) for p in self.ports()])

    def open_figures(self) -> None:
        """The open key figures after `analyze`: work done, keys, errors, stored bytes."""
        r = self.res
        m0, m1 = self.edges[0], self.edges[-1]
        stepped = sum(b.get(DEQUEUED, 0.0) - a.get(DEQUEUED, 0.0)
                      for a, b in zip(m0, m1, strict=True))
        r["window_stepped"] = int(stepped)
        r["cpu_per_stepped"] = sum(r["cpu"]) / max(1.0, stepped)
        end = [scrape_metrics(p, timeout_s=30) for p in self.ports()]
        r["late_events"] = sum(m.get(LATE, 0.0) for m in end)
        r["stepped_total"] = sum(m.get(DEQUEUED, 0.0) for m in end)
        r["keys_sent"] = self.keys.keys_seen
        r["head_keys_sent"] = len(self.keys.head)
        self.view.update()
        mine = {k: n for (_p, k), n in self.view.live.items()
                if k is not None and k.startswith(PREFIX)}
        r["keys_stored"] = len(mine)
        ledger = [orjson.loads(x.value) for x in kafka_io.iter_topic(
            self.conf, self.dep.topics.ledger) if x.value]
        admitted = {str(e["counter"]) for e in ledger if e.get("entry") == "created"
                    and str(e.get("counter", "")).startswith(f"{FAMILY}[")}
        r["keys_admitted"] = len(admitted)
        releases = [orjson.loads(x.value) for x in kafka_io.iter_topic(
            self.conf, self.dep.topics.counts) if x.value]
        r["releases"] = len(releases)
        errs = key_errors(releases, self.keys.truth(), self.dep.settings.tick_ms)
        r["released_keys"] = len(errs)
        r["admitted_not_head"] = sorted(e.counter for e in errs
                                        if not e.counter.startswith(f"{FAMILY}[head-"))[:5]
        r["error_sent"] = error_summary(errs, "sent")
        r["error_stepped"] = error_summary(errs, "stepped")
        r["errors"] = [(e.counter, e.tick, e.value, e.sent, e.stepped) for e in errs]
        forms = self.view.live_forms
        by_form: dict[int, list[int]] = {}
        for k, n in mine.items():
            if k[len(b"c/"):].decode() not in admitted:
                by_form.setdefault(forms.get(k, -1), []).append(n)
        waiting = [n for ns in by_form.values() for n in ns]
        r["waiting_keys"] = len(waiting)
        r["waiting_bytes_mean"] = sum(waiting) / max(1, len(waiting))
        # format -> (keys, mean bytes): 5 the compact form, 4 a key with more inputs
        r["waiting_forms"] = {f: (len(ns), sum(ns) / len(ns)) for f, ns in sorted(by_form.items())}
        self.state_dirs()
        d = r["state"]["worker1"]
        r["rocksdb_per_key"] = (d["sst"] + d["wal"] + d["other"]) / max(1, len(mine))
        r["rss_per_key"] = [(b - a) / max(1, len(mine))
                            for a, b in zip(r["idle_rss"], r["rss"], strict=True)]


def open_keys_run(conf: Mapping[str, str], bootstrap: str, tmp: Path, workers: int,
                  rate: float, seconds: float, children: Children, standby: int,
                  worker_settings: Mapping[str, Any], head_keys: int, seed: int,
                  restore: bool) -> dict[str, Any]:
    """One run of the phase (see the module docstring) with `workers` workers."""
    run = OpenKeysRun(conf, bootstrap, tmp, children, f"open{workers}", standby,
                      worker_settings, head_keys, seed)
    run.res.update(workers=workers, rate=rate, loadavg_start=os.getloadavg()[0])
    try:
        run.create()
        run.join(workers)
        run.idle(min(SETTLE_S, seconds / 3), min(IDLE_S, seconds / 3))
        stats = run.load(rate, seconds)
        run.analyze(stats)
        run.open_figures()
        if restore:
            run.restore(ready_s=300)
            r = run.res
            if "restore_rss" in r:
                r["restore_rss_per_key"] = r["restore_rss"] / max(1, r["keys_stored"])
    finally:
        run.close()
    return run.res


# ------------------------------------------------------------------------ report

def _err(e: Mapping[str, float]) -> str:
    if not e:
        return "no key released"
    return (f"mean {e['mean']:,.1f}, max {e['max']:,.1f}, L2 {e['l2']:,.1f} events; mean "
            f"relative {e['mean_rel']:.3f}")


def report_open_keys(r: Mapping[str, Any]) -> list[str]:
    w = r["workers"]
    lines = [f"Phase open-keys: {w} worker(s), family {FAMILY!r} (ECC, event mode, epsilon "
             f"{r['epsilon']}, delta {r['delta']}, selection_delta {r['selection_delta']}), "
             f"{r['rate']:,.0f} events/s for {r['window_s']:.0f} s (after a warm-up): half "
             f"Zipf({r['zipf']}) over {r['head_keys']:,} head keys, half new keys; tick "
             f"{r['tick_ms']} ms, lateness {r['lateness_ms']} ms, checkpoint "
             f"{r.get('checkpoint_ms', 500)} ms"]
    ml50, ml95, _ = r["marker_lag"]
    p50, p95, mx = r["latency"]
    lines.append(f"  kept up: {'yes' if r['kept_up'] else 'NO'} (markers committed p50 "
                 f"{ml50:.0f} / p95 {ml95:.0f} ms after their append; last third p95 "
                 f"{r['marker_last_third'][1]:.0f} ms); seal->release p50 {p50:.0f}, p95 "
                 f"{p95:.0f}, max {mx:.0f} ms (n={r['latency_n']:,}; target p95 <= 1,000 "
                 f"ms; last third p95 {r['last_third'][1]:.0f} ms); caught up after the "
                 f"load: {'yes' if r['caught_up'] else 'NO'}; late events {r['late_events']:,.0f}")
    ev = max(1, r["window_events"])
    lines.append(f"  work: {r['window_events']:,} events produced in the window, "
                 f"{r['window_stepped']:,} stepped ({r['window_stepped'] / ev:.0%}); CPU "
                 f"{sum(r['cpu']):.1f} CPU-s -> {r['cpu_per_stepped'] * 1e3:.3f} CPU-ms per "
                 f"stepped event ({sum(r['cpu']) / ev * 1e3:.3f} per produced); idle before "
                 f"the load {', '.join(f'{c:.2f}' for c in r['idle_cpu_per_s'])} CPU-s/s")
    lines += _cpu_lines(r)
    lines.append(f"  RSS at the end {', '.join(_mib(b) for b in r['rss'])}, peak "
                 f"{', '.join(_mib(b) for b in r['rss_peak'])} (target <= 2,048 MiB), "
                 f"before the load {', '.join(_mib(b) for b in r['idle_rss'])}; growth per "
                 f"stored key {', '.join(f'{b:,.0f} B' for b in r['rss_per_key'])}")
    lines.append(f"  keys: {r['keys_sent']:,} sent ({r['head_keys_sent']:,} of the head), "
                 f"{r['keys_stored']:,} in the worker's state (changelog), "
                 f"{r['keys_admitted']:,} admitted (ledger), {r['released_keys']:,} released "
                 f"({r['releases']:,} release records in all)"
                 + (f"; NOT head keys among them: {r['admitted_not_head']}"
                    if r["admitted_not_head"] else ""))
    lines.append(f"  error of the admitted keys' last release against the events sent up "
                 f"to its tick: {_err(r['error_sent'])}; against the events stepped by "
                 f"then: {_err(r['error_stepped'])}")
    d = r["state"]["worker1"]
    forms = "; ".join(f"format {f}: {n:,} keys, {b:,.1f} B" for f, (n, b) in
                      r["waiting_forms"].items())
    lines.append(f"  a key seen, not admitted: {r['waiting_bytes_mean']:,.1f} B stored "
                 f"(changelog key + value, mean over {r['waiting_keys']:,}; by the value's "
                 f"format: {forms}); worker1's RocksDB dir "
                 f"{_mib(d['sst'] + d['wal'] + d['other'])} = {r['rocksdb_per_key']:,.0f} B "
                 "per stored key")
    if "restore_s" in r or "restore_waited_s" in r:
        first = (f"first commit on every partition {r['restore_s']:.1f} s"
                 if "restore_s" in r else "no commit on every partition")
        ready = (f"ready {r['ready_s']:.1f} s" if "ready_s" in r
                 else f"NOT ready after {r.get('restore_waited_s', 0):.0f} s")
        bulk = ("; bulk load {:,.0f} records in {:.1f} s ({:,.0f} records/s)".format(
            *r["bulk_load"]) if "bulk_load" in r else "")
        lines.append(f"  restore on a fresh worker (state dir empty): {first}, {ready} "
                     f"after its start (target <= 60 s){bulk}; its RSS "
                     f"{_mib(r['restore_rss'])}")
    lines.append(f"  machine: {r['machine_busy']:.0%} of {psutil.cpu_count()} CPUs busy over "
                 f"the window; load average {r['loadavg_start']:.1f} at the run's start, "
                 f"{r['loadavg']:.1f} at the window's end")
    lines += _log_lines([r["logs"]])
    return lines


def stepped_ratio(runs: Mapping[int, Mapping[str, Any]], w: int) -> float:
    """w workers' CPU per stepped event against the one worker of the same set."""
    return float(runs[w]["cpu_per_stepped"]) / float(runs[1]["cpu_per_stepped"])


def report_open_ratio(runs: Mapping[int, Mapping[str, Any]]) -> list[str]:
    base = runs.get(1)
    out = []
    for w, r in sorted(runs.items()):
        if w == 1 or base is None:
            continue
        out.append(f"Phase open-keys: {w} workers / 1 worker, CPU per stepped event "
                   f"{stepped_ratio(runs, w):.2f} (target <= 1.3); "
                   "per produced event "
                   f"{total(r) / total(base):.2f}")
    return out


def report_open_ratio_range(sets: Sequence[Mapping[int, Mapping[str, Any]]]) -> list[str]:
    """The ratio of each set (its runs side by side in one stretch of the hour), as a
    range over the sets."""
    out = []
    for w in sorted({w for runs in sets for w in runs if w != 1}):
        got = [stepped_ratio(runs, w) for runs in sets if w in runs and 1 in runs]
        if got:
            out.append(f"Phase open-keys: {w} workers / 1 worker over {len(got)} sets, CPU "
                       f"per stepped event {min(got):.2f}-{max(got):.2f} "
                       f"({', '.join(f'{x:.2f}' for x in got)}; target <= 1.3 in each)")
    return out


def total(r: Mapping[str, Any]) -> float:
    return float(sum(r["cpu"])) / max(1, int(r["window_events"]))
