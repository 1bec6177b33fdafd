"""The Faust worker: the only module of the project that imports Faust.

Three pieces, all built from Settings by `build_app`:

- the ingest agent: input topic -> `records.parse_input` -> the timeline topic, at the
  counter's partition `partition_for(counter, P)`, or the dead-letter topic with a reason;
- the leader timer: appends "sealed through n" markers to every timeline partition once
  tick n's end plus the allowed lateness has passed on the wall clock;
- the operator agent: timeline -> `Operator.apply` on a Faust table (RocksDB via
  rocksdict, changelogged to Kafka) -> private-count and ledger topics.

The dead-letter topic is the only place raw input bytes appear (base64, truncated): it is a
private topic, like the input. The private-count and ledger topics are public.

Crash safety (at-least-once, never exactly-once; see DESIGN.md):
- every timeline event carries a header naming its input partition and offset, so the
  duplicates that a crash of the ingest agent creates are dropped by `TimelineApplier`
  (the same code replay runs);
- the operator's state writes are buffered during `apply`; the releases are sent and
  acknowledged by the broker first, then the state is written (per-counter values first,
  per-partition values last). A crash before the state write re-executes the record and
  re-sends identical releases (noise is keyed, never redrawn); a crash after it finds the
  releases already delivered. So a release is never lost and never has two values.
- after an unclean stop the local RocksDB files are discarded and rebuilt from the
  changelog, since they may hold writes the changelog never received.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import ssl
import sys
import time
from collections import Counter as Tally
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust

from processor.core.rng import NoiseKey
from processor.stream import kafka_io
from processor.stream.config import ConfigError, Settings, load_settings
from processor.stream.operator import Operator
from processor.stream.records import Rejection, deadletter_record, parse_input, sealed_through
from processor.stream.replay import (
    BufferedStore,
    TimelineApplier,
    encode_marker_record,
    encode_source,
    load_noise_key,
    partition_of,
    timeline_event_bytes,
)

log = logging.getLogger("processor.stream.app")

STATE_TABLE = "dpc-state"
#: A file in state_dir that exists while a worker runs; found at start => unclean stop.
RUNNING_FLAG = "WORKER_RUNNING"
#: How often the metrics summary (aggregate counts only) is logged.
METRICS_LOG_S = 30.0


@dataclass
class WorkerMetrics:
    """Aggregate counters of one worker process. Never per-counter, never values."""

    counts: Tally[str] = field(default_factory=Tally)

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def add_output_metrics(self, deltas: object) -> None:
        """Fold the operator's metric deltas (a mapping or a dataclass of ints)."""
        items: Mapping[str, Any]
        if isinstance(deltas, Mapping):
            items = deltas
        elif hasattr(deltas, "__dataclass_fields__"):
            items = {k: getattr(deltas, k) for k in deltas.__dataclass_fields__}
        else:
            return
        for k, v in items.items():
            if isinstance(v, int) and not isinstance(v, bool) and v:
                self.counts[f"operator_{k}"] += v

    def summary(self) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))


def _ssl_context(settings: Settings) -> ssl.SSLContext | None:
    sec = kafka_io.security_config(settings)
    protocol = sec.get("security.protocol", "plaintext")
    if "ssl" not in protocol:
        return None
    ctx = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH,
                                     cafile=sec.get("ssl.ca.location"))
    cert = sec.get("ssl.certificate.location")
    if cert:
        ctx.load_cert_chain(cert, sec.get("ssl.key.location"))
    return ctx


def broker_credentials(settings: Settings) -> faust.types.auth.CredentialsT | None:
    """Faust credentials for the configured security protocol (None for plaintext)."""
    sec = kafka_io.security_config(settings)
    protocol = sec.get("security.protocol", "plaintext")
    ctx = _ssl_context(settings)
    if protocol.startswith("sasl"):
        return faust.SASLCredentials(
            username=sec.get("sasl.username"),
            password=sec.get("sasl.password"),
            mechanism=sec.get("sasl.mechanism", "PLAIN"),
            ssl_context=ctx,
        )
    if ctx is not None:
        return faust.SSLCredentials(ctx)
    return None


def broker_urls(settings: Settings) -> list[str]:
    servers = settings.bootstrap_servers
    parts = servers.split(",") if isinstance(servers, str) else list(servers)
    return [f"kafka://{s.strip()}" for s in parts if s.strip()]


