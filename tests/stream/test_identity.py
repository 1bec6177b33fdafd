"""Noise identity: what a counter's noise is keyed by, and the refusal to
publish a second value for a published (counter, tick).

Without a broker: two deployments sharing a key (another app id, other topics) draw
different noise on the same data; a changed configuration draws different noise; the
identity and the ledger carry a public key fingerprint, never key bytes.
With a broker: a worker runs, stops, loses its state (local state dir AND the changelog
topic); the restart is refused (exit 2, the error names the counter and the remedy) and
nothing is republished.
"""

from __future__ import annotations

import hashlib
import hmac
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from processor.core.grid import UNIT
from processor.core.rng import NoiseKey
from processor.stream.kafka import kafka_io
from processor.stream.model.config import Settings, TopicSettings, with_overrides
from processor.stream.model.identity import counter_id, key_fingerprint, noise_identity
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import Output
from processor.stream.model.records import Event, Release, encode_batch, encode_marker
from processor.stream.model.state import DictStore
from tests.stream.helpers import apply_now
from tests.stream.refusals import public_records

TICK = 1000
SECRET = hashlib.sha256(b"identity test key (public, tests only)").digest()
KEY = NoiseKey(SECRET)


def base(**kw: Any) -> Settings:
    # eps = 500: ECC releases non-zero values within 100 ticks, so noise is visible.
    fields: dict[str, Any] = dict(counters={"a": 0}, tick_ms=TICK, heartbeat_ticks=1,
                                  heartbeat_spread=False, mechanism="ecc", epsilon=500.0,
                                  delta=1e-6, partitions=1)
    fields.update(kw)
    return with_overrides(Settings(), **fields)


def run(s: Settings, key: NoiseKey = KEY, ticks: int = 100) -> list[Release]:
    """The real ECC through the operator: one event per tick for `ticks` ticks, a marker
    per tick, a release at every tick (heartbeat_ticks=1)."""
    op = Operator(s, key)
    store = DictStore()
    out = Output()
    for off, n in enumerate(range(ticks)):
        apply_now(op, store, 0, 2 * off, encode_batch([Event("a", n * TICK, UNIT, 0, off)]), out)
        apply_now(op, store, 0, 2 * off + 1, encode_marker(n), out)
    return [r for r in out.decoded_releases() if r.counter == "a"]


def values(releases: list[Release]) -> list[float]:
    return [r.value for r in releases]


def test_two_deployments_sharing_a_key_draw_different_noise() -> None:
    """Same key, same configuration, same data: another app id, or another topic, keys
    other noise (before: identical noise on whatever data each deployment counted)."""
    s = base()
    mine = run(s)
    assert len(mine) == 100 and values(mine) == values(run(base()))  # deterministic
    assert len(set(values(mine))) > 2
    for other in (base(app_id="another-deployment"),
                  base(topics=replace(s.topics, counts="other-counts")),
                  base(topics=replace(s.topics, input="other-input"))):
        assert noise_identity(other, KEY) != noise_identity(s, KEY)
        theirs = run(other)
        assert [r.tick for r in theirs] == [r.tick for r in mine]
        assert values(theirs) != values(mine)
    # Another key: another identity (and other noise), whatever the settings.
    other_key = NoiseKey(hashlib.sha256(b"another key").digest())
    assert noise_identity(s, other_key) != noise_identity(s, KEY)
    assert values(run(s, other_key)) != values(mine)


def test_a_changed_configuration_draws_different_noise() -> None:
    """A counter declared in addition (the fingerprint changes, a's parameters do not):
    a's noise is unrelated to before. Settings that do not define the computation (where
    the brokers are, where state lives) leave the identity as it is: every worker and
    replay of one deployment must draw the same noise."""
    s = base()
    changed = base(counters={"a": 0, "b": 0})
    assert changed.fingerprint() != s.fingerprint()
    assert noise_identity(changed, KEY) != noise_identity(s, KEY)
    assert values(run(changed)) != values(run(s))
    for same in (base(bootstrap_servers="kafka-0:9092,kafka-1:9092"),
                 base(state_dir="/elsewhere")):
        assert noise_identity(same, KEY) == noise_identity(s, KEY)


