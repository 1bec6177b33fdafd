"""Phase `deployment` of `bench_replay.py`: replay of a real worker's run, against the
time that run took.

One worker (`python -m processor worker`) with --counters declared counters (names
m000000..., all starting at the tick the run starts in) runs for --seconds of wall-clock
time from its start (the creation of the counters included), with a paced input of --rate
events/s (cycling over the counters, each stamped with the wall clock; 0: none), on topics
that keep every record; then it is stopped cleanly (SIGTERM). The deployment's duration
is from the worker's start to its exit. Then `python -m processor replay --config F
--json --quiet` runs --repeats times (a subprocess each, so interpreter start and imports
are in the figure), each timed (wall and CPU of the subprocess) with the load average
before it; every run must say identical. Reported per run: replay wall seconds, the
ratio deployment / replay (target >= 10), timeline records per second of replay, and the
counts of the verdict.

A run that exceeds --replay-timeout seconds is stopped and reported as such (the figure
is then a lower bound). With --keep DIR the deployment's directory (configuration, key,
worker log) stays in DIR, to replay the same topics again on the same broker
(`bench_replay.py --replay-config DIR/.../worker.toml`: `replay_runs`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from stream_io import (
    KEPT,
    Produced,
    Tail,
    create_topics,
    event_value,
    produce_one,
    records_in,
    wait_until,
)

from processor.devtools.deployment import Deployment, isolated_deployment
from processor.stream.kafka import kafka_io


def run_deployment(bootstrap: str, counters: int, seconds: float, rate: float,
                   worker_settings: Mapping[str, Any], parent: str) -> dict[str, Any]:
    """Run the worker (module docstring); returns the deployment and what it did."""
    tick = int(worker_settings.get("tick_ms", 1000))
    start = (int(time.time() * 1000) // tick) * tick
    names = [f"m{i:06d}" for i in range(counters)]
    dep = isolated_deployment(bootstrap, dict.fromkeys(names, start), parent=parent,
                              name="bench-replay-dep", create_topics=False,
                              **dict(worker_settings))
    conf = dep.conf
    t = dep.topics
    create_topics(conf, [t.input, t.timeline, t.counts, t.ledger, t.deadletter],
                  dep.settings.partitions, KEPT)
    ledger = Tail(conf, t.ledger)
    stats = Produced()
    producer = kafka_io.make_producer(conf)
    t0 = time.monotonic()
    dep.worker.start()
    try:
        def created() -> bool:
            if not dep.worker.alive():
                raise RuntimeError("worker exited: " + dep.worker.log_tail())
            ledger.drain()
            return ledger.count >= counters
        created_s = wait_until(created, max(seconds, 600), f"ledger entries for {counters} "
                               "counters", 0.5)
        sent = 0
        while (now := time.monotonic()) < t0 + seconds:
            if not dep.worker.alive():
                raise RuntimeError("worker exited: " + dep.worker.log_tail())
            # Paced: as many events as the elapsed time since the counters exist allows.
            due = int((now - t0 - created_s) * rate)
            while sent < due:
                produce_one(producer, t.input,
                            event_value(names[sent % counters], int(time.time() * 1000)),
                            stats)
                sent += 1
            producer.poll(0)
            time.sleep(0.05)
        producer.flush(30)
    finally:
        code = dep.worker.stop(120)
        ledger.close()
    duration = time.monotonic() - t0
    if code != 0:
        raise RuntimeError(f"worker exit code {code}: " + dep.worker.log_tail())
    return {"dep": dep, "duration_s": duration, "created_s": created_s, "events": stats.count,
            "timeline_records": records_in(conf, [t.timeline]),
            "releases": records_in(conf, [t.counts]),
            "ledger_entries": records_in(conf, [t.ledger])}


def replay_once(config: Path, timeout_s: float) -> dict[str, Any]:
    """One `replay --json --quiet` subprocess: wall, CPU, load average before, verdict."""
    argv = [sys.executable, "-m", "processor", "replay", "--config", str(config),
            "--json", "--quiet"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPC_")}
    load = os.getloadavg()[0]
    c0 = os.times()
    w0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"wall_s": time.perf_counter() - w0, "load": load, "timeout": True}
    wall = time.perf_counter() - w0
    c1 = os.times()
    out: dict[str, Any] = {"wall_s": wall, "load": load, "timeout": False,
                           "cpu_s": (c1.children_user - c0.children_user
                                     + c1.children_system - c0.children_system),
                           "exit": proc.returncode}
    try:
        out["verdict"] = orjson.loads(proc.stdout)
    except orjson.JSONDecodeError:
        out["stderr"] = proc.stderr.decode(errors="replace")[-2000:]
    return out


def replay_runs(config: Path, counters: int, duration_s: float, repeats: int,
                replay_timeout_s: float) -> None:
    """`repeats` replays of the deployment configured in `config`, each against the
    deployment's `duration_s` (also on the topics of a deployment kept with --keep)."""
    for i in range(repeats):
        r = replay_once(config, replay_timeout_s)
        if r["timeout"]:
            print(f"  replay {i + 1}: not done after {r['wall_s']:.0f} s (load "
                  f"{r['load']:.2f}); ratio < {duration_s / r['wall_s']:.2f}", flush=True)
            break
        v = r.get("verdict")
        if v is None:
            raise RuntimeError(f"replay failed (exit {r['exit']}): {r.get('stderr')}")
        c = v["counts"]
        print(f"  replay {i + 1}: {v['verdict']}, {r['wall_s']:.1f} s wall "
              f"({r['cpu_s']:.1f} CPU-s), load {r['load']:.2f}; ratio "
              f"{duration_s / r['wall_s']:.1f}x; "
              f"{c['timeline_records'] / r['wall_s']:,.0f} timeline records/s, "
              f"{counters / r['wall_s']:,.0f} counters/s; "
              f"releases {c['releases']}, ledger {c['ledger']}", flush=True)
        if v["verdict"] != "identical":
            raise RuntimeError(f"replay verdict {v['verdict']}: {v['differences']}")


def deployment_phase(bootstrap: str, counters: int, seconds: float, rate: float,
                     worker_settings: Mapping[str, Any], repeats: int,
                     replay_timeout_s: float, keep: str | None) -> None:
    parent = keep or tempfile.mkdtemp(prefix="bench-replay-dep-")
    Path(parent).mkdir(parents=True, exist_ok=True)
    print(f"deployment: {counters} counters, {seconds:.0f} s, {rate:g} events/s, "
          f"settings {dict(worker_settings)}", flush=True)
    run = run_deployment(bootstrap, counters, seconds, rate, worker_settings, parent)
    dep: Deployment = run["dep"]
    try:
        records = run["timeline_records"]
        print(f"  ran {run['duration_s']:.1f} s (counters created after "
              f"{run['created_s']:.1f} s), {run['events']} events, {records} timeline "
              f"records, {run['releases']} releases, {run['ledger_entries']} ledger "
              f"entries; config {dep.config}", flush=True)
        replay_runs(dep.config, counters, run["duration_s"], repeats, replay_timeout_s)
    finally:
        if keep is None:
            dep.close()
            import shutil
            shutil.rmtree(parent, ignore_errors=True)
