"""Replay throughput: timeline records recomputed per second, in memory and end to end.

Workload (a worker's timeline, built here without a worker): --counters declared counters
(default 1000, README-like settings: ECC, eps 1, tick 100 ms, heartbeat every 60 ticks) on
--partitions timeline partitions (default 4); per tick, --events events (default 40, value
1, random counters) in one batch record per partition that has any, then one "sealed
through" marker per partition, as the leader appends them; --ticks ticks (default 3000:
about 24,000 timeline records).

Phases (each the best of --repeats):
  recompute  `replay.recompute_timeline` (BatchCommit on a DictStore, what replay runs)
             over the in-memory timeline, in one process and in `default_jobs` (one per
             partition, at most one per CPU): records/s;
  compare    `replay.compare` of that recomputation with itself as the published topics;
  end to end (needs a broker: --bootstrap or KAFKA_BOOTSTRAP_SERVERS) the timeline, the
             releases and the ledger entries produced to fresh topics and the worker
             group's offsets committed at the end, then `replay.replay` (snapshot, read,
             recompute, compare) and `python -m processor replay --json --quiet` (a
             subprocess: interpreter start, imports, the same work) timed; both must say
             identical. The CLI's start-up alone (`replay --help`) is timed too, and the
             CLI's rate without it printed.

`--compare H`: the comparison alone, one partition's share of --counters counters with H
heartbeats each, all identical: its bulk paths against its per-record loops
(`comparison.FAST`), alternated, CPU-us per release.

    .venv/bin/python bench/bench_replay.py [--ticks 3000] [--counters 1000] [--events 40]
        [--partitions 4] [--repeats 3] [--bootstrap HOST:PORT] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import os
import pstats
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping

import orjson
from confluent_kafka import Consumer, TopicPartition

from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.stream.kafka import kafka_io
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.records import Event, encode_batch, encode_marker, partition_for
from processor.stream.replay import compare, default_jobs, recompute_timeline, replay

TICK = 100
Timeline = dict[int, list[tuple[int, bytes | None]]]


def workload(s: Settings, ticks: int, events: int, rng: random.Random) -> Timeline:
    names = sorted(s.counters)
    P = s.partitions
    timeline: Timeline = {p: [] for p in range(P)}
    src = 0
    for n in range(1, ticks + 1):
        per: dict[int, list[Event]] = {}
        for _ in range(events):
            c = names[rng.randrange(len(names))]
            per.setdefault(partition_for(c, P), []).append(
                Event(c, n * TICK + rng.randrange(TICK), UNIT, 0, src))
            src += 1
        for p in range(P):
            recs = timeline[p]
            if p in per:
                recs.append((len(recs), encode_batch(per[p])))
            recs.append((len(recs), encode_marker(n)))
    return timeline


def best(repeats: int, fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, CPU) seconds of the fastest of `repeats` calls. CPU counts every thread of
    this process and the processes it waited for (the recomputation's forked jobs, the
    CLI's subprocess): on a machine shared with other load the wall time stretches, the
    CPU time much less."""
    runs = []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), os.times()
        fn()
        t1, c1 = time.perf_counter(), os.times()
        cpu = sum(getattr(c1, f) - getattr(c0, f)
                  for f in ("user", "system", "children_user", "children_system"))
        runs.append((t1 - t0, cpu))
    return min(runs)


def rates(records: int, wall: float, cpu: float) -> str:
    return (f"{wall:7.2f} s {records / wall:>9,.0f} records/s  "
            f"({records / cpu:,.0f} per CPU-second)")


