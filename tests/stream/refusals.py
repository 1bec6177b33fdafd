"""Test helpers for a worker that must refuse to go on: one `error:` line, exit 2, no
traceback, and nothing new on the public topics."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from processor.stream.kafka import kafka_io


def one_error_line(log: str) -> str:
    """The log's one `error:` line (the log holds exactly one, and no traceback)."""
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, log
    assert "Traceback" not in log, log
    return errors[0]


def refused(worker: Any, **wait: Any) -> tuple[str, str]:
    """Wait for a started `worker` to exit; it must exit 2 with one `error:` line and no
    traceback. (That line, the log.)"""
    code, log = worker.wait_exit(**wait)
    assert code == 2, log
    return one_error_line(log), log


def public_records(dep: Any) -> tuple[list[bytes | None], list[bytes | None]]:
    """The values on the deployment's ledger and private-count topics, in log order."""
    return ([r.value for r in kafka_io.iter_topic(dep.conf, dep.topics.ledger)],
            [r.value for r in kafka_io.iter_topic(dep.conf, dep.topics.counts)])


def ran_and_stopped(deployment_factory: Callable[..., Any], name: str) -> Any:
    """A deployment of counter `a` (epsilon 500, 200 ms ticks) whose worker published two
    releases and stopped cleanly: the state a refused restart is tried on."""
    tick = 200
    start = (int(time.time() * 1000) // tick) * tick
    dep = deployment_factory({"a": start}, name=name, partitions=1, tick_ms=tick,
                             lateness_ms=200, heartbeat_ticks=5, epsilon=500.0)
    dep.worker.start()
    dep.wait_releases(lambda rs: len(rs) >= 2, timeout_s=120)
    assert dep.worker.stop() == 0, dep.worker.log_tail()
    return dep
