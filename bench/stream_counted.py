"""Phase throughput of `bench_stream.py`: counted events per second and CPU per counted event, the
processor beside its peers, on one broker, in one run.

What "counted" means, per system (the same N input events, JSON, unkeyed, 4 partitions):

- processor: an event is counted when its counter's mechanism has STEPPED it (taken it out
  of the counter's queue as x_t of some tick, the operator's `events_dequeued`) inside a
  batch commit that has returned. A batch commit returns after the releases it produced
  are acknowledged by the broker and its state is written to the table (RocksDB; the
  changelog record queued in Faust's producer) (processor/stream/model/commit.py), so a
  counted event's release, if its tick made one, is on the private-count topic. The
  bench reads the worker's operator metric `dpc_operator_events_dequeued_total` (an
  operator channel, /metrics), at most every second, the next reading when the rate of
  the last two says the end is near (`scrape_wait`: each scrape costs the worker CPU that
  no peer pays, about 0.5 ms for that one metric, Prometheus's `name[]` filter, against
  1.5 ms for the page of every operator metric it read before; at 50 ms intervals whole
  pages were a sixth of its busy samples in the dense stage); end = the first reading at or above
  the warm-up's value + N. An event merely accepted, on the timeline, or sealed is NOT
  counted: in the dense load each counter steps one event per tick, so most events wait
  in queues for many ticks after they were sealed, and that wait is in the figure.
- Quix Streams / Faust Table: counted when the output record carrying the count that
  includes it is appended: end = the broker append time of the first output record per
  counter whose count reaches that counter's expected total (warm-up included).
- plain confluent-kafka loop: when forwarded (end = append time of the N-th output).
- plain Faust agent (no state, no parsing: not a counting peer): when its "done" record
  (after N records seen) is appended.

start = the broker append time of the first of the N input records (the same for all).
events/s = N / (end - start). CPU = user + system seconds of the system's whole process
tree (psutil, /proc) from just before the N events are produced to the moment the bench
saw the end (it polls every 50 ms near the end, so a few ms of the system's idle work are in it);
CPU-ms per counted event = that / N; for the processor also split by thread group over the
same window (`stream_procs.thread_cpu`: main = Faust's event loop with the operator's agent
and timers, other python = the ingest loop, Faust's consumer thread and the checkpoint's
executor threads, librdkafka, rocksdb). "+flush": the same through the moment the system's
state changelog for the stage is written (`flushed`: Quix writes it at its next checkpoint,
a busy Faust event loop may still be sending the processor's, whose batch commit returns
once the state is in Faust's producer buffer), less the system's idle CPU rate (measured
over 3 s before the stage) times that wait. The broker's and the load generator's CPU are
in no system's figure. The processor's end is a wall-clock reading on the broker's host, the
peers' a broker append time: one machine, one clock.

Loads (same for every system; the bench produces the N events in one burst, as fast as
one confluent-kafka producer goes, after the system is warm):

- dense: 200 counters (default), N / 200 events each, so every counter's queue holds
  events for N / 200 ticks: each counter steps an event every tick (at most 200 x 10
  events/s through the mechanisms with 100 ms ticks: the tick capacity binds).
- sparse: N / 2 counters, 2 events each: a counter steps its 2 events in the first two
  open ticks and is ⊥ at every other tick; the tick capacity does not bind.

The processor runs tick 100 ms, lateness 100 ms, heartbeats off (see HEARTBEAT_TICKS), 4
partitions, epsilon 1, one worker, standby replicas as configured. Before the burst it must
be quiet (`quiesce`: the changelog of its counters' creation sent) and its idle rates are
measured over 3 s. Its events are stamped lateness + 2 ticks before production, so
each is late and joins the first open tick: the bench never waits for the wall clock to
reach an event's own tick. Warm-up: the ledger holds every counter and one warm-up event
was stepped (the peers: its output appeared), then the N events.
"""

from __future__ import annotations

