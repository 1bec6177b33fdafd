"""The operator surface (processor/stream/worker/metrics.py): two registries for two audiences,
health and readiness, the HTTP listeners, and a real worker scraped while events flow."""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from processor.devtools.deployment import Deployment
from processor.stream.model.config import ConfigError, Settings, load_settings, with_overrides
from processor.stream.worker.metrics import (
    LOOP_STALL_S,
    PUBLIC_METRICS,
    READY_SLACK_S,
    LagProbe,
    PublicMetricError,
    Surface,
    check_public,
    family_names,
)

#: Labels the operator registry may use: none of them can name a counter.
ALLOWED_LABELS = {"reason", "kind", "le",
                  # dpc_changelog_records_read: restore or standby
                  "copy",
                  # python_info of prometheus_client's platform collector
                  "implementation", "major", "minor", "patchlevel", "version",
                  # dpc_build_info: package versions
                  "python", "librdkafka", "confluent_kafka", "faust", "aiokafka",
                  # Kafka coordinates (topics of the deployment, partition numbers, consumer
                  # groups, client and broker names) and producer error names
                  "topic", "partition", "group", "client", "broker", "stage", "error"}


def settings(**kw: Any) -> Settings:
    base: dict[str, Any] = dict(counters={"a": 0}, tick_ms=1000, lateness_ms=2000,
                                metrics_port=0)
    base.update(kw)
    return with_overrides(Settings(), **base)


