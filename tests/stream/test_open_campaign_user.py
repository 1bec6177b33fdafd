"""The campaign's open-key checker in user mode (processor/devtools/open_campaign.py,
phase K with --open-user), on the pure pipeline of tests/stream/test_open_families_user.py
(units log, bounding stage, operator): it finds the real stages right, and each broken
stage wrong. Deterministic (fixed noise key, no statistical claim)."""

from __future__ import annotations

from typing import Any

import orjson

from processor.core import registry
from processor.devtools.open_campaign import check_open_keys, kept_events
from processor.stream.kafka.kafka_io import KafkaRecord
from processor.stream.model.bounding import encode_units
from processor.stream.model.config import with_unit
from processor.stream.model.families import OpenFamily
from processor.stream.model.operator import Operator
from processor.stream.model.records import TimelineBatch, decode_timeline
from tests.stream.test_open_families_user import (
    DELTA_U,
    EPS_U,
    HEAVY,
    SEL,
    K,
    M,
    _pipeline,
    _units_log,
    user_settings,
)
from tests.stream.test_operator import KEY, settings


def _records(topic: str, values: list[bytes]) -> dict[int, list[KafkaRecord]]:
    return {0: [KafkaRecord(topic, 0, i, None, v, (), 0) for i, v in enumerate(values)]}


def _verdict(timeline: list[bytes], run: Any, log: list[tuple[int, int, bytes]],
             s: Any) -> Any:
    units = {0: [KafkaRecord("u", p, off, None, raw, (), 0) for p, off, raw in log]}
    return check_open_keys(s, KEY, _records("t", timeline),
                           [orjson.loads(r.to_json()) for r in run.releases],
                           [orjson.loads(e.to_json()) for e in run.ledger], units)


def _with_resend(s: Any) -> list[tuple[int, int, bytes]]:
    """`_units_log` and, after it, a units record ingest sent again after a crash: the
    greedy unit's first event (tick 5), same input offset, in a new record."""
    log = _units_log(s)
    again = orjson.loads(log[5][2])["e"]
    assert [r[1] for r in again] == ["declared"]
    log.append((0, len(log), encode_units(again)))
    return log


def test_the_user_mode_checker_finds_the_stages_right() -> None:
    """The real bounding stage and operator: no violation; the kept set is the pipeline's
    own count (6 of the units' events beyond a bound, a re-sent copy deciding nothing);
    the heavy key, and only it, admitted, of the three keys a unit could reach (the
    greedy unit's first key, the other unit's, the heavy one)."""
    s = user_settings()
    log = _with_resend(s)
    timeline, dead, run, _ = _pipeline(s, log=log)
    report = _verdict(timeline, run, log, s)
    assert report.ok, report.violations
    sent = sum(len(orjson.loads(raw)["e"]) for _, _, raw in log)
    assert report.events_kept == sent - len(dead) - 1  # the copy is no event
    assert (report.keys_admitted, report.keys_seen) == (1, 3)
    forwarded = {(ev.src_partition, ev.src_offset) for t in timeline
                 if isinstance(b := decode_timeline(t), TimelineBatch) for ev in b.events}
    assert set(kept_events({0: [KafkaRecord("u", 0, o, None, r, (), 0)
                                for _, o, r in log]}, K, M)) == forwarded


def test_the_user_mode_checker_catches_each_broken_stage() -> None:
    """Controls, each caught: a bounding stage that lets a unit touch m + 1 counters
    (counted beyond its bounds), a timeline that lost one kept event (kept but not on the
    timeline), and a gate that ignores the unit's bounds (delta0 = delta_sel: the heavy
    key published before the core gate admits it)."""
    s = user_settings()
    log = _units_log(s)
    loose = with_unit(settings({"declared": 0}, families={"pages": OpenFamily(0, SEL)},
                               mechanism="simecc", heartbeat_ticks=50),
                      EPS_U, DELTA_U, K, M + 1)
    timeline, _, run, _ = _pipeline(s, bounder_settings=loose, log=log)
    bad = _verdict(timeline, run, log, s)
    assert any("beyond its unit's bounds" in v for v in bad.violations), bad.violations

    timeline, _, run, _ = _pipeline(s, log=log)
    lost = next(i for i, t in enumerate(timeline) if isinstance(decode_timeline(t),
                                                                 TimelineBatch))
    bad = _verdict(timeline[:lost] + timeline[lost + 1:], run, log, s)
    assert any("kept but not on the timeline" in v for v in bad.violations), bad.violations

    op = Operator(s, KEY, factory=registry)
    op._delta0 = {"pages": SEL}
    timeline, _, forged, _ = _pipeline(s, op=op, log=log)
    bad = _verdict(timeline, forged, log, s)
    assert any(HEAVY in v for v in bad.violations), bad.violations


def test_the_checker_judges_what_the_operator_committed() -> None:
    """A clean stop leaves the timeline past the operator's committed offset: ticks
    ingest sealed that nobody applied, or a marker the operator applied and published
    but its last checkpoint did not cover (the next owner re-sends the same records).
    Given the committed offset, the checker requires every record through the committed
    frontier and accepts, past it, only the recomputation's records: the prefix run and
    the whole run both pass. Controls, caught: the prefix run judged against the whole
    timeline (changes missing), and the whole run with one change past the frontier
    forged."""
    s = user_settings()
    log = _units_log(s)
    timeline, _, whole_run, _ = _pipeline(s, log=log)
    cut = 600
    applied, _, run, _ = _pipeline(s, log=log[:cut])
    assert timeline[:len(applied)] == applied
    # The bounding stage forwarded everything (the drain waits for it); the operator
    # committed the first `cut` ticks.
    units = {0: [KafkaRecord("u", p, off, None, raw, (), 0) for p, off, raw in log]}

    def judge(r: Any, committed: dict[int, int] | None,
              forge: bool = False) -> Any:
        releases = [orjson.loads(x.to_json()) for x in r.releases]
        if forge:
            last = max((x for x in releases if x["counter"] == HEAVY
                        and x["kind"] == "change"), key=lambda x: x["tick"])
            last["value"] += 1.0
        return check_open_keys(s, KEY, _records("t", timeline), releases,
                               [orjson.loads(e.to_json()) for e in r.ledger], units,
                               committed=committed)

    for r in (run, whole_run):
        judged = judge(r, {0: len(applied)})
        assert judged.ok and judged.keys_admitted == 1, judged.violations
    whole = judge(run, None)
    assert any(HEAVY in v and "changes after admission" in v for v in whole.violations), (
        whole.violations)
    forged = judge(whole_run, {0: len(applied)}, forge=True)
    assert any(HEAVY in v and "changes after admission" in v for v in forged.violations), (
        forged.violations)
