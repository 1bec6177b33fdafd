"""What keys of an open family that wait for admission cost, stored and in memory
(docs/open-keys.md, "Keys waiting for admission, in memory and in the store").

    .venv/bin/python bench/bench_waiting_keys.py [--mechanism ecc simecc]
        [--calibration paper tight] [--events 1 2 5] [--keys 10000] [--age 10000]
        [--quiet-ticks 600] [--idle-decoded 16384]

Through the operator, in process (no broker), one partition, on a store that keeps and
returns copies of its bytes as RocksDB does: a family starting at a tick of 1 s (the
README's heartbeats, every 60 ticks, spread; epsilon 1, delta 1e-6), a marker through
AGE - 1 ticks after its start, then KEYS new keys with EVENTS events each (10 ticks
apart, from tick AGE on; none of them admitted), one marker per tick through the last
event and 10 ticks more, then QUIET markers more (the keys' quiet ticks), a checkpoint
that is not full every 6 markers (the worker's periodic one), and a full one at the end
(a clean stop).

Printed per (mechanism, calibration, events), each measured in a process of its own:

- stored: the bytes of each key's stored value (mean, min-max; the format: 4 is the
  mechanism's whole state, 5 the compact form);
- over the quiet markers, per key: the markers that took it from the due wheel
  (wake-ups), the writes of its value (periodic checkpoints), the decodes and the
  CPU-us each took (mean; a compact value's decode replays its counter), and the
  quiet markers' CPU time in all;
- memory, after the quiet markers: the process's resident set growth per key from
  before the events (the store's bytes included; freed heap pages handed back first);
  with `--trace`, what Python allocated per key over that window instead (tracemalloc:
  the operator, its cache and idle entries; the store's keys and values, which RocksDB
  holds outside Python online, left out); and how many keys were decoded then;
- a clean stop: the key values its full checkpoint decoded, per key;
- a restart: a new operator on the store (its due wheel rebuilt from the stored
  values, as after a restore or a takeover), then 120 quiet markers: wake-ups, decodes
  and writes per key, and their CPU time;
- decode alone: the mean CPU-us of decoding 200 stored key values after the run (for a
  compact value, its replay).

Noise key NoiseKey.from_seed(5).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import subprocess
import sys
import time
import tracemalloc
from typing import Any

from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.devtools.inmemory import CopyingStore
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.families import OpenFamily
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.records import Event, encode_batch, encode_marker
from processor.stream.model.state import CounterState

KEY = NoiseKey.from_seed(5)
START = 1_767_225_600  # a tick of 1 s (2026-01-01), the family's start
GAP = 10  # ticks between a key's events


class Counting(Operator):
    """The operator, counting its counter decodes and their CPU time, and the counters
    markers take from the due wheel (wake-ups)."""

    decodes = 0
    decode_s = 0.0
    wakes = 0

    def _idle_entry(self, txn: Any, name: str, entry: Any) -> Any:
        self.wakes += 1
        return super()._idle_entry(txn, name, entry)

    def _decode_counter(self, raw: bytes) -> CounterState:
        t0 = time.process_time()
        try:
            return super()._decode_counter(raw)
        finally:
            self.decodes += 1
            self.decode_s += time.process_time() - t0


class WritesCounted(CopyingStore):
    """The store, counting the writes of key values."""

    key_writes = 0

    def set(self, key: str, value: bytes) -> None:
        if key.startswith("c/pages["):
            self.key_writes += 1
        super().set(key, value)


def _rss() -> int:
    """The resident set, after handing freed heap pages back (as the worker does after
    large flushes: processor/stream/worker/heap.py), so that what was decoded and freed
    is not counted."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _form(raw: bytes) -> str:
    return f"format {raw[3]}"


