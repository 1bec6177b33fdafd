"""Secrets and private input stay out of the logs at every level.

`configure_logging` (processor/stream/model/logs.py) keeps the Kafka clients' and Faust's loggers
at INFO or above whatever `--loglevel` says. The pure tests check the clamp on the exact
line aiokafka writes at DEBUG under SASL/PLAIN; the broker tests show that aiokafka really
logs record values at DEBUG when unclamped (the control for the scan) and run a real worker
at `--loglevel debug` with events flowing, then scan its log for the noise key, raw input
values and the SASL password of its configuration.
"""

from __future__ import annotations

import asyncio
import io
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from processor.devtools.deployment import ROOT, WorkerProcess
from processor.stream.model.config import SecuritySettings
from processor.stream.model.logs import CLIENT_LOG_FLOORS, LOG_FORMAT, configure_logging

#: The line aiokafka's conn.py writes at DEBUG for the SASL/PLAIN authentication request.
SASL_LINE = "Request to %s:%d %d: %s"


@pytest.fixture
def isolated_logging() -> Iterator[io.StringIO]:
    """The root logger with one handler writing to a buffer, as `configure_logging` would
    find it; every level and handler put back afterwards (pytest's own included)."""
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    # Every client-family logger, and the ones the tests write to, starts from the
    # defaults (NOTSET, propagating, enabled): an earlier test in the same process may
    # have clamped or silenced them (configure_logging, Faust's own logging setup).
    names = {*CLIENT_LOG_FLOORS, "aiokafka.conn", "faust.agents.agent", "processor.test",
             "processor.stream.app"}
    names |= {n for n, lg in logging.Logger.manager.loggerDict.items()
              if isinstance(lg, logging.Logger) and n.split(".", 1)[0] in CLIENT_LOG_FLOORS}
    loggers = [logging.getLogger(n) for n in sorted(names)]
    saved = [(lg, lg.level, lg.propagate, lg.disabled) for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.NOTSET)
        lg.propagate, lg.disabled = True, False
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.handlers = [handler]
    try:
        yield buf
    finally:
        root.handlers = saved_handlers
        root.setLevel(saved_level)
        for lg, level, propagate, disabled in saved:
            lg.setLevel(level)
            lg.propagate, lg.disabled = propagate, disabled


def _emit_client_lines(password: str, record_value: str) -> None:
    logging.getLogger("aiokafka.conn").debug(
        SASL_LINE, "127.0.0.1", 9092, 3,
        f"SaslAuthenticateRequest_v1(sasl_auth_bytes=b'dpc\\x00dpc\\x00{password}')")
    logging.getLogger("aiokafka.producer.producer").debug(
        "Sending (key=%s value=%s) to %s", None, record_value, "tp")
    logging.getLogger("faust.agents.agent").debug("%r yielded: %r", "fun", record_value)
    logging.getLogger("mode.services").debug("service internals %s", record_value)
    logging.getLogger("kafka.conn").debug("%s", password)


def test_clamp_drops_client_debug_lines_and_keeps_the_rest(
        isolated_logging: io.StringIO) -> None:
    password, value = "pw-" + uuid.uuid4().hex, "rec-" + uuid.uuid4().hex
    assert configure_logging("debug") == logging.DEBUG
    _emit_client_lines(password, value)
    logging.getLogger("processor.test").debug("own debug line")
    logging.getLogger("aiokafka.conn").info("Authenticated as %s via %s", "dpc", "PLAIN")
    out = isolated_logging.getvalue()
    assert password not in out and value not in out
    # the processor's own loggers follow --loglevel; the clients keep INFO and above
    assert "own debug line" in out and "Authenticated as dpc via PLAIN" in out


