"""Throughput of the pure operator (no Kafka): `BatchCommit.commit` on a DictStore with a
sink that only collects, i.e. the worker's per-batch work without the broker.

Workloads, each a timeline of event-batch records and "sealed through" markers (one
marker per tick, as the leader's timer writes them), applied one tick per batch (the
tick's event record, then its marker), with a checkpoint after every batch (the default)
or after every `--checkpoint-ticks` K batches, as a worker checkpoints once per interval
(a counter's state is encoded once per checkpoint, however often it stepped since):

- dense:     200 counters; in the first T/5 ticks 5 events per counter per tick, then
             markers only: every counter's queue is non-empty and it steps an event at
             every one of the T ticks, and every queued event has been stepped at the end;
- sparse:    10,000 declared counters, 20 events per tick spread over them (most ticks
             of a counter are ⊥), then 5 ticks of markers only (a counter that got two
             events in one tick steps the second at the next);
- idle:      10,000 declared counters, markers only (after the first marker created them);
- heartbeat: the same, but every counter's heartbeat falls on the last marker (all due).

Heartbeats are switched off (heartbeat_ticks = 10^6) except in the last workload, so the
others measure events and markers alone. An event counts when its counter's mechanism has
stepped it (the operator's `events_dequeued`), never when it was merely queued; events/s =
stepped events / the time of every commit of the workload (arrivals, steps, releases,
state writes); ev/CPU-s = the same events / the CPU time of this process over those
commits (steadier than events/s on a shared machine). Also printed: events queued (they
must equal the stepped ones: the bench says so if not), records/s (timeline records) and
per-marker work.

    .venv/bin/python bench/bench_operator.py [--mechanism ecc simecc] [--ticks 200]
        [--counters 10000] [--repeats 3] [--profile]

`--memory` measures instead what idle counters leave allocated per declared counter
(tracemalloc over the configuration, the operator and its cache after markers through
`--ticks` ticks of 1 s with the README's heartbeats, every 60 ticks, and a checkpoint that
is not full every 6 ticks, on a store that keeps and returns copies of its bytes as
RocksDB does; the store's own keys and values, which RocksDB holds outside Python online,
are left out) and the allocation sites that hold the most. With `--idle-decoded 0` every
idle counter is released (what each counter beyond the operator's IDLE_DECODED costs).

`--restart WARM GAP` measures instead a clean stop and a crash, each followed by a cold
operator's first marker and checkpoint (`restart_cpu`): the operator's part of a restore.

`--idle-cpu WARM TICKS` measures instead the CPU per tick of 1 s of `--counters` idle
counters with the same heartbeats and checkpoints, after WARM ticks, over TICKS ticks
(`idle_cpu`): what one worker's operator spends on them per second, without the broker;
with `--minutes` also the CPU of each 60 of those ticks.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import random
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.devtools.inmemory import CopyingStore
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.operator import DEFAULT_CACHE_SIZE, IDLE_DECODED, Operator
from processor.stream.model.outputs import CollectingSink, Output
from processor.stream.model.records import Event, encode_batch, encode_marker
from processor.stream.model.state import DictStore, StateStore

TICK = 1000
#: Marker-only ticks after the sparse workload's last events (see the module docstring).
SPARSE_DRAIN = 5
DENSE_COUNTERS = 200
Batch = list[tuple[int, bytes]]


@dataclass
class Workload:
    name: str
    settings: Settings
    warm: list[Batch]  # untimed (the first marker creates every counter)
    timed: list[Batch]
    events: int  # input events in `timed`


def timeline_batches(ticks: range, per_tick: Sequence[Sequence[Event]] | None,
             offset: int) -> tuple[list[Batch], int]:
    out: list[Batch] = []
    for i, n in enumerate(ticks):
        batch: Batch = []
        if per_tick is not None and per_tick[i]:
            batch.append((offset, encode_batch(per_tick[i])))
            offset += 1
        batch.append((offset, encode_marker(n)))
        offset += 1
        out.append(batch)
    return out, offset


def dense(s: Settings, ticks: int, counters: int, per_counter: int,
          rng: random.Random) -> Workload:
    """Arrivals in the first ticks / per_counter ticks, exactly `ticks` events per counter,
    so each counter steps one at every tick and none is left queued at the end."""
    src = 0
    per_tick: list[list[Event]] = []
    for n in range(1, ticks + 1):
        evs = []
        if n <= ticks // per_counter:
            for c in range(counters):
                for _ in range(per_counter):
                    evs.append(Event(f"k{c:05d}", n * TICK + rng.randrange(TICK), UNIT, 0,
                                     src))
                    src += 1
        per_tick.append(evs)
    warm, off = timeline_batches(range(0, 1), None, 0)
    timed, _ = timeline_batches(range(1, ticks + 1), per_tick, off)
    return Workload(f"dense ({counters} ctrs, {per_counter} ev/tick, drained)", s, warm, timed,
                    src)


def sparse(s: Settings, ticks: int, counters: int, per_tick_n: int,
           rng: random.Random) -> Workload:
    src = 0
    per_tick: list[list[Event]] = []
    for n in range(1, ticks + 1):
        evs = []
        for _ in range(per_tick_n):
            c = rng.randrange(counters)
            evs.append(Event(f"k{c:05d}", n * TICK + rng.randrange(TICK), UNIT, 0, src))
            src += 1
        per_tick.append(evs)
    per_tick += [[] for _ in range(SPARSE_DRAIN)]
    warm, off = timeline_batches(range(0, 1), None, 0)
    timed, _ = timeline_batches(range(1, ticks + SPARSE_DRAIN + 1), per_tick, off)
    return Workload(f"sparse ({counters} ctrs, {per_tick_n} ev/tick)", s, warm, timed, src)


def idle(s: Settings, ticks: int, counters: int) -> Workload:
    warm, off = timeline_batches(range(0, 1), None, 0)
    timed, _ = timeline_batches(range(1, ticks + 1), None, off)
    return Workload(f"idle markers ({counters} ctrs)", s, warm, timed, 0)


def heartbeat(s: Settings, ticks: int, counters: int) -> Workload:
    warm, off = timeline_batches(range(0, ticks), None, 0)
    timed, _ = timeline_batches(range(ticks, ticks + 1), None, off)
    return Workload(f"heartbeat marker ({counters} due)", s, warm, timed, 0)


async def run_workload(w: Workload, cache_size: int, profile: cProfile.Profile | None,
                       checkpoint_ticks: int = 1
                       ) -> tuple[float, float, int, int, int, int, int]:
    """Apply the workload's timed batches, a checkpoint after every `checkpoint_ticks`
    of them and after the last (1: `BatchCommit.commit` per batch)."""
    bc = BatchCommit(Operator(w.settings, NoiseKey.from_seed(1), cache_size=cache_size),
                     DictStore(), CollectingSink())
    for b in w.warm:
        await bc.commit(0, b)
    releases = touched = markers = stepped = queued = 0
    if profile is not None:
        profile.enable()
    t0 = time.perf_counter()
    c0 = time.process_time()
    for i, b in enumerate(w.timed, 1):
        out = await bc.apply(0, b)
        if i % checkpoint_ticks == 0 or i == len(w.timed):
            await bc.checkpoint()
        releases += len(out.releases)
        touched += out.metrics["counters_touched"]
        markers += out.metrics["markers_applied"]
        stepped += out.metrics["events_dequeued"]
        queued += out.metrics["events_queued"]
    dt = time.perf_counter() - t0
    cpu = time.process_time() - c0
    if profile is not None:
        profile.disable()
    return dt, cpu, releases, touched, markers, stepped, queued


class _Discarding:
    """A Sink that keeps nothing (what a worker keeps of what it published)."""

    def send(self, out: Output) -> None:
        return None

    async def flush(self) -> None:
        return None


class _Encoding(_Discarding):
    """A Sink that makes of every release what the worker's sink hands its producer (key,
    value, timestamp, headers: kafka.producer.KafkaSink), then drops it."""

    def send(self, out: Output) -> None:
        for r in out.releases:
            (r.key(), r.to_json(), r.timestamp_ms(), r.headers())


def memory(mech: str, ticks: int, counters: int, cache_size: int, idle_decoded: int,
           top: int) -> None:
    """Print what `counters` idle counters leave allocated per counter, the store's keys
    and values apart: declared in the configuration (made inside the measured window),
    the README's heartbeats (every 60 ticks of 1 s, spread), created by the first marker
    and then `ticks` markers, a checkpoint that is not full every 6 (the worker's periodic
    one), measured after the last marker as a running worker holds them."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    start = 1_767_225_600  # a tick of 1 s (2026-01-01), as a deployment's start
    names = {f"counter-{c:07d}": start * TICK for c in range(counters)}
    s = with_overrides(Settings(), counters=names, partitions=1, mechanism=mech,
                       epsilon=1.0, delta=1e-6, heartbeat_ticks=60, heartbeat_spread=True)
    store = CopyingStore()
    bc = BatchCommit(Operator(s, NoiseKey.from_seed(1), cache_size=cache_size,
                              idle_decoded=idle_decoded), store, _Discarding())
    for i, n in enumerate(range(start, start + ticks + 1)):
        asyncio.run(bc.apply(0, [(i, encode_marker(n))]))
        if i % 6 == 5:
            asyncio.run(bc.checkpoint(full=False))
    asyncio.run(bc.checkpoint(full=False))
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    stats = after.compare_to(before, "lineno")
    total = sum(st.size_diff for st in stats)
    stored = sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in store.data.items())
    print(f"idle {mech} ({counters} ctrs, {ticks} ticks): {(total - stored) / counters:,.0f} "
          f"bytes per counter allocated, besides the store's keys and values "
          f"({stored / counters:,.0f})")
    for st in [st for st in stats if st.traceback[0].filename != __file__][:top]:
        frame = st.traceback[0]
        print(f"  {st.size_diff / counters:>7,.0f} B/counter {st.count_diff:>9,} blocks  "
              f"{frame.filename.split('/processor/')[-1]}:{frame.lineno}")


