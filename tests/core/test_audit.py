"""The empirical privacy audit (processor/core/audit.py).

Every audit is run with alpha = 0.05: for a correct (eps, delta)-DP mechanism,
P(eps_lb > eps) <= 0.05 (false-alarm rate 5%; fixed seeds make each outcome deterministic).
The control that shows the audit has power: a broken SimECC that releases the true sum at
its checkpoints must get eps_lb > eps on the same streams.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from processor.core.audit import (
    advantage,
    audit,
    bucketed,
    clopper_pearson,
    eps_lower_bound,
    final_value,
    insertion_neighbour,
    section8_guess,
)
from processor.core.ecc import ECC, SimECC
from processor.core.rng import NoiseKey

ALPHA = 0.05


def test_clopper_pearson_closed_forms() -> None:
    lo, hi = clopper_pearson(0, 10, 0.05)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 10))
    lo, hi = clopper_pearson(10, 10, 0.05)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 10))
    lo, hi = clopper_pearson(30, 100, 0.05)
    assert lo < 0.3 < hi and (lo, hi) == pytest.approx((0.2124, 0.3998), abs=1e-3)
    with pytest.raises(ValueError):
        clopper_pearson(3, 2, 0.05)


def test_insertion_neighbour() -> None:
    x = [1.0, None, 0.5, 1.0, None, 1.0]
    assert insertion_neighbour(x, 1) == [1.0, 1.0, 0.5, 1.0, None, 1.0]  # ⊥ at 2 absorbs
    assert insertion_neighbour(x, 3, 0.25) == [1.0, None, 0.25, 0.5, 1.0, 1.0]
    assert insertion_neighbour([1.0, 1.0], 1) == [1.0, 1.0]  # no ⊥: last event falls off


def test_bucketed_feature() -> None:
    f = bucketed(final_value, 5.0)
    assert f([(3, 12.5), (9, 17.25)], 10) == 15.0 and f([], 10) == 0.0


def test_eps_lower_bound_on_known_distributions() -> None:
    """Randomised response with ratio exactly e^1: eps_lb <= 1 (a 5% false-alarm check);
    with ratio e^3 the same audit at configured eps = 1 finds eps_lb > 1 (power)."""
    rng = np.random.default_rng(41)
    n = 4000
    for true_eps, expect_pass in ((1.0, True), (3.0, False)):
        p0 = math.exp(true_eps) / (1 + math.exp(true_eps))
        f0: list[Any] = [int(v) for v in rng.random(n) < p0]
        f1: list[Any] = [int(v) for v in rng.random(n) < 1 - p0]
        r = eps_lower_bound(f0, f1, 0.0, ALPHA, eps=1.0)
        assert r.passed is expect_pass
        assert r.eps_lb <= true_eps


class _ExactCC:
    """Broken CC for the control: the exact running sum (no noise at all)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.s = 0

    def step(self, u: int) -> int:
        self.s += u
        return self.s

    def alpha(self, beta: float, t: int) -> float:
        return float(self.inner.alpha(beta, t))

    def to_state(self) -> dict[str, Any]:
        return dict(self.inner.to_state())


class BrokenSimECC(SimECC):
    """SimECC releasing the true prefix sum at its checkpoints: not private."""

    def _setup(self, *args: Any) -> None:
        super()._setup(*args)
        self._cc = _ExactCC(self._cc)  # type: ignore[assignment]


SIM_EPS, SIM_DELTA = 4.0, 1e-3
X1 = [1.0] * 20 + [None] * 600
X0 = insertion_neighbour(X1, 1)


def test_simecc_audit_passes_and_broken_variant_fails() -> None:
    key = NoiseKey.from_seed(42)
    ok = audit(lambda cid: SimECC(SIM_EPS, SIM_DELTA, key, cid), X0, X1, 150,
               eps=SIM_EPS, delta=SIM_DELTA, feature=final_value, alpha=ALPHA)
    assert ok.passed, ok
    bad = audit(lambda cid: BrokenSimECC(SIM_EPS, SIM_DELTA, key, cid), X0, X1, 1000,
                eps=SIM_EPS, delta=SIM_DELTA, feature=final_value, alpha=ALPHA)
    assert not bad.passed and bad.eps_lb > SIM_EPS, bad


def test_ecc_audit_passes() -> None:
    """ECC at eps = 8, delta = 0.1 (threshold ~200 events, so the stream carries 230)."""
    eps, delta = 8.0, 0.1
    key = NoiseKey.from_seed(43)
    x1 = [1.0] * 230 + [None] * 200
    r = audit(lambda cid: ECC(eps, delta, key, cid), insertion_neighbour(x1, 1), x1, 120,
              eps=eps, delta=delta, feature=final_value, alpha=ALPHA)
    assert r.passed, r


def test_section8_attack_helper() -> None:
    """On noiseless releases the attack recovers the shift almost always; on releases that
    ignore the input (the control) its advantage is near 0."""
    rng = np.random.default_rng(44)
    T = 200
    p = np.where((np.arange(T) // 10) % 2 == 0, 0.1, 0.9)
    correct = correct_noise = 0
    trials = 300
    for _ in range(trials):
        b = int(rng.integers(0, 2))
        x = (rng.random(T) < p).astype(float)
        xb = np.concatenate([[1.0], x[:-1]]) if b else x
        correct += section8_guess(p, np.cumsum(xb)) == b
        correct_noise += section8_guess(p, np.cumsum(rng.random(T) < 0.5)) == b
    adv, lo, _ = advantage(correct, trials)
    assert adv > 0.9 and lo > 0.8
    adv0, lo0, hi0 = advantage(correct_noise, trials)
    assert lo0 < 0 < hi0 and abs(adv0) < 0.25
