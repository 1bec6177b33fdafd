"""`python -m processor audit`: options, the JSON verdict, exit codes.

Each verdict is a test at --alpha 0.05 (false-alarm rate 5% for a correct mechanism, +0.1%
for the noise-law check); seeds are fixed, so the outcomes are deterministic.
"""

from __future__ import annotations

import orjson
import pytest

from processor.audit_cli import main_audit
from processor.core import registry
from processor.core.audit import DEFAULTS, FEATURES, PATTERNS
from tests.test_offline import ExactCounter


def test_help_documents_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main_audit(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--mechanism", "--epsilon", "--delta", "--runs", "--pattern", "--events",
                "--gap", "--feature", "--horizon", "--backend", "--alpha", "--seed", "--json"):
        assert opt in out
    for word in (*FEATURES, *PATTERNS, *DEFAULTS):
        assert word in out


def test_gaussiancc_passes_with_json_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main_audit(["--mechanism", "gaussiancc", "--epsilon", "10", "--delta", "1e-6",
                     "--runs", "400", "--json"])
    cap = capsys.readouterr()
    rep = orjson.loads(cap.out)
    assert rc == 0 and rep["passed"] is True
    assert [b["method"] for b in rep["bounds"]] == ["empirical", "known-null"]
    assert 0 < rep["eps_lower_bound"] <= 10 and rep["null_law_p"] >= 0.001
    assert rep["feature"] == "lr" and rep["pattern"] == "empty"
    assert "audit PASSED" in cap.err


def test_basecc_fails_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case, `--mechanism basecc --epsilon 10`: the known-null bound exceeds
    10 (it used to pass, capped at 3.67)."""
    rc = main_audit(["--mechanism", "basecc", "--epsilon", "10", "--delta", "1e-6",
                     "--runs", "200", "--events", "200", "--json"])
    rep = orjson.loads(capsys.readouterr().out)
    assert rc == 1 and rep["passed"] is False and rep["eps_lower_bound"] > 10


def test_partitioncc_fails_on_the_simulator_backend(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main_audit(["--mechanism", "partitioncc", "--epsilon", "20", "--delta", "1e-6",
                     "--runs", "300", "--events", "8000", "--backend", "sim", "--json"])
    rep = orjson.loads(capsys.readouterr().out)
    assert rc == 1 and rep["eps_lower_bound"] > 20


def test_a_non_private_counter_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control for the command: no noise at all; the shift is seen in every run."""
    monkeypatch.setattr(registry, "make", lambda *a, **k: ExactCounter())
    rc = main_audit(["--mechanism", "basecc", "--epsilon", "1", "--delta", "1e-6",
                     "--runs", "200", "--events", "40", "--feature", "increments"])
    assert rc == 1


def test_ecc_passes_with_its_partition_law_checked(capsys: pytest.CaptureFixture[str]) -> None:
    """ECC at eps = 150 with the default stream (sized from eps): it releases, the bound is
    below eps, and the partition law check runs and accepts (KS at 0.001)."""
    rc = main_audit(["--mechanism", "ecc", "--epsilon", "150", "--delta", "1e-6",
                     "--runs", "200", "--json"])
    rep = orjson.loads(capsys.readouterr().out)
    assert rc == 0 and rep["passed"] is True and rep["partition_law_p"] >= 0.001
    assert rep["feature"] == "first" and rep["events"] > 140


def test_constant_score_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    """ECC on too few events never releases: exit 2 and a message, never a PASS."""
    rc = main_audit(["--mechanism", "ecc", "--epsilon", "150", "--delta", "1e-6",
                     "--runs", "10", "--events", "20", "--gap", "5"])
    assert rc == 2 and "constant" in capsys.readouterr().err


def test_bad_combinations_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main_audit(["--mechanism", "ecc", "--epsilon", "1", "--delta", "1e-6",
                    "--horizon", "10"])
    assert main_audit(["--mechanism", "ecc", "--epsilon", "1", "--delta", "1e-6",
                       "--feature", "lr", "--runs", "4"]) == 2
    assert "no likelihood-ratio score" in capsys.readouterr().err
