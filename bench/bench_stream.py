"""Stream benchmark: the processor against a plain Faust agent on the same broker, run.

    python bench/bench_stream.py [--bootstrap HOST:PORT] [--events 10000] [--counters 10000]

Phases (bounded: about 2-3 minutes in all):
1. Throughput: N events are produced to a fresh input topic up front; then
   (a) a plain Faust agent that only counts the records of that topic, and
   (b) the processor worker (validate -> timeline -> operator -> releases)
   consume it from the beginning. Rates are measured from the first record each one handled
   to the moment it had handled all N (for the processor: its consumer group has committed
   the timeline past the last event, so every release of those events is published).
2. Sealing latency: for each release, the time from the append of the marker that sealed
   its tick to the append of the release (Kafka record timestamps, same clock).
3. Many counters: a worker with 10,000 declared counters runs for a while; resident memory
   of the worker process (psutil), its RocksDB directory size, and the state table's size
   (keys and bytes of the latest values, read from its changelog topic).

Prints one table. Starts a local broker (deploy/kafka.py) unless --bootstrap or
KAFKA_BOOTSTRAP_SERVERS is given.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402
import psutil  # noqa: E402

from processor.cli import write_key  # noqa: E402
from processor.devtools.deployment import WorkerProcess, write_config  # noqa: E402
from processor.stream import kafka_io  # noqa: E402
from processor.stream.app import STATE_TABLE, ensure_topics  # noqa: E402
from processor.stream.config import Settings, TopicSettings, with_overrides  # noqa: E402


def _baseline_agent(bootstrap: str, topic: str, n: int, out: str) -> None:
    """Child process: a Faust app whose one agent only counts the records of `topic`."""
    import faust

    app = faust.App(f"bench-baseline-{uuid.uuid4().hex[:8]}", broker=f"kafka://{bootstrap}",
                    web_enabled=False, consumer_auto_offset_reset="earliest",
                    store="memory://")
    src = app.topic(topic, key_type=bytes, value_type=bytes, key_serializer="raw",
                    value_serializer="raw")
    state: dict[str, Any] = {"n": 0, "first": None}

    async def count(stream: Any) -> None:
        async for _value in stream:
            if state["first"] is None:
                state["first"] = time.time()
            state["n"] += 1
            if state["n"] == n:
                Path(out).write_text(orjson.dumps(
                    {"first": state["first"], "last": time.time()}).decode())

    app.agent(src, name="bench-count")(count)
    asyncio.set_event_loop(asyncio.new_event_loop())
    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


def _wait_file(path: Path, timeout_s: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size:
            return dict(orjson.loads(path.read_bytes()))
        time.sleep(0.2)
    raise TimeoutError(f"no result in {path}")


def _settings(bootstrap: str, tmp: Path, name: str, counters: dict[str, int],
              **kw: Any) -> Settings:
    uid = uuid.uuid4().hex[:8]
    fields: dict[str, Any] = dict(
        app_id=f"bench-{name}-{uid}", bootstrap_servers=bootstrap,
        topics=TopicSettings(input=f"bench-{name}-in-{uid}", timeline=f"bench-{name}-tl-{uid}",
                             counts=f"bench-{name}-counts-{uid}",
                             ledger=f"bench-{name}-ledger-{uid}",
                             deadletter=f"bench-{name}-dead-{uid}"),
        partitions=4, tick_ms=200, lateness_ms=400, max_future_ms=60_000, heartbeat_ticks=50,
        counters=counters, mechanism="ecc", epsilon=1.0, delta=1e-6,
        noise_key_file=str(write_key(tmp / "noise.key")), state_dir=str(tmp / f"state-{name}"))
    fields.update(kw)
    return with_overrides(Settings(), **fields)


def _latencies(settings: Settings, after_ms: int = 0) -> list[float]:
    """Per release: release append time minus the append time of the marker that sealed it
    (only markers appended at or after `after_ms`)."""
    conf = kafka_io.base_config(settings)
    tick = settings.tick_ms
    markers: dict[int, list[tuple[int, int]]] = {}
    for p, recs in kafka_io.read_topic(conf, settings.topics.timeline).items():
        best: list[tuple[int, int]] = []
        for r in recs:
            d = orjson.loads(r.value or b"")
            if d.get("k") == "m" and (not best or d["n"] > best[-1][0]):
                best.append((int(d["n"]), r.timestamp_ms))
        markers[p] = best
    from processor.stream.records import partition_for

    out: list[float] = []
    for r in kafka_io.iter_topic(conf, settings.topics.counts):
        d = orjson.loads(r.value or b"")
        g = int(d["tick_start_ms"]) // tick
        ms = markers[partition_for(str(d["counter"]), settings.partitions)]
        lo, hi = 0, len(ms)
        while lo < hi:  # first marker with n >= g
            mid = (lo + hi) // 2
            if ms[mid][0] >= g:
                hi = mid
            else:
                lo = mid + 1
        if lo < len(ms) and ms[lo][1] >= after_ms:
            out.append(r.timestamp_ms - ms[lo][1])
    return out


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def phase_throughput(bootstrap: str, tmp: Path, n: int) -> dict[str, Any]:
    conf = kafka_io.plain_config(bootstrap)
    names = [f"k{i:03d}" for i in range(100)]
    start = (int(time.time() * 1000) // 200) * 200 - 60_000
    s = _settings(bootstrap, tmp, "tput", dict.fromkeys(names, start))
    ensure_topics(s)
    now = int(time.time() * 1000)
    kafka_io.produce_all(conf, s.topics.input, ((None, orjson.dumps(
        {"counter": names[i % 100], "ts": now + (i % 50) * 200, "value": 1}))
        for i in range(n)))
    # (a) the plain Faust agent.
    out = tmp / "baseline.json"
    base = subprocess.Popen([sys.executable, __file__, "--baseline-agent", bootstrap,
                             s.topics.input, str(n), str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(ROOT))
    try:
        b = _wait_file(out, 120)
    finally:
        base.terminate()
        base.wait(30)
    base_rate = n / max(1e-9, b["last"] - b["first"])
    # (b) the processor.
    worker = WorkerProcess(write_config(s, tmp / "tput.toml"), tmp / "tput.log").start()
    try:
        deadline = time.monotonic() + 180
        done_at = None
        while time.monotonic() < deadline:
            tl = kafka_io.read_topic(conf, s.topics.timeline)
            events = [(p, r.offset, r.timestamp_ms) for p, rs in tl.items() for r in rs
                      if r.header(kafka_io.SOURCE_HEADER)]
            if len(events) >= n:
                last: dict[int, int] = {}
                for p, off, _ts in events:
                    last[p] = max(last.get(p, -1), off)
                done = kafka_io.committed_offsets(conf, s.app_id, s.topics.timeline)
                if all(done.get(p, 0) > off for p, off in last.items()):
                    done_at = time.time() * 1000
                    break
            time.sleep(0.3)
        if done_at is None:
            raise TimeoutError("processor did not finish: " + worker.log_tail())
        first_ms = min(ts for _p, _o, ts in events)
        last_ingest = max(ts for _p, _o, ts in events)
        rss = psutil.Process(worker.proc.pid).memory_info().rss if worker.proc else 0
    finally:
        worker.stop()
    proc_rate = n / max(1e-9, (done_at - first_ms) / 1000)
    ingest_rate = n / max(1e-9, (last_ingest - first_ms) / 1000)
    lat = _latencies(s)
    return {"n": n, "baseline": base_rate, "processor": proc_rate, "ingest": ingest_rate,
            "lat": lat, "rss": rss}


def phase_steady(bootstrap: str, tmp: Path, seconds: float) -> dict[str, Any]:
    """100 counters, ~40 events/s stamped with the wall clock: steady-state latency."""
    conf = kafka_io.plain_config(bootstrap)
    names = [f"s{i:03d}" for i in range(100)]
    tick = 200
    start = (int(time.time() * 1000) // tick) * tick
    s = _settings(bootstrap, tmp, "steady", dict.fromkeys(names, start), tick_ms=tick,
                  lateness_ms=400, heartbeat_ticks=10)
    ensure_topics(s)
    worker = WorkerProcess(write_config(s, tmp / "steady.toml"), tmp / "steady.log").start()
    try:
        first = kafka_io.wait_for(conf, s.topics.counts, lambda rs: len(rs) > 0,
                                  timeout_s=120)
        warm_ms = first[0].timestamp_ms + 2000
        producer = kafka_io.make_producer(conf)
        t_end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < t_end:
            for _ in range(4):
                producer.produce(s.topics.input, value=orjson.dumps(
                    {"counter": names[(i * 13) % 100], "ts": int(time.time() * 1000)}))
                i += 1
            producer.poll(0)
            time.sleep(0.1)  # pacing of the load generator (~40 events/s)
        producer.flush(30)
    finally:
        worker.stop()
    lat = _latencies(s, after_ms=warm_ms)
    return {"events": i, "lat": lat}


def phase_many(bootstrap: str, tmp: Path, counters: int, seconds: float) -> dict[str, Any]:
    """A worker with `counters` declared counters: memory and state size once all exist."""
    conf = kafka_io.plain_config(bootstrap)
    names = [f"m{i:05d}" for i in range(counters)]
    tick = 1000
    start = (int(time.time() * 1000) // tick) * tick
    # Starts staggered over ten ticks, so heartbeats (every 10 ticks) spread evenly: about
    # counters / 10 of them are due at each tick instead of all at once.
    s = _settings(bootstrap, tmp, "many",
                  {n: start + (i % 10) * tick for i, n in enumerate(names)}, tick_ms=tick,
                  lateness_ms=1000, heartbeat_ticks=10)
    ensure_topics(s)
    worker = WorkerProcess(write_config(s, tmp / "many.toml"), tmp / "many.log").start()
    created_s = float("nan")
    try:
        t0 = time.monotonic()
        kafka_io.produce_all(conf, s.topics.input, ((None, orjson.dumps(
            {"counter": names[(i * 37) % counters], "ts": start + 11 * tick}))
            for i in range(counters)))
        ledger_n = 0
        while time.monotonic() - t0 < seconds:
            time.sleep(1.0)  # polling interval of a bounded progress loop
            ledger_n = sum(len(v) for v in kafka_io.read_topic(conf, s.topics.ledger).values())
            if ledger_n >= counters:
                created_s = time.monotonic() - t0
                break
        # One full heartbeat period with every counter in place.
        if ledger_n >= counters:
            time.sleep(10 * tick / 1000)
        settled_ms = int(time.time() * 1000) - 10 * tick
        proc = psutil.Process(worker.proc.pid) if worker.proc else None
        rss = proc.memory_info().rss if proc else 0
        db_bytes = _dir_size(Path(s.state_dir))
    finally:
        worker.stop()
    changelog = f"{s.app_id}-{STATE_TABLE}-changelog"
    latest: dict[bytes | None, int] = {}
    for r in kafka_io.iter_topic(conf, changelog):
        latest[r.key] = len(r.value or b"")
    lat = _latencies(s, after_ms=settled_ms) if ledger_n >= counters else []
    return {"counters": counters, "rss": rss, "db_bytes": db_bytes, "keys": len(latest),
            "value_bytes": sum(latest.values()), "ledger": ledger_n, "lat": lat,
            "created_s": created_s}


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--baseline-agent"]:
        _baseline_agent(args_in[1], args_in[2], int(args_in[3]), args_in[4])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", ""))
    p.add_argument("--events", type=int, default=10_000)
    p.add_argument("--counters", type=int, default=10_000)
    p.add_argument("--seconds", type=float, default=100.0,
                   help="deadline for creating all counters in the many-counters run")
    args = p.parse_args(args_in)
    kafka = None
    if not args.bootstrap:
        from processor.devtools.local_kafka import LocalKafka

        kafka = LocalKafka(1).start()
        args.bootstrap = kafka.bootstrap_servers
    try:
        with tempfile.TemporaryDirectory(prefix="dpc-bench-") as tmp:
            t = phase_throughput(args.bootstrap, Path(tmp), args.events)
            st = phase_steady(args.bootstrap, Path(tmp), 15.0)
            m = phase_many(args.bootstrap, Path(tmp), args.counters, args.seconds)
    finally:
        if kafka is not None:
            kafka.stop()
    rows = [
        ("events (throughput phase)", f"{t['n']}"),
        ("plain Faust agent, events/s", f"{t['baseline']:.0f}"),
        ("processor ingest, events/s", f"{t['ingest']:.0f}"),
        ("processor end-to-end, events/s", f"{t['processor']:.0f}"),
        ("ratio processor / plain agent", f"{t['processor'] / t['baseline']:.3f}"),
        ("seal->release latency p50/p95/max ms, backlog (throughput phase)",
         f"{_pct(t['lat'], .5):.0f} / {_pct(t['lat'], .95):.0f} / "
         f"{max(t['lat'], default=float('nan')):.0f} (n={len(t['lat'])})"),
        ("seal->release latency p50/p95/max ms, steady 40 ev/s, 100 counters",
         f"{_pct(st['lat'], .5):.0f} / {_pct(st['lat'], .95):.0f} / "
         f"{max(st['lat'], default=float('nan')):.0f} (n={len(st['lat'])})"),
        ("worker RSS, 100 counters", f"{t['rss'] / 2**20:.0f} MiB"),
        (f"worker RSS, {m['counters']} counters", f"{m['rss'] / 2**20:.0f} MiB"),
        ("RocksDB dir size", f"{m['db_bytes'] / 2**20:.1f} MiB"),
        ("state table keys / latest value bytes",
         f"{m['keys']} / {m['value_bytes'] / 2**20:.1f} MiB"),
        ("ledger entries (counters created)",
         f"{m['ledger']} in {m['created_s']:.0f} s"),
        (f"seal->release latency p50/p95/max ms ({m['counters']} counters)",
         f"{_pct(m['lat'], .5):.0f} / {_pct(m['lat'], .95):.0f} / "
         f"{max(m['lat'], default=float('nan')):.0f} (n={len(m['lat'])})" if m["lat"]
         else "n/a: no release of a tick sealed after creation was published before the "
              "stop (worker still catching up)"),
    ]
    w = max(len(a) for a, _ in rows)
    for a, b in rows:
        print(f"{a:<{w}}  {b}")
    if st["lat"]:
        print(f"(mean steady latency: {statistics.fmean(st['lat']):.0f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