class TableStore:
    """The StateStore protocol on a Faust table (raw bytes keys and values)."""

    def __init__(self, table: Any) -> None:
        self._table = table

    def get(self, key: str) -> bytes | None:
        # Read the store directly: Table.get would look the key up twice (contains + get).
        try:
            value = self._table.data[key.encode("utf-8")]
        except KeyError:
            return None
        return None if value is None else bytes(value)

    def set(self, key: str, value: bytes) -> None:
        self._table[key.encode("utf-8")] = value


class GapGuard:
    """Records of one topic that Faust never handed to our agent, fetched directly.

    Around a rebalance Faust skips (and acknowledges) messages it fetched under the old
    consumer generation or while flow control was suspended; when it does not seek back,
    those offsets would never be processed, and at-least-once would lose them. The guard
    keeps, per partition, the next offset this process expects (first from the group's
    committed offset) and returns the records of any forward gap, read with a plain
    consumer, so the agent processes them first, in order. Re-processing is always safe:
    ingest duplicates are dropped by the timeline filter, the operator is idempotent.
    """

    def __init__(self, conf: Mapping[str, str], group_id: str, topic: str,
                 metrics: WorkerMetrics) -> None:
        self._conf = dict(conf)
        self._group = group_id
        self._topic = topic
        self._metrics = metrics
        self._next: dict[int, int] = {}

    @property
    def topic(self) -> str:
        return self._topic

    async def reseed(self, partitions: set[int]) -> None:
        """At a (re)assignment, before anything is fetched under it: expect each newly
        assigned partition from the group's committed offset as it is now, each kept one
        from where this worker got to, and forget the others.

        Faust may later acknowledge (and commit past) messages it cleared from its buffers
        during the rebalance; with the expectation fixed here, the first message it does
        deliver reveals that gap, which `missing` then re-reads.
        """
        loop = asyncio.get_running_loop()
        committed: dict[int, int] = {}
        for p in sorted(partitions):
            committed[p] = await loop.run_in_executor(
                None, kafka_io.committed_offset, self._conf, self._group, self._topic, p)
        # Merged in one step, after every await: the agent may have moved on meanwhile. A
        # partition this worker keeps across the rebalance starts from where it got to
        # itself (the commit may lag that by up to the commit interval).
        self._next = {p: max(c, self._next.get(p, c)) for p, c in committed.items()}

    async def missing(self, partition: int, offset: int) -> list[kafka_io.KafkaRecord]:
        loop = asyncio.get_running_loop()
        expected = self._next.get(partition)
        if expected is None:
            expected = await loop.run_in_executor(
                None, kafka_io.committed_offset, self._conf, self._group, self._topic,
                partition)
        gap: list[kafka_io.KafkaRecord] = []
        if offset > expected:
            gap = await loop.run_in_executor(
                None, kafka_io.read_range, self._conf, self._topic, partition, expected,
                offset)
            if gap:
                self._metrics.add(f"gap_records_refetched_{self._topic}", len(gap))
                log.warning("re-read %d record(s) of %s partition %d that the consumer "
                            "skipped", len(gap), self._topic, partition)
        self._next[partition] = max(expected, offset + 1)
        return gap


@dataclass
class WorkerApp:
    """The Faust app plus what tests and the CLI need to reach."""

    app: faust.App
    settings: Settings
    metrics: WorkerMetrics
    table: Any


