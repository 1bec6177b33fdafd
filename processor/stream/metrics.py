"""The worker's operator surface: Prometheus metrics, `/healthz` and `/readyz` over HTTP.

Two registries for two audiences (docs/operator-channels.md says why):

- the **operator registry**, served at `/metrics` on `metrics_host:metrics_port` next to
  `/healthz`, `/readyz` and `/metrics/public`. It carries exact functions of the input
  (events applied, dead letters by reason, batch sizes, consumer lag, ...), so it has the
  trust of the input topic: operator-only.
- the **public registry**: only quantities derived from the public topics, the public
  configuration or the wall clock (`PUBLIC_METRICS`). Served at `/metrics/public` on the
  operator listener and, when `public_metrics` is on, at `/metrics` on a listener of its
  own (`metrics_host:public_metrics_port`). A port of its own, not just a path, because a
  trust boundary must be enforceable where operators draw them, in firewalls and
  Kubernetes NetworkPolicies, which see ports, not paths.

Nothing on either is per counter: no counter name in a metric name or label, never a
released or true value. `check_public` refuses a public registry holding any family that
is not on the allow-list (the Surface runs it when it is built).

Why prometheus_client and not Faust's web server: what operators scrape is the Prometheus
text format, which prometheus_client writes; Faust's web server is off (`web_enabled=False`)
and turning it on for three endpoints would bring aiohttp routes and Faust's own pages, all
served from the event loop: a stalled loop would then also silence the probe meant to
report it. Here one small threaded WSGI server per listener answers from its own threads,
so a scrape never waits on the event loop (except the liveness ping, bounded).

Liveness (`/healthz`): the event loop answers (a callback scheduled from the HTTP thread ran
within `LOOP_STALL_S`) and the ingest thread, once started, is alive and went round its
loop within `INGEST_STALL_S`. Readiness (`/readyz`): the worker holds a partition assignment
(none between a revocation and the next assignment) and, on every timeline partition it
owns, the operator applied a marker whose tick was sealed at most `tick_ms +
READY_SLACK_S` ago (marker age, below).

Marker age: seconds since the sealing time (end of the tick plus `lateness_ms`) of the
newest tick sealed on every timeline partition of this worker, i.e. how stale the
published values of its counters are. In steady state it runs from ~0 to about one tick.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from socketserver import ThreadingMixIn
from typing import Any, Final, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from confluent_kafka import Consumer, TopicPartition
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from processor.stream import kafka_io
from processor.stream.config import Settings
from processor.stream.operator import METRICS as OPERATOR_COUNTS
from processor.stream.records import REASONS

log = logging.getLogger("processor.stream.metrics")

#: The only metric families the public registry may hold: each is a function of the
#: public topics (what a subscriber reads anyway), the public configuration or the wall
#: clock. Anything else is private until docs/operator-channels.md classifies it.
PUBLIC_METRICS: Final = frozenset({
    "dpc_up",
    "dpc_ready",
    "dpc_marker_age_seconds",
    "dpc_markers_appended",
    "dpc_releases_sent",
    "dpc_ledger_entries_sent",
})
#: /healthz fails once the event loop has not run a scheduled callback for this long
#: (generous: one marker that catches up thousands of counters holds the loop for a while).
LOOP_STALL_S: Final = 60.0
#: How long one liveness check waits for the event loop to run its callback.
LOOP_PING_S: Final = 0.5
#: /healthz fails once the ingest loop has not come round for this long (it may wait up
#: to 60 s for the broker to acknowledge a batch).
INGEST_STALL_S: Final = 120.0
#: /readyz allows the last sealed tick's marker to be up to tick_ms + this old.
READY_SLACK_S: Final = 30.0
#: How often the consumer lag is read from the brokers, and the timeout of each request.
LAG_REFRESH_S: Final = 10.0
LAG_TIMEOUT_S: Final = 5.0
_LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                           2.5, 5.0, 10.0, 30.0)
_SIZE_BUCKETS: Final = (1, 5, 10, 50, 100, 500, 1000, 2500, 5000, 10000)


class PublicMetricError(ValueError):
    """The public registry holds a metric family that is not on the allow-list."""


def family_names(registry: CollectorRegistry) -> set[str]:
    """The names of the metric families `registry` yields right now."""
    return {m.name for m in registry.collect()}


def check_public(registry: CollectorRegistry) -> None:
    """Raise PublicMetricError unless every family in `registry` is in PUBLIC_METRICS
    (checked on what it actually yields, so a collector cannot smuggle one in)."""
    forbidden = sorted(family_names(registry) - PUBLIC_METRICS)
    if forbidden:
        raise PublicMetricError(f"not allowed on the public registry: {', '.join(forbidden)}")


class IngestStatus(Protocol):
    """What the surface reads of the ingest stage (`ingest.Ingest`)."""

    #: time.monotonic() when the loop last came round; None before it started.
    last_beat: float | None

    def alive(self) -> bool:
        """Whether the ingest thread is running."""


# ------------------------------------------------------------------- collectors


class _CountsCollector:
    """A collector of families built from the worker's count snapshot (`_families`)."""

    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self._counts = counts

    def describe(self) -> Iterable[Metric]:
        return self._families({})

    def collect(self) -> Iterable[Metric]:
        return self._families(self._counts())

    @staticmethod
    def _families(c: Mapping[str, int]) -> Iterator[Metric]:
        raise NotImplementedError