def test_clamp_holds_against_a_child_logger_set_to_debug(
        isolated_logging: io.StringIO) -> None:
    """A library (or a later basicConfig) setting a child logger to DEBUG does not get
    past the floor: the level is lifted, and the handler filter drops what remains."""
    logging.getLogger("aiokafka.conn").setLevel(logging.DEBUG)
    configure_logging("debug")
    assert logging.getLogger("aiokafka.conn").level >= logging.INFO
    logging.getLogger("aiokafka.conn").setLevel(logging.DEBUG)  # set again after setup
    secret = "pw-" + uuid.uuid4().hex
    logging.getLogger("aiokafka.conn").debug(SASL_LINE, "h", 1, 1, secret)
    assert secret not in isolated_logging.getvalue()


def test_control_without_the_clamp_the_lines_are_written(
        isolated_logging: io.StringIO) -> None:
    """Control: the same lines at DEBUG without configure_logging reach the log, so the
    tests above can fail."""
    logging.getLogger().setLevel(logging.DEBUG)
    password, value = "pw-" + uuid.uuid4().hex, "rec-" + uuid.uuid4().hex
    _emit_client_lines(password, value)
    out = isolated_logging.getvalue()
    assert password in out and value in out


def test_json_log_format_is_one_object_per_line_and_keeps_the_floor(
        isolated_logging: io.StringIO) -> None:
    """--log-format json: every line parses as JSON with ts, level, logger and msg (exc
    with a traceback); the client floors hold in this format too."""
    password, value = "pw-" + uuid.uuid4().hex, "rec-" + uuid.uuid4().hex
    configure_logging("debug", "json")
    _emit_client_lines(password, value)
    own = logging.getLogger("processor.test")
    own.info("started %s", "worker")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        own.exception("failed")
    lines = [orjson.loads(x) for x in isolated_logging.getvalue().splitlines()]
    assert [(x["level"], x["logger"], x["msg"]) for x in lines] == [
        ("INFO", "processor.test", "started worker"), ("ERROR", "processor.test", "failed")]
    assert "RuntimeError: boom" in lines[1]["exc"] and lines[0]["ts"].endswith("+00:00")
    assert password not in isolated_logging.getvalue() and value not in isolated_logging.getvalue()


def test_json_log_has_the_metrics_as_structured_fields(
        isolated_logging: io.StringIO) -> None:
    """The worker's metrics line: as the worker writes it today (`metrics %s` with a k=v
    summary) and as `extra={"fields": ...}`, the JSON line has msg "metrics" and the counts
    as an object of integers; in text the fields follow the message as k=v. Control: a
    message that merely starts with "metrics" but is not k=v stays a plain msg."""
    from processor.stream.model.logs import TextFormatter

    configure_logging("info", "json")
    own = logging.getLogger("processor.stream.app")
    own.info("metrics %s", "events_applied=12 ingested=12 releases_sent=3")
    own.info("metrics", extra={"fields": {"events_applied": 12, "releases_sent": 3}})
    own.info("metrics %s", "of a strange kind")
    lines = [orjson.loads(x) for x in isolated_logging.getvalue().splitlines()]
    assert lines[0]["msg"] == "metrics" and lines[0]["fields"] == {
        "events_applied": 12, "ingested": 12, "releases_sent": 3}
    assert lines[1]["msg"] == "metrics" and lines[1]["fields"] == {
        "events_applied": 12, "releases_sent": 3}
    assert lines[2]["msg"] == "metrics of a strange kind" and "fields" not in lines[2]
    record = logging.LogRecord("processor.stream.app", logging.INFO, __file__, 1, "metrics",
                               None, None)
    record.fields = {"b": 2, "a": 1}
    assert TextFormatter("%(message)s").format(record) == "metrics a=1 b=2"


