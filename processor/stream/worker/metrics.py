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
import collections
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

from processor.errors import StreamError
from processor.stream.kafka import kafka_io
from processor.stream.kafka.topics import topic_name
from processor.stream.model.config import Settings
from processor.stream.model.operator import METRICS as OPERATOR_COUNTS
from processor.stream.model.records import REASONS

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


#: What each count of the bounding stage (processor/stream/model/bounding.py METRICS, and
#: unit_stage.py's forwards and checkpoints) means; privacy_unit = "user" only (0
#: otherwise). Each is exported as dpc_<name>_total.
UNIT_COUNT_HELP: Final[Mapping[str, str]] = {
    "unit_records": "Units records the bounding stage applied (one per ingest batch per "
                    "units partition); records",
    "unit_records_skipped_duplicates": "Units records skipped because the stage's state "
                                       "shows them applied already (re-delivery after a "
                                       "restart or rebalance); records",
    "unit_records_malformed": "Units records that could not be decoded and changed "
                              "nothing; records",
    "unit_events_kept": "Events the bounding stage kept within the contribution bounds "
                        "and forwarded to the timeline; events",
    "unit_duplicates_dropped": "Events the bounding stage dropped because an event from "
                               "the same input partition and offset was decided already "
                               "(the ingest stage re-sent a batch); events",
    "unit_events_redelivered_dropped": "Events of a units record read again (a re-sent "
                                       "batch after a restart) whose unit had decided them "
                                       "already and did not keep them: nothing sent again; "
                                       "events",
    "unit_forward_batches": "Timeline batch records the bounding stage sent with the "
                            "events it kept; records",
    "unit_checkpoints": "Checkpoints of the bounding stage (its state written, its units "
                        "records acknowledged); checkpoints",
}


#: What each operator count (processor/stream/model/operator.py METRICS) means; its unit is the
#: word after the semicolon. tests/stream/test_metrics.py fails when a count has none.
OPERATOR_COUNT_HELP: Final[Mapping[str, str]] = {
    "events_applied": "Events the operator put into a counter's queue (valid timeline "
                      "events, each at its tick or the first open one); events",
    "markers_applied": "Seal markers the operator applied (each seals the ticks through "
                       "its tick on one timeline partition; re-applied ones included); "
                       "markers",
    "late_events": "Events that arrived for an already sealed tick and joined the earliest "
                   "open tick instead (counted, never dropped); events",
    "skipped_duplicates": "Timeline records (or their part for one counter) skipped because "
                          "the operator's state shows them applied already (re-delivery "
                          "after a restart or rebalance); records",
    "duplicates_dropped": "Events dropped because an event from the same input partition "
                          "and offset was applied already (the ingest stage re-sent a "
                          "batch); events",
    "malformed_records": "Timeline records that could not be decoded and changed nothing; "
                         "records",
    "undeclared_skipped": "Events of a counter that is not declared (allow_undeclared = "
                          "false) skipped by the operator; events",
    "before_start_skipped": "Events stamped before their counter's start skipped by the "
                            "operator; events",
    "misrouted_skipped": "Events on a timeline partition that is not their counter's home "
                         "partition, skipped; events",
    "counters_touched": "Counters whose state a committed batch changed, summed over "
                        "batches; counter updates",
    "events_queued": "Events that entered a counter's queue (equal to events_applied); "
                     "events",
    "events_dequeued": "Events that left a counter's queue into its mechanism (at most one "
                       "per counter per tick); events",
    "markers_refused": "Seal markers refused because they seal ticks the brokers' clock had "
                       "not reached when they were appended (an alarm: a clock far ahead, "
                       "or a writer that is not a worker); markers",
}


def build_labels() -> dict[str, str]:
    """The versions `dpc_build_info` reports: this package, Python, and the Kafka client
    stacks (confluent-kafka and its librdkafka for ingest, Faust and aiokafka for the
    operator). Missing packages are reported as "none"."""
    import platform
    from importlib import metadata

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "none"

    try:
        import confluent_kafka
        librdkafka = str(confluent_kafka.libversion()[0])
    except ImportError:  # pragma: no cover - a dependency of the worker
        librdkafka = "none"
    from processor import __version__
    return {"version": version("dp-stream-counts") if version("dp-stream-counts") != "none"
            else __version__,
            "python": platform.python_version(), "librdkafka": librdkafka,
            "confluent_kafka": version("confluent-kafka"),
            "faust": version("faust-streaming"), "aiokafka": version("aiokafka")}


