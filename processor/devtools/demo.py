"""The demo (`python -m processor demo`, `bash deploy/demo.sh`): a local broker, the worker,
a bursty producer, the live view (`python -m processor view`), and the private counts
printed as they are released, next to the true count.

The true count is computed HERE, by the demo, from the events the demo itself produced
(demo mode only): the processor never computes or publishes a true count. The demo hands
it, with the dead-letter counts by reason, to the view through a local 0600 file
(`processor.view.overlay`), never through a topic. The deployment (topics, app id, key,
state dir, config, worker process) comes from `processor.devtools.deployment`, as for the
tests and the benchmarks.

Lifecycle: without `--bootstrap` the demo uses the local broker of `python deploy/kafka.py
start` (starting one if none runs); it outlives the demo. Ctrl-C (or SIGTERM) ends the
demo's own clean way: producing stops, the worker and the view stop, a summary prints,
exit 0. At exit the topics and the run directory (config, key, logs) are KEPT, and the
demo prints how to look at them again, audit them (`replay`) and delete them
(`python -m processor demo --delete RUN_DIR`); `--cleanup` deletes them at exit instead.
Killed (even SIGKILL), the demo still takes its worker and view along: the kernel sends
each SIGTERM when the demo goes (`kafka.tools.die_with_parent`).
librdkafka's log lines of the demo's own clients go through Python logging into the run
directory (`demo-clients.log`), never into the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from importlib import import_module
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from processor.commandline import CommandParser
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.devtools.deployment import ROOT, Deployment, isolated_deployment
from processor.devtools.kafka.tools import die_with_parent
from processor.stream.kafka import kafka_io
from processor.stream.model.config import STREAM_MECHANISMS
from processor.view.overlay import write_overlay

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
    # Events per second outside bursts. With the demo's 50 ms ticks (at most 20 events/s
    # leave a counter's queue) these keep the true counts in the hundreds within 30 s,
    # well above SimECC's noise at eps = 10 (RMSE ~54 at 30 s: `plan`, see main_demo).
    rates: tuple[float, ...] = (15.0, 10.0, 6.0)
    burst_every_s: float = 15.0
    burst_size: int = 40
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

    def steps(self) -> list[list[int]]:
        """[[tick, true count], ...] at the ticks where the count changed (and the last)."""
        out: list[list[int]] = []
        ticks = sorted(self.s)
        for i, t in enumerate(ticks):
            v = self.s[t]
            if not out or out[-1][1] != v or i == len(ticks) - 1:
                out.append([t, v])
        return out


# --- where the demo runs ------------------------------------------------------------------

#: Kept runs go here by default (git-ignored, next to the broker jars).
RUNS_DIR = ROOT / "deploy" / ".cache" / "demo-runs"
KAFKA_CLI = ROOT / "deploy" / "kafka.py"
#: The example subscriber of the downstream contract (a plain consumer of the public topic).
SUBSCRIBER = ROOT / "examples" / "python" / "subscriber.py"
#: The demo's app ids start with this; `--delete` refuses a run directory without it.
APP_PREFIX = "dpc-demo-app-"

LEGEND = ("legend: private = the published noisy count · ± bound: |private − true| ≤ bound "
          "with probability ≥ 1 − beta (beta {beta}), a worst case, usually far from reached "
          "· kind: change = the value moved, heartbeat = unchanged, re-sent on schedule "
          "· true = the demo's own count, never published")

#: The one line that says what the viewer sees and which setting trades error for privacy.
EXPLAIN = ("what you see: private = true count + noise, so no single event can be told from "
           "the output (eps {eps} per event); the band ± bound holds the true count with "
           "probability ≥ {conf}; {lag} Lower --epsilon: more privacy, more noise, later "
           "steps (python -m processor plan --epsilon E --delta {delta} --tick-ms {tick} "
           "--rate R shows the trade).")
_LAG = {
    "simecc": "the private line moves only at SimECC's checkpoints (a fixed gap of ticks "
              "that does not depend on the data) and holds between them, so it lags the "
              "truth and catches up in steps.",
    "ecc": "the private line moves only when ECC's noisy test sees enough new events "
           "(a threshold that grows as eps shrinks), so it lags the truth and catches up "
           "in steps.",
}


class _ClientLogs(logging.Handler):
    """Keeps the demo's Kafka client log lines (librdkafka, through Python logging) out of
    the table: counted, kept, and written to the run directory at the end."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.lines) < 10_000:
            self.lines.append(self.format(record))

    def save(self, path: Path) -> Path | None:
        if not self.lines:
            return None
        path.write_text("\n".join(self.lines) + "\n", encoding="utf-8")
        return path