def test_faust_sensor_noise_is_dropped_and_other_warnings_kept(
        isolated_logging: io.StringIO) -> None:
    """Whichever logger Faust's app logs it through: faust.app.base, or the module of the
    App subclass (the worker's WorkerApp logs as processor.stream.app)."""
    configure_logging("info")
    for name in ("faust.app.base", "processor.stream.app"):
        logging.getLogger(name).warning("[^-App]: Missing sensor state for rebalance #%s", 1)
        logging.getLogger(name).warning("[^-App]: a real warning from %s", name)
    out = isolated_logging.getvalue()
    assert "Missing sensor state" not in out
    assert "a real warning from faust.app.base" in out
    assert "a real warning from processor.stream.app" in out


def test_unknown_log_format_is_refused(isolated_logging: io.StringIO) -> None:
    with pytest.raises(ValueError, match="unknown log format 'xml'"):
        configure_logging("info", "xml")


def test_a_higher_loglevel_is_kept(isolated_logging: io.StringIO) -> None:
    configure_logging("error")
    logging.getLogger("aiokafka.conn").warning("a warning")
    assert "a warning" not in isolated_logging.getvalue()
    assert logging.getLogger("aiokafka").level == logging.ERROR


# ------------------------------------------------------------------------- with a broker

def _aiokafka_send(bootstrap: str, topic: str, value: bytes) -> None:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, value)
        finally:
            await producer.stop()

    asyncio.run(run())


@pytest.mark.kafka
def test_aiokafka_logs_record_values_at_debug_unless_clamped(
        kafka_bootstrap: str, unique_topic: Callable[[str], str],
        create_topics: Callable[..., None], isolated_logging: io.StringIO) -> None:
    """The leak is real (control): an unclamped aiokafka producer at DEBUG writes the
    record's value into the log; after configure_logging("debug") the same send does not."""
    topic = unique_topic("logclamp")
    create_topics(kafka_bootstrap, [topic])
    logging.getLogger().setLevel(logging.DEBUG)
    planted = "canary-" + uuid.uuid4().hex
    _aiokafka_send(kafka_bootstrap, topic, planted.encode())
    assert planted in isolated_logging.getvalue()

    configure_logging("debug")
    clamped = "canary-" + uuid.uuid4().hex
    _aiokafka_send(kafka_bootstrap, topic, clamped.encode())
    out = isolated_logging.getvalue()
    assert clamped not in out
    assert "aiokafka" in out.split(planted, 1)[1]  # aiokafka still logged (at INFO)


def scan(text: str, needles: dict[str, str]) -> list[str]:
    """The names of the needles found in `text`."""
    return [name for name, needle in needles.items() if needle in text]


#: The worker with configure_logging replaced by a plain basicConfig: the control run.
UNCLAMPED_WORKER = (
    "import logging, sys\n"
    "import processor.stream.worker.app as app\n"
    "app.configure_logging = lambda level, fmt='text': logging.basicConfig(level=level.upper())\n"
    "sys.exit(app.main_worker(sys.argv[1:]))\n")


def debug_run(deployment_factory: Callable[..., Any], password: str, canary: str, bad: str,
              *, clamped: bool) -> tuple[str, str]:
    """Run one worker of a fresh deployment at --loglevel debug until a release of the
    undeclared counter `canary` is out; returns (its log, the noise key's hex)."""
    tick = 500
    start = (int(time.time() * 1000) // tick) * tick
    dep = deployment_factory(
        {"declared": start}, name="logscan", loglevel="debug", partitions=1, tick_ms=tick,
        lateness_ms=500, heartbeat_ticks=4, allow_undeclared=True, epsilon=500.0,
        security=SecuritySettings(security_protocol="PLAINTEXT", sasl_password=password))
    assert password in dep.config.read_text()  # precondition: the worker gets it
    worker = dep.worker
    if not clamped:
        worker = UnclampedWorker(dep.config, dep.directory / "unclamped.log",
                                 loglevel="debug", env=worker.env)
        dep.workers.append(worker)  # stopped at teardown like any other
    worker.start()
    now = int(time.time() * 1000)
    dep.produce([orjson.dumps({"counter": canary, "ts": now + i}) for i in range(5)]
                + [b'{"counter": "' + bad.encode() + b'", "ts": "not a time"}'])
    try:
        dep.wait_releases(lambda recs: any(r.get("counter") == canary for r in recs),
                          timeout_s=120)
    finally:
        code = worker.stop()
    assert code == 0, worker.log_tail()
    assert dep.settings.noise_key_file is not None
    return (worker.log_path.read_text(errors="replace"),
            Path(dep.settings.noise_key_file).read_text().strip())


class UnclampedWorker(WorkerProcess):
    """A WorkerProcess running UNCLAMPED_WORKER instead of `python -m processor worker`."""

    def start(self) -> UnclampedWorker:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", UNCLAMPED_WORKER, "--config", self.config_path,
             "--loglevel", self.loglevel],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=str(ROOT), env=self.env)
        self.starts += 1
        return self


