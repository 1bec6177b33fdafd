"""Secured brokers as a tested path: the real worker and replay against
a local broker whose only client listener is SASL_SSL with SCRAM-SHA-512, and against one
that requires mutual TLS; certificates made by the test (a fresh CA per broker).

One broker per mode, module-scoped, both started at once (the second JVM comes up while
the first mode's tests run). Per mode: the worker ingests events and a malformed record,
publishes releases, and replay (the command line, reading the same config) finds them
identical; a wrong password, an untrusted CA (and, for mutual TLS, a client certificate
from a foreign CA) each stop the worker and replay within seconds with one `error:` line
naming the refusal, exit code 2, no secret in the output. Controls: a plaintext client
gets nothing from the secured listener, and the failing configurations differ from the
working one in that one setting only. Every check is exact (no statistics: false-alarm
rate 0 on a correct system).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaException

from processor.devtools.deployment import (
    Deployment,
    isolated_deployment,
    worker_env,
    write_config,
)
from processor.devtools.kafka.cluster import LocalKafka
from processor.devtools.kafka.tls import make_tls_files
from processor.stream.kafka import kafka_io
from processor.stream.model.config import SecuritySettings, Settings, with_overrides
from tests.stream.test_app_e2e import TEST_SECRET, now_ms, published_map

ROOT = Path(__file__).resolve().parents[2]
#: The SCRAM user the worker logs in as (created when the broker's storage is formatted).
USER, PASSWORD = "dpc-worker", "s3cret-scram-pass"
#: A refused start must end within this many seconds (it ends in about 3: the
#: interpreter's start plus one refused handshake; waiting for metadata would take 15).
FAIL_FAST_S = 12.0


MODES = ("sasl_ssl", "mtls")


@pytest.fixture(scope="module")
def secured_brokers(local_kafka_available: None) -> Iterator[dict[str, Future[LocalKafka]]]:
    """One single-node LocalKafka per mode, both started at once in the background (the
    second JVM starts while the first mode's tests run); all stopped at the end."""
    brokers = {mode: LocalKafka(security=mode, scram_users={USER: PASSWORD}, heap="256m",
                                start_timeout=180.0) for mode in MODES}
    with ThreadPoolExecutor(len(MODES)) as pool:
        started = {mode: pool.submit(kafka.start) for mode, kafka in brokers.items()}
        try:
            yield started
        finally:
            for mode, kafka in brokers.items():
                with contextlib.suppress(Exception):  # a failed start already cleaned up
                    started[mode].result()
                kafka.stop()


@pytest.fixture(scope="module", params=MODES)
def secured_kafka(request: pytest.FixtureRequest,
                  secured_brokers: dict[str, Future[LocalKafka]]) -> LocalKafka:
    """The single-node LocalKafka whose client listener is secured by `request.param`."""
    return secured_brokers[str(request.param)].result(timeout=300)


@pytest.fixture
def secured_deployment(secured_kafka: LocalKafka, tmp_path: Path) -> Iterator[Deployment]:
    """An isolated deployment on the secured broker (topics created over the secured
    listener, worker not started); its workers are stopped at teardown."""
    start = (now_ms() // 100) * 100
    dep = isolated_deployment(
        secured_kafka.bootstrap_servers, {"a": start, "b": start}, parent=tmp_path,
        name=f"sec-{secured_kafka.security}", secret=TEST_SECRET,
        security=SecuritySettings(**secured_kafka.client_security()), partitions=2,
        tick_ms=100, lateness_ms=300, heartbeat_ticks=10, mechanism="simecc", epsilon=500.0)
    try:
        yield dep
    finally:
        dep.close()


def _worker(settings: Settings, path: Path, command: str = "worker"
            ) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the worker (or `command`) on `settings` until it exits; (result, seconds)."""
    config = write_config(settings, path)
    started = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "processor", command, "--config", str(config)],
                         capture_output=True, text=True, timeout=120, cwd=str(ROOT),
                         env=worker_env())
    return res, time.monotonic() - started


@pytest.mark.kafka
def test_worker_and_replay_on_the_secured_broker(secured_kafka: LocalKafka,
                                                 secured_deployment: Deployment) -> None:
    """Events and one malformed record go in over the secured listener; the worker
    publishes releases that move with the data and dead-letters the record; it stops
    cleanly, and `python -m processor replay` on its config says identical. Control: a
    client without the security settings gets no metadata from the listener."""
    dep = secured_deployment
    dep.worker.start()
    dep.wait_releases(lambda rs: len(rs) > 0, timeout_s=90)
    now = now_ms()
    events = [orjson.dumps({"counter": "a", "ts": now + 200}) for _ in range(20)]
    events += [orjson.dumps({"counter": "b", "ts": now + 200, "value": 0.5}) for _ in range(10)]
    dep.produce([*events, b"{not json"])

    def moved(rs: list[dict[str, Any]]) -> bool:
        return {r["counter"] for r in rs if r["kind"] == "change" and r["value"] > 0} == {"a", "b"}

    dep.wait_releases(moved, timeout_s=90)
    assert dep.worker.stop() == 0, dep.worker.log_tail()

    dead = [orjson.loads(r.value or b"") for r in
            kafka_io.iter_topic(dep.conf, dep.topics.deadletter)]
    assert [d["reason"] for d in dead] == ["unparsable"]
    published_map(dep.releases())  # one value per (counter, tick, kind)
    log = dep.worker.log_path.read_text(errors="replace")
    assert PASSWORD not in log and "Traceback" not in log, log[-2000:]

    res = subprocess.run([sys.executable, "-m", "processor", "replay", "--config",
                          str(dep.config)], capture_output=True, text=True, timeout=120,
                         cwd=str(ROOT), env=worker_env())
    assert res.returncode == 0, res.stdout + res.stderr
    assert "identical" in res.stdout and PASSWORD not in res.stdout + res.stderr

    # Control: the listener really is secured (a plaintext client gets no metadata).
    with pytest.raises(KafkaException):
        kafka_io.check_access({"bootstrap.servers": secured_kafka.bootstrap_servers}, 1.5)


def _refusals(kafka: LocalKafka, settings: Settings, tmp: Path) -> dict[str, Settings]:
    """Configurations that differ from the working one in one security setting each."""
    sec = settings.security
    foreign = make_tls_files(tmp / "foreign-ca", name="foreign")
    out = {"untrusted CA": replace(sec, ssl_cafile=str(foreign.ca_cert))}
    if kafka.security == "sasl_ssl":
        out["wrong password"] = replace(sec, sasl_password="not-the-" + PASSWORD)
    else:
        out["client certificate of a foreign CA"] = replace(
            sec, ssl_certfile=str(foreign.client_cert), ssl_keyfile=str(foreign.client_key))
    return {what: with_overrides(settings, security=s) for what, s in out.items()}


@pytest.mark.kafka
def test_refused_credentials_fail_fast_with_one_error_line(
        secured_kafka: LocalKafka, secured_deployment: Deployment, tmp_path: Path) -> None:
    """A wrong password, an untrusted CA, a foreign client certificate: the worker and
    replay stop in seconds with exactly one `error:` line saying the brokers refuse this
    client and why, exit code 2, no traceback, no password. Control: the unchanged
    configuration passes the same access check (the refusal is the changed setting's)."""
    dep = secured_deployment
    kafka_io.check_access(dep.conf, 10.0)
    for i, (what, settings, command) in enumerate(
            (w, s, c) for w, s in _refusals(secured_kafka, dep.settings, tmp_path).items()
            for c in ("worker", "replay")):
        res, took = _worker(settings, tmp_path / f"refused-{i}.toml", command)
        what = f"{command}, {what}"
        out = (res.stdout + res.stderr).strip()
        lines = out.splitlines()
        assert res.returncode == 2, f"{what}: {out}"
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: {lines}"
        assert "refuse this client" in lines[0], f"{what}: {lines[0]}"
        reason = "SASL authentication failed" if "wrong password" in what else "SSL"
        assert reason in lines[0], f"{what}: {lines[0]}"
        assert PASSWORD not in out and "not-the-" not in out
        assert took < FAIL_FAST_S, f"{what}: took {took:.1f} s"
