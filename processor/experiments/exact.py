"""Exact advantage of the Section 8 linear attack against an additive Gaussian counter,
and the probability that a finite experiment's Clopper-Pearson reading meets a bound.

For a counter y = s + n whose noise n is Gaussian and independent of the input, the
statistic S = c - y . w (attack.weights) is, given the stream fed, N(c - s . w, V) with
V = Var(n . w): sum_t sigma_t^2 w_t^2 for GaussianCC (Algorithm 6, independent ticks),
and the sum of squared coefficients of n . w over the independent unit normals of the
unbounded CC for BaseCC (basecc_noise_sd). The stream is random, but
s . w = sum_i x_i W_i with W_i = sum_{t >= i} w_t (= dp_i for i >= 2, and 0 for i = 1), a
weighted count of independent Bernoulli inputs: under b = 0 x_i ~ Bernoulli(p_i), under
b = 1 x_1 = 1 and x_i ~ Bernoulli(p_{i-1}). When every W_i is an integer multiple k_i of
one unit u (true of every Section 8 setting: W_i in {0, +-(high - low)}), s . w = u K with
K an integer whose law is a finite convolution of binomials, so

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
from processor.simulator import params
from processor.simulator.simulate import cc_scales

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
    _, w = attack.weights(rates)
    return advantage_given_sd(rates, math.sqrt(float(np.sum(sigmas**2 * w**2))))


def basecc_noise_sd(eps: float, delta: float, rates: FloatArray, base: str = "sqrt") -> float:
    """The standard deviation of n . w for BaseCC's noise n (the simulator's CC, Lemma 3.12,
    with the core's scales; see simulate.cc_noise), exactly.

    n_t = a A_{K(t)} + b_{k(t)} Q_t with every part Gaussian and independent of the input:
    A_K the sum of the first K interval releases' unit normals (K(t) intervals completed at
    t), and Q, inside interval I_k = [2^(k-1), 2^k - 1], the inner counter of horizon
    2^(k-1) - 1 (unit sigma; 0 at the interval's last tick): the causal convolution of unit
    normals with the square-root coefficients c, or the Gaussian tree's node sums. So n . w
    is a fixed linear combination of independent unit normals, and its variance is the sum
    of the squared coefficients.
    """
    _, w = attack.weights(rates)
    n = rates.size
    a, b = cc_scales(eps, delta, n, base)
    t = np.arange(1, n + 1)
    completed = np.array([(v + 1).bit_length() - 1 for v in t.tolist()], dtype=np.int64)
    # Interval release k (1-based) enters every tick with K(t) >= k.
    per_k = np.bincount(completed, weights=w, minlength=int(completed.max()) + 2)
    reach = np.cumsum(per_k[::-1])[::-1]  # reach[k] = sum of w_t over K(t) >= k
    var = a * a * float(np.sum(reach[1:] ** 2))
    k = 1
    while (1 << (k - 1)) <= n:
        start = 1 << (k - 1)
        length = min((1 << k) - 1, n) - start + 1
        inner = min(length, start - 1)
        if inner > 0:
            wk = w[start - 1: start - 1 + inner]
            if base == "tree":
                tau = np.arange(1, inner + 1)
                j = 0
                while (1 << j) <= inner:
                    use = ((tau >> j) & 1).astype(bool)
                    node = np.bincount((tau[use] >> j) - 1, weights=wk[use])
                    var += b[k - 1] ** 2 * float(np.sum(node**2))
                    j += 1
            else:
                c = (params.blt_coeffs(inner) if base == "blt"
                     else params.sqrt_coeffs(inner))
                # the coefficient of z_j is sum_{i >= j} w_i c_{i-j}
                coef = np.correlate(wk, c[:inner], mode="full")[inner - 1:]
                var += b[k - 1] ** 2 * float(np.sum(coef**2))
        k += 1
    return math.sqrt(var)


def advantage_given_sd(rates: FloatArray, sd: float) -> float:
    """Exact advantage of the linear attack on y = s + n with n . w ~ N(0, sd^2)
    independent of the input (see module)."""
    c, _ = attack.weights(rates)
    theta = attack.threshold(rates)
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
