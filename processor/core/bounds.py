"""Per-release error bounds of SimECC and ECC (and W) from public quantities (parameters,
beta and t).

What the bound guarantees: for every input stream and every tick t separately,
P(|y_t - s_t| > bound(t)) <= beta (per-tick coverage). It is not a bound that holds at
all ticks at once (a union over ticks would cost a factor sqrt(ln t^2) in every Gaussian
tail and was 9-75x the actual error); each release states its own (1 - beta) guarantee.

The argument (the project's own, built on the paper's Section 6 and Lemmas 3.12/3.13).
Checkpoints t_1 < t_2 < ... with gaps g_l = max(1, o_l + Z_l), o_l = mu + ceil(4 ln l /
eps_p), Z_l ~ DLap(b) on the integers; CC's release for checkpoint l is s(t_l) + e_l; BCC's
is t_hat_l = t_l + D_l, D_l = max(ceil(e'_l + a_l), 0) with a_l BCC's public shift and e'_l
its inner CC noise. All of these are data-independent (SimPart ignores the input and BCC
counts block lengths). At tick t let i be the last checkpoint with t_hat_i <= t and J the
checkpoint whose value y_t is (t_hat_J is the latest release tick <= t, so J <= i and
t_hat_J >= t_hat_i). Then y_t - s_t = e_J - (s_t - s(t_J)) with 0 <= s_t - s(t_J) <= t - t_J,
so |y_t - s_t| <= max(e_J, t - t_J - e_J), and
    t - t_J <= (t - t_i) + D_J - D_i,   t - t_i <= g_{i+1} - 1 + D_{i+1}
(checkpoint i + 1 is either after t or not yet released at t). With D_l <= e'_l + a_l + 1
(when that is >= 0) and D_l >= e'_l + a_l, the lag is at most a public constant plus a
Gaussian linear form in the e' and e of at most four indices, plus one gap. The indices
are confined to a window with high probability:
  - N_t (checkpoints up to t) <= n_hi, a Chernoff bound on sums of the Z_l;
  - every D_l (l <= n_hi + 1) <= D_max and every gap >= g_min, so J >= i - D_max / g_min;
  - i >= N_{t - D_max} >= n_lo (those checkpoints are released by t), Chernoff again.
Inside the window a union bound over the (J, i) pairs uses the exact variance of each
linear form: the tree base's noise is a sum of independent atoms (interval releases and
tree nodes), so correlated terms such as e'_J - e'_i are computed exactly; for other
bases the cross terms are bounded by Cauchy-Schwarz where every covariance is >= 0
(tree, sqrt, blt) and the sds added otherwise (Minkowski). The gap enters through
Z <=st L + 1 (L a continuous Laplace of the same scale), whose sum with a Gaussian has a
closed-form tail, and beta is split between the window events (a fifth) and the pair
tails, the smallest bound with total failure <= beta found by bisection. When no
checkpoint can have been released the error is s_t <= t, and t - t_J <= t - 1 always
caps the lag. The noise is taken as Gaussian with the core's exact sds: the core's
discrete (tree) and rounded (BLT) Gaussians live on lattices 2^-16 of an event or finer
with sds of at least one event, where their tails differ from the continuous ones by
far less than the float rounding of the bound.

The bound is a function of (eps, delta, calibration, base, beta, t) only. It is not
monotone in t: before the first release can have happened it is t itself, then it drops.

ECC (and W, which publishes its inner ECC(eps/2, delta/2)'s bound; `end()`'s padding
ticks are ⊥ ticks of that ECC) has the same per-tick semantics (ecc_bound, the project's
own argument on the paper's Algorithms 1-3 and Lemmas 3.12/3.13). Part's checkpoints
depend on the data, so there is no window of indices from below; everything private (the
number of checkpoints, the SVT instance and its local step, which checkpoint is shown) is
maximised over a range that holds with high probability for every input. Part's l-th SVT
fires at local step s iff v_s + Z_s > floor(thr UNIT) + Z_0 with thr = tau + 16 ln(l)/eps_p
+ (8/eps_p) ln(s + c); Z_0 ~ DLap(t0) once per instance, Z_s ~ DLap(t1) fresh per step
(the skip path samples the same law exactly, so the dense law is what is bounded). beta is
split in twentieths:
  - (1) blocks are long: an instance fires with sum <= tau - x - y only if Z_0 < -y or
    some Z_s > (8/eps_p) ln(s + c) + x (sum_s (s + c)^-alpha e^{-x/b1} converges), so with
    n = floor(t/G) + 1 instances at p/n each, every block has >= G = floor(tau - x - y)
    ticks, N_t <= n - 1 =: n_hi, and instance l starts after tick (l - 1) G;
  - (2) Z_0 <= k0 for every instance l <= n (a union over n);
  - (5) the open block at t: if the SVT did not fire at t its sum v is at most
    thr + Z_0 - Z_t, and Z_t, the step noise drawn at tick t, is fresh given the past: one
    tail, not a union over instances and steps. Maximised over s <= t, l <= n with
    (l - 1) G + s <= t (and v <= s);
  - (2) every BCC delay D_l (l <= n_hi) is <= d (D_l <= a_l + e'_l + 1, a Gaussian tail);
  - (3) the first unreleased block u closed at t_u > t - D_u, so its sum is at most one
    event more than the ⊥ step at tick t_u - 1, one of the d ticks before t: a union of
    the step noise over those d ticks;
  - (1) out of order: a block l > J released no later than J has t_l - t_J <= D_J - D_l <=
    a_J - a_l + 1 + e'_J - e'_l; with blocks >= G ticks only l - J <= d/G can, a union
    over those pairs (none when d < G); beyond 4096 indices the cap d is used;
  - (6) CC: y_t = s(t_J) + e_J for the checkpoint J shown (J <= n_hi; J = 0: y_t = 0), and
    |y_t - s_t| > b needs e_J > b or -e_J > b - lag; a union over J <= n_hi with the exact
    sd of each e_J (their maximum beyond 512 indices), the least such b by bisection.
The lag s_t - s(t_J) is then at most max(open, block_u + d - 1) plus the out-of-order
span, and at most t: events after t_u are within D_u - 1 ticks, and blocks between J and u
are out-of-order ones. Every quantity grows with t, so the bound computed at the end of a
block of ticks (t/256 beyond 2^12) is valid at every tick of the block: ECC's bound is
non-decreasing in t.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt
from scipy.special import log_ndtr, ndtr, ndtri

from processor.core.bounded import tree_node_sigma2
from processor.core.cc import bcc_eta, bcc_offset, cc_sigma, cc_sigma_max, psum_var
from processor.core.errors import InvalidParameterError
from processor.core.grid import UNIT
from processor.core.params import ecc_parameters, simecc_parameters
from processor.core.partition import simpart_scale
from processor.core.svt import svt_scales

__all__ = ["EccBound", "SimEccBound", "ecc_bound", "gaussian_upper", "log_tail_factor",
           "simecc_bound"]

#: Shares of beta: the window events (N_t, D_max, g_min, released-by-t) and the pair tails.
_SHARE_WINDOW = 0.2
_SHARE_PAIRS = 0.8
#: Above this many (i, J) pairs the window is treated by envelopes (_envelope_cases).
_EXACT_PAIRS = 1024


def _gauss_sf(x: float) -> float:
    """P(N(0, 1) > x)."""
    return float(ndtr(-x))


def _laplace_gauss_sf(u: float, s: float, b: float) -> float:
    """P(L + X > u) for L ~ Laplace(b) and X ~ N(0, s^2) independent (exact):
    Phi~(u/s) + e^{k - u/b} Phi((u - s^2/b)/s) / 2 - e^{k + u/b} Phi~((u + s^2/b)/s) / 2,
    k = s^2 / (2 b^2), each exponential taken with its log-Phi so nothing overflows."""
    if s <= 0.0:
        return 0.5 * math.exp(-u / b) if u >= 0 else 1.0 - 0.5 * math.exp(u / b)
    k = s * s / (2.0 * b * b)
    v = s / b
    plus = math.exp(k - u / b + float(log_ndtr(u / s - v)))
    minus = math.exp(min(700.0, k + u / b + float(log_ndtr(-u / s - v))))
    return min(1.0, max(0.0, float(ndtr(-u / s)) + 0.5 * plus - 0.5 * minus))


def gaussian_upper(p: float) -> float:
    """z with P(N(0, 1) > z) = p (p in (0, 1)); from ndtri, exact to float precision."""
    return float(-ndtri(p))


def log_tail_factor(log_beta: float, t: int) -> float:
    """tail_factor(beta, t) from ln(beta): sqrt(2 ln(pi^2 t^2 / (3 beta))) without forming
    beta, so a tiny internal delta never underflows to 0 (and the bound to inf)."""
    return math.sqrt(2.0 * (math.log(math.pi**2 / 3.0) + 2.0 * math.log(t) - log_beta))


# --------------------------------------------------------------------------- the partition


@lru_cache(maxsize=64)
def _exp_neg_inv(b: float) -> float:
    return math.exp(-1.0 / b)


@dataclass(frozen=True)
class _Gaps:
    """SimPart's gap law: g_l = max(1, mu + ceil(4 ln l / eps_p) + Z_l), Z_l ~ DLap(b)."""

    mu: int
    eps_p: float
    b: float

    @property
    def r(self) -> float:
        return _exp_neg_inv(self.b)

    def offsets_low(self, n: int) -> float:
        """A lower bound on sum_{l <= n} o_l: n mu + 4 ln(n!) / eps_p."""
        return n * self.mu + 4.0 * math.lgamma(n + 1) / self.eps_p

    def offsets_high(self, n: int) -> float:
        """An upper bound on sum_{l <= n} o_l (each ceiling adds less than one)."""
        return self.offsets_low(n) + n

    def log_mgf(self, lam: float) -> float:
        """ln E[exp(lam Z)] for |lam| < 1/b: (1 - r)^2 / ((1 - r e^lam)(1 - r e^-lam))."""
        r = self.r
        return (2.0 * math.log1p(-r) - math.log1p(-r * math.exp(lam))
                - math.log1p(-r * math.exp(-lam)))

    def log_mgf_pos(self, lam: float) -> float:
        """ln E[exp(lam max(Z, 0))] for 0 < lam < 1/b:
        1/(1 + r) + (1 - r)/(1 + r) * r e^lam / (1 - r e^lam)."""
        r = self.r
        q = r * math.exp(lam)
        return math.log(1.0 / (1.0 + r) + (1.0 - r) / (1.0 + r) * q / (1.0 - q))

    def upper_tail(self, k: int) -> float:
        """P(Z >= k) for k >= 1: r^k / (1 + r)."""
        return math.exp(k * math.log(self.r)) / (1.0 + self.r) if k >= 1 else 1.0

    def quantile(self, p: float) -> int:
        """The least k >= 0 with P(Z > k) = P(Z < -k) <= p."""
        k = math.ceil(math.log(p * (1.0 + self.r)) / math.log(self.r)) - 1
        return max(0, k)