import collections
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil
from stream_io import (
    Rec,
    Tail,
    create_deployment_topics,
    create_topics,
    event_value,
    produce_burst,
    records_in,
    topics_matching,
    wait_until,
)
from stream_procs import (
    Children,
    cpu_diff,
    cpu_seconds,
    py_spy,
    rss_bytes,
    scrape_counter,
    thread_cpu,
)

from processor.devtools.deployment import isolated_deployment
from processor.devtools.kafka.tools import free_port

BENCH = Path(__file__).resolve().parent
#: Processor timing of this phase (see the module docstring).
TICK_MS = 100
LATENESS_MS = 100
#: Heartbeats off (as in bench_operator): this phase measures events; what heartbeats cost
#: is per counter and per second, phase idle's figure (10,000 counters beating every 60 s
#: write thousands of changelog records a second in bursts, which would swamp the sparse
#: stage's own). `--heartbeat-ticks 600` (60 s of 100 ms ticks) puts them back.
HEARTBEAT_TICKS = 1_000_000
#: How often the bench looks for a stage's end (bounds the CPU of idle work in a figure).
POLL_S = 0.05
#: The processor's end is looked for `SCRAPE_AHEAD x remaining / rate` seconds after each
#: reading (within [POLL_S, 1 s]), the rate as the readings show it (`scrape_wait`; before
#: any growth: SCRAPE_RATE, a rate no processor stage reaches). A steady stage is read
#: about once a second and a few times at its end, and a reading short of the end looks
#: again after a fraction of what is left (at least POLL_S): the end is seen within POLL_S
#: of it while the rate holds, within 1 s - SCRAPE_AHEAD x that if it jumps.
SCRAPE_RATE = 50_000
SCRAPE_AHEAD = 0.8
DEQUEUED = "dpc_operator_events_dequeued_total"
#: After a stage's end, how long its system may still be writing the stage's state changelog
#: (Quix checkpoints every 5 s by default; Faust's producer and the processor send theirs
#: within milliseconds). The changelog count, and the "with flush" CPU, are read then.
FLUSH_S = {"quix": 6.0}
FLUSH_DEFAULT_S = 0.5
#: ... and after that pause, until its changelog grows in a second by at most its idle rate
#: (measured before the stage) + this many records, for at most FLUSH_MAX_S: a loaded
#: event loop may still be sending the stage's changelog.
FLUSH_QUIET_PER_S = 30
#: The idle window before each stage (the system warm, no input).
IDLE_S = 3.0
FLUSH_MAX_S = 20.0

#: Every system this phase knows: label, and whether it counts per counter.
SYSTEMS: dict[str, str] = {
    "processor-ecc": "processor ECC (every event stepped)",
    "processor-simecc": "processor SimECC (every event stepped)",
    "quix": "Quix Streams: group_by + stateful count",
    "faust-table": "Faust: group_by + Table count",
    "faust-agent": "plain Faust agent (no state, no parsing)",
    "kafka-loop": "plain confluent-kafka loop",
}
DEFAULT_SYSTEMS = ("processor-ecc", "quix", "faust-table", "kafka-loop", "faust-agent")


@dataclass(frozen=True)
class Load:
    """N events over `counters` counters, cycling (each gets N / counters)."""

    name: str
    counters: int
    events: int

    @property
    def names(self) -> list[str]:
        return [f"c{i:05d}" for i in range(self.counters)]

    def values(self, ts: int) -> list[bytes]:
        names = self.names
        return [event_value(names[i % self.counters], ts) for i in range(self.events)]

    def expected(self, warm: str) -> dict[str, int]:
        """Each counter's count once the N events and the warm-up event are in."""
        names = self.names
        per = collections.Counter(names[i % self.counters] for i in range(self.events))
        per[warm] += 1
        return dict(per)