class PublicMetricError(StreamError, ValueError):
    """The public registry holds a metric family that is not on the allow-list."""

    error_prefix = "metrics: "


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
            "topic (one per timeline partition per sealing round, on the leader only); "
            "markers", value=c.get("markers_appended", 0))
        yield CounterMetricFamily(
            "dpc_releases_sent", "Releases (private counts: changes and heartbeats) sent to "
            "the private-count topic and acknowledged by the brokers, re-sends after a "
            "crash included; records", value=c.get("releases_sent", 0))
        yield CounterMetricFamily(
            "dpc_ledger_entries_sent", "Entries sent to the privacy ledger topic and "
            "acknowledged by the brokers; records", value=c.get("ledger_entries_sent", 0))


class _OperatorCounts(_CountsCollector):
    """The worker's aggregate counts that are exact functions of the input (private)."""

    @staticmethod
    def _families(c: Mapping[str, int]) -> Iterator[Metric]:
        dead = CounterMetricFamily("dpc_dead_letters", "Input records the ingest stage "
                                   "sent to the dead-letter topic instead of counting them, "
                                   "by reason code; records", labels=["reason"])
        reasons = dict.fromkeys(REASONS, 0)
        for key, v in c.items():
            if key.startswith("deadletter_"):
                reasons[key.removeprefix("deadletter_")] = v
        for reason, v in sorted(reasons.items()):
            dead.add_metric([reason], v)
        yield dead
        for key, help_ in (
                ("input_records", "Input records the ingest stage consumed and committed "
                 "(valid and dead-lettered); records"),
                ("ingested", "Valid events the ingest stage forwarded to the timeline topic; "
                 "events"),
                ("timeline_batches", "Timeline batch records the ingest stage sent (one per "
                 "timeline partition per consumed batch); records"),
                ("ingest_commits_lost_to_rebalance",
                 "Ingest batches delivered to the timeline but whose input offsets could not "
                 "be committed because a rebalance took the partitions (re-read by the next "
                 "owner, dropped as duplicates by the operator); batches")):
            yield CounterMetricFamily(f"dpc_{key}", help_, value=c.get(key, 0))
        taken = CounterMetricFamily(
            "dpc_changelog_records_read", "State changelog records this worker read into "
            "its state table, by copy (bulk: every partition, by the bulk load at start, "
            "before joining the group; restore: a partition it owns, brought back after a "
            "rebalance or restart; standby: a copy of a partition another worker owns); "
            "records", labels=["copy"])
        for copy in ("bulk", "restore", "standby"):
            taken.add_metric([copy], c.get(f"changelog_{copy}_records", 0))
        yield taken
        for key in OPERATOR_COUNTS:
            yield CounterMetricFamily(
                f"dpc_operator_{key}", OPERATOR_COUNT_HELP.get(key, f"operator count {key}"),
                value=c.get(f"operator_{key}", 0))
        for key, help_ in UNIT_COUNT_HELP.items():
            yield CounterMetricFamily(f"dpc_{key}", help_, value=c.get(key, 0))
        yield CounterMetricFamily(
            "dpc_timeline_records_refetched", "Timeline records the Faust consumer skipped "
            "around a rebalance and the worker re-read from the brokers (GapGuard); records",
            value=sum(v for k, v in c.items() if k.startswith("gap_records_refetched_")))
        # The clock cross-check (clock.ClockGuard, docs/time.md).
        yield CounterMetricFamily(
            "dpc_clock_alarms", "Episodes in which the local wall clock and the brokers' "
            "(log-append time of the timeline) disagreed by more than the tolerance; "
            "episodes", value=c.get("clock_alarms", 0))
        skew = c.get("clock_skew_ms")
        yield GaugeMetricFamily(
            "dpc_clock_skew_seconds", "Local wall clock minus the brokers' clock, as last "
            "estimated (0 within the estimate's uncertainty; NaN: no broker time yet); "
            "seconds", value=math.nan if skew is None else skew / 1000.0)


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
                                "thread alive), else 0", value=up)
        yield GaugeMetricFamily("dpc_ready", "1 while /readyz passes (partitions assigned, "
                                "a recent marker applied on each), else 0", value=ready)
        yield GaugeMetricFamily(
            "dpc_marker_age_seconds", "Time since the sealing time (tick end + lateness) of "
            "the newest tick sealed on every timeline partition of this worker: how stale "
            "its published counts are (NaN: no marker applied yet); seconds", value=age)


