"""The demo (`python -m processor demo`, `bash deploy/demo.sh`): a local broker, the worker,
a bursty producer and the private counts printed as they are released, next to the true
count.

The true count is computed HERE, by the demo, from the events the demo itself produced
(demo mode only): the processor never computes or publishes a true count. The deployment
(topics, app id, key, state dir, config, worker process) comes from
`processor.devtools.deployment`, as for the tests and the benchmarks.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.devtools.deployment import Deployment, isolated_deployment
from processor.devtools.local_kafka import LocalKafka
from processor.stream import kafka_io
from processor.stream.config import STREAM_MECHANISMS

# --- demo traffic -----------------------------------------------------------------------

class _Uniform:
    """Uniform draws in [0, 1) for demo traffic, from the project's keyed generator."""

    def __init__(self, seed: int) -> None:
        self._cursor = WordCursor(KeyedStream(NoiseKey.from_seed(seed), "demo/traffic"))

    def __call__(self) -> float:
        return (self._cursor.next_word() >> 11) / float(1 << 53)

    def exp(self, rate: float) -> float:
        return -math.log(1.0 - self()) / rate


@dataclass
class PlannedRecord:
    """One input record the demo will produce, `at_s` seconds after the start."""

    at_s: float
    counter: str | None
    raw: bytes
    valid: bool
    late_by_ms: int = 0


@dataclass
class TrafficPlan:
    """Per counter: a Poisson rate with bursts and idle gaps; a few late and bad records."""

    counters: tuple[str, ...] = ("signups", "purchases", "incidents")
    rates: tuple[float, ...] = (2.0, 0.7, 0.15)  # events per second outside bursts
    burst_every_s: float = 15.0
    burst_size: int = 12
    idle_every_s: float = 20.0
    idle_for_s: float = 6.0
    late_fraction: float = 0.03
    bad_fraction: float = 0.02
    records: list[PlannedRecord] = field(default_factory=list)

    def plan(self, seconds: float, seed: int, late_ms: int) -> list[PlannedRecord]:
        """The records to produce over `seconds`, in time order (deterministic in `seed`)."""
        u = _Uniform(seed)
        out: list[PlannedRecord] = []
        for i, (name, rate) in enumerate(zip(self.counters, self.rates, strict=True)):
            t = 0.0
            while True:
                t += u.exp(rate)
                if t >= seconds:
                    break
                # An idle gap: a stretch with no events at all for this counter.
                if (t + i * 3.0) % self.idle_every_s < self.idle_for_s:
                    continue
                late = late_ms if u() < self.late_fraction else 0
                out.append(PlannedRecord(t, name, b"", True, late))
            b = self.burst_every_s * (0.5 + i * 0.3)
            while b < seconds:
                out.extend(PlannedRecord(b + k * 0.01, name, b"", True)
                           for k in range(self.burst_size))
                b += self.burst_every_s
        bad = [b"not json", b'{"counter": "signups", "ts": 1, "value": 3}',
               b'{"counter": "nobody-declared-me"}', b'{"counter": 5}',
               b'{"counter": "signups", "value": 0.5}']
        n_bad = max(len(bad), int(len(out) * self.bad_fraction))
        for k in range(n_bad):
            out.append(PlannedRecord(u() * seconds, None, bad[k % len(bad)], False))
        out.sort(key=lambda r: r.at_s)
        self.records = out
        return out


