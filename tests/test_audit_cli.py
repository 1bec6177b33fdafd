"""The audit command's shift feature: the matched filter must separate the two streams
when the release is exact, and the command must fail (exit 1) when an attacker wins."""

from __future__ import annotations

import pytest

from processor.audit_cli import main_audit, shift_feature
from processor.core import registry
from processor.core.audit import insertion_neighbour, run_transcript
from tests.test_offline import ExactCounter


def test_shift_feature_separates_exact_releases() -> None:
    x0: list[float | None] = [1.0, 0.0] * 20 + [None] * 3
    x1 = insertion_neighbour(x0, 1)
    f = shift_feature(x0, x1)
    assert f(run_transcript(ExactCounter(), x1), len(x1)) is True
    assert f(run_transcript(ExactCounter(), x0), len(x0)) is False


def test_audit_command_fails_a_non_private_counter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control for the command: with no noise at all the shift is seen in every run, the
    Clopper-Pearson bound exceeds eps, and the command exits 1."""
    monkeypatch.setattr(registry, "make", lambda *a, **k: ExactCounter())
    rc = main_audit(["--mechanism", "basecc", "--epsilon", "1", "--delta", "1e-6",
                     "--runs", "200", "--events", "40", "--gap", "3"])
    assert rc == 1


def test_audit_command_passes_simecc() -> None:
    """SimECC at eps = 2: the bound stays below eps (false-alarm rate alpha = 0.05, fixed seed)."""
    rc = main_audit(["--mechanism", "simecc", "--epsilon", "2", "--delta", "1e-3",
                     "--runs", "200", "--events", "40", "--gap", "3"])
    assert rc == 0
