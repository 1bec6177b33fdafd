"""Open families in user mode (docs/open-keys.md, "In the stream"): the bounding stage
caps a unit's keys as counters (at most k events in each of at most m counters, keys
included), the gate's delta0 pays for the m keys at the unit's epsilon, every ledger
entry states the total, and replay flags a unit counted beyond its
bounds and a gate that ignores them. Pure: no Kafka. Deterministic (fixed noise key, no
statistical claim)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import orjson

from processor.core import registry
from processor.core.ecc import ECC, SimECC
from processor.core.grid import UNIT
from processor.core.selection import OpenKey
from processor.stream.model.bounding import (
    BoundCommit,
    Bounder,
    check_kept_set,
    encode_units,
    unit_hash,
    unit_key,
)
from processor.stream.model.config import Settings, with_unit
from processor.stream.model.families import OpenFamily, key_counter
from processor.stream.model.identity import counter_id, noise_identity
from processor.stream.model.lifetime import family_entries
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.records import encode_marker
from processor.stream.model.state import DictStore
from processor.stream.replay import compare, ledger_history, recompute_timeline
from tests.stream.test_operator import KEY, TICK, Run, settings

SEL = 1e-7
K, M = 2, 2
EPS_U, DELTA_U = 40.0, 1e-6
T = 900
HEAVY = key_counter("pages", "heavy")


def user_settings(**kw: Any) -> Settings:
    base: dict[str, Any] = dict(families={"pages": OpenFamily(0, SEL)}, mechanism="simecc",
                                heartbeat_ticks=50)
    base.update(kw)
    return with_unit(settings({"declared": 0}, **base), EPS_U, DELTA_U, K, M)


def _units_log(s: Settings) -> list[tuple[int, int, bytes]]:
    """Per tick n, one units record: a new unit with one event of the heavy key (ticks 20
    to T), a unit "greedy" touching the declared counter and five keys at ticks 5 to 9
    (m = 2: only its first two counters kept) and another, "twice", with five events of
    one key at ticks 12 to 16 (k = 2: two kept)."""
    ukey = unit_key(KEY)
    log: list[tuple[int, int, bytes]] = []
    src = 0

    def row(uid: str, counter: str, n: int) -> list[object]:
        nonlocal src
        src += 1
        return [unit_hash(ukey, uid), counter, n * TICK + 3, UNIT, 0, src]

    greedy = ["declared", *(key_counter("pages", f"g{i}") for i in range(4))]
    for n in range(T + 1):
        rows = []
        if n >= 20:
            rows.append(row(f"h{n}", HEAVY, n))
        if 5 <= n < 10:
            rows.append(row("greedy", greedy[n - 5], n))
        if 12 <= n < 17:
            rows.append(row("twice", key_counter("pages", "t"), n))
        log.append((0, n, encode_units(rows)))
    return log


def _pipeline(s: Settings, bounder_settings: Settings | None = None,
              op: Operator | None = None, log: list[tuple[int, int, bytes]] | None = None,
              ) -> tuple[list[bytes], list[bytes], Run, list[bytes]]:
    """The units log (default `_units_log`) through the bounding stage (under
    `bounder_settings`, default `s`) and its forwards, one marker per units record,
    through the operator: (timeline, dead letters, the run, units records)."""
    fw = CollectingSink()
    bc = BoundCommit(Bounder(bounder_settings or s), DictStore(), fw)
    run = Run(s, registry)
    if op is not None:
        run.op = op
    timeline: list[bytes] = []
    if log is None:
        log = _units_log(s)
    for p, off, raw in log:
        before = len(fw.timeline)
        asyncio.run(bc.commit(p, [(off, raw)]))
        for _, data in fw.timeline[before:]:
            timeline.append(data)
            assert not run.feed(data).releases  # nothing public at an event
        marker = encode_marker(off)
        timeline.append(marker)
        run.feed(marker)
    return timeline, list(fw.deadletters), run, [raw for _, _, raw in log]


def _ledger(s: Settings, run: Run) -> list[bytes]:
    """The ledger as a worker writes it: its start's family records, then the entries."""
    return [v for _, v in family_entries(s, {})] + [e.to_json() for e in run.ledger]


def _replay(s: Settings, timeline: list[bytes], run: Run,
            ledger: list[bytes] | None = None) -> set[tuple[str, str, str]]:
    releases = [r.to_json() for r in run.releases]
    if ledger is None:
        ledger = _ledger(s, run)
    history = ledger_history(s, KEY, ledger, releases)
    res = recompute_timeline(s, KEY, {0: list(enumerate(timeline))}, {0: len(timeline)},
                             history=history)
    return {(d.topic, d.key[0], d.problem) for d in compare(res, releases, ledger, history)[2]}


def test_user_mode_gate_pays_for_m_keys_at_the_units_epsilon() -> None:
    """delta0 = the largest with (1 + e^eps_u) m delta0 <= delta_sel (recomputed here,
    not through selection.py); the event-mode delta0 at the per-event epsilon would be
    far larger (the control a gate ignoring the unit's bounds would use)."""
    s = user_settings()
    d0 = s.gate_delta0("pages")
    assert (1.0 + math.exp(EPS_U)) * M * d0 <= SEL
    assert (1.0 + math.exp(EPS_U)) * M * d0 > SEL * (1 - 1e-12)
    assert OpenFamily(0, SEL).delta0(s.epsilon) > 100 * d0


