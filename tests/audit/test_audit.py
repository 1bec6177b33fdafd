"""The empirical privacy audit (processor/audit/) and its controls.

False-alarm rates. Every verdict below is a test at alpha = 0.05: for a correct
(eps, delta)-DP mechanism P(some bound > eps) <= 0.05 (alpha/2 per bound), plus 0.001 for
the noise-law (Kolmogorov-Smirnov) check where it runs. Seeds are fixed, so each outcome
is deterministic; the rates say how likely a different seed would be to flip a PASS.

Controls (each must FAIL), built here by subclassing or by injecting simulator parameters,
never in processor/core: BaseCC and PartitionCC (private for swaps only), GaussianCC with
its noise divided by 20, a SimECC that releases its true block sums, and an ECC whose SVT
noise is halved (caught by the partition law check: no bound on ECC's releases can catch
it, see docs/audit.md). The correct ECC, SimECC and GaussianCC must PASS with a lower
bound above 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from processor.audit.diagnostics import advantage, ecc_partition_check, section8_guess
from processor.audit.plans import default_streams, make_streams, plan_for
from processor.audit.runs import (
    audit,
    cc_noise_cov,
    core_releases,
    increment_weights,
    insertion_neighbour,
)
from processor.audit.statistics import (
    NO_RELEASE,
    AuditError,
    attainable_bound,
    check_spread,
    clopper_pearson,
    empirical_bound,
    judge,
    known_null_bound,
    null_law_check,
)
from processor.commands.audit import core_backend, run_audit, sim_backend
from processor.core.api import Counter
from processor.core.baselines import GaussianCC, gaussiancc_sigma2_units
from processor.core.calibration import gdp_mu
from processor.core.cc import cc_sigma
from processor.core.ecc import ECC, SimECC
from processor.core.grid import UNIT
from processor.core.partition import Part, part_tau
from processor.core.rng import NoiseKey
from processor.core.samplers.scalar import discrete_gaussian
from processor.core.svt import SVT

ALPHA = 0.05
DELTA = 1e-6


# --------------------------------------------------------------------- statistics


def test_clopper_pearson_closed_forms() -> None:
    lo, hi = clopper_pearson(0, 10, 0.05)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 10))
    lo, hi = clopper_pearson(10, 10, 0.05)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 10))
    lo, hi = clopper_pearson(30, 100, 0.05)
    assert lo < 0.3 < hi and (lo, hi) == pytest.approx((0.2124, 0.3998), abs=1e-3)
    with pytest.raises(ValueError):
        clopper_pearson(3, 2, 0.05)


def test_insertion_neighbour_and_streams() -> None:
    x = [1.0, None, 0.5, 1.0, None, 1.0]
    assert insertion_neighbour(x, 1) == [1.0, 1.0, 0.5, 1.0, None, 1.0]  # ⊥ at 2 absorbs
    assert insertion_neighbour(x, 3, 0.25) == [1.0, None, 0.25, 0.5, 1.0, 1.0]
    assert insertion_neighbour([1.0, 1.0], 1) == [1.0, 1.0]  # no ⊥: last event falls off
    x0, x1 = make_streams("alternating", 4, 2)
    assert x0 == [1.0, 0.0, 1.0, 0.0, None, None]
    assert x1 == [1.0, 1.0, 0.0, 1.0, 0.0, None]
    assert make_streams("empty", 2, 1) == ([None] * 3, [1.0, None, None])


def test_empirical_bound_on_randomised_response() -> None:
    """Randomised response with ratio exactly e^1: bound <= 1 (5% false-alarm check); with
    ratio e^3 the same audit at configured eps = 1 fails (power); the bound never exceeds
    what the run count allows."""
    rng = np.random.default_rng(41)
    n = 4000
    for true_eps, expect_pass in ((1.0, True), (3.0, False)):
        p0 = math.exp(true_eps) / (1 + math.exp(true_eps))
        f0 = (rng.random(n) < p0).astype(float)
        f1 = (rng.random(n) < 1 - p0).astype(float)
        r = judge(f0, f1, eps=1.0, delta=0.0, alpha=ALPHA)
        assert r.passed is expect_pass, r
        assert r.eps_lb <= true_eps
        assert r.eps_lb <= r.attainable


def test_empirical_bound_is_not_capped_by_a_binary_outcome() -> None:
    """A perfectly separated continuous score reaches the run-count limit, far above what a
    midpoint test on a coin's worth of information gives."""
    rng = np.random.default_rng(5)
    s0, s1 = rng.normal(0, 1, 4000), rng.normal(12, 1, 4000)
    b = empirical_bound(s0, s1, DELTA, ALPHA)
    cap = attainable_bound(2000, DELTA, ALPHA)
    assert cap - 0.05 < b.eps_lb <= cap and b.eps_lb > 6.0


