"""The per-unit derivation (processor/core/unit.py, docs/privacy-unit.md).

Deterministic (no sampling, so no false-alarm rate): the derived per-event parameters are
recomputed independently (direct summation of the group-privacy sum with math.fsum, and
Google's dp-accounting library: its privacy-loss-distribution accountant composes the m
counters, and its Laplace mechanism at sensitivity k is the exact k-event loss of the pure
part). Controls: derivations that forget the k events (eps_unit / m) or the e^(i eps)
growth of delta (delta_unit / (m k)) are rejected by the same independent checks.
"""

from __future__ import annotations

import math

import pytest
from dp_accounting.pld import common
from dp_accounting.pld import privacy_loss_distribution as pld

from processor.core import unit
from processor.core.errors import InvalidParameterError

TARGETS = [
    (1.0, 1e-6, 1, 1), (1.0, 1e-6, 3, 1), (1.0, 1e-6, 3, 2), (4.0, 1e-5, 5, 4),
    (10.0, 1e-5, 10, 3), (150.0, 1e-5, 3, 2), (0.1, 1e-9, 2, 7), (600.0, 1e-6, 2, 1),
    (8.0, 1e-6, 100, 10),
]


def _direct_group_delta(eps: float, delta: float, k: int) -> float:
    """delta * sum_{i<k} e^(i eps), summed term by term (independent of log_group_sum)."""
    return delta * math.fsum(math.exp(i * eps) for i in range(k))


def _certified(eps: float, delta: float, k: int, m: int, target_eps: float,
               target_delta: float) -> bool:
    """The independent check: per-event (eps, delta), k events per counter by direct
    summation of Lemma 1, m counters composed by dp-accounting's PLD accountant (tighter
    than basic composition, so a derivation by basic composition must pass it)."""
    ce, cd = k * eps, _direct_group_delta(eps, delta, k)
    if ce * m > target_eps * (1 + 1e-12) or cd >= 1:
        return False
    if m == 1:
        return cd <= target_delta * (1 + 1e-9)
    if m * cd > target_delta * (1 + 1e-12):  # basic composition, recomputed here
        return False
    dist = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(ce, cd))
    # At eps_unit (1 + 1e-3): the PLD rounds each loss up to its 1e-4 grid, which moves the
    # atom at exactly eps_unit above it; the controls fail by far more than that.
    return float(dist.self_compose(m).get_delta_for_epsilon(
        target_eps * (1 + 1e-3))) <= target_delta * (1 + 1e-6)


def _laplace_delta(eps: float, k: int, m: int, target_eps: float) -> float:
    """dp-accounting: m counters whose pure part is a Laplace mechanism calibrated for one
    event at eps, shifted by k events (sensitivity k): the exact hockey stick at the
    target plus the PLD's pessimistic rounding (each of the m losses rounded up to the
    1e-4 grid). Near 0 when k m eps <= target."""
    dist = pld.from_laplace_mechanism(parameter=1.0 / eps, sensitivity=k,
                                      value_discretization_interval=1e-4)
    if m > 1:
        dist = dist.self_compose(m)
    return float(dist.get_delta_for_epsilon(target_eps + 1.01e-4 * m))


@pytest.mark.parametrize("target", TARGETS)
def test_derived_parameters_are_certified_independently(
        target: tuple[float, float, int, int]) -> None:
    e, d, k, m = target
    p = unit.derive(e, d, k, m)
    assert p.delivered_epsilon <= e and p.delivered_delta <= d
    assert _certified(p.event_epsilon, p.event_delta, k, m, e, d)
    # Not needlessly small: within 1e-9 of the target (the derivation is an inversion).
    assert p.event_epsilon * k * m == pytest.approx(e, rel=1e-12)
    assert m * _direct_group_delta(p.event_epsilon, p.event_delta, k) == pytest.approx(
        d, rel=1e-9)
    if k * m * e < 200:  # the Laplace PLD's grid covers the loss range comfortably
        assert _laplace_delta(p.event_epsilon, k, m, e) <= 1e-9


def test_event_mode_is_the_identity() -> None:
    p = unit.derive(1.0, 1e-6, 1, 1)
    assert (p.event_epsilon, p.event_delta) == (1.0, 1e-6)


@pytest.mark.parametrize("target", [t for t in TARGETS if t[2] * t[3] > 1])
def test_control_forgetting_k_is_rejected(target: tuple[float, float, int, int]) -> None:
    """Control: per-event eps = eps_unit / m (k events counted as one)."""
    e, d, k, m = target
    wrong_eps, wrong_delta = e / m, d / m
    assert not _certified(wrong_eps, wrong_delta, k, m, e, d)
    if k > 1 and k * e < 200:
        assert _laplace_delta(wrong_eps, k, m, e) > 1e-3


@pytest.mark.parametrize("target", [t for t in TARGETS if t[2] > 1 and t[0] / t[3] > 0.5])
def test_control_delta_without_group_growth_is_rejected(
        target: tuple[float, float, int, int]) -> None:
    """Control: eps right, delta = delta_unit / (m k) (the e^(i eps) growth ignored)."""
    e, d, k, m = target
    good = unit.derive(e, d, k, m)
    assert not _certified(good.event_epsilon, d / (m * k), k, m, e, d)


def test_group_sum_matches_direct_summation() -> None:
    for k in (1, 2, 3, 10, 1000):
        for eps in (1e-9, 1e-4, 0.01, 0.5, 1.0, 3.0):
            if k * eps > 700:  # e^(k eps) overflows the direct sum
                continue
            direct = math.fsum(math.exp(i * eps) for i in range(k))
            assert math.exp(unit.log_group_sum(k, eps)) == pytest.approx(direct, rel=1e-12)
            assert direct <= k * math.exp((k - 1) * eps) * (1 + 1e-15)  # textbook bound


def test_large_targets_do_not_overflow() -> None:
    p = unit.derive(600.0, 1e-6, 50, 1)
    assert p.event_epsilon == pytest.approx(12.0) and p.event_delta > 0


@pytest.mark.parametrize("bad", [
    (0.0, 1e-6, 1, 1), (math.inf, 1e-6, 1, 1), (1.0, 0.0, 1, 1), (1.0, 1.0, 1, 1),
    (1.0, 1e-6, 0, 1), (1.0, 1e-6, 1, 0), (1.0, 1e-6, True, 1), (1.0, 1e-6, 1.5, 1),
    (1.0, 1e-6, unit.MAX_BOUND + 1, 1), (1.0, 1e-300, 1000, 1000),
])
def test_bad_targets_are_typed_errors(bad: tuple[object, object, object, object]) -> None:
    with pytest.raises(InvalidParameterError):
        unit.derive(*bad)  # type: ignore[arg-type]