def test_a_unit_is_capped_at_m_counters_keys_included_and_k_events_per_key() -> None:
    """The greedy unit's events to its third to fifth counter and the other unit's third
    to fifth event of one key are dead-lettered (contribution_bound_exceeded), never
    counted; the heavy key, one event from each of many units, is admitted at the tick
    the core gate gives its as-if-declared counter (per-event parameters derived from
    the unit's target, delta0 for m keys), with its whole count; its created entry
    states the unit's guarantee and the total with the gate's term."""
    s = user_settings()
    timeline, dead, run, _ = _pipeline(s)
    reasons = [orjson.loads(d)["reason"] for d in dead]
    assert reasons == ["contribution_bound_exceeded"] * 6
    assert sorted(orjson.loads(d)["offset"] for d in dead) == [3, 4, 5, 8, 9, 10]
    # The core gate on the heavy key's as-if-declared counter: one event per tick from
    # global tick 20 (local tick 21).
    c = registry.make(s.mechanism, s.epsilon, s.delta, KEY,
                      counter_id(noise_identity(s, KEY), HEAVY))
    assert isinstance(c, ECC | SimECC)
    gate = OpenKey.first_seen(c, s.gate_delta0("pages"), 21)
    admitted = next(rec for n in range(20, T + 1) for rec in gate.update(1.0))
    mine = [r for r in run.releases if r.counter == HEAVY]
    assert (mine[0].tick, mine[0].value, mine[0].kind) == (*admitted, "change")
    assert admitted[1] > 50  # its whole count, events before admission included
    assert {r.counter for r in run.releases} == {"declared", HEAVY}
    (entry,) = [e for e in run.ledger if e.counter == HEAVY]
    obj = orjson.loads(entry.to_json())
    assert (obj["since_tick"], obj["max_counters_per_unit"], obj["contribution_bound"],
            obj["unit_epsilon"], obj["unit_delta"]) == (admitted[0], M, K, EPS_U, DELTA_U)
    total = obj["unit_delta_total"]
    assert DELTA_U + SEL * (1 - 1e-9) <= total <= DELTA_U + SEL * (1 + 1e-9)
    # A declared counter beside the family states the same total: a person touching
    # it and keys incurs the gate's term too.
    (declared,) = [e for e in run.ledger if e.counter == "declared"]
    assert orjson.loads(declared.to_json())["unit_delta_total"] == total
    schema = json.loads((Path(__file__).parents[2] / "schemas" / "ledger-entry.schema.json"
                         ).read_text())
    v = jsonschema.Draft202012Validator(schema)
    for e in (entry, declared):
        v.validate(orjson.loads(e.to_json()))
    # Control: the field is refused on an event-mode entry.
    with_total = {**orjson.loads(declared.to_json()), "schema_version": 1,
                  "privacy_unit": "one event", "contribution_bound": 1,
                  "unit_delta_total": total}
    for k in ("unit_field", "max_counters_per_unit", "unit_epsilon", "unit_delta",
              "unit_derivation"):
        with_total.pop(k)
    assert not v.is_valid(with_total)
    with_total.pop("unit_delta_total")
    assert v.is_valid(with_total)
    assert _replay(s, timeline, run) == set()
    # Controls: the declared counter's entry without the gate's term, and the ledger
    # without the family's record, are flagged ("understated").
    bare = orjson.dumps({k: x for k, x in orjson.loads(declared.to_json()).items()
                         if k != "unit_delta_total"})
    ledger = [bare if x == declared.to_json() else x for x in _ledger(s, run)]
    assert ("ledger", "declared", "understated") in _replay(s, timeline, run, ledger)
    assert ("ledger", HEAVY, "understated") in _replay(
        s, timeline, run, [e.to_json() for e in run.ledger])


def test_replay_flags_a_unit_counted_beyond_m_and_a_gate_ignoring_the_bounds() -> None:
    """Controls, each caught: a bounding stage that lets a unit touch m + 1 counters
    (its forwards are outside the kept set replay recomputes: "unexpected"), and an
    operator whose gate ignores what a unit can do (delta0 = delta_sel, the factor
    (1 + e^eps_u) m left out: the heavy key is published before its admission)."""
    s = user_settings()
    log = _units_log(s)
    loose = with_unit(settings({"declared": 0}, families={"pages": OpenFamily(0, SEL)},
                               mechanism="simecc", heartbeat_ticks=50),
                      EPS_U, DELTA_U, K, M + 1)
    timeline, _, _, _ = _pipeline(s, bounder_settings=loose)
    got = check_kept_set(s, log, timeline, {0: 10**9})
    assert got and {p for p, _ in got} == {"unexpected"}
    timeline, _, run, _ = _pipeline(s)
    assert check_kept_set(s, log, timeline, {0: 10**9}) == []

    op = Operator(s, KEY, factory=registry)
    op._delta0 = {"pages": SEL}
    timeline, _, forged, _ = _pipeline(s, op=op)
    first_forged = min(r.tick for r in forged.releases if r.counter == HEAVY)
    first_real = min(r.tick for r in run.releases if r.counter == HEAVY)
    assert first_forged < first_real
    assert ("counts", HEAVY, "unexpected") in _replay(s, timeline, forged)
