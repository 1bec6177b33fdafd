"""Replay across configuration changes (processor/stream/replay/: LedgerHistory and
LedgerProvenance; docs/replay.md, "What replay needs").

A worker (BatchCommit over the operator, as app.py runs it) lives through configuration
changes under its state: epsilon changed with on_parameter_change = "keep", the
configured mechanism changed, counters added later (with a start after the restart, and
with one before it: then where the restart was between two markers matters), and three
configurations in a row.
Replay given only the final configuration and the key takes each counter's parameters and
fingerprints from the published ledger and recomputes everything else: identical. Without
the ledger's history (the old replay) the same timeline is different, so the tests can
fail. Controls: a ledger entry with a changed epsilon, a release computed with the
configured parameters instead of the stored ones, a release under a fingerprint no entry
announced and an entry whose parameters the configuration validation refuses are each
reported as differences with a reason. One test against the real broker: a worker
restarted with a changed epsilon ("keep"), then `python -m processor replay` with the
final configuration exits 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import pytest

from processor.commands import main as cli
from processor.core.rng import NoiseKey
from processor.stream.kafka import kafka_io
from processor.stream.model.commit import BatchCommit
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.operator import Operator
from processor.stream.model.outputs import CollectingSink
from processor.stream.model.records import Event, LedgerEntry, Release, encode_batch, encode_marker
from processor.stream.model.state import DictStore
from processor.stream.replay import (
    Difference,
    Recomputed,
    compare,
    ledger_history,
    recompute_timeline,
)

KEY = NoiseKey.from_seed(11)
TICK = 100


def _base() -> Settings:
    return with_overrides(Settings(), counters={"a": 0, "b": 0}, partitions=1,
                          tick_ms=TICK, mechanism="ecc", epsilon=300.0, delta=1e-6,
                          heartbeat_ticks=4)


def _timeline(ticks: range, counters: Sequence[str]) -> list[bytes]:
    """Per tick, one event for each counter (value 1) and the marker sealing the tick."""
    out: list[bytes] = []
    for n in ticks:
        out.append(encode_batch([Event(c, n * TICK + 7, 65536, -1, -1) for c in counters]))
        out.append(encode_marker(n))
    return out


@dataclasses.dataclass
class Life:
    """What a worker published over its life, and the timeline it applied."""

    timeline: list[tuple[int, bytes | None]]
    releases: list[Release]
    ledger: list[LedgerEntry]


def _live(phases: Sequence[tuple[Settings, list[bytes]]]) -> Life:
    """A worker restarted under each phase's settings (a new Operator on the same store,
    as after a stop), applying that phase's timeline records one batch at a time."""
    store = DictStore()
    pub = CollectingSink()
    timeline: list[tuple[int, bytes | None]] = []
    for s, records in phases:
        commit = BatchCommit(Operator(s, KEY), store, pub)
        for r in records:
            asyncio.run(commit.commit(0, [(len(timeline), r)]))
            timeline.append((len(timeline), r))
    return Life(timeline, pub.releases, pub.ledger)


def _replay(s: Settings, life: Life, releases: Sequence[bytes] | None = None,
            ledger: Sequence[bytes] | None = None, *, history: bool = True,
            ) -> tuple[Recomputed, list[Difference]]:
    """Replay's recomputation and comparison with `s`, everything committed."""
    pub = [r.to_json() for r in life.releases] if releases is None else list(releases)
    led = [e.to_json() for e in life.ledger] if ledger is None else list(ledger)
    h = ledger_history(s, KEY, led, pub) if history else None
    got = recompute_timeline(s, KEY, {0: life.timeline}, {0: len(life.timeline)},
                             history=h)
    _rel, _led, diffs = compare(got, pub, led, h)
    return got, diffs