@pytest.mark.parametrize(("eps", "factor"), [(0.5, 4.0), (2.0, 2.5), (8.0, 2.0)])
def test_known_null_bound_on_exact_gaussian_dp(eps: float, factor: float) -> None:
    """Scores N(0,1) vs N(mu,1) with mu the GDP parameter of (eps, delta) are exactly
    (eps, delta)-DP: the bound stays below eps (false alarm <= alpha/2), and at eps = 8 it
    sees more than half of it from 2000 estimation runs. With factor * mu the pair is far
    from (eps, delta)-DP and the bound exceeds eps (power)."""
    rng = np.random.default_rng(7)
    mu = float(gdp_mu(eps, DELTA))
    ok = known_null_bound(rng.normal(mu, 1, 4000), DELTA, ALPHA)
    assert ok.eps_lb <= eps, ok
    if eps >= 8:
        assert ok.eps_lb > 0.5 * eps, ok
    bad = known_null_bound(rng.normal(factor * mu, 1, 4000), DELTA, ALPHA)
    assert bad.eps_lb > eps, bad


def test_constant_score_fails_loudly() -> None:
    with pytest.raises(AuditError, match="constant"):
        check_spread(np.zeros(10), np.zeros(10))
    with pytest.raises(AuditError, match="constant"):
        judge(np.ones(10), np.ones(10), eps=1.0, delta=DELTA)


def test_release_score_of_a_silent_run_is_below_every_threshold() -> None:
    """PartitionCC's score over its releases: a run without any release gets NO_RELEASE
    (conservative for both known-null events) and the noise-law check leaves it out."""
    x0, x1 = make_streams("alternating", 30, 1)
    plan = plan_for("partitioncc", 20.0, DELTA, x0, x1, "lr")
    y = np.zeros((3, len(x0)))
    y[1, 10:] = 5.0
    y[2, 4:] = 1.5
    y[2, 20:] = 9.0
    z = plan.score(y)
    assert z[0] == NO_RELEASE and np.all(np.isfinite(z)) and np.all(z[1:] > NO_RELEASE)
    assert null_law_check(np.concatenate([[NO_RELEASE] * 5, np.linspace(-2, 2, 50)])) > 0.5


def test_cc_covariance_matches_the_core() -> None:
    """The law the known-null bound relies on: diagonal = the core's exact cc_sigma^2; the
    off-diagonal structure is checked against the core's releases by the KS tests below."""
    cov = cc_noise_cov(1.0, DELTA, 40)
    want = [(cc_sigma(1.0, DELTA, t, "tree") / UNIT) ** 2 for t in range(1, 41)]
    assert np.allclose(np.diag(cov), want, rtol=1e-12)
    assert np.allclose(cov, cov.T) and np.all(np.linalg.eigvalsh(cov) > 0)


def test_increment_weights_are_the_section8_linear_attack() -> None:
    x0, x1 = make_streams("alternating", 6, 1)
    y = np.arange(1.0, 8.0) ** 2
    dx = np.array([a - b for a, b in zip(np.nan_to_num(np.array(x1, float)),
                                         np.nan_to_num(np.array(x0, float)), strict=True)])
    assert float(y @ increment_weights(x0, x1)) == pytest.approx(
        float(np.diff(y, prepend=0.0) @ dx))


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


# --------------------------------------------------------------------- broken variants


class QuietGaussianCC(GaussianCC):
    """Control: GaussianCC with its noise divided by 20 (sigma^2 / 400)."""

    def _step(self, u: int) -> int:
        num, den = gaussiancc_sigma2_units(self.eps, self.delta, self._t + 1)
        self._s += u
        return self._s + discrete_gaussian(self._cur, num, den * 400)