def end_to_end(bootstrap: str, s: Settings, key_secret: bytes, timeline: Timeline,
               repeats: int) -> None:
    from processor.devtools.deployment import isolated_deployment

    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        dep = isolated_deployment(bootstrap, s.counters, parent=tmp, name="bench-replay",
                                  secret=key_secret, base=s)
        key = dep.key
        records = sum(len(v) for v in timeline.values())
        for p, recs in timeline.items():
            kafka_io.produce_all(dep.conf, dep.topics.timeline,
                                 ((None, v or b"") for _o, v in recs), partition=p)
        result = recompute_timeline(dep.settings, key, timeline, {})
        kafka_io.produce_all(dep.conf, dep.topics.ledger,
                             ((e.key(), e.to_json()) for e in result.unsettled_ledger))
        kafka_io.produce_all(dep.conf, dep.topics.counts,
                             ((r.key(), r.to_json()) for r in result.unsettled))
        _commit_end(dep.conf, dep.settings.app_id, dep.topics.timeline, timeline)
        report = replay(dep.settings, key)
        assert report.identical and report.releases.pending == 0, report.summary()
        wall, cpu = best(repeats, lambda: replay(dep.settings, key))
        print(f"end to end (replay.replay)         {records:>7} records "
              f"{rates(records, wall, cpu)}", flush=True)
        argv = [sys.executable, "-m", "processor", "replay", "--config", str(dep.config),
                "--json", "--quiet"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPC_")}
        out = b""

        def cli() -> None:
            nonlocal out
            out = subprocess.run(argv, env=env, capture_output=True, check=True).stdout

        wall, cpu = best(repeats, cli)
        assert orjson.loads(out)["identical"] is True, out
        print(f"end to end (CLI, subprocess)       {records:>7} records "
              f"{rates(records, wall, cpu)}", flush=True)
        # The CLI's fixed cost (interpreter start, imports: numpy, scipy, confluent_kafka),
        # paid once per run whatever the timeline's length: measured apart, so the rate a
        # long audit approaches (records over the rest) is visible next to the short one's.
        help_argv = [sys.executable, "-m", "processor", "replay", "--help"]
        start, _c = best(repeats, lambda: subprocess.run(help_argv, env=env, check=True,
                                                          capture_output=True))
        print(f"  CLI start-up (replay --help)     {start:7.2f} s; without it "
              f"{records / max(wall - start, 1e-9):>9,.0f} records/s", flush=True)


def _commit_end(conf: Mapping[str, str], group: str, topic: str, timeline: Timeline) -> None:
    """Commit the worker group's offsets at the end of the timeline (a caught-up worker)."""
    consumer = Consumer({**conf, "group.id": group, "enable.auto.commit": "false"})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, len(recs))
                                 for p, recs in timeline.items()], asynchronous=False)
    finally:
        consumer.close()