class _PublicCounts(_CountsCollector):
    """Counts a subscriber could reconstruct from the public topics (or the clock)."""

    @staticmethod
    def _families(c: Mapping[str, int]) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "dpc_markers_appended", "Seal markers this worker appended to the timeline "
            "(one per partition per sealed tick, leader only)",
            value=c.get("markers_appended", 0))
        yield CounterMetricFamily(
            "dpc_releases_sent", "Releases sent to the private-count topic and acknowledged",
            value=c.get("releases_sent", 0))
        yield CounterMetricFamily(
            "dpc_ledger_entries_sent", "Entries sent to the privacy ledger topic and "
            "acknowledged", value=c.get("ledger_entries_sent", 0))


class _OperatorCounts(_CountsCollector):
    """The worker's aggregate counts that are exact functions of the input (private)."""

    @staticmethod
    def _families(c: Mapping[str, int]) -> Iterator[Metric]:
        dead = CounterMetricFamily("dpc_dead_letters", "Input records sent to the "
                                   "dead-letter topic, by reason", labels=["reason"])
        reasons = dict.fromkeys(REASONS, 0)
        for key, v in c.items():
            if key.startswith("deadletter_"):
                reasons[key.removeprefix("deadletter_")] = v
        for reason, v in sorted(reasons.items()):
            dead.add_metric([reason], v)
        yield dead
        for key, help_ in (
                ("input_records", "Input records consumed and committed by the ingest stage"),
                ("ingested", "Valid events the ingest stage forwarded to the timeline"),
                ("timeline_batches", "Timeline batch records the ingest stage sent"),
                ("ingest_commits_lost_to_rebalance",
                 "Ingest batches delivered but not committed because of a rebalance")):
            yield CounterMetricFamily(f"dpc_{key}", help_, value=c.get(key, 0))
        for key in OPERATOR_COUNTS:
            yield CounterMetricFamily(f"dpc_operator_{key}",
                                      f"Operator count {key} (commit.Output metrics)",
                                      value=c.get(f"operator_{key}", 0))
        yield CounterMetricFamily(
            "dpc_timeline_records_refetched", "Timeline records the consumer skipped around "
            "a rebalance and the worker re-read (GapGuard)",
            value=sum(v for k, v in c.items() if k.startswith("gap_records_refetched_")))
        # The clock cross-check (clock.ClockGuard, docs/time.md).
        yield CounterMetricFamily(
            "dpc_clock_alarms", "Episodes in which the local wall clock and the brokers' "
            "(log-append time of the timeline) disagreed by more than the tolerance",
            value=c.get("clock_alarms", 0))
        skew = c.get("clock_skew_ms")
        yield GaugeMetricFamily(
            "dpc_clock_skew_seconds", "Local wall clock minus the brokers' clock, as last "
            "estimated (0 within the estimate's uncertainty; NaN: no broker time yet)",
            value=math.nan if skew is None else skew / 1000.0)