def _client_logger(handler: _ClientLogs) -> logging.Logger:
    logger = logging.getLogger("confluent_kafka.demo")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)  # the client families' floor (processor/stream/model/logs.py)
    return logger


def _local_broker() -> tuple[str, bool]:
    """The bootstrap servers of the `deploy/kafka.py start` broker, starting it if none
    runs; and whether this call started it. It is detached (its own session): Ctrl-C in
    the demo's terminal spares it, and it outlives the demo with the topics."""
    state = _read_broker_state()
    if state is not None:
        print(f"using the local Kafka broker at {state} (python deploy/kafka.py start)",
              flush=True)
        return state, False
    # On the README's port when it is free: then the demo's broker is the one the README's
    # walk-through uses (deploy/config.example.toml looks at localhost:9092), and its
    # `kafka.py start --ports 9092` finds it running instead of failing.
    ports = ["--ports", str(README_PORT)] if _port_free(README_PORT) else []
    command = " ".join(["python deploy/kafka.py start", *ports])
    print(f"starting a local Kafka broker in the background ({command}; the first run "
          "downloads it with Maven)...", flush=True)
    out = subprocess.run([sys.executable, str(KAFKA_CLI), "start", *ports],
                         stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                         check=False)
    if out.returncode != 0 or not out.stdout.strip():
        raise RuntimeError(f"could not start a local Kafka broker (exit {out.returncode})")
    address = out.stdout.strip().splitlines()[-1]
    print(f"local Kafka broker at {address}: it keeps running after the demo (with the "
          "demo's topics); `python deploy/kafka.py stop` stops it and deletes its data",
          flush=True)
    return address, True


#: The port of the README's local broker (`python deploy/kafka.py start --ports 9092`).
README_PORT = 9092


