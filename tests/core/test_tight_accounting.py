"""The tight calibration's exact accounting (processor/core/tight.py).

Every plan is recomputed from the parameters it hands to the partition and the counters
(`account`), and its delivered (eps, delta) must meet the target; the Gaussian term is
checked a second time against the 120-digit discrete Gaussian delta at the same
one-dimensional lattice equivalent. Controls: plans that charge CC for one step instead of
Observation 4.13's four, or skip the clamp term, or give SimPart a smaller mu, are
rejected by the same computation. No randomness here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from fractions import Fraction

import pytest

from processor.core import tight
from processor.core.calibration import discrete_gaussian_delta, gaussian_delta
from processor.core.ecc import ECC, SimECC
from processor.core.errors import InvalidParameterError
from processor.core.params import ecc_parameters, simecc_parameters
from processor.core.partition import simpart_scale
from processor.core.rng import NoiseKey

EPS = (0.1, 1.43, 10.0, 150.0)
DELTAS = (1e-5, 1e-9)


@pytest.mark.parametrize("mechanism", tight.MECHANISMS)
@pytest.mark.parametrize("eps", EPS)
@pytest.mark.parametrize("delta", DELTAS)
def test_delivered_guarantee_meets_the_target(mechanism: str, eps: float, delta: float) -> None:
    plan = tight.tight_plan(mechanism, eps, delta)
    acc = tight.account(plan)
    assert acc.eps_total <= eps * (1 + 1e-15)
    assert acc.delta_total <= delta
    # every term of the final inequality is accounted for and positive
    assert 0 < acc.delta_part < delta and 0 < acc.delta_gauss < delta and acc.eta > 0
    assert acc.mu_total == pytest.approx(math.hypot(4 * acc.mu_cc, 2 * acc.mu_bcc))
    # the 120-digit discrete delta of the lattice equivalent stays below what was charged
    sigma, shift = tight.lattice_equivalent(plan, acc.mu_total)
    exact = discrete_gaussian_delta(Fraction(sigma) ** 2, acc.gauss_eps, shift)
    assert float(exact) <= acc.delta_gauss + acc.excess
    # and the charged continuous part is the GDP profile at mu >= mu_total
    assert shift / sigma >= acc.mu_total
    assert acc.delta_gauss >= gaussian_delta(1.0, acc.gauss_eps, acc.mu_total)


@pytest.mark.parametrize("eps", EPS)
def test_tight_adds_less_noise_than_the_paper(eps: float) -> None:
    """The point of it: SimECC's CC and BCC carry more signal per unit of noise (larger GDP
    mu per step) than with the paper's group-privacy constants, and its mean gap is
    smaller. ECC's Part costs 17/3 eps_p, so its plan buys a lower threshold and a less
    noisy BCC with some of CC's budget: only those two are compared."""
    d = 1e-5
    paper, tt = simecc_parameters(eps, d), simecc_parameters(eps, d, "tight")
    assert tight.cc_mu(tt.cc_eps, tt.cc_delta) > tight.cc_mu(paper.cc_eps, paper.cc_delta)
    assert tight.bcc_mu(tt.bcc_eps, tt.bcc_delta) > tight.bcc_mu(paper.bcc_eps, paper.bcc_delta)
    assert tt.mu < paper.mu
    ep, et = ecc_parameters(eps, d), ecc_parameters(eps, d, "tight")
    assert tight.bcc_mu(et.bcc_eps, et.bcc_delta) > tight.bcc_mu(ep.bcc_eps, ep.bcc_delta)
    assert et.tau < ep.tau


def test_origin_of_408_and_102() -> None:
    """Part's tau - 1 = 8 ln(pi^2/(2 delta)) / eps_p and SimPart's mu - 3 = 2 ln(...) / eps_p
    with eps_p = eps / 51: the 8 and the 2 are the exponents of Lemmas 4.14 and 6.2."""
    eps, delta = 1.0, 1e-6
    p = ecc_parameters(eps, delta)
    assert p.tau - 1 == pytest.approx(8 * math.log(math.pi**2 / (2 * delta)) / p.eps_part)
    q = simecc_parameters(eps, delta)
    assert q.mu - 3 == math.ceil(2 * math.log(2 * math.pi**2 / (3 * delta)) / q.eps_part)
    # Lemma 4.14's bound at the paper's tau is delta/2, as Theorem 4.8 uses it
    assert tight.part_bad(p.eps_part, p.tau) == pytest.approx(delta / 2)


