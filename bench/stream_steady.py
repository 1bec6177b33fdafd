"""Phases many, scaleout and idle of `bench_stream.py`.

A run is a sequence of steps on one `SteadyRun` (one deployment, the README configuration:
tick 1 s, lateness 2 s, heartbeat every 60 ticks, 4 partitions, ECC): create the counters
(the first worker, until the ledger holds them all), let further workers join (until the
group's assignment is stable), a settle pause and an idle window (the workers' CPU with no
input), the paced load (a warm-up, then the measured window), then what the topics say.
Every time is a broker append time (LogAppendTime on every topic, the state changelog too).

many (--counters C, --rate R, --seconds S), one worker. After the ledger holds every
counter, a paced producer sends R events/s, each stamped with the wall clock, cycling over
the counters, for a warm-up then a measured window of S seconds. Reported:
- kept up: per marker appended in the window, the time to the checkpoint that made it
  durable (the first changelog record `p/<p>` whose marker offset reaches it), p50/p95/max
  and p50/p95 per first and last third of the window; kept up = its p95 within one tick
  plus the checkpoint interval (a marker applied at once still waits for the next
  checkpoint; beyond that, markers queue behind the operator);
- caught up after the load: every event on the timeline and sealed and committed within 5
  minutes, with the delay from the last input record to its timeline batch and to that
  commit (an event stamped now waits lateness + the rest of its tick for the seal);
- seal-to-release latency p50/p95/max: for each release whose sealing marker was appended
  inside the window, release append time - append time of the first marker that sealed
  its tick; also per first and last third of the window (growth means falling behind);
- CPU over the window (user + system of every thread of the worker processes and their
  children, psutil; per thread group from /proc/<pid>/task/*/stat) per event produced in
  it; the idle rate before the load; timeline batch records and events per record;
  changelog records per event;
- RSS at the end, its peak sampled every second under load, and before the load; the
  RocksDB directory size at the end (SST / WAL / other, and the blocks allocated) against
  the state table's live size (latest non-tombstone value per key in the changelog, key +
  value bytes) and their ratio (target <= 3); the machine's CPU busy fraction and load
  average (the machine is shared); warning/error lines of the worker logs.

scaleout (--workers 1 2 3, --repeat K sets): the run of `many` with each worker count (one
app id, one consumer group, a state dir and a metrics port each), in an order rotated
between sets: the first worker starts alone and creates the counters, the others then
join, and the load starts once the group's assignment is stable, after a 10 s pause
(standby restore) and the 15 s idle window. Total CPU per event = the window's CPU / the
events produced in it; marginal = (the window's CPU - each worker's idle rate x the
window) / the same events; both also against the events the operator committed in the
window (from the partition values' duplicate filters). The ratio to 1 worker per set and
its range (target: within 20%); the timeline partitions each worker held (the broker's
group description) before and after the joins, with the per-partition RocksDB directories
each worker's state dir holds. The 2-core machine cannot show a wall-clock speed-up with
the broker and the load on it: CPU per event is the figure.

idle (--counters C, --seconds S): one worker, C declared counters, no input: after the
ledger holds them and a 10 s pause, its CPU-s per second over S seconds (per thread group)
and RSS; then every worker stopped and a fresh one (empty state dir, same group) started:
restore = from its start to its first commit on every timeline partition (its state came
back from the changelog and the operator applies the timeline again); ready = to its
/readyz answering 200 (it also caught up with the ticks sealed while no worker ran),
polled once the first commit is seen, so never before it. Its start's steps: the seconds
from its start to the log times of its lifecycle lines (`start checks`, `bulk load`,
`worker starting`, `worker ready`: the worker's own readiness) and the start checks
line's own seconds per step.

takeover (--counters C, --seconds S): two workers, C declared counters, no input,
standby replicas; after the assignment is stable, a pause and an idle window of S
seconds, the worker that joined is SIGKILLed and the survivor's takeover of its
partitions timed from the group's reassignment (`SteadyRun.takeover`).

A broker kill (scaleout on a three-node cluster, `BrokerKill`): in the middle of each
run's measured window one node, chosen at random, is SIGKILLed and restarted after a
pause (the reliability campaign's `KillDriver.kill_broker`), while the load goes on; after
the catch-up, nothing lost = every event produced is on the timeline, sealed and
committed (the catch-up above), and, every worker stopped cleanly, `python -m processor
replay` (the campaign's `replay_cli`) recomputes every public record of the deployment
identically.
"""

from __future__ import annotations

import math
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import psutil
from confluent_kafka import KafkaException
from stream_io import (
    Produced,
    Tail,
    create_deployment_topics,
    event_value,
    groups_with_prefix,
    produce_one,
    records_in,
    topics_matching,
    wait_until,
)
from stream_procs import (
    Children,
    cpu_diff,
    cpu_seconds,
    dir_sizes,
    machine_busy,
    partition_dbs,
    pcts,
    rss_bytes,
    scrape_metrics,
    thread_cpu,
)
from stream_timeline import TimelineView, wait_accounted

from processor.devtools.deployment import (
    Deployment,
    WorkerProcess,
    group_assignment,
    isolated_deployment,
    write_config,
)

if TYPE_CHECKING:
    from processor.devtools.kafka.cluster import LocalKafka
from processor.devtools.kafka.tools import free_port
from processor.stream.kafka import kafka_io
from processor.stream.model.config import load_settings, with_overrides

#: The worker's bulk load line (docs/operator-channels.md): records, seconds, records/s.
_BULK_LOAD = re.compile(r"bulk load: (\d+) changelog record\(s\) of \d+ partition\(s\) in "
                        r"([\d.]+) s \((\d+) records/s\)")
_CHECKS = re.compile(r"start checks: (.*)$", re.M)

#: The worker's lifecycle lines (docs/operator-channels.md) whose log times mark the
#: steps of a start: the start checks done, the bulk load done, Faust started, ready.
_START_MARKS: Final = (("checks", "start checks: "), ("bulk load", "bulk load: "),
                       ("faust", "worker starting: "), ("ready", "worker ready: "))
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def start_marks(log: str, t0_ms: int) -> dict[str, float]:
    """Seconds from `t0_ms` (epoch ms) to the first log line of each of _START_MARKS
    (log times in this host's local time, as the worker writes them)."""
    marks: dict[str, float] = {}
    for line in log.splitlines():
        when = _LOG_TIME.match(line)
        for name, text in _START_MARKS:
            if when is not None and name not in marks and text in line:
                at = datetime.strptime(when.group(1), "%Y-%m-%d %H:%M:%S,%f")
                marks[name] = at.timestamp() - t0_ms / 1000
    return marks