@pytest.mark.kafka
def test_debug_worker_log_has_no_key_password_or_raw_input(
        deployment_factory: Callable[..., Any], tmp_path: Path) -> None:
    # A password with PLAINTEXT is accepted by the configuration and ignored by the
    # clients: it is in the worker's settings (a repr or a config dump would show it) but
    # never on the wire. The SASL frame path is covered by the pure clamp tests above.
    password = "pw-" + uuid.uuid4().hex
    canary = "zq-canary-" + uuid.uuid4().hex[:12]  # an undeclared counter: private input
    bad = "zq-bad-" + uuid.uuid4().hex[:12]  # inside a malformed record (dead letter)
    log_text, secret_hex = debug_run(deployment_factory, password, canary, bad, clamped=True)
    # preconditions: the run was at DEBUG, and the client libraries did log into this file
    assert " DEBUG " in log_text, log_text[-2000:]
    assert " aiokafka." in log_text and " faust." in log_text, log_text[-2000:]
    # no terminal escape codes (Faust's spinner) and no benign-warning noise at start
    assert "\x1b[" not in log_text and "Missing sensor state" not in log_text
    needles = {"noise key": secret_hex, "noise key (upper)": secret_hex.upper(),
               "password": password, "undeclared counter": canary, "malformed record": bad}
    assert scan(log_text, needles) == []

    # control 1: the scan finds what a deliberately unclamped logger writes to a log
    planted = tmp_path / "planted.log"
    control = logging.getLogger("dpc.test.unclamped")
    handler = logging.FileHandler(planted)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    control.addHandler(handler)
    control.setLevel(logging.DEBUG)
    control.propagate = False
    try:
        control.debug("planted %s %s %s", secret_hex, password, canary)
    finally:
        control.removeHandler(handler)
        handler.close()
    found = scan(log_text + planted.read_text(), needles)
    assert {"noise key", "password", "undeclared counter"} <= set(found)


@pytest.mark.kafka
def test_unclamped_debug_worker_client_lines_carry_no_operator_record(
        deployment_factory: Callable[..., Any]) -> None:
    """The same run with configure_logging replaced by a plain basicConfig: Faust's and
    aiokafka's DEBUG lines are there, and none carries the undeclared counter's name.
    Until the operator wrote its changelog and releases through Faust's producer, these
    lines quoted every record sent (this test was the control of the one above); now
    those records go through librdkafka, whose log lines never quote a record, and the
    clamp stays as a second defence (the pure clamp tests above; the planted control)."""
    canary = "zq-canary-" + uuid.uuid4().hex[:12]
    log_text, _ = debug_run(deployment_factory, "pw-" + uuid.uuid4().hex, canary,
                            "zq-bad-" + uuid.uuid4().hex[:12], clamped=False)
    assert "aiokafka" in log_text and "faust." in log_text, log_text[-2000:]
    assert sum("DEBUG" in line for line in log_text.splitlines()) > 100
    assert [line for line in log_text.splitlines() if canary in line] == []
