"""Replay given another configuration or key than the ledger's (issue 31: a second shell
without DPC_COUNTERS): `ledger_mismatch` names what the ledger contradicts: counters,
fingerprint, key, parameters. Replay then recomputes nothing: the verdict's first line
says so and the command exits 3, not 1. Controls: the ledger's own configuration and key
find nothing, a counter whose start lies ahead is not missing, and stored parameters
(on_parameter_change = "keep") are no contradiction. tests/deploy/test_readme_commands.py
runs the README's replay from a second shell without DPC_COUNTERS against a broker."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from processor.core.rng import NoiseKey
from processor.stream.model.config import Settings
from processor.stream.model.records import LedgerEntry
from processor.stream.replay.configured import ledger_mismatch
from processor.stream.replay.report import Difference, ReplayReport, Tally

KEY = NoiseKey(b"\x11" * 32)
NOW = 1_800_000_000_000
RAN = Settings(counters={"signups": NOW - 60_000}, mechanism="simecc", calibration="tight",
               tick_ms=100)


def ledger(settings: Settings, key: NoiseKey = KEY, **changed: Any) -> list[bytes]:
    return [dataclasses.replace(LedgerEntry(
        counter=name, mechanism=settings.mechanism, epsilon=settings.epsilon,
        delta=settings.delta, tick_ms=settings.tick_ms, start_ms=start,
        fingerprint=settings.fingerprint(), key_id=key.fingerprint(),
        calibration=settings.calibration), **changed).to_json()
        for name, start in settings.counters.items()]


def test_the_ledgers_own_configuration_and_key_find_nothing() -> None:
    assert ledger_mismatch(RAN, KEY, ledger(RAN), NOW) == []
    assert ledger_mismatch(RAN, KEY, [], NOW) == []  # nothing published: nothing to say
    ahead = dataclasses.replace(RAN, counters={**RAN.counters, "later": NOW + 60_000})
    # A counter that starts ahead is not yet announced; the fingerprint changed, though.
    got = ledger_mismatch(ahead, KEY, ledger(RAN), NOW)
    assert len(got) == 1 and got[0].startswith("the configuration's fingerprint")


def test_the_example_counters_in_place_of_the_workers_are_named() -> None:
    """The issue's case: the example file's [counters] instead of DPC_COUNTERS."""
    second_shell = dataclasses.replace(RAN, counters={"signups": 1_767_225_600_000,
                                                      "incidents": 1_767_225_600_000,
                                                      "test_results": 1_767_225_600_000})
    got = ledger_mismatch(second_shell, KEY, ledger(RAN), NOW)
    assert got[0] == "counters incidents, test_results are configured but on no ledger entry"
    assert got[1].startswith(f"the configuration's fingerprint "
                             f"{second_shell.fingerprint()[:12]} is on no ledger entry "
                             f"(the ledger has {RAN.fingerprint()[:12]})")
    assert got[2] == "start_ms differs from the ledger's for signups"


def test_another_key_and_other_parameters_are_named() -> None:
    other = NoiseKey(b"\x22" * 32)
    got = ledger_mismatch(RAN, other, ledger(RAN), NOW)
    assert got == [f"the noise key (fingerprint {other.fingerprint()}) is not the ledger's "
                   f"({KEY.fingerprint()})"]
    eps = dataclasses.replace(RAN, epsilon=2.0)
    got = ledger_mismatch(eps, KEY, ledger(RAN), NOW)
    assert got[1:] == ["epsilon differs from the ledger's for signups"]
    # Control: a counter that keeps its stored parameters on purpose.
    kept = ledger(RAN, parameters="stored") + ledger(eps, parameters="stored")
    assert ledger_mismatch(eps, KEY, kept, NOW) == []


def test_the_verdict_and_exit_code_put_the_configuration_first() -> None:
    """A mismatch is the verdict (nothing recomputed): its first line names it, JSON says
    configuration_differs, the exit code is 3. Controls: no mismatch and no difference is
    identical; no mismatch with a difference is DIFFERENT (exit 1)."""
    from processor.stream.replay import cli

    diff = Difference("counts", ("signups", 5, "change"), "missing", "due, not published")
    report = ReplayReport(0, 0, Tally(), Tally(), {0: (1, 1)}, [], ["counters x ..."])
    assert report.summary().startswith("CONFIGURATION DIFFERS from the ledger's: counters x")
    assert "Nothing was recomputed" in report.summary() and not report.identical
    assert report.to_json()["verdict"] == "configuration_differs"
    assert orjson.loads(orjson.dumps(report.to_json()))["configuration"] == ["counters x ..."]
    assert ReplayReport(10, 0, Tally(), Tally(), {}, []).summary().startswith("identical")
    plain = ReplayReport(10, 0, Tally(), Tally(), {}, [diff])
    assert plain.summary().startswith("DIFFERENT") and not plain.configuration_differs
    assert cli.EXIT_CONFIGURATION == 3


def test_entries_appended_to_the_ledger_are_no_configuration_mismatch() -> None:
    """A forgery appends: an entry for a counter nobody configured, one under another
    fingerprint, key or epsilon for a configured counter. None of them makes a mismatch
    (each check is an absence), so replay goes on to report them as differences."""
    forged = dataclasses.replace(RAN, counters={**RAN.counters, "forged": NOW - 60_000},
                                 epsilon=9.0)
    appended = ledger(RAN) + ledger(forged, NoiseKey(b"\x33" * 32))
    assert ledger_mismatch(RAN, KEY, appended, NOW) == []
