"""A counter's creation is published at most once for the deployment's whole life
(docs/state.md, "A creation is published at most once").

The worker learns what the ledger announced at its start and at each assignment; a
creation that lands on the ledger after its last read (another worker's, a zombie's)
would not be known when its own marker creates the counter. So the worker reads the
ledger on once more right before it publishes a batch that creates counters, and refuses
(exit 2, nothing of the batch published) when the ledger announced one of them under
another creation.

With a broker: a worker runs a counter that starts later; a creation of that counter
under another tag lands on the ledger after the worker's reads; when the worker's marker
reaches the counter's start, the worker refuses instead of publishing a second creation.
Control: the same counter without a foreign entry is created once, and the worker keeps
running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from processor.stream.kafka import kafka_io
from processor.stream.model.identity import creation_tag, key_fingerprint, noise_identity
from processor.stream.model.records import LedgerEntry
from tests.stream.refusals import one_error_line, public_records

TICK = 100
SETTINGS: dict[str, Any] = dict(partitions=1, tick_ms=TICK, lateness_ms=300,
                                max_future_ms=60_000, heartbeat_ticks=10,
                                heartbeat_spread=False, epsilon=1.0, delta=1e-6)


def _created(dep: Any, counter: str) -> list[str]:
    """The creation tags of `counter`'s "created" entries on the ledger, in log order."""
    tags = []
    for value in public_records(dep)[0]:
        d = orjson.loads(value or b"{}")
        if d.get("counter") == counter and d.get("entry") == "created":
            tags.append(str(d.get("creation")))
    return tags


def _running_with_late_counter(deployment_factory: Callable[..., Any], name: str,
                               lead_s: float) -> tuple[Any, int]:
    """A deployment of counter `a` (started) and `late` (starting `lead_s` from now), its
    worker running and past its first assignment (it published `a`)."""
    now = int(time.time() * 1000)
    start = now // TICK * TICK - 20 * TICK
    late = (now + int(lead_s * 1000)) // TICK * TICK
    dep = deployment_factory({"a": start, "late": late}, name=name, **SETTINGS)
    dep.worker.start()
    dep.wait_releases(lambda rs: any(r["counter"] == "a" for r in rs), timeout_s=90)
    assert _created(dep, "late") == []
    return dep, late


@pytest.mark.kafka
def test_a_creation_on_the_ledger_after_the_workers_reads_is_refused(
        deployment_factory: Callable[..., Any]) -> None:
    dep, late = _running_with_late_counter(deployment_factory, "once", 25.0)
    s = dep.settings
    # Another creation of `late`: what a worker that created it from another partition
    # state would have written (another marker and frontier, so another tag).
    tag = creation_tag(noise_identity(s, dep.key), "late", late // TICK + 7, late // TICK + 3)
    entry = LedgerEntry(counter="late", mechanism=s.mechanism, epsilon=s.epsilon,
                        delta=s.delta, tick_ms=TICK, start_ms=late, fingerprint=s.fingerprint(),
                        key_id=key_fingerprint(dep.key), creation=tag)
    kafka_io.produce_all(dep.conf, dep.topics.ledger,
                         [(entry.key(), entry.to_json())])
    assert _created(dep, "late") == [tag]
    before = public_records(dep)

    # Until the worker stopped, or published a creation of its own (the failure).
    deadline = time.monotonic() + 90.0
    while dep.worker.alive() and len(_created(dep, "late")) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _created(dep, "late") == [tag], "a second creation was published"
    code, log = dep.worker.wait_exit(timeout_s=30, tail=80)
    assert code == 2, log
    assert "already announced on the ledger topic" in one_error_line(log), log
    assert "counter 'late'" in log, log
    assert _created(dep, "late") == [tag]  # published once: the foreign creation only
    assert public_records(dep)[0] == before[0]


@pytest.mark.kafka
def test_control_a_counter_nobody_created_is_created_once(
        deployment_factory: Callable[..., Any]) -> None:
    dep, _late = _running_with_late_counter(deployment_factory, "once-ctl", 8.0)
    dep.wait_releases(lambda rs: any(r["counter"] == "late" for r in rs), timeout_s=90)
    assert dep.worker.alive(), dep.worker.log_tail()
    assert dep.worker.stop() == 0, dep.worker.log_tail()
    tags = _created(dep, "late")
    assert len(tags) == 1, tags
