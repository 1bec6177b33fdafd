"""Which pair of streams and which score each mechanism gets: plans and the pair search.

`make_streams`, `default_streams` and `plan_for` (a `Plan`: the two streams, the score,
the known laws where there are some) per mechanism; `search_pair` and `pair_objective`
choose the pair the attack separates best (docs/audit.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats
from scipy.linalg import solve_triangular

from processor.audit.runs import (
    GaussianLaw,
    cc_noise_cov,
    gaussian_lr_score,
    increment_weights,
    insertion_neighbour,
    linear_score,
    matched_weights,
    prefix_sums,
    shift_profile,
    solve_lower,
)
from processor.audit.statistics import (
    NO_RELEASE,
    AuditError,
    FloatArray,
    Score,
    Stream,
    check_spread,
    empirical_bound,
    gauss_pair_eps,
    pmf_pair_bound,
)
from processor.core.baselines import gaussiancc_sigma, partitioncc_parameters
from processor.core.grid import UNIT

# ------------------------------------------------------------------------ plans


#: the event patterns a plan can put before the gap: "alternating" 1, 0, 1, 0, ... (the
#: shift moves the prefix sum at every other tick), "alternating0" 0, 1, 0, 1, ... (the
#: other phase), "pairs" 1, 1, 0, 0, "sparse" 1, 0, 0, "dense" 1, 1, 0, "ones" (all 1),
#: "empty" (no event: the neighbour is one event at tick 1, the prefix sums differ by 1 at
#: every tick)
PATTERNS = ("alternating", "alternating0", "pairs", "sparse", "dense", "ones", "empty")
_PERIODS: dict[str, tuple[float, ...]] = {
    "alternating": (1.0, 0.0), "alternating0": (0.0, 1.0), "pairs": (1.0, 1.0, 0.0, 0.0),
    "sparse": (1.0, 0.0, 0.0), "dense": (1.0, 1.0, 0.0), "ones": (1.0,)}


def make_streams(pattern: str, events: int, gap: int, at: int = 1
                 ) -> tuple[list[float | None], list[float | None]]:
    """(x, x'): `events` events of the pattern then `gap` ⊥ ticks, and its insertion
    neighbour at tick `at` (a 1 is queued there; the events from `at` on shift one tick
    later and the first ⊥ absorbs the shift, so the shift run covers ticks at..events)."""
    if pattern not in PATTERNS:
        raise AuditError(f"unknown pattern {pattern!r}; known: {', '.join(PATTERNS)}")
    if events < 0 or gap < 1:
        raise AuditError("need events >= 0 and gap >= 1")
    if not 1 <= at <= events + 1:
        raise AuditError("the insertion tick must lie in 1..events + 1")
    if pattern == "empty":
        vals: list[float | None] = [None] * events
    else:
        per = _PERIODS[pattern]
        vals = [per[i % len(per)] for i in range(events)]
    x0 = [*vals, *([None] * gap)]
    return x0, insertion_neighbour(x0, at)


@dataclass(frozen=True)
class Plan:
    """What the audit feeds a mechanism and what it looks at.

    score maps releases (runs x T) to one real per run; known_null says the score is
    standardised under the mechanism's claimed law (N(0, 1) on x exactly)."""

    x0: list[float | None]
    x1: list[float | None]
    score: Score
    known_null: bool
    feature: str
    #: for known-law Gaussian scores: releases on x' -> the mean of the score given the
    #: release ticks (|d|_C, the mu the pair exercises), for `exact_pair_bound`
    shift: Score | None = None
    #: for the tree's leaf score: the exact laws (pmf over 0..n) of the score on x and x'
    pair_law: tuple[FloatArray, FloatArray] | None = None


#: default (pattern, events, gap, feature) per mechanism; events 0: sized from (eps, delta)
#: by default_streams
DEFAULTS: dict[str, tuple[str, int, int, str]] = {
    "gaussiancc": ("empty", 63, 1, "lr"),
    "basecc": ("alternating", 0, 1, "lr"),
    "partitioncc": ("alternating", 0, 1, "lr"),
    "tree": ("alternating", 2000, 1, "leaves"),
    "ecc": ("alternating", 0, 0, "first"),
    "simecc": ("empty", 0, 0, "values"),
}
_FALLBACK = ("alternating", 400, 400, "matched")
#: SimECC's default stream holds this many blocks: every release carries the shift
SIMECC_BLOCKS = 8


def default_streams(mechanism: str, eps: float, delta: float) -> tuple[str, int, int, str]:
    """(pattern, events, gap, feature) for this mechanism. BaseCC, PartitionCC: enough
    alternating events for the shift to show (below, capped at 20,000 and 150,000). ECC: enough
    alternating events
    that Part's first checkpoint comes with probability >= 0.99 (ecc_part_term), then a gap
    that holds BCC's delay of the first release with probability >= 0.999. SimECC:
    SIMECC_BLOCKS blocks (simecc_gap_bound at 0.99), then the delay of the last release."""
    pattern, events, gap, feature = DEFAULTS.get(mechanism, _FALLBACK)
    if mechanism in ("basecc", "partitioncc"):
        # The likelihood ratio's mean on x' is about k eps sqrt(n) on n alternating events,
        # k = 0.04 (BaseCC) and 0.003 (PartitionCC, measured for eps 5 to 80). The
        # known-null bound exceeds eps once that mean is about sqrt(2.4 eps) and at least
        # 1.5: n = max(2.4 eps, 1.5^2) / (k eps)^2, doubled for margin, within a cost cap.
        # PartitionCC's cap: at eps = 1 the exact-pair bound needs the shift of ~150,000
        # events (the pair's mu ~0.33; run it with --backend sim).
        k, lo, hi = (0.04, 200, 20_000) if mechanism == "basecc" else (0.003, 1000, 150_000)
        want = 2.0 * max(2.4 * eps, 2.25) / (k * eps) ** 2
        events = 2 * math.ceil(min(max(want, lo), hi) / 2)
        return pattern, events, gap, feature
    if mechanism not in ("ecc", "simecc"):
        return pattern, events, gap, feature
    from processor.core.cc import bcc_alpha
    from processor.core.ecc import (
        ecc_parameters,
        ecc_part_term,
        simecc_gap_bound,
        simecc_parameters,
    )

    if mechanism == "ecc":
        need = 1
        for _ in range(3):  # the threshold grows with the tick: settle the fixed point
            need = math.ceil(ecc_part_term(eps, delta, 0.01, 2 * need + 1))
        events, blocks = 2 * need, 1
        ep = ecc_parameters(eps, delta)
        bcc_eps, bcc_delta = ep.bcc_eps, ep.bcc_delta
    else:
        blocks = SIMECC_BLOCKS
        events = blocks * simecc_gap_bound(eps, delta, 0.01, blocks)
        q = simecc_parameters(eps, delta)
        bcc_eps, bcc_delta = q.bcc_eps, q.bcc_delta
    delay = bcc_alpha(bcc_eps, bcc_delta, blocks, 1e-3)
    return pattern, events, math.ceil(delay) + 10, feature


FEATURES = ("lr", "leaves", "values", "increments", "matched", "final", "first")


def first_release_tick(y: FloatArray) -> FloatArray:
    """The tick of the first change of y per run (T + 1 if y never changes): the timing
    channel of counters whose releases are scheduled (ECC's BCC delays)."""
    moved = np.diff(y, axis=1, prepend=0.0) != 0.0
    any_ = moved.any(axis=1)
    first = np.where(any_, np.argmax(moved, axis=1) + 1, y.shape[1] + 1)
    return np.asarray(first, dtype=np.float64)


def plan_for(mechanism: str, eps: float, delta: float, x0: list[float | None],
             x1: list[float | None], feature: str, **params: int | str) -> Plan:
    """The score `feature` for this mechanism on (x, x'):

    - "lr": the likelihood-ratio statistic under the mechanism's claimed Gaussian law
      (gaussiancc: independent sigma_t; basecc: the CC covariance; partitioncc: the CC
      covariance over its releases, which happen at public ticks), standardised: enables
      the known-null bound;
    - "values": for ecc and simecc, the same statistic over the sequence of released values
      (their CC's law; the release ticks are BCC-delayed, so the shift is read at the
      release tick, exact when d is constant as with the "empty" pattern): a feature for the
      assumption-free bound only;
    - "increments": the Section 8 linear attack sum_t dy_t (x'_t - x_t);
    - "matched": sum_t y_t d_t, the whole release stream against the prefix shift;
    - "final": y_T;
    - "first": the tick of the first release.
    """
    d = shift_profile(x0, x1)
    s0 = prefix_sums(x0)
    n = len(x0)
    if not np.any(d):
        raise AuditError("the two streams have the same prefix sums: nothing to test")
    if feature == "leaves":
        if mechanism != "tree":
            raise AuditError("the leaves feature is for the Laplace tree")
        return tree_leaf_plan(eps, x0, x1)
    if feature == "increments":
        return Plan(x0, x1, linear_score(increment_weights(x0, x1)), False, feature)
    if feature == "matched":
        return Plan(x0, x1, linear_score(matched_weights(x0, x1)), False, feature)
    if feature == "first":
        return Plan(x0, x1, first_release_tick, False, feature)
    if feature == "final":
        w = np.zeros(n)
        w[-1] = 1.0
        return Plan(x0, x1, linear_score(w), False, feature)
    if feature == "values":
        if mechanism not in ("ecc", "simecc"):
            raise AuditError("the values feature is for ecc and simecc")
        from processor.core.ecc import ecc_parameters, simecc_parameters

        # The law of the mechanism as configured: the tight calibration gives its CC
        # another (eps, delta) split than the paper's.
        cal = str(params.get("calibration", "paper"))
        ep = (ecc_parameters(eps, delta, cal) if mechanism == "ecc"
              else simecc_parameters(eps, delta, cal))
        # ECC and SimECC release once per block (blocks of tens of ticks or more)
        law = GaussianLaw(cc_noise_cov(ep.cc_eps, ep.cc_delta, min(n, 512)))
        return Plan(x0, x1, _release_lr(law, d, s0), False, feature)
    if feature != "lr":
        raise AuditError(f"unknown feature {feature!r}; known: {', '.join(FEATURES)}")
    if mechanism == "gaussiancc":
        sig = np.array([gaussiancc_sigma(eps, delta, t) for t in range(1, n + 1)])
        mu = math.sqrt(float(np.sum(d * d / sig**2)))
        return Plan(x0, x1, gaussian_lr_score(d, s0, sig), True, feature, _constant(mu))
    if mechanism == "basecc":
        law = GaussianLaw(cc_noise_cov(eps, delta, n))
        wd = solve_lower(law.chol, d)
        m = math.sqrt(float(wd @ wd))
        w = _solve_upper(law.chol.T, wd)  # C^-1 d
        return Plan(x0, x1, linear_score(w, float(s0 @ w), m), True, feature, _constant(m))
    if mechanism == "partitioncc":
        p = partitioncc_parameters(eps, delta, int(params.get("horizon", 10_000)))
        law = GaussianLaw(cc_noise_cov(p.cc_eps, p.cc_delta, _max_blocks(n)))
        return Plan(x0, x1, _release_lr(law, d, s0), True, feature,
                    _release_lr(law, d, s0, shift=True))
    raise AuditError(f"no likelihood-ratio score for {mechanism!r}; use increments, "
                     "matched or final")


def tree_leaf_ticks(n: int) -> npt.NDArray[np.int64]:
    """Ticks (1-based, <= n) at which LaplaceTree's release moves by exactly one fresh
    leaf: inside a running dyadic interval I_k = [2^(k-1), 2^k - 1] (not at its last tick,
    where the interval's sum is released instead), at odd local time tau = t - 2^(k-1) + 1,
    the bounded tree's decomposition of tau is that of tau - 1 plus the leaf tau, so
    y_t - y_(t-1) = x_t + one DLap node."""
    t = np.arange(1, n + 1, dtype=np.int64)
    k = np.array([int(v).bit_length() for v in t], dtype=np.int64)
    start = np.left_shift(1, k - 1)
    tau = t - start + 1
    keep = (tau % 2 == 1) & (t != 2 * start - 1)
    return np.asarray(t[keep], dtype=np.int64)


def tree_leaf_plan(eps: float, x0: list[float | None], x1: list[float | None]) -> Plan:
    """The leaf attack on the Laplace tree (a swap-private counter): at every leaf tick t
    (tree_leaf_ticks) where the neighbour changes the input (x'_t - x_t = D = +-1), the
    release's increment o_t = y_t - y_(t-1) is x_t plus one DLap node of the block's
    scale; B_t = 1{D (o_t - x_t) > 1/2} is a Bernoulli of a known probability on x (the
    node beyond +1/2) and on x' (beyond -1/2). The score is K = sum B_t: a sum of
    independent Bernoullis under the claimed law, so its law on both streams is computed
    exactly (pair_law) and the exact-pair bound needs no sampling; the runs on x check the
    law (KS), those on both feed the assumption-free bound too. The Laplace likelihood
    ratio of one node is a clipped sign of the same event, so little is lost."""
    from processor.core.bounded import laplace_tree_scale

    n = len(x0)
    v0 = np.array([0.0 if v is None else float(v) for v in x0])
    v1 = np.array([0.0 if v is None else float(v) for v in x1])
    if np.any((v0 != np.round(v0)) | (v1 != np.round(v1))):
        raise AuditError("the leaves feature takes values in {0, 1}")
    ticks = tree_leaf_ticks(n)
    ticks = ticks[v0[ticks - 1] != v1[ticks - 1]]
    if ticks.size == 0:
        raise AuditError("no leaf tick where the two streams differ")
    sign = v1[ticks - 1] - v0[ticks - 1]
    x_at = v0[ticks - 1]
    half = UNIT // 2
    pmf0, pmf1 = np.ones(1), np.ones(1)
    levels = np.array([int(t).bit_length() for t in ticks])
    for k in np.unique(levels):
        cnt = int(np.sum(levels == k))
        scale = laplace_tree_scale(eps / 2.0, (1 << (int(k) - 1)) - 1, UNIT)
        r = math.exp(-1.0 / scale)
        q = r ** (half + 1) / (1.0 + r)          # P(N >= UNIT/2 + 1)
        p = 1.0 - r**half / (1.0 + r)            # P(N >= -UNIT/2 + 1)
        pmf0 = np.convolve(pmf0, stats.binom.pmf(np.arange(cnt + 1), cnt, q))
        pmf1 = np.convolve(pmf1, stats.binom.pmf(np.arange(cnt + 1), cnt, p))

    def score(y: FloatArray) -> FloatArray:
        prev = np.concatenate([np.zeros((y.shape[0], 1)), y[:, :-1]], axis=1)
        o = (y - prev)[:, ticks - 1]
        return np.asarray(np.sum(sign * (o - x_at) > 0.5, axis=1), dtype=np.float64)

    return Plan(x0, x1, score, False, "leaves", pair_law=(pmf0, pmf1))


def _max_blocks(n: int) -> int:
    # PartitionCC closes at most one block per tick; its blocks hold many events, so a
    # covariance over min(n, 2048) releases is plenty (more releases raise AuditError).
    return min(n, 2048)


def _solve_upper(up: FloatArray, b: FloatArray) -> FloatArray:
    return np.asarray(solve_triangular(up, b, lower=False), dtype=np.float64)


def _constant(m: float) -> Score:
    def f(y: FloatArray) -> FloatArray:
        return np.full(y.shape[0], m, dtype=np.float64)

    return f


def _release_lr(law: GaussianLaw, d: FloatArray, s0: FloatArray, shift: bool = False
                ) -> Score:
    """The likelihood-ratio score of a counter that releases CC estimates of the prefix sum
    at public ticks (the ticks where y changes) and holds in between: per run, over its
    releases v_1..v_L at ticks t_1..t_L, z = d' C^-1 (v - s_t) / |d|_C with C the CC
    covariance of releases 1..L. Given the ticks, z is N(0, 1) on x whatever the ticks are,
    so it is N(0, 1) on x exactly. A run whose releases carry no shift (d = 0 at every
    release) scores its last release alone (still N(0, 1) on x). A run without any release
    scores NO_RELEASE, below every threshold: on x that only moves probability from
    {z >= c} to {z <= c}, so Phi(-c) and Phi(c) stay conservative in the known-null bound,
    and the null-law check leaves those runs out. shift=True: the score's mean given the
    ticks, |d|_C over the releases instead (0 for a run without releases)."""
    def f(y: FloatArray) -> FloatArray:
        out = np.zeros(y.shape[0], dtype=np.float64)
        cap = law.chol.shape[0]
        for r in range(y.shape[0]):
            row = y[r]
            ticks = np.flatnonzero(np.diff(row, prepend=0.0) != 0.0)
            if ticks.size == 0:
                out[r] = 0.0 if shift else NO_RELEASE
                continue
            if ticks.size > cap:
                raise AuditError(f"more than {cap} releases in one run")
            resid = row[ticks] - s0[ticks]
            z, m = law.z(resid, d[ticks])
            if shift:
                out[r] = m
                continue
            if math.isnan(z):
                e = np.zeros(ticks.size)
                e[-1] = 1.0
                z, _ = law.z(resid, e)
            out[r] = z
        return out

    return f


# ------------------------------------------------------------ worst-case pair search


@dataclass(frozen=True)
class PairChoice:
    """One candidate pair (pattern, insertion tick) and how strongly it separates under
    the mechanism's attack: `objective` is an eps lower bound (exact where the law is
    known, from a pilot sample otherwise; -inf: nothing to test on this pair)."""

    pattern: str
    at: int
    objective: float
    how: str


def candidate_pairs(events: int) -> list[tuple[str, int]]:
    """The pairs searched: every pattern, the shift run starting at tick 1, 2 (the other
    phase against the tree's and the partition's blocks) or a third of the way in (a
    shorter run at another position)."""
    ats = sorted({1, 2, max(1, events // 3)})
    return [(p, a) for p in PATTERNS for a in ats if a <= events]


#: releases of `runs` runs on a stream, for a pilot: (stream, runs, label) -> runs x T
Pilot = Callable[[Stream, int, str], FloatArray]


def pair_objective(mechanism: str, eps: float, delta: float, feature: str,
                   params: dict[str, int], pilot: Pilot | None, pilot_runs: int,
                   alpha: float = 0.05) -> Callable[[list[float | None], list[float | None]],
                                                    tuple[float, str]]:
    """How strongly a pair separates under this mechanism's audit, for the search:

    - GaussianCC, BaseCC (lr): the exact profile of the pair's mu |d|_C (no sampling);
    - the tree (leaves): the exact-pair bound of the leaf score's computed laws;
    - PartitionCC (lr): the exact-pair profile at the 10% quantile of mu over the release
      ticks of a pilot's runs on x';
    - anything else (ECC, SimECC, other features): the assumption-free bound on a pilot.

    The pilot must be keyed apart from the audit's own runs (the CLI uses another seed), so
    the choice is independent of the runs that are then judged."""
    cache: dict[int, GaussianLaw] = {}

    def f(x0: list[float | None], x1: list[float | None]) -> tuple[float, str]:
        n = len(x0)
        if mechanism == "basecc" and feature == "lr":
            law = cache.get(n)
            if law is None:
                law = cache[n] = GaussianLaw(cc_noise_cov(eps, delta, n))
            wd = solve_lower(law.chol, shift_profile(x0, x1))
            return gauss_pair_eps(math.sqrt(float(wd @ wd)), delta)[0], "exact mu"
        plan = plan_for(mechanism, eps, delta, x0, x1, feature, **params)
        if plan.pair_law is not None:
            return pmf_pair_bound(plan.pair_law[0], plan.pair_law[1], delta)[0], "exact law"
        if plan.shift is not None and mechanism == "gaussiancc":
            m = float(plan.shift(np.zeros((1, n)))[0])
            return gauss_pair_eps(m, delta)[0], "exact mu"
        if pilot is None:
            raise AuditError("this mechanism's pair search needs a pilot backend")
        if plan.shift is not None:
            m1 = plan.shift(pilot(x1, pilot_runs, "pilot/x'"))
            q = float(np.quantile(m1, 0.1))
            return gauss_pair_eps(q, delta, 0.9)[0], f"pilot of {pilot_runs} runs (ticks)"
        s0 = plan.score(pilot(x0, pilot_runs, "pilot/x"))
        s1 = plan.score(pilot(x1, pilot_runs, "pilot/x'"))
        check_spread(s0, s1)
        return empirical_bound(s0, s1, delta, alpha).eps_lb, f"pilot of {pilot_runs} runs"

    return f


def search_pair(events: int, gap: int,
                objective: Callable[[list[float | None], list[float | None]],
                                    tuple[float, str]]
                ) -> tuple[PairChoice, list[PairChoice]]:
    """The candidate pair with the largest objective (ties: the first), and every
    candidate's result. Candidates on which the score cannot vary (the streams' prefix
    sums agree, or nothing is released) score -inf."""
    tried: list[PairChoice] = []
    seen: set[tuple[tuple[float | None, ...], tuple[float | None, ...]]] = set()
    for pattern, at in candidate_pairs(events):
        x0, x1 = make_streams(pattern, events, gap, at)
        key = (tuple(x0), tuple(x1))
        if key in seen:
            continue
        seen.add(key)
        try:
            val, how = objective(x0, x1)
        except AuditError as exc:
            val, how = -math.inf, f"skipped: {exc}"
        tried.append(PairChoice(pattern, at, val, how))
    if not tried or max(c.objective for c in tried) == -math.inf:
        why = "; ".join(f"{c.pattern} at {c.at}: {c.how}" for c in tried[:2])
        raise AuditError(f"no candidate pair separates the streams ({why}; ...): "
                         "lengthen them")
    best = max(tried, key=lambda c: c.objective)
    return best, tried