def _port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:`port` (a bind succeeds)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _read_broker_state() -> str | None:
    """The bootstrap servers of a running `deploy/kafka.py start` broker, or None."""
    from processor.devtools.kafka.cluster import LocalKafka
    from processor.devtools.kafka.tools import DEFAULT_STATE_FILE

    try:
        state = json.loads(DEFAULT_STATE_FILE.read_text(encoding="utf-8"))
        if state.get("security", "plaintext") != "plaintext":
            raise RuntimeError("the local broker of `python deploy/kafka.py start` is secured "
                               f"({state['security']}); the demo needs a plaintext one: stop "
                               "it, or give the demo --bootstrap")
        kafka = LocalKafka.attach(state)
        if all(kafka.is_alive(i) for i in range(kafka.nodes)):
            return str(state["bootstrap_servers"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


# --- the live view, as a child process ---------------------------------------------------

def _start_view(config: Path, overlay: Path, port: int, log: Path
                ) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m processor view` on the public topics with the demo's overlay; its own
    session, so the terminal's Ctrl-C reaches the demo, which stops it. (process, URL)."""
    for attempt_port in dict.fromkeys((port, 0)):  # the asked port, else any free one
        with open(log, "ab") as err:
            # SIGTERM (its clean stop) when the demo goes, even killed: never left running.
            proc = subprocess.Popen(
                die_with_parent([sys.executable, "-m", "processor", "view", "--config",
                                 str(config), "--port", str(attempt_port), "--demo-file",
                                 str(overlay), "--poll-ms", "500"], "TERM"),
                stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, cwd=str(ROOT),
                start_new_session=True)
        url = _read_url(proc, 30.0)
        if url is not None:
            return proc, url
        _stop_process(proc)
    raise RuntimeError(f"the live view did not start (log: {log})")


def _read_url(proc: subprocess.Popen[bytes], timeout_s: float) -> str | None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline().decode(errors="replace")
            if line.startswith("view: "):
                return line.split()[1]
            if not line:
                return None
    return None


def _stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5.0)
    if proc.stdout is not None:
        proc.stdout.close()


# --- the command ---------------------------------------------------------------------------

def main_demo(argv: Sequence[str] | None = None) -> int:
    """`python -m processor demo [--seconds 60] [--tick-ms 250] [--mechanism ecc] ...`."""
    p = CommandParser(
        prog="python -m processor demo",
        description="Local broker + processor + bursty demo producer + live view; prints the "
        "private counts as they are released with the demo's own true count beside them. "
        "Ctrl-C stops it cleanly; the topics and the run directory are kept for replay.")
    p.add_argument("--seconds", type=float, default=60.0, help="how long to produce (s)")
    # The defaults are chosen with `python -m processor plan --epsilon 10 --delta 1e-6
    # --tick-ms 50 --rate 15 --horizon 10s 30s 60s`: SimECC with the tight calibration first
    # changes after 2.6 s and then every 2.5 s, RMSE 34.6 / 54.3 / 54.9 events at 10 / 30 /
    # 60 s (published bound 104 / 125 / 143) while the true count of the busiest counter
    # reaches ~450 in 30 s (the queue lets at most one event through per 50 ms tick). ECC
    # at the same eps first changes after 12 s (RMSE ~150), and the paper calibration is
    # several times slower: both shown by the same plan command. eps = 10 per event is a
    # level practitioners publish under; the old demo ran at eps = 400.
    p.add_argument("--tick-ms", type=int, default=50, help="tick length (ms, default 50)")
    p.add_argument("--lateness-ms", type=int, default=1000,
                   help="allowed lateness before a tick is sealed (ms, default 1000)")
    p.add_argument("--mechanism", choices=STREAM_MECHANISMS, default="simecc",
                   help="the private counter (default simecc: its checkpoints come on a "
                   "fixed schedule, so it moves within seconds at a small eps)")
    p.add_argument("--calibration", choices=("paper", "tight"), default="tight",
                   help="the paper's constants or the tight analysis (default tight: the "
                   "same eps and delta with less noise, docs/tight-calibration.md)")
    p.add_argument("--epsilon", type=float, default=10.0,
                   help="privacy parameter eps per event (default 10; smaller is more private "
                   "and noisier)")
    p.add_argument("--delta", type=float, default=1e-6, help="privacy parameter delta")
    p.add_argument("--seed", type=int, default=7, help="seed of the demo traffic (not noise)")
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", ""),
                   help="use this broker (default: $KAFKA_BOOTSTRAP_SERVERS, else the local "
                   "broker of `python deploy/kafka.py start`, started if none runs)")
    p.add_argument("--view-port", type=int, default=8080,
                   help="port of the live view on 127.0.0.1 (default 8080, any free port if "
                   "taken; 0: any free port)")
    p.add_argument("--no-view", action="store_true", help="do not start the live view")
    p.add_argument("--metrics-port", type=int, default=9464,
                   help="port of the worker's operator metrics on 127.0.0.1 (default 9464, "
                   "any free port if taken; 0: any free port)")
    p.add_argument("--runs-dir", default=str(RUNS_DIR),
                   help="where each run's directory (config, key, logs) is kept")
    p.add_argument("--cleanup", action="store_true",
                   help="at exit delete the topics and the run directory, and stop a broker "
                   "the demo started (default: keep them to consume and audit)")
    p.add_argument("--delete", metavar="RUN_DIR",
                   help="delete a kept run (its topics and directory) and exit")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.delete:
        return delete_run(Path(args.delete))

    # The first private count waits for the broker's start, then for the worker's; the
    # demo's own heavy import (Faust's, to create the topics) runs meanwhile.
    threading.Thread(target=_import_quietly, args=(TOPICS_MODULE,), daemon=True).start()
    started_broker = False
    bootstrap = args.bootstrap
    if not bootstrap:
        bootstrap, started_broker = _local_broker()
    runs = Path(args.runs_dir)
    runs.mkdir(parents=True, exist_ok=True)
    tick = int(args.tick_ms)
    start_ms = (int(time.time() * 1000) // tick) * tick
    plan = TrafficPlan()
    deployment = isolated_deployment(
        bootstrap, dict.fromkeys(plan.counters, start_ms), parent=runs, name="dpc-demo",
        partitions=2, tick_ms=tick, lateness_ms=int(args.lateness_ms), max_future_ms=60_000,
        mechanism=args.mechanism, calibration=args.calibration, epsilon=args.epsilon,
        delta=args.delta, heartbeat_ticks=max(1, 5000 // tick),  # a heartbeat every ~5 s
        metrics_host="127.0.0.1", metrics_port=_free_port(int(args.metrics_port)),
        create_topics=False)  # created by _Run while the worker starts
    # A demo never leaves its worker running, even killed; the worker stays in the demo's
    # process group, so the terminal's Ctrl-C reaches it too.
    deployment.worker.dies_with_parent = True
    with deployment:
        code = _Run(args, plan, deployment, start_ms).run()
    if args.cleanup:
        delete_run(deployment.directory)
        if started_broker:
            subprocess.run([sys.executable, str(KAFKA_CLI), "stop"], check=False)
    else:
        _print_kept(deployment, started_broker or not args.bootstrap)
    return code


#: Where `ensure_topics` lives (it imports Faust: about a second).
TOPICS_MODULE = "processor.stream.worker.app"


def _import_quietly(module: str) -> None:
    """Import `module` ahead of its use (a background thread's warm-up). A failure is left
    to the real import, which raises it where it is handled."""
    with contextlib.suppress(Exception):
        import_module(module)


def _free_port(wanted: int) -> int:
    """`wanted` if nothing listens there on 127.0.0.1, else (or for 0) a free port."""
    import socket

    for port in dict.fromkeys((wanted, 0)):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise RuntimeError("no free port for the worker's metrics")


def _print_kept(deployment: Deployment, local_broker: bool) -> None:
    here = Path.cwd()

    def short(path: Path) -> Path:
        return path.relative_to(here) if path.is_relative_to(here) else path

    d, cfg, t = short(deployment.directory), short(deployment.config), deployment.topics
    broker = deployment.settings.bootstrap_servers
    exe = Path(sys.executable)
    py = str(short(exe)) if exe.is_relative_to(here) else "python"
    lines = [
        f"\nkept for you: the topics on {broker}"
        + (" (the local broker keeps running)" if local_broker else "")
        + f" and the run directory {d} (config, noise key, logs)",
        f"  topics      public: {t.counts}, {t.ledger}; operator-only: {t.input}, "
        f"{t.timeline}, {t.deadletter}",
        f"  look again  {py} -m processor view --config {cfg} "
        f"--demo-file {d}/demo-overlay.json",
    ]
    if SUBSCRIBER.is_file():
        lines.append(f"  consume     {py} {short(SUBSCRIBER)} --bootstrap-servers {broker} "
                     f"--topic {t.counts} --until-end")
    lines += [
        f"  audit       {py} -m processor replay --config {cfg}",
        f"  delete      {py} -m processor demo --delete {d}"
        + ("   (then `python deploy/kafka.py stop` stops the broker)" if local_broker else ""),
    ]
    print("\n".join(lines), flush=True)


def delete_run(run_dir: Path) -> int:
    """Delete a kept demo run: its five topics, the worker's internal topics (they start
    with its app id) and the directory. Refuses anything that is not a demo run."""
    from processor.stream.model.config import load_settings

    config = run_dir / "worker.toml"
    settings = load_settings(str(config), {})
    if not settings.app_id.startswith(APP_PREFIX):
        raise RuntimeError(f"{run_dir} is not a demo run (app id {settings.app_id!r})")
    conf = kafka_io.base_config(settings)
    admin = kafka_io.make_admin(conf)
    existing = admin.list_topics(timeout=30).topics
    t = settings.topics
    names = sorted(n for n in existing if n in {t.input, t.timeline, t.counts, t.ledger,
                                                 t.deadletter}
                   or n.startswith(settings.app_id + "-"))
    if names:
        for name, fut in admin.delete_topics(names, operation_timeout=30).items():
            try:
                fut.result(timeout=60)
            except Exception as exc:
                print(f"could not delete topic {name}: {exc}", file=sys.stderr)
    shutil.rmtree(run_dir)
    print(f"deleted {len(names)} topics and {run_dir}", flush=True)
    return 0


class _Run:
    """One demo run: produce, tail the topics, print the table, feed the view, stop."""

    def __init__(self, args: argparse.Namespace, plan: TrafficPlan, deployment: Deployment,
                 start_ms: int) -> None:
        self.args, self.plan, self.deployment = args, plan, deployment
        self.settings = deployment.settings
        self.tick = self.settings.tick_ms
        self.start_ms = start_ms
        self.records = plan.plan(args.seconds, args.seed,
                                 late_ms=3 * self.tick + self.settings.lateness_ms)
        self.truth = {c: QueueTruth(self.tick, start_ms // self.tick) for c in plan.counters}
        self.overlay = deployment.directory / "demo-overlay.json"
        self.client_logs = _ClientLogs()
        self.stop_signal: int | None = None
        self.dead: Counter[str] = Counter()
        self.produced = {"events": 0, "bad": 0}
        self.releases = 0
        self.ledger = 0
        #: counter -> (largest |private - true| seen, largest bound printed)
        self.errors: dict[str, tuple[float, float]] = {}

    def _on_signal(self, signum: int, _frame: object) -> None:
        # The terminal's Ctrl-C reaches the worker too (same process group) and it shuts
        # down by itself; the demo notes the request and leaves its loop at the next turn.
        if self.stop_signal is None:
            self.stop_signal = signum
            print("\nstopping (Ctrl-C): the worker and the view shut down cleanly...",
                  flush=True)

    def run(self) -> int:
        logger = _client_logger(self.client_logs)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        view: subprocess.Popen[bytes] | None = None
        worker = self.deployment.worker
        try:
            worker.start()
            # The topics, for the demo's consumer and the view, while the worker imports
            # (it creates them too: ensure_topics is made for workers starting at once).
            from processor.stream.worker.app import ensure_topics  # TOPICS_MODULE, warmed up

            ensure_topics(self.settings)
            self._write_overlay()
            port = self.settings.metrics_port
            print(f"worker metrics: http://127.0.0.1:{port}/metrics  (operator-only: "
                  f"exact aggregate counts; /readyz, /healthz beside it)", flush=True)
            if not self.args.no_view:
                view, url = _start_view(self.deployment.config, self.overlay,
                                        self.args.view_port,
                                        self.deployment.directory / "view.log")
                print(f"live view: {url}  (open it in a browser; it reads the public topics "
                      "only, plus the demo's own true count from a local file)", flush=True)
            result = self._loop(logger)
        finally:
            code = worker.stop()
            if view is not None:
                _stop_process(view)
            for s, h in old.items():
                signal.signal(s, h)
            self._summary(code)
        # An error exit of the worker fails the demo; a negative code is a signal (our own
        # SIGTERM before its handlers were installed, the terminal's SIGINT), not a failure.
        return 1 if result == 0 and code > 0 else result

    def _loop(self, logger: logging.Logger) -> int:
        s, conf = self.settings, self.deployment.conf
        # librdkafka's lines through Python logging (a `logger`), never onto the table.
        client: dict[str, Any] = {**conf, "logger": logger}
        producer = kafka_io.make_producer(client)
        consumer = Consumer({**client, "group.id": f"dpc-demo-{os.getpid()}",
                             "enable.auto.commit": "false", "auto.offset.reset": "earliest"})
        n_valid = sum(r.valid for r in self.records)
        print(f"worker started; producing {n_valid} events and "
              f"{len(self.records) - n_valid} bad records over {self.args.seconds:.0f}s "
              f"({s.mechanism}, {s.calibration} calibration, eps={s.epsilon}, "
              f"delta={s.delta}, tick {self.tick} ms); "
              "Ctrl-C stops", flush=True)
        print(EXPLAIN.format(eps=f"{s.epsilon:g}", conf=f"{1 - s.beta:g}",
                             lag=_LAG.get(s.mechanism, ""), delta=f"{s.delta:g}",
                             tick=self.tick), flush=True)
        print(LEGEND.format(beta=s.beta), flush=True)
        print(f"{'time':<8} {'counter':<10} {'tick':>5} {'kind':<9} {'private':>9} "
              f"{'± bound':>9} {'true':>6}", flush=True)
        try:
            topics = [s.topics.counts, s.topics.ledger, s.topics.deadletter]
            consumer.assign([TopicPartition(name, p, -2) for name in topics
                             for p in consumer.list_topics(name, timeout=30)
                             .topics[name].partitions])
            t0 = time.monotonic()
            base_ms = int(time.time() * 1000)
            end_at = self.args.seconds + (s.lateness_ms + 4 * self.tick) / 1000.0
            i = 0
            next_overlay = 0.0
            while self.stop_signal is None and time.monotonic() - t0 < end_at:
                elapsed = time.monotonic() - t0
                while i < len(self.records) and self.records[i].at_s <= elapsed:
                    self._produce(producer, self.records[i], base_ms)
                    i += 1
                producer.poll(0)
                sealed = (int(time.time() * 1000) - s.lateness_ms) // self.tick - 1
                for q in self.truth.values():
                    q.advance(sealed)
                batch: list[Any] = consumer.consume(num_messages=500, timeout=0.2)
                self._show([(str(m.topic()), orjson.loads(m.value())) for m in batch
                            if m.error() is None and m.value()])
                if time.monotonic() >= next_overlay:
                    self._write_overlay()
                    next_overlay = time.monotonic() + 0.5
                if self.stop_signal is None and not self.deployment.worker.alive():
                    print("worker exited unexpectedly:\n" + self.deployment.worker.log_tail(),
                          file=sys.stderr)
                    return 1
            self._write_overlay()
            return 0
        finally:
            producer.flush(10)
            consumer.close()

    def _produce(self, producer: Any, r: PlannedRecord, base_ms: int) -> None:
        if r.valid and r.counter is not None:
            ts = base_ms + int(r.at_s * 1000) - r.late_by_ms
            self.truth[r.counter].add(ts)
            raw = orjson.dumps({"counter": r.counter, "ts": ts})
            self.produced["events"] += 1
        else:
            raw = r.raw
            self.produced["bad"] += 1
        producer.produce(self.settings.topics.input, value=raw)

    def _show(self, batch: list[tuple[str, Any]]) -> None:
        """Count the dead letters; print the ledger entries, then the releases in time
        order (a batch holds one partition's records after another's)."""
        t = self.settings.topics
        for topic, rec in batch:
            if topic == t.deadletter:
                self.dead[str(rec.get("reason", "?"))] += 1
            elif topic == t.ledger:
                self.ledger += 1
                print(f"ledger: {rec.get('counter')} announced ({rec.get('mechanism')}, "
                      f"eps={rec.get('epsilon')}, delta={rec.get('delta')}, "
                      f"tick {rec.get('tick_ms')} ms)", flush=True)
        releases = [rec for topic, rec in batch if topic == t.counts]
        releases.sort(key=lambda r: (int(r["tick_start_ms"]), str(r["counter"])))
        for rec in releases:
            self._row(rec)

    def _row(self, rec: dict[str, Any]) -> None:
        self.releases += 1
        name, tick = str(rec["counter"]), int(rec["tick"])
        tr = self.truth.get(name)
        true_s = None
        if tr is not None:
            # A release for tick t means t is sealed: bring the truth up to it.
            tr.advance(tr.start_tick + tick - 1)
            true_s = tr.at(tick)
        value, bound = float(rec["value"]), float(rec["error_bound"])
        if true_s is not None:
            err, big = self.errors.get(name, (0.0, 0.0))
            self.errors[name] = (max(err, abs(value - true_s)), max(big, bound))
        when = datetime.fromtimestamp(
            (int(rec["tick_start_ms"]) + int(rec["tick_ms"])) / 1000).strftime("%H:%M:%S")
        print(f"{when:<8} {name:<10} {tick:>5} {rec['kind']:<9} {value:>9.2f} "
              f"{bound:>9.1f} {'' if true_s is None else true_s:>6}", flush=True)

    def _write_overlay(self) -> None:
        write_overlay(self.overlay, {
            "truth": {c: q.steps() for c, q in self.truth.items()},
            "start_ms": dict.fromkeys(self.truth, self.start_ms),
            "tick_ms": self.tick,
            "dead_letters": dict(self.dead),
            "produced": self.produced,
            "note": (f"demo: {self.produced['events']} events and {self.produced['bad']} bad "
                     "records produced so far; the dashed line is the demo's own true count"),
        })

    def _summary(self, worker_code: int) -> None:
        how = ("stopped by Ctrl-C" if self.stop_signal == signal.SIGINT
               else "stopped by SIGTERM" if self.stop_signal is not None else "done")
        print(f"\n{how}: {self.produced['events']} events and {self.produced['bad']} bad "
              f"records produced; {self.releases} releases and {self.ledger} ledger entries "
              f"shown; worker exit code {worker_code}", flush=True)
        if self.dead:
            print("dead letters by reason: " + ", ".join(
                f"{reason} {n}" for reason, n in sorted(self.dead.items())), flush=True)
        for name, (err, bound) in sorted(self.errors.items()):
            print(f"  {name:<10} largest |private - true| {err:.1f}, largest bound {bound:.1f}",
                  flush=True)
        saved = self.client_logs.save(self.deployment.directory / "demo-clients.log")
        if saved is not None and not self.args.cleanup:  # --cleanup deletes it right after
            print(f"{len(self.client_logs.lines)} Kafka client log lines: {saved}", flush=True)