#: The pause after the assignment is stable, then the idle window (each at most a third of
#: the measured window).
SETTLE_S = 10.0
#: The longest wait of phase idle for the worker to work off the ticks sealed while it
#: created its counters (`SteadyRun.caught_up`); the window starts after it either way.
CATCH_UP_MAX_S = 900.0
IDLE_S = 15.0
#: How often the load generator samples the workers' resident memory (its peak is reported).
RSS_SAMPLE_S = 1.0
#: The longest wait for the replay of a deployment whose broker was killed.
REPLAY_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class BrokerKill:
    """One node of `cluster` SIGKILLed in the middle of a run's measured window and
    restarted `down_s` later; `seed` picks the node."""

    cluster: LocalKafka
    down_s: float
    seed: int

    def start(self, dep: Deployment) -> tuple[threading.Thread, list[BaseException]]:
        """The kill and the restart in a thread (the load goes on meanwhile); the list
        receives what it raised."""
        from processor.devtools.campaign import KillDriver

        driver = KillDriver(dep, random.Random(self.seed), bad_share=0.0)
        failed: list[BaseException] = []

        def strike() -> None:
            try:
                driver.kill_broker(self.cluster, self.down_s)
            except Exception as exc:  # raised again by the caller after the load
                failed.append(exc)
        thread = threading.Thread(target=strike, name="broker-kill", daemon=True)
        thread.start()
        return thread, failed


def every_worker_placed(held: Mapping[str, list[int]], workers: int, partitions: int) -> bool:
    """Whether a group's assignment (member -> timeline partitions) has all `workers`
    members and gives partitions to as many of them as can hold one: every member, or
    every partition's own member when the workers outnumber the partitions."""
    holding = sum(1 for ps in held.values() if ps)
    return len(held) == workers and holding == min(workers, partitions)