def test_the_identity_never_contains_key_bytes() -> None:
    """The key id is HMAC-SHA256(key, "fingerprint") truncated: public, not the key; the
    identity, the counter id and the ledger entry contain no key bytes in any encoding."""
    s = base()
    kid = key_fingerprint(KEY)
    assert kid == hmac.new(SECRET, b"fingerprint", hashlib.sha256).hexdigest()[:16]
    ident = noise_identity(s, KEY)
    cid = counter_id(noise_identity(s, KEY), "a")
    assert cid == f"{ident}/a" and len(ident) == 32
    op = Operator(s, KEY)
    out = apply_now(op, DictStore(), 0, 0, encode_marker(3))
    assert [e.key_id for e in out.ledger] == [kid]
    public = [ident, cid, kid, *(e.to_json().decode() for e in out.ledger),
              *(r.to_json().decode() for r in out.releases)]
    for text in public:
        for chunk in (SECRET[i:i + 8] for i in range(0, len(SECRET), 8)):
            assert chunk.hex() not in text.lower() and chunk not in text.encode("latin-1")


# --------------------------------------------------------------------------- the broker

E2E = dict(partitions=2, tick_ms=100, lateness_ms=300, max_future_ms=10_000,
           heartbeat_ticks=10, heartbeat_spread=False, epsilon=1.0, delta=1e-6)


def _delete_topic(conf: dict[str, str], topic: str, timeout_s: float = 60.0) -> None:
    """Delete `topic` and wait until the cluster no longer lists it."""
    admin = kafka_io.make_admin(conf)
    for fut in admin.delete_topics([topic], operation_timeout=30).values():
        fut.result()
    deadline = time.monotonic() + timeout_s
    while topic in admin.list_topics(timeout=10).topics:
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic!r} still listed after deletion")
        time.sleep(0.2)