class _OperatorStatus:
    """Operator-only gauges computed when scraped: build info, assigned partitions,
    catch-up, and librdkafka's statistics of the ingest stage's clients."""

    def __init__(self, surface: Surface) -> None:
        self._surface = surface
        self._build = build_labels()

    def describe(self) -> Iterable[Metric]:
        return self._families({}, math.nan, {})

    def collect(self) -> Iterable[Metric]:
        s = self._surface
        stats = getattr(s.ingest, "client_stats", None) or {}
        return self._families(s.assigned_partitions(), s.catchup_ticks_behind(), stats)

    def _families(self, assigned: Mapping[str, int], behind: float,
                  stats: Mapping[str, Mapping[str, Any]]) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "dpc_build_info", "Always 1; the labels name the versions running: this package, "
            "Python, librdkafka and confluent-kafka (ingest), Faust and aiokafka (operator)",
            labels=sorted(self._build))
        info.add_metric([self._build[k] for k in sorted(self._build)], 1.0)
        yield info
        parts = GaugeMetricFamily(
            "dpc_assigned_partitions", "Partitions of the topic currently assigned to this "
            "worker (timeline: the operator's Faust consumer; input: the ingest consumer, "
            "from librdkafka's statistics); partitions", labels=["topic"])
        for topic, n in sorted(assigned.items()):
            parts.add_metric([topic], float(n))
        yield parts
        yield GaugeMetricFamily(
            "dpc_catchup_ticks_behind", "Ticks whose sealing time has passed but that the "
            "operator has not yet sealed on every timeline partition of this worker (0 in "
            "steady state; large while catching up after a start or a stop; NaN: no "
            "marker applied yet); ticks", value=behind)
        yield from client_stats_families(stats)


def _sum_brokers(stats: Mapping[str, Any], field_name: str) -> float:
    brokers = stats.get("brokers") or {}
    return float(sum(int(b.get(field_name, 0)) for b in brokers.values()
                     if isinstance(b, Mapping)))


def client_stats_families(stats: Mapping[str, Mapping[str, Any]]) -> Iterator[Metric]:
    """Prometheus families from librdkafka's statistics (the JSON its `stats_cb` gets
    every `statistics.interval.ms`, decoded), by client name (`ingest-consumer`,
    `ingest-producer`). Aggregates over brokers, plus per broker and per partition; never
    a record, never a counter name (topic and partition names only)."""
    def fam(kind: type[GaugeMetricFamily] | type[CounterMetricFamily], name: str,
            help_: str, labels: list[str]) -> Any:
        return kind(name, help_, labels=labels)

    queued = fam(GaugeMetricFamily, "dpc_kafka_client_queued_messages",
                 "Messages in the client's producer queue waiting for delivery "
                 "(librdkafka msg_cnt); messages", ["client"])
    tx_errors = fam(CounterMetricFamily, "dpc_kafka_client_tx_errors",
                    "Requests the client failed to send, summed over brokers (librdkafka "
                    "txerrs; for a producer: produce errors); requests", ["client"])
    retries = fam(CounterMetricFamily, "dpc_kafka_client_tx_retries",
                  "Requests the client re-sent, summed over brokers (librdkafka txretries; "
                  "for a producer: produce retries); requests", ["client"])
    timeouts = fam(CounterMetricFamily, "dpc_kafka_client_request_timeouts",
                   "Requests that timed out, summed over brokers (librdkafka req_timeouts); "
                   "requests", ["client"])
    rx_errors = fam(CounterMetricFamily, "dpc_kafka_client_rx_errors",
                    "Response errors the client received, summed over brokers (librdkafka "
                    "rxerrs); responses", ["client"])
    rtt = fam(GaugeMetricFamily, "dpc_kafka_client_broker_rtt_seconds",
              "Average round-trip time of requests to the broker over the last statistics "
              "interval (librdkafka rtt.avg; a consumer's includes the up to 500 ms a fetch "
              "waits for data); seconds", ["client", "broker"])
    up = fam(GaugeMetricFamily, "dpc_kafka_client_broker_up",
             "1 while the client's connection to the broker is up (librdkafka state UP), "
             "else 0", ["client", "broker"])
    lag = fam(GaugeMetricFamily, "dpc_kafka_client_consumer_lag_records",
              "The consumer's own view of its lag per assigned partition (high watermark "
              "minus its position, librdkafka consumer_lag; the broker-read lag is "
              "dpc_consumer_lag_records); records", ["client", "topic", "partition"])
    rebalances = fam(CounterMetricFamily, "dpc_kafka_client_rebalances",
                     "Rebalances of the client's consumer group seen by this client "
                     "(librdkafka cgrp.rebalance_cnt); rebalances", ["client"])
    age = fam(GaugeMetricFamily, "dpc_kafka_client_stats_age_seconds",
              "Time since the client last reported its statistics (every 10 s while it "
              "polls); seconds", ["client"])
    now_s = time.time()
    for client, st in sorted(stats.items()):
        queued.add_metric([client], float(st.get("msg_cnt", 0)))
        tx_errors.add_metric([client], _sum_brokers(st, "txerrs"))
        retries.add_metric([client], _sum_brokers(st, "txretries"))
        timeouts.add_metric([client], _sum_brokers(st, "req_timeouts"))
        rx_errors.add_metric([client], _sum_brokers(st, "rxerrs"))
        if isinstance(st.get("time"), int | float):  # wall clock, seconds
            age.add_metric([client], max(0.0, now_s - float(st["time"])))
        for b in (st.get("brokers") or {}).values():
            if not isinstance(b, Mapping) or int(b.get("nodeid", -1)) < 0:
                continue  # the bootstrap placeholders
            broker = str(b.get("nodename") or b.get("name"))
            up.add_metric([client, broker], 1.0 if b.get("state") == "UP" else 0.0)
            avg = (b.get("rtt") or {}).get("avg", 0)
            rtt.add_metric([client, broker], float(avg) / 1e6)
        cgrp = st.get("cgrp")
        if isinstance(cgrp, Mapping):
            rebalances.add_metric([client], float(cgrp.get("rebalance_cnt", 0)))
            for topic, t in (st.get("topics") or {}).items():
                for pid, p in ((t or {}).get("partitions") or {}).items():
                    if int(pid) < 0 or not isinstance(p, Mapping):
                        continue
                    value = int(p.get("consumer_lag", -1))
                    if value >= 0:
                        lag.add_metric([client, str(topic), str(pid)], float(value))
    yield from (queued, tx_errors, retries, timeouts, rx_errors, rtt, up, lag, rebalances,
                age)