class SteadyRun:
    """One deployment of the README configuration with `counters` counters."""

    def __init__(self, conf: Mapping[str, str], bootstrap: str, tmp: Path, children: Children,
                 counters: int, label: str, standby: int = 1,
                 worker_settings: Mapping[str, Any] | None = None) -> None:
        # The README configuration's tick unless the run sets its own.
        tick = int((worker_settings or {}).get("tick_ms", 1000))
        start = self.start_ms = (int(time.time() * 1000) // tick) * tick
        self.conf, self.children, self.counters = conf, children, counters
        self.names = [f"m{i:05d}" for i in range(counters)]
        self.dep: Deployment = isolated_deployment(
            bootstrap, dict.fromkeys(self.names, start), parent=tmp, name=f"bench-{label}",
            create_topics=False, metrics_port=free_port(), standby_replicas=standby,
            **dict(worker_settings or {}))
        children.deployments.append(self.dep)
        s = self.dep.settings
        create_deployment_topics(conf, self.dep)
        self.view = TimelineView(conf, self.dep)
        self.ledger = Tail(conf, self.dep.topics.ledger)
        self.procs: list[WorkerProcess] = [self.dep.worker]
        self.res: dict[str, Any] = {"counters": counters, "tick_ms": s.tick_ms,
                                    "lateness_ms": s.lateness_ms, "standby_replicas": standby,
                                    "checkpoint_ms": s.checkpoint_interval_ms()}

    @property
    def group(self) -> str:
        return self.dep.settings.app_id

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.procs if w.proc is not None]

    def check_alive(self) -> None:
        for w in self.procs:
            if not w.alive():
                raise RuntimeError("worker exited: " + w.log_tail())

    def assignment(self) -> dict[str, list[int]]:
        return group_assignment(self.conf, self.group, self.dep.topics.timeline)

    def member_name(self, member: str) -> str:
        """The worker (worker1, worker2, ... in start order) whose process a group member
        id names: it begins with the process's client id (`kafka_io.client_id`)."""
        host = socket.gethostname()
        for i, w in enumerate(self.procs):
            if w.proc is not None and member.startswith(
                    f"dpc-{self.group}-{host}-{w.proc.pid}-"):
                return f"worker{i + 1}"
        return f"member-{member[-6:]}"

    def named_assignment(self) -> dict[str, list[int]]:
        return {self.member_name(m): ps for m, ps in sorted(self.assignment().items())}

    # -- steps

    def create(self) -> None:
        """Start the first worker; wait until the ledger holds every counter."""
        t0 = time.monotonic()
        self.dep.worker.start()

        def created() -> bool:
            self.check_alive()
            self.ledger.drain()
            return self.ledger.count >= self.counters
        wait_until(created, 1800, f"ledger entries for {self.counters} counters")
        self.res["created_s"] = time.monotonic() - t0
        self.view.attach_changelog()
        first = self.assignment()
        self.res["assign_before"] = {"worker1": sorted(p for ps in first.values() for p in ps)}

    def new_worker(self, label: str) -> WorkerProcess:
        """Another worker of the group with a state dir, and a metrics port, of its own (a
        worker that cannot bind the shared port serves no endpoint and runs no lag probe,
        and the workers would not be equal)."""
        w = self.dep.add_worker(label)
        write_config(with_overrides(load_settings(w.config_path, env={}),
                                    metrics_port=free_port()), w.config_path)
        return w

    def join(self, workers: int) -> None:
        """Start workers 2..`workers`; wait until `every_worker_placed` and the assignment
        stayed the same over 8 readings."""
        if workers < 2:
            return
        for i in range(2, workers + 1):
            self.procs.append(self.new_worker(f"worker{i}").start())
        last: list[dict[str, list[int]]] = []

        def stable() -> bool:
            self.check_alive()
            a = self.assignment()
            last.append(a)
            full = every_worker_placed(a, workers, self.dep.settings.partitions)
            return full and len(last) >= 8 and all(x == a for x in last[-8:])
        self.res["join_s"] = wait_until(stable, 300, f"a stable {workers}-worker assignment")

    def idle(self, settle_s: float, idle_s: float, profile: Path | None = None) -> None:
        """What the workers burn with no input (markers, heartbeats, polling), after a
        pause: a worker that just joined still restores its standby copies. `profile`:
        py-spy record of the first worker over the window, raw, the GIL's holder by
        thread (py-spy next to this interpreter; not a dependency of the project)."""
        self.res["assign_start"] = self.named_assignment()
        time.sleep(settle_s)
        pids = self.pids
        self.res["window_at_s"] = time.time() - self.start_ms / 1000
        spy = None
        if profile is not None:
            spy = subprocess.Popen(
                [str(Path(sys.executable).with_name("py-spy")), "record", "--gil",
                 "--threads", "--nonblocking", "--format", "raw", "--duration",
                 str(int(idle_s)), "-o", str(profile), "-p", str(pids[0])],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        c0 = [cpu_seconds(pid) for pid in pids]
        t0s = [thread_cpu(pid) for pid in pids]
        m0 = self.worker_metrics()
        i0 = time.monotonic()
        time.sleep(idle_s)  # the idle measurement window itself
        idle = time.monotonic() - i0
        m1 = self.worker_metrics()
        self.res["idle_s"] = idle
        # The first worker's releases sent per second in the window, and the ticks it was
        # behind at its ends (dpc_catchup_ticks_behind: a window that starts while the
        # marker backlog of a long creation is worked off measures that, not idleness).
        self.res["idle_releases_per_s"] = (
            m1.get("dpc_releases_sent_total", 0.0) - m0.get("dpc_releases_sent_total", 0.0)
        ) / idle
        self.res["idle_behind"] = (m0.get("dpc_catchup_ticks_behind", math.nan),
                                   m1.get("dpc_catchup_ticks_behind", math.nan))
        self.res["idle_cpu_per_s"] = [(cpu_seconds(pid) - a) / idle
                                      for a, pid in zip(c0, pids, strict=True)]
        self.res["idle_threads_per_s"] = [{k: v / idle for k, v in
                                           cpu_diff(a, thread_cpu(pid)).items()}
                                          for a, pid in zip(t0s, pids, strict=True)]
        self.res["idle_rss"] = [rss_bytes(pid) for pid in pids]
        if spy is not None:
            spy.wait(60)

    def worker_metrics(self) -> dict[str, float]:
        """The first worker's metrics (its /metrics page), by series; empty where the page
        did not answer within 30 s (a worker busy catching up may not)."""
        return scrape_metrics(self.dep.settings.metrics_port, timeout_s=30)

    def caught_up(self, timeout_s: float) -> float:
        """Wait until the first worker has sealed every tick whose sealing time passed
        (dpc_catchup_ticks_behind at most 1: between two markers); seconds waited. A first
        start of many counters falls behind while it creates them (the ticks sealed
        meanwhile come due at once), and works that backlog off at its full speed."""
        def done() -> bool:
            self.check_alive()
            behind = self.worker_metrics().get("dpc_catchup_ticks_behind", math.nan)
            return behind <= 1
        try:
            return wait_until(done, timeout_s, "the worker caught up", interval_s=1.0)
        except TimeoutError:
            return math.nan  # measured anyway: the report shows the ticks behind

    def warmup_s(self, rate: float) -> float:
        """The load's warm-up: long enough for the first events' ticks to be sealed and
        released, and for one sweep of the load over every counter. An assignment drops
        the decoded counters (`StageShell.on_revoked`), so each worker of a group that
        just settled decodes every counter at its first event after it, once; one worker
        that created its counters holds them decoded. Without the sweep, a multi-worker
        window at 1,000 events/s over 10,000 counters held those one-time decodes and one
        worker's did not."""
        s = self.dep.settings
        return (s.tick_ms + s.lateness_ms) / 1000 + 2.0 + self.counters / rate

    def load(self, rate: float, seconds: float, kill: BrokerKill | None = None) -> Produced:
        """A paced producer: `rate` events/s cycling over the counters, each stamped with
        the wall clock; a warm-up (`warmup_s`), then the measured window of `seconds`;
        `kill` strikes in its middle."""
        pids = self.pids
        warmup = self.warmup_s(rate)
        stats = Produced()
        producer = kafka_io.make_producer(self.conf)
        cpu0: list[float] = []
        th0: list[dict[str, float]] = []
        machine0 = psutil.cpu_times()
        n0 = w0_ms = sent = 0
        peak = [0] * len(pids)
        next_rss = 0.0
        t_load = time.monotonic()
        t_win, t_end = t_load + warmup, t_load + warmup + seconds
        striking: tuple[threading.Thread, list[BaseException]] | None = None
        while (now := time.monotonic()) < t_end:
            if kill is not None and striking is None and now >= t_win + seconds / 2:
                striking = kill.start(self.dep)
            if not cpu0 and now >= t_win:
                cpu0 = [cpu_seconds(pid) for pid in pids]
                th0 = [thread_cpu(pid) for pid in pids]
                machine0 = psutil.cpu_times()
                n0, w0_ms = sent, int(time.time() * 1000)
                self.res["chl0"] = records_in(self.conf, self._changelogs())
                self.window_edge(True)
            if now >= next_rss:
                peak = [max(p, rss_bytes(pid)) for p, pid in zip(peak, pids, strict=True)]
                next_rss = now + RSS_SAMPLE_S
            ts = int(time.time() * 1000)
            while sent < int((now - t_load) * rate):
                produce_one(producer, self.dep.topics.input, self.event(sent, ts), stats)
                sent += 1
            producer.poll(0)
            time.sleep(0.005)  # pacing of the load generator
        cpu1 = [cpu_seconds(pid) for pid in pids]
        machine1, w1_ms = psutil.cpu_times(), int(time.time() * 1000)
        self.window_edge(False)
        r = self.res
        r["threads"] = [cpu_diff(a, thread_cpu(pid)) for a, pid in zip(th0, pids, strict=True)]
        if striking is not None:
            striking[0].join()
            if striking[1]:
                raise striking[1][0]
            r["broker_down_s"] = kill.down_s if kill is not None else 0.0
            # The restarted node is up, but may not answer the group listing below yet.
            r["cluster_answers_s"] = wait_until(self._groups_listed, 300,
                                                "every broker answering after the kill", 1.0)
        r["machine_busy"] = machine_busy(machine0, machine1)
        r["loadavg"] = os.getloadavg()[0]
        r["changelog_records"] = records_in(self.conf, self._changelogs()) - r.pop("chl0")
        r["rss"] = [rss_bytes(pid) for pid in pids]
        r["rss_peak"] = [max(p, q) for p, q in zip(peak, r["rss"], strict=True)]
        r["assign_end"] = self.named_assignment()
        ingest = [g for g in groups_with_prefix(self.conf, self.group) if g != self.group]
        r["ingest_groups"] = {g: sorted(map(len, group_assignment(
            self.conf, g, self.dep.topics.input).values())) for g in ingest}
        if producer.flush(60) or stats.errors:
            raise RuntimeError("load generator: undelivered events")
        r["events"], r["window_events"] = sent, sent - n0
        r["window"] = (w0_ms, w1_ms)
        r["window_s"] = (w1_ms - w0_ms) / 1000
        r["cpu"] = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
        r["cpu_per_event"] = sum(r["cpu"]) / max(1, r["window_events"])
        return stats

    def event(self, i: int, ts: int) -> bytes:
        """The load's `i`-th input event, stamped `ts`: cycling over the counters."""
        return event_value(self.names[(i * 7919) % self.counters], ts)

    def window_edge(self, start: bool) -> None:
        """Called by `load` just after it read the workers' CPU at the start of the
        measured window (`start`) and at its end (a subclass reads more there)."""

    def _groups_listed(self) -> bool:
        """Whether every broker answers the group listing."""
        try:
            groups_with_prefix(self.conf, self.group)
        except (TimeoutError, KafkaException):
            return False
        return True

    def _changelogs(self) -> list[str]:
        return topics_matching(self.conf, self.group, "changelog")

    def analyze(self, stats: Produced) -> None:
        """Catch-up (every event on the timeline, sealed and committed), then the window's
        figures from the topics."""
        r, view = self.res, self.view
        s = self.dep.settings
        acc = wait_accounted(view, r["events"], 300, self.procs[0].log_tail)
        r["caught_up"] = acc is not None
        if acc is not None and acc.end is not None and acc.last_batch is not None:
            r["ingest_delay_ms"] = acc.last_batch - stats.last_ts
            r["accounted_delay_ms"] = acc.end - stats.last_ts
            r["seal_lag_ms"] = acc.seal_lag
            r["released"] = acc.released
        else:
            view.update()
            late = view.account()
            r["missing"] = r["events"] - late.events
            r["pending"] = late.pending
        self.state_dirs()
        w0_ms, w1_ms = r["window"]
        batches = [n for log in view.logs.values() for _o, ts, _g, n in log.batches
                   if w0_ms <= ts <= w1_ms]
        r["window_batches"] = len(batches)
        r["window_batch_events"] = sum(batches)
        r["window_changelog"] = sum(w0_ms <= t <= w1_ms for t in view.changelog_ts)
        r["window_applied"] = view.applied_by(w1_ms) - view.applied_by(w0_ms)
        lags = [x for _t, x in view.marker_lags(w0_ms, w1_ms)]
        r["marker_lag"] = pcts(lags)
        r["marker_lag_n"] = len(lags)
        # Kept up: 95% of the window's markers were applied within one tick of their
        # append, i.e. before the next marker came (no queue of markers behind the operator).
        # A marker is committed by the first checkpoint after it was applied.
        r["kept_up"] = (bool(lags)
                        and r["marker_lag"][1] <= s.tick_ms + s.checkpoint_interval_ms())
        lat = view.latencies(w0_ms, w1_ms)
        r["latency"] = pcts([x for _t, x in lat])
        r["latency_n"] = len(lat)
        third = (w1_ms - w0_ms) / 3
        r["first_third"] = pcts([x for t, x in lat if t < w0_ms + third])[:2]
        r["last_third"] = pcts([x for t, x in lat if t >= w1_ms - third])[:2]
        r["marker_first_third"] = pcts([x for t, x in view.marker_lags(w0_ms, w1_ms)
                                        if t < w0_ms + third])[:2]
        r["marker_last_third"] = pcts([x for t, x in view.marker_lags(w0_ms, w1_ms)
                                       if t >= w1_ms - third])[:2]
        r["not_log_append"] = (stats.not_log_append + view.not_log_append
                               + (acc.not_log_append if acc is not None else 0))

    def replay(self) -> None:
        """Every worker stopped cleanly, then `python -m processor replay` over the
        deployment (the campaign's `replay_cli`): its verdict and differences."""
        from processor.devtools.campaign import replay_cli

        self.res["stop_exits"] = exits = [w.stop() for w in self.procs]
        # A worker that exited before the stop (the kill took its brokers): why.
        self.res["exit_logs"] = {f"worker{i + 1}": w.log_tail(15)
                                 for i, (w, code) in enumerate(zip(self.procs, exits,
                                                                   strict=True)) if code}
        self.res["replay"] = replay_cli(self.dep.worker.config_path, REPLAY_TIMEOUT_S)

    def state_dirs(self) -> None:
        dirs = {f"worker{i + 1}": Path(w.config_path).parent / _state_name(i)
                for i, w in enumerate(self.procs)}
        self.res["state"] = {w: dir_sizes(d) for w, d in dirs.items()}
        self.res["dbs"] = {w: partition_dbs(d) for w, d in dirs.items()}

    def restore(self, timeout_s: float = 900, ready_s: float = 120,
                stop_s: float = 300) -> None:
        """Stop every worker; start a fresh one with an empty state dir in the same group.
        restore_s = from its start until it committed a batch on every timeline partition
        (the first partition value `p/<p>` appended after its start: its table came back
        from the changelog and the operator applies the timeline again); ready_s = until
        its /readyz answers 200 (it also caught up with the ticks sealed while no worker
        ran: a marker applied within a tick of now on each partition), at most `ready_s`
        more. The workers' stop is timed and its exit codes kept (stop_s, stop_exits): a
        clean stop writes every counter's deferred progress, so what the fresh worker
        reseals depends on it; up to `stop_s` for it, then SIGKILL (exit code -9)."""
        began = time.monotonic()
        self.res["stop_exits"] = [w.stop(timeout_s=stop_s) for w in self.procs]
        self.res["stop_s"] = time.monotonic() - began
        self.view.update()
        fresh = self.new_worker("fresh")
        port = load_settings(fresh.config_path, env={}).metrics_port
        self.procs.append(fresh)
        t0_ms = int(time.time() * 1000)
        t0 = time.monotonic()
        fresh.start()

        def alive() -> bool:
            if not fresh.alive():
                raise RuntimeError("fresh worker exited: " + fresh.log_tail())
            return True

        def committed() -> bool:
            self.view.update()
            return alive() and all(any(c[0] >= t0_ms for c in cs)
                                   for cs in self.view.commits.values())
        r = self.res
        try:
            wait_until(committed, timeout_s, "the fresh worker's first commits", 0.5)
            firsts = [min(c[0] for c in cs if c[0] >= t0_ms) for cs in self.view.commits.values()]
            r["restore_s"] = (max(firsts) - t0_ms) / 1000
            r["restore_rss"] = rss_bytes(fresh.proc.pid) if fresh.proc else 0
            wait_until(lambda: alive() and _http_ok(f"http://127.0.0.1:{port}/readyz"),
                       ready_s, "the fresh worker ready", 0.5)
            r["ready_s"] = time.monotonic() - t0
        except TimeoutError:
            r.setdefault("restore_rss", rss_bytes(fresh.proc.pid) if fresh.proc else 0)
            r["restore_waited_s"] = time.monotonic() - t0
        r["restore_changelog_records"] = records_in(self.conf, self._changelogs())
        # The worker's own account of its start's bulk load (records, seconds, records/s).
        loaded = _BULK_LOAD.search(fresh.log_tail(2000))
        if loaded is not None:
            r["bulk_load"] = [float(x) for x in loaded.groups()]
        checks = _CHECKS.search(fresh.log_tail(2000))
        r["start_checks"] = checks.group(1) if checks is not None else ""
        r["start_marks"] = start_marks(fresh.log_tail(2000), t0_ms)

    def takeover(self, timeout_s: float = 300) -> None:
        """SIGKILL the worker that joined (`join`); the survivor takes its partitions over
        from its standby copies. reassigned_s = from the kill to the first reading of the
        group's description (polled every 0.1 s) with the survivor alone holding every
        timeline partition: the group's reassignment (the session timeout is most of
        it); takeover_s = from that reading to the survivor's first commit (a partition
        value `p/<p>` appended after the kill) on each partition it took over, and to its
        first commit on every partition (a rebalance revokes and reassigns its own too);
        its RSS then."""
        named = self.named_assignment()
        victim, survivor = self.procs[1], self.procs[0]
        taken = sorted(named.get("worker2", []))
        every = sorted(p for ps in named.values() for p in ps)
        r = self.res
        r["takeover_taken"] = taken
        self.view.update()
        t_kill_ms = int(time.time() * 1000)
        t_kill = time.monotonic()
        victim.kill()

        def alone() -> bool:
            if not survivor.alive():
                raise RuntimeError("the surviving worker exited: " + survivor.log_tail())
            a = self.assignment()
            return len(a) == 1 and sorted(p for ps in a.values() for p in ps) == every
        wait_until(alone, timeout_s, "the group's reassignment to the survivor", 0.1)
        t_re_ms = int(time.time() * 1000)
        r["reassigned_s"] = time.monotonic() - t_kill

        def firsts(parts: Sequence[int]) -> list[int] | None:
            self.view.update()
            got = [min((c[0] for c in self.view.commits[p] if c[0] >= t_kill_ms), default=0)
                   for p in parts]
            return None if 0 in got else got
        wait_until(lambda: firsts(every) is not None, timeout_s,
                   "the survivor's commits on every partition", 0.25)
        taken_at, every_at = firsts(taken) or [], firsts(every) or []
        r["takeover_s"] = (max(taken_at, default=t_re_ms) - t_re_ms) / 1000
        r["takeover_all_s"] = (max(every_at) - t_re_ms) / 1000
        r["takeover_rss"] = rss_bytes(survivor.proc.pid) if survivor.proc else 0

    def close(self) -> None:
        self.ledger.close()
        self.res["logs"] = self.children.close_deployment(self.dep)
        try:
            self.view.update()  # everything the workers wrote until they stopped
            self.res["live_keys"] = len(self.view.live)
            self.res["live_bytes"] = sum(self.view.live.values())
        finally:
            self.view.close()


def _http_ok(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _state_name(i: int) -> str:
    # isolated_deployment's first worker uses "state"; add_worker(label) "<label>-state".
    return "state" if i == 0 else f"worker{i + 1}-state"


def steady_run(conf: Mapping[str, str], bootstrap: str, tmp: Path, workers: int,
               counters: int, rate: float, seconds: float, children: Children,
               standby: int = 1, worker_settings: Mapping[str, Any] | None = None,
               kill: BrokerKill | None = None) -> dict[str, Any]:
    """Phases 2-3: `workers` workers, `counters` counters, a paced load of `rate` events/s
    measured over `seconds` (see the module docstring); `standby` = standby_replicas,
    `worker_settings` further settings of the deployment; `kill`: a broker killed in the
    middle of the window, then the deployment replayed."""
    run = SteadyRun(conf, bootstrap, tmp, children, counters, f"w{workers}", standby,
                    worker_settings)
    run.res.update(workers=workers, rate=rate)
    try:
        run.create()
        run.join(workers)
        run.idle(min(SETTLE_S, seconds / 3), min(IDLE_S, seconds / 3))
        stats = run.load(rate, seconds, kill)
        run.analyze(stats)
        if kill is not None:
            run.replay()
    finally:
        run.close()
    return run.res


def idle_run(conf: Mapping[str, str], bootstrap: str, tmp: Path, counters: int,
             seconds: float, children: Children, standby: int = 1,
             restore: bool = True, worker_settings: Mapping[str, Any] | None = None,
             window_after_s: float = 0.0, profile: Path | None = None
             ) -> dict[str, Any]:
    """Phase `idle`: one worker with `counters` declared counters and no input: its CPU-s
    per second over `seconds` (after a settle pause, and no earlier than `window_after_s`
    after the counters' first tick) and RSS; then (with `restore`) the restore of that
    state on a fresh worker with an empty state dir. `profile`: py-spy's raw samples of
    the worker over the window (the GIL's holder, by thread) written there."""
    run = SteadyRun(conf, bootstrap, tmp, children, counters, "idle", standby,
                    worker_settings)
    run.res.update(workers=1, rate=0.0)
    try:
        run.create()
        # The ticks sealed while it created the counters come due at once: the window
        # measures idleness only once that backlog is worked off.
        run.res["caught_up_s"] = run.caught_up(CATCH_UP_MAX_S)
        # Each counter's first write at the deferral bound falls 4 to 5 heartbeat
        # intervals after its first tick: a window meant to hold none starts after it.
        wait = window_after_s - (time.time() - run.start_ms / 1000) - SETTLE_S
        if wait > 0:
            time.sleep(wait)
        run.idle(SETTLE_S, seconds, profile)
        # Shown at once: the end of a run of a million counters reads every release back
        # (`close`), which may fail after the window's figures were taken.
        print("\n".join(_idle_window_lines(run.res)), flush=True)
        run.res["assign_end"] = run.named_assignment()
        run.state_dirs()
        if restore:
            run.restore()
    finally:
        run.close()
    return run.res


def takeover_run(conf: Mapping[str, str], bootstrap: str, tmp: Path, counters: int,
                 seconds: float, children: Children, standby: int = 1,
                 worker_settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Phase `takeover`: two workers with `counters` declared counters, no input, standby
    replicas (`standby`, at least 1 for a takeover from standby copies); after the
    assignment is stable and a pause, the idle cost over `seconds`, then the joiner
    SIGKILLed and the survivor's takeover timed (`SteadyRun.takeover`)."""
    run = SteadyRun(conf, bootstrap, tmp, children, counters, "takeover", standby,
                    worker_settings)
    run.res.update(workers=2, rate=0.0)
    try:
        run.create()
        run.join(2)
        run.idle(SETTLE_S, seconds)
        run.takeover()
        run.res["assign_end"] = run.named_assignment()
    finally:
        run.close()
    return run.res


# ------------------------------------------------------------------------ report

def _mib(b: float) -> str:
    return f"{b / 2**20:.1f} MiB"



def _log_lines(found: Sequence[Mapping[str, Any]]) -> list[str]:
    count = sum(int(f["count"]) for f in found)
    examples = list(dict.fromkeys(e for f in found for e in f["examples"]))[:3]
    return [f"  worker logs: {count} warning/error line(s)"
            + "".join(f"\n    {e}" for e in examples)]


def report_steady(r: Mapping[str, Any], title: str) -> list[str]:
    lines = [f"{title}: {r['workers']} worker(s), {r['counters']:,} counters, "
             f"{r['rate']:,.0f} events/s, tick {r['tick_ms']} ms, lateness "
             f"{r['lateness_ms']} ms, checkpoint {r.get('checkpoint_ms', 500)} ms"]
    lines.append(f"  counters created (ledger complete) {r['created_s']:.1f} s after the "
                 f"first worker started" + (f"; the other workers joined and the assignment "
                                           f"was stable after {r['join_s']:.1f} s"
                                           if "join_s" in r else ""))
    verdict = "yes" if r["kept_up"] else "NO (markers queued behind the operator)"
    ml50, ml95, mlmax = r["marker_lag"]
    lines.append(f"  kept up during the window: {verdict}: markers committed p50 {ml50:.0f} / "
                 f"p95 {ml95:.0f} / max {mlmax:.0f} ms after their append (n="
                 f"{r['marker_lag_n']}; kept up: p95 <= one tick + the checkpoint interval, "
                 f"{r['tick_ms'] + r.get('checkpoint_ms', 500)} ms); "
                 f"p50/p95 in the window's first third {r['marker_first_third'][0]:.0f}/"
                 f"{r['marker_first_third'][1]:.0f} ms, last third "
                 f"{r['marker_last_third'][0]:.0f}/{r['marker_last_third'][1]:.0f} ms")
    if r["caught_up"]:
        lines.append(f"  caught up after the load: yes; last input record -> its timeline "
                     f"batch {r['ingest_delay_ms']} ms, -> the commit of the marker sealing "
                     f"the last events {r['accounted_delay_ms']} ms (that marker's own lag "
                     f"{r['seal_lag_ms']} ms; lateness + the rest of the tick, "
                     f"{r['lateness_ms']} - {r['tick_ms'] + r['lateness_ms']} ms, is the wait "
                     "for the seal)")
    else:
        lines.append(f"  caught up after the load: NO: {r['missing']:,} of {r['events']:,} "
                     f"events not on the timeline, partitions {r['pending']} not sealed and "
                     "committed, at the deadline (5 min after the load)")
    if "replay" in r:
        rp = r["replay"]
        lines.append(f"  broker killed mid-window, restarted {r['broker_down_s']:.0f} s later;"
                     f" nothing lost: {'yes' if r['caught_up'] else 'NO'}; workers stopped "
                     f"(exit {r['stop_exits']}); replay: exit {rp['exit']}, verdict "
                     f"{rp.get('verdict', 'none')}, {rp.get('differences', '?')} "
                     f"difference(s) {rp.get('first', rp.get('error', ''))}")
        for w, tail in r["exit_logs"].items():
            lines.append(f"  {w} exited before the stop; its log ends:\n    "
                         + tail.replace("\n", "\n    "))
    p50, p95, mx = r["latency"]
    lines.append(f"  seal->release latency over the window: p50 {p50:.0f} ms, p95 {p95:.0f} "
                 f"ms, max {mx:.0f} ms (n={r['latency_n']:,}); p50/p95 in the window's "
                 f"first third {r['first_third'][0]:.0f}/{r['first_third'][1]:.0f} ms, last "
                 f"third {r['last_third'][0]:.0f}/{r['last_third'][1]:.0f} ms")
    for w, d in r["state"].items():
        total = d["sst"] + d["wal"] + d["other"]
        lines.append(f"  {w}: RocksDB dir {_mib(total)} (SST {_mib(d['sst'])}, WAL "
                     f"{_mib(d['wal'])}, other {_mib(d['other'])}; {_mib(d['disk'])} "
                     f"allocated on disk); per-partition DBs "
                     f"{ {p: _mib(b) for p, b in sorted(r['dbs'][w].items())} }")
    w1 = r["state"]["worker1"]
    live = max(1, r["live_bytes"])
    lines.append(f"  state table live size: {r['live_keys']:,} keys, {_mib(r['live_bytes'])};"
                 f" ratio RocksDB dir / live = "
                 f"{(w1['sst'] + w1['wal'] + w1['other']) / live:.2f} (worker1; target"
                 f" <= 3); without the WAL {(w1['sst'] + w1['other']) / live:.2f}")
    lines.append(f"  worker RSS at the end: {', '.join(_mib(b) for b in r['rss'])}; peak "
                 f"(sampled every {RSS_SAMPLE_S:.0f} s under load) "
                 f"{', '.join(_mib(b) for b in r['rss_peak'])}; idle before the load "
                 f"{', '.join(_mib(b) for b in r['idle_rss'])}")
    lines.append(f"  machine over the window: {r['machine_busy']:.0%} of its "
                 f"{psutil.cpu_count()} CPUs busy (all processes), load average "
                 f"{r['loadavg']:.1f} at its end")
    ev = max(1, r["window_events"])
    lines.append(f"  work in the window: {r['window_batches']:,} timeline batch records "
                 f"({r['window_batch_events'] / max(1, r['window_batches']):.1f} events each), "
                 f"{r['window_changelog'] / ev:.2f} changelog records per event")
    lines.append(f"  CPU over the window ({r['window_s']:.1f} s, {r['window_events']:,} "
                 f"events): {', '.join(f'{c:.1f}' for c in r['cpu'])} CPU-s -> "
                 f"{r['cpu_per_event'] * 1e3:.3f} CPU-ms per event; idle before the load: "
                 f"{', '.join(f'{c:.2f}' for c in r['idle_cpu_per_s'])} CPU-s/s")
    lines += _cpu_lines(r)
    lines += _log_lines([r["logs"]])
    lines.append(f"  timeline partitions held: before the join {r['assign_before']}, at the "
                 f"window start {r['assign_start']}, at its end {r['assign_end']}; ingest "
                 f"group members' input partition counts {r['ingest_groups']}")
    return lines


def _cpu_lines(r: Mapping[str, Any]) -> list[str]:
    """Per worker: CPU over the window, its idle rate times the window, the rest (the
    load's), each by thread group."""
    out = []
    w = r["window_s"]
    for i, (cpu, idle, th, ith) in enumerate(zip(r["cpu"], r["idle_cpu_per_s"], r["threads"],
                                               r["idle_threads_per_s"], strict=True)):
        groups = ", ".join(f"{g} {th.get(g, 0.0):.1f}/{ith.get(g, 0.0) * w:.1f}"
                           for g in sorted(set(th) | set(ith)))
        out.append(f"  worker{i + 1}: {cpu:.1f} CPU-s in the window, idle rate x window "
                   f"{idle * w:.1f}, load's {cpu - idle * w:.1f}; by thread (window/idle x "
                   f"window): {groups}")
    return out


def total_cpu_per_event(r: Mapping[str, Any]) -> float:
    """All CPU of the workers over the window / the events produced in it."""
    return float(sum(r["cpu"])) / max(1, int(r["window_events"]))


def marginal_cpu_per_event(r: Mapping[str, Any]) -> float:
    """(CPU over the window - each worker's idle CPU rate x the window) / events."""
    idle = sum(r["idle_cpu_per_s"]) * r["window_s"]
    return float(sum(r["cpu"]) - idle) / max(1, int(r["window_events"]))


def applied_cpu_per_event(r: Mapping[str, Any]) -> float:
    """All CPU of the workers over the window / the events the operator committed in it
    (differs from the produced count when a run falls behind or catches up)."""
    return float(sum(r["cpu"])) / max(1, int(r.get("window_applied", 0)))


def _span(xs: Sequence[float], fmt: str = ".3f") -> str:
    return (f"{min(xs):{fmt}}" if len(xs) == 1 or min(xs) == max(xs)
            else f"{min(xs):{fmt}} - {max(xs):{fmt}}")


def report_scaleout(sets: Sequence[Mapping[int, Mapping[str, Any]]],
                    counts: Sequence[int]) -> list[str]:
    """Per set (one run per worker count of `counts`, one after the other, order rotated
    between sets; a run that had no result is missing from its set): CPU per event, total
    and marginal, and each worker count's ratio to 1 worker; then the ranges over the
    sets."""
    done = [r for runs in sets for r in runs.values()]
    if not done:
        return ["Phase scaleout: no run had a result"]
    first = done[0]
    lines = [f"Phase scaleout: CPU-ms per event (user + system of the worker processes "
             f"and all their threads; standby_replicas = {first.get('standby_replicas', 1)}; "
             f"{len(sets)} set(s) of {', '.join(map(str, counts))} worker(s), order rotated)",
             f"  {'set':<4}{'workers':>8}{'total':>8}{'ratio':>7}{'marginal':>10}{'ratio':>7}"
             f"{'idle CPU-s/s':>22}{'ev/batch':>10}{'chlog/ev':>10}  kept up  applied  busy"
             "  order"]
    ratios: dict[int, tuple[list[float], list[float], list[float]]] = {
        w: ([], [], []) for w in counts}
    for k, runs in enumerate(sets):
        base = runs.get(1)
        for w in counts:
            if w not in runs:
                lines.append(f"  {k + 1:<4}{w:>8}  no result")
                continue
            r = runs[w]
            t, m = total_cpu_per_event(r), marginal_cpu_per_event(r)
            rt = rm = float("nan")
            if base is not None:
                rt, rm = t / total_cpu_per_event(base), m / marginal_cpu_per_event(base)
                ratios[w][0].append(rt)
                ratios[w][1].append(rm)
                ratios[w][2].append(applied_cpu_per_event(r) / applied_cpu_per_event(base))
            lines.append(
                f"  {k + 1:<4}{w:>8}{t * 1e3:>8.3f}{rt:>7.2f}{m * 1e3:>10.3f}{rm:>7.2f}"
                f"{'+'.join(f'{c:.3f}' for c in r['idle_cpu_per_s']):>22}"
                f"{r['window_batch_events'] / max(1, r['window_batches']):>10.1f}"
                f"{r['window_changelog'] / max(1, r['window_events']):>10.2f}"
                f"  {'y' if r['kept_up'] else 'N':>7}"
                f"  {r.get('window_applied', 0) / max(1, r['window_events']):>7.0%}"
                f"  {r['machine_busy']:>4.0%}  {'-'.join(r.get('order', []))}")
    for w in counts[1:]:
        tot, marg, app = ratios[w]
        if tot:
            lines.append(f"  ratio {w} workers / 1 worker: total {_span(tot, '.2f')}, "
                         f"marginal {_span(marg, '.2f')} (target 0.8 - 1.2); total per "
                         f"event applied in the window {_span(app, '.2f')}")
    killed = [r for runs in sets for r in runs.values() if "replay" in r]
    if killed:
        lost = sum(not r["caught_up"] for r in killed)
        same = sum(r["replay"].get("verdict") == "identical" for r in killed)
        lines.append(f"  broker killed mid-window in {len(killed)} run(s): nothing lost in "
                     f"{len(killed) - lost}, replay identical in {same}")
    lines.append("  total = all CPU of the workers over the window / events produced in it; "
                 "marginal = the same less each worker's idle CPU rate (measured with no "
                 "input just before the load) x the window; idle in CPU-s per second; "
                 "applied = events the operator committed in the window / events produced "
                 "in it (100% in a steady state)")
    for k, runs in enumerate(sets):
        for w in counts[1:]:
            if w not in runs:
                continue
            r = runs[w]
            lines.append(f"  set {k + 1}, {w} workers: partitions held {r['assign_end']} "
                         f"(worker1 alone before the join: {r['assign_before']['worker1']});"
                         " per-partition RocksDB dirs "
                         + "; ".join(f"{n} " + ", ".join(f"{p}: {_mib(b)}" for p, b in
                                                         sorted(d.items()))
                                     for n, d in r["dbs"].items()))
    if not all(r.get("kept_up") for runs in sets for r in runs.values()):
        lines.append("  NOTE: a run that did not keep up worked on larger batches than the "
                     "load alone makes, so its CPU per event is not the steady-state figure")
    return lines


def report_takeover(r: Mapping[str, Any]) -> list[str]:
    """Phase takeover: a killed worker's partitions taken over by the survivor."""
    lines = [f"Phase takeover: 2 workers, {r['counters']:,} declared counters, no input, "
             f"standby replicas {r['standby_replicas']}, tick {r['tick_ms']} ms"]
    lines.append(f"  counters created {r['created_s']:.1f} s after the first worker "
                 f"started; the second joined in {r.get('join_s', 0):.1f} s; assignment "
                 f"{r['assign_start']}; idle RSS " + ", ".join(_mib(b) for b in r["idle_rss"]))
    if "reassigned_s" in r:
        lines.append(f"  worker2 SIGKILLed: the group reassigned its partitions "
                     f"{r['takeover_taken']} to worker1 {r['reassigned_s']:.1f} s later "
                     "(session timeout); worker1's first commit on each of them "
                     f"{r['takeover_s']:.1f} s after that reassignment, on every partition "
                     f"{r['takeover_all_s']:.1f} s; its RSS {_mib(r['takeover_rss'])}; "
                     f"load average {os.getloadavg()[0]:.2f} at the end")
    lines += _log_lines([r["logs"]])
    return lines


def _idle_window_lines(r: Mapping[str, Any]) -> list[str]:
    """Phase idle's window: when it began, its CPU, RSS, releases and catch-up."""
    lines: list[str] = []
    lines.append(f"  counters created (ledger complete) {r['created_s']:.1f} s after the "
                 "worker started")
    th = r["idle_threads_per_s"][0]
    lines.append(f"  the window began {r['window_at_s']:.0f} s after the counters' first "
                 "tick")
    lines.append(f"  idle cost over {r['idle_s']:.0f} s: {r['idle_cpu_per_s'][0]:.3f} CPU-s "
                 "per second (" + ", ".join(f"{g} {v:.3f}" for g, v in sorted(th.items()))
                 + f"); RSS {_mib(r['idle_rss'][0])}; load average "
                 f"{os.getloadavg()[0]:.2f} at the end")
    if "caught_up_s" in r:
        c = r["caught_up_s"]
        lines.append("  caught up with the ticks sealed meanwhile " + (
            f"{c:.1f} s after that" if c == c else f"NOT within {CATCH_UP_MAX_S:.0f} s"))
    if "idle_releases_per_s" in r:
        b0, b1 = r["idle_behind"]
        lines.append(f"  releases sent in the window {r['idle_releases_per_s']:,.0f}/s; ticks "
                     f"behind at its start {b0:.0f}, at its end {b1:.0f}")
    return lines


def report_idle(r: Mapping[str, Any]) -> list[str]:
    """Phase idle: the idle cost of many declared counters, and their restore."""
    lines = [f"Phase idle: 1 worker, {r['counters']:,} declared counters, no input, tick "
             f"{r['tick_ms']} ms"]
    lines += _idle_window_lines(r)
    d = r["state"]["worker1"]
    lines.append(f"  RocksDB dir {_mib(d['sst'] + d['wal'] + d['other'])}")
    if "restore_s" in r or "restore_waited_s" in r:
        first = (f"first commit on every timeline partition {r['restore_s']:.1f} s after "
                 "its start (process start, group join, changelog restore)"
                 if "restore_s" in r else "no commit on every partition yet")
        ready = (f"ready (/readyz: caught up with the ticks sealed while no worker ran) "
                 f"{r['ready_s']:.1f} s after its start" if "ready_s" in r else
                 f"NOT ready {r.get('restore_waited_s', 0):.0f} s after its start")
        if "stop_s" in r:
            lines.append(f"  the workers stopped in {r['stop_s']:.1f} s, exit code(s) "
                         f"{', '.join(str(c) for c in r['stop_exits'])} (a clean stop writes "
                         "every counter's deferred progress to the changelog)")
        lines.append(f"  restore on a fresh worker (empty state dir, same group): {first}; "
                     f"{ready}; changelog {r['restore_changelog_records']:,} records; its RSS "
                     f"{_mib(r['restore_rss'])}")
        if "bulk_load" in r:
            n, secs, rate = r["bulk_load"]
            lines.append(f"  its bulk load (before joining the group): {n:,.0f} changelog "
                         f"records in {secs:.1f} s, {rate:,.0f} records/s")
        if r.get("start_marks"):
            lines.append("  its start, s after the process start: " + ", ".join(
                f"{k} {v:.1f}" for k, v in r["start_marks"].items())
                + f" (start checks: {r['start_checks']})")
    lines += _log_lines([r["logs"]])
    return lines