class QueueTruth:
    """The demo's own true count per counter under the FIFO-per-tick discipline.

    Events join their tick (event time); each tick at most one leaves the queue; s_t counts
    what has left. Late events are placed at their event time here, so around them this can
    differ slightly from the processor's assignment (which moves them to the first open tick).
    """

    def __init__(self, tick_ms: int, start_tick: int) -> None:
        self.tick_ms = tick_ms
        self.start_tick = start_tick
        self.arrivals: dict[int, int] = {}
        self._queue: deque[int] = deque()
        self._next = start_tick
        self.s: dict[int, int] = {}  # local tick -> true count

    def add(self, ts_ms: int) -> None:
        g = max(ts_ms // self.tick_ms, self.start_tick)
        self.arrivals[g] = self.arrivals.get(g, 0) + 1

    def advance(self, through_global: int) -> None:
        total = self.s.get(self._next - self.start_tick, 0)
        while self._next <= through_global:
            self._queue.extend([1] * self.arrivals.pop(self._next, 0))
            if self._queue:
                total += self._queue.popleft()
            self._next += 1
            self.s[self._next - self.start_tick] = total

    def at(self, local_tick: int) -> int | None:
        return self.s.get(local_tick)


def _tail_counts(conf: dict[str, str], topic: str
                 ) -> Generator[list[dict[str, Any]], None, None]:
    """Yield batches of decoded release records as they arrive (from the beginning)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**conf, "group.id": f"dpc-demo-{os.getpid()}", "enable.auto.commit": "false",
                  "auto.offset.reset": "earliest"})
    try:
        md = c.list_topics(topic, timeout=30)
        c.assign([TopicPartition(topic, p, -2) for p in md.topics[topic].partitions])
        while True:
            batch: list[Any] = c.consume(num_messages=500, timeout=0.2)
            yield [orjson.loads(m.value()) for m in batch if m.error() is None and m.value()]
    finally:
        c.close()


def main_demo(argv: Sequence[str] | None = None) -> int:
    """`python -m processor demo [--seconds 60] [--tick-ms 1000] [--mechanism ecc]`."""
    p = argparse.ArgumentParser(
        prog="python -m processor demo",
        description="Local broker + processor + bursty demo producer; prints the private "
        "counts as they are released with the demo's own true count beside them.")
    p.add_argument("--seconds", type=float, default=60.0, help="how long to produce (s)")
    # The queue lets at most one event through per tick, so a one-minute demo counts at
    # most a few hundred events; a short tick and a large epsilon make the private count
    # visibly move within that minute. Production settings come from the config file.
    p.add_argument("--tick-ms", type=int, default=250)
    p.add_argument("--lateness-ms", type=int, default=1000)
    p.add_argument("--mechanism", choices=STREAM_MECHANISMS, default="ecc")
    p.add_argument("--epsilon", type=float, default=400.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--seed", type=int, default=7, help="seed of the demo traffic (not noise)")
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", ""),
                   help="use this broker instead of starting a local one")
    args = p.parse_args(list(argv) if argv is not None else None)

    kafka: LocalKafka | None = None
    bootstrap = args.bootstrap
    if not bootstrap:
        print("starting a local Kafka broker (first run downloads it with Maven)...",
              flush=True)
        kafka = LocalKafka(1).start()
        bootstrap = kafka.bootstrap_servers
    try:
        return _run_demo(args, bootstrap)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        return 130
    finally:
        if kafka is not None:
            kafka.stop()


def _run_demo(args: argparse.Namespace, bootstrap: str) -> int:
    tick = int(args.tick_ms)
    now = int(time.time() * 1000)
    start_ms = (now // tick) * tick
    plan = TrafficPlan()
    with isolated_deployment(
            bootstrap, dict.fromkeys(plan.counters, start_ms), name="dpc-demo", partitions=2,
            tick_ms=tick, lateness_ms=int(args.lateness_ms), max_future_ms=60_000,
            mechanism=args.mechanism, epsilon=args.epsilon, delta=args.delta,
            heartbeat_ticks=20) as deployment:
        return _produce_and_show(args, plan, deployment, start_ms)


def _produce_and_show(args: argparse.Namespace, plan: TrafficPlan, deployment: Deployment,
                      start_ms: int) -> int:
    settings, conf = deployment.settings, deployment.conf
    tick = settings.tick_ms
    records = plan.plan(args.seconds, args.seed, late_ms=3 * tick + settings.lateness_ms)
    truth = {c: QueueTruth(tick, start_ms // tick) for c in plan.counters}
    worker = deployment.worker.start()
    producer = kafka_io.make_producer(conf)
    print(f"worker started; producing {sum(r.valid for r in records)} events and "
          f"{sum(not r.valid for r in records)} bad records over {args.seconds:.0f}s "
          f"({settings.mechanism}, eps={settings.epsilon}, delta={settings.delta}, "
          f"tick {tick} ms)", flush=True)
    print(f"{'counter':<10} {'tick':>5} {'kind':<9} {'private':>9} {'± bound':>9} "
          f"{'true':>6}", flush=True)
    t0 = time.monotonic()
    base_ms = int(time.time() * 1000)
    i = 0
    end_at = args.seconds + (settings.lateness_ms + 4 * tick) / 1000.0
    tail = _tail_counts(conf, settings.topics.counts)
    try:
        while time.monotonic() - t0 < end_at:
            elapsed = time.monotonic() - t0
            while i < len(records) and records[i].at_s <= elapsed:
                r = records[i]
                i += 1
                if r.valid and r.counter is not None:
                    ts = base_ms + int(r.at_s * 1000) - r.late_by_ms
                    truth[r.counter].add(ts)
                    raw = orjson.dumps({"counter": r.counter, "ts": ts})
                else:
                    raw = r.raw
                producer.produce(settings.topics.input, value=raw)
            producer.poll(0)
            sealed = (int(time.time() * 1000) - settings.lateness_ms) // tick - 1
            for q in truth.values():
                q.advance(sealed)
            for rel in next(tail):
                tr = truth.get(str(rel["counter"]))
                true_s = None
                if tr is not None:
                    # A release for tick t means t is sealed: bring the truth up to it.
                    tr.advance(tr.start_tick + int(rel["tick"]) - 1)
                    true_s = tr.at(int(rel["tick"]))
                print(f"{rel['counter']:<10} {rel['tick']:>5} {rel['kind']:<9} "
                      f"{rel['value']:>9.2f} {rel['error_bound']:>9.1f} "
                      f"{'' if true_s is None else true_s:>6}", flush=True)
            if not worker.alive():
                print("worker exited unexpectedly:\n" + worker.log_tail(), file=sys.stderr)
                return 1
    finally:
        producer.flush(10)
        tail.close()
        code = worker.stop()
    print(f"done; worker exit code {code}", flush=True)
    return 0 if code == 0 else 1