class _ExactCC:
    """A CC without noise: the exact running sum of what it is fed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.s = 0

    def step(self, u: int) -> int:
        self.s += u
        return self.s

    def alpha_max(self, beta: float, t: int) -> float:
        return float(self.inner.alpha_max(beta, t))

    def to_state(self) -> dict[str, Any]:
        return dict(self.inner.to_state())


class TrueSumSimECC(SimECC):
    """Control: SimECC releasing its true block sums (the CC on block sums is exact)."""

    def _setup(self, *args: Any) -> None:
        super()._setup(*args)
        self._cc = _ExactCC(self._cc)  # type: ignore[assignment]


class HalfNoiseSVT(SVT):
    """SVT with the Laplace scales of 2 eps (half the noise) and the thresholds of eps."""

    __slots__ = ()

    def __init__(self, eps: float, tau: float, key: NoiseKey, label: str,
                 state: dict[str, Any] | None = None) -> None:
        super().__init__(2 * eps, tau, key, label, state)
        self.eps = eps
        self._b8 = 8.0 / eps
        self._c = math.ceil(12.0 / eps)
        self._g = 8.0 * UNIT / (eps * self._t1)


class HalfNoisePart(Part):
    def _new_svt(self, st: dict[str, Any] | None) -> SVT:
        return HalfNoiseSVT(self.eps_p, part_tau(self.tau, self.l, self.eps_p), self._key,
                            f"{self._label}/svt{self.l}", st)


class HalfNoiseECC(ECC):
    """Control: ECC whose partition draws its SVT noise at half the scale."""

    def _new_part(self, key: NoiseKey, label: str, st: dict[str, Any] | None) -> Part:
        return HalfNoisePart(self._params.eps_part, self._params.tau, key, label, st)


def _core(cls: type[Counter], eps: float, delta: float, seed: int) -> Any:
    key = NoiseKey.from_seed(seed)
    return lambda cid: cls(eps, delta, key, cid)  # type: ignore[call-arg]


# --------------------------------------------------------------------- controls: FAIL


def test_basecc_fails_on_the_core() -> None:
    """BaseCC at eps = 10 on 200 alternating events: the likelihood-ratio score under its
    own (correct) Gaussian law has mean ~4.6 on x'; the known-null bound (15 to 21 over
    seeds) exceeds 10.
    The empirical bound alone could not (200 runs cap it at ~3.1): only a bound that is not
    capped by the number of runs catches a swap-only counter at eps = 10."""
    eps = 10.0
    x0, x1 = make_streams("alternating", 200, 1)
    plan = plan_for("basecc", eps, DELTA, x0, x1, "lr")
    res = run_audit(core_backend("basecc", eps, DELTA, 11, {}), plan, 200, eps=eps,
                    delta=DELTA, alpha=ALPHA)
    assert res.null_law_ok, res  # the core follows the law the score assumes
    assert not res.passed and res.eps_lb > 1.3 * eps, res


def test_basecc_fails_at_eps_1_on_the_simulator() -> None:
    """The same at eps = 1 needs the shift of 2000 events (the score's mean on x' is ~1.3):
    the vectorised simulator (same law as the core, tree base) runs it in about a second."""
    eps = 1.0
    x0, x1 = make_streams("alternating", 2000, 1)
    plan = plan_for("basecc", eps, DELTA, x0, x1, "lr")
    res = run_audit(sim_backend("basecc", eps, DELTA, 12, {}), plan, 1000, eps=eps,
                    delta=DELTA, alpha=ALPHA)
    assert res.null_law_ok and not res.passed and res.eps_lb > 1.5, res


def test_partitioncc_fails_on_the_simulator() -> None:
    """PartitionCC at eps = 20 on 8000 alternating events: releases happen at public block
    ends; the likelihood ratio over its releases (its CC's Gaussian law given the release
    ticks) has mean ~5 on x', and the known-null bound (~24) exceeds 20."""
    eps = 20.0
    x0, x1 = make_streams("alternating", 8000, 1)
    plan = plan_for("partitioncc", eps, DELTA, x0, x1, "lr")
    res = run_audit(sim_backend("partitioncc", eps, DELTA, 13, {}), plan, 400, eps=eps,
                    delta=DELTA, alpha=ALPHA)
    assert res.null_law_ok and not res.passed, res


def test_partitioncc_core_follows_the_law_the_score_assumes() -> None:
    """The known-null bound for PartitionCC stands on its CC's Gaussian law given the
    release ticks; on the core's releases the standardised score on x is N(0, 1)
    (KS at 0.001), and on x' it moves up."""
    eps = 40.0
    x0, x1 = make_streams("alternating", 600, 1)
    plan = plan_for("partitioncc", eps, DELTA, x0, x1, "lr")
    rel = core_backend("partitioncc", eps, DELTA, 14, {})
    z0, z1 = plan.score(rel(x0, 150, "x")), plan.score(rel(x1, 150, "x'"))
    res = judge(z0, z1, eps=eps, delta=DELTA, known_null=True)
    assert res.null_law_ok, res
    assert float(np.mean(z1)) > 2.0