def _chernoff(log_mgf: Callable[[float], float], n: int, m: float, lam_max: float) -> float:
    """min over lam in (0, lam_max) of exp(n log_mgf(lam) - lam m): a bound on
    P(sum of n i.i.d. copies >= m) for m > 0 (golden-section search on a convex exponent)."""
    if m <= 0:
        return 1.0

    def f(lam: float) -> float:
        return n * log_mgf(lam) - lam * m

    lo, hi = 0.0, lam_max * (1.0 - 1e-9)
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, c = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fc = f(a), f(c)
    for _ in range(40):
        if fa < fc:
            hi, c, fc = c, a, fa
            a = hi - g * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, c, fc
            c = lo + g * (hi - lo)
            fc = f(c)
    return math.exp(min(0.0, fa, fc))


def _count_high(gaps: _Gaps, t: int, p: float) -> int:
    """n_hi with P(N_t > n_hi) <= p: N_t >= n iff t_n <= t, and t_n >= sum o_l + sum Z_l."""
    n = max(1, int(t / (gaps.mu + 4.0 * math.log(max(2, t // gaps.mu)) / gaps.eps_p)))
    # P(sum Z <= -m) = P(sum (-Z) >= m), -Z has the same law.
    while _chernoff(gaps.log_mgf, n, gaps.offsets_low(n) - t, 1.0 / gaps.b) > p:
        n += 1 + n // 64
    return n - 1


def _count_low(gaps: _Gaps, u: int, p: float) -> int:
    """n_lo with P(N_u < n_lo) <= p: N_u < n iff t_n > u, and t_n <= sum o_l + sum Z_l^+."""
    if u <= 0:
        return 0
    n = int(u / gaps.mu) + 1
    while n > 0 and _chernoff(gaps.log_mgf_pos, n, u - gaps.offsets_high(n),
                              1.0 / gaps.b) > p:
        n -= 1 + n // 64
    return max(0, n)


# --------------------------------------------------------------------------- the counters


@dataclass(frozen=True)
class _CC:
    """An UnboundedCC's noise: its sd at step l (counts); `tag` names its draws."""

    eps: float
    delta: float
    base: str
    tag: str

    def sd(self, l: int) -> float:  # noqa: E741
        return _cc_sd(self.eps, self.delta, self.base, l)


@lru_cache(maxsize=65536)
def _cc_sd(eps: float, delta: float, base: str, l: int) -> float:  # noqa: E741
    return cc_sigma(eps, delta, l, base, UNIT) / UNIT


@lru_cache(maxsize=65536)
def _tree_atoms(eps: float, delta: float, tag: str, l: int  # noqa: E741
                ) -> dict[tuple[str, int, int, int], float]:
    out: dict[tuple[str, int, int, int], float] = {}
    if l <= 0:
        return out
    done = (l + 1).bit_length() - 1  # intervals complete at l
    pv = psum_var(eps, delta, "tree", UNIT) / UNIT**2
    for k in range(1, done + 1):
        out[(tag, k, -1, 0)] = pv
    start = 1 << done
    if l != start - 1:
        tau = l - start + 1
        num, den = tree_node_sigma2(eps / 2, delta / 2, start - 1, UNIT)
        nv = num / den / UNIT**2
        h = 0
        while tau >> h:
            if (tau >> h) & 1:
                out[(tag, done + 1, h, tau >> h)] = nv
            h += 1
    return out


#: Bases whose noise at two steps has a covariance >= 0 (every coefficient of the noise in
#: the independent draws is >= 0: interval releases, tree nodes, the square root's c_j,
#: the BLT decoder's impulse response b_k, positive and decreasing to a positive limit:
#: tests/core/test_bounds.py checks it through k = 2^40).
_NONNEG_COV = ("tree", "sqrt", "blt")


def _combo_sd(terms: list[tuple[_CC, int, float]]) -> float:
    """An upper bound on the sd of sum c * e(l) over (counter, l, c), counters of distinct
    tags independent. Exact from the atoms (tree base); with covariances known to be >= 0,
    cross terms of opposite signs are dropped and the others bounded by Cauchy-Schwarz;
    otherwise the sds add (Minkowski)."""
    terms = [(cc, n, c) for cc, n, c in terms if n > 0 and c != 0.0]
    var = 0.0
    for tag in {cc.tag for cc, _, _ in terms}:
        group = [(cc, n, c) for cc, n, c in terms if cc.tag == tag]
        base = group[0][0].base
        if base == "tree":
            atoms: dict[tuple[str, int, int, int], list[float]] = {}
            for cc, n, c in group:
                for key, v in _tree_atoms(cc.eps, cc.delta, cc.tag, n).items():
                    atoms.setdefault(key, [0.0, v])[0] += c
            var += sum(coef * coef * v for coef, v in atoms.values())
            continue
        sds = [(abs(c) * cc.sd(n), c) for cc, n, c in group]
        if base in _NONNEG_COV:
            v = sum(a * a for a, _ in sds)
            for x in range(len(sds)):
                for y in range(x + 1, len(sds)):
                    if sds[x][1] * sds[y][1] > 0:
                        v += 2.0 * sds[x][0] * sds[y][0]
            var += v
        else:
            var += sum(a for a, _ in sds) ** 2
    return math.sqrt(var)


@dataclass(frozen=True)
class SimEccBound:
    """The public ingredients of SimECC's bound (see the module docstring)."""

    gaps: _Gaps
    cc: _CC
    #: BCC's inner CC (eps, delta / 2); bcc_eps, bcc_delta are BCC's own parameters
    bcc: _CC
    bcc_eps: float
    bcc_delta: float
    log_eta: float

    def shift(self, l: int) -> float:  # noqa: E741
        """BCC's shift a_l in counts, by the function BCC.step adds it with (bcc_offset)."""
        return _shift(self.bcc_eps, self.bcc_delta, self.bcc.base, l)

    def bound(self, t: int, beta: float) -> float:
        """The bound at tick t. Beyond 2^12 it is the bound of t's block of ticks (256
        blocks per doubling of t), valid at every tick of the block and cached, so a long
        stream computes it once per block."""
        if t <= 0:
            return 0.0
        if t < 1 << 12:
            return self.range_bound(t, t, beta)
        size = 1 << (t.bit_length() - 9)
        start = t - t % size
        return _range_bound(self, start, start + size - 1, beta)

    def range_bound(self, t1: int, t: int, beta: float) -> float:
        """A bound valid at every tick in [t1, t] (t1 <= t): the window of checkpoint
        indices covers both ends, and the caps that use the tick use the largest."""
        w = beta * _SHARE_WINDOW / 4.0
        g = self.gaps
        n_hi = _count_high(g, t, w)
        if n_hi == 0:
            return float(t)  # nothing released: y_t = 0 and the error is s_t <= t
        top = n_hi + 1
        z_d = gaussian_upper(w / top)
        d_max = (max(self.shift(n) + z_d * self.bcc.sd(n) + 1.0 for n in range(1, top + 1))
                 if top <= 512 else self._d_max_coarse(top, z_d))
        g_min = max(1, g.mu - g.quantile(w / top))
        n_lo = min(n_hi, _count_low(g, t1 - math.ceil(d_max), w))
        r = int(d_max // g_min)
        budget = beta * _SHARE_PAIRS
        fixed = 0.0  # failure probability that does not depend on the bound
        # (const, sd, q, sd of e_J, count): the lag form exceeds b with probability at most
        # min(P(L + N(0, sd^2) > b - const), q), q bounding the configuration (J, i) itself.
        cases: list[tuple[float, float, float, float, int]] = []
        far = self._far_inversions(max(1, n_lo - r), n_hi, r)
        width = n_hi - n_lo + 1
        envelope = width * (r + 1) > _EXACT_PAIRS
        if envelope:  # a wide window (large t): one case per distance, window-wide maxima
            cases = self._envelope_cases(n_lo, n_hi, r, far, budget)
            fixed += sum(q * width for q in far.values() if q * width < budget * 1e-4)
        for i in range(n_lo, n_hi + 1):
            o_next = g.mu + math.ceil(4.0 * math.log(i + 1) / g.eps_p)
            # The clamp max(1, .) of gap i + 1 and the linear form of D_{i+1} (both tiny).
            fixed += g.upper_tail(o_next) + _gauss_sf((self.shift(i + 1) + 1.0)
                                                      / self.bcc.sd(i + 1))
            if envelope:
                continue
            # J = 0 (y_t = 0) only when nothing is released: t_hat_i >= 1 > t_hat_0.
            for j in range(max(1, i - r) if i else 0, i + 1):
                if j == 0:
                    cases.append((math.inf, 0.0, math.inf, 0.0, 1))
                    continue
                const = o_next + 1.0 + self.shift(i + 1)
                terms = [(self.bcc, i + 1, 1.0), (self.cc, j, -1.0)]
                q = math.inf
                if j < i:
                    if i - j >= 2 and far[i - j] * width < budget * 1e-4:
                        continue  # counted once for all i below
                    const += self.shift(j) + 1.0 - self.shift(i)
                    terms += [(self.bcc, j, 1.0), (self.bcc, i, -1.0)]
                    q = self._inversion(j, i)
                    if q < budget * 1e-4:  # the configuration J = j, i0 = i itself
                        fixed += q
                        continue
                cases.append((const, _combo_sd(terms), q, self.cc.sd(j), 1))
        if not envelope:
            fixed += sum(q * width for q in far.values() if q * width < budget * 1e-4)
        # the linear form of D_J for the J below the window of i + 1 (each ~1e-12)
        fixed += sum(_gauss_sf((self.shift(n) + 1.0) / self.bcc.sd(n))
                     for n in range(max(1, n_lo - r), n_lo + 1))
        left = budget - fixed
        if left <= 0.0:
            raise InvalidParameterError("beta too small for the bound's window")

        def failure(b: float) -> float:
            total = 0.0
            for const, sd, q, sd_e, count in cases:
                if const == math.inf:  # J = 0: the error is s_t <= t
                    total += 0.0 if b >= t else 1.0
                    continue
                lag = min(_laplace_gauss_sf(b - const, sd, g.b),
                          _gauss_sf((b - t + 1.0) / sd_e))
                total += count * (min(lag, q) + _gauss_sf(b / sd_e))
            return total

        return _least_bound(failure, left)

    def _inversion(self, j: int, i: int) -> float:
        return _inversion(self, j, i)

    def _envelope_cases(self, n_lo: int, n_hi: int, r: int, far: dict[int, float],
                        budget: float) -> list[tuple[float, float, float, float, int]]:
        """The cases of a wide window, each standing for all i in [n_lo, n_hi] at one
        distance d = i - j: the largest shift and sd over the window, the largest offset
        o_{n_hi + 1}, and for d >= 1 the shift range and the sd of e'_{i+1} + e'_j - e'_i
        bounded as _combo_sd does without atoms."""
        g = self.gaps
        width = n_hi - n_lo + 1
        idx = range(max(1, n_lo - r), n_hi + 2)
        shifts = [self.shift(n) for n in idx]
        s_max, spread = max(shifts), max(shifts) - min(shifts) + 1.0
        sd_b = max(self.bcc.sd(n) for n in idx)
        sd_c = max(self.cc.sd(n) for n in idx)
        const0 = g.mu + math.ceil(4.0 * math.log(n_hi + 1) / g.eps_p) + 1.0 + s_max
        nonneg = self.bcc.base in _NONNEG_COV
        three = (math.sqrt(5.0) if nonneg else 3.0) * sd_b
        two = (math.sqrt(2.0) if nonneg else 2.0) * sd_b
        out: list[tuple[float, float, float, float, int]] = []
        if n_lo == 0:
            out.append((math.inf, 0.0, math.inf, 0.0, 1))
        out.append((const0, math.hypot(sd_b, sd_c), math.inf, sd_c, width))
        if r >= 1:
            q1 = _laplace_gauss_sf(g.mu - spread - 1.0, two, g.b)
            out.append((const0 + spread, math.hypot(three, sd_c), q1, sd_c, width))
        for q in far.values():
            if q * width >= budget * 1e-4:
                out.append((const0 + spread, math.hypot(three, sd_c), q, sd_c, width))
        return out

    def _far_inversions(self, lo: int, hi: int, r: int) -> dict[int, float]:
        """d -> a bound on P(t_hat_j >= t_hat_{j+d}) for every pair in [lo, hi + 1] at
        distance d in 2..r: the lead is at least d mu, the shift difference at most the
        window's range, the sd of e'_j - e'_i at most twice the largest (Minkowski)."""
        if r < 2:
            return {}
        g = self.gaps
        shifts = [self.shift(n) for n in range(lo, hi + 2)]
        sd = 2.0 * max(self.bcc.sd(n) for n in range(lo, hi + 2))
        spread = max(shifts) - min(shifts) + 1.0
        out: dict[int, float] = {}
        for d in range(2, r + 1):
            def exponent(lam: float, d: int = d) -> float:
                return lam * lam * sd * sd / 2.0 + d * g.log_mgf(lam)

            out[d] = _chernoff(exponent, 1, d * g.mu - spread, 1.0 / g.b)
        return out

    def _inversion_uncached(self, j: int, i: int) -> float:
        """A bound on P(t_hat_j >= t_hat_i) for j < i: D_j - D_i >= t_i - t_j =
        sum_{j < l <= i} g_l, with D_j - D_i <= a_j + 1 - a_i + (e'_j - e'_i)."""
        g = self.gaps
        sd = _combo_sd([(self.bcc, j, 1.0), (self.bcc, i, -1.0)])
        lead = sum(g.mu + math.ceil(4.0 * math.log(n) / g.eps_p) for n in range(j + 1, i + 1))
        c = lead - (self.shift(j) + 1.0 - self.shift(i))
        if i - j == 1:  # -Z_i <=st L + 1 (L continuous Laplace of the same scale)
            return _laplace_gauss_sf(c - 1.0, sd, g.b)
        m = i - j
        return _chernoff(lambda lam: lam * lam * sd * sd / 2.0 + m * g.log_mgf(lam), 1, c,
                         1.0 / g.b)

    def _d_max_coarse(self, top: int, z: float) -> float:
        # sd and shift grow at most like sqrt(log) between dyadic points; bound them on
        # each [2^k - 1, 2^{k+1} - 2] by the interval's largest sigma (cc_sigma_max logic).
        sd = cc_sigma_max(self.bcc.eps, self.bcc.delta, top, self.bcc.base, UNIT) / UNIT
        return sd * (log_tail_factor(self.log_eta, top) + z) + 1.0


def _least_bound(failure: Callable[[float], float], left: float) -> float:
    """The smallest b found by doubling then bisection (to 1/4) with failure(b) <= left;
    failure is non-increasing in b."""
    lo, hi = 0.0, 1.0
    while failure(hi) > left:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 0.25:
        mid = 0.5 * (lo + hi)
        if failure(mid) > left:
            lo = mid
        else:
            hi = mid
    return hi


@lru_cache(maxsize=65536)
def _shift(bcc_eps: float, bcc_delta: float, base: str, l: int) -> float:  # noqa: E741
    if l <= 0:
        return 0.0
    return bcc_offset(bcc_eps, bcc_delta, l, base, UNIT) / UNIT


@lru_cache(maxsize=4096)
def _range_bound(model: SimEccBound, t1: int, t2: int, beta: float) -> float:
    return model.range_bound(t1, t2, beta)


@lru_cache(maxsize=65536)
def _inversion(model: SimEccBound, j: int, i: int) -> float:
    """SimEccBound._inversion, cached: it depends on the pair only, not on t."""
    return model._inversion_uncached(j, i)


@lru_cache(maxsize=256)
def _model(eps: float, delta: float, base: str, calibration: str) -> SimEccBound:
    p = simecc_parameters(eps, delta, calibration)
    ts, ss = simpart_scale(p.eps_part)
    # ln(eta) = ln(delta / 2) - ln(1 + e^eps), in log space: eta itself underflows for
    # large eps even where the shift it defines is finite.
    log_eta = math.log(0.5 * p.bcc_delta) - _log1pexp(p.bcc_eps)
    if bcc_eta(p.bcc_eps, p.bcc_delta) <= 0.0:
        raise InvalidParameterError("eps too large for BCC's eta")
    return SimEccBound(_Gaps(p.mu, p.eps_part, ts / ss),
                       _CC(p.cc_eps, p.cc_delta, base, "c"),
                       _CC(p.bcc_eps, p.bcc_delta / 2, base, "b"), p.bcc_eps, p.bcc_delta,
                       log_eta)


def _log1pexp(x: float) -> float:
    return x + math.log1p(math.exp(-x)) if x > 0 else math.log1p(math.exp(x))


def simecc_bound(eps: float, delta: float, beta: float, t: int, base: str = "tree",
                 calibration: str = "paper") -> float:
    """A bound on |y_t - s_t| (events) of SimECC(eps, delta, calibration) whose CC and BCC
    run on `base`, at tick t, holding with probability >= 1 - beta at that tick for every
    input (see the module docstring)."""
    if not 0 < beta < 1:
        raise InvalidParameterError("beta must be in (0, 1)")
    return _model(float(eps), float(delta), base, calibration).bound(int(t), float(beta))



# --------------------------------------------------------------------------- ECC (and W)


def _dlap_over(scale_units: int, p: float) -> float:
    """w (events) with P(Z > w UNIT) <= p for Z ~ DLap(scale_units) on the unit lattice:
    P(Z >= k) = r^k / (1 + r), r = e^{-1/scale}, for k >= 1, so k - 1 units with
    k = ceil(scale ln(1 / (p (1 + r))))."""
    r = math.exp(-1.0 / scale_units)
    k = math.ceil(scale_units * math.log(1.0 / (p * (1.0 + r))))
    return max(0, k - 1) / UNIT


@dataclass(frozen=True)
class _Svt:
    """Part's SVT instances: threshold tau + 16 ln(l)/eps_p + (8/eps_p) ln(s + c) at local
    step s of instance l, c = ceil(12/eps_p); Z_0 ~ DLap(t0), per-step Z ~ DLap(t1) (units)."""

    tau: float
    eps_p: float
    t0: int
    t1: int

    @property
    def c(self) -> int:
        return math.ceil(12.0 / self.eps_p)

    def steps_over(self, x: float) -> float:
        """A bound on P(some step s >= 1 of one instance has Z_s > (8/eps_p) ln(s + c) + x):
        sum_s e^{-x/b1} (s + c)^{-alpha} <= e^{-x/b1} c^{1 - alpha} / (alpha - 1), with
        b1 = t1/UNIT and alpha = 8 / (eps_p b1) (just under 2: the scale is inflated)."""
        b1 = self.t1 / UNIT
        alpha = 8.0 / (self.eps_p * b1)
        return math.exp(-x / b1) * math.pow(self.c, 1.0 - alpha) / (alpha - 1.0)


@dataclass(frozen=True)
class _Blocks:
    """Part's blocks with probability >= 1 - p: N_t <= n - 1, and instance l (l <= n)
    starts no earlier than after tick starts[l - 1] (None: only l - 1 ticks, nothing
    assumed); every block is at least g ticks long."""

    n: int
    g: int
    starts: npt.NDArray[np.int64] | None

    def last_instance(self, t: int, s: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The largest instance that can be at local step s at tick t (each s >= 1)."""
        if self.starts is None:
            return np.minimum(self.n, t - s + 1)
        return np.minimum(self.n, np.searchsorted(self.starts, t - s, side="right"))


def _ecc_windows(svt: _Svt, t: int, p: float) -> _Blocks:
    """Every one of Part's first n instances that fires closes a block of at least
    G_l = floor(tau + 16 ln(l)/eps_p - x - y) ticks, with probability >= 1 - p. Instance l
    fires at step s only if v_s + Z_s > floor(thr_s UNIT) + Z_0, so with Z_0 >= -y and
    Z_s <= (8/eps_p) ln(s + c) + x (events) its sum exceeds tau_l - x - y - 2^-16, and a
    block has at least as many ticks as events. Then the first n blocks take more than t
    ticks when G_1 + ... + G_n > t, so N_t <= n - 1. Each instance gets p / n, half to Z_0
    and half to its steps (_Svt.steps_over); n is raised until it is the least with
    G_1 + ... + G_n > t for the G that share allows. When the noise leaves no margin
    (G_1 <= 1) nothing is assumed: n = t + 1."""
    n = 1
    while True:
        q = p / n
        y = _dlap_over(svt.t0, q / 2.0)
        x = max(0.0, svt.t1 / UNIT * math.log(2.0 * svt.steps_over(0.0) / q))
        g1 = math.floor(svt.tau - x - y)
        if g1 <= 1:
            return _Blocks(t + 1, 1, None)
        ls = np.arange(1, t // g1 + 2)
        sizes = np.floor(svt.tau + 16.0 * np.log(ls) / svt.eps_p - x - y).astype(np.int64)
        ends = np.cumsum(sizes)
        need = int(np.searchsorted(ends, t, side="right")) + 1  # least m with ends > t
        if need <= n:
            return _Blocks(n, g1, np.concatenate(([0], ends[:n - 1])))
        n = need


@dataclass(frozen=True)
class EccBound:
    """The public ingredients of ECC's per-tick bound (see ecc_bound)."""

    svt: _Svt
    cc: _CC
    bcc: _CC
    bcc_eps: float
    bcc_delta: float
    log_eta: float

    def shift(self, l: int) -> float:  # noqa: E741
        return _shift(self.bcc_eps, self.bcc_delta, self.bcc.base, l)

    def bound(self, t: int, beta: float) -> float:
        """The bound at tick t: exact below 2^12, beyond it the bound computed for the last
        tick of t's block (t/256 ticks; valid at every earlier tick, see ecc_bound), cached."""
        if t <= 0:
            return 0.0
        if t >= 1 << 12:
            size = 1 << (t.bit_length() - 9)
            t = t - t % size + size - 1
        return _ecc_upto(self, t, beta)

    def d_max(self, top: int, p: float) -> float:
        """A bound on every BCC delay D_l, l <= top, failing with probability <= p:
        D_l <= a_l + e'_l + 1 and a Gaussian tail at p / top for each e'_l."""
        z = gaussian_upper(p / top)
        if top <= 512:
            return max(self.shift(n) + z * self.bcc.sd(n) + 1.0 for n in range(1, top + 1))
        sd = cc_sigma_max(self.bcc.eps, self.bcc.delta, top, self.bcc.base, UNIT) / UNIT
        return sd * (log_tail_factor(self.log_eta, top) + z) + 1.0

    def interval_sum(self, t: int, blocks: _Blocks, k: float) -> float:
        """The most an instance's interval sum can be while it has not fired at a step whose
        noises satisfy Z_0 <= k0 and -Z_s <= k1 (k = k0 + k1): min(s, tau + 16 ln(l)/eps_p +
        (8/eps_p) ln(s + c) + k), maximised over local step s <= t and the instances l that
        can be at step s at tick t (blocks.last_instance); on a geometric grid of s, each
        cell [a, b] bounded by its worst ends (l from a, the log from b)."""
        v = self.svt
        b = _grid(t)
        a = np.concatenate(([1], b[:-1]))
        ls = blocks.last_instance(t, a)
        # + one unit: the threshold is floored from a float product
        val = (v.tau + 16.0 * np.log(ls) / v.eps_p + 8.0 * np.log(b + v.c) / v.eps_p + k
               + 1.0 / UNIT)
        return float(np.max(np.minimum(b.astype(np.float64), val)))

    def upto(self, t: int, beta: float) -> float:
        """A bound valid at every tick <= t (ecc_bound's argument with t as the horizon);
        beta in twentieths: windows 1, Z_0 2, this tick's step 5, delays 2, the step
        before a firing 3, out-of-order releases 1, CC 6."""
        share = beta / 20.0
        blocks = _ecc_windows(self.svt, t, share)
        n, g = blocks.n, blocks.g
        k0 = _dlap_over(self.svt.t0, 2.0 * share / n)  # Z_0 of the instances l <= n
        n_hi = n - 1
        open_sum = self.interval_sum(t, blocks, k0 + _dlap_over(self.svt.t1, 5.0 * share))
        lag = open_sum
        if n_hi >= 1:
            d = math.floor(_ecc_d_max(self, n_hi, 2.0 * share))  # every D_l, l <= n_hi
            if d >= 1:
                # the step before the firing of the first unreleased block: one of the d
                # ticks before t
                k1 = _dlap_over(self.svt.t1, 3.0 * share / d)
                block = min(self.interval_sum(t, blocks, k0 + k1) + 1.0, float(t))
                lag = max(open_sum, block + d - 1.0)
                if d >= g:  # releases out of order: they span at most D_J - D_l ticks
                    lag += min(d, _ecc_out_of_order(self, n_hi, d // g, share))
        lag = min(lag, float(t))
        if n_hi < 1:
            return lag
        return self._with_cc(lag, n_hi, 6.0 * share)

    def out_of_order(self, n_hi: int, r: int, p: float) -> float:
        """A bound on D_J - D_l over the pairs J < l <= n_hi, l - J <= r, failing with
        probability <= p: D_J - D_l <= a_J - a_l + 1 + (e'_J - e'_l), with the sd of the
        difference from _diff_sd. Beyond 4096 indices: inf (the caller keeps its cap, the
        largest delay)."""
        if n_hi > 4096:
            return math.inf
        if n_hi < 2:
            return 0.0  # one checkpoint: nothing to come out of order with
        z = gaussian_upper(p / (n_hi * r))
        best = -math.inf
        for l in range(2, n_hi + 1):  # noqa: E741
            for j in range(max(1, l - r), l):
                sd = _diff_sd(self.bcc, j, l)
                best = max(best, self.shift(j) - self.shift(l) + 1.0 + z * sd)
        return float(max(0, math.floor(best)))  # < 1: no release can come out of order

    def _with_cc(self, lag: float, n_hi: int, p: float) -> float:
        """The least b >= lag (a multiple of 1/8) with sum over J <= n_hi of P(e_J > b) +
        P(-e_J > b - lag) <= p (exact sds up to 512 indices, their maximum beyond)."""
        if n_hi <= 512:
            sds = np.array([self.cc.sd(j) for j in range(1, n_hi + 1)])
            mult = 1
        else:
            sds = np.array([cc_sigma_max(self.cc.eps, self.cc.delta, n_hi, self.cc.base,
                                         UNIT) / UNIT])
            mult = n_hi

        def failure(b: float) -> float:
            return mult * float(np.sum(ndtr(-b / sds) + ndtr(-(b - lag) / sds)))

        # the least multiple of 1/8 >= lag that passes: failure falls in b and grows with
        # lag (and with the sds), so the answer never decreases when they grow
        lo = math.ceil(8.0 * lag)
        if failure(lo / 8.0) <= p:
            return lo / 8.0
        step = 1
        while failure((lo + step) / 8.0) > p:
            lo, step = lo + step, 2 * step
        hi = lo + step  # failure(lo) > p >= failure(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if failure(mid / 8.0) > p:
                lo = mid
            else:
                hi = mid
        return hi / 8.0


def _diff_sd(cc: _CC, j: int, l: int) -> float:  # noqa: E741
    """An upper bound on the sd of e_j - e_l (j < l) of one UnboundedCC. Its noise at step
    m is the sum of one release p_k per interval complete at m (i.i.d., variance pv) and
    the running interval's bounded counter, independent of all p_k (cc.cc_sigma). Steps in
    different intervals: the difference is the p_k completed in between plus the two
    running counters, all independent (exact). In the same interval the p_k cancel and the
    two values of one bounded counter remain: variance <= v_j + v_l where its covariances
    are >= 0 (_NONNEG_COV), else (sd_j + sd_l)^2."""
    pv = psum_var(cc.eps, cc.delta, cc.base, UNIT) / UNIT**2
    kj, kl = (j + 1).bit_length() - 1, (l + 1).bit_length() - 1
    vj = max(0.0, cc.sd(j) ** 2 - kj * pv)
    vl = max(0.0, cc.sd(l) ** 2 - kl * pv)
    if kj != kl:
        return math.sqrt((kl - kj) * pv + vj + vl)
    if cc.base in _NONNEG_COV:
        return math.sqrt(vj + vl)
    return math.sqrt(vj) + math.sqrt(vl)


def _edges() -> npt.NDArray[np.int64]:
    edges = list(range(1, 65))
    while edges[-1] < 1 << 62:
        edges.append(math.ceil(edges[-1] * 1.05))
    return np.array(edges, dtype=np.int64)


#: 1..64, then up by 5% per point: the same cells for every t (a finer grid at a later t
#: could lower the maximum, and the bound is to be non-decreasing in t).
_EDGES = _edges()


@lru_cache(maxsize=1024)
def _grid(t: int) -> npt.NDArray[np.int64]:
    """The cells' right ends up to t: the fixed edges below t, then t."""
    below = _EDGES[np.less(_EDGES, t)]
    return np.concatenate((below, [t])).astype(np.int64)


@lru_cache(maxsize=4096)
def _ecc_d_max(model: EccBound, top: int, p: float) -> float:
    return model.d_max(top, p)


@lru_cache(maxsize=4096)
def _ecc_out_of_order(model: EccBound, n_hi: int, r: int, p: float) -> float:
    # the same (n_hi, r) recurs for thousands of consecutive ticks
    return model.out_of_order(n_hi, r, p)


@lru_cache(maxsize=4096)
def _ecc_upto(model: EccBound, t: int, beta: float) -> float:
    return model.upto(t, beta)


@lru_cache(maxsize=256)
def _ecc_model(eps: float, delta: float, base: str, calibration: str) -> EccBound:
    p = ecc_parameters(eps, delta, calibration)
    t0, t1 = svt_scales(p.eps_part)
    if bcc_eta(p.bcc_eps, p.bcc_delta) <= 0.0:
        raise InvalidParameterError("eps too large for BCC's eta")
    log_eta = math.log(0.5 * p.bcc_delta) - _log1pexp(p.bcc_eps)
    return EccBound(_Svt(p.tau, p.eps_part, t0, t1),
                    _CC(p.cc_eps, p.cc_delta, base, "c"),
                    _CC(p.bcc_eps, p.bcc_delta / 2, base, "b"), p.bcc_eps, p.bcc_delta,
                    log_eta)


def ecc_bound(eps: float, delta: float, beta: float, t: int, base: str = "tree",
              calibration: str = "paper") -> float:
    """A bound on |y_t - s_t| (events) of ECC(eps, delta, calibration) whose CC and BCC run
    on `base`, at tick t, holding with probability >= 1 - beta at that tick for every input
    (per tick, not at all ticks at once). Non-decreasing in t. The argument is in the
    module docstring (ECC section)."""
    if not 0 < beta < 1:
        raise InvalidParameterError("beta must be in (0, 1)")
    return _ecc_model(float(eps), float(delta), base, calibration).bound(int(t), float(beta))
