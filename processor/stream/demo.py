"""The demo: a local broker, the worker, a bursty producer and the private counts printed as
they are released, next to the true count.

The true count is computed HERE, by the demo, from the events the demo itself produced
(demo mode only): the processor never computes or publishes a true count.

Also home of the pieces tests and the benchmark share to run the real worker:
`render_toml` (Settings -> a config file) and `WorkerProcess` (the worker as a child
process that can be stopped cleanly or killed with SIGKILL).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any

import orjson

from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.devtools.local_kafka import LocalKafka
from processor.stream import kafka_io
from processor.stream.config import SecuritySettings, Settings, TopicSettings, with_overrides

ROOT = Path(__file__).resolve().parents[2]


# --- configuration files ---------------------------------------------------------------

def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    # A JSON string of printable text is a valid TOML basic string.
    return orjson.dumps(str(v)).decode()


def render_toml(settings: Settings) -> str:
    """A TOML configuration that `load_settings` reads back as `settings`."""
    lines: list[str] = []
    for f in fields(Settings):
        if f.name in ("security", "topics", "counters"):
            continue
        v = getattr(settings, f.name)
        if v is not None:
            lines.append(f"{f.name} = {_toml_value(v)}")
    lines.append("[security]")
    for f in fields(SecuritySettings):
        v = getattr(settings.security, f.name)
        if v is not None:
            lines.append(f"{f.name} = {_toml_value(v)}")
    lines.append("[topics]")
    for f in fields(TopicSettings):
        lines.append(f"{f.name} = {_toml_value(getattr(settings.topics, f.name))}")
    lines.append("[counters]")
    for name, start in settings.counters.items():
        lines.append(f"{_toml_value(name)} = {int(start)}")
    return "\n".join(lines) + "\n"


def write_config(settings: Settings, path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    p.write_text(render_toml(settings), encoding="utf-8")
    return p


def write_key(path: str | os.PathLike[str], secret: bytes | None = None) -> Path:
    """Write a noise key file (hex, mode 0600); a fresh random key unless `secret` is given."""
    p = Path(path)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write((secret if secret is not None else NoiseKey.generate()).hex() + "\n")
    return p


# --- the worker as a child process -----------------------------------------------------

class WorkerProcess:
    """`python -m processor worker --config F` as a child process.

    stop() sends SIGTERM (a graceful Faust shutdown); kill() sends SIGKILL (a crash).
    Output goes to `log_path`, never to the caller's terminal.
    """

    def __init__(self, config_path: str | os.PathLike[str], log_path: str | os.PathLike[str],
                 *, loglevel: str = "warning", env: dict[str, str] | None = None) -> None:
        self.config_path = str(config_path)
        self.log_path = Path(log_path)
        self.loglevel = loglevel
        self.env = dict(os.environ if env is None else env)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.starts = 0

    def start(self) -> WorkerProcess:
        if self.alive():
            raise RuntimeError("worker already running")
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "processor", "worker", "--config", self.config_path,
             "--loglevel", self.loglevel],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=str(ROOT), env=self.env)
        self.starts += 1
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, exactly like a crashed machine process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self._reap(30.0)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self._reap(30.0)

    def _reap(self, timeout_s: float) -> int:
        code = 0
        if self.proc is not None:
            code = self.proc.wait(timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        return int(code)

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
    p.add_argument("--mechanism", choices=("ecc", "simecc"), default="ecc")
    p.add_argument("--epsilon", type=float, default=400.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--seed", type=int, default=7, help="seed of the demo traffic (not noise)")
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", ""),
                   help="use this broker instead of starting a local one")
    args = p.parse_args(list(argv) if argv is not None else None)

    kafka: LocalKafka | None = None
    with tempfile.TemporaryDirectory(prefix="dpc-demo-") as tmp:
        bootstrap = args.bootstrap
        if not bootstrap:
            print("starting a local Kafka broker (first run downloads it with Maven)...",
                  flush=True)
            kafka = LocalKafka(1).start()
            bootstrap = kafka.bootstrap_servers
        try:
            return _run_demo(args, bootstrap, Path(tmp))
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            return 130
        finally:
            if kafka is not None:
                kafka.stop()


def _run_demo(args: argparse.Namespace, bootstrap: str, tmp: Path) -> int:
    tick = int(args.tick_ms)
    now = int(time.time() * 1000)
    start_ms = (now // tick) * tick
    plan = TrafficPlan()
    run_id = f"{int(time.time())}-{os.getpid()}"
    settings = with_overrides(
        Settings(), app_id=f"dpc-demo-{run_id}", bootstrap_servers=bootstrap,
        topics=TopicSettings(input=f"demo-input-{run_id}", timeline=f"demo-timeline-{run_id}",
                             counts=f"demo-counts-{run_id}", ledger=f"demo-ledger-{run_id}",
                             deadletter=f"demo-dead-{run_id}"),
        partitions=2, tick_ms=tick, lateness_ms=int(args.lateness_ms), max_future_ms=60_000,
        mechanism=args.mechanism, epsilon=args.epsilon, delta=args.delta,
        heartbeat_ticks=20, counters={c: start_ms for c in plan.counters},
        noise_key_file=str(write_key(tmp / "noise.key")), state_dir=str(tmp / "state"))
    cfg = write_config(settings, tmp / "demo.toml")
    conf = kafka_io.base_config(settings)
    from processor.stream.app import ensure_topics

    ensure_topics(settings)
    records = plan.plan(args.seconds, args.seed, late_ms=3 * tick + int(args.lateness_ms))
    truth = {c: QueueTruth(tick, start_ms // tick) for c in plan.counters}
    worker = WorkerProcess(cfg, tmp / "worker.log", loglevel="warning").start()
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
