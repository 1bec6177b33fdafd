"""The campaign run small (processor/devtools/campaign.py): every
category of bad input once, mixed with valid awkward records, and one SIGKILL of the
worker at each moment that matters (during startup, right after a marker, while a backlog
drains, inside a batch commit); then the checks: nothing lost, nothing counted twice, no
(counter, tick) with two values, every bad record dead-lettered with its reason and never
counted, replay identical. reliability/campaign.py runs the same code at full size.

Every check is exact (false-alarm rate 0 on a correct system). Controls: the corpus
checker flags the undeclared categories when the counters are not required to be
declared, and the topic checker flags a run judged against a wrong expectation.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from processor.devtools.campaign import (
    BAD,
    CAMPAIGN_SETTINGS,
    KILL_MOMENTS,
    VALID,
    CorpusContext,
    FuzzRecord,
    KillDriver,
    campaign_counters,
    check,
    exit_label,
    fuzz_corpus,
    refusals,
)
from processor.devtools.deployment import Deployment, WorkerProcess
from processor.devtools.unit_campaign import BOUND_REASON, MISSING_REASON, unit_phase
from processor.stream.model.config import Settings, with_overrides
from processor.stream.model.records import (
    OPEN_FAMILY_REASONS,
    REASONS,
    USER_MODE_REASONS,
    Rejection,
    parse_input,
)
from tests.stream.test_app_e2e import TEST_SECRET


def _mismatches(corpus: list[FuzzRecord], settings: Settings, now: int) -> set[str]:
    """Categories whose records parse_input does not treat as the corpus says."""
    out: set[str] = set()
    for rec in corpus:
        got = parse_input(rec.raw, settings, now)
        if rec.reason is None:
            ok = not isinstance(got, Rejection) and (got.counter, got.units) == (
                rec.counter, rec.units)
        else:
            ok = isinstance(got, Rejection) and got.reason == rec.reason
        if not ok:
            out.add(rec.category)
    return out


def test_every_category_gets_its_outcome_from_parse_input() -> None:
    """At least 44 bad categories covering every dead-letter reason, each rejected with
    the reason it names, and each valid category counted as it says (about 170 records
    per category, seeded). Control: with allow_undeclared the undeclared
    categories, and only they, are flagged."""
    now = int(time.time() * 1000)
    counters = campaign_counters(4, now)
    settings = with_overrides(Settings(), counters=counters, **CAMPAIGN_SETTINGS)
    ctx = CorpusContext(tuple(counters), min(counters.values()), now, settings.max_future_ms)
    corpus = fuzz_corpus(ctx, random.Random(20261130), bad=10_000, valid=1_000)
    assert len(BAD) >= 44 and {reason for reason, _ in BAD.values()} == set(REASONS) - set(
        USER_MODE_REASONS) - set(OPEN_FAMILY_REASONS)  # event mode, no open family
    assert {r.category for r in corpus} >= set(BAD) | set(VALID)
    assert _mismatches(corpus, settings, now) == set()
    loose = replace(settings, allow_undeclared=True)
    assert _mismatches(corpus, loose, now) == {"undeclared", "undeclared_unicode",
                                               "undeclared_near_miss"}


def test_a_corpus_without_valid_records_is_only_bad_ones() -> None:
    """A small all-bad draw (phase D feeds in pieces of ~20 records at a 97.5% bad share)
    has no valid record to duplicate: 20 bad records, none valid."""
    ctx = CorpusContext(("c0",), 0, int(time.time() * 1000), 3000)
    corpus = fuzz_corpus(ctx, random.Random(7), bad=20, valid=0, every_category=False)
    assert len(corpus) == 20 and all(r.reason is not None for r in corpus)


@pytest.mark.kafka
def test_a_worker_that_refused_fails_the_phase() -> None:
    """The driver's counts of workers found exited with code 2 (a refusal, restarted by
    the driver) are what fails a phase (reliability/campaign.py `finish`); the exits the
    faults cause (SIGKILL, SIGTERM, the fence's 3, a clean 0) and counts of 0 do not."""
    counts = {"pause_exit_2": 1, "drain_found_exit_2": 2, "marker_found_exit_2": 0,
              "clean_stop_exit_0": 2, "pauses_fenced": 1, "pause_exit_3": 1,
              "rebalance_stop_exit_143": 1, "drain_found_exit_-9": 1,
              "startup_found_exit_12": 1}
    assert refusals(counts) == ["drain_found_exit_2", "pause_exit_2"]
    assert refusals({k: n for k, n in counts.items() if "_exit_2" not in k}) == []
    assert refusals({"pause_exit_2_brokers_unreachable": 1}) == []


def test_a_paused_start_that_met_no_broker_is_no_refusal(tmp_path: Path) -> None:
    """A worker paused during its start exits 2 with the probe's one line when resumed
    (the brokers "do not answer" it in time): labelled apart, so no phase fails on it;
    any other last error line, or none, is a refusal's 2. Control: the same log with
    a refusal's line after it."""
    log = tmp_path / "worker.log"
    w = WorkerProcess(tmp_path / "worker.toml", log)
    log.write_bytes(b"INFO start\nerror: the Kafka brokers at 127.0.0.1:1 do not answer "
                    b"(_TRANSPORT); check bootstrap_servers\n")
    assert exit_label(w, 2) == "2_brokers_unreachable" and exit_label(w, 3) == "3"
    with log.open("ab") as f:
        f.write(b"error: counter 'c1' was already announced on the ledger topic\n")
    assert exit_label(w, 2) == "2"
    log.write_bytes(b"INFO nothing\n")
    assert exit_label(w, 2) == "2"


def test_small_campaign_with_a_kill_at_every_moment(
        deployment_factory: Callable[..., Deployment]) -> None:
    """Every category once (plus some more valid records), a worker killed once at each
    of KILL_MOMENTS while the records flow, a clean drain: the checks find nothing lost,
    nothing counted twice, no conflicting values, every bad record dead-lettered with its
    reason, replay identical. Control: the same topics judged against an expectation
    with one category's reason changed are flagged."""
    rng = random.Random(1130)
    dep = deployment_factory(campaign_counters(4, int(time.time() * 1000)), name="camp",
                             secret=TEST_SECRET, **CAMPAIGN_SETTINGS)
    driver = KillDriver(dep, rng, bad_share=0.9, backlog=(200, 400))
    dep.worker.start()
    driver.feed(len(BAD) + len(VALID) + 40)
    dep.wait_releases(lambda rs: len(rs) > 0, timeout_s=90)
    for moment in KILL_MOMENTS:
        driver.feed(100)
        driver.kill(moment)
    assert driver.drain_and_stop([dep.worker], timeout_s=120), (driver.counts,
                                                                 dep.worker.log_tail())
    report = check(dep, driver.expected)
    print("small campaign:", dict(driver.counts), report.as_dict())
    assert report.ok, report.as_dict()
    assert report.bad_records >= len(BAD) and report.valid_records >= len(VALID)
    assert set(report.dead_letters_by_reason) == set(REASONS) - set(USER_MODE_REASONS) - set(
        OPEN_FAMILY_REASONS)
    assert sum(driver.counts[f"kills_{m}"] for m in KILL_MOMENTS) >= 3, driver.counts

    nan = next(raw for raw, r in driver.expected.items() if r.category == "value_nan")
    wrong = {**driver.expected, nan: replace(driver.expected[nan], reason="unparsable")}
    assert check(dep, wrong, with_replay=False).bad_wrong_reason >= 1


@pytest.mark.kafka
def test_small_unit_campaign_with_kills_and_a_rebalance(kafka_bootstrap: str,
                                                         tmp_path: Path) -> None:
    """Phase U small (processor/devtools/unit_campaign.py): privacy_unit = "user" with
    k = 2, m = 3, two workers of one group, a few hundred records (every bad category,
    bad unit ids, many events per unit), a SIGKILL inside the bounding stage's checkpoint
    (after its forwards, or between its state writes), one during startup and a
    rebalance; every checker at zero: each record counted or dead-lettered once, the
    kept set equal to the recomputation, no unit beyond a bound, the published counts
    equal to the recomputation and replay's (exit 0, identical), no raw id outside the
    input and dead-letter topics. The checkers' controls: tests/reliability/
    test_unit_checks.py."""
    result = unit_phase(kafka_bootstrap, tmp_path, random.Random(1731), records=400,
                        kills=2, rebalances=1, units=40, name="campu",
                        plan=["mid_batch", "rebalance", "startup"],
                        crash_points=(("unit_after_forward", 1, 3),
                                      ("unit_between_state_writes", 2, 8)),
                        drain_timeout_s=180)
    print("small unit campaign:", result)
    units = result["units"]
    assert result["ok"], result
    assert units["recomputed_dropped"] > 0 and units["counted"] > 0
    assert {BOUND_REASON, MISSING_REASON, "invalid_unit"} <= set(
        units["dead_letters_by_reason"])
    assert units["ids_scanned"] > 0 and units["topics_scanned"] >= 5
    assert result["driver"].get("kills_mid_batch", 0) + result["driver"].get(
        "kills_startup", 0) >= 1, result["driver"]


@pytest.mark.kafka
def test_small_open_key_campaign_with_kills(kafka_bootstrap: str, tmp_path: Path) -> None:
    """Phase K small: Zipf keys for 40 s, two workers of one group, two SIGKILLs of one
    of them (its keys move to the other and back); the independent checker finds
    every key's records as the core gate says (some admitted, most not), replay the
    same. The checker's controls are in tests/stream/test_open_families.py."""
    from processor.devtools.open_campaign import open_key_phase

    result = open_key_phase(kafka_bootstrap, tmp_path, random.Random(1732), seconds=40.0,
                            rate=40.0, keys=100, kills=2, workers=2)
    # pytest shortens a long dict: the failing checks in full.
    assert result["ok"], orjson.dumps(
        {k: result[k] for k in ("first_violations", "replay_identical", "caught_up",
                                "driver", "changelog")}).decode()
    assert result["violations"] == 0 and result["replay_identical"]
    assert 0 < result["keys_admitted"] < result["keys_seen"]
    assert result["driver"]["kills_sigkill"] == 2 and result["starts"] == 4
