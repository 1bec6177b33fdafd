"""The runs an audit scores: neighbouring streams, releases of the core counters, scores.

The insertion and per-unit neighbours of a stream, the release rows of independently
keyed core counters (`core_releases`), the scores a run is reduced to (linear, matched,
Gaussian likelihood ratio under CC's claimed law) and `audit`, which runs and judges.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import solve_triangular

from processor.audit.statistics import (
    AuditError,
    AuditResult,
    Factory,
    FloatArray,
    Score,
    Stream,
    Transcript,
    judge,
)
from processor.core.api import Counter
from processor.core.bounded import gaussian_sigma2, tree_node_sigma2
from processor.core.grid import UNIT

# ------------------------------------------------------------------------ streams


def insertion_neighbour(xs: Stream, i: int, value: float = 1.0) -> list[float | None]:
    """The insertion neighbour of xs at tick i (1-based, Definition 3.11): value at i, the
    events from i on shift one tick later until the first ⊥ at or after i absorbs the
    shift; same length as xs (if no ⊥ absorbs it, the last event falls off the end)."""
    if not 1 <= i <= len(xs):
        raise ValueError("insertion tick out of range")
    out: list[float | None] = [*xs[: i - 1], value]
    k = i - 1
    while k < len(xs) and xs[k] is not None:
        out.append(xs[k])
        k += 1
    out.extend(xs[k + 1:])
    return out[: len(xs)]


def unit_neighbour(xs: Stream, i: int, k: int, value: float = 1.0) -> list[float | None]:
    """k events of one privacy unit inserted at tick i (docs/privacy-unit.md): the
    insertion neighbour applied k times, each intermediate stream a valid one, so the pair
    is a k-step chain of edit neighbours (Lemma 1 there)."""
    if k < 1:
        raise ValueError("k must be >= 1")
    out: list[float | None] = list(xs)
    for _ in range(k):
        out = insertion_neighbour(out, i, value)
    return out


def prefix_sums(xs: Stream) -> FloatArray:
    """s_1..s_T (⊥ counts as 0)."""
    return np.cumsum([0.0 if v is None else float(v) for v in xs], dtype=np.float64)


def shift_profile(x0: Stream, x1: Stream) -> FloatArray:
    """d_t = s'_t - s_t: how the neighbour moves every prefix sum (the signal every score
    looks for). For an insertion at tick 1, d_t = 1 - x_t until the shift is absorbed."""
    if len(x0) != len(x1):
        raise AuditError("the two streams must have the same length")
    return prefix_sums(x1) - prefix_sums(x0)


# ------------------------------------------------------------------------ releases


def run_transcript(m: Counter, xs: Stream) -> Transcript:
    """Feed xs (runs of ⊥ through skip) and return the ticks where y changed."""
    out: Transcript = []
    i = 0
    while i < len(xs):
        x = xs[i]
        if x is None:
            j = i
            while j < len(xs) and xs[j] is None:
                j += 1
            out.extend(m.skip(j - i))
            i = j
            continue
        before = m.y
        y = m.update(x)
        if y != before:
            out.append((m.t, y))
        i += 1
    return out


def release_row(tr: Transcript, n: int) -> FloatArray:
    """y_1..y_n from the changes of a transcript (y holds between changes, y_0 = 0)."""
    row = np.zeros(n, dtype=np.float64)
    prev_t, prev_y = 1, 0.0
    for t, y in tr:
        if t > n:
            break
        row[prev_t - 1 : t - 1] = prev_y
        prev_t, prev_y = t, y
    row[prev_t - 1:] = prev_y
    return row


def core_releases(factory: Factory, xs: Stream, runs: int, label: str) -> FloatArray:
    """Releases (runs x T) of independently keyed counters factory(f"{label}/{i}") on xs."""
    return np.stack([release_row(run_transcript(factory(f"{label}/{i}"), xs), len(xs))
                     for i in range(runs)]) if runs else np.zeros((0, len(xs)))


# ------------------------------------------------------------------------ scores


def linear_score(w: FloatArray, offset: float = 0.0, scale: float = 1.0) -> Score:
    """s = (y . w - offset) / scale per run."""
    w = np.asarray(w, dtype=np.float64)

    def f(y: FloatArray) -> FloatArray:
        return np.asarray((y @ w - offset) / scale, dtype=np.float64)

    return f


def increment_weights(x0: Stream, x1: Stream) -> FloatArray:
    """The Section 8 linear attack, generalised: S = sum_t dy_t (x'_t - x_t), the increments
    of y matched to the per-tick input difference, written as y . w. It sees the queue
    shift as the differences of consecutive inputs, which is what swap-private counters
    protect only once per changed tick."""
    e = shift_profile(x0, x1)
    dx = np.diff(e, prepend=0.0)  # x'_t - x_t
    w = dx.copy()
    w[:-1] -= dx[1:]  # sum_t (y_t - y_{t-1}) dx_t = sum_t y_t (dx_t - dx_{t+1})
    return w


def matched_weights(x0: Stream, x1: Stream) -> FloatArray:
    """sum_t y_t d_t: a statistic over the whole release stream, matched to the shift of
    the prefix sums (what a counter that holds and re-releases its estimate exposes)."""
    return shift_profile(x0, x1)


def gaussian_lr_score(d: FloatArray, s0: FloatArray, sigma: FloatArray) -> Score:
    """The likelihood-ratio statistic for independent Gaussian noise (GaussianCC):
    z = sum_t d_t (y_t - s_t) / sigma_t^2 / m, m = sqrt(sum_t d_t^2 / sigma_t^2).
    Exactly N(0, 1) on x and N(m, 1) on x' under the claimed law; m is the mu of the
    Gaussian DP guarantee that this pair of streams exercises."""
    w = d / sigma**2
    m = math.sqrt(float(np.sum(d * d / sigma**2)))
    if m == 0.0:
        raise AuditError("the two streams have the same prefix sums: nothing to test")
    return linear_score(w, float(s0 @ w), m)


def cc_noise_cov(eps: float, delta: float, n: int) -> FloatArray:
    """Covariance (events^2) of y_t - s_t, t = 1..n, of UnboundedCC(eps, delta) with the
    tree base (BaseCC, and PartitionCC's counter of block sums), from its construction
    (cc.py): every completed interval I_k adds one release of variance a^2, so ticks s <= t
    share K(s) of them; inside the running interval I_k (not at its last tick) the
    GaussianTree of horizon 2^{k-1} - 1 adds, at local time tau, one node of variance b_k^2
    per set bit h of tau (the node tau >> h of level h), shared by two ticks of the same
    interval exactly when both have bit h set and the same tau >> h."""
    num, den = gaussian_sigma2(eps / 2, delta / 2, float(UNIT))
    a2 = num / den / UNIT**2
    t = np.arange(1, n + 1, dtype=np.int64)
    completed = np.array([(int(v) + 1).bit_length() - 1 for v in t], dtype=np.int64)
    level = np.array([int(v).bit_length() for v in t], dtype=np.int64)  # t in I_level
    cov = a2 * np.minimum.outer(completed, completed).astype(np.float64)
    start = np.left_shift(1, level - 1)
    tau = t - start + 1
    inner = t != (2 * start - 1)  # the last tick of I_k is p_k alone
    same = np.equal.outer(level, level) & np.logical_and.outer(inner, inner)
    for k in np.unique(level[inner]):
        h_n = int((1 << (int(k) - 1)) - 1)
        num, den = tree_node_sigma2(eps / 2, delta / 2, h_n, UNIT)
        b2 = num / den / UNIT**2
        rows = np.flatnonzero((level == k) & inner)
        tk = tau[rows]
        shared = np.zeros((rows.size, rows.size), dtype=np.float64)
        for h in range(h_n.bit_length()):
            on = ((tk >> h) & 1).astype(bool)
            node = np.where(on, tk >> h, -1)
            shared += np.equal.outer(node, node) & np.logical_and.outer(on, on)
        cov[np.ix_(rows, rows)] += b2 * shared * same[np.ix_(rows, rows)]
    return cov


class GaussianLaw:
    """A claimed noise law y = m + e, e ~ N(0, cov), for the likelihood-ratio score
    z = d' C^-1 (v - m0) / sqrt(d' C^-1 d) of a mean shift d: N(0, 1) on x, N(|d|_C, 1) on x'.
    Works on any leading block of the covariance (releases 1..L), via one Cholesky factor."""

    def __init__(self, cov: FloatArray) -> None:
        self.chol = np.linalg.cholesky(np.asarray(cov, dtype=np.float64))

    def z(self, resid: FloatArray, d: FloatArray) -> tuple[float, float]:
        """(z, m) for one run: resid = v - m0 and d over the first L releases."""
        n = resid.size
        if n == 0:
            return math.nan, 0.0
        lo = self.chol[:n, :n]
        wd = solve_lower(lo, d)
        m2 = float(wd @ wd)
        if m2 == 0.0:
            return math.nan, 0.0
        wr = solve_lower(lo, resid)
        return float(wd @ wr) / math.sqrt(m2), math.sqrt(m2)


def solve_lower(lo: FloatArray, b: FloatArray) -> FloatArray:
    return np.asarray(solve_triangular(lo, b, lower=True), dtype=np.float64)


def audit(factory: Factory, x0: Stream, x1: Stream, runs: int, *, eps: float, delta: float,
          score: Score, alpha: float = 0.05, known_null: bool = False,
          label: str = "audit") -> AuditResult:
    """Run `runs` independently keyed runs of the core counters on each stream (ids
    f"{label}/0/{i}" and f"{label}/1/{i}"), score every run, and judge."""
    if len(x0) != len(x1):
        raise AuditError("the two streams must have the same length")
    y0 = core_releases(factory, x0, runs, f"{label}/0")
    y1 = core_releases(factory, x1, runs, f"{label}/1")
    return judge(score(y0), score(y1), eps=eps, delta=delta, alpha=alpha,
                 known_null=known_null)