@pytest.mark.kafka
def test_restart_after_loss_of_state_is_refused_and_nothing_is_republished(
        deployment_factory: Callable[..., Any]) -> None:
    """Run a worker, stop it cleanly, delete its state dir and its state changelog topic
    (a new, empty state table), restart: the worker reads the ledger, and the first marker
    that would re-create an announced counter stops it with exit code 2 and an error naming
    the counter and the remedy; the private-count and ledger topics are unchanged.
    Control: the same restart WITH its state keeps running and publishing."""
    from processor.stream.kafka.topics import changelog_topic

    tick = E2E["tick_ms"]
    start = (int(time.time() * 1000) // tick) * tick - 20 * tick
    dep = deployment_factory({"a": start, "b": start}, name="ident", **E2E)
    dep.worker.start()
    dep.produce([orjson.dumps({"counter": "a", "ts": int(time.time() * 1000) + 300})
                 for _ in range(5)])
    dep.wait_releases(lambda rs: {r["counter"] for r in rs if r["tick"] >= 30} == {"a", "b"},
                      timeout_s=90)
    assert dep.worker.stop() == 0, dep.worker.log_tail()

    # Control: a restart with its state continues (no refusal), then stops cleanly.
    before_control = len(dep.releases())
    dep.worker.start()
    dep.wait_releases(lambda rs: len(rs) > before_control + 4, timeout_s=90)
    assert dep.worker.stop() == 0, dep.worker.log_tail()

    ledger, counts = public_records(dep)
    assert sorted(orjson.loads(v or b"")["counter"] for v in ledger) == ["a", "b"]

    shutil.rmtree(Path(dep.settings.state_dir))
    _delete_topic(dep.conf, changelog_topic(dep.settings))
    dep.worker.start()
    code, log = dep.worker.wait_exit(tail=80)
    assert code == 2, log
    assert "already announced on the ledger topic" in log, log
    # Where it struck, for finding out why: the record and the restore's position.
    assert "refused at " in log and "has applied changelog" in log, log
    assert ("counter 'a'" in log or "counter 'b'" in log) and "new app_id" in log, log
    assert "Traceback" not in log, log
    assert public_records(dep) == (ledger, counts)


def test_topic_settings_are_all_part_of_the_identity() -> None:
    """Each of the five topic names is part of the deployment's identity."""
    s = base()
    seen = {noise_identity(s, KEY)}
    for f in ("input", "timeline", "counts", "ledger", "deadletter"):
        topics: TopicSettings = replace(s.topics, **{f: f"x-{f}"})
        seen.add(noise_identity(base(topics=topics), KEY))
    assert len(seen) == 6


@pytest.mark.kafka
def test_crash_after_the_creating_markers_acks_is_re_executed_not_refused(
        deployment_factory: Callable[..., Any]) -> None:
    """The worker SIGKILLs itself once the FIRST batch (the marker that creates a and b and
    publishes their ledger entries) is acknowledged, before any state write. The restart
    reads those entries from the ledger and re-executes that very marker: the same
    creation, so it is not refused; it keeps publishing, every ledger entry of a counter is
    the same record, and replay finds the published stream identical."""
    from processor.stream.replay import replay

    tick = E2E["tick_ms"]
    start = (int(time.time() * 1000) // tick) * tick - 20 * tick
    dep = deployment_factory({"a": start, "b": start}, name="ident-crash",
                             **{**E2E, "partitions": 1})
    dep.worker.env["DPC_TEST_CRASH_AT"] = "after_acks:1"
    dep.worker.start()
    code, log = dep.worker.wait_exit()
    assert code == -9, log
    first = [r.value for r in kafka_io.iter_topic(dep.conf, dep.topics.ledger)]
    assert sorted(orjson.loads(v or b"")["counter"] for v in first) == ["a", "b"]
    # The first batch caught up through the ticks since the start: wait past those.
    later = max(r["tick"] for r in dep.releases()) + 20
    del dep.worker.env["DPC_TEST_CRASH_AT"]
    dep.worker.start()
    dep.wait_releases(lambda rs: {r["counter"] for r in rs if r["tick"] >= later}
                      == {"a", "b"}, timeout_s=90)
    assert dep.worker.alive(), dep.worker.log_tail()
    assert dep.worker.stop() == 0, dep.worker.log_tail()
    ledger = [r.value for r in kafka_io.iter_topic(dep.conf, dep.topics.ledger)]
    assert set(ledger) == set(first) and len(ledger) == 4  # re-sent, identical
    report = replay(dep.settings, dep.key)
    assert report.identical, report.summary()


@pytest.mark.kafka
def test_restart_within_the_creating_tick_does_not_meet_its_marker_again(
        deployment_factory: Callable[..., Any]) -> None:
    """Long ticks: the first marker creates a and b; the worker stops, loses its state and
    restarts within the same tick. A restarted leader reads the timeline's last marker and
    never appends a second marker through that tick (which would re-create the counters
    under the same creation tag and republish their ticks); at the next tick the
    re-creation is refused (exit 2), and nothing was republished."""
    from processor.stream.kafka.topics import changelog_topic
    from processor.stream.model.records import TimelineMarker, decode_timeline, sealed_through

    tick = 40_000
    now = int(time.time() * 1000)
    # Lateness chosen so that the sealed tick advances 39 s from now: the first start, the
    # stop and the restart all fall before that.
    lateness = (now % tick) - 1000 if now % tick >= 1000 else now % tick + tick - 1000
    start = (now // tick) * tick - 3 * tick
    dep = deployment_factory({"a": start, "b": start}, name="ident-tick",
                             **{**E2E, "partitions": 1, "tick_ms": tick,
                                "lateness_ms": lateness, "heartbeat_ticks": 1})
    first_n = sealed_through(now, dep.settings)
    dep.worker.start()
    dep.wait_releases(lambda rs: {r["counter"] for r in rs} == {"a", "b"}, timeout_s=60)
    assert dep.worker.stop() == 0, dep.worker.log_tail()
    ledger, counts = public_records(dep)
    shutil.rmtree(Path(dep.settings.state_dir))
    _delete_topic(dep.conf, changelog_topic(dep.settings))
    dep.worker.start()
    restarted_at = int(time.time() * 1000)
    code, log = dep.worker.wait_exit(tail=80)
    assert sealed_through(restarted_at, dep.settings) == first_n, "restart too slow: " \
        "not within the creating tick, so this run shows nothing"
    assert code == 2 and "already announced on the ledger topic" in log, log
    assert public_records(dep) == (ledger, counts)
    records = [decode_timeline(r.value or b"")
               for r in kafka_io.iter_topic(dep.conf, dep.topics.timeline)]
    marks = [m.sealed_through for m in records if isinstance(m, TimelineMarker)]
    assert marks == sorted(set(marks)) and marks[0] == first_n, marks
