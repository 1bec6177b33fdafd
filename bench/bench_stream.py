"""Stream benchmark: the processor next to its peers on the same broker, in one run.

    python bench/bench_stream.py [--phase throughput|many|scaleout|idle|takeover|open-keys|all]
        [--quick]
        [--events 20000] [--repeat 3] [--loads dense sparse] [--systems ...]
        [--counters 10000] [--rate 1000] [--seconds 60] [--workers 1 2]
        [--cluster [--kill-broker [--broker-down-s 10]]]
        [--quix-python PY] [--bootstrap HOST:PORT] [--json FILE]

Starts a local single-node broker (processor.devtools.kafka; with --cluster a three-node
cluster: replication 3, min ISR 2) unless --bootstrap or KAFKA_BOOTSTRAP_SERVERS names
one. Every deployment (app id, topics, key, config, state
dirs, logs) lives in one temporary directory outside the repository; workers, child
processes and the broker are stopped on exit, error, Ctrl-C or SIGTERM.

Phases (each module's docstring is the exact specification of its figures):

- throughput (`stream_counted.py`): events/s and CPU-ms per COUNTED event of the processor
  (an event counts once its counter's mechanism has stepped it in a batch commit that
  returned, so its release, if any, is acknowledged), Quix Streams' stateful count, a
  Faust Table count, the plain confluent-kafka loop and the plain Faust agent; dense and
  sparse loads; stages one after another, the order rotated per repeat.
- many (`stream_steady.py`): one worker, C counters, a paced load of R events/s for S
  seconds: kept up (marker commit latency p50/p95), seal-to-release p50/p95 (and per
  third of the window), CPU per event, changelog records per event, RSS (peak), state size.
- scaleout: the same load with each of --workers worker processes of one group, one set
  per --repeat, the order rotated: CPU per event total and marginal, ratio to 1 worker.
  With --kill-broker (on --cluster) one broker is SIGKILLed in the middle of each run's
  window and restarted --broker-down-s later; then nothing lost, and the replay identical.
- idle: one worker with C declared counters and no input: CPU-s per second, RSS, the
  releases sent per second, once the worker has worked off the ticks sealed while it
  created the counters; then the restore of that state on a fresh worker (empty state
  dir) timed to its readiness.
- open-keys (`stream_open_keys.py`): one open ECC family in event mode, a key stream of
  --rate events/s for --seconds (half a Zipf(1.1) head of --head-keys keys, half keys never
  seen before) on one worker: kept up, RSS, keys seen and admitted, the admitted keys'
  error against the truth sent, CPU per stepped event, bytes per waiting key stored and in
  memory, the restore on a fresh worker; then the same load on each further --workers
  count of one group: CPU per stepped event against one worker's. --repeat sets of runs,
  the order rotated per set: the ratio of each set and their range.

Clock: every time is a broker append time (all topics the bench creates, and the state
changelog, use LogAppendTime), except the processor's end in phase throughput, which is the
bench's reading of the worker's metric (same host as the broker, see stream_counted).
CPU: user + system seconds of the measured process trees from /proc (psutil).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

import orjson  # noqa: E402
import stream_counted  # noqa: E402
import stream_open_keys  # noqa: E402
from stream_io import client_config, local_kafka  # noqa: E402
from stream_procs import Children  # noqa: E402
from stream_steady import (  # noqa: E402
    BrokerKill,
    idle_run,
    report_idle,
    report_scaleout,
    report_steady,
    report_takeover,
    steady_run,
    takeover_run,
)

if TYPE_CHECKING:
    from processor.devtools.kafka.cluster import LocalKafka


def _repo_litter() -> set[str]:
    """Untracked and ignored paths in the checkout (to report what a run left behind)."""
    out = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=ROOT,
                         capture_output=True, text=True, check=False).stdout
    return {line[3:] for line in out.splitlines() if line[:2] in ("??", "!!")}


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    # The first SIGINT/SIGTERM stops the run; later ones are ignored, so that the cleanup
    # it starts (workers, child processes, broker, temporary directory) runs to its end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def quix_python(given: str | None) -> str | None:
    """The interpreter that runs the Quix peer: --quix-python, $BENCH_QUIX_PYTHON, or this
    one if it has quixstreams (None: the Quix stage is left out, and the report says so)."""
    for cand in (given, os.environ.get("BENCH_QUIX_PYTHON")):
        if cand:
            found = shutil.which(cand) or cand
            if not Path(found).exists():
                raise SystemExit(f"--quix-python {cand!r}: no such interpreter")
            return found
    return sys.executable if importlib.util.find_spec("quixstreams") else None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--phase",
                   choices=("throughput", "many", "scaleout", "idle", "takeover",
                            "open-keys", "all"),
                   default="all", help="all = throughput, then scaleout (which includes many)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 2,000 events once; 500 counters at 200 events/s for 6 s")
    p.add_argument("--events", type=int, help="throughput: events per stage (default 20,000)")
    p.add_argument("--repeat", type=int,
                   help="throughput: repeats (default 3); scaleout, open-keys: sets of "
                   "runs, one per --workers count, order rotated (default 1)")
    p.add_argument("--loads", nargs="+", choices=("dense", "sparse"),
                   default=["dense", "sparse"], help="throughput loads")
    p.add_argument("--dense-counters", type=int, default=200,
                   help="throughput: counters of the dense load (default 200)")
    p.add_argument("--systems", nargs="+", choices=sorted(stream_counted.SYSTEMS),
                   help="throughput: systems to run (default: "
                   + " ".join(stream_counted.DEFAULT_SYSTEMS) + ")")
    p.add_argument("--heartbeat-ticks", type=int,
                   help="throughput: the processor's heartbeat_ticks (default "
                   f"{stream_counted.HEARTBEAT_TICKS}: none); many, scaleout, idle, "
                   "takeover: theirs when given (default: the README configuration's)")
    p.add_argument("--quix-python", help="the Python with quixstreams for the Quix peer "
                   "(default $BENCH_QUIX_PYTHON, or this one if it has quixstreams)")
    p.add_argument("--counters", type=int,
                   help="many/scaleout/idle/takeover counters (default 10,000)")
    p.add_argument("--rate", type=float, help="steady load, events/s (default 1,000)")
    p.add_argument("--seconds", type=float,
                   help="measured window of many/scaleout/idle/takeover (default 60)")
    p.add_argument("--workers", type=int, nargs="+",
                   help="scaleout: worker counts (default 1 2); open-keys: 1 and the "
                   "further counts to compare with it (default 1 3)")
    p.add_argument("--head-keys", type=int, default=10_000,
                   help="open-keys: keys of the Zipf head (default 10,000)")
    p.add_argument("--epsilon", type=float, default=10.0,
                   help="open-keys: the deployment's epsilon (default 10: at 1 an ECC key "
                   "needs about 8,000 events stepped, one per tick, to be admitted)")
    p.add_argument("--seed", type=int, default=0, help="open-keys: the key stream's seed")
    p.add_argument("--standby", type=int, default=1,
                   help="standby_replicas of every deployment (default 1, the README "
                   "configuration; 0 measures scale-out without standby copies)")
    p.add_argument("--checkpoint-ms", type=int,
                   help="checkpoint_ms of every processor deployment (default 0: derived "
                   "from tick and lateness, Settings.checkpoint_interval_ms)")
    p.add_argument("--tick-ms", type=int,
                   help="many/scaleout/idle: the deployments' tick_ms (default 1000, the "
                   "README configuration); the idle cost grows with the ticks per second")
    p.add_argument("--no-restore", action="store_true", help="idle: skip the restore")
    p.add_argument("--window-after", type=float, default=0.0, metavar="S",
                   help="idle: start the window no earlier than S s after the counters' "
                   "first tick (each counter's first write at the deferral bound falls "
                   "DEFERRED_HEARTBEATS + 1-2 heartbeat intervals after it: about 3,900 s "
                   "with the README configuration)")
    p.add_argument("--profile", type=Path, metavar="FILE",
                   help="idle: py-spy record (--gil --threads, raw) of the worker over the "
                   "window into FILE (py-spy installed next to this Python)")
    p.add_argument("--profile-dir", type=Path, metavar="DIR",
                   help="throughput: py-spy record (every thread, raw) of each stage's "
                   "system over its window, one file per stage in DIR (py-spy installed "
                   "next to this Python); a profiled run's figures are not a measurement")
    p.add_argument("--profile-native", action="store_true",
                   help="--profile-dir with native frames (py-spy --native)")
    p.add_argument("--cluster", action="store_true",
                   help="a local three-node cluster (replication 3, min ISR 2) instead of "
                   "one broker")
    p.add_argument("--kill-broker", action="store_true",
                   help="scaleout on --cluster: SIGKILL one broker in the middle of each "
                   "run's window, restart it --broker-down-s later; then check that "
                   "nothing was lost and that `processor replay` finds the deployment "
                   "identical")
    p.add_argument("--broker-down-s", type=float, default=10.0,
                   help="--kill-broker: seconds the killed broker stays down (default 10)")
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", ""))
    p.add_argument("--json", help="also write the results to this file")
    # Test-only: the metric that ends a processor stage (tests/bench's control counts
    # queued events with it and must see the tick-capacity bound broken).
    p.add_argument("--processor-metric", default=stream_counted.DEQUEUED,
                   help=argparse.SUPPRESS)
    return p.parse_args(argv)


def run_throughput(a: argparse.Namespace, ctx: stream_counted.Ctx,
                   results: dict[str, Any]) -> list[str]:
    systems = list(a.systems or stream_counted.DEFAULT_SYSTEMS)
    notes: list[str] = []
    if "quix" in systems and ctx.quix_python is None:
        systems.remove("quix")
        notes.append("  Quix Streams left out: no Python with quixstreams (--quix-python; "
                     "bench/README.md says how to make one)")
    events = a.events or (2000 if a.quick else 20_000)
    repeat = a.repeat or (1 if a.quick else 3)
    load_list = stream_counted.loads(events, a.dense_counters, a.loads)
    print("phase throughput: counted events", flush=True)
    runs = stream_counted.phase_counted(ctx, systems, load_list, repeat)
    results["throughput"] = [r.as_dict() for r in runs]
    return stream_counted.report_counted(runs, systems, load_list) + notes


def steady_settings(a: argparse.Namespace, ctx: stream_counted.Ctx) -> dict[str, Any]:
    """The worker settings of the many/scaleout/idle deployments: the common ones, and
    --tick-ms and --heartbeat-ticks when given (the throughput phase keeps its own 100 ms
    ticks)."""
    out = dict(ctx.worker_settings)
    if a.tick_ms is not None:
        out["tick_ms"] = a.tick_ms
    if a.heartbeat_ticks is not None:
        out["heartbeat_ticks"] = a.heartbeat_ticks
    return out


def rotated(counts: Sequence[int], k: int) -> list[int]:
    """The worker counts in set k's order: each set starts one count further on, so that
    across sets every count runs early and late in the hour."""
    i = k % len(counts)
    return [*counts[i:], *counts[:i]]


def run_scaleout(a: argparse.Namespace, ctx: stream_counted.Ctx, counters: int, rate: float,
                 seconds: float, results: dict[str, Any],
                 cluster: LocalKafka | None = None) -> list[str]:
    lines: list[str] = []
    sets: list[dict[int, dict[str, Any]]] = []
    counts = sorted(set(a.workers or [1, 2]))
    for k in range(a.repeat or 1):
        order = rotated(counts, k)
        got: dict[int, dict[str, Any]] = {}
        for w in order:
            print(f"phase scaleout: {w} worker(s), set {k + 1}", flush=True)
            kill = (BrokerKill(cluster, a.broker_down_s, seed=k * 10 + w)
                    if a.kill_broker and cluster is not None else None)
            try:
                got[w] = steady_run(ctx.conf, ctx.bootstrap, ctx.tmp, w, counters, rate,
                                    seconds, ctx.children, ctx.standby,
                                    steady_settings(a, ctx), kill)
            except TimeoutError as exc:  # a group that never settled: the next run goes on
                lines += _shown([f"Phase scaleout: {w} worker(s) (set {k + 1}): no result: "
                                 f"{exc}"])
                continue
            got[w]["order"] = [str(x) for x in order]
            lines += _shown(report_steady(got[w],
                                          f"Phase scaleout: {w} worker(s) (set {k + 1})"))
        sets.append(got)
    results["scaleout"] = [{str(w): r for w, r in s.items()} for s in sets]
    return lines + _shown(report_scaleout(sets, counts))


def run_phases(a: argparse.Namespace, ctx: stream_counted.Ctx,
               results: dict[str, Any], cluster: LocalKafka | None = None) -> list[str]:
    q = a.quick
    counters = a.counters or (500 if q else 10_000)
    rate = a.rate or (200.0 if q else 1000.0)
    seconds = a.seconds or (6.0 if q else 60.0)
    lines: list[str] = []
    if a.phase in ("throughput", "all"):
        lines += _shown(run_throughput(a, ctx, results))
    if a.phase == "many":
        print("phase many: 1 worker", flush=True)
        r = steady_run(ctx.conf, ctx.bootstrap, ctx.tmp, 1, counters, rate, seconds,
                       ctx.children, ctx.standby, steady_settings(a, ctx))
        results["many"] = r
        lines += _shown(report_steady(r, "Phase many counters"))
    if a.phase in ("scaleout", "all"):
        lines += run_scaleout(a, ctx, counters, rate, seconds, results, cluster)
    if a.phase == "idle":
        print("phase idle: declared counters, no input", flush=True)
        r = idle_run(ctx.conf, ctx.bootstrap, ctx.tmp, counters, seconds, ctx.children,
                     ctx.standby, restore=not a.no_restore,
                     worker_settings=steady_settings(a, ctx),
                     window_after_s=a.window_after, profile=a.profile)
        results["idle"] = r
        lines += _shown(report_idle(r))
    if a.phase == "open-keys":
        lines += run_open_keys(a, ctx, results)
    if a.phase == "takeover":
        print("phase takeover: a worker killed, its partitions taken over", flush=True)
        r = takeover_run(ctx.conf, ctx.bootstrap, ctx.tmp, counters, seconds, ctx.children,
                         ctx.standby, worker_settings=steady_settings(a, ctx))
        results["takeover"] = r
        lines += _shown(report_takeover(r))
    return lines


def run_open_keys(a: argparse.Namespace, ctx: stream_counted.Ctx,
                  results: dict[str, Any]) -> list[str]:
    """Phase open-keys: one worker (and its restore), then each further worker count;
    with --repeat, sets of runs, the order rotated per set (so a drift of the machine
    over the hour does not fall on one worker count's side of every ratio)."""
    rate = a.rate or 3000.0
    seconds = a.seconds or 600.0
    ws = steady_settings(a, ctx)
    ws.setdefault("tick_ms", 100)
    ws["epsilon"] = a.epsilon
    lines: list[str] = []
    counts = sorted(set(a.workers or [1, 3]) | {1})
    sets: list[dict[int, dict[str, Any]]] = []
    for k in range(a.repeat or 1):
        order = rotated(counts, k)
        runs: dict[int, dict[str, Any]] = {}
        for w in order:
            print(f"phase open-keys: {w} worker(s), set {k + 1}", flush=True)
            runs[w] = stream_open_keys.open_keys_run(
                ctx.conf, ctx.bootstrap, ctx.tmp, w, rate, seconds, ctx.children,
                ctx.standby, ws, a.head_keys, a.seed,
                restore=w == 1 and k == 0 and not a.no_restore)
            lines += _shown(stream_open_keys.report_open_keys(runs[w]))
        lines += _shown(stream_open_keys.report_open_ratio(runs))
        sets.append(runs)
    results["open_keys"] = {str(w): r for w, r in sets[0].items()}
    if len(sets) > 1:
        results["open_keys_sets"] = [{str(w): r for w, r in runs.items()} for runs in sets]
        lines += _shown(stream_open_keys.report_open_ratio_range(sets))
    return lines


def _shown(lines: list[str]) -> list[str]:
    """Print a phase's report as soon as it is done (a later phase may fail or be
    interrupted); the whole report is printed again at the end."""
    print("\n".join(lines), flush=True)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(list(sys.argv[1:] if argv is None else argv))
    if a.kill_broker and (not a.cluster or a.bootstrap or a.phase != "scaleout"):
        print("error: --kill-broker needs --cluster, --phase scaleout and no --bootstrap "
              "(the bench kills a broker of its own cluster)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)
    litter0 = _repo_litter()
    children = Children()
    results: dict[str, Any] = {"args": vars(a)}
    try:
        # Exits in reverse order: children (workers, peers) stop while the broker still
        # runs and before their directory goes; then the broker; then the directory.
        with tempfile.TemporaryDirectory(prefix="dpc-bench-") as tmp_s, \
                local_kafka(a.bootstrap, 3 if a.cluster else 1) as (bootstrap, cluster), \
                contextlib.closing(children):
            ctx = stream_counted.Ctx(client_config(bootstrap), bootstrap, Path(tmp_s),
                                     children, quix_python(a.quix_python), a.standby,
                                     a.processor_metric,
                                     a.heartbeat_ticks if a.heartbeat_ticks is not None
                                     else stream_counted.HEARTBEAT_TICKS)
            if a.checkpoint_ms is not None:
                ctx.worker_settings = {"checkpoint_ms": a.checkpoint_ms}
            if a.profile_dir is not None:
                a.profile_dir.mkdir(parents=True, exist_ok=True)
                ctx.profile_dir, ctx.profile_native = a.profile_dir, a.profile_native
            if a.quick:  # a smoke run: shorter idle windows and flush waits
                ctx.idle_s, ctx.flush_max_s = 1.0, 5.0
            lines = run_phases(a, ctx, results, cluster)
    except KeyboardInterrupt:
        print("interrupted: workers and broker stopped", file=sys.stderr, flush=True)
        return 130
    bad = sum(int(v.get("not_log_append", 0)) for v in _walk(results))
    lines.append(f"timestamps: {'all' if not bad else f'NOT all ({bad} records not)'} "
                 "LogAppendTime (broker append times)")
    left = sorted(_repo_litter() - litter0)
    lines.append("left in the repository: " + (", ".join(left) if left else "nothing")
                 + " (the checkout is shared: other sessions' files would show too)")
    print("\n".join(lines), flush=True)
    if a.json:
        Path(a.json).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2
                                              | orjson.OPT_NON_STR_KEYS
                                              | orjson.OPT_SERIALIZE_NUMPY, default=str))
    return 0


def _walk(obj: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(obj, Mapping):
        yield obj
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


if __name__ == "__main__":
    raise SystemExit(main())
