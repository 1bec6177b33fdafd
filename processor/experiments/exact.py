"""Exact advantage of the Section 8 linear attack against an additive Gaussian counter,
and the probability that a finite experiment's Clopper-Pearson reading meets a bound.

For a counter y = s + n whose noise n is Gaussian, independent of the input, with per-tick
standard deviations sigma_t and independent ticks (GaussianCC, Algorithm 6), the statistic
S = c - y . w (attack.weights) is, given the stream fed, N(c - s . w, V) with
V = sum_t sigma_t^2 w_t^2. The stream is random, but s . w = sum_i x_i W_i with
W_i = sum_{t >= i} w_t (= dp_i for i >= 2, and 0 for i = 1), a weighted count of
independent Bernoulli inputs: under b = 0 x_i ~ Bernoulli(p_i), under b = 1 x_1 = 1 and
x_i ~ Bernoulli(p_{i-1}). When every W_i is an integer multiple k_i of one unit u (true of
every Section 8 setting: W_i in {0, +-(high - low)}), s . w = u K with K an integer whose
law is a finite convolution of binomials, so

    advantage = Pr[guess 1 | b = 1] - Pr[guess 1 | b = 0]
              = sum_k (P[K = k | b = 1] - P[K = k | b = 0]) Phi((c - u k - theta) / sqrt(V)),

a finite sum: exact up to float rounding (binomial pmfs from scipy, Phi from
scipy.special.ndtr; about 1e-15 absolute). This is the law the simulator draws (continuous
Gaussian noise with the core's rounded-up sigma_t); the core's discrete Gaussian differs
from it by the 2^-16 grid only.

pass_probability(advantage, runs, bound) is the chance that an experiment of `runs`
independent trials puts its two-sided Clopper-Pearson upper limit on the advantage at or
below `bound`: the number of correct guesses is Binomial(runs, (1 + advantage) / 2), and the
upper limit increases with it, so this is a binomial cdf at the last passing count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr
from scipy.stats import binom

from processor.experiments import attack

FloatArray = npt.NDArray[np.float64]

#: how far W_i / u may be from an integer (float rounding of differences of rates)
_LATTICE_TOL = 1e-9


@dataclass(frozen=True)
class LatticeLaw:
    """The law of K = (s . w) / unit on the integers offset..offset + len(pmf) - 1."""

    unit: float
    offset: int
    pmf: FloatArray


def suffix_weights(rates: FloatArray) -> FloatArray:
    """W_i = sum_{t >= i} w_t, so that s . w = sum_i x_i W_i for s = cumsum(x)."""
    _, w = attack.weights(rates)
    return np.asarray(np.cumsum(w[::-1])[::-1], dtype=np.float64)


def _unit(weights: FloatArray) -> tuple[float, npt.NDArray[np.int64]]:
    nz = np.abs(weights[np.abs(weights) > _LATTICE_TOL])
    if nz.size == 0:
        return 1.0, np.zeros(weights.size, dtype=np.int64)
    unit = float(nz.min())
    k = np.rint(weights / unit)
    if np.max(np.abs(weights / unit - k)) > _LATTICE_TOL:
        raise ValueError("the attack weights are not multiples of one unit; no exact law")
    return unit, k.astype(np.int64)


def _fed_rates(rates: FloatArray, b: int) -> FloatArray:
    """Per-tick Bernoulli rates of the stream fed under challenge bit b."""
    if b == 0:
        return rates.astype(np.float64)
    return np.concatenate(([1.0], rates[:-1])).astype(np.float64)


def statistic_law(rates: FloatArray, b: int) -> LatticeLaw:
    """The exact law of (s(x^(b)) . w) / unit under the Section 8 stream law."""
    unit, k = _unit(suffix_weights(rates))
    fed = _fed_rates(rates, b)
    offset = 0
    pmf = np.ones(1, dtype=np.float64)
    # Group ticks by (multiplier, rate): each group is a binomial count times its multiplier.
    groups: dict[tuple[int, float], int] = {}
    for ki, ri in zip(k.tolist(), fed.tolist(), strict=True):
        if ki != 0:
            groups[(ki, ri)] = groups.get((ki, ri), 0) + 1
    for (ki, ri), n in sorted(groups.items()):
        counts = binom.pmf(np.arange(n + 1), n, ri)
        spread = np.zeros(abs(ki) * n + 1, dtype=np.float64)
        spread[:: abs(ki)] = counts
        if ki < 0:
            spread = spread[::-1]
            offset += ki * n
        pmf = np.convolve(pmf, spread)
    return LatticeLaw(unit, offset, pmf)


def gaussian_advantage(rates: FloatArray, sigmas: FloatArray) -> float:
    """Exact advantage of the linear attack on y = s + N(0, diag(sigmas^2)) (see module)."""
    if sigmas.shape != rates.shape:
        raise ValueError("need one sigma per tick")
    c, w = attack.weights(rates)
    theta = attack.threshold(rates)
    sd = math.sqrt(float(np.sum(sigmas**2 * w**2)))
    law0, law1 = statistic_law(rates, 0), statistic_law(rates, 1)
    lo = min(law0.offset, law1.offset)
    hi = max(law0.offset + law0.pmf.size, law1.offset + law1.pmf.size)
    diff = np.zeros(hi - lo, dtype=np.float64)
    diff[law1.offset - lo: law1.offset - lo + law1.pmf.size] += law1.pmf
    diff[law0.offset - lo: law0.offset - lo + law0.pmf.size] -= law0.pmf
    ks = np.arange(lo, hi, dtype=np.float64)
    guess1 = ndtr((c - law0.unit * ks - theta) / sd)
    return float(np.dot(diff, guess1))


def pass_probability(advantage: float, runs: int, bound: float,
                     confidence: float = 0.95) -> float:
    """P[the Clopper-Pearson upper limit on the advantage from `runs` trials is <= bound]
    when the true advantage is `advantage` (correct guesses ~ Binomial(runs, (1+adv)/2))."""
    if runs < 1 or not -1 <= advantage <= 1:
        raise ValueError("need runs >= 1 and an advantage in [-1, 1]")
    q = (1 + advantage) / 2

    def passes(k: int) -> bool:
        return 2 * attack.clopper_pearson(k, runs, confidence)[1] - 1 <= bound

    if not passes(0):
        return 0.0
    lo, hi = 0, runs  # largest passing k by bisection: the upper limit increases in k
    if passes(hi):
        return 1.0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return float(binom.cdf(lo, runs, q))