class _NoChangelog:
    """The producer of a `table.PartitionStore` whose changelog records go nowhere."""

    def produce(self, *_a: object, **_k: object) -> None:
        return None

    def produce_many(self, *_a: object, **_k: object) -> None:
        return None


class _OneStore:
    """commit.Stores of one partition's store, durable once written."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def of(self, partition: int) -> StateStore:
        return self.store

    async def flush(self) -> None:
        return None


def rocks_store(path: str) -> StateStore:
    """The worker's store of one partition (`table.PartitionStore`) on a RocksDB database
    opened as Faust opens the worker's (`table.ROCKSDB_OPTIONS`: its 8 MiB block cache),
    its changelog records dropped."""
    from types import SimpleNamespace
    from typing import Any

    from faust.stores.rocksdb import RocksDBOptions

    from processor.stream.worker.table import ROCKSDB_OPTIONS, PartitionStore

    options: Any = ROCKSDB_OPTIONS
    db = RocksDBOptions(**options).open(Path(path))
    table: Any = SimpleNamespace(data=SimpleNamespace(_db_for_partition=lambda _p: db))
    producer: Any = _NoChangelog()
    return PartitionStore(table, 0, producer, "changelog")


def idle_cpu(mech: str, warm: int, ticks: int, counters: int, idle_decoded: int,
             rocksdb: str | None = None, minutes: bool = False) -> None:
    """Print the CPU of `counters` idle counters per tick of 1 s (= CPU-s per second of a
    worker's operator), the README's heartbeats (every 60 ticks, spread) and a checkpoint
    that is not full every 6 ticks, on a store that copies bytes as RocksDB does: markers
    through `warm` ticks first (creating the counters; past DEFERRED_HEARTBEATS + 2
    heartbeat intervals, 3,960 ticks, also each counter's first write at the deferral
    bound, which uses the noise key), then `ticks` more, timed (a whole cycle of the
    writes at the bound is 3,960 ticks). Releases go to a sink that encodes them as
    the worker's does and keeps nothing (no broker: their sending is not included).
    `rocksdb`: a directory for the store, the worker's (`rocks_store`), instead. `minutes`:
    also the CPU-ms per tick of each 60 timed ticks, in order (the writes of idle counters
    at the deferral bound come in bursts: a window shorter than their cycle can miss
    them)."""
    start = 1_767_225_600
    names = {f"counter-{c:07d}": start * TICK for c in range(counters)}
    s = with_overrides(Settings(), counters=names, partitions=1, mechanism=mech,
                       epsilon=1.0, delta=1e-6, heartbeat_ticks=60, heartbeat_spread=True)
    store = CopyingStore() if rocksdb is None else _OneStore(rocks_store(rocksdb))
    bc = BatchCommit(Operator(s, NoiseKey.from_seed(1), idle_decoded=idle_decoded),
                     store, _Encoding())

    per_minute: list[float] = []

    async def run(first: int, last: int) -> None:
        mark = time.process_time()
        for i in range(first, last):
            await bc.apply(0, [(i, encode_marker(start + i))])
            if i % 6 == 5:
                await bc.checkpoint(full=False)
            if (i - first) % 60 == 59:
                now = time.process_time()
                per_minute.append((now - mark) / 60 * 1000)
                mark = now

    c0 = time.process_time()
    asyncio.run(run(0, warm + 1))
    c1 = time.process_time()
    per_minute.clear()
    asyncio.run(run(warm + 1, warm + 1 + ticks))
    cpu = time.process_time() - c1
    beats = counters * ticks / 60
    where = "" if rocksdb is None else ", RocksDB"
    print(f"idle {mech} ({counters} ctrs, idle_decoded {idle_decoded}{where}): warm-up "
          f"{c1 - c0:.1f} CPU-s, then {cpu / ticks:.4f} CPU-s per tick of 1 s over {ticks} "
          f"ticks ({cpu / beats * 1e6:.1f} us per heartbeat)", flush=True)
    if minutes:
        print("CPU-ms per tick, each 60 ticks: " + " ".join(f"{m:.1f}" for m in per_minute),
              flush=True)


def restart_cpu(mech: str, warm: int, gap: int, counters: int, crash: bool) -> None:
    """Print the CPU of a restart of `counters` idle counters (the README's heartbeats,
    a checkpoint that is not full every 6 ticks, a store that copies bytes as RocksDB
    does): markers through `warm` ticks; then the stop (a full checkpoint; with `crash`
    none: the last periodic one stands, progress left behind); then a cold operator on
    the same store applies the marker through `gap` ticks later (the ticks sealed while
    no worker ran) and the first checkpoint after it: the operator's part of a restore
    or a takeover from a standby copy, without the broker."""
    start = 1_767_225_600
    names = {f"counter-{c:07d}": start * TICK for c in range(counters)}
    s = with_overrides(Settings(), counters=names, partitions=1, mechanism=mech,
                       epsilon=1.0, delta=1e-6, heartbeat_ticks=60, heartbeat_spread=True)
    store = CopyingStore()
    bc = BatchCommit(Operator(s, NoiseKey.from_seed(1)), store, _Discarding())

    async def run(first: int, last: int) -> None:
        for i in range(first, last):
            await bc.apply(0, [(i, encode_marker(start + i))])
            if i % 6 == 5:
                await bc.checkpoint(full=False)

    asyncio.run(run(0, warm + 1))
    c0 = time.process_time()
    if not crash:
        asyncio.run(bc.checkpoint())
    c1 = time.process_time()
    bc = BatchCommit(Operator(s, NoiseKey.from_seed(1)), store, _Discarding())
    out = asyncio.run(bc.apply(0, [(warm + 1, encode_marker(start + warm + gap))]))
    asyncio.run(bc.checkpoint(full=False))
    c2 = time.process_time()
    print(f"restart {mech} ({counters} ctrs, {'crash' if crash else 'clean stop'} after "
          f"{warm} ticks, {gap} ticks later): stop {c1 - c0:.2f} CPU-s; first marker and "
          f"checkpoint {c2 - c1:.2f} CPU-s ({out.metrics['counters_touched']} counters, "
          f"{len(out.releases)} releases)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mechanism", nargs="+", default=["ecc", "simecc"])
    ap.add_argument("--ticks", type=int, default=200)
    ap.add_argument("--counters", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    ap.add_argument("--cache-size", type=int, default=DEFAULT_CACHE_SIZE,
                    help=f"decoded-state LRU size (default {DEFAULT_CACHE_SIZE})")
    ap.add_argument("--idle-decoded", type=int, default=IDLE_DECODED,
                    help=f"idle counters stay decoded up to this many (default {IDLE_DECODED};"
                    " 0 releases every idle counter)")
    ap.add_argument("--only", help="run only workloads whose name contains this")
    ap.add_argument("--memory", action="store_true",
                    help="measure the memory per idle counter instead (see the doc)")
    ap.add_argument("--idle-cpu", type=int, nargs=2, metavar=("WARM", "TICKS"),
                    help="measure instead the CPU per tick of idle counters after WARM "
                    "ticks, over TICKS ticks (see idle_cpu)")
    ap.add_argument("--rocksdb", metavar="DIR",
                    help="--idle-cpu: the worker's store (a RocksDB database as the worker "
                    "opens it, in a new directory under DIR) instead of one in memory")
    ap.add_argument("--minutes", action="store_true",
                    help="--idle-cpu: also print the CPU of each 60 timed ticks")
    ap.add_argument("--checkpoint-ticks", type=int, default=1,
                    help="a checkpoint every this many ticks' batches (default 1: one per "
                    "batch; a worker checkpoints every checkpoint interval, 0.5 s or more: "
                    "5 ticks of 100 ms)")
    ap.add_argument("--restart", type=int, nargs=2, metavar=("WARM", "GAP"),
                    help="measure instead a clean stop and a crash after WARM ticks, each "
                    "followed by a cold operator's first marker GAP ticks later (see "
                    "restart_cpu)")
    ap.add_argument("--profile", action="store_true",
                    help="print a cProfile of the timed part (one run per workload)")
    args = ap.parse_args()
    if not (args.memory or args.idle_cpu or args.restart):
        print(f"{'workload':<36} {'mech':<7} {'stepped':>8} {'queued':>8} {'events/s':>10} "
              f"{'ev/CPU-s':>10} {'records/s':>10} {'releases':>9} {'touched/marker':>15}")
    for mech in args.mechanism:
        rng = random.Random(0)
        few = {f"k{c:05d}": 0 for c in range(DENSE_COUNTERS)}
        many = {f"k{c:05d}": 0 for c in range(args.counters)}
        base = with_overrides(Settings(), counters=few, partitions=1, mechanism=mech,
                              epsilon=1.0, delta=1e-6, heartbeat_ticks=10**6)
        big = with_overrides(base, counters=many)
        beat = with_overrides(big, heartbeat_ticks=args.ticks + 1, heartbeat_spread=False)
        workloads = [dense(base, args.ticks, DENSE_COUNTERS, 5, rng),
                     sparse(big, args.ticks, args.counters, 20, rng),
                     idle(big, args.ticks, args.counters),
                     heartbeat(beat, args.ticks, args.counters)]
        if args.memory:
            memory(mech, args.ticks, args.counters, args.cache_size, args.idle_decoded, 15)
            continue
        if args.idle_cpu:
            if args.rocksdb is not None:
                with tempfile.TemporaryDirectory(dir=args.rocksdb) as d:
                    idle_cpu(mech, args.idle_cpu[0], args.idle_cpu[1], args.counters,
                             args.idle_decoded, d, args.minutes)
                continue
            idle_cpu(mech, args.idle_cpu[0], args.idle_cpu[1], args.counters, args.idle_decoded,
                     minutes=args.minutes)
            continue
        if args.restart:
            for crash in (False, True):
                restart_cpu(mech, args.restart[0], args.restart[1], args.counters, crash)
            continue
        for w in workloads:
            if args.only and args.only not in w.name:
                continue
            prof = cProfile.Profile() if args.profile else None
            runs = [asyncio.run(run_workload(w, args.cache_size, prof, args.checkpoint_ticks))
                    for _ in range(1 if args.profile else args.repeats)]
            dt, _, releases, touched, markers, stepped, queued = min(runs)
            cpu = min(r[1] for r in runs)
            records = sum(len(b) for b in w.timed)
            ev_rate = f"{stepped / dt:,.0f}" if stepped else "-"
            ev_cpu = f"{stepped / cpu:,.0f}" if stepped and cpu > 0 else "-"
            print(f"{w.name:<36} {mech:<7} {stepped:>8} {queued:>8} {ev_rate:>10} {ev_cpu:>10} "
                  f"{records / dt:>10,.0f} {releases:>9} {touched / max(markers, 1):>15.1f}"
                  + ("" if stepped == queued == w.events else
                     f"  NOTE: {w.events} events in, {queued} queued, {stepped} stepped"),
                  flush=True)
            if prof is not None:
                pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