def loads(events: int, dense_counters: int, which: Sequence[str]) -> list[Load]:
    out = []
    for name in which:
        if name == "dense":
            out.append(Load("dense", dense_counters, events))
        elif name == "sparse":
            out.append(Load("sparse", max(1, events // 2), events))
        else:
            raise ValueError(f"unknown load {name!r}")
    return out


@dataclass
class Ctx:
    conf: Mapping[str, str]
    bootstrap: str
    tmp: Path
    children: Children
    quix_python: str | None
    standby: int = 1
    #: The operator metric whose growth by N ends a processor stage. Only the tests change
    #: it (to events_queued: the control that a bench counting queued events is caught).
    processor_metric: str = DEQUEUED
    heartbeat_ticks: int = HEARTBEAT_TICKS
    #: The idle window before each stage and the longest flush wait (--quick shortens them).
    idle_s: float = IDLE_S
    flush_max_s: float = FLUSH_MAX_S
    #: Further settings of every processor deployment (--checkpoint-ms).
    worker_settings: Mapping[str, Any] = field(default_factory=dict)
    #: --profile-dir: a py-spy profile (raw) of each stage's system over its window, one
    #: file per stage (`stream_procs.py_spy`; `native`: with native frames). A profiled
    #: stage's figures are not a measurement (py-spy shares the machine).
    profile_dir: Path | None = None
    profile_native: bool = False
    profiled: int = 0

    def profile_path(self, system: str, load: str) -> Path | None:
        """Where the next stage's profile goes (None: not profiled)."""
        if self.profile_dir is None:
            return None
        self.profiled += 1
        return self.profile_dir / f"{self.profiled:02d}-{system}-{load}.txt"


@dataclass
class StageResult:
    system: str
    load: str
    events: int
    seconds: float
    cpu_s: float
    loadavg: float
    changelog: int  # state changelog records appended during the stage
    outputs: int  # output / release records appended during the stage
    produce_s: float
    rss: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.events / max(1e-3, self.seconds)

    @property
    def cpu_ms_per_event(self) -> float:
        return 1e3 * self.cpu_s / max(1, self.events)

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "rate": self.rate, "cpu_ms_per_event": self.cpu_ms_per_event}


# ------------------------------------------------------------------------ the peers

class OutputWatch:
    """Reads a peer's output topic and says when (broker append time) it counted all."""

    def __init__(self, tail: Tail, kind: str, expected: Mapping[str, int], n: int) -> None:
        self.tail, self.kind, self.expected, self.n = tail, kind, expected, n
        self.best: dict[str, int] = {}
        self.reached: dict[str, int] = {}  # counter -> append time of its final count
        self.records: list[Rec] = []
        self.end: int | None = None

    def poll(self) -> bool:
        new = self.tail.catch_up()
        self.records += new
        if self.kind == "faust-agent":
            done = [r.ts for r in self.records if r.value == b"done"]
            self.end = min(done) if done else None
        elif self.kind == "kafka-loop":
            if len(self.records) >= self.n:
                self.end = sorted(r.ts for r in self.records)[self.n - 1]
        else:
            for r in new:
                d = orjson.loads(r.value or b"{}")
                c, k = str(d["counter"]), int(d["count"])
                self.best[c] = max(self.best.get(c, 0), k)
                if k >= self.expected.get(c, 1 << 62) and c not in self.reached:
                    self.reached[c] = r.ts
            if len(self.reached) == len(self.expected):
                self.end = max(self.reached.values())
        return self.end is not None


def peer_command(kind: str, ctx: Ctx, src: str, out: str, n: int, work: Path) -> list[str]:
    args = [ctx.bootstrap, src, out, str(n), str(work)]
    if kind == "quix":
        if ctx.quix_python is None:
            raise RuntimeError("no Python with quixstreams (--quix-python)")
        return [ctx.quix_python, str(BENCH / "peer_quix.py"), *args]
    return [sys.executable, str(BENCH / "stream_peers.py"), kind, *args]


def run_peer(kind: str, ctx: Ctx, load: Load) -> StageResult:
    uid = uuid.uuid4().hex[:8]
    src, out = f"bench-{kind}-in-{uid}", f"bench-{kind}-out-{uid}"
    create_topics(ctx.conf, [src, out], 4)
    work = ctx.tmp / f"{kind}-{load.name}-{uid}"
    work.mkdir()
    log = work / "child.log"
    proc = ctx.children.spawn(peer_command(kind, ctx, src, out, load.events, work), work, log)
    tail = Tail(ctx.conf, out)

    def alive() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} exited: {log.read_text(errors='replace')[-2000:]}")
        return True

    try:
        warm = load.names[0]
        produce_burst(ctx.conf, src, [event_value(warm, int(time.time() * 1000))])
        wait_until(lambda: alive() and bool(tail.catch_up()), 300, f"{kind}: warm-up output")
        watch = OutputWatch(tail, kind, load.expected(warm), load.events)
        changelogs = topics_matching(ctx.conf, uid, "changelog")
        idle = idle_rates(ctx.conf, changelogs, proc.pid, ctx.idle_s)
        chl0 = records_in(ctx.conf, changelogs)
        values = load.values(int(time.time() * 1000))
        with py_spy(proc.pid, ctx.profile_path(kind, load.name), ctx.profile_native):
            cpu0 = cpu_seconds(proc.pid)
            sent = produce_burst(ctx.conf, src, values)
            wait_until(lambda: alive() and watch.poll(), 900, f"{kind}: all events counted",
                       interval_s=POLL_S)
            cpu1 = cpu_seconds(proc.pid)
        rss = rss_bytes(proc.pid)
        chl1, flush_s = flushed(ctx.conf, changelogs, FLUSH_S.get(kind, FLUSH_DEFAULT_S),
                                idle[1], ctx.flush_max_s)
        cpu2 = cpu_seconds(proc.pid)
    finally:
        ctx.children.stop(proc)
        tail.close()
    assert sent.first_ts is not None and watch.end is not None
    return StageResult(kind, load.name, load.events, (watch.end - sent.first_ts) / 1000,
                       cpu1 - cpu0, os.getloadavg()[0],
                       round(chl1 - chl0 - idle[1] * flush_s), len(watch.records),
                       (sent.last_ts - sent.first_ts) / 1000, rss,
                       {"changelog_topics": len(changelogs), "flush_s": flush_s,
                        "cpu_flush_s": cpu2 - cpu0 - idle[0] * flush_s,
                        "idle_cpu_per_s": idle[0], "idle_changelog_per_s": idle[1],
                        "not_log_append": sent.not_log_append + tail.not_log_append})


# ------------------------------------------------------------------------ the processor

def run_processor(mechanism: str, ctx: Ctx, load: Load) -> StageResult:
    tick = TICK_MS
    start = (int(time.time() * 1000) // tick) * tick - 100 * tick
    port = free_port()
    dep = isolated_deployment(ctx.bootstrap, dict.fromkeys(load.names, start), parent=ctx.tmp,
                              name=f"bench-{load.name}", create_topics=False, tick_ms=tick,
                              lateness_ms=LATENESS_MS, heartbeat_ticks=ctx.heartbeat_ticks,
                              partitions=4, mechanism=mechanism, epsilon=1.0, delta=1e-6,
                              metrics_port=port, standby_replicas=ctx.standby,
                              **dict(ctx.worker_settings))
    ctx.children.deployments.append(dep)
    create_deployment_topics(ctx.conf, dep)
    ledger = Tail(ctx.conf, dep.topics.ledger)
    uid = dep.topics.input.rsplit("-", 1)[-1]

    def dequeued() -> float:
        if not dep.worker.alive():
            raise RuntimeError("worker exited: " + dep.worker.log_tail())
        v = scrape_counter(port, ctx.processor_metric)
        return -1.0 if v is None else v

    try:
        t0 = time.monotonic()
        dep.worker.start()

        def created() -> bool:
            ledger.drain()
            return dequeued() >= 0 and ledger.count >= load.counters
        wait_until(created, 900, "processor: ledger entries of every counter")
        created_s = time.monotonic() - t0
        produce_burst(ctx.conf, dep.topics.input,
                      [event_value(load.names[0], int(time.time() * 1000))])
        wait_until(lambda: dequeued() >= 1, 300, "processor: the warm-up event stepped")
        d0 = dequeued()
        changelogs = topics_matching(ctx.conf, uid, "changelog")
        pid = dep.worker.proc.pid if dep.worker.proc else 0
        settle_s = quiesce(ctx.conf, changelogs, load.counters / 10 + 100)
        idle = idle_rates(ctx.conf, changelogs, pid, ctx.idle_s)
        chl0 = records_in(ctx.conf, changelogs)
        rel0 = records_in(ctx.conf, [dep.topics.counts])
        with py_spy(pid, ctx.profile_path(f"processor-{mechanism}", load.name),
                    ctx.profile_native):
            cpu0, th0 = cpu_seconds(pid), thread_cpu(pid)
            # Late at the worker: lateness + 2 ticks before now (see the module docstring).
            stamp = int(time.time() * 1000) - LATENESS_MS - 2 * tick
            sent = produce_burst(ctx.conf, dep.topics.input, load.values(stamp))
            scrapes = scrape_wait(dequeued, d0 + load.events, 900,
                                  "processor: every event stepped")
            end_ms = time.time() * 1000
            cpu1, th1, rss = cpu_seconds(pid), thread_cpu(pid), rss_bytes(pid)
        chl1, flush_s = flushed(ctx.conf, changelogs, FLUSH_DEFAULT_S, idle[1],
                                ctx.flush_max_s)
        releases = records_in(ctx.conf, [dep.topics.counts]) - rel0
        cpu2 = cpu_seconds(pid)
    finally:
        ledger.close()
        logs = ctx.children.close_deployment(dep)
    assert sent.first_ts is not None
    return StageResult(f"processor-{mechanism}", load.name, load.events,
                       (end_ms - sent.first_ts) / 1000, cpu1 - cpu0, os.getloadavg()[0],
                       round(chl1 - chl0 - idle[1] * flush_s), releases,
                       (sent.last_ts - sent.first_ts) / 1000, rss,
                       {"created_s": created_s, "settle_s": settle_s, "logs": logs,
                        "flush_s": flush_s,
                        "cpu_flush_s": cpu2 - cpu0 - idle[0] * flush_s,
                        "idle_cpu_per_s": idle[0], "idle_changelog_per_s": idle[1],
                        "threads": cpu_diff(th0, th1), "scrapes": scrapes,
                        "not_log_append": sent.not_log_append})


def scrape_wait(read: Callable[[], float], target: float, timeout_s: float,
                what: str, clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> int:
    """Read until `read()` reaches `target`; returns the number of readings. The next
    reading comes `SCRAPE_AHEAD x (target - last) / rate` seconds later, within [POLL_S,
    1 s]; rate = the larger of the growth per second since the first reading that had
    grown (the stage under way) and since the previous reading; SCRAPE_RATE until one
    reading after that first growth. TimeoutError names `what`."""
    t0 = clock()
    reads = 0
    first: float | None = None
    grown: tuple[float, float] | None = None  # the first reading above `first`
    prev = (0.0, 0.0)
    while True:
        v, now = read(), clock()
        reads += 1
        left = target - v
        if left <= 0:
            return reads
        if now - t0 > timeout_s:
            raise TimeoutError(f"{what}: not after {timeout_s:.0f} s")
        rate = float(SCRAPE_RATE)
        if first is None:
            first = v
        elif grown is None:
            if v > first:
                grown = (v, now)
        elif now > grown[1]:
            rate = max((v - grown[0]) / (now - grown[1]),
                       (v - prev[0]) / (now - prev[1]) if now > prev[1] else 0.0)
            if rate <= 0:
                rate = float(SCRAPE_RATE)
        prev = (v, now)
        sleep(min(1.0, max(POLL_S, SCRAPE_AHEAD * left / rate)))


def quiesce(conf: Mapping[str, str], changelogs: Sequence[str], per_s: float,
            timeout_s: float = 300.0) -> float:
    """Wait until the changelog grows by at most `per_s` records in a second; seconds
    waited. A worker that just created its counters is still sending their state for a
    while (thousands of records per second at 10,000 counters); the stage must not be
    charged with it. `per_s` (counters / 10 + 100) is above the worker's steady idle rate
    (markers' partition values, 40/s, and heartbeats: counters / 60 per second, a state
    write or two each) and far below that drain."""
    t0 = time.monotonic()
    last = records_in(conf, changelogs)
    while time.monotonic() - t0 < timeout_s:
        time.sleep(1.0)
        now = records_in(conf, changelogs)
        if now - last <= per_s:
            break
        last = now
    return time.monotonic() - t0


def idle_rates(conf: Mapping[str, str], changelogs: Sequence[str], pid: int,
               seconds: float = IDLE_S) -> tuple[float, float]:
    """(CPU-s per second, changelog records per second) of a warm system with no input,
    over `seconds` just before its stage: the processor's markers, partition values and
    heartbeats; a peer's polling."""
    c0, r0, t0 = cpu_seconds(pid), records_in(conf, changelogs), time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t0
    return (cpu_seconds(pid) - c0) / dt, (records_in(conf, changelogs) - r0) / dt


def flushed(conf: Mapping[str, str], topics: Sequence[str], pause_s: float,
            idle_per_s: float, max_s: float = FLUSH_MAX_S) -> tuple[int, float]:
    """(records in `topics`, seconds waited) once the system is done writing its changelog
    for the stage: after `pause_s`, when a second adds at most its idle rate +
    FLUSH_QUIET_PER_S records (at most `max_s` in all)."""
    t0 = time.monotonic()
    time.sleep(pause_s)
    last = records_in(conf, topics)
    while time.monotonic() - t0 < max_s:
        time.sleep(1.0)
        now = records_in(conf, topics)
        if now - last <= idle_per_s + FLUSH_QUIET_PER_S:
            return now, time.monotonic() - t0
        last = now
    return last, time.monotonic() - t0


def run_stage(system: str, ctx: Ctx, load: Load) -> StageResult:
    if system.startswith("processor-"):
        return run_processor(system.removeprefix("processor-"), ctx, load)
    return run_peer(system, ctx, load)


def phase_counted(ctx: Ctx, systems: Sequence[str], load_list: Sequence[Load], repeat: int,
                  on_result: Callable[[StageResult], None] | None = None
                  ) -> list[StageResult]:
    """Every system on every load, `repeat` times; the systems' order rotated per repeat."""
    out: list[StageResult] = []
    for r in range(repeat):
        k = r % len(systems)
        order = [*systems[k:], *systems[:k]]
        for load in load_list:
            for system in order:
                print(f"  repeat {r + 1}/{repeat}, {load.name}: {system} ...", flush=True)
                res = run_stage(system, ctx, load)
                res.extra["repeat"], res.extra["order"] = r, order
                print(f"    {res.rate:,.0f} events/s, {res.cpu_ms_per_event:.3f} CPU-ms per "
                      f"counted event (load average {res.loadavg:.2f})", flush=True)
                out.append(res)
                if on_result is not None:
                    on_result(res)
    return out


# ------------------------------------------------------------------------ report

def flush_ms(r: StageResult) -> float:
    """CPU-ms per event through the changelog flush (see `flushed`)."""
    return 1e3 * float(r.extra["cpu_flush_s"]) / max(1, r.events)


def _span(xs: Sequence[float], fmt: str) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}-{hi:{fmt}}"


def _thread_line(system: str, own: Sequence[StageResult]) -> list[str]:
    """The processor's CPU-ms per event by thread group (stream_procs.thread_group), the
    stage's window as in CPU-ms/event, ranges over the repeats."""
    runs = [r for r in own if r.extra.get("threads")]
    if not runs:
        return []
    groups = sorted({g for r in runs for g in r.extra["threads"]})
    parts = [f"{g} "
             + _span([1e3 * r.extra["threads"].get(g, 0.0) / r.events for r in runs], ".3f")
             for g in groups]
    return [f"    {system} CPU-ms per event by thread group: " + ", ".join(parts)]


def report_counted(results: Sequence[StageResult], systems: Sequence[str],
                   load_list: Sequence[Load]) -> list[str]:
    repeats = len({r.extra.get("repeat") for r in results})
    lines = [f"Phase throughput: counted events, {repeats} repeat(s), one broker, stages one after "
             "another, order rotated per repeat (ranges over the repeats)"]
    for load in load_list:
        lines.append(f"  {load.name}: {load.events:,} events over {load.counters:,} counters "
                     f"({load.events // load.counters} each)")
        lines.append(f"    {'system':<44}{'events/s':>17}{'CPU-ms/event':>15}"
                     f"{'+flush':>13}{'flush s':>10}{'chlog/ev':>11}{'out/ev':>11}"
                     f"{'load avg':>12}{'idle CPU-s/s':>14}{'idle chlog/s':>14}")
        for system in systems:
            rs = [r for r in results if r.system == system and r.load == load.name]
            if not rs:
                continue
            lines.append(
                f"    {SYSTEMS[system]:<44}{_span([r.rate for r in rs], ',.0f'):>17}"
                f"{_span([r.cpu_ms_per_event for r in rs], '.3f'):>15}"
                f"{_span([flush_ms(r) for r in rs], '.3f'):>13}"
                f"{_span([r.extra['flush_s'] for r in rs], '.1f'):>10}"
                f"{_span([r.changelog / r.events for r in rs], '.2f'):>11}"
                f"{_span([r.outputs / r.events for r in rs], '.2f'):>11}"
                f"{_span([r.loadavg for r in rs], '.1f'):>12}"
                f"{_span([r.extra['idle_cpu_per_s'] for r in rs], '.3f'):>14}"
                f"{_span([r.extra['idle_changelog_per_s'] for r in rs], '.0f'):>14}")
        base = [r for r in results if r.system == "quix" and r.load == load.name]
        for system in (s for s in systems if s.startswith("processor-")):
            own = [r for r in results if r.system == system and r.load == load.name]
            pairs = [(p, q) for p in own for q in base
                     if p.extra.get("repeat") == q.extra.get("repeat")]
            if pairs:
                cpu = [p.cpu_ms_per_event / q.cpu_ms_per_event for p, q in pairs]
                cpu_flush = [flush_ms(p) / flush_ms(q) for p, q in pairs]
                lines.append(f"    {system} / Quix, per repeat: CPU per event "
                             f"{_span(cpu, '.2f')}x (+flush {_span(cpu_flush, '.2f')}x), "
                             f"events/s {_span([p.rate / q.rate for p, q in pairs], '.2f')}x")
        for system in (s for s in systems if s.startswith("processor-")):
            own = [r for r in results if r.system == system and r.load == load.name]
            lines += _thread_line(system, own)
            scrapes = [r.extra["scrapes"] for r in own if "scrapes" in r.extra]
            if scrapes:
                lines.append(f"    {system} /metrics readings per stage (the bench's, CPU "
                             f"the worker pays): {_span(scrapes, 'd')}")
    lines.append("  CPU-ms/event: the system's CPU from the burst to its end / N; +flush: the "
                 "same until its changelog for the stage is written (flush s after the end: "
                 f"Quix's next checkpoint, at least {FLUSH_S['quix']:.0f} s; the others at "
                 f"least {FLUSH_DEFAULT_S} s; then until a second adds <= its idle rate + "
                 f"{FLUSH_QUIET_PER_S} changelog records), less its idle CPU rate (measured "
                 "before the stage) x that wait; chlog/ev: state "
                 "changelog records per event by then, less the idle rate x the wait; "
                 "out/ev: output (processor: release) records per event")
    produce = [r.produce_s for r in results]
    lines.append(f"  producing the N events took {_span(produce, '.2f')} s (in every "
                 f"system's window alike); {psutil.cpu_count()} CPUs; load average = the "
                 "1-minute figure at each stage's end")
    rss = [r.rss for r in results if r.system.startswith("processor-")]
    if rss:
        lines.append(f"  processor worker RSS at the end: {_span([b / 2**20 for b in rss], '.0f')}"
                     " MiB")
    return lines
