"""Cost of privacy_unit = "user" (the bounding stage, docs/privacy-unit.md) against
"event", in one run on one broker.

    python bench/bench_unit.py [--events 20000] [--repeat 2] [--users 20000]
        [--bootstrap HOST:PORT] [--json FILE]
    python bench/bench_unit.py --stage [--events 60000] [--users 60000] [--repeat 3]

Starts a local single-node broker (processor.devtools.kafka) unless --bootstrap or
KAFKA_BOOTSTRAP_SERVERS names one. Per repeat, two isolated deployments (same counters,
tick 100 ms, lateness 100 ms, ECC), one per mode, in an order rotated between repeats.
Each worker is started, fed one warm-up event and waited for until it released
something; then its idle CPU is measured for IDLE_S, then the N events are produced as
fast as one producer goes: 100 counters, each event naming one of --users units (user
mode: target eps 4, delta 1e-6 per unit, k = 3 events per counter, m = 2 counters per
unit, so part of the events exceed a bound and are dead-lettered).

    counted = events that reach the operator (event mode: all N; user mode: the kept ones)
    start   = append time of the first input record (LogAppendTime)
    end     = append time of the last timeline batch that carries one of the N events
              (event mode: ingest's; user mode: the bounding stage's forward)
    events/s            = N / (end - start)   (input events through to the timeline)
    CPU per counted event = (worker tree CPU over [produce, end + SETTLE_S]
                             - idle CPU rate x that window) / counted
    state bytes per unit = mean (key + value) bytes of the live values of the units
                           table (latest record per key of its changelog)
    records per event    = records appended to each topic (units, timeline: batches,
                           markers and heartbeats; both changelogs) over the window / N
    timeline event batches = the timeline records carrying any of the N events

The operator's own work (applying the batches and the markers) follows the timeline by
at most a tick, and the bounding stage's last checkpoint by at most its interval: both
are inside the CPU window (SETTLE_S after `end`). Target:
CPU per counted event in user mode at most 1.5x event mode.

`--stage`: the bounding stage alone, in this process, no broker: the same events routed
by ingest's `route` into units records (500-event input batches), applied by
`BoundCommit` over one RocksDB database per units partition (rocksdict, one write batch
per checkpoint; no changelog producer), a checkpoint every STAGE_CHECKPOINT_EVENTS input
events. Reports this process's CPU per input event, apply and checkpoint apart, the
cyclic collector's share (gc callbacks) and the unit writes per event. Far less noisy
than the end-to-end figure on a shared machine, and it isolates what bounding.py costs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rocksdict import Options, Rdict, WriteBatch
from stream_io import broker

from processor.core.rng import NoiseKey
from processor.core.unit import derive
from processor.devtools.deployment import Deployment, isolated_deployment
from processor.stream.kafka import kafka_io
from processor.stream.kafka.ingest import InputRecord, route
from processor.stream.kafka.topics import changelog_topic, units_changelog_topic, units_topic
from processor.stream.model.bounding import UNITS_SOURCE, BoundCommit, Bounder, unit_key
from processor.stream.model.config import Settings, with_overrides, with_unit
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.records import (
    TimelineBatch,
    TimelineFormatError,
    decode_timeline,
)
from processor.stream.model.transaction import StoreGeneration

IDLE_S = 3.0
#: Both modes checkpoint every 2 s (the operator and the bounding stage alike): each
#: checkpoint writes every value touched since the last one, once.
CHECKPOINT_MS = 2000
#: After the last forward: the operator's last batches, and the bounding stage's last
#: checkpoint (its unit writes, up to CHECKPOINT_MS and a timer round later).
SETTLE_S = CHECKPOINT_MS / 1000 + 1.0
COUNTERS = [f"c{i:03d}" for i in range(100)]
K, M, UNIT_EPS, UNIT_DELTA = 3, 2, 4.0, 1e-6


def cpu_seconds(pid: int) -> float:
    total = 0.0
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU-seconds per part of the worker (as bench_stream.thread_cpu): main (Faust's
    loop: the operator and bounding agents), librdkafka, rocksdb, other python (ingest)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            raw = (task / "stat").read_text()
            comm = raw[raw.index("(") + 1:raw.rindex(")")]
            fields = raw[raw.rindex(")") + 2:].split()
            cpu = (int(fields[11]) + int(fields[12])) * _TICK_S
            group = ("main" if int(task.name) == pid else "librdkafka"
                     if comm.startswith("rdk:") else "rocksdb"
                     if comm.startswith("rocksdb") else "other python")
            out[group] = out.get(group, 0.0) + cpu
    return out


def deployment(bootstrap: str, tmp: Path, mode: str) -> Deployment:
    start = (int(time.time() * 1000) // 100) * 100 - 3_600_000
    kw: dict[str, Any] = dict(tick_ms=100, lateness_ms=100, max_future_ms=60_000,
                              heartbeat_ticks=60, partitions=4, checkpoint_ms=CHECKPOINT_MS)
    if mode == "user":
        d = Settings()
        p = derive(UNIT_EPS, UNIT_DELTA, K, M, mechanism=d.mechanism, calibration=d.calibration)
        kw.update(privacy_unit="user", unit_epsilon=UNIT_EPS, unit_delta=UNIT_DELTA,
                  max_events_per_counter=K, max_counters_per_unit=M,
                  epsilon=p.event_epsilon, delta=p.event_delta)
    else:
        kw.update(epsilon=1.0, delta=1e-6)
    return isolated_deployment(bootstrap, dict.fromkeys(COUNTERS, start), parent=tmp,
                               name=f"bu-{mode}", **kw)


def events(n: int, users: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    now = int(time.time() * 1000) - 300  # late: joins the first open tick at once
    return [orjson.dumps({"counter": rng.choice(COUNTERS), "ts": now,
                          "user": f"user-{rng.randrange(users)}"}) for _ in range(n)]


def timeline_state(dep: Deployment, mode: str) -> tuple[int, int, int]:
    """(events on the timeline (user mode: forwarded, deduplicated), append time of the
    last batch carrying any, batch records carrying any)."""
    n, last, batches = 0, 0, 0
    seen: set[tuple[int, int]] = set()
    for r in kafka_io.iter_topic(dep.conf, dep.topics.timeline):
        try:
            rec = decode_timeline(r.value or b"")
        except TimelineFormatError:
            continue
        if not isinstance(rec, TimelineBatch) or not rec.events:
            continue
        if (mode == "user") != (rec.source == UNITS_SOURCE):
            continue
        fresh = 0
        for ev in rec.events:
            if (ev.src_partition, ev.src_offset) not in seen:
                seen.add((ev.src_partition, ev.src_offset))
                fresh += 1
        if fresh:
            n += fresh
            batches += 1
            last = max(last, r.timestamp_ms)
    return n, last, batches


def topic_records(dep: Deployment, mode: str) -> dict[str, int]:
    """Records appended so far per topic (the sum of its partitions' high watermarks)."""
    s = dep.settings
    topics = {"timeline": s.topics.timeline, "changelog": changelog_topic(s)}
    if mode == "user":
        topics.update(units=units_topic(s), units_changelog=units_changelog_topic(s))
    out: dict[str, int] = {}
    for name, topic in topics.items():
        try:
            out[name] = sum(hi for _, hi in kafka_io.end_offsets(dep.conf, topic).values())
        except Exception:  # a changelog not created yet: nothing appended
            out[name] = 0
    return out


def deadletters(dep: Deployment) -> int:
    return sum(1 for _ in kafka_io.iter_topic(dep.conf, dep.topics.deadletter))


def state_bytes_per_unit(dep: Deployment) -> tuple[float, int]:
    latest: dict[bytes, bytes] = {}
    for r in kafka_io.iter_topic(dep.conf, units_changelog_topic(dep.settings)):
        if r.key is not None and r.key.startswith(b"u/"):
            latest[r.key] = r.value or b""
    sizes = [len(k) + len(v) for k, v in latest.items() if v]
    return (statistics.fmean(sizes) if sizes else 0.0), len(sizes)


def run_mode(bootstrap: str, tmp: Path, mode: str, n: int, users: int, seed: int
             ) -> dict[str, Any]:
    dep = deployment(bootstrap, tmp, mode)
    try:
        dep.worker.start()
        dep.produce(events(1, users, seed + 1))
        dep.wait_releases(lambda rs: len(rs) > 0, timeout_s=120)
        time.sleep(1.0)
        pid = dep.worker.proc.pid  # type: ignore[union-attr]
        c0 = cpu_seconds(pid)
        time.sleep(IDLE_S)
        idle_rate = (cpu_seconds(pid) - c0) / IDLE_S
        warm_tl, _, warm_batches = timeline_state(dep, mode)
        warm_dead = deadletters(dep)
        values = events(n, users, seed)
        recs0 = topic_records(dep, mode)
        c0, t0, th0 = cpu_seconds(pid), time.monotonic(), thread_cpu(pid)
        dep.produce(values)
        # The first input record of the N (the warm-up one is older; the input topic's
        # timestamps are the producer's create times, on this machine's clock).
        ins = sorted(r.timestamp_ms for r in kafka_io.iter_topic(dep.conf, dep.topics.input))
        first_in = ins[1] if len(ins) > 1 else ins[0]
        deadline = time.monotonic() + 300
        while True:
            got, last, batches = timeline_state(dep, mode)
            dead = deadletters(dep) - warm_dead
            if got - warm_tl + dead >= n or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        time.sleep(SETTLE_S)
        cpu = cpu_seconds(pid) - c0
        th1 = thread_cpu(pid)
        by_thread = {k: round(th1.get(k, 0.0) - th0.get(k, 0.0), 3) for k in th1}
        window = time.monotonic() - t0
        recs1 = topic_records(dep, mode)
        counted = got - warm_tl
        out: dict[str, Any] = {
            "mode": mode, "events": n, "counted": counted, "dead_lettered": dead,
            "events_per_s": n / max(1e-3, (last - first_in) / 1000.0),
            "cpu_s": cpu, "idle_cpu_per_s": idle_rate, "window_s": window,
            "cpu_ms_per_counted_event": 1000.0 * (cpu - idle_rate * window) / max(1, counted),
            "complete": got - warm_tl + dead >= n, "cpu_s_by_thread": by_thread,
            "records_per_event": {k: round((recs1[k] - recs0[k]) / n, 5) for k in recs1},
            "timeline_event_batches": batches - warm_batches,
            "load_avg_1m": os.getloadavg()[0]}
        if mode == "user":
            out["state_bytes_per_unit"], out["units_in_state"] = state_bytes_per_unit(dep)
        return out
    finally:
        dep.close()


#: --stage: input events per checkpoint (what the worker applies in CHECKPOINT_MS here,
#: as its units changelog records per event show), and per ingest batch.
STAGE_CHECKPOINT_EVENTS = 20_000
STAGE_BATCH = 500


class RocksStore:
    """state.StateStore on one rocksdict database, as
    table.PartitionStore without its changelog producer."""

    shares_bytes = False

    def __init__(self, path: str) -> None:
        self._db = Rdict(path, options=Options(raw_mode=True))
        self.writes = 0
        self._generation = StoreGeneration()

    def generation(self) -> int | None:
        return self._generation.now(self._db, self._db.latest_sequence_number())

    def get(self, key: str) -> bytes | None:
        value = self._db.get(key.encode("utf-8"))
        return None if value is None else bytes(value)

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        got: Any = self._db.get([k.encode("utf-8") for k in keys]) if keys else []
        return [None if v is None else bytes(v) for v in got]

    def set(self, key: str, value: bytes) -> None:
        self.write_many([(key, value)])

    def delete(self, key: str) -> None:
        self._db.delete(key.encode("utf-8"))

    def write_many(self, writes: Iterable[tuple[str, bytes]]) -> None:
        wb = WriteBatch(raw_mode=True)
        n = 0
        for key, value in writes:
            wb.put(key.encode("utf-8"), value)
            n += 1
        before = self._db.latest_sequence_number()
        self._db.write(wb)
        self._generation.wrote(self._db, before, self._db.latest_sequence_number(), n)
        self.writes += n

    def scan(self, prefix: str) -> Any:
        return iter(())

    def close(self) -> None:
        self._db.close()


class RocksStores:
    """commit.Stores: a RocksStore per units partition, durable once written."""

    def __init__(self, root: Path, partitions: int) -> None:
        self.stores = [RocksStore(str(root / f"p{p}")) for p in range(partitions)]

    def of(self, partition: int) -> RocksStore:
        return self.stores[partition]

    async def flush(self) -> None:
        return None


def stage_run(n: int, users: int, seed: int, root: Path) -> dict[str, Any]:
    """The bounding stage alone over `n` events (see the module doc)."""
    start = (int(time.time() * 1000) // 100) * 100 - 3_600_000
    base = with_overrides(Settings(), counters=dict.fromkeys(COUNTERS, start), partitions=4,
                          tick_ms=100, lateness_ms=100, max_future_ms=60_000)
    d = Settings()
    p = derive(UNIT_EPS, UNIT_DELTA, K, M, mechanism=d.mechanism, calibration=d.calibration)
    settings = with_overrides(with_unit(base, UNIT_EPS, UNIT_DELTA, K, M),
                              epsilon=p.event_epsilon, delta=p.event_delta)
    ukey = unit_key(NoiseKey.from_seed(seed))
    values = events(n, users, seed)
    now = int(time.time() * 1000)
    units: list[tuple[int, int, bytes]] = []
    next_offset = [0] * settings.partitions
    for b in range(0, n, STAGE_BATCH):
        recs = [InputRecord(0, b + i, v) for i, v in enumerate(values[b:b + STAGE_BATCH])]
        for up, data in route(recs, settings, now, source="input", unit_key=ukey).units:
            units.append((up, next_offset[up], data))
            next_offset[up] += 1
    stores = RocksStores(root, settings.partitions)
    fw = CollectingSink()
    bc = BoundCommit(Bounder(settings), stores, fw)
    per_record = n / max(1, len(units))
    gc_s = [0.0, 0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_s[1] = time.process_time()
        else:
            gc_s[0] += time.process_time() - gc_s[1]

    async def run() -> tuple[float, float]:
        apply_s = checkpoint_s = 0.0
        since = 0.0
        for up, offset, data in units:
            t = time.process_time()
            await bc.apply(up, [(offset, data)], forward=False)
            apply_s += time.process_time() - t
            since += per_record
            if since >= STAGE_CHECKPOINT_EVENTS:
                t = time.process_time()
                await bc.checkpoint()
                checkpoint_s += time.process_time() - t
                since = 0.0
        t = time.process_time()
        await bc.checkpoint()
        return apply_s, checkpoint_s + time.process_time() - t

    gc.collect()
    gc.callbacks.append(on_gc)
    try:
        apply_s, checkpoint_s = asyncio.run(run())
    finally:
        gc.callbacks.remove(on_gc)
        for store in stores.stores:
            store.close()
    kept = sum(len(orjson.loads(data)["e"]) for _, data in fw.timeline)
    return {"mode": "stage", "events": n, "kept": kept, "dead_lettered": len(fw.deadletters),
            "units_records": len(units),
            "cpu_us_per_event": 1e6 * (apply_s + checkpoint_s) / n,
            "apply_us_per_event": 1e6 * apply_s / n,
            "checkpoint_us_per_event": 1e6 * checkpoint_s / n,
            "gc_us_per_event": 1e6 * gc_s[0] / n,
            "cpu_us_per_kept_event": 1e6 * (apply_s + checkpoint_s) / max(1, kept),
            "unit_writes_per_event": round(sum(s.writes for s in stores.stores) / n, 5),
            "load_avg_1m": os.getloadavg()[0]}


def stage_main(args: argparse.Namespace) -> int:
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-unit-stage-") as d:
        for i in range(args.repeat):
            root = Path(d) / f"r{i}"
            root.mkdir()
            r = stage_run(args.events, args.users, 1000 + i, root)
            runs.append(r)
            print(orjson.dumps(r).decode(), flush=True)
    summary = {"cpu_us_per_event": [r["cpu_us_per_event"] for r in runs],
               "median_cpu_us_per_event": statistics.median(
                   r["cpu_us_per_event"] for r in runs)}
    print(orjson.dumps(summary).decode())
    if args.json:
        Path(args.json).write_bytes(orjson.dumps({"runs": runs, "summary": summary}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    ap.add_argument("--json", help="write the results as JSON to this file")
    ap.add_argument("--stage", action="store_true",
                    help="the bounding stage alone, in this process (no broker)")
    args = ap.parse_args(argv)
    if args.stage:
        return stage_main(args)
    runs: list[dict[str, Any]] = []
    with broker(args.bootstrap) as bootstrap, \
            tempfile.TemporaryDirectory(prefix="bench-unit-") as d:
        for i in range(args.repeat):
            order = ("event", "user") if i % 2 == 0 else ("user", "event")
            for mode in order:
                r = run_mode(bootstrap, Path(d), mode, args.events, args.users, 1000 + i)
                runs.append(r)
                print(orjson.dumps(r).decode(), flush=True)
    ev = [r for r in runs if r["mode"] == "event"]
    us = [r for r in runs if r["mode"] == "user"]
    cpu_ratio = [u["cpu_ms_per_counted_event"] / e["cpu_ms_per_counted_event"]
                 for e, u in zip(ev, us, strict=True)]
    rate_ratio = [u["events_per_s"] / e["events_per_s"] for e, u in zip(ev, us, strict=True)]
    summary = {"cpu_per_counted_event_ratio_user_over_event": cpu_ratio,
               "events_per_s_ratio_user_over_event": rate_ratio,
               "state_bytes_per_unit": [u.get("state_bytes_per_unit") for u in us]}
    print(orjson.dumps(summary).decode())
    if args.json:
        Path(args.json).write_bytes(orjson.dumps({"runs": runs, "summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
