"""`python -m processor audit`: options, the JSON verdict, exit codes.

Each verdict is a test at --alpha 0.05 (false-alarm rate 5% for a correct mechanism, +0.1%
for the noise-law check); seeds are fixed, so the outcomes are deterministic.
"""

from __future__ import annotations

import orjson
import pytest

from processor.audit.plans import DEFAULTS, FEATURES, PATTERNS
from processor.commands import audit as audit_command
from processor.commands.audit import main_audit
from processor.core import registry
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
    assert [b["method"] for b in rep["bounds"]] == ["empirical", "known-null", "exact-pair"]
    assert 0 < rep["eps_lower_bound"] <= 10 and rep["null_law_p"] >= 0.001
    # the pair exercises mu ~1.8 of GaussianCC's ~1.85: its exact profile is just below 10
    assert rep["bounds"][2]["eps_lower_bound"] > 9 and rep["caught_by"] == ""
    assert rep["feature"] == "lr" and rep["pattern"] == "empty"
    assert "audit PASSED" in cap.err


def test_basecc_fails_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case, `--mechanism basecc --epsilon 10`: the known-null bound exceeds
    10 (a capped bound, 3.67, would let it pass)."""
    rc = main_audit(["--mechanism", "basecc", "--epsilon", "10", "--delta", "1e-6",
                     "--runs", "200", "--events", "200", "--json"])
    rep = orjson.loads(capsys.readouterr().out)
    assert rc == 1 and rep["passed"] is False and rep["eps_lower_bound"] > 10


@pytest.mark.parametrize(("backend", "limit", "said"), [("core", 0, True),
                                                         ("core", None, False),
                                                         ("sim", 0, False)])
def test_a_long_core_audit_says_so_before_it_runs(
        backend: str, limit: int | None, said: bool, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A core-backend audit over more ticks than LONG_CORE_TICKS says, before its runs,
    how long it may take and that --backend sim is faster. Controls: the same audit under
    the default limit (200 x 2 x 201 ticks) and on the simulator say nothing of it."""
    if limit is not None:
        monkeypatch.setattr(audit_command, "LONG_CORE_TICKS", limit)
    rc = main_audit(["--mechanism", "basecc", "--epsilon", "10", "--delta", "1e-6",
                     "--runs", "200", "--events", "200", "--backend", backend])
    err = capsys.readouterr().err
    assert rc == 1 and "audit FAILED" in err
    note = ("note: 200 runs of each stream, 201 ticks each: 80,400 ticks on the core backend, "
            "which takes minutes; --backend sim")
    assert (note in err) is said
    if said:
        assert err.index(note) < err.index("audit FAILED")


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


def test_the_tree_at_eps_1_fails(capsys: pytest.CaptureFixture[str]) -> None:
    """`--mechanism tree --epsilon 1 --delta 1e-6 --seed 3` (the tree is not private under
    the queue shift) must fail, caught by the exact-pair bound: the leaf score's exact law
    gives ~9.7 on the default pair (2,000 alternating events); fewer runs than the default
    keep the test short (the exact bound needs none; the law check and the empirical bound
    use them)."""
    rc = main_audit(["--mechanism", "tree", "--epsilon", "1", "--delta", "1e-6",
                     "--seed", "3", "--runs", "150", "--json"])
    cap = capsys.readouterr()
    rep = orjson.loads(cap.out)
    assert rc == 1 and "exact-pair bound" in rep["caught_by"], cap.err
    assert rep["null_law_p"] >= 0.001 and rep["eps_lower_bound"] > 5


def test_partitioncc_fails_at_eps_1(capsys: pytest.CaptureFixture[str]) -> None:
    """PartitionCC at eps = 1 (default stream: 150,000 alternating events, simulator):
    the pair's mu is ~0.33 given the release ticks, whose law the runs sample; the
    exact-pair bound (~1.4) exceeds 1 where the sampling bounds stay below it."""
    rc = main_audit(["--mechanism", "partitioncc", "--epsilon", "1", "--delta", "1e-6",
                     "--backend", "sim", "--runs", "100", "--seed", "4", "--json"])
    cap = capsys.readouterr()
    rep = orjson.loads(cap.out)
    assert rc == 1 and rep["caught_by"] == "exact-pair bound", cap.err


@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_ecc_with_quiet_svt_fails_under_both_calibrations(
        calibration: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """ECC with SVT noise / 4 must fail under either calibration: both the plan check (the
    SVT's scale) and the partition law check catch it (bounds on its releases alone let it
    pass under tight)."""
    from tests.audit.test_audit_power import quiet_ecc

    cls = quiet_ecc(4)
    monkeypatch.setattr(registry, "make", lambda _m, e, d, k, c="", **p: cls(e, d, k, c, **p))
    rc = main_audit(["--mechanism", "ecc", "--epsilon", "150", "--delta", "1e-6",
                     "--calibration", calibration, "--runs", "200"])
    err = capsys.readouterr().err
    assert rc == 1 and "caught by:" in err and "partition law" in err.split("caught by:")[1]


UNIT_ARGS = ["--unit-epsilon", "8", "--unit-delta", "1e-6", "--max-events-per-counter", "8",
             "--runs", "400", "--json"]


def test_per_unit_mode_passes_when_derived_and_fails_when_not(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Per-unit mode (docs/privacy-unit.md): 8 events of one unit inserted; with the
    per-event parameters derived from the unit target (eps 8 / 8 = 1) the audit passes;
    the control, per-event eps = the unit's 8 (not derived), fails, caught by the exact
    unit derivation check AND by the black-box bounds (known-null, exact-pair: the 8
    insertions move GaussianCC's law about 8 times as far). Fixed seed; false-alarm rate
    0.05 + 0.001 for the passing run."""
    rc = main_audit(["--mechanism", "gaussiancc", *UNIT_ARGS])
    rep = orjson.loads(capsys.readouterr().out)
    assert rc == 0 and rep["passed"] is True, rep
    assert rep["epsilon"] == 1.0 and rep["unit"]["claim_epsilon"] == 8.0
    assert [c["check"] for c in rep["checks"]] == ["unit derivation"]
    rc = main_audit(["--mechanism", "gaussiancc", *UNIT_ARGS, "--epsilon", "8",
                     "--delta", "1e-6"])
    rep = orjson.loads(capsys.readouterr().out)
    assert rc == 1 and rep["passed"] is False
    caught = rep["caught_by"].split(", ")
    assert "unit derivation" in caught and "known-null bound" in caught, caught


def test_per_unit_mode_on_simecc_checks_the_derivation(
        capsys: pytest.CaptureFixture[str]) -> None:
    """SimECC (simulator backend): derived parameters pass; eps_unit per event fails on
    the exact derivation check (its black-box bounds cannot reach 8 with 400 runs)."""
    args = ["--mechanism", "simecc", "--backend", "sim", *UNIT_ARGS]
    assert main_audit(args) == 0
    capsys.readouterr()
    assert main_audit([*args, "--epsilon", "8", "--delta", "1e-6"]) == 1
    rep = orjson.loads(capsys.readouterr().out)
    assert "unit derivation" in rep["caught_by"]


def test_per_unit_mode_needs_its_arguments() -> None:
    with pytest.raises(SystemExit) as exc:
        main_audit(["--mechanism", "gaussiancc", "--unit-epsilon", "8"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main_audit(["--mechanism", "gaussiancc"])