CHANGES: dict[str, Callable[[Settings], Settings]] = {
    # epsilon changed, existing counters keep theirs; c added later (start in the future)
    "keep-epsilon": lambda s: with_overrides(s, epsilon=90.0, on_parameter_change="keep",
                                             counters={"a": 0, "b": 0, "c": 30 * TICK}),
    # the configured mechanism and epsilon changed: a and b stay ECC at 300.0, c is SimECC
    "mechanism": lambda s: with_overrides(s, mechanism="simecc", epsilon=50.0,
                                          on_parameter_change="keep",
                                          counters={"a": 0, "b": 0, "c": 30 * TICK}),
    # only a counter added: a and b run with the configured parameters ("configured")
    "counter-added": lambda s: with_overrides(s, counters={"a": 0, "b": 0, "c": 30 * TICK}),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_replay_with_the_final_configuration_verifies_the_whole_history(
        change: str) -> None:
    """Ticks 1-20 under the first configuration, 21-70 under the changed one: replay with
    the changed one alone is identical (a and b run with their stored parameters under
    the first fingerprint's noise identity, c with the new ones), and the ledger says
    so: a and b "reconfigured" with parameters "stored" ("configured" when only a counter
    was added). Control: the old replay (every
    counter from the configuration) finds differences."""
    s1 = _base()
    s2 = CHANGES[change](s1)
    life = _live([(s1, _timeline(range(1, 21), ["a", "b"])),
                  (s2, _timeline(range(21, 71), ["a", "b", "c"]))])
    got, diffs = _replay(s2, life)
    assert diffs == []
    assert got.settled == life.releases and got.settled_ledger == life.ledger
    entries = {(e.counter, e.entry, e.parameters, e.mechanism, e.epsilon, e.fingerprint)
               for e in life.ledger}
    kept = "configured" if change == "counter-added" else "stored"
    assert entries == {
        ("a", "created", "configured", "ecc", 300.0, s1.fingerprint()),
        ("b", "created", "configured", "ecc", 300.0, s1.fingerprint()),
        ("a", "reconfigured", kept, "ecc", 300.0, s2.fingerprint()),
        ("b", "reconfigured", kept, "ecc", 300.0, s2.fingerprint()),
        ("c", "created", "configured", s2.mechanism, s2.epsilon, s2.fingerprint())}
    assert {r.fingerprint for r in life.releases} == {s1.fingerprint(), s2.fingerprint()}
    # Noise and counts are recomputed, not only parameters: values moved.
    assert {(r.counter, r.fingerprint == s2.fingerprint()) for r in life.releases
            if r.kind == "change" and r.value > 0} >= {("a", True), ("b", True)}

    # Control: recomputing every counter with the final configuration is not identical.
    _got, old = _replay(s2, life, history=False)
    assert {d.key[0] for d in old if d.topic == "counts"} >= {"a", "b"}


def test_three_configurations_with_a_counter_created_in_the_middle() -> None:
    """c is created under the second configuration (epsilon 90) and runs on under the
    third (epsilon 40): replay with the third takes c's parameters and noise identity from
    its created entry (an intermediate fingerprint), identical."""
    s1 = _base()
    s2 = CHANGES["keep-epsilon"](s1)
    s3 = with_overrides(s2, epsilon=40.0)
    life = _live([(s1, _timeline(range(1, 21), ["a", "b"])),
                  (s2, _timeline(range(21, 46), ["a", "b", "c"])),
                  (s3, _timeline(range(46, 80), ["a", "b", "c"]))])
    assert {(e.counter, e.fingerprint) for e in life.ledger if e.entry == "created"} == {
        ("a", s1.fingerprint()), ("b", s1.fingerprint()), ("c", s2.fingerprint())}
    assert {(r.counter, r.epsilon) for r in life.releases} == {
        ("a", 300.0), ("b", 300.0), ("c", 90.0)}
    _got, diffs = _replay(s3, life)
    assert diffs == []
    # Entries re-sent after a crash (identical) are one entry, not a second creation.
    twice = [e.to_json() for e in (*life.ledger, *life.ledger)]
    assert _replay(s3, life, ledger=twice)[1] == []


def _window_timeline() -> list[bytes]:
    """a and b every tick 1-100; d (not declared yet) at tick 5, then twice 30 events
    between the markers of ticks 20 and 21 (records 40 and 41), then never again."""
    out = _timeline(range(1, 101), ["a", "b"])
    out[8] = encode_batch([Event(c, 5 * TICK + 7, 65536, -1, -1) for c in ("a", "b", "d")])
    d = encode_batch([Event("d", 21 * TICK + 3, 65536, -1, -1)] * 30)
    return [*out[:40], d, d, *out[40:]]


@pytest.mark.parametrize("restart", [40, 41, 42])
def test_a_counter_declared_after_its_start_is_created_where_the_worker_created_it(
        restart: int) -> None:
    """d is declared at a restart after its start (tick 1): the worker skipped its events
    until then and created it at the first marker after the restart. Where the restart
    was between two markers is not on the timeline: before, between or after d's two
    event records of that window, three different outcomes for d. Replay finds the
    creating marker by the ledger's creation tag and the restart's position by which
    candidate's records were published: identical in all three. Control: one operator
    declaring d from the start (no placement) differs, on d only."""
    from processor.stream.replay import ledger_operator

    s1 = _base()
    s2 = with_overrides(s1, counters={"a": 0, "b": 0, "d": 0}, epsilon=500.0,
                        on_parameter_change="keep")  # little noise: d's count shows
    records = _window_timeline()
    life = _live([(s1, records[:restart]), (s2, records[restart:])])
    created = next(e for e in life.ledger if (e.counter, e.entry) == ("d", "created"))
    assert (created.epsilon, created.fingerprint) == (500.0, s2.fingerprint())
    got, diffs = _replay(s2, life)
    assert diffs == []
    assert got.settled == life.releases and got.settled_ledger == life.ledger
    # The three restarts are three computations (so the placement is tested).
    others = [_live([(s1, records[:r]), (s2, records[r:])]) for r in (40, 41, 42)]
    assert len({tuple((r.tick, r.value) for r in o.releases
                      if r.counter == "d" and r.kind == "change") for o in others}) == 3

    led = [e.to_json() for e in life.ledger]
    h = ledger_history(s2, KEY, led, [r.to_json() for r in life.releases])
    plain = recompute_timeline(s2, KEY, {0: life.timeline}, {0: len(life.timeline)},
                               operator=ledger_operator(s2, KEY, h))
    _rel, _led, diffs = compare(plain, [r.to_json() for r in life.releases], led, h)
    assert diffs and {d.key[0] for d in diffs} == {"d"}


def _kept_life() -> tuple[Settings, Life]:
    s1 = _base()
    s2 = CHANGES["keep-epsilon"](s1)
    return s2, _live([(s1, _timeline(range(1, 21), ["a", "b"])),
                      (s2, _timeline(range(21, 71), ["a", "b", "c"]))])


def test_a_tampered_ledger_entry_is_a_difference() -> None:
    """The created entry of a says epsilon 90 (it ran with 300): replay recomputes a with the
    epsilon the ledger claims, so a's releases differ (epsilon and values), its recomputed
    reconfigured entry carries 9 where 3 was published, and a and b, created under one
    configuration, disagree on its parameters ("inconsistent", both named: the ledger
    alone cannot tell which lies; b's releases, recomputed with its own, are identical).
    A reconfigured entry tampered alone (epsilon 90) differs from its recomputation (the
    running instance's)."""
    s2, life = _kept_life()
    ledger = [e.to_json() if (e.counter, e.entry) != ("a", "created")
              else dataclasses.replace(e, epsilon=90.0).to_json() for e in life.ledger]
    _got, diffs = _replay(s2, life, ledger=ledger)
    releases = [d for d in diffs if d.topic == "counts"]
    assert releases and {d.key[0] for d in releases} == {"a"}
    # Other noise too: changes at other ticks are missing or unexpected.
    assert all("epsilon: replay=90.0" in d.detail for d in releases
               if d.problem == "different")
    assert any(d.problem == "different" for d in releases)
    entries = {(d.key[0], d.problem) for d in diffs if d.topic == "ledger"}
    assert entries == {("a", "different"), ("a", "inconsistent"), ("b", "inconsistent")}
    assert all("disagree" in d.detail for d in diffs if d.problem == "inconsistent")

    ledger = [e.to_json() if (e.counter, e.entry) != ("a", "reconfigured")
              else dataclasses.replace(e, epsilon=90.0).to_json() for e in life.ledger]
    _got, diffs = _replay(s2, life, ledger=ledger)
    assert [(d.topic, d.key[0], d.problem) for d in diffs] == [("ledger", "a", "different")]
    assert "epsilon: replay=300.0 published=90.0" in diffs[0].detail


def test_a_release_computed_with_the_wrong_parameters_is_a_difference() -> None:
    """After the change the worker should run a with its stored parameters; a release of
    a computed with the configured ones (the old replay's recomputation, epsilon 90 under
    the new noise identity) in place of the published one is "different"."""
    s2, life = _kept_life()
    wrong, _ = _replay(s2, life, history=False)
    t = max(r.tick for r in life.releases if r.counter == "a")
    forged = next(r for r in wrong.settled if (r.counter, r.tick) == ("a", t))
    assert forged.epsilon == 90.0
    releases = [forged.to_json() if (r.counter, r.tick) == ("a", t) else r.to_json()
                for r in life.releases]
    _got, diffs = _replay(s2, life, releases=releases)
    assert [(d.key[:2], d.problem) for d in diffs] == [(("a", t), "different")]
    assert "epsilon: replay=300.0 published=90.0" in diffs[0].detail


def test_an_unannounced_fingerprint_and_a_refused_entry_are_reported_with_a_reason() -> None:
    """A release under a fingerprint no ledger entry of its counter announced is
    "unexplained"; a created entry whose parameters the configuration validation refuses
    (epsilon 0) is reported naming the field, and its counter is recomputed with the
    configured parameters (so its releases differ too). Control: the untouched
    topics give no difference."""
    s2, life = _kept_life()
    assert _replay(s2, life)[1] == []
    r0 = next(r for r in life.releases if r.counter == "b")
    releases = [dataclasses.replace(r, fingerprint="f" * 64).to_json() if r is r0
                else r.to_json() for r in life.releases]
    _got, diffs = _replay(s2, life, releases=releases)
    assert [(d.key[:2], d.problem) for d in diffs] == [(("b", r0.tick), "different"),
                                                       (("b", r0.tick), "unexplained")]
    assert "not announced by a ledger entry" in diffs[1].detail

    ledger = [e.to_json() if (e.counter, e.entry) != ("b", "created")
              else dataclasses.replace(e, epsilon=0.0).to_json() for e in life.ledger]
    _got, diffs = _replay(s2, life, ledger=ledger)
    problems = {(d.topic, d.key[0], d.problem) for d in diffs}
    # Recomputed under the current fingerprint, b's created entry has another key: the
    # published one is unexpected (with the reason), the recomputed one missing.
    assert {p for p in problems if p[0] == "ledger"} == {
        ("ledger", "b", "unexpected"), ("ledger", "b", "missing")}
    assert ("counts", "b", "different") in problems
    assert {p[1] for p in problems} == {"b"}
    reason = next(d.detail for d in diffs if (d.topic, d.problem) == ("ledger", "unexpected"))
    assert "validation refuses" in reason and "epsilon" in reason


def test_each_distinct_parameters_are_validated_once(monkeypatch: pytest.MonkeyPatch,
                                                     ) -> None:
    """Validating settings is linear in the declared counters: a ledger of many counters
    created with one configuration's parameters validates them once, not once per entry
    (with 100,000 counters per entry was hours). The verdict is per entry still: two
    entries refused for epsilon 0.0 and -0.0 (equal as floats) each carry the validation's
    own message for their value, and the accepted ones are used. Control: the counting
    wrapper sees every call (one per distinct parameters, one for the per-event settings)."""
    from processor.stream.replay import history as history_module

    s2, life = _kept_life()
    created = next(e for e in life.ledger if (e.counter, e.entry) == ("a", "created"))
    many = [dataclasses.replace(created, counter=f"m{i:04d}") for i in range(300)]
    refused = [dataclasses.replace(created, counter="z0", epsilon=0.0),
               dataclasses.replace(created, counter="z1", epsilon=-0.0)]
    calls: list[dict[str, Any]] = []

    def counting(s: Settings, **changes: Any) -> Settings:
        calls.append(changes)
        return with_overrides(s, **changes)

    monkeypatch.setattr(history_module, "with_overrides", counting)
    h = ledger_history(s2, KEY, [e.to_json() for e in (*many, *refused)])
    assert len(calls) == 1 + 1 + 2
    assert set(h.created) == {e.counter for e in many}
    reasons = {d.key[0]: d.detail for d in h.problems}
    assert set(reasons) == {"z0", "z1"}
    for name, eps in (("z0", 0.0), ("z1", -0.0)):
        with pytest.raises(Exception) as exc:
            with_overrides(s2, privacy_unit="event", epsilon=eps)
        assert f"({exc.value})" in reasons[name]


# ----------------------------------------------------------------------- the broker


@pytest.mark.kafka
def test_replay_after_a_restart_with_a_changed_epsilon(
        deployment_factory: Callable[..., Any], capsys: pytest.CaptureFixture[str]) -> None:
    """A worker runs counter a at epsilon 500, stops, restarts with epsilon 400 and
    on_parameter_change = "keep", runs, stops: `python -m processor replay` with the final
    configuration is identical (exit 0), the ledger holding a's created and reconfigured
    entries."""
    from processor.devtools.deployment import write_config

    tick = 200
    start = (int(time.time() * 1000) // tick) * tick
    dep = deployment_factory({"a": start}, name="history", partitions=1, tick_ms=tick,
                             lateness_ms=200, heartbeat_ticks=5, epsilon=500.0)
    dep.worker.start()
    dep.produce([orjson.dumps({"counter": "a", "ts": int(time.time() * 1000)})])
    dep.wait_releases(lambda rs: len(rs) >= 2, timeout_s=60)
    assert dep.worker.stop() == 0, dep.worker.log_tail()
    first = len(dep.releases())

    kept = with_overrides(dep.settings, epsilon=400.0, on_parameter_change="keep")
    write_config(kept, dep.config)
    dep.worker.start()
    dep.produce([orjson.dumps({"counter": "a", "ts": int(time.time() * 1000)})])
    dep.wait_releases(lambda rs: len(rs) >= first + 2, timeout_s=60)
    assert dep.worker.stop() == 0, dep.worker.log_tail()
    # The history replay must cover: two fingerprints, the stored epsilon throughout.
    assert {r["epsilon"] for r in dep.releases()} == {500.0}
    assert {r["fingerprint"] for r in dep.releases()} == {dep.settings.fingerprint(),
                                                          kept.fingerprint()}
    entries = [orjson.loads(r.value or b"")
               for r in kafka_io.iter_topic(dep.conf, dep.topics.ledger)]
    assert [(e["entry"], e["parameters"]) for e in entries] == [
        ("created", "configured"), ("reconfigured", "stored")]

    capsys.readouterr()
    code = cli.main(["replay", "--config", str(dep.config), "--json", "--quiet"])
    verdict = orjson.loads(capsys.readouterr().out)
    assert code == 0 and verdict["identical"], verdict["differences"]
    assert verdict["counts"]["ledger"]["published"] == 2