class Clock:
    """A settable clock (wall and monotonic seconds)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


COUNTS = {"releases_sent": 7, "ledger_entries_sent": 2, "markers_appended": 12,
          "input_records": 40, "ingested": 35, "deadletter_unparsable": 3,
          "deadletter_before_start": 2, "operator_events_applied": 35,
          "gap_records_refetched_dpc-timeline": 4, "changelog_standby_records": 9}


def surface(s: Settings | None = None, **kw: Any) -> Surface:
    return Surface(s or settings(), lambda: COUNTS, **kw)


def parsed(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict[str, Metric], name: str, **labels: str) -> float:
    """The sample `name` (or `name`_total) with `labels` among the families."""
    for family in families.values():
        for sample in family.samples:
            if sample.name in (name, f"{name}_total") and all(
                    sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise KeyError(name)


# ------------------------------------------------------------------- registries


def test_public_registry_is_exactly_the_allow_list() -> None:
    sf = surface()
    assert family_names(sf.public) == PUBLIC_METRICS
    check_public(sf.public)
    fams = parsed(generate_latest(sf.public).decode())
    assert value(fams, "dpc_releases_sent") == 7
    assert value(fams, "dpc_ledger_entries_sent") == 2
    assert value(fams, "dpc_markers_appended") == 12


def test_public_check_refuses_a_forbidden_family() -> None:
    """Control: the allow-list check fails as soon as a private metric joins the public
    registry, whether registered as a metric or yielded by a collector at scrape time."""
    sf = surface()
    Counter("dpc_operator_events_applied", "exact input count", registry=sf.public)
    with pytest.raises(PublicMetricError, match="dpc_operator_events_applied"):
        check_public(sf.public)

    class Sneaky:
        def collect(self) -> Iterable[Metric]:
            yield CounterMetricFamily("dpc_dead_letters", "by reason", value=1)

    registry = CollectorRegistry()
    registry.register(Sneaky())  # no describe(): invisible until collected
    with pytest.raises(PublicMetricError, match="dpc_dead_letters"):
        check_public(registry)


def test_operator_registry_has_every_metric_and_no_per_counter_label() -> None:
    sf = surface()
    fams = parsed(generate_latest(sf.operator).decode())
    assert set(fams) >= PUBLIC_METRICS
    for name in ("dpc_input_consumer_lag_records", "dpc_timeline_consumer_lag_records",
                 "dpc_dead_letters", "dpc_rebalances", "dpc_commit_seconds",
                 "dpc_timeline_batch_events", "dpc_ingest_batch_records",
                 "dpc_operator_events_applied", "dpc_input_records"):
        assert name in fams, name
    assert value(fams, "dpc_dead_letters", reason="unparsable") == 3
    assert value(fams, "dpc_dead_letters", reason="before_start") == 2
    assert value(fams, "dpc_dead_letters", reason="value_not_finite") == 0
    assert value(fams, "dpc_timeline_records_refetched") == 4
    assert value(fams, "dpc_changelog_records_read", copy="standby") == 9
    assert value(fams, "dpc_changelog_records_read", copy="restore") == 0
    assert math.isnan(value(fams, "dpc_input_consumer_lag_records"))
    labels = {k for f in fams.values() for smp in f.samples for k in smp.labels}
    assert labels <= ALLOWED_LABELS
    # The public exposition carries none of the operator-only families.
    public_text = generate_latest(sf.public).decode()
    for name in set(fams) - PUBLIC_METRICS:
        assert name not in public_text


def test_histograms_observe_commits_and_ingest_batches() -> None:
    sf = surface()
    sf.batch_committed(0, None, {"events_applied": 1}, 0.004)
    sf.batch_committed(0, 9, {"markers_applied": 1}, 0.2)
    sf.ingest_batch(250)
    fams = parsed(generate_latest(sf.operator).decode())
    assert value(fams, "dpc_commit_seconds_count", kind="events") == 1
    assert value(fams, "dpc_commit_seconds_count", kind="marker") == 1
    assert value(fams, "dpc_timeline_batch_events_sum") == 1
    assert value(fams, "dpc_ingest_batch_records_sum") == 250


# ------------------------------------------------------------------- readiness, liveness


def test_readiness_needs_assignment_and_a_recent_marker_on_every_partition() -> None:
    s = settings()
    clock = Clock(0.0)
    sf = surface(s, clock=clock)
    assert sf.readiness() == (False, "waiting for a partition assignment")
    sf.assigned([0, 1])
    assert not sf.readiness()[0] and math.isnan(sf.marker_age_s())
    n = 100
    sealed_at = ((n + 1) * s.tick_ms + s.lateness_ms) / 1000  # 103.0
    clock.t = sealed_at + 0.25
    sf.batch_committed(0, n, {"markers_applied": 1}, 0.01)
    assert not sf.readiness()[0], "partition 1 has no marker yet"
    # A batch that did not apply its marker (a redelivered one) does not count.
    sf.batch_committed(1, None, {"skipped_duplicates": 1}, 0.01)
    assert not sf.readiness()[0]
    sf.batch_committed(1, n + 1, {"markers_applied": 1}, 0.01)
    assert sf.readiness()[0]
    assert sf.marker_age_s() == pytest.approx(0.25)  # the older of the two partitions
    clock.t = sealed_at + s.tick_ms / 1000 + READY_SLACK_S + 1
    ok, why = sf.readiness()
    assert not ok and "marker age" in why
    # A rebalance: not ready until the next assignment; a new partition needs a marker.
    sf.batch_committed(0, n + 40, {"markers_applied": 1}, 0.01)
    sf.batch_committed(1, n + 40, {"markers_applied": 1}, 0.01)
    assert sf.readiness()[0]
    asyncio.run(sf.on_revoked(None, set(), signal=None))
    assert not sf.readiness()[0]
    sf.assigned([1, 2])
    assert not sf.readiness()[0]
    sf.assigned([])  # more workers than partitions: a standby is ready once assigned
    assert sf.readiness()[0]


class FakeIngest:
    def __init__(self) -> None:
        self.last_beat: float | None = None
        self.running = False

    def alive(self) -> bool:
        return self.running


def test_liveness_watches_the_event_loop_and_the_ingest_thread() -> None:
    mono = Clock(1000.0)
    ingest = FakeIngest()
    sf = surface(monotonic=mono, ingest=ingest)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        sf.start(loop, probe_lag=False)  # metrics_port 0: nothing is served
        assert sf.listeners == []
        assert sf.health() == (True, "alive")  # ingest not started yet: starting up
        ingest.running, ingest.last_beat = True, mono.t
        mono.t += 10
        assert sf.health()[0]
        mono.t += 200  # the loop still answers: only the ingest loop is stuck
        ok, why = sf.health()
        assert not ok and why.startswith("ingest loop stalled")
        ingest.last_beat = mono.t
        ingest.running = False
        assert sf.health() == (False, "ingest thread stopped")
        ingest.running = True
        assert sf.health()[0]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    # The loop no longer runs callbacks: alive for a while (one long batch), then not.
    assert sf.health()[0]
    mono.t += LOOP_STALL_S + 1
    ingest.last_beat = mono.t
    ok, why = sf.health()
    assert not ok and why.startswith("event loop unresponsive")
    loop.close()
    assert sf.health() == (False, "event loop closed")


# ------------------------------------------------------------------- HTTP


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


@pytest.fixture
def served() -> Iterator[Callable[..., Surface]]:
    made: list[Surface] = []

    def serve(s: Settings) -> Surface:
        sf = surface(s)
        made.append(sf)
        sf.start(None, probe_lag=False)
        return sf

    yield serve
    for sf in made:
        sf.close()


def test_http_endpoints_and_the_public_listener(served: Callable[..., Surface]) -> None:
    port, public_port = free_port(), free_port()
    sf = served(settings(metrics_port=port, public_metrics=True,
                         public_metrics_port=public_port))
    base = f"http://127.0.0.1:{port}"
    status, text = get(f"{base}/metrics")
    assert status == 200 and "dpc_dead_letters_total" in text and "dpc_up 1.0" in text
    status, text = get(f"{base}/metrics/public")
    assert status == 200 and set(parsed(text)) == PUBLIC_METRICS
    assert get(f"{base}/healthz") == (200, "ok: alive\n")
    status, text = get(f"{base}/readyz")
    assert status == 503 and "assignment" in text
    sf.assigned([])
    assert get(f"{base}/readyz")[0] == 200
    assert get(f"{base}/other")[0] == 404
    # The public listener: the public set at /metrics, nothing else.
    status, text = get(f"http://127.0.0.1:{public_port}/metrics")
    assert status == 200 and set(parsed(text)) == PUBLIC_METRICS
    assert "dpc_dead_letters" not in text and "dpc_input_records" not in text
    for path in ("/metrics/public", "/healthz", "/readyz"):
        assert get(f"http://127.0.0.1:{public_port}{path}")[0] == 404


def test_public_listener_is_opt_in(served: Callable[..., Surface]) -> None:
    port, public_port = free_port(), free_port()
    served(settings(metrics_port=port, public_metrics_port=public_port))
    with pytest.raises(urllib.error.URLError):
        get(f"http://127.0.0.1:{public_port}/metrics")


def test_a_taken_port_is_logged_not_fatal(served: Callable[..., Surface],
                                          caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with caplog.at_level(logging.WARNING, logger="processor.stream.metrics"):
            sf = served(settings(metrics_port=port))
    assert sf.listeners == []
    assert f"cannot listen on 127.0.0.1:{port}" in caplog.text


def test_metrics_settings_are_validated(tmp_path: Any) -> None:
    assert (Settings().metrics_host, Settings().metrics_port, Settings().public_metrics) == (
        "127.0.0.1", 9464, False)
    cfg = tmp_path / "c.toml"
    cfg.write_text('metrics_port = 9100\npublic_metrics = true\n[counters]\na = 0\n')
    s = load_settings(str(cfg), env={"DPC_METRICS_HOST": "0.0.0.0"})
    assert (s.metrics_host, s.metrics_port, s.public_metrics, s.public_metrics_port) == (
        "0.0.0.0", 9100, True, 9465)
    for kw, field in (({"metrics_port": -1}, "metrics_port"),
                      ({"metrics_port": 70000}, "metrics_port"),
                      ({"public_metrics_port": 0}, "public_metrics_port"),
                      ({"metrics_host": ""}, "metrics_host"),
                      ({"public_metrics": True, "metrics_port": 9500,
                        "public_metrics_port": 9500}, "public_metrics_port")):
        with pytest.raises(ConfigError) as err:
            settings(**kw)
        assert err.value.field == field


# ------------------------------------------------------------------- a real worker


def wait_until(what: str, check: Callable[[], bool], timeout_s: float,
               dep: Deployment) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout_s:.0f} s; worker log:\n"
                                 + dep.worker.log_tail())
        time.sleep(0.2)  # polling an HTTP endpoint; the deadline decides


@pytest.mark.kafka
def test_worker_serves_metrics_health_and_readiness(
        deployment_factory: Callable[..., Deployment]) -> None:
    """A real worker, scraped over HTTP while events flow: readiness turns true, the
    metrics move, and no counter name appears in any scrape."""
    tick = 100
    start = (int(time.time() * 1000) // tick - 20) * tick
    names = ["qzx-signups-7c1", "qzx-refunds-9d4"]
    port, public_port = free_port(), free_port()
    dep = deployment_factory(dict.fromkeys(names, start), name="metrics", partitions=2,
                             tick_ms=tick, lateness_ms=300, heartbeat_ticks=10,
                             metrics_port=port, public_metrics=True,
                             public_metrics_port=public_port)
    base = f"http://127.0.0.1:{port}"
    dep.worker.start()
    scrapes: list[str] = []

    def scrape(url: str) -> dict[str, Metric]:
        status, text = get(url)
        assert status == 200
        scrapes.append(text)
        return parsed(text)

    def answers(path: str, code: int) -> bool:
        try:
            status, text = get(base + path)
        except urllib.error.URLError:
            return False  # not listening yet
        scrapes.append(text)
        return status == code

    wait_until("/healthz 200", lambda: answers("/healthz", 200), 90, dep)
    wait_until("/readyz 200", lambda: answers("/readyz", 200), 90, dep)
    before = scrape(f"{base}/metrics")

    def events(k: int) -> Iterator[bytes]:
        now = int(time.time() * 1000)
        for i in range(k):
            yield orjson.dumps({"counter": names[i % 2], "ts": now})
        yield b"not json"

    dep.produce(events(40))

    def moved() -> bool:
        m = scrape(f"{base}/metrics")
        return (value(m, "dpc_input_records") >= value(before, "dpc_input_records") + 41
                and value(m, "dpc_operator_events_applied") >= 40
                and value(m, "dpc_ingest_batch_records_count") >= 1
                and value(m, "dpc_timeline_batch_events_sum") >= 40
                and value(m, "dpc_releases_sent") > value(before, "dpc_releases_sent")
                and not math.isnan(value(m, "dpc_input_consumer_lag_records")))

    wait_until("metrics moving", moved, 90, dep)
    after = scrape(f"{base}/metrics")
    assert value(after, "dpc_dead_letters", reason="unparsable") == 1
    assert value(after, "dpc_ledger_entries_sent") >= 2
    assert value(after, "dpc_rebalances") >= 1
    assert value(after, "dpc_commit_seconds_count", kind="marker") >= 1
    assert value(after, "dpc_up") == 1 and value(after, "dpc_ready") == 1
    assert 0 <= value(after, "dpc_marker_age_seconds") < tick / 1000 + READY_SLACK_S
    # The lag computation against the brokers: everything ingested is committed, and a
    # group that never committed lags by the whole topic (41 records).
    probe = LagProbe(dep.settings, CollectorRegistry())
    try:
        wait_until("input lag 0", lambda: sum(probe.lag_by_partition(
            f"{dep.settings.app_id}-ingest", dep.topics.input).values()) == 0, 30, dep)
        never = probe.lag_by_partition(f"{dep.settings.app_id}-never", dep.topics.input)
        assert sum(never.values()) == 41 and set(never) == set(range(dep.settings.partitions))
    finally:
        probe.stop()
    # What a Kafka operator looks for, on the real worker: per-partition lag, assigned
    # partitions, build info, and librdkafka's statistics of the ingest clients (reported
    # every 10 s).
    assert value(after, "dpc_build_info") == 1
    timeline = dep.topics.timeline
    assert value(after, "dpc_assigned_partitions", topic=timeline) == dep.settings.partitions
    assert value(after, "dpc_catchup_ticks_behind") <= 2 * READY_SLACK_S * 1000 / tick
    for p in range(dep.settings.partitions):
        value(after, "dpc_consumer_lag_records", topic=dep.topics.input, partition=str(p))

    def client_stats() -> bool:
        m = scrape(f"{base}/metrics")
        try:
            value(m, "dpc_kafka_client_tx_retries", client="ingest-producer")
            value(m, "dpc_kafka_client_rebalances", client="ingest-consumer")
            value(m, "dpc_assigned_partitions", topic=dep.topics.input)
        except KeyError:
            return False
        return True

    wait_until("librdkafka statistics", client_stats, 40, dep)
    last = parsed(scrapes[-1])
    assert value(last, "dpc_kafka_client_tx_errors", client="ingest-producer") == 0
    assert value(last, "dpc_assigned_partitions", topic=dep.topics.input) == \
        dep.settings.partitions
    public = scrape(f"http://127.0.0.1:{public_port}/metrics")
    assert set(public) == PUBLIC_METRICS
    assert value(public, "dpc_releases_sent") >= value(after, "dpc_releases_sent")
    for text in scrapes:
        for name in names:
            assert name not in text
    assert dep.worker.stop() == 0, dep.worker.log_tail()


# ------------------------------------------------------------------- for Kafka operators

#: Help texts that need no unit: 0/1 gauges and the info metric.
_UNITLESS = ("1 while", "Always 1")


def undocumented(registry: CollectorRegistry) -> list[str]:
    """Families of ours whose help does not say its unit (the part after the last `; `)
    or is too short to say what it measures."""
    bad = []
    for fam in registry.collect():
        if not fam.name.startswith("dpc_"):
            continue
        doc = fam.documentation
        if len(doc) < 40 or not (doc.startswith(_UNITLESS) or "; " in doc):
            bad.append(f"{fam.name}: {doc!r}")
    return bad


def test_every_help_text_says_what_and_its_unit() -> None:
    """Control: the help text the issue quoted (`Operator count events_applied
    (commit.Output metrics)`) is caught by the same check."""
    from processor.stream.model.bounding import METRICS as UNIT_METRICS
    from processor.stream.model.operator import METRICS
    from processor.stream.worker.metrics import OPERATOR_COUNT_HELP, UNIT_COUNT_HELP

    assert set(OPERATOR_COUNT_HELP) == set(METRICS)
    assert set(UNIT_COUNT_HELP) == {*UNIT_METRICS, "unit_forward_batches",
                                    "unit_checkpoints"}
    sf = surface(ingest=StatsIngest(SAMPLE_STATS))
    assert undocumented(sf.operator) == []
    registry = CollectorRegistry()
    Counter("dpc_operator_events_applied", "Operator count events_applied (commit.Output "
            "metrics)", registry=registry)
    assert len(undocumented(registry)) == 1


def test_build_info_assignment_catchup_and_producer_errors() -> None:
    s = settings(partitions=4)
    clock = Clock(0.0)
    sf = surface(s, clock=clock, ingest=StatsIngest(SAMPLE_STATS))
    fams = parsed(generate_latest(sf.operator).decode())
    info = next(iter(fams["dpc_build_info"].samples))
    assert info.value == 1 and info.labels["python"].count(".") == 2
    assert info.labels["librdkafka"][0].isdigit() and info.labels["faust"] != "none"
    # Before any assignment only the ingest consumer's (from librdkafka) is known.
    assert sf.assigned_partitions() == {"dpc-input": 3}
    sf.assigned([0, 2])
    assert sf.assigned_partitions() == {"dpc-input": 3, "dpc-timeline": 2}
    # Catch-up: due tick minus the oldest sealed tick over the owned partitions.
    assert math.isnan(sf.catchup_ticks_behind())
    sf.batch_committed(0, 100, {"markers_applied": 1}, 0.01)
    sf.batch_committed(2, 90, {"markers_applied": 1}, 0.01)
    clock.t = (500 * s.tick_ms + s.lateness_ms) / 1000  # tick 499 is due (sealed at 500 s)
    assert sf.catchup_ticks_behind() == 499 - 90
    ok, why = sf.readiness()
    assert not ok and why.startswith("catching up, 409 ticks behind"), why
    clock.t = (91 * s.tick_ms + s.lateness_ms) / 1000 + 0.5  # tick 90 just sealed
    assert sf.catchup_ticks_behind() == 0 and sf.readiness()[0]
    # Producer errors by stage and error name (never the message).
    from confluent_kafka import KafkaError, KafkaException

    sf.producer_error("operator", KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT,
                                                            "secret text")))
    sf.producer_error("operator", TimeoutError("x"))
    sf.producer_error("ingest", "NOT_ENOUGH_REPLICAS")
    asyncio.run(sf.on_revoked(None, set(), signal=None))
    text = generate_latest(sf.operator).decode()
    fams = parsed(text)
    assert value(fams, "dpc_producer_errors", stage="operator", error="_MSG_TIMED_OUT") == 1
    assert value(fams, "dpc_producer_errors", stage="operator", error="TimeoutError") == 1
    assert value(fams, "dpc_producer_errors", stage="ingest", error="NOT_ENOUGH_REPLICAS") == 1
    assert value(fams, "dpc_partitions_revocations") == 1
    assert "secret text" not in text


class StatsIngest(FakeIngest):
    def __init__(self, stats: dict[str, Any]) -> None:
        super().__init__()
        self.client_stats = stats


#: A trimmed librdkafka statistics report of a consumer and a producer (the fields
#: client_stats_families reads, as librdkafka 2.x names them; a real report is checked
#: against the same code by test_real_librdkafka_statistics).
SAMPLE_STATS: dict[str, Any] = {
    "ingest-consumer": {
        "name": "rdkafka#consumer-1", "type": "consumer", "time": time.time(), "msg_cnt": 0,
        "brokers": {
            "127.0.0.1:9092/bootstrap": {"nodeid": -1, "state": "UP", "txerrs": 9},
            "127.0.0.1:9092/1": {"name": "127.0.0.1:9092/1", "nodeid": 1,
                                 "nodename": "127.0.0.1:9092", "state": "UP", "txerrs": 0,
                                 "txretries": 1, "req_timeouts": 0, "rxerrs": 0,
                                 "rtt": {"avg": 2500}}},
        "topics": {"dpc-input": {"partitions": {
            "0": {"consumer_lag": 5}, "1": {"consumer_lag": 0}, "2": {"consumer_lag": -1},
            "-1": {"consumer_lag": -1}}}},
        "cgrp": {"state": "up", "rebalance_cnt": 2, "assignment_size": 3},
    },
    "ingest-producer": {
        "name": "rdkafka#producer-1", "type": "producer", "time": time.time(), "msg_cnt": 4,
        "brokers": {"127.0.0.1:9092/1": {"nodeid": 1, "nodename": "127.0.0.1:9092",
                                         "state": "DOWN", "txerrs": 3, "txretries": 7,
                                         "req_timeouts": 2, "rxerrs": 1,
                                         "rtt": {"avg": 0}}},
    },
}


def test_librdkafka_statistics_become_families() -> None:
    from processor.stream.worker.metrics import client_stats_families

    registry = CollectorRegistry()

    class C:
        def collect(self) -> Iterable[Metric]:
            return client_stats_families(SAMPLE_STATS)

    registry.register(C())
    fams = parsed(generate_latest(registry).decode())
    assert value(fams, "dpc_kafka_client_tx_errors", client="ingest-producer") == 3
    # The sums include the bootstrap connections' (failed sends there are real); the
    # per-broker families leave the placeholders out (below: one broker label only).
    assert value(fams, "dpc_kafka_client_tx_errors", client="ingest-consumer") == 9
    brokers = {smp.labels["broker"] for smp in fams["dpc_kafka_client_broker_up"].samples}
    assert brokers == {"127.0.0.1:9092"}
    assert value(fams, "dpc_kafka_client_tx_retries", client="ingest-producer") == 7
    assert value(fams, "dpc_kafka_client_request_timeouts", client="ingest-producer") == 2
    assert value(fams, "dpc_kafka_client_queued_messages", client="ingest-producer") == 4
    assert value(fams, "dpc_kafka_client_broker_up", client="ingest-producer",
                 broker="127.0.0.1:9092") == 0
    assert value(fams, "dpc_kafka_client_broker_rtt_seconds", client="ingest-consumer",
                 broker="127.0.0.1:9092") == pytest.approx(0.0025)
    assert value(fams, "dpc_kafka_client_consumer_lag_records", client="ingest-consumer",
                 topic="dpc-input", partition="0") == 5
    with pytest.raises(KeyError):  # unknown lag (-1) and the internal partition: absent
        value(fams, "dpc_kafka_client_consumer_lag_records", partition="2")
    assert value(fams, "dpc_kafka_client_rebalances", client="ingest-consumer") == 2
    # The sample's "time" is when this module was imported: the age is measured from it.
    expected = time.time() - SAMPLE_STATS["ingest-consumer"]["time"]
    assert value(fams, "dpc_kafka_client_stats_age_seconds",
                 client="ingest-consumer") == pytest.approx(expected, abs=5)


def test_real_librdkafka_statistics(kafka_bootstrap: str, unique_topic: Callable[[str], str]
                                    ) -> None:
    """A real producer's statistics report through the same code: its broker is up, the
    queue drained, no errors (the field names above are librdkafka's)."""
    from confluent_kafka import Producer

    from processor.stream.worker.metrics import client_stats_families

    got: list[str] = []
    producer = Producer({"bootstrap.servers": kafka_bootstrap,
                         "statistics.interval.ms": "200", "stats_cb": got.append})
    topic = unique_topic("stats")
    producer.produce(topic, b"x")
    producer.flush(30)
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        producer.poll(0.2)
    assert got, "no statistics in 30 s"
    fams = {f.name: f for f in client_stats_families({"p": orjson.loads(got[-1])})}
    ups = [smp.value for smp in fams["dpc_kafka_client_broker_up"].samples]
    assert ups and all(v == 1 for v in ups), ups
    assert fams["dpc_kafka_client_queued_messages"].samples[0].value == 0
    assert fams["dpc_kafka_client_tx_errors"].samples[0].value == 0
