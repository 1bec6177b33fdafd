"""`python -m processor send`: the short form and JSON lines become input records, each
is checked as ingest checks it (parse_input) and sent only when it passes, and the
closing line says what went where. On the real broker: exactly the accepted lines reach
the input topic, in order; refused lines are reported with their reason and line number
(exit 1); a missing input topic and brokers that do not answer are one `error:` line,
exit 2, the latter within seconds."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from processor.commands.send import event_json


def test_the_short_form_is_the_event_it_stands_for() -> None:
    """ts empty or missing: the time the line is read; digits: epoch ms; other text: an
    ISO-8601 string; value and user as given. JSON lines pass as they are. A value that
    is no number stays text (the schema check then names it); too many fields stay one
    counter name (refused whole, never split wrongly)."""
    def obj(line: str) -> Any:
        return orjson.loads(event_json(line, 1234))

    assert obj("signups") == {"counter": "signups", "ts": 1234}
    assert obj("signups,,") == {"counter": "signups", "ts": 1234}
    assert obj("signups, 5000") == {"counter": "signups", "ts": 5000}
    assert obj("a,2026-01-01T00:00:00Z,0.5,u1") == {
        "counter": "a", "ts": "2026-01-01T00:00:00Z", "value": 0.5, "user": "u1"}
    assert obj("a,,1") == {"counter": "a", "ts": 1234, "value": 1}
    assert obj("a,,x") == {"counter": "a", "ts": 1234, "value": "x"}
    assert obj("a,1,1,u,extra") == {"counter": "a,1,1,u,extra", "ts": 1234}
    line = '{"counter": "a", "ts": 7, "value": 0.25}'
    assert event_json(line, 1234) == line.encode()


def _send(config: str, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "processor", "send", "--config", config,
                           *args], input=text, capture_output=True, text=True, timeout=120)


@pytest.mark.kafka
def test_send_puts_exactly_the_valid_lines_on_the_input_topic(
        deployment_factory: Callable[..., Any]) -> None:
    """Five event lines, two refused (an undeclared counter, a value out of range): the
    three accepted ones reach the input topic in order and nothing else; stderr names
    the refused lines and reasons; stdout's closing line counts them. Control: a run of
    only valid lines exits 0."""
    from processor.stream.kafka.kafka_io import read_topic

    start = (int(time.time() * 1000) // 1000 - 60) * 1000
    dep = deployment_factory({"a": start, "b": start})
    ts = start + 5000
    text = "\n".join([
        "# the walk-through's events", "a", "", "b,,0.5", "nope", "a,,2",
        f'{{"counter": "a", "ts": {ts}, "value": 0.25}}']) + "\n"
    done = _send(str(dep.config), text)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "stdin:5: not sent (undeclared_counter): counter is not declared in the configuration",
        "stdin:6: not sent (value_out_of_range): value must be in [0, 1]"]
    topic = dep.settings.topics.input
    assert done.stdout == (f"sent 3 event(s) to {topic!r} at {dep.settings.bootstrap_servers}"
                           " (a 2, b 1); 2 line(s) refused\n")
    values = [orjson.loads(r.value or b"") for recs in read_topic(dep.conf, topic).values()
              for r in recs]
    assert sorted((v["counter"], v.get("value", 1)) for v in values) == [
        ("a", 0.25), ("a", 1), ("b", 0.5)]
    assert {"counter": "a", "ts": ts, "value": 0.25} in values
    assert all(start < v["ts"] <= time.time() * 1000 for v in values)
    done = _send(str(dep.config), "a\nb,,0\n")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert "sent 2 event(s)" in done.stdout


@pytest.mark.kafka
def test_send_without_the_input_topic_or_a_broker_is_one_error_line(
        deployment_factory: Callable[..., Any]) -> None:
    """No input topic (no worker has run): one line saying to start the worker, exit 2,
    nothing created. Brokers that do not answer: one line naming them within 5 s of
    the probe (the command's start included: under 15 s)."""
    from processor.stream.kafka.kafka_io import missing_topics

    dep = deployment_factory({"a": 0}, create_topics=False)
    done = _send(str(dep.config), "a\n", "--wait", "1")
    waited, error = done.stderr.splitlines()
    assert done.returncode == 2 and waited.startswith("waiting up to 1 s"), done.stderr
    assert error.startswith("error: the input topic") and "start the worker" in error
    assert missing_topics(dep.conf, [dep.settings.topics.input]) == [
        dep.settings.topics.input]
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = dep.directory / "nobroker.toml"
    config.write_text(dep.config.read_text().replace(
        dep.settings.bootstrap_servers, f"127.0.0.1:{port}"))
    began = time.monotonic()
    done = _send(str(config), "a\n")
    assert time.monotonic() - began < 15
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.kafka
def test_send_waits_for_the_input_topic_a_starting_worker_creates(
        deployment_factory: Callable[..., Any]) -> None:
    """The README starts the worker in the background and sends at once: send says it
    waits, and sends once the topic exists (created here while it waits, as the worker
    would)."""
    from processor.stream.kafka.kafka_io import create_topics, read_topic

    dep = deployment_factory({"a": 0}, create_topics=False)
    proc = subprocess.Popen([sys.executable, "-m", "processor", "send", "--config",
                             str(dep.config), "--wait", "120"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        assert proc.stderr.readline().startswith("waiting up to 120 s for the input topic")
        create_topics(dep.conf, [dep.settings.topics.input], 1)
        out, err = proc.communicate("a\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and err == "", err
    assert out.startswith("sent 1 event(s)")
    assert sum(len(v) for v in read_topic(dep.conf, dep.settings.topics.input).values()) == 1
