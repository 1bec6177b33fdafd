"""Open families end to end on a real broker: the worker (a child process, as deployed)
counts an open family's keys, publishes a heavy key from its admission on with its whole
count, never a key with few events, and stays identical to the pure recomputation
(replay) across a kill -9 and a restart. Waits have deadlines; no synchronising sleep."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

import orjson
import pytest

from processor.core import registry
from processor.core.ecc import ECC, SimECC
from processor.core.selection import OpenKey
from processor.stream.kafka import kafka_io
from processor.stream.model.families import OpenFamily, key_counter
from processor.stream.model.identity import counter_id, noise_identity
from tests.stream.test_app_e2e import (
    Live,
    implied_ticks,
    live_factory,  # noqa: F401  (the fixture, re-exported for this module)
    now_ms,
)

HEAVY = key_counter("pages", "heavy")


def _send_heavy(live: Live, stop: threading.Event, sent: list[int], per_unit: bool) -> None:
    """One event of the heavy key per tick (100 ms), stamped with the wall clock; with
    per_unit each from a unit of its own."""
    producer = kafka_io.make_producer(live.conf)
    while not stop.is_set():
        event: dict[str, object] = {"counter": "pages", "key": "heavy", "ts": now_ms()}
        if per_unit:
            event["user"] = f"h{sent[0]}"
        producer.produce(live.topics.input, value=orjson.dumps(event))
        sent[0] += 1
        producer.poll(0)
        stop.wait(0.1)  # the sending rate, not a synchronisation wait
    assert producer.flush(30) == 0


def heavy_across_a_kill(live: Live, *, per_unit: bool, admit_timeout_s: float) -> int:
    """Send the heavy key's events, kill -9 the worker before the key can be admitted
    (its count is below the gate's threshold for its first ~10 s), restart it, wait for
    the key's first release and 20 more declared ticks, stop the worker cleanly; the
    number of heavy events sent."""
    stop = threading.Event()
    sent = [0]
    producer = threading.Thread(target=_send_heavy, args=(live, stop, sent, per_unit),
                                daemon=True)
    producer.start()
    try:
        live.wait_releases(lambda rs: any(r["counter"] == "declared" and r["tick"] > 40
                                          for r in rs), timeout_s=60)
        live.worker.kill()
        live.worker.start()
        live.wait_releases(lambda rs: any(r["counter"] == HEAVY for r in rs),
                           timeout_s=admit_timeout_s)
    finally:
        stop.set()
        producer.join(timeout=60)
    last = max(r["tick"] for r in live.releases() if r["counter"] == "declared")
    live.wait_releases(lambda rs: any(r["counter"] == "declared" and r["tick"] > last + 20
                                      for r in rs), timeout_s=60)
    assert live.worker.stop() == 0, live.worker.log_tail()
    return sent[0]


@pytest.mark.kafka
def test_open_keys_end_to_end_across_a_kill(live_factory: Callable[..., Live]) -> None:  # noqa: F811
    tick = 100
    start = (now_ms() // tick) * tick
    live = live_factory({"declared": start}, name="openkeys", mechanism="simecc",
                        epsilon=200.0, families={"pages": OpenFamily(start, 1e-7)})
    live.worker.start()
    live.wait_releases(lambda rs: len(rs) > 0, timeout_s=90)
    live.produce([orjson.dumps({"counter": "pages", "key": "light", "ts": now_ms()}),
                  orjson.dumps({"counter": "pages", "key": "light", "ts": now_ms()}),
                  orjson.dumps({"counter": "pages", "key": "one", "ts": now_ms()}),
                  orjson.dumps({"counter": "pages", "key": "x" * 200, "ts": now_ms()}),
                  orjson.dumps({"counter": "pages", "ts": now_ms()})])
    sent = heavy_across_a_kill(live, per_unit=False, admit_timeout_s=180)

    # The bad key and the missing key went to the dead letters, with their reasons.
    dead = [orjson.loads(r.value or b"") for r in
            kafka_io.iter_topic(live.conf, live.topics.deadletter)]
    assert sorted(d["reason"] for d in dead) == ["invalid_key", "key_missing"]
    # Only the declared counter and the heavy key were published, and announced.
    releases = live.releases()
    assert {r["counter"] for r in releases} == {"declared", HEAVY}
    ledger = [orjson.loads(r.value or b"") for r in
              kafka_io.iter_topic(live.conf, live.topics.ledger)]
    assert {e["counter"] for e in ledger} == {"declared", HEAVY}

    # Independently of the operator: the key's implied input from the timeline, its
    # counter as if declared at the family's start, the core gate: the first published
    # record is the admission, with the whole count.
    s = live.settings
    timeline = kafka_io.read_topic(live.conf, live.topics.timeline)
    as_declared = dataclasses.replace(s, counters={
        "declared": start, **{key_counter("pages", k): start for k in ("heavy", "light", "one")}})
    implied = implied_ticks(as_declared, timeline)
    # The light keys' events did reach the operator (the check above is not vacuous).
    assert [sum(x is not None for x in implied[key_counter("pages", k)])
            for k in ("light", "one")] == [2, 1]
    xs = implied[HEAVY]
    c = registry.make(s.mechanism, s.epsilon, s.delta, live.key,
                      counter_id(noise_identity(s, live.key), HEAVY))
    assert isinstance(c, ECC | SimECC)
    first = next(t for t, x in enumerate(xs, start=1) if x is not None)
    gate = OpenKey.first_seen(c, s.families["pages"].delta0(s.epsilon), first)
    admitted = next(rec for x in xs[first - 1:] for rec in gate.update(x))
    mine = sorted((r for r in releases if r["counter"] == HEAVY), key=lambda r: r["tick"])
    assert (mine[0]["tick"], mine[0]["value"], mine[0]["kind"]) == (*admitted, "change")
    (entry,) = [e for e in ledger if e["counter"] == HEAVY]
    assert entry["since_tick"] == admitted[0] and entry["start_ms"] == start
    # Its whole count: the events before its admission tick are in its first release.
    assert admitted[1] > 50

    # Identical to the pure recomputation, kill -9 included (replay).
    from processor.stream.replay import replay

    report = replay(s, live.key)
    assert report.identical, report.summary()
    print(f"open keys e2e: {sent} heavy events, admitted at tick {admitted[0]} "
          f"with {admitted[1]}, {live.worker.starts} starts")