def deployment(args: argparse.Namespace) -> None:
    """Phase deployment: a worker's run, then replay of its topics (its own broker unless
    --bootstrap or KAFKA_BOOTSTRAP_SERVERS names one)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from replay_deployment import deployment_phase
    from stream_io import broker

    with broker(args.bootstrap or None) as bootstrap:
        deployment_phase(bootstrap, args.counters, args.deployment, args.rate,
                         {"tick_ms": args.tick_ms, "mechanism": args.mechanism,
                          "calibration": args.calibration, "epsilon": args.epsilon,
                          "partitions": args.partitions},
                         args.repeats, args.replay_timeout, args.keep)


def compare_phase(counters: int, heartbeats: int, repeats: int) -> None:
    """Phase compare: `replay.compare` of one partition's share (`counters` counters,
    `heartbeats` heartbeats each, every record committed and published as recomputed)
    with its bulk paths and with its per-record loops (`comparison.FAST`), alternated,
    best of `repeats`: CPU-us per release."""
    from processor.stream.replay import comparison
    from processor.stream.replay.comparison import ledger_key, release_key
    from processor.stream.replay.partitioned import split_keyed
    from processor.stream.replay.recompute import Keyed, Recomputed

    fp = "c486bf14c5228811c1ccd31720d7d203251ad3b59ec50ac444db28ce472d1152"
    releases: Keyed = [((c, t, "heartbeat"), orjson.dumps({"counter": c, "tick": t, "kind":
                                                    "heartbeat", "value": 0.0,
                                                    "fingerprint": fp}))
                for c in (f"m{i:07d}" for i in range(counters))
                for t in range(60, 60 * heartbeats + 1, 60)]
    entries: Keyed = [((c, "cr", fp), orjson.dumps({"counter": c, "entry": "created",
                                             "creation": "cr", "fingerprint": fp}))
               for c in (f"m{i:07d}" for i in range(counters))]
    published, rkeys, _ = split_keyed([raw for _k, raw in releases], 1, release_key)
    ledger, lkeys, _ = split_keyed([raw for _k, raw in entries], 1, ledger_key)
    best = {True: float("inf"), False: float("inf")}
    for _ in range(repeats):
        for fast in (True, False):
            comparison.FAST = fast
            got = Recomputed([], [], [], [], 0, 0, _encoded=(releases, [], entries, []))
            t = time.process_time()
            rel, _ent, diffs = compare(got, published[0], ledger[0], totals=False,
                                       keys=(rkeys[0], lkeys[0]))
            best[fast] = min(best[fast], time.process_time() - t)
            assert not diffs and rel.due == len(releases)
    comparison.FAST = True
    print(f"compare, {len(releases):,} releases and {counters:,} ledger entries, all "
          f"identical, CPU-us per release (best of {repeats}): bulk paths "
          f"{best[True] / len(releases) * 1e6:.2f}, per-record loops "
          f"{best[False] / len(releases) * 1e6:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=3000, help="ticks of timeline")
    ap.add_argument("--counters", type=int, default=1000, help="declared counters")
    ap.add_argument("--events", type=int, default=40, help="events per tick")
    ap.add_argument("--partitions", type=int, default=4, help="timeline partitions")
    ap.add_argument("--epsilon", type=float, default=1.0,
                    help="ECC's epsilon (default 1; larger: fewer counters due per tick)")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", ""),
                    help="a broker for the end-to-end phase (default: skip it)")
    ap.add_argument("--compare", type=int, default=0, metavar="HEARTBEATS",
                    help="instead: the comparison alone on --counters counters with "
                    "HEARTBEATS heartbeats each, bulk paths against per-record loops")
    ap.add_argument("--profile", action="store_true",
                    help="print a cProfile of one in-memory recomputation")
    ap.add_argument("--deployment", type=float, default=0.0, metavar="SECONDS",
                    help="instead: run a worker with --counters counters for SECONDS, then "
                    "time the replay CLI on its topics (replay_deployment.py)")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="with --deployment: input events/s (default 0)")
    ap.add_argument("--tick-ms", type=int, default=1000,
                    help="with --deployment: the worker's tick_ms (default 1000)")
    ap.add_argument("--mechanism", default="ecc", help="with --deployment: ecc or simecc")
    ap.add_argument("--calibration", default="paper",
                    help="with --deployment: paper or tight")
    ap.add_argument("--replay-timeout", type=float, default=900.0,
                    help="with --deployment: stop a replay after this many seconds")
    ap.add_argument("--keep", default=None, metavar="DIR",
                    help="with --deployment: keep the deployment's files in DIR")
    ap.add_argument("--replay-config", default=None, metavar="FILE",
                    help="instead: only the replays of a deployment kept with --keep (its "
                    "worker.toml; its broker still up), each against --deployment seconds "
                    "(the duration it printed)")
    args = ap.parse_args()
    if args.replay_config:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from pathlib import Path

        from replay_deployment import replay_runs
        replay_runs(Path(args.replay_config), args.counters, args.deployment or float("nan"),
                    args.repeats, args.replay_timeout)
        return
    if args.deployment:
        deployment(args)
        return
    if args.compare:
        compare_phase(args.counters, args.compare, args.repeats)
        return
    secret = bytes(range(32))
    key = NoiseKey(secret)
    s = with_overrides(Settings(), counters={f"c{i:04d}": 0 for i in range(args.counters)},
                       partitions=args.partitions, tick_ms=TICK, mechanism="ecc",
                       epsilon=args.epsilon, delta=1e-6, heartbeat_ticks=60)
    timeline = workload(s, args.ticks, args.events, random.Random(0))
    records = sum(len(v) for v in timeline.values())
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        recompute_timeline(s, key, timeline, {})
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    result = recompute_timeline(s, key, timeline, {p: len(v) for p, v in timeline.items()})
    for jobs in sorted({1, default_jobs(s)}):
        wall, cpu = best(args.repeats, functools.partial(recompute_timeline, s, key,
                                                         timeline, {}, jobs=jobs))
        print(f"recompute (in memory, jobs={jobs})  {records:>7} records "
              f"{rates(records, wall, cpu)}", flush=True)
    print(f"  ({len(result.settled)} releases, {len(result.settled_ledger)} ledger entries)")
    published = [r.to_json() for r in result.settled]
    ledger = [e.to_json() for e in result.settled_ledger]
    wall, _cpu = best(args.repeats, lambda: compare(result, published, ledger))
    releases, _entries, diffs = compare(result, published, ledger)
    assert not diffs and releases.due == len(published)
    print(f"compare                            {len(published):>7} releases {wall:7.2f} s",
          flush=True)
    if args.bootstrap:
        end_to_end(args.bootstrap, s, secret, timeline, args.repeats)
    else:
        print("end to end: skipped (no --bootstrap, no KAFKA_BOOTSTRAP_SERVERS)")


if __name__ == "__main__":
    main()
