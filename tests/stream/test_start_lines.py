"""What the worker says at the default log level: the start checks' line (the seconds of
each step), the bulk load's line (records read, seconds), a start line (app, brokers,
parameters, state directory) once every start check passed and, once /readyz would
pass, a ready line naming the public topics; all carry only public values. Brokers that
do not answer are one `error:` line and nothing else, exit 2, within BROKER_PROBE_S (5 s)
of the probe."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from processor.devtools.deployment import WorkerProcess


def _wait_for(worker: WorkerProcess, text: str, timeout_s: float = 90) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        log = worker.log_path.read_text(errors="replace")
        if text in log:
            return log
        assert worker.alive(), log
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} in:\n{worker.log_path.read_text(errors='replace')}")


@pytest.mark.kafka
def test_start_and_ready_lines_at_the_default_level(
        deployment_factory: Callable[..., Any]) -> None:
    tick = 200
    start = (int(time.time() * 1000) // tick) * tick
    dep = deployment_factory({"secret-counter-name": start}, tick_ms=tick, lateness_ms=200)
    worker = dep.worker
    assert worker.loglevel == "warning"
    worker.start()
    log = _wait_for(worker, "worker ready:")
    assert worker.stop() == 0
    lines = log.splitlines()
    started = next(line for line in lines if "worker starting:" in line)
    ready = next(line for line in lines if "worker ready:" in line)
    # The bulk load runs before the start line: it is part of the start, and a database
    # it cannot write is the start's one error line (docs/state.md, "Restore").
    loaded = next(line for line in lines if "bulk load:" in line)
    checks = next(line for line in lines if "start checks:" in line)
    assert " INFO " in started and " INFO " in ready and " INFO " in loaded
    assert lines.index(checks) < lines.index(loaded) < lines.index(started) < lines.index(ready)
    # Each step of the start before the bulk load, with its seconds.
    for step in ("process start to main", "configuration", "topics", "ledger"):
        assert re.search(rf"[ :,]{step} \d+\.\d\d s", checks), (step, checks)
    s = dep.settings
    for public in (repr(s.app_id), s.bootstrap_servers, "1 counter(s)", s.mechanism,
                   f"ticks of {tick} ms", s.state_dir):
        assert public in started, (public, started)
    assert repr(s.topics.counts) in ready and repr(s.topics.ledger) in ready
    assert "secret-counter-name" not in checks + loaded + started + ready  # never named


@pytest.mark.kafka
def test_no_broker_is_one_line_within_seconds(deployment_factory: Callable[..., Any]) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dep = deployment_factory({"a": 0}, create_topics=False)
    config = dep.directory / "nobroker.toml"
    config.write_text(dep.config.read_text().replace(dep.settings.bootstrap_servers,
                                                     f"127.0.0.1:{port}"))
    cmd = [sys.executable, "-m", "processor", "worker", "--config", str(config)]
    began = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - began
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert f"127.0.0.1:{port}" in errors[0] and "Traceback" not in done.stderr
    assert took < 5 + 5, took  # the probe's 5 s and the start (imports, settings)
    # The start line comes after every start check: a refused start prints only its error.
    assert done.stderr.splitlines() == errors