def measure(mechanism: str, calibration: str, events: int, keys: int, age: int,
            quiet: int, idle_decoded: int, trace: bool) -> dict[str, Any]:
    s = with_overrides(Settings(), counters={}, partitions=1, tick_ms=1000,
                       mechanism=mechanism, calibration=calibration, epsilon=1.0,
                       delta=1e-6, heartbeat_ticks=60, heartbeat_spread=True,
                       families={"pages": OpenFamily(START * 1000, 1e-7)})
    op = Counting(s, KEY, idle_decoded=idle_decoded)
    store = WritesCounted()
    sink = CollectingSink()
    bc = BatchCommit(op, store, sink)
    offset = 0

    def apply(record: bytes) -> None:
        nonlocal offset
        asyncio.run(bc.apply(0, [(offset, record)]))
        offset += 1

    first = START + age
    apply(encode_marker(first - 1))
    asyncio.run(bc.checkpoint())
    gc.collect()
    rss0 = _rss()
    if trace:
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
    rows = [Event(f"pages[key-{k:07d}]", (first + j * GAP) * 1000 + 1, UNIT, 0, i)
            for i, (k, j) in enumerate((k, j) for j in range(events) for k in range(keys))]
    for i in range(0, len(rows), 2000):
        apply(encode_batch(rows[i:i + 2000]))
    last = first + (events - 1) * GAP + 10
    t0 = time.process_time()
    for i, n in enumerate(range(first, last + 1)):
        apply(encode_marker(n))
        if i % 6 == 5:
            asyncio.run(bc.checkpoint(full=False))
    asyncio.run(bc.checkpoint(full=False))
    seal_cpu = time.process_time() - t0
    values = [v for k, v in store.data.items() if k.startswith("c/pages[")]
    assert len(values) == keys
    # The quiet ticks.
    op.decodes, op.decode_s, op.wakes = 0, 0.0, 0
    store.key_writes = 0
    t_quiet = time.process_time()
    for i, n in enumerate(range(last + 1, last + 1 + quiet)):
        apply(encode_marker(n))
        if i % 6 == 5:
            asyncio.run(bc.checkpoint(full=False))
    asyncio.run(bc.checkpoint(full=False))
    quiet_cpu = time.process_time() - t_quiet
    quiet_decodes, quiet_s = op.decodes, op.decode_s
    quiet_wakes, quiet_writes = op.wakes, store.key_writes
    gc.collect()
    rss1 = _rss()
    allocated = 0.0
    if trace:
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        stored_py = sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in store.data.items())
        allocated = sum(st.size_diff for st in after.compare_to(before, "filename")) - stored_py
    decoded = sum(k.startswith("c/pages[") for k in op._cache.section(op._counters))
    assert not sink.releases and not sink.ledger  # no key admitted, nothing published
    op.decodes = 0
    asyncio.run(bc.checkpoint())  # a clean stop
    stop_decodes = op.decodes
    # A restart on the store (a restore, a takeover): a new operator, whose due wheel is
    # rebuilt from the stored values, then 2 heartbeat intervals of quiet markers.
    op = Counting(s, KEY, idle_decoded=idle_decoded)
    bc = BatchCommit(op, store, sink)
    store.key_writes = 0
    t_restart = time.process_time()
    for i, n in enumerate(range(last + 1 + quiet, last + 1 + quiet + 120)):
        apply(encode_marker(n))
        if i % 6 == 5:
            asyncio.run(bc.checkpoint(full=False))
    asyncio.run(bc.checkpoint(full=False))
    restart_cpu = time.process_time() - t_restart
    # Decoding alone.
    sample = [v for k, v in sorted(store.data.items()) if k.startswith("c/pages[")][:200]
    t1 = time.process_time()
    for raw in sample:
        CounterState.from_bytes(raw, op.factory, KEY)
    decode_us = (time.process_time() - t1) / len(sample) * 1e6
    sizes = [len(v) for v in values]
    forms = sorted({_form(v) for v in values})
    return {
        "mechanism": mechanism, "calibration": calibration, "events": events,
        "keys": keys, "age": age, "stored_mean": sum(sizes) / keys,
        "stored_min": min(sizes), "stored_max": max(sizes), "forms": forms,
        "allocated_per_key": allocated / keys,
        "rss_per_key": (rss1 - rss0) / keys, "decoded_after": decoded,
        "seal_cpu_s": seal_cpu, "stop_decodes_per_key": stop_decodes / keys,
        "quiet_decodes_per_key": quiet_decodes / keys,
        "quiet_decode_us": quiet_s / quiet_decodes * 1e6 if quiet_decodes else 0.0,
        "decode_us": decode_us, "published": len(sink.releases) + len(sink.ledger),
        "quiet_wakes_per_key": quiet_wakes / keys, "quiet_writes_per_key": quiet_writes / keys,
        "quiet_cpu_s": quiet_cpu, "restart_wakes_per_key": op.wakes / keys,
        "restart_decodes_per_key": op.decodes / keys,
        "restart_writes_per_key": store.key_writes / keys, "restart_cpu_s": restart_cpu,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mechanism", nargs="+", default=["ecc", "simecc"])
    ap.add_argument("--calibration", nargs="+", default=["paper", "tight"])
    ap.add_argument("--events", nargs="+", type=int, default=[1, 2, 5])
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--age", type=int, default=10_000)
    ap.add_argument("--quiet-ticks", type=int, default=600)
    ap.add_argument("--idle-decoded", type=int, default=1 << 14)
    ap.add_argument("--trace", action="store_true",
                    help="memory by tracemalloc instead of the resident set")
    args = ap.parse_args()
    cases = [(m, c, e) for m in args.mechanism for c in args.calibration for e in args.events]
    if len(cases) > 1:
        # One process per case: a resident set that earlier cases grew says nothing.
        rest = [f"--keys={args.keys}", f"--age={args.age}",
                f"--quiet-ticks={args.quiet_ticks}", f"--idle-decoded={args.idle_decoded}",
                *(["--trace"] if args.trace else [])]
        for m, c, e in cases:
            subprocess.run([sys.executable, __file__, "--mechanism", m, "--calibration", c,
                            "--events", str(e), *rest], check=True)
        return
    for mechanism in args.mechanism:
        for calibration in args.calibration:
            for events in args.events:
                r = measure(mechanism, calibration, events, args.keys, args.age,
                            args.quiet_ticks, args.idle_decoded, args.trace)
                memory = (f"allocated {r['allocated_per_key']:,.0f} B/key" if args.trace
                          else f"RSS +{r['rss_per_key']:,.0f} B/key")
                print(f"{mechanism} {calibration} {events} event(s), {args.keys} keys first "
                      f"seen at tick {args.age:,}: stored {r['stored_mean']:,.0f} B/key "
                      f"({r['stored_min']}-{r['stored_max']}, {', '.join(r['forms'])}); "
                      f"events' markers {r['seal_cpu_s']:.1f} CPU-s; "
                      f"over {args.quiet_ticks} quiet ticks "
                      f"{r['quiet_wakes_per_key']:.2f} wake-ups/key, "
                      f"{r['quiet_writes_per_key']:.2f} writes/key, "
                      f"{r['quiet_decodes_per_key']:.2f} decodes/key at "
                      f"{r['quiet_decode_us']:,.0f} us, {r['quiet_cpu_s']:.2f} CPU-s; "
                      f"then {memory}, "
                      f"{r['decoded_after']} keys decoded; a clean stop "
                      f"{r['stop_decodes_per_key']:.2f} decodes/key; a restart then "
                      f"120 quiet ticks {r['restart_wakes_per_key']:.2f} wake-ups/key, "
                      f"{r['restart_decodes_per_key']:.2f} decodes/key, "
                      f"{r['restart_writes_per_key']:.2f} writes/key, "
                      f"{r['restart_cpu_s']:.2f} CPU-s; decode alone "
                      f"{r['decode_us']:,.0f} us",
                      flush=True)


if __name__ == "__main__":
    main()
