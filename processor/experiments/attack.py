"""The distinguishing attack of Section 8 and the statistics reported with it.

The defender draws x ~ Bernoulli(p_t) independently per tick, the neighbour
x^(1) = (1, x_1, ..., x_{T-1}) (a 1 inserted at the front, the last input dropped), and a
fair challenge bit b; it releases y = M(x^(b)). The attacker knows p and computes
S = sum_{t=2}^T (p_t - dy_t) dp_t with dp_t = p_t - p_{t-1}, dy_t = y_t - y_{t-1}
(p_0 = y_0 = 0), and guesses b = 1 iff S >= theta = (1/2) sum_{t=2}^T dp_t^2.
Under b = 0 the residual p_t - dy_t of an unbiased counter has mean 0 and under b = 1 mean
dp_t, so theta is the midpoint of the two means of S.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.stats import beta as beta_dist

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def block_rates(horizon: int, low: float = 0.1, high: float = 0.9, width: int = 10) -> FloatArray:
    """The rate profile p_1..p_T: `low` for the first `width` ticks, then `high`, alternating."""
    if horizon < 1 or width < 1 or not (0 <= low <= 1 and 0 <= high <= 1):
        raise ValueError("need horizon >= 1, width >= 1 and rates in [0, 1]")
    block = (np.arange(horizon) // width) % 2
    return np.where(block == 0, low, high).astype(np.float64)


def draw_trials(
    rates: FloatArray, runs: int, rng: np.random.Generator
) -> tuple[npt.NDArray[np.int8], BoolArray]:
    """(x^(b), b) for `runs` independent trials: the stream actually fed to the mechanism
    (runs x T, in {0, 1}) and the challenge bits."""
    horizon = rates.size
    x0 = (rng.random((runs, horizon)) < rates[None, :]).astype(np.int8)
    b = rng.random(runs) < 0.5
    fed = x0.copy()
    fed[b, 1:] = x0[b, :-1]
    fed[b, 0] = 1
    return fed, b


def weights(rates: FloatArray) -> tuple[float, FloatArray]:
    """(c, w) with S = c - y . w: S is linear in y.

    sum_{t=2}^T (y_t - y_{t-1}) dp_t = sum_t y_t w_t with w_t = dp_t [t >= 2] - dp_{t+1}
    [t <= T - 1], and c = sum_{t=2}^T p_t dp_t. One matrix-vector product per batch, no
    differenced copy of y.
    """
    dp = np.diff(rates, prepend=0.0)
    w = np.zeros(rates.size, dtype=np.float64)
    w[1:] += dp[1:]
    w[:-1] -= dp[1:]
    return float(np.dot(rates[1:], dp[1:])), w


def statistic(y: npt.NDArray[np.floating], rates: FloatArray) -> FloatArray:
    """S per run (rows of y are runs)."""
    c, w = weights(rates)
    return np.asarray(c - y @ w, dtype=np.float64)


def threshold(rates: FloatArray) -> float:
    """theta = (1/2) sum_{t=2}^T dp_t^2."""
    dp = np.diff(rates, prepend=0.0)
    return 0.5 * float(np.dot(dp[1:], dp[1:]))


def guesses(y: FloatArray, rates: FloatArray) -> BoolArray:
    """The attacker's guess of b per run."""
    return statistic(y, rates) >= threshold(rates)


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact two-sided Clopper-Pearson interval for a binomial proportion k / n."""
    if n <= 0 or not 0 <= k <= n or not 0 < confidence < 1:
        raise ValueError("need 0 <= k <= n, n > 0 and confidence in (0, 1)")
    a = 1.0 - confidence
    low = 0.0 if k == 0 else float(beta_dist.ppf(a / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta_dist.ppf(1 - a / 2, k + 1, n - k))
    return low, high


@dataclass(frozen=True)
class Advantage:
    """2 Pr[guess = b] - 1 with the Clopper-Pearson interval mapped through q -> 2q - 1."""

    value: float
    low: float
    high: float


def advantage(correct: int, n: int, confidence: float = 0.95) -> Advantage:
    lo, hi = clopper_pearson(correct, n, confidence)
    return Advantage(2 * correct / n - 1, 2 * lo - 1, 2 * hi - 1)


def per_run_rmse(y: FloatArray, s: npt.NDArray[np.integer] | FloatArray) -> FloatArray:
    """sqrt(mean_t (y_t - s_t)^2) per run."""
    e = y - s
    return np.asarray(np.sqrt(np.einsum("ij,ij->i", e, e) / y.shape[1]), dtype=np.float64)


def mean_se(values: FloatArray) -> tuple[float, float]:
    """Mean and standard error (sample std / sqrt(n)) of per-run values."""
    n = values.size
    if n == 0:
        raise ValueError("no values")
    se = float(np.std(values, ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
    return float(np.mean(values)), se
