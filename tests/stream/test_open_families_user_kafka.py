"""Open families in user mode end to end on a real broker: the worker (a child process,
as deployed) bounds each unit's keys in the bounding stage (k events per key, m counters
per unit, keys included), publishes a heavy key fed by many units from its admission
on, with its whole count and a ledger entry stating the unit's total, never a key with
few events nor one a unit reached beyond its bounds, and stays identical to the pure
recomputation (replay: admissions and the kept set) across a kill -9 and a restart; a
start raising the family's selection_delta is then refused (exit 2, one line).
Waits have deadlines; no synchronising sleep."""

from __future__ import annotations

import base64
import collections
import math
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from processor.core.unit import derive
from processor.stream.kafka import kafka_io
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.families import OpenFamily, key_counter
from processor.stream.worker.app import RUNNING_FLAG, ledger_at_start
from tests.stream.test_app_e2e import (
    Live,
    _worker_start_error,
    live_factory,  # noqa: F401  (the fixture, re-exported for this module)
    now_ms,
)
from tests.stream.test_open_families_kafka import HEAVY, heavy_across_a_kill

K, M = 2, 2
EPS_U, DELTA_U, SEL = 600.0, 1e-6, 1e-7


@pytest.mark.kafka
def test_open_keys_in_user_mode_end_to_end_across_a_kill(
        live_factory: Callable[..., Live], tmp_path: Path) -> None:  # noqa: F811
    tick = 100
    start = (now_ms() // tick) * tick
    d = Settings()
    p = derive(EPS_U, DELTA_U, K, M, mechanism="simecc", calibration=d.calibration)
    live = live_factory({"declared": start}, name="openkeys-user", mechanism="simecc",
                        lateness_ms=300, privacy_unit="user", unit_epsilon=EPS_U,
                        unit_delta=DELTA_U, max_events_per_counter=K,
                        max_counters_per_unit=M, epsilon=p.event_epsilon,
                        delta=p.event_delta, families={"pages": OpenFamily(start, SEL)})
    live.worker.start()

    def ev(key: str | None, user: str, counter: str = "pages") -> bytes:
        obj: dict[str, object] = {"counter": counter, "ts": now_ms(), "user": user}
        if key is not None:
            obj["key"] = key
        return orjson.dumps(obj)

    # "greedy" touches the declared counter and three keys (m = 2: two dead letters);
    # "twice" sends four events to one key (k = 2: two dead letters); a bad key.
    live.produce([ev(None, "greedy", "declared"), ev("g1", "greedy"), ev("g2", "greedy"),
                  ev("g3", "greedy"), *(ev("t", "twice") for _ in range(4)),
                  ev("light", "l1"), ev("light", "l2"), ev("x" * 200, "bad")])
    live.wait_releases(lambda rs: len(rs) > 0, timeout_s=90)
    sent = heavy_across_a_kill(live, per_unit=True, admit_timeout_s=240)

    dead = [orjson.loads(r.value or b"") for r in
            kafka_io.iter_topic(live.conf, live.topics.deadletter)]
    # Distinct input records (a dead letter is sent at least once: a kill before the
    # stage's checkpoint sends it again). Which of greedy's counters are kept depends
    # on the units log's order (the input has several partitions): two of its four
    # events and two of twice's four are dead-lettered.
    distinct = {(x["partition"], x["offset"]): x for x in dead}
    assert sorted(x["reason"] for x in distinct.values()) == (
        ["contribution_bound_exceeded"] * 4 + ["invalid_key"])
    rows = [orjson.loads(base64.b64decode(x["raw"])) for x in distinct.values()
            if x["reason"] == "contribution_bound_exceeded"]
    assert sorted(collections.Counter(r[0] for r in rows).values()) == [2, 2]
    assert [r[1] for r in rows].count(key_counter("pages", "t")) == 2
    releases = live.releases()
    assert {r["counter"] for r in releases} == {"declared", HEAVY}
    values = [orjson.loads(r.value or b"") for r in
              kafka_io.iter_topic(live.conf, live.topics.ledger)]
    # The family's gate record, written once (by the first start, before any key; the
    # restart finds it), then the entries.
    records = [e for e in values if e.get("entry") == "family"]
    assert [(e["family"], e["gate_delta0"]) for e in records] == [
        ("pages", live.settings.gate_delta0("pages"))]
    ledger = [e for e in values if "counter" in e]
    assert len(ledger) + len(records) == len(values)
    assert {e["counter"] for e in ledger} == {"declared", HEAVY}
    (entry,) = [e for e in ledger if e["counter"] == HEAVY]
    mine = sorted((r for r in releases if r["counter"] == HEAVY), key=lambda r: r["tick"])
    assert entry["since_tick"] == mine[0]["tick"] and mine[0]["value"] > 50
    assert (entry["max_counters_per_unit"], entry["contribution_bound"]) == (M, K)
    # The total: the unit's delta plus the gate's term for m keys, at most delta_sel
    # (recomputed here from the configuration's delta0, not through selection.py).
    d0 = live.settings.gate_delta0("pages")
    assert (1 + math.exp(EPS_U)) * M * d0 <= SEL
    assert DELTA_U < entry["unit_delta_total"] <= DELTA_U + SEL * (1 + 1e-9)
    # A declared counter beside the family states the same total.
    assert {e["unit_delta_total"] for e in ledger} == {entry["unit_delta_total"]}

    # Identical to the pure recomputation, kill -9 included: every admission, every
    # release and the kept set (replay).
    from processor.stream.replay import replay

    report = replay(live.settings, live.key)
    assert report.identical, report.summary()

    # A start raising selection_delta would make the written totals false: the worker
    # refuses it before it publishes, one error line, exit 2. Control: a lowered one is
    # accepted and states the recorded delta0 (the start's check on this ledger).
    def family(sel: float) -> Settings:
        return with_overrides(live.settings, families={"pages": OpenFamily(start, sel)},
                              state_dir=str(tmp_path / "state"))

    res = _worker_start_error(family(SEL * 10), tmp_path)
    assert res.returncode == 2, res.stderr
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: families.pages.selection_delta:"), lines
    # The refused start loaded the changelog while the ledger was read (app.run_worker)
    # and left no running flag: a next start keeps what it loaded and loads on.
    state = tmp_path / "state"
    assert list(state.rglob("*.db")), "no database loaded"
    assert not list(state.glob(f"*.{RUNNING_FLAG}")), sorted(state.iterdir())
    published = [r.value for r in kafka_io.iter_topic(live.conf, live.topics.ledger)]
    claim = ledger_at_start(family(SEL / 10), live.key, published)[1]
    assert claim is not None and claim.gate_delta0 == d0
    print(f"open keys user mode e2e: {sent} heavy events, admitted at tick "
          f"{mine[0]['tick']} with {mine[0]['value']}, {live.worker.starts} starts")