def test_quiet_gaussiancc_fails() -> None:
    """GaussianCC with 1/20 of its noise at eps = 1: the scores separate (empirical bound
    2.7, known-null 2.6) and the noise-law check rejects the standardised scores outright
    (p ~ 1e-57)."""
    eps = 1.0
    x0, x1 = make_streams("empty", 63, 1)
    plan = plan_for("gaussiancc", eps, DELTA, x0, x1, "lr")
    res = audit(_core(QuietGaussianCC, eps, DELTA, 15), plan.x0, plan.x1, 300, eps=eps,
                delta=DELTA, score=plan.score, alpha=ALPHA, known_null=True)
    assert not res.passed and not res.null_law_ok, res
    assert res.bounds[0].eps_lb > 2 * eps, res


def test_true_sum_simecc_fails() -> None:
    """SimECC releasing its true block sums at eps = 3: every release is 0 on x and 1 on x',
    so the scores separate completely and the bound reaches the run-count limit (3.81 with
    400 runs per stream), above 3."""
    eps, delta = 3.0, 1e-3
    x0, x1 = make_streams("empty", 1200, 600)
    plan = plan_for("simecc", eps, delta, x0, x1, "values")
    res = audit(_core(TrueSumSimECC, eps, delta, 16), plan.x0, plan.x1, 400, eps=eps,
                delta=delta, score=plan.score, alpha=ALPHA)
    assert not res.passed and res.eps_lb > eps, res


def test_the_values_score_is_the_configured_calibrations_likelihood_ratio() -> None:
    """The "values" score is the likelihood ratio under the CC law of the counter as
    configured: with calibration="tight" that of the tight (eps, delta) split of its CC.
    Control: the paper split's law scores the same releases differently (the score once
    ignored the calibration)."""
    from processor.audit.plans import _release_lr
    from processor.audit.runs import GaussianLaw, cc_noise_cov, prefix_sums, shift_profile
    from processor.core.params import simecc_parameters

    eps, delta = 3.0, 1e-3
    x0, x1 = make_streams("empty", 300, 150)
    rng = np.random.default_rng(5)
    s0 = prefix_sums(x0)
    # Releases as a counter's: the prefix sum plus noise every 20th tick, held between.
    y = np.zeros((8, 300))
    for r in range(8):
        for t in range(300):
            y[r, t] = (s0[t] + 1000.0 + rng.normal(0.0, 30.0) if t % 20 == 19
                       else y[r, t - 1] if t else 0.0)
    scores = {cal: plan_for("simecc", eps, delta, x0, x1, "values", calibration=cal).score(y)
              for cal in ("paper", "tight")}
    p = simecc_parameters(eps, delta, "tight")
    law = GaussianLaw(cc_noise_cov(p.cc_eps, p.cc_delta, 300))
    expected = _release_lr(law, shift_profile(x0, x1), s0)(y)
    np.testing.assert_allclose(scores["tight"], expected)
    assert not np.allclose(scores["paper"], scores["tight"])


# --------------------------------------------------------------------- correct: PASS


def test_gaussiancc_passes_with_a_tight_bound() -> None:
    """GaussianCC at eps = 10: PASS, and the known-null bound recovers a large part of the
    guarantee (the pair exercises mu ~1.8 of its mu ~1.85)."""
    eps = 10.0
    x0, x1 = make_streams("empty", 63, 1)
    plan = plan_for("gaussiancc", eps, DELTA, x0, x1, "lr")
    res = run_audit(core_backend("gaussiancc", eps, DELTA, 17, {}), plan, 600, eps=eps,
                    delta=DELTA, alpha=ALPHA)
    assert res.passed, res
    assert res.eps_lb > 3.0, res


def test_simecc_passes_with_a_nontrivial_bound() -> None:
    """SimECC at eps = 150 (configured): its releases do depend on the extra event (its
    released values carry it); PASS with a bound above 0.1 (0.23 with this seed)."""
    eps = 150.0
    x0, x1 = make_streams("empty", 200, 200)
    plan = plan_for("simecc", eps, DELTA, x0, x1, "values")
    res = run_audit(core_backend("simecc", eps, DELTA, 18, {}), plan, 1000, eps=eps,
                    delta=DELTA, alpha=ALPHA)
    assert res.passed and res.eps_lb > 0.1, res


def test_simecc_releases_and_passes_at_small_eps() -> None:
    """SimECC at eps = 3 (the same streams as its broken control): the score varies (it
    releases), PASS."""
    eps, delta = 3.0, 1e-3
    x0, x1 = make_streams("empty", 1200, 600)
    plan = plan_for("simecc", eps, delta, x0, x1, "values")
    res = audit(_core(SimECC, eps, delta, 16), plan.x0, plan.x1, 400, eps=eps, delta=delta,
                score=plan.score, alpha=ALPHA)
    assert res.passed, res