# ------------------------------------------------------------------- consumer lag


class LagProbe:
    """Consumer lag of the ingest group on the input topic and of the Faust group on the
    timeline topic, read from the brokers every LAG_REFRESH_S in a thread of its own.

    Per partition: end offset - committed offset, what `kafka-consumer-groups --describe`
    shows in its LAG column (`dpc_consumer_lag_records{group,topic,partition}`), and its
    sum over the topic's partitions (`dpc_<input|timeline>_consumer_lag_records`), the same
    on every worker. Read from the brokers rather than from the consumers in this process,
    so a stuck consumer still shows its lag growing. The sums are NaN until the first read
    and after a failed one; a partition's series is absent until its first read and keeps
    its last value after a failed one (the sums and the failure counter say it is stale).
    """

    def __init__(self, settings: Settings, registry: CollectorRegistry) -> None:
        self._conf = {**kafka_io.base_config(settings), "log_level": "0"}
        self._targets = (
            ("input", f"{settings.app_id}-ingest", topic_name(settings, "input")),
            ("timeline", settings.app_id, topic_name(settings, "timeline")),
        )
        self.gauges = {
            name: Gauge(f"dpc_{name}_consumer_lag_records",
                        f"Records of the {name} topic not yet committed by group {group!r}, "
                        "summed over its partitions (NaN: not read yet or the last read "
                        "failed); records",
                        registry=registry)
            for name, group, _topic in self._targets}
        for g in self.gauges.values():
            g.set(math.nan)
        self.failures = Counter("dpc_lag_probe_failures",
                                "Consumer lag reads from the brokers that failed (the summed "
                                "lag gauges are NaN until the next good read); a count",
                                registry=registry)
        self.per_partition = Gauge(
            "dpc_consumer_lag_records", "Records of one partition not yet committed by the "
            "consumer group (end offset minus committed offset, as kafka-consumer-groups "
            "--describe shows it), read from the brokers every 10 s; records",
            ["group", "topic", "partition"], registry=registry)
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
                by_partition = self.lag_by_partition(group, topic)
            except Exception as exc:
                self.gauges[name].set(math.nan)
                self.failures.inc()
                if not self._failing:
                    log.warning("consumer lag not read (%s); retrying every %.0f s",
                                type(exc).__name__, LAG_REFRESH_S)
                self._failing = True
                continue
            for partition, lag in by_partition.items():
                self.per_partition.labels(group, topic, str(partition)).set(lag)
            self.gauges[name].set(sum(by_partition.values()))
            self._failing = False

    def lag_by_partition(self, group: str, topic: str) -> dict[int, int]:
        """Per partition of `topic`: records `group` has not committed. Blocking."""
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
        out: dict[int, int] = {}
        for tp in committed:
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                    timeout=LAG_TIMEOUT_S)
            # Nothing committed yet: the group starts at the low watermark (reset earliest).
            start = tp.offset if tp.offset >= 0 else lo
            out[int(tp.partition)] = max(0, int(hi) - int(start))
        return out


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

    `counts()` returns the worker's aggregate counts (WorkerMetrics plus the ingest
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
        self.operator.register(_OperatorStatus(self))
        # CPU time and memory follow the input volume: operator-only like the rest.
        ProcessCollector(registry=self.operator)
        PlatformCollector(registry=self.operator)
        self.rebalances = Counter("dpc_rebalances", "Partition assignments this worker's "
                                  "operator (Faust) consumer received, one per rebalance; "
                                  "rebalances", registry=self.operator)
        self.revocations = Counter("dpc_partitions_revocations", "Times the operator's "
                                   "partitions were revoked (the start of a rebalance; the "
                                   "worker is not ready until the next assignment); "
                                   "revocations", registry=self.operator)
        self.producer_errors = Counter(
            "dpc_producer_errors", "Sends to Kafka that failed after the client's own "
            "retries, by stage (operator: releases, ledger, markers, state changelog via "
            "Faust/aiokafka; ingest: timeline and dead-letter records via librdkafka) and "
            "error name; sends", ["stage", "error"], registry=self.operator)
        self.commit_seconds = Histogram(
            "dpc_commit_seconds", "Time to apply, publish (acknowledged) and persist one "
            "batch of timeline records (kind: marker if it applied a marker, else events); "
            "seconds", ["kind"], buckets=_LATENCY_BUCKETS, registry=self.operator)
        self.batch_events = Histogram(
            "dpc_timeline_batch_events", "Events applied per committed batch of timeline "
            "records (batches without a marker); events", buckets=_SIZE_BUCKETS,
            registry=self.operator)
        self.lag = LagProbe(settings, self.operator)
        self.ingest_batch_records = Histogram(
            "dpc_ingest_batch_records", "Input records per batch the ingest stage consumed "
            "and committed; records", buckets=_SIZE_BUCKETS, registry=self.operator)
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
        self.revocations.inc()

    def producer_error(self, stage: str, error: BaseException | str) -> None:
        """A send to Kafka failed for good (after the client's own retries): counted by
        `stage` ("operator" or "ingest") and the error's name (a KafkaError code name or
        the exception type, never its message: client errors can quote topic data).
        For the worker to call where it handles a failed send."""
        if isinstance(error, BaseException):
            code = error.args[0] if error.args else None
            name_of = getattr(code, "name", None)
            error = str(name_of()) if callable(name_of) else type(error).__name__
        self.producer_errors.labels(stage, error).inc()

    def assigned_partitions(self) -> dict[str, int]:
        """Topic -> partitions this worker holds: the timeline's (operator, once assigned)
        and the input's (the ingest consumer, from its librdkafka statistics)."""
        out: dict[str, int] = {}
        if self._has_assignment:
            out[topic_name(self.settings, "timeline")] = len(self._timeline_partitions)
        stats = (getattr(self.ingest, "client_stats", None) or {}).get("ingest-consumer")
        cgrp = stats.get("cgrp") if isinstance(stats, Mapping) else None
        if isinstance(cgrp, Mapping) and "assignment_size" in cgrp:
            out[topic_name(self.settings, "input")] = int(cgrp["assignment_size"])
        return out

    def catchup_ticks_behind(self) -> float:
        """Ticks whose sealing time (end + lateness) has passed but that are not yet sealed
        on every timeline partition of this worker: 0 in steady state (up to 1 between two
        markers), large while a start far behind catches up. NaN: no marker yet."""
        owned, ticks = self._timeline_partitions, self._marker_tick
        if not owned or any(p not in ticks for p in owned):
            return math.nan
        s = self.settings
        due = (int(self._clock() * 1000) - s.lateness_ms) // s.tick_ms - 1
        return float(max(0, due - min(ticks[p] for p in owned)))

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
            return False, (f"catching up, {self.catchup_ticks_behind():.0f} ticks behind "
                           f"(marker age {age:.1f} s exceeds {limit:.1f} s)")
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


class WorkerMetrics:
    """Aggregate counters of one worker process. Never per counter, never values."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def add_all(self, deltas: Mapping[str, int], prefix: str = "") -> None:
        """Fold one batch's metric deltas (aggregates: a stage's outputs.Output
        metrics), each under `prefix` + its name."""
        for k, v in deltas.items():
            if v:
                self.counts[prefix + k] += v

    def summary(self, extra: Mapping[str, int] | None = None) -> str:
        merged = collections.Counter(self.counts)
        merged.update(extra or {})
        return " ".join(f"{k}={v}" for k, v in sorted(merged.items()))
