"""The audit's statistics: lower bounds on epsilon from two samples of scores, and the
verdict.

`empirical_bound` (Clopper-Pearson, any mechanism), `known_null_bound` and
`exact_pair_bound` / `pmf_pair_bound` (known laws), the law checks of the scores
(`null_law_check`, `pmf_law_check`), `judge` (every bound and check of one audit) and
`AuditError`. The package docstring (processor/audit/__init__.py) states what each bound
assumes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

from processor.core.api import Counter
from processor.errors import ProcessorError

Stream = Sequence[float | None]
FloatArray = npt.NDArray[np.float64]
#: (t, y) at every tick where y changed
Transcript = list[tuple[int, float]]
Factory = Callable[[str], Counter]
#: releases (runs x T) -> one score per run
Score = Callable[[FloatArray], FloatArray]
#: the score of a run that released nothing, for scores over the releases (_release_lr)
NO_RELEASE = -1e9


class AuditError(ProcessorError):
    """The audit cannot run or cannot conclude (constant score, bad streams, bad sizes)."""

    error_prefix = "audit: "


# ------------------------------------------------------------------------ statistics


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """The exact two-sided (1 - alpha) Clopper-Pearson interval for k successes in n
    trials; each end is a one-sided (1 - alpha/2) bound."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError("need 0 <= k <= n and n > 0")
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def _cp_low(k: npt.NDArray[np.int64], n: int, level: float) -> FloatArray:
    """One-sided lower Clopper-Pearson bounds (each holds with probability 1 - level)."""
    with np.errstate(all="ignore"):
        lo = stats.beta.ppf(level, k, n - k + 1)
    return np.where(k == 0, 0.0, np.nan_to_num(lo, nan=0.0)).astype(np.float64)


def _cp_high(k: npt.NDArray[np.int64], n: int, level: float) -> FloatArray:
    """One-sided upper Clopper-Pearson bounds (each holds with probability 1 - level)."""
    with np.errstate(all="ignore"):
        hi = stats.beta.ppf(1 - level, k + 1, n - k)
    return np.where(k == n, 1.0, np.nan_to_num(hi, nan=1.0)).astype(np.float64)