def test_simpart_bad_event_bound_against_a_direct_sum() -> None:
    """simpart_bad bounds sum_l Pr[Z_l <= 2 - mu - ceil(4 ln(l)/eps_p)] for the core's DLap
    (rounded-up scale): compared with the sum over the first 10^5 instances."""
    eps_p, mu = 0.5, 20
    t, s = simpart_scale(eps_p)
    r = math.exp(-s / t)
    direct = sum(r ** (mu - 2 + math.ceil(4 * math.log(l) / eps_p)) / (1 + r)
                 for l in range(1, 100_001))  # noqa: E741
    bound = tight.simpart_bad(eps_p, mu)
    assert direct <= bound <= direct * 1.05


def test_controls_are_rejected_by_the_accounting() -> None:
    """Plans a wrong analysis would produce must fail the same computation."""
    eps, delta = 10.0, 1e-5
    plan = tight.tight_plan("simecc", eps, delta)
    # CC charged for one step instead of four: its noise a quarter of what is needed
    e4, d4 = tight._cc_for(4 * tight.cc_mu(plan.cc_eps, plan.cc_delta), plan.cc_delta)
    assert tight.account(dataclasses.replace(plan, cc_eps=e4, cc_delta=d4)).delta_total > delta
    # BCC's clamp paid at BCC's own eps (the paper's Lemma 3.13) instead of the joint eps
    acc = tight.account(plan)
    ok_eta = acc.eta * (1 + math.exp(acc.gauss_eps)) / (1 + math.exp(plan.bcc_eps))
    e_b, d_b = tight._bcc_for(acc.mu_bcc, ok_eta)
    assert tight.account(dataclasses.replace(plan, bcc_eps=e_b, bcc_delta=d_b)).delta_total > delta
    # SimPart's mean gap smaller than its bad event allows
    assert tight.account(dataclasses.replace(plan, part_param=plan.part_param - 3)
                         ).delta_total > delta
    # Part's partition loss 17/3 eps_p (Lemma 4.14) charged as SimPart's eps_p
    ecc_plan = tight.tight_plan("ecc", eps, delta)
    assert tight.account(dataclasses.replace(ecc_plan, mechanism="simecc",
                                             part_param=3.0)).delta_total > delta


