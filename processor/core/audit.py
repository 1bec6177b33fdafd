"""Empirical privacy audit: a distinguishing test on neighbouring streams (Section 8 spirit).

Pure: no I/O. Given a factory of counters and two neighbouring streams, run many
independently keyed runs on each, reduce each run's public transcript to a feature (for
example y at the last tick, or the first release), and turn the frequencies of an event
E under both streams into a lower bound on epsilon: if the mechanism is (eps, delta)-DP
then P0(E) <= e^eps P1(E) + delta, so

    eps_lb = ln((P0_low(E) - delta) / P1_high(E))

with one-sided Clopper-Pearson bounds P0_low <= P0(E), P1_high >= P1(E), is below eps
except with probability alpha. The event (and the direction, x vs x' or x' vs x) is chosen
on the first half of the runs and evaluated on the second half, so the choice costs
nothing: each of the two bounds is taken at level alpha/2 and the false-alarm rate of
"eps_lb > eps" is at most alpha for a correct mechanism.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import stats

from processor.core.api import Counter

Stream = Sequence[float | None]
#: (t, y) at every tick where y changed, then ("end", T)
Transcript = list[tuple[int, float]]
Feature = Callable[[Transcript, int], Hashable]
Factory = Callable[[str], Counter]


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """The exact two-sided (1 - alpha) Clopper-Pearson interval for k successes in n
    trials; each end is a one-sided (1 - alpha/2) bound."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError("need 0 <= k <= n and n > 0")
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


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


def final_value(tr: Transcript, n: int) -> Hashable:
    """y at the last tick (0.0 if nothing was released)."""
    return tr[-1][1] if tr else 0.0


def first_release(tr: Transcript, n: int) -> Hashable:
    """(tick, value) of the first change of y, or None."""
    return tr[0] if tr else None


def bucketed(feature: Feature, width: float) -> Feature:
    """A numeric feature rounded down to multiples of `width` (histogram buckets)."""

    def f(tr: Transcript, n: int) -> Hashable:
        v = feature(tr, n)
        if isinstance(v, int | float) and not isinstance(v, bool):
            return math.floor(v / width) * width
        return v

    return f


@dataclass(frozen=True)
class AuditResult:
    """The outcome: eps_lb (a lower bound on epsilon with confidence 1 - alpha; -inf if
    no event separates the streams) next to the configured eps."""

    eps: float
    delta: float
    eps_lb: float
    event: str
    direction: str
    runs: int
    p0_low: float
    p1_high: float
    alpha: float

    @property
    def passed(self) -> bool:
        return self.eps_lb <= self.eps


@dataclass(frozen=True)
class _Event:
    """One candidate event on a feature value: equality, or a threshold for numbers."""

    op: str
    c: Hashable

    def __call__(self, f: Hashable) -> bool:
        if self.op == "==":
            return bool(f == self.c)
        if not isinstance(f, int | float) or not isinstance(self.c, int | float):
            return False
        return f <= self.c if self.op == "<=" else f >= self.c

    def __str__(self) -> str:
        return f"f {self.op} {self.c!r}"


def _events(a: list[Hashable], b: list[Hashable]) -> list[_Event]:
    """Candidate events: each observed value, and for numbers every threshold {f <= c}
    and {f >= c}."""
    vals = set(a) | set(b)
    out = [_Event("==", v) for v in vals]
    nums = sorted(v for v in vals if isinstance(v, int | float) and not isinstance(v, bool))
    for c in nums:
        out += [_Event("<=", c), _Event(">=", c)]
    return out


def _score(ka: int, kb: int, na: int, nb: int, delta: float, alpha: float) -> float:
    """The bound the event would give on these counts (used on the selection half)."""
    lo = clopper_pearson(ka, na, alpha)[0]
    hi = clopper_pearson(kb, nb, alpha)[1]
    return math.log((lo - delta) / hi) if lo > delta else -math.inf


def eps_lower_bound(f0: list[Hashable], f1: list[Hashable], delta: float, alpha: float,
                    eps: float = math.inf) -> AuditResult:
    """The audit's statistics from the features of the runs on each stream (see module
    docstring; the first half of each list selects, the second half estimates)."""
    h0, h1 = len(f0) // 2, len(f1) // 2
    sel0, sel1, est0, est1 = f0[:h0], f1[:h1], f0[h0:], f1[h1:]
    best: tuple[float, _Event, bool] | None = None
    for ev in _events(sel0, sel1):
        k0 = sum(map(ev, sel0))
        k1 = sum(map(ev, sel1))
        for flip in (False, True):
            a, b = (k1, k0) if flip else (k0, k1)
            sc = _score(a, b, *((h1, h0) if flip else (h0, h1)), delta, alpha)
            if best is None or sc > best[0]:
                best = (sc, ev, flip)
    if best is None or not est0 or not est1:
        return AuditResult(eps, delta, -math.inf, "none", "", len(f0) + len(f1), 0.0, 1.0,
                           alpha)
    _, ev, flip = best
    a_runs, b_runs = (est1, est0) if flip else (est0, est1)
    ka, kb = sum(map(ev, a_runs)), sum(map(ev, b_runs))
    # each one-sided bound at level alpha/2: two-sided intervals at level alpha
    p_low = clopper_pearson(ka, len(a_runs), alpha)[0]
    p_high = clopper_pearson(kb, len(b_runs), alpha)[1]
    lb = math.log((p_low - delta) / p_high) if p_low > delta else -math.inf
    return AuditResult(eps, delta, lb, str(ev), "x' vs x" if flip else "x vs x'",
                       len(f0) + len(f1), p_low, p_high, alpha)


def audit(factory: Factory, x0: Stream, x1: Stream, runs: int, *, eps: float,
          delta: float, feature: Feature = final_value, alpha: float = 0.05,
          label: str = "audit") -> AuditResult:
    """Run `runs` independently keyed runs on each stream (counter ids f"{label}/0/{i}"
    and f"{label}/1/{i}" under the factory's key) and bound epsilon from below."""
    if len(x0) != len(x1):
        raise ValueError("the two streams must have the same length")
    f0 = [feature(run_transcript(factory(f"{label}/0/{i}"), x0), len(x0)) for i in range(runs)]
    f1 = [feature(run_transcript(factory(f"{label}/1/{i}"), x1), len(x1)) for i in range(runs)]
    return eps_lower_bound(f0, f1, delta, alpha, eps)


# ------------------------------------------------------------------ Section 8 attack

def section8_guess(p: npt.ArrayLike, y: npt.ArrayLike) -> int:
    """The correlation attack of Section 8: with dp_t = p_t - p_{t-1}, dy_t = y_t - y_{t-1}
    (p_0 = y_0 = 0), S = sum_{t>=2} (p_t - dy_t) dp_t, theta = (1/2) sum_{t>=2} dp_t^2;
    guess 1 (the shifted stream) iff S >= theta."""
    pa = np.concatenate([[0.0], np.asarray(p, dtype=np.float64)])
    ya = np.concatenate([[0.0], np.asarray(y, dtype=np.float64)])
    dp = np.diff(pa)[1:]
    dy = np.diff(ya)[1:]
    s = float(np.sum((pa[2:] - dy) * dp))
    theta = 0.5 * float(np.sum(dp * dp))
    return int(s >= theta)


def advantage(correct: int, n: int, alpha: float = 0.05) -> tuple[float, float, float]:
    """Attack advantage 2 P[guess = b] - 1 and its Clopper-Pearson interval."""
    lo, hi = clopper_pearson(correct, n, alpha)
    return 2 * correct / n - 1, 2 * lo - 1, 2 * hi - 1