class _Status:
    """Liveness, readiness and marker age, computed when scraped."""

    def __init__(self, surface: Surface) -> None:
        self._surface = surface

    def describe(self) -> Iterable[Metric]:
        return self._families(0.0, 0.0, math.nan)

    def collect(self) -> Iterable[Metric]:
        s = self._surface
        return self._families(float(s.health()[0]), float(s.readiness()[0]),
                              s.marker_age_s())

    @staticmethod
    def _families(up: float, ready: float, age: float) -> Iterator[Metric]:
        yield GaugeMetricFamily("dpc_up", "1 while /healthz passes (event loop and ingest "
                                "thread alive)", value=up)
        yield GaugeMetricFamily("dpc_ready", "1 while /readyz passes (assignment held, "
                                "recent marker applied)", value=ready)
        yield GaugeMetricFamily(
            "dpc_marker_age_seconds", "Seconds since the sealing time of the newest tick "
            "sealed on every timeline partition of this worker (NaN: none yet)", value=age)


# ------------------------------------------------------------------- consumer lag


class LagProbe:
    """Consumer lag of the ingest group on the input topic and of the Faust group on the
    timeline topic, read from the brokers every LAG_REFRESH_S in a thread of its own.

    Lag = sum over the topic's partitions of (end offset - committed offset): the group's
    lag (what `kafka-consumer-groups --describe` shows), the same on every worker. Read from
    the brokers rather than from the consumers in this process, so a stuck consumer still
    shows its lag growing. NaN until the first read, and after a failed one.
    """

    def __init__(self, settings: Settings, registry: CollectorRegistry) -> None:
        self._conf = {**kafka_io.base_config(settings), "log_level": "0"}
        self._targets = (
            ("input", f"{settings.app_id}-ingest", kafka_io.topic_name(settings, "input")),
            ("timeline", settings.app_id, kafka_io.topic_name(settings, "timeline")),
        )
        self.gauges = {
            name: Gauge(f"dpc_{name}_consumer_lag_records",
                        f"Records of the {name} topic not yet committed by group {group!r}",
                        registry=registry)
            for name, group, _topic in self._targets}
        for g in self.gauges.values():
            g.set(math.nan)
        self.failures = Counter("dpc_lag_probe_failures",
                                "Consumer lag reads that failed (the lag gauges are NaN)",
                                registry=registry)
        self._consumers: dict[str, Consumer] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dpc-lag-probe", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end and wait a little: a read in flight may take up to
        LAG_TIMEOUT_S per request, and the thread (a daemon) then ends on its own."""
        self._stop.set()
        if self._thread is None:
            self._close()
        else:
            self._thread.join(LAG_TIMEOUT_S)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.refresh()
                self._stop.wait(LAG_REFRESH_S)
        finally:
            # Closed by the thread that uses them, never while a request is in flight.
            self._close()

    def _close(self) -> None:
        for consumer in self._consumers.values():
            consumer.close()
        self._consumers.clear()

    def refresh(self) -> None:
        """Read both lags once (any error: NaN, counted, logged once by type)."""
        for name, group, topic in self._targets:
            try:
                lag = self.lag_of(group, topic)
            except Exception as exc:
                self.gauges[name].set(math.nan)
                self.failures.inc()
                if not self._failing:
                    log.warning("consumer lag not read (%s); retrying every %.0f s",
                                type(exc).__name__, LAG_REFRESH_S)
                self._failing = True
                continue
            self.gauges[name].set(lag)
            self._failing = False

    def lag_of(self, group: str, topic: str) -> int:
        """Records of `topic` that `group` has not committed (all of them if it committed
        nothing). Blocking: broker requests."""
        consumer = self._consumers.get(group)
        if consumer is None:
            # Never subscribes: a consumer with the group's id only to read its commits.
            consumer = Consumer({**self._conf, "group.id": group,
                                 "enable.auto.commit": "false"})
            self._consumers[group] = consumer
        md = consumer.list_topics(topic, timeout=LAG_TIMEOUT_S).topics.get(topic)
        if md is None or md.error is not None:
            raise LookupError("topic metadata")
        tps = [TopicPartition(topic, p) for p in sorted(md.partitions)]
        committed = consumer.committed(tps, timeout=LAG_TIMEOUT_S)
        total = 0
        for tp in committed:
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                    timeout=LAG_TIMEOUT_S)
            # Nothing committed yet: the group starts at the low watermark (reset earliest).
            start = tp.offset if tp.offset >= 0 else lo
            total += max(0, int(hi) - int(start))
        return total


# ------------------------------------------------------------------- HTTP


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log: scrapes every few seconds would drown the worker's log."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class Listener:
    """One HTTP server on its own daemon thread (request threads are daemons too)."""

    def __init__(self, host: str, port: int, app: WSGIApplication, name: str) -> None:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_cls = type("_FamilyServer", (_Server,), {"address_family": family})
        self.server: WSGIServer = make_server(host, port, app, server_class=server_cls,
                                              handler_class=_QuietHandler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, name=name,
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5.0)


def _router(routes: Mapping[str, WSGIApplication]) -> WSGIApplication:
    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        target = routes.get(environ.get("PATH_INFO", "") or "/")
        if target is None:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found\n"]
        return target(environ, start_response)
    return app


def _check_app(check: Callable[[], tuple[bool, str]]) -> WSGIApplication:
    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        ok, why = check()
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8"),
                        ("Cache-Control", "no-store")])
        return [f"{'ok' if ok else 'fail'}: {why}\n".encode()]
    return app


# ------------------------------------------------------------------- the surface


class Surface:
    """The registries, the state behind health and readiness, and the listeners.

    The worker calls `batch_committed`, `ingest_batch`, `assigned` and `on_revoked` from
    its event loop (or the ingest thread); the HTTP threads read. Shared values are replaced
    whole, never mutated in place, so a reader never sees one half-updated.

    `counts()` returns the worker's aggregate counts (app.WorkerMetrics plus the ingest
    stage's); `ingest` is the ingest stage (None: no ingest thread to watch).
    """

    def __init__(self, settings: Settings, counts: Callable[[], Mapping[str, int]], *,
                 ingest: IngestStatus | None = None,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.ingest: IngestStatus | None = ingest
        self._clock = clock
        self._monotonic = monotonic
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_seen = monotonic()
        self._has_assignment = False
        self._timeline_partitions: frozenset[int] = frozenset()
        #: timeline partition -> newest tick sealed by a marker the operator applied
        self._marker_tick: dict[int, int] = {}
        self.listeners: list[Listener] = []
        self._lag_started = False

        self.public = CollectorRegistry()
        self.operator = CollectorRegistry()
        status = _Status(self)
        public_counts = _PublicCounts(counts)
        for registry in (self.public, self.operator):
            registry.register(status)
            registry.register(public_counts)
        self.operator.register(_OperatorCounts(counts))
        # CPU time and memory follow the input volume: operator-only like the rest.
        ProcessCollector(registry=self.operator)
        PlatformCollector(registry=self.operator)
        self.rebalances = Counter("dpc_rebalances", "Partition assignments this worker "
                                  "received (one per rebalance)", registry=self.operator)
        self.commit_seconds = Histogram(
            "dpc_commit_seconds", "Time to apply, publish and persist one batch of timeline "
            "records (kind: marker if it applied a marker, else events)", ["kind"],
            buckets=_LATENCY_BUCKETS, registry=self.operator)
        self.batch_events = Histogram(
            "dpc_timeline_batch_events", "Events applied per committed batch of timeline "
            "records (batches without a marker)", buckets=_SIZE_BUCKETS,
            registry=self.operator)
        self.lag = LagProbe(settings, self.operator)
        self.ingest_batch_records = Histogram(
            "dpc_ingest_batch_records", "Input records per batch the ingest stage consumed",
            buckets=_SIZE_BUCKETS, registry=self.operator)
        check_public(self.public)

    # -- events (called by the worker)

    def batch_committed(self, partition: int, sealed_through: int | None,
                        out_metrics: Mapping[str, int], seconds: float) -> None:
        """One `BatchCommit.commit` on timeline `partition` finished; `sealed_through` is
        the newest tick its applied markers sealed (the operator's Output), or None."""
        if out_metrics.get("markers_applied", 0):
            self.commit_seconds.labels("marker").observe(seconds)
            newest = self._marker_tick.get(partition)
            if sealed_through is not None and (newest is None or sealed_through > newest):
                self._marker_tick = {**self._marker_tick, partition: sealed_through}
        else:
            self.commit_seconds.labels("events").observe(seconds)
            self.batch_events.observe(out_metrics.get("events_applied", 0))

    def ingest_batch(self, records: int) -> None:
        """The ingest stage committed a batch of `records` input records (its thread)."""
        self.ingest_batch_records.observe(records)

    def assigned(self, timeline_partitions: Iterable[int]) -> None:
        """A rebalance ended: this worker now owns `timeline_partitions` (maybe none)."""
        owned = frozenset(timeline_partitions)
        self._marker_tick = {p: n for p, n in self._marker_tick.items() if p in owned}
        self._timeline_partitions = owned
        self._has_assignment = True
        self.rebalances.inc()

    async def on_revoked(self, sender: Any, /, *args: Any, signal: Any,
                         **kwargs: Any) -> None:
        """Faust's on_partitions_revoked: not ready until the next assignment."""
        self._has_assignment = False

    # -- state

    def marker_age_s(self) -> float:
        """Seconds since the sealing time of the newest tick sealed on every timeline
        partition of this worker; NaN while one of them has no applied marker."""
        owned, ticks = self._timeline_partitions, self._marker_tick
        if not owned or any(p not in ticks for p in owned):
            return math.nan
        n = min(ticks[p] for p in owned)
        s = self.settings
        sealed_at_s = ((n + 1) * s.tick_ms + s.lateness_ms) / 1000.0
        return max(0.0, self._clock() - sealed_at_s)

    def health(self) -> tuple[bool, str]:
        """Liveness: (ok, why). See the module docstring."""
        loop = self._loop
        if loop is not None:
            if loop.is_closed():
                return False, "event loop closed"
            answered = threading.Event()

            def beat() -> None:
                self._loop_seen = self._monotonic()
                answered.set()

            try:
                loop.call_soon_threadsafe(beat)
            except RuntimeError:
                return False, "event loop closed"
            answered.wait(LOOP_PING_S)
            silent = self._monotonic() - self._loop_seen
            if silent > LOOP_STALL_S:
                return False, f"event loop unresponsive for {silent:.0f} s"
        ingest = self.ingest
        if ingest is not None and ingest.last_beat is not None:
            if not ingest.alive():
                return False, "ingest thread stopped"
            silent = self._monotonic() - ingest.last_beat
            if silent > INGEST_STALL_S:
                return False, f"ingest loop stalled for {silent:.0f} s"
        return True, "alive"

    def readiness(self) -> tuple[bool, str]:
        """Readiness: (ok, why). See the module docstring."""
        if not self._has_assignment:
            return False, "waiting for a partition assignment"
        if not self._timeline_partitions:
            return True, "assigned (no timeline partition: standby)"
        age = self.marker_age_s()
        if math.isnan(age):
            return False, "no marker applied yet on every owned timeline partition"
        limit = self.settings.tick_ms / 1000.0 + READY_SLACK_S
        if age > limit:
            return False, f"marker age {age:.1f} s exceeds {limit:.1f} s"
        return True, f"marker age {age:.1f} s"

    # -- serving

    def start(self, loop: asyncio.AbstractEventLoop | None = None, *,
              probe_lag: bool = True) -> None:
        """Open the configured listeners and (with `probe_lag`, when the operator listener
        is up) start the lag probe. `loop` is the event loop the liveness check pings. A
        port that cannot be bound is logged and left out: the worker runs on (a second
        worker on the same host, say), and its missing endpoint shows as a failed probe
        or scrape."""
        self._loop = loop
        self._loop_seen = self._monotonic()
        s = self.settings
        public_app = make_wsgi_app(self.public)
        if s.metrics_port:
            routes: dict[str, WSGIApplication] = {
                "/metrics": make_wsgi_app(self.operator),
                "/metrics/public": public_app,
                "/healthz": _check_app(self.health),
                "/readyz": _check_app(self.readiness),
            }
            if (self._listen(s.metrics_host, s.metrics_port, routes, "dpc-metrics")
                    and probe_lag):
                self.lag.start()
                self._lag_started = True
        if s.public_metrics:
            self._listen(s.metrics_host, s.public_metrics_port, {"/metrics": public_app},
                         "dpc-metrics-public")

    def _listen(self, host: str, port: int, routes: Mapping[str, WSGIApplication],
                name: str) -> bool:
        try:
            self.listeners.append(Listener(host, port, _router(routes), name))
        except OSError as exc:
            log.warning("%s endpoint not served: cannot listen on %s:%d (%s)", name, host,
                        port, exc.strerror or type(exc).__name__)
            return False
        return True

    def close(self) -> None:
        """Stop the listeners and the lag probe (idempotent)."""
        for listener in self.listeners:
            listener.close()
        self.listeners.clear()
        if self._lag_started:
            self.lag.stop()
            self._lag_started = False