def build_app(settings: Settings, key: NoiseKey, *, replication: int = 1) -> WorkerApp:
    """Build the Faust app (agents, timer, table) for `settings`. Does not start it.

    `replication` is the replication factor of the topics Faust creates (the state
    changelog); `run_worker` derives it from the cluster size.
    """
    partitions = int(settings.partitions)
    app = faust.App(
        settings.app_id,
        broker=broker_urls(settings),
        broker_credentials=broker_credentials(settings),
        store="rocksdb://",  # faust-streaming's RocksDB store, on rocksdict when installed
        # One directory per app id: two apps never share RocksDB files.
        datadir=str(Path(settings.state_dir).resolve() / settings.app_id),
        topic_partitions=partitions,
        processing_guarantee="at_least_once",  # exactly-once is avoided on purpose
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        # A standby copy of each state partition on another worker (when there is one), so a
        # failed worker's counters move with little changelog to replay.
        table_standby_replicas=1,
        topic_replication_factor=replication,
        # A worker killed without leaving the group is noticed after this long (Faust's
        # default is 60 s); its partitions then move to a live worker.
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        broker_commit_every=1000,
        broker_commit_interval=1.0,
        producer_linger=0.005,
    )
    t_input = _raw_topic(app, kafka_io.topic_name(settings, "input"))
    t_timeline = _raw_topic(app, kafka_io.topic_name(settings, "timeline"), partitions)
    t_counts = _raw_topic(app, kafka_io.topic_name(settings, "counts"))
    t_ledger = _raw_topic(app, kafka_io.topic_name(settings, "ledger"))
    t_dead = _raw_topic(app, kafka_io.topic_name(settings, "deadletter"))
    # Raw bytes in and out: the operator owns its (versioned) encoding. Without
    # use_partitioner, a write goes to the changelog partition of the timeline record being
    # processed, which is the partition the counter lives in.
    # (key_type/value_type bytes select the "raw" serializer for the store and changelog.)
    table = app.Table(STATE_TABLE, default=None, partitions=partitions,
                      key_type=bytes, value_type=bytes)
    metrics = WorkerMetrics()
    operator = Operator(settings, key)
    applier = TimelineApplier(operator)
    input_name = kafka_io.topic_name(settings, "input")

    conf = kafka_io.base_config(settings)
    input_gaps = GapGuard(conf, settings.app_id, input_name, metrics)
    timeline_gaps = GapGuard(conf, settings.app_id, kafka_io.topic_name(settings, "timeline"),
                             metrics)

    async def ingest_one(partition: int, offset: int, value: bytes) -> None:
        now_ms = int(time.time() * 1000)
        parsed = parse_input(value, settings, now_ms)
        if isinstance(parsed, Rejection):
            await t_dead.send(
                value=deadletter_record(parsed, value, input_name, partition, offset),
                force=True)
            metrics.add(f"deadletter_{parsed.reason}")
            return
        counter = parsed.counter
        await t_timeline.send(
            key=counter.encode("utf-8"),
            value=timeline_event_bytes(parsed),
            partition=partition_of(counter, partitions),
            headers={kafka_io.SOURCE_HEADER: encode_source(partition, offset)},
            force=True)
        metrics.add("ingested")

    async def ingest(stream: faust.StreamT[bytes]) -> None:
        """Validate each input record; forward it to its counter's timeline partition."""
        async for event in stream.events():
            msg = event.message
            for rec in await input_gaps.missing(msg.partition, msg.offset):
                await ingest_one(rec.partition, rec.offset, rec.value or b"")
            value = msg.value if isinstance(msg.value, bytes) else b""
            await ingest_one(msg.partition, msg.offset, value)

    async def operate(stream: faust.StreamT[bytes]) -> None:
        """Apply timeline records in offset order; releases before state (see module doc)."""
        async for event in stream.events():
            msg = event.message
            # Records Faust skipped are applied first, in order, within this event (their
            # state goes to the same changelog partition: it is the same partition).
            for rec in await timeline_gaps.missing(msg.partition, msg.offset):
                await _operate_one(rec.partition, rec.offset, rec.value or b"",
                                   rec.header(kafka_io.SOURCE_HEADER))
            value = msg.value if isinstance(msg.value, bytes) else b""
            await _operate_one(msg.partition, msg.offset, value,
                               _header(msg.headers, kafka_io.SOURCE_HEADER))

    async def _operate_one(partition: int, offset: int, value: bytes,
                           source: bytes | None) -> None:
        store = BufferedStore(TableStore(table))
        try:
            result = applier.apply(store, partition, offset, value, source)
        except Exception as exc:
            # The operator never raises on a well-formed record, so this is corrupt state or
            # a bug. Skipping the record would silently fork the published stream from the
            # log, so the worker stops instead (nothing of this record was written). Only
            # the error type is logged: its message might name a counter.
            log.critical("operator failed (%s); stopping the worker", type(exc).__name__)
            await app.crash(exc)
            raise
        if result.duplicate:
            metrics.add("timeline_duplicates_dropped")
        metrics.add_output_metrics(result.metrics)
        pending = []
        for entry in result.ledger:
            pending.append(await t_ledger.send(key=entry.key(), value=entry.to_json(),
                                               force=True))
        for rel in result.releases:
            pending.append(await t_counts.send(key=rel.key(), value=rel.to_json(), force=True))
        if pending:
            # Wait until the broker has every release before the state says "done".
            await asyncio.gather(*pending)
            metrics.add("releases_sent", len(result.releases))
        store.flush()

    async def on_assigned(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        assigned = args[0]  # the set of TPs assigned to this worker
        for guard in (input_gaps, timeline_gaps):
            await guard.reseed({tp.partition for tp in assigned if tp.topic == guard.topic})

    app.on_partitions_assigned.connect(on_assigned)

    app.agent(t_input, name=f"{settings.app_id}-ingest")(ingest)
    app.agent(t_timeline, name=f"{settings.app_id}-operator")(operate)

    tick_ms = int(settings.tick_ms)
    last_marker = {"n": -(1 << 62)}

    async def append_markers() -> None:
        """Leader only: 'sealed through n' on every timeline partition (idempotent)."""
        n = sealed_through(int(time.time() * 1000), settings)
        if n <= last_marker["n"]:
            return
        record = encode_marker_record(n)
        futs = [await t_timeline.send(key=None, value=record, partition=p, force=True)
                for p in range(partitions)]
        await asyncio.gather(*futs)
        last_marker["n"] = n
        metrics.add("markers_appended", partitions)

    interval = max(0.1, min(0.5, tick_ms / 4000.0))
    app.timer(interval=interval, on_leader=True, name=f"{settings.app_id}-markers")(
        append_markers)

    async def log_metrics() -> None:
        log.info("metrics %s", metrics.summary())

    app.timer(interval=METRICS_LOG_S, name=f"{settings.app_id}-metrics")(log_metrics)
    return WorkerApp(app=app, settings=settings, metrics=metrics, table=table)


def _raw_topic(app: faust.App, name: str, partitions: int | None = None) -> faust.TopicT:
    """A topic of raw bytes keys and values (our records carry their own encoding)."""
    return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw",
                     value_serializer="raw", partitions=partitions)