def test_ecc_releases_and_passes_on_the_core() -> None:
    """ECC at eps = 150 on 140 alternating events: its partition fires and its first release
    comes before the end in every run (no constant score), PASS."""
    eps = 150.0
    x0, x1 = make_streams("alternating", 140, 60)
    plan = plan_for("ecc", eps, DELTA, x0, x1, "first")
    y0 = core_releases(_core_ecc(eps), x0, 300, "x")
    assert np.all(np.any(y0 != 0.0, axis=1)), "ECC released nothing in some run"
    y1 = core_releases(_core_ecc(eps), x1, 300, "x'")
    res = judge(plan.score(y0), plan.score(y1), eps=eps, delta=DELTA, alpha=ALPHA)
    assert res.passed, res


def _core_ecc(eps: float) -> Any:
    return _core(ECC, eps, DELTA, 19)


def test_ecc_passes_with_a_nontrivial_bound_on_the_simulator() -> None:
    """ECC at eps = 150: the first release comes about one tick earlier on x' (the queued
    event closes the first block sooner; BCC's noise hides most of it). 40,000 simulated
    runs per stream bound eps from below by 0.27 to 0.56 over seeds 0..4; PASS."""
    eps = 150.0
    x0, x1 = make_streams("alternating", 140, 60)
    plan = plan_for("ecc", eps, DELTA, x0, x1, "first")
    res = run_audit(sim_backend("ecc", eps, DELTA, 0, {}), plan, 40000, eps=eps,
                    delta=DELTA, alpha=ALPHA)
    assert res.passed and res.eps_lb > 0.15, res


def test_default_streams_let_ecc_and_simecc_release() -> None:
    """The command's default streams are sized from (eps, delta): with them ECC's partition
    fires and the first release lands before the end in every run (Part at 0.99, BCC delay
    at 0.999 per run: 20 runs all release with probability > 0.8); SimECC releases too."""
    eps = 150.0
    for name in ("ecc", "simecc"):
        pattern, events, gap, _ = default_streams(name, eps, DELTA)
        x0, _x1 = make_streams(pattern, events, gap)
        y = core_releases(_core_ecc(eps) if name == "ecc" else _core(SimECC, eps, DELTA, 21),
                          x0, 20, name)
        assert np.all(np.any(y != 0.0, axis=1)), name
    n = [default_streams("basecc", e, DELTA)[1] for e in (0.5, 1.0, 10.0)]
    assert n[0] > n[1] > n[2] >= 200


def test_ecc_with_too_few_events_is_refused() -> None:
    """With 40 events ECC's partition (threshold ~55 events at eps = 150) never fires: the
    score is constant and the audit says so instead of passing."""
    eps = 150.0
    x0, x1 = make_streams("alternating", 40, 20)
    plan = plan_for("ecc", eps, DELTA, x0, x1, "first")
    with pytest.raises(AuditError, match="constant"):
        audit(_core_ecc(eps), x0, x1, 20, eps=eps, delta=DELTA, score=plan.score)


@pytest.mark.parametrize("eps", [150.0, 20.0])
def test_ecc_with_halved_svt_noise_fails(eps: float) -> None:
    """ECC whose Part has half its SVT noise. Its releases do not give it away: the bound on
    the first release (the timing channel) stays far below eps, as for the correct ECC;
    halving the noise only doubles the partition's share of the loss, which is far below
    eps on any pair of streams an audit can run. The partition's law check does: every SVT
    instance's gap of 300 fresh Parts against Algorithm 1's law (windowed KS, 0.001 in
    all) rejects the broken one and accepts the correct one."""
    x0, x1 = make_streams("alternating", 140, 60)
    if eps == 150.0:
        plan = plan_for("ecc", eps, DELTA, x0, x1, "first")
        res = audit(_core(HalfNoiseECC, eps, DELTA, 22), x0, x1, 300, eps=eps, delta=DELTA,
                    score=plan.score, alpha=ALPHA)
        assert res.eps_lb <= eps  # the releases alone cannot fail it
    key = NoiseKey.from_seed(23)
    broken = ecc_partition_check(lambda c: HalfNoiseECC(eps, DELTA, key, c)._part, eps,
                                 DELTA, 300, seed=1).p_value
    good = ecc_partition_check(lambda c: ECC(eps, DELTA, key, c)._part, eps, DELTA, 300,
                               seed=1).p_value
    assert broken < 1e-3 <= good, (broken, good)