def test_refusals() -> None:
    with pytest.raises(InvalidParameterError, match="paper, tight"):
        tight.check_calibration("loose")
    with pytest.raises(InvalidParameterError, match="covers ecc, simecc"):
        tight.tight_plan("gaussiancc", 1.0, 1e-6)
    with pytest.raises(InvalidParameterError):
        tight.tight_plan("simecc", -1.0, 1e-6)
    with pytest.raises(InvalidParameterError, match="calibration"):
        SimECC(1.0, 1e-6, NoiseKey.from_seed(1), "c", calibration="Tight")
    with pytest.raises(InvalidParameterError, match="calibration"):
        ECC(1.0, 1e-6, NoiseKey.from_seed(1), "c", calibration=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("mechanism", tight.MECHANISMS)
def test_edges_of_the_parameter_range(mechanism: str) -> None:
    """Tiny eps with a large delta (the counters' delta and eta are capped below mu / 4 so
    the plan stays reachable) still meet the target; an eps whose clamp probability
    underflows is refused with a typed error naming it."""
    for eps, delta in ((1e-3, 0.5), (0.01, 0.1), (1e-3, 1e-12), (600.0, 1e-6)):
        assert tight.account(tight.tight_plan(mechanism, eps, delta)).delta_total <= delta
    with pytest.raises(InvalidParameterError, match="too large for the tight calibration"):
        tight.tight_plan(mechanism, 800.0, 1e-6)


def _simpart_law(eps_p: float, mu: int, horizon: int) -> Callable[[tuple[int, ...]], float]:
    """Pr[SimPart(T) = t_1:k] from Algorithm 5 at the core's rounded-up DLap scale."""
    t_s, s_s = simpart_scale(eps_p)
    r = math.exp(-s_s / t_s)

    def pmf(z: int) -> float:
        return (1 - r) / (1 + r) * r ** abs(z)

    def cdf_le(z: int) -> float:  # Pr[Z <= z]
        return 1 - r ** (z + 1) / (1 + r) if z >= 0 else r ** (-z) / (1 + r)

    def gap_pmf(l: int, g: int) -> float:  # noqa: E741
        base = mu + math.ceil(4 * math.log(l) / eps_p)
        return cdf_le(1 - base) if g == 1 else pmf(g - base)

    def law(ts: tuple[int, ...]) -> float:
        p, prev = 1.0, 0
        for l, t in enumerate(ts, start=1):  # noqa: E741
            p *= gap_pmf(l, t - prev)
            prev = t
        last = len(ts) + 1
        p *= sum(gap_pmf(last, g) for g in range(horizon - prev + 1, horizon + 60))
        return p

    return law


def test_simpart_loss_is_eps_p_as_the_proof_of_lemma_6_2_shows() -> None:
    """Exhaustively for T = 16: for every checkpoint sequence with gaps >= 3 (C_T^++), every
    insertion step i and absorbing step j, both directions of Definition 4.10, the exact
    ratio Pr[SimPart = t] / Pr[SimPart = f(t)] is at most e^(eps_p) (the proof of Lemma 6.2;
    the lemma states e^(2 eps_p)), and e^(eps_p) is nearly attained: the tight plan's a."""
    eps_p, mu, horizon = 1.0, 4, 16
    law = _simpart_law(eps_p, mu, horizon)

    def sequences(prev: int) -> list[tuple[int, ...]]:
        out: list[tuple[int, ...]] = [()]
        for t in range(prev + 3, horizon + 1):
            out += [(t, *rest) for rest in sequences(t)]
        return out

    worst = 0.0
    for ts in sequences(0):
        if not ts:
            continue
        full = (*ts, horizon + 1)
        for i in range(1, horizon + 1):
            for j in range(i, horizon + 2):
                p = next(n for n, t in enumerate(full) if i <= t)   # 0-based: t_{p-1} < i <= t_p
                q = next(n for n, t in enumerate(full) if j <= t)
                if p >= q - 2:
                    continue
                for sign in (-1, 1):
                    mapped = (*ts[:p + 1], *(t + sign for t in ts[p + 1:q - 1]), *ts[q - 1:])
                    worst = max(worst, law(ts) / law(mapped))
    assert worst <= math.exp(eps_p) * (1 + 1e-12)
    assert worst > math.exp(0.9 * eps_p)


@pytest.mark.parametrize("eps", (1.43, 150.0))
def test_the_counters_noise_is_at_least_what_the_accounting_assumes(eps: float) -> None:
    """Step 3's premise on the counters as built: the whitened shift of one 1-step change
    of UnboundedCC's input (its interval sum and the Gaussian tree of the running interval,
    at every horizon up to 2^20) is at most cc_mu, computed from the core's actual lattice
    sigmas (rounded-up sigma^2 in units^2); the same for BCC's inner counter. Control: 10%
    less noise would exceed it (the bound is tight, not vacuous)."""
    from processor.core.bounded import gaussian_sigma2, tree_levels, tree_node_sigma2
    from processor.core.grid import UNIT

    plan = tight.tight_plan("simecc", eps, 1e-5)
    for e, d, mu in ((plan.cc_eps, plan.cc_delta, tight.cc_mu(plan.cc_eps, plan.cc_delta)),
                     (plan.bcc_eps, plan.bcc_delta / 2,
                      tight.bcc_mu(plan.bcc_eps, plan.bcc_delta))):
        num, den = gaussian_sigma2(e / 2, d / 2, float(UNIT))
        psum = UNIT * UNIT * den / num
        for k in range(1, 21):
            horizon = (1 << k) - 1
            tn, td = tree_node_sigma2(e / 2, d / 2, horizon, UNIT)
            tree = tree_levels(horizon) * UNIT * UNIT * td / tn
            assert math.sqrt(psum + tree) <= mu
            # control: the same counter with 10% less noise would not be
            assert math.sqrt(psum + tree) / 0.9 > mu