def _log_ratio(num: FloatArray, den: FloatArray, delta: float) -> FloatArray:
    """ln((num - delta) / den), -inf where num <= delta."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.log(np.maximum(num - delta, 0.0)) - np.log(den)
    return np.where(num > delta, out, -np.inf)


@dataclass(frozen=True)
class Bound:
    """One lower bound on epsilon and how it was obtained.

    `event` is "s >= c" or "s <= c" on the score; `order` says which stream's probability
    is in the numerator ("x/x'": P_x(E) <= e^eps P_x'(E) + delta was tested). `p_low` and
    `p_high` are the bounds on the numerator and denominator probabilities (for the known
    null bound one of them is exact). eps_lb = -inf: no event separated the streams.
    """

    method: str
    eps_lb: float
    event: str
    threshold: float
    order: str
    p_low: float
    p_high: float
    n_select: int
    n_estimate: int
    alpha: float


def _none(method: str, n_sel: int, n_est: int, alpha: float) -> Bound:
    return Bound(method, -math.inf, "none", math.nan, "", 0.0, 1.0, n_sel, n_est, alpha)


def _counts_ge(sorted_s: FloatArray, c: FloatArray) -> npt.NDArray[np.int64]:
    return (sorted_s.size - np.searchsorted(sorted_s, c, side="left")).astype(np.int64)


def _counts_le(sorted_s: FloatArray, c: FloatArray) -> npt.NDArray[np.int64]:
    return np.searchsorted(sorted_s, c, side="right").astype(np.int64)


#: at most this many candidate thresholds are scored on the selection half (quantiles)
MAX_THRESHOLDS = 400
#: an event is a candidate only if at least this many selection runs fall in it on the
#: numerator's side: thresholds at the last few order statistics look best on the selection
#: half by chance and then come out empty on the estimation half
MIN_COUNT = 10


def _candidates(a: FloatArray, b: FloatArray) -> FloatArray:
    c = np.unique(np.concatenate([a, b]))
    if c.size > MAX_THRESHOLDS:
        c = np.unique(np.quantile(c, np.linspace(0.0, 1.0, MAX_THRESHOLDS)))
    return c


def empirical_bound(s0: FloatArray, s1: FloatArray, delta: float, alpha: float) -> Bound:
    """The assumption-free bound (module docstring): holds with probability >= 1 - alpha/2.

    The first half of each sample selects (threshold, event, order), the second half
    estimates: P_a(E) >= p_low and P_b(E) <= p_high with one-sided level alpha/4 each."""
    s0 = np.asarray(s0, dtype=np.float64)
    s1 = np.asarray(s1, dtype=np.float64)
    h0, h1 = s0.size // 2, s1.size // 2
    if min(h0, h1) < 1:
        raise AuditError("need at least 2 runs per stream")
    sel = (np.sort(s0[:h0]), np.sort(s1[:h1]))
    est = (np.sort(s0[h0:]), np.sort(s1[h1:]))
    cands = _candidates(*sel)
    lvl = alpha / 4
    best: tuple[float, int, int, float] | None = None  # (score, event, order, c)
    for ev, count in enumerate((_counts_ge, _counts_le)):
        k = (count(sel[0], cands), count(sel[1], cands))
        n = (h0, h1)
        for order in (0, 1):  # 0: numerator x, 1: numerator x'
            a, b = (0, 1) if order == 0 else (1, 0)
            sc = _log_ratio(_cp_low(k[a], n[a], lvl), _cp_high(k[b], n[b], lvl), delta)
            sc = np.where(k[a] >= min(MIN_COUNT, n[a]), sc, -np.inf)
            i = int(np.argmax(sc))
            if best is None or sc[i] > best[0]:
                best = (float(sc[i]), ev, order, float(cands[i]))
    n_est = min(s0.size - h0, s1.size - h1)
    if best is None or best[0] == -math.inf:
        return _none("empirical", min(h0, h1), n_est, alpha)
    _, ev, order, c = best
    count = _counts_ge if ev == 0 else _counts_le
    a, b = (0, 1) if order == 0 else (1, 0)
    ca = np.array([c])
    ka, kb = count(est[a], ca), count(est[b], ca)
    p_low = float(_cp_low(ka, est[a].size, lvl)[0])
    p_high = float(_cp_high(kb, est[b].size, lvl)[0])
    lb = float(_log_ratio(np.array([p_low]), np.array([p_high]), delta)[0])
    return Bound("empirical", lb, "s >= c" if ev == 0 else "s <= c", c,
                 "x/x'" if order == 0 else "x'/x", p_low, p_high, min(h0, h1), n_est, alpha)


def attainable_bound(n_estimate: int, delta: float, alpha: float) -> float:
    """The largest value `empirical_bound` can return with n_estimate runs per stream in
    the estimation half (perfect separation): a configured eps at or above it cannot fail."""
    n = max(1, n_estimate)
    k = np.array([n])
    lo = _cp_low(k, n, alpha / 4)
    hi = _cp_high(np.array([0]), n, alpha / 4)
    return float(_log_ratio(lo, hi, delta)[0])


def known_null_bound(z1: FloatArray, delta: float, alpha: float) -> Bound:
    """The known-law bound: z1 are scores on x' standardised so that on x they are N(0, 1).

    For E = {z >= c}: eps >= ln((P_x'(E) - delta) / Phi(-c)); for E = {z <= c}:
    eps >= ln((Phi(c) - delta) / P_x'(E)). The threshold and event are chosen on the first
    half of z1 and P_x'(E) is bounded (one-sided Clopper-Pearson at alpha/4) on the second
    half. To choose, the first half is summarised as N(m, s^2) (its mean and deviation)
    and the threshold that maximises the bound expected on the second half is taken: tail
    counts of a few runs are too noisy to choose by. Holds with probability >= 1 - alpha/2
    when the claimed law is right (see null_law_check).
    """
    z1 = np.asarray(z1, dtype=np.float64)
    h = z1.size // 2
    if h < 2:
        raise AuditError("need at least 4 runs on x'")
    sel, est = z1[:h], np.sort(z1[h:])
    n = est.size
    m, sd = float(np.mean(sel)), max(float(np.std(sel, ddof=1)), 1e-12)
    lvl = alpha / 4
    cands = np.unique(np.concatenate([np.linspace(-40.0, 40.0, 8001), sel]))
    # a pessimistic count (two standard deviations below the expected one), so the chosen
    # threshold keeps enough runs in the event on the estimation half
    k_up = _pessimistic(n * stats.norm.sf(cands, m, sd))
    up = _log_ratio(_cp_low(k_up, n, lvl), stats.norm.sf(cands), delta)
    k_dn = n - _pessimistic(n * stats.norm.sf(cands, m, sd))
    down = _log_ratio(stats.norm.cdf(cands), _cp_high(k_dn, n, lvl), delta)
    iu, idn = int(np.argmax(up)), int(np.argmax(down))
    if max(up[iu], down[idn]) == -math.inf:
        return _none("known-null", h, n, alpha)
    ca = np.array([cands[iu] if up[iu] >= down[idn] else cands[idn]])
    if up[iu] >= down[idn]:
        p_low = float(_cp_low(_counts_ge(est, ca), n, lvl)[0])
        p_high = float(stats.norm.sf(ca[0]))
        ev, order = "s >= c", "x'/x"
    else:
        p_low = float(stats.norm.cdf(ca[0]))
        p_high = float(_cp_high(_counts_le(est, ca), n, lvl)[0])
        ev, order = "s <= c", "x/x'"
    lb = float(_log_ratio(np.array([p_low]), np.array([p_high]), delta)[0])
    return Bound("known-null", lb, ev, float(ca[0]), order, p_low, p_high, h, n, alpha)


def gauss_pair_eps(m: float, delta: float, p_low: float = 1.0) -> tuple[float, float]:
    """(eps lower bound, threshold c) from the exact law of a standardised score that is
    N(0, 1) on x and, on x', N(m_T, 1) given the release ticks T with P(m_T >= m) >=
    p_low: for E = {z >= c}, P_x'(E) >= p_low Phi(m - c) and P_x(E) = Phi(-c), so
    eps >= max_c ln((p_low Phi(m - c) - delta) / Phi(-c)). With p_low = 1 and m the
    pair's mu this is the exact privacy profile of the claimed law on the pair (no
    sampling). Computed in logs over a fine grid of c (every c is valid: no choice is
    made on data)."""
    from scipy.special import log_ndtr

    if m <= 0.0 or p_low <= delta:
        return -math.inf, math.nan
    c = np.linspace(-10.0, m + 40.0, 20001)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        num = np.log(p_low) + log_ndtr(m - c)
        # ln(e^num - delta), -inf where e^num <= delta
        lnum = num + np.log1p(-np.minimum(delta * np.exp(-num), 1.0))
        lb = lnum - log_ndtr(-c)
    lb = np.where(np.isfinite(lb), lb, -np.inf)
    i = int(np.argmax(lb))
    return float(lb[i]), float(c[i])


#: quantiles of m_T tried (on the selection half) for the exact-pair bound
_M_QUANTILES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5)


def exact_pair_bound(m1: FloatArray, delta: float, alpha: float) -> Bound:
    """The exact-pair bound of a known-law Gaussian score (`gauss_pair_eps`): m1 holds,
    per run on x', the score's mean given that run's release ticks (|d|_C). If it is the
    same in every run (ticks are public and fixed: GaussianCC, BaseCC), the bound is
    exact: the claimed law itself is not (eps, delta)-DP on the pair. Otherwise (the
    release ticks are random: PartitionCC) a level m is chosen on the first half and
    P(m_T >= m) is bounded from below on the second half (Clopper-Pearson at alpha/4):
    the only sampling is of the ticks; the Gaussian noise is integrated out exactly, so
    the bound is not capped by the number of runs. Valid when the claimed law holds (the
    null-law check)."""
    m1 = np.asarray(m1, dtype=np.float64)
    if m1.size == 0:
        raise AuditError("no runs on x'")
    if float(np.max(m1)) == float(np.min(m1)):
        lb, c = gauss_pair_eps(float(m1[0]), delta)
        return Bound("exact-pair", lb, "s >= c", c, "x'/x", 1.0, 0.0, 0, 0, alpha)
    h = m1.size // 2
    sel, est = m1[:h], m1[h:]
    best = max(_M_QUANTILES, key=lambda q: gauss_pair_eps(
        float(np.quantile(sel, q)), delta, 1.0 - q)[0])
    m = float(np.quantile(sel, best))
    k = np.array([int(np.sum(est >= m))])
    p_low = float(_cp_low(k, est.size, alpha / 4)[0])
    lb, c = gauss_pair_eps(m, delta, p_low)
    return Bound("exact-pair", lb, "s >= c", c, "x'/x", p_low, 0.0, h, est.size, alpha)


def pmf_pair_bound(pmf0: FloatArray, pmf1: FloatArray, delta: float) -> tuple[float, str,
                                                                              float]:
    """(eps lower bound, event, threshold) from the exact laws of an integer score on x
    (pmf0) and x' (pmf1): the best of ln((P_a(E) - delta) / P_b(E)) over every tail
    event {s >= c}, {s <= c} and both orders. No sampling: the laws are computed."""
    best = (-math.inf, "none", math.nan)
    for ev, tails in (("s >= c", lambda p: np.cumsum(p[::-1])[::-1]),
                      ("s <= c", np.cumsum)):
        t0, t1 = tails(pmf0), tails(pmf1)
        for num, den in ((t1, t0), (t0, t1)):
            sc = _log_ratio(num, den, delta)
            i = int(np.argmax(sc))
            if sc[i] > best[0]:
                best = (float(sc[i]), ev, float(i))
    return best


def _pessimistic(expected: FloatArray) -> npt.NDArray[np.int64]:
    return np.floor(np.maximum(expected - 2.0 * np.sqrt(expected), 0.0)).astype(np.int64)


def null_law_check(z0: FloatArray) -> float:
    """p-value of the Kolmogorov-Smirnov test of the standardised scores on x against
    N(0, 1) (runs that released nothing left out): small when the mechanism does not add
    the noise its law claims."""
    z = np.asarray(z0, dtype=np.float64)
    z = z[z > NO_RELEASE]
    if z.size == 0:
        raise AuditError("no run on x released anything")
    return float(stats.kstest(z, "norm").pvalue)


# ------------------------------------------------------------------------ the audit


@dataclass(frozen=True)
class AuditResult:
    """The verdict: passed iff every bound is <= eps and the null law (if any) holds.

    The false-alarm rate of "not passed" for a correct (eps, delta)-DP mechanism is at
    most alpha (alpha/2 per bound; the null-law check runs at `law_alpha`, added to it).
    """

    eps: float
    delta: float
    alpha: float
    runs: int
    bounds: tuple[Bound, ...]
    attainable: float
    null_law_p: float | None
    law_alpha: float

    @property
    def eps_lb(self) -> float:
        return max((b.eps_lb for b in self.bounds), default=-math.inf)

    @property
    def null_law_ok(self) -> bool:
        return self.null_law_p is None or self.null_law_p >= self.law_alpha

    @property
    def passed(self) -> bool:
        return self.eps_lb <= self.eps and self.null_law_ok


def check_spread(s0: FloatArray, s1: FloatArray, what: str = "score") -> None:
    """Fail loudly when the score is the same in every run: no test is possible (for ECC
    or SimECC this means nothing was released in the window; lengthen the stream)."""
    both = np.concatenate([s0, s1])
    if both.size == 0 or not np.all(np.isfinite(both)):
        raise AuditError(f"the {what} is missing or not finite")
    if float(np.max(both)) == float(np.min(both)):
        raise AuditError(
            f"the {what} is constant ({float(both[0])!r}) over all {both.size} runs: the "
            "mechanism released nothing that depends on the noise in this window; use more "
            "events or more ticks")


def judge(s0: FloatArray, s1: FloatArray, *, eps: float, delta: float, alpha: float = 0.05,
          known_null: bool = False, law_alpha: float = 1e-3, m1: FloatArray | None = None,
          pair_law: tuple[FloatArray, FloatArray] | None = None) -> AuditResult:
    """The bounds and the verdict: the empirical one always; the known-null one if
    `known_null` (s0, s1 are standardised under the claimed law); the exact-pair one from
    m1 (the score's mean per run on x' given its ticks: `exact_pair_bound`) or from the
    score's exact laws `pair_law` (`pmf_pair_bound`). The last two and the known-null bound
    stand on the claimed law, which the null-law check tests on the runs on x."""
    check_spread(s0, s1)
    bounds = [empirical_bound(s0, s1, delta, alpha)]
    p_law: float | None = None
    if known_null:
        bounds.append(known_null_bound(s1, delta, alpha))
        p_law = null_law_check(s0)
    if known_null and m1 is not None:
        bounds.append(exact_pair_bound(m1, delta, alpha))
    if pair_law is not None:
        lb, ev, c = pmf_pair_bound(pair_law[0], pair_law[1], delta)
        bounds.append(Bound("exact-pair", lb, ev, c, "", 0.0, 0.0, 0, 0, alpha))
        p_law = pmf_law_check(s0, pair_law[0])
    n_est = bounds[0].n_estimate
    return AuditResult(eps, delta, alpha, int(s0.size + s1.size), tuple(bounds),
                       attainable_bound(n_est, delta, alpha), p_law, law_alpha)


def pmf_law_check(k0: FloatArray, pmf0: FloatArray) -> float:
    """p-value of the KS test of integer scores on x against their exact law (conservative
    for a discrete law): small when the mechanism does not add the noise it claims."""
    cdf = np.cumsum(pmf0)

    def f(v: FloatArray) -> FloatArray:
        i = np.floor(np.asarray(v)).astype(np.int64)
        return np.where(i < 0, 0.0, cdf[np.clip(i, 0, cdf.size - 1)])

    return float(stats.kstest(np.asarray(k0, dtype=np.float64), f).pvalue)
