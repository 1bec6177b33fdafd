"""The bounding stage on the real broker (privacy_unit = "user", docs/privacy-unit.md):
bounds enforced with the bound exactly reached, across a SIGKILL inside the stage's
checkpoint (after its forwards were acknowledged and before its state write; between two
state writes), and across a rebalance of the units topic between two workers.

Each test checks, from the topics alone: every input event is either kept (on the
timeline, deduplicated as the operator's filter does) or dead-lettered, never both, never
neither; no unit has more than k kept events in a counter nor more than m counters; the
kept set equals the one recomputed from the units topic and the key
(bounding.kept_inputs, what replay does); no raw unit id appears in the units topic or the
stage's changelog. Deterministic checks (no sampling).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from processor.core.unit import derive
from processor.stream.kafka import kafka_io
from processor.stream.kafka.topics import units_changelog_topic, units_topic
from processor.stream.model.bounding import SEQ_BITS, UNITS_SOURCE, decode_units, kept_inputs
from processor.stream.model.config import Settings
from processor.stream.model.records import TimelineBatch, TimelineFormatError, decode_timeline
from processor.stream.replay import replay
from tests.stream.test_app_e2e import (
    Live,
    live_factory,  # noqa: F401  (fixture)
    now_ms,
)
from tests.stream.test_metrics import free_port, get, parsed, value, wait_until

K, M = 2, 2
COUNTERS = ("a", "b", "c")
UNIT_TARGET = dict(privacy_unit="user", unit_epsilon=400.0, unit_delta=1e-6,
                   max_events_per_counter=K, max_counters_per_unit=M)


def _user_live(factory: Callable[..., Live], name: str, **overrides: Any) -> Live:
    tick = 100
    start = (now_ms() // tick) * tick
    d = Settings()
    p = derive(400.0, 1e-6, K, M, mechanism=d.mechanism, calibration=d.calibration)
    return factory(dict.fromkeys(COUNTERS, start), name=name, lateness_ms=300,
                   **{**UNIT_TARGET, "epsilon": p.event_epsilon, "delta": p.event_delta},
                   **overrides)


def _events(seed: int, n: int) -> list[bytes]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        out.append(orjson.dumps({"counter": rng.choice(COUNTERS), "ts": now_ms(),
                                 "user": f"person-{rng.randrange(15)}"}))
    return out


class Snapshot:
    """What the topics say: input events, kept input coordinates, dead letters."""

    def __init__(self, live: Live) -> None:
        conf, s = live.conf, live.settings
        self.inputs: dict[tuple[int, int], dict[str, object]] = {}
        for r in kafka_io.iter_topic(conf, s.topics.input):
            self.inputs[(r.partition, r.offset)] = orjson.loads(r.value or b"{}")
        # The timeline before the units topic: a forwarded event's units record was
        # written before it, so it is in the later read (no race with a running stage).
        timeline = list(kafka_io.iter_topic(conf, s.topics.timeline))
        dead = list(kafka_io.iter_topic(conf, s.topics.deadletter))
        self.units_log = [(r.partition, r.offset, r.value or b"")
                          for r in kafka_io.iter_topic(conf, units_topic(s))]
        seq_to_input: dict[tuple[int, int], tuple[int, int]] = {}
        for p, off, raw in self.units_log:
            for i, row in enumerate(decode_units(raw)[1]):
                seq_to_input[(p, off << SEQ_BITS | i)] = (row[4], row[5])
        hw: dict[tuple[int, int], int] = {}
        self.kept: list[tuple[int, int]] = []
        for r in timeline:
            try:
                rec = decode_timeline(r.value or b"")
            except TimelineFormatError:
                continue  # the clock probe
            if not isinstance(rec, TimelineBatch) or rec.source != UNITS_SOURCE:
                continue
            for ev in rec.events:
                label = (r.partition, ev.src_partition)
                if ev.src_offset <= hw.get(label, -1):
                    continue  # a re-sent copy: the operator's filter drops it
                hw[label] = ev.src_offset
                key = (ev.src_partition, ev.src_offset)
                assert key in seq_to_input, (key, [(p, o, len(decode_units(raw)[1]))
                                                   for p, o, raw in self.units_log])
                self.kept.append(seq_to_input[key])
        self.dead: dict[tuple[int, int], str] = {}
        for r in dead:
            d = orjson.loads(r.value or b"{}")
            self.dead[(d["partition"], d["offset"])] = d["reason"]
        self.raw_units = {str(v.get("user")) for v in self.inputs.values()}
        self.changelog = [r.value or b"" for r in
                          kafka_io.iter_topic(conf, units_changelog_topic(s))]

    def complete(self) -> bool:
        return len(set(self.kept)) + len(self.dead) >= len(self.inputs)

    def check(self, live: Live) -> None:
        kept = set(self.kept)
        assert len(kept) == len(self.kept), "an input event forwarded twice"
        assert not kept & set(self.dead), "an event both kept and dead-lettered"
        assert kept | set(self.dead) == set(self.inputs), "an event lost"
        per: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for coord in kept:
            ev = self.inputs[coord]
            per[str(ev["user"])][str(ev["counter"])] += 1
        for counters in per.values():
            assert len(counters) <= M and max(counters.values()) <= K
        assert kept == kept_inputs(live.settings, self.units_log)
        # Replay (python -m processor replay): the kept set and the counts recompute.
        report = replay(live.settings, live.key, timeout_s=60, jobs=1)
        assert report.identical, report.summary()
        blob = b"".join(raw for _, _, raw in self.units_log) + b"".join(self.changelog)
        assert not any(u.encode() in blob for u in self.raw_units if u != "None")


def _wait_complete(live: Live, timeout_s: float = 90.0) -> Snapshot:
    deadline = time.monotonic() + timeout_s
    while True:
        snap = Snapshot(live)
        if snap.complete() or time.monotonic() > deadline:
            assert snap.complete(), live.worker.log_tail()
            return snap
        time.sleep(0.5)


@pytest.mark.kafka
def test_bounds_exactly_reached_on_the_broker(
        live_factory: Callable[..., Live]) -> None:  # noqa: F811
    """alice: exactly k in a and k in b (m counters, k each: all kept), then one more in
    a and one in c (both over: dead-lettered); bob: k + 1 in c; an event without a unit
    (unit_missing). One input partition, so the input order is the log order."""
    port = free_port()
    live = _user_live(live_factory, "ub-exact", metrics_port=port)
    ev = [("alice", "a"), ("alice", "a"), ("alice", "b"), ("alice", "b"), ("alice", "a"),
          ("alice", "c"), ("bob", "c"), ("bob", "c"), ("bob", "c")]
    values = [orjson.dumps({"counter": c, "ts": now_ms(), "user": u}) for u, c in ev]
    values.append(orjson.dumps({"counter": "a", "ts": now_ms()}))
    kafka_io.produce_all(live.conf, live.topics.input, ((b"one-key", v) for v in values))
    live.worker.start()
    snap = _wait_complete(live)
    snap.check(live)
    reasons = sorted(snap.dead.values())
    assert reasons == ["contribution_bound_exceeded"] * 3 + ["unit_missing"]
    offsets = sorted(o for _, o in snap.kept)
    assert offsets == [0, 1, 2, 3, 6, 7]
    # /metrics exports the stage's counts under their own names: the dead letters by
    # reason beside the ingest stage's, the kept events and the checkpoints.
    base = f"http://127.0.0.1:{port}/metrics"

    def stage_counts() -> dict[str, float]:
        m = parsed(get(base)[1])
        return {"bound": value(m, "dpc_dead_letters", reason="contribution_bound_exceeded"),
                "missing": value(m, "dpc_dead_letters", reason="unit_missing"),
                "kept": value(m, "dpc_unit_events_kept"),
                "records": value(m, "dpc_unit_records"),
                "malformed": value(m, "dpc_unit_records_malformed"),
                "checkpoints": value(m, "dpc_unit_checkpoints")}

    wait_until("the bounding stage's counts on /metrics",
               lambda: stage_counts()["checkpoints"] >= 1, 60, live)
    counts = stage_counts()
    assert (counts["bound"], counts["missing"], counts["kept"]) == (3, 1, 6), counts
    assert counts["records"] >= 1 and counts["malformed"] == 0, counts
    # The ledger carries the unit, both bounds and both guarantees.
    ledger = [orjson.loads(r.value or b"{}")
              for r in kafka_io.iter_topic(live.conf, live.topics.ledger)]
    live.wait_releases(lambda rs: len(rs) > 0)
    ledger = ledger or [orjson.loads(r.value or b"{}")
                        for r in kafka_io.iter_topic(live.conf, live.topics.ledger)]
    assert ledger and all(e["schema_version"] == 2 and e["privacy_unit"] == "user"
                          and e["contribution_bound"] == K
                          and e["max_counters_per_unit"] == M
                          and e["unit_epsilon"] == 400.0 for e in ledger)


def _waves(live: Live, seed: int, waves: int, per_wave: int, pause_s: float) -> int:
    sent = 0
    for w in range(waves):
        sent += live.produce(_events(seed * 100 + w, per_wave))
        time.sleep(pause_s)
    return sent


@pytest.mark.kafka
@pytest.mark.parametrize("point", ["unit_after_forward", "unit_between_state_writes"])
def test_bounds_hold_across_a_kill_in_the_stage_checkpoint(
        live_factory: Callable[..., Live], point: str) -> None:  # noqa: F811
    """SIGKILL at the 2nd passage of the crash point (forwards acknowledged, state not yet
    written / half of it written), restart at once: the checks of Snapshot.check."""
    live = _user_live(live_factory, f"ub-{point[5:12]}")
    live.worker.env["DPC_TEST_CRASH_AT"] = f"{point}:2"
    live.worker.start()
    # Waves until the kill: the 2nd passage needs input after the stage's 1st checkpoint,
    # however long the worker takes to start and join (a loaded machine).
    deadline = time.monotonic() + 90
    wave = 0
    while live.worker.alive() and time.monotonic() < deadline:
        live.produce(_events(700 + wave, 40))
        wave += 1
        time.sleep(0.7)  # the pace of input, not a synchronisation
    code, log = live.worker.wait_exit(timeout_s=60, tail=300)
    assert code == -9 and f"test crash point {point} reached" in log, log
    del live.worker.env["DPC_TEST_CRASH_AT"]
    live.worker.start()
    _waves(live, 8, waves=2, per_wave=40, pause_s=0.2)
    _wait_complete(live).check(live)


@pytest.mark.kafka
def test_bounds_hold_across_a_rebalance_of_the_unit_stage(
        live_factory: Callable[..., Live]) -> None:  # noqa: F811
    """Worker 1 alone, then worker 2 joins (the units partitions are split), then worker 1
    stops (all move to worker 2), events flowing throughout."""
    live = _user_live(live_factory, "ub-rebal")
    second = live.add_worker("w2")
    live.worker.start()
    _waves(live, 11, waves=4, per_wave=40, pause_s=0.5)
    # Worker 1 running (it published) before the group changes: a worker stopped while
    # still starting on a loaded machine exits 143 before its own shutdown runs.
    live.wait_releases(lambda rs: len(rs) > 0, timeout_s=120)
    second.start()
    _waves(live, 12, waves=6, per_wave=40, pause_s=0.7)
    assert live.worker.stop() == 0
    _waves(live, 13, waves=4, per_wave=40, pause_s=0.5)
    snap = _wait_complete(live, timeout_s=120)
    snap.check(live)