def _header(headers: Any, name: str) -> bytes | None:
    if not headers:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    found: bytes | None = None
    for k, v in items:
        kk = k.decode() if isinstance(k, bytes) else str(k)
        if kk == name:
            found = bytes(v) if v is not None else None
    return found


def ensure_topics(settings: Settings, replication: int | None = None) -> int:
    """Create the timeline and output topics (and the input, if missing) with P partitions.

    Returns the replication factor used (default: min(3, live brokers)).
    """
    conf = kafka_io.base_config(settings)
    partitions = int(settings.partitions)
    if replication is None:
        replication = kafka_io.replication_for(conf)
    names = [kafka_io.topic_name(settings, w)
             for w in ("input", "timeline", "counts", "ledger", "deadletter")]
    kafka_io.create_topics(conf, names, partitions, replication=replication)
    have = kafka_io.partition_count(conf, kafka_io.topic_name(settings, "timeline"))
    if have != partitions:
        raise RuntimeError(f"timeline topic has {have} partitions, configuration says "
                           f"{partitions}: counters would land in the wrong partitions")
    return replication


def _prepare_state_dir(settings: Settings, app: faust.App) -> Path:
    """Discard local table files after an unclean stop; mark this run as running."""
    state_dir = Path(settings.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    flag = state_dir / f"{settings.app_id}.{RUNNING_FLAG}"
    if flag.exists():
        tabledir = Path(app.conf.tabledir)
        if not tabledir.is_absolute():
            tabledir = state_dir / tabledir
        log.warning("previous worker did not stop cleanly: rebuilding table state from "
                    "the changelog")
        shutil.rmtree(tabledir, ignore_errors=True)
    flag.write_text(str(os.getpid()))
    return flag


def run_worker(settings: Settings, key: NoiseKey | None = None, *,
               loglevel: str = "warning") -> int:
    """Run the worker until SIGTERM/SIGINT; returns the exit code."""
    if key is None:
        key = load_noise_key(settings)
    replication = ensure_topics(settings)
    wa = build_app(settings, key, replication=replication)
    flag = _prepare_state_dir(settings, wa.app)
    worker = faust.Worker(wa.app, loglevel=loglevel, quiet=True,
                          override_logging=False, redirect_stdouts=False)
    code = 1
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = int(exc.code or 0) if not isinstance(exc.code, str) else 1
    finally:
        log.info("worker stopped: metrics %s", wa.metrics.summary())
        if code == 0:
            with contextlib.suppress(OSError):
                flag.unlink()
    return code


def main_worker(argv: Sequence[str] | None = None) -> int:
    """`python -m processor worker --config F [--key-file K] [--loglevel L]`."""
    p = argparse.ArgumentParser(prog="python -m processor worker",
                                description="Run the private-count stream processor.")
    p.add_argument("--config", help="TOML configuration (DPC_* environment overrides apply)")
    p.add_argument("--key-file", help="noise key file (overrides noise_key_file)")
    p.add_argument("--loglevel", default="warning",
                   help="debug, info, warning (default) or error")
    args = p.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=args.loglevel.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"error: configuration: {exc}", file=sys.stderr)
        return 2
    key = NoiseKey.from_file(args.key_file) if args.key_file else load_noise_key(settings)
    return run_worker(settings, key, loglevel=args.loglevel)


if __name__ == "__main__":
    asyncio.set_event_loop(asyncio.new_event_loop())
    sys.exit(main_worker())
