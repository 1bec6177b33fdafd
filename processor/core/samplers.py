"""Exact samplers on the integers, fed only by the keyed generator of rng.py.

Every draw reads uniform 64-bit words from a `WordCursor` (scalar samplers) or directly
from a `KeyedStream` lane (the vectorised block sampler), so a draw is a deterministic
function of (key, label, lane, position) and is reproduced exactly after a crash.

The exact samplers follow Canonne, Kamath and Steinke 2020, "The Discrete Gaussian for
Differential Privacy", Algorithms 1-3, using only Python integers and integer comparisons:
no floating point touches their output distribution, so P(output = z) is exactly the
stated probability (given uniform words).

Conventions shared by all samplers:
- A sampler whose outcome is certain (probability 0 or 1, or m == 1) consumes no words.
- Otherwise every "uniform integer below m" reads whole 64-bit words, so words are never
  split between two draws: either the top bitlen(m-1) bits of a word, retried while
  >= m (uniform_below), or, where one word must decide at once, w mod m with w rejected
  (redrawn) when w >= 2^64 - (2^64 mod m) (the block sampler and Bernoulli(exp(-1))).
  Both are exact rejection sampling: a rejected word is simply never used.
- Bernoulli(exp(-1)), the inner loop of every discrete Laplace draw, is decided from one
  word in all but ~1e-16 of cases (von Neumann's K from 18!/k! thresholds) and continued
  exactly otherwise.

There are no float samplers: every draw is exact. (The SVT's skip path compares lazily
refined uniforms with float bounds first, but decides only when the decision is certain;
see svt.py.)
"""

from __future__ import annotations

import array
import bisect
import math
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from processor.core.errors import InvalidParameterError
from processor.core.grid import UNIT
from processor.core.rng import KeyedStream, WordCursor

__all__ = [
    "BLOCK_MAX_T",
    "LaplaceBank",
    "bernoulli_exp",
    "bernoulli_frac",
    "discrete_gaussian",
    "discrete_laplace",
    "discrete_laplace_block",
    "dlap_log_sf",
    "dlap_sf",
    "gaussian_sigma2_units",
    "laplace_scale_units",
    "rounded_gaussian",
    "uniform_below",
]

_U64_MAX = (1 << 64) - 1


def _check_int(name: str, v: object, minimum: int) -> int:
    """Validate an integer parameter (bool rejected) that must be >= minimum."""
    if isinstance(v, bool) or not isinstance(v, int | np.integer):
        raise InvalidParameterError(f"{name} must be an integer, got {type(v).__name__}")
    iv = int(v)
    if iv < minimum:
        raise InvalidParameterError(f"{name} must be >= {minimum}, got {iv}")
    return iv


# --------------------------------------------------------------------------- exact, scalar


def _uniform_below(cur: WordCursor, m: int) -> int:
    """uniform_below without argument checks (m >= 2); the fast path reads one word."""
    k = (m - 1).bit_length()
    if k <= 64:
        shift = 64 - k
        next_word = cur.next_word
        while True:
            x = next_word() >> shift
            if x < m:
                return x
    while True:
        x = cur.next_bits(k)
        if x < m:
            return x


def uniform_below(cur: WordCursor, m: int) -> int:
    """An exactly uniform integer in {0, ..., m-1}, m >= 1 (any size, also > 2^64).

    Rejection on whole bits: read k = bitlen(m-1) bits (the top k bits of one word, or
    whole words when k > 64, see WordCursor.next_bits) and retry while the value is >= m;
    each try succeeds with probability > 1/2. m == 1 returns 0 and consumes nothing.
    """
    m = _check_int("m", m, 1)
    if m == 1:
        return 0
    return _uniform_below(cur, m)


def _bern_frac(cur: WordCursor, num: int, den: int) -> bool:
    """bernoulli_frac without argument checks (0 <= num <= den)."""
    if num == 0:
        return False
    if num >= den:
        return True
    return _uniform_below(cur, den) < num


def bernoulli_frac(cur: WordCursor, num: int, den: int) -> bool:
    """True with probability exactly num/den (0 <= num <= den, den >= 1)."""
    den = _check_int("den", den, 1)
    num = _check_int("num", num, 0)
    if num > den:
        raise InvalidParameterError("bernoulli_frac needs num <= den")
    return _bern_frac(cur, num, den)


def _von_neumann_table(den: int, levels: int) -> tuple[int, int, list[int]]:
    """For Bernoulli(exp(-1/den)) from one word: von Neumann's K (the first k with
    Bernoulli(1/(den k)) false) has P(K > k) = den^-k / k!, so with r uniform on
    [0, M), M = den^levels levels!, K > k iff r < M / (den^k k!) for k <= levels. Returns
    M, the largest word accepted for r = w mod M (larger words are rejected: exact, see
    _limit), and the thresholds in ascending order."""
    modulus = den ** levels * math.factorial(levels)
    thresholds = [modulus // (den ** k * math.factorial(k)) for k in range(levels, 0, -1)]
    return modulus, _U64_MAX - (1 << 64) % modulus, thresholds


def _one_word_bernoulli_exp(den: int, levels: int) -> Callable[[WordCursor], bool]:
    """A sampler of Bernoulli(exp(-1/den)), exact, decided from one word in all but
    ~den^-levels / levels! of cases; r == 0 (K > levels) goes on exactly at k = levels + 1."""
    modulus, limit, thresholds = _von_neumann_table(den, levels)

    def draw(cur: WordCursor) -> bool:
        while True:
            w = cur.next_word()
            if w <= limit:  # else: rejected word, draw again
                break
        nle = bisect.bisect_right(thresholds, w % modulus)  # K = levels + 1 - nle
        if nle > 0:
            return (levels + 1 - nle) % 2 == 1
        k = levels + 1
        while _bern_frac(cur, 1, den * k):
            k += 1
        return k % 2 == 1

    return draw


_F18, _F18_LIMIT_INT, _VN_LIST = _von_neumann_table(1, 18)
#: True with probability exactly exp(-1), usually from a single word.
_bernoulli_exp_minus_one = _one_word_bernoulli_exp(1, 18)


def _bernoulli_exp_le1(cur: WordCursor, num: int, den: int) -> bool:
    """Bernoulli(exp(-num/den)) for 0 <= num/den <= 1 (CKS Algorithm 1, von Neumann).

    K = 1; while Bernoulli(gamma/K): K += 1; return K odd. P(K > k) = gamma^k / k!, so
    P(K odd) = sum over odd k of (gamma^(k-1)/(k-1)! - gamma^k/k!) = exp(-gamma).
    """
    if num == den:
        return _bernoulli_exp_minus_one(cur)
    k = 1
    while _bern_frac(cur, num, den * k):
        k += 1
    return k % 2 == 1


def _bern_exp(cur: WordCursor, num: int, den: int) -> bool:
    """bernoulli_exp without argument checks."""
    whole, rem = divmod(num, den)
    for _ in range(whole):
        if not _bernoulli_exp_minus_one(cur):
            return False
    return _bernoulli_exp_le1(cur, rem, den)


def bernoulli_exp(cur: WordCursor, num: int, den: int) -> bool:
    """True with probability exactly exp(-num/den), num >= 0, den >= 1.

    For gamma = num/den > 1: floor(gamma) independent Bernoulli(exp(-1)) trials must all
    succeed, then one Bernoulli(exp(-frac(gamma))) (CKS Algorithm 1).
    """
    den = _check_int("den", den, 1)
    num = _check_int("num", num, 0)
    return _bern_exp(cur, num, den)


def _discrete_laplace(cur: WordCursor, t: int, s: int) -> int:
    """discrete_laplace without argument checks."""
    while True:
        u = _uniform_below(cur, t) if t > 1 else 0
        if not _bernoulli_exp_le1(cur, u, t):
            continue
        v = 0
        while _bernoulli_exp_minus_one(cur):
            v += 1
        y = (u + t * v) // s
        negative = cur.next_word() >> 63 == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_laplace(cur: WordCursor, t: int, s: int = 1) -> int:
    """One sample Z with P(Z = z) proportional to exp(-|z| * s / t) (scale b = t/s).

    CKS Algorithm 2: U uniform in [0, t) accepted with probability exp(-U/t) gives the
    remainder, V (geometric: P(V >= v) = e^-v) the number of whole t's; X = U + t V has
    P(X = x) proportional to exp(-x/t); Y = floor(X / s) then has P(Y = y) proportional to
    exp(-y s/t); a fair sign, rejecting "minus zero", makes it two-sided.
    """
    if type(t) is not int or type(s) is not int or t < 1 or s < 1:
        # The common case (exact ints in range) skips the checks' calls: hot in SVT steps.
        t = _check_int("t", t, 1)
        s = _check_int("s", s, 1)
    return _discrete_laplace(cur, t, s)


def discrete_gaussian(cur: WordCursor, sigma2_num: int, sigma2_den: int) -> int:
    """One sample Z with P(Z = z) proportional to exp(-z^2 / (2 sigma^2)), exactly.

    sigma^2 = sigma2_num / sigma2_den > 0. CKS Algorithm 3: propose Y ~ DLap(t) with
    t = floor(sigma) + 1 and accept with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)).
    With sigma^2 = n/d the exponent is (|Y| d t - n)^2 / (2 n d t^2), a ratio of integers.
    """
    n = _check_int("sigma2_num", sigma2_num, 1)
    d = _check_int("sigma2_den", sigma2_den, 1)
    t = math.isqrt(n // d) + 1  # floor(sqrt(n/d)) == isqrt(floor(n/d))
    den = 2 * n * d * t * t
    while True:
        y = _discrete_laplace(cur, t, 1)
        diff = abs(y) * d * t - n
        if _bern_exp(cur, diff * diff, den):
            return y


# --------------------------------------------------------------------------- rounded normal


class _LazyUniform:
    """A uniform real in [0, 1) whose base-2^64 digits are drawn only when needed.

    Digit i is one fresh word; comparing two lazy uniforms reads digits until they differ
    (ties of a whole word have probability 2^-64 and just read one more digit). So every
    comparison is exact and the value is, at any time, uniform on the interval its known
    digits define.
    """

    __slots__ = ("cur", "digits")

    def __init__(self, cur: WordCursor) -> None:
        self.cur = cur
        self.digits: list[int] = []

    def digit(self, i: int) -> int:
        while len(self.digits) <= i:
            self.digits.append(self.cur.next_word())
        return self.digits[i]

    def less(self, other: _LazyUniform) -> bool:
        i = 0
        while True:
            a, b = self.digit(i), other.digit(i)
            if a != b:
                return a < b
            i += 1


#: True with probability exactly exp(-1/2), usually from a single word (Karney's sampler).
_bernoulli_exp_minus_half = _one_word_bernoulli_exp(2, 16)


def _karney_b(cur: WordCursor, k: int, x: _LazyUniform) -> bool:
    """True with probability exactly exp(-x (2k + x) / (2k + 2)) (Karney 2016, Algorithm B).

    n counts the steps of a decreasing chain x > z_1 > z_2 > ... in which each step also
    passes a test of probability (2k + x) / (2k + 2); P(n >= j) = (p x)^j / j! with
    p = (2k + x) / (2k + 2), so P(n even) = exp(-p x). The test draws j uniform in
    [0, 2k + 2): j < 2k passes, j = 2k passes iff a fresh uniform is below x, else fails.
    """
    y = x
    n = 0
    m = 2 * k + 2
    while True:
        z = _LazyUniform(cur)
        if not z.less(y):
            break
        j = _uniform_below(cur, m)
        if j == 2 * k + 1 or (j == 2 * k and not _LazyUniform(cur).less(x)):
            break
        y = z
        n += 1
    return n % 2 == 0


def rounded_gaussian(cur: WordCursor, scale: int) -> int:
    """round(scale * G) for G ~ N(0, 1), exactly: the continuous Gaussian N(0, scale^2)
    rounded to the nearest integer (halves away from zero; a tie has probability 0).

    G is drawn by Karney's exact algorithm ("Sampling exactly from the normal
    distribution", 2016, Algorithm N), with exact integer Bernoulli(exp(-r)) trials
    (CKS Algorithm 1) and lazy uniforms:
    N1 k >= 0 with P(k) = exp(-k/2) (1 - exp(-1/2)) (successes of Bernoulli(exp(-1/2)));
    N2 accept with probability exp(-k (k - 1) / 2); N3 x uniform in [0, 1);
    N4 accept with probability exp(-x (2k + x) / 2) (Algorithm B, k + 1 times);
    N5 a fair sign. The density of s (k + x) is proportional to exp(-(k + x)^2 / 2).
    The output needs only floor(scale (k + x) + 1/2): the digits of x are read until the
    interval they leave for x maps into one integer. Unlike the discrete Gaussian, this is
    a deterministic function of a continuous Gaussian draw, so whatever it feeds is
    post-processing of the continuous Gaussian mechanism. `scale` >= 1 is an integer
    (callers round their sigma up to the lattice they round on).
    """
    scale = _check_int("scale", scale, 1)
    while True:
        k = 0
        while _bernoulli_exp_minus_half(cur):
            k += 1
        if k > 1 and not _bern_exp(cur, k * (k - 1), 2):
            continue
        x = _LazyUniform(cur)
        if all(_karney_b(cur, k, x) for _ in range(k + 1)):
            break
    negative = cur.next_word() >> 63 == 1
    # x in [a / 2^(64 m), (a + 1) / 2^(64 m)); f(x) = scale (k + x) + 1/2 is increasing,
    # so floor(f) is decided once f(upper end) <= floor(f(lower end)) + 1.
    a, m = 0, 0
    while True:
        a = (a << 64) | x.digit(m)
        m += 1
        den = 2 << (64 * m)  # f = (2 scale (k 2^(64m) + a) + 2^(64m)) / den
        lo = (2 * scale * ((k << (64 * m)) + a) + (1 << (64 * m))) // den
        hi_num = 2 * scale * ((k << (64 * m)) + a + 1) + (1 << (64 * m))
        if hi_num <= (lo + 1) * den:
            return -lo if negative else lo


# --------------------------------------------------------------------------- calibration to units


def laplace_scale_units(b: float) -> int:
    """The Laplace scale b (in counts) as an integer number of grid units: ceil(b * UNIT).

    Rounded up, so the noise is never smaller than asked: DLap(ceil(b UNIT)) for a
    sensitivity of UNIT units is at least as private as Lap(b) for sensitivity 1. The
    product is exact (UNIT is a power of two), so the only rounding is the ceil.
    """
    if isinstance(b, bool) or not isinstance(b, int | float) or not math.isfinite(b) or b <= 0:
        raise InvalidParameterError(f"Laplace scale must be a finite number > 0, got {b!r}")
    return _scale_units(b)


@lru_cache(maxsize=1024)
def _scale_units(b: float) -> int:
    # cached: every restored SVT and counter asks for the same few scales
    return max(1, math.ceil(Fraction(b) * UNIT))


_SIGMA2_BITS = 42  # numerator precision: relative rounding < 2^-41 <= 2^-40


def gaussian_sigma2_units(sigma_units: float) -> tuple[int, int]:
    """sigma^2 (sigma given in grid units) as a rational (num, den) for discrete_gaussian.

    den is a power of two; num/den >= sigma_units^2 (rounded up: never less noise) and
    num/den - sigma_units^2 <= 2^-40 * sigma_units^2. The square of the float is formed
    exactly with Fractions, so the ceil is the only rounding.
    """
    if (isinstance(sigma_units, bool) or not isinstance(sigma_units, int | float)
            or not math.isfinite(sigma_units) or sigma_units <= 0):
        raise InvalidParameterError(f"sigma must be a finite number > 0, got {sigma_units!r}")
    x = Fraction(sigma_units) ** 2
    # x >= 2^(e-1); scaling by 2^k with k = bits - e makes x * 2^k >= 2^(bits-1), so one
    # unit of rounding in the numerator is a relative error < 2^-(bits-1).
    e = x.numerator.bit_length() - x.denominator.bit_length()
    k = max(0, _SIGMA2_BITS - e)
    scaled = x * (1 << k)
    num = -((-scaled.numerator) // scaled.denominator)  # ceil
    den = 1 << k
    # Keep the representation small when it is exact (e.g. integer sigma).
    while k > 0 and num % 2 == 0:
        num //= 2
        den //= 2
        k -= 1
    return num, den


# --------------------------------------------------------------------------- vectorised block

#: Largest t the vectorised block sampler accepts; beyond it the scalar path is used.
#: Why: the block computes 2t, t * K (K < 40 von Neumann steps) and U + t * V (V < 40)
#: in uint64; with t <= 2^48 these stay far below 2^63.
BLOCK_MAX_T = 1 << 48

_LD = 2  # von Neumann steps for exp(-U/t) in the first vectorised sub-pass (columns)
_LV = 3  # Bernoulli(exp(-1)) trials of the geometric V in the first vectorised sub-pass
# Later sub-passes see few attempts, so their cost is per call, not per element: give them
# more columns, so that one of them almost always finishes the loop.
_LD2 = 4
_LV2 = 5
_MAX_SUB = 8  # sub-passes of either loop before a trial is parked for the scalar code
_MAX_PASSES = 3  # batches of attempts in the vectorised region

# Bernoulli(exp(-1)) from one word, vectorised (see _bernoulli_exp_minus_one).
_F18_LIMIT = np.uint64(_F18_LIMIT_INT)
_VN_THRESH = np.array(_VN_LIST, dtype=np.uint64)

# Stages of an attempt parked for the scalar code.
_P_D = 1  # inside the von Neumann loop for Bernoulli(exp(-U/t)) at step k
_P_V = 2  # inside the geometric V with v successes; k > 0: inside exp(-1) at step k


def _limit(m: int) -> int:
    """The largest word accepted when drawing uniform mod m from one word.

    A word w is accepted iff w < 2^64 - (2^64 mod m); then w mod m is exactly uniform on
    [0, m). A rejected word is simply a redraw, so skipping it never biases anything.
    """
    return _U64_MAX - (1 << 64) % m


def _resume_attempt(cur: WordCursor, t: int, s: int, stage: int, u: int, neg: bool, k: int,
                    v: int) -> int | None:
    """Finish one parked attempt exactly (scalar code): its sample, or None if rejected."""
    if stage == _P_D:
        while _bern_frac(cur, u, t * k):
            k += 1
        if k % 2 == 0:  # Bernoulli(exp(-U/t)) failed: the attempt is rejected
            return None
        v, k = 0, 0
    if k > 0:
        while _bern_frac(cur, 1, k):
            k += 1
        more = k % 2 == 1
    else:
        more = _bernoulli_exp_minus_one(cur)
    while more:
        v += 1
        more = _bernoulli_exp_minus_one(cur)
    y = (u + t * v) // s
    if neg and y == 0:  # "minus zero" is rejected as in CKS
        return None
    return -y if neg else y


class _Words:
    """Consecutive words of one lane, fetched in large slices, handed out by position."""

    __slots__ = ("buf", "buf_start", "lane", "pos", "stream")

    def __init__(self, stream: KeyedStream, lane: int, prefetch: int) -> None:
        self.stream = stream
        self.lane = lane
        self.pos = 0
        self.buf = stream.words(lane, 0, max(prefetch, 1))
        self.buf_start = 0

    def take(self, n: int) -> npt.NDArray[np.uint64]:
        if self.pos + n > self.buf_start + len(self.buf):
            self.buf = self.stream.words(self.lane, self.pos, max(n, len(self.buf)))
            self.buf_start = self.pos
        i = self.pos - self.buf_start
        self.pos += n
        out: npt.NDArray[np.uint64] = self.buf[i: i + n]
        return out


def _run_attempts(src: _Words, a: int, t: int, s: int, m_tab: npt.NDArray[np.uint64],
                  lim_tab: npt.NDArray[np.uint64]
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                             list[tuple[int, int, int, bool, int, int]]]:
    """Run `a` independent attempts of CKS Algorithm 2, vectorised.

    Returns (ok, values, parked): the offsets (0..a-1) of the attempts that produced a
    sample and those samples, in attempt order, and the attempts left unfinished by the
    bounded loops as (offset, stage, U, negative, k, v) for _resume_attempt. Every other
    attempt was rejected (exp(-U/t) failed, or "minus zero").

    Words of a sub-pass are laid out column by column (word c * n + i is column c of
    attempt i), so each column is a contiguous vector; any fixed layout is equally exact.
    """
    u64 = np.uint64
    one = u64(1)
    parked: list[tuple[int, int, int, bool, int, int]] = []

    # U and the sign from one word each; a rejected word is a rejected attempt (a redraw).
    w0 = src.take(a)
    r0 = w0 % u64(2 * t)
    uu = r0 >> one
    neg = (r0 & one) == one
    acc0 = w0 <= u64(_limit(2 * t))

    # Bernoulli(exp(-U/t)): von Neumann step k is Bernoulli(U / (t k)).
    d_ids = np.arange(a, dtype=np.int64) if acc0.all() else np.flatnonzero(acc0)
    d_u = uu[d_ids]
    d_k = np.ones(len(d_ids), dtype=np.int64)
    passed: list[npt.NDArray[np.int64]] = []
    for sub in range(_MAX_SUB):
        nd = len(d_ids)
        if nd == 0:
            break
        ncol = _LD if sub == 0 else _LD2
        wd = src.take(nd * ncol).reshape(ncol, nd)
        run = np.ones(nd, dtype=bool)  # every step so far succeeded
        stuck = np.zeros(nd, dtype=bool)  # a rejected word: redo that step
        f = np.zeros(nd, dtype=np.int64)  # successes in this sub-pass
        for c in range(ncol):
            w = wd[c]
            if sub == 0:  # every attempt starts at step 1: one modulus per column
                m, lim = m_tab[1 + c], lim_tab[1 + c]
            else:
                m, lim = m_tab[d_k + c], lim_tab[d_k + c]
            ok = w % m < d_u
            acc = w <= lim
            if not acc.all():  # rare: w rejected with probability < t k / 2^64
                stuck |= run & ~acc
                ok &= acc
            run &= ok
            f += run
        k_stop = d_k + f  # the step that failed, was rejected, or comes next
        decided = ~(run | stuck)
        passed.append(d_ids[decided & ((k_stop & 1) == 1)])  # K odd: exp(-U/t) passed
        cont = ~decided
        d_k = k_stop[cont]
        d_ids = d_ids[cont]
        d_u = d_u[cont]
    for j, k in zip(d_ids.tolist(), d_k.tolist(), strict=True):
        parked.append((j, _P_D, int(uu[j]), bool(neg[j]), k, 0))

    # V: Bernoulli(exp(-1)) successes before the first failure, one word per trial.
    v_ids = np.concatenate(passed) if passed else np.empty(0, dtype=np.int64)
    v_v = np.zeros(len(v_ids), dtype=np.int64)
    done_ids: list[npt.NDArray[np.int64]] = []
    done_v: list[npt.NDArray[np.int64]] = []
    f18 = u64(_F18)
    for sub in range(_MAX_SUB):
        nv = len(v_ids)
        if nv == 0:
            break
        ncol = _LV if sub == 0 else _LV2
        wv = src.take(nv * ncol).reshape(ncol, nv)
        run = np.ones(nv, dtype=bool)
        stuck = np.zeros(nv, dtype=bool)  # rejected word (fresh redraw) or K > 18
        deep = np.zeros(nv, dtype=bool)  # K > 18: continue von Neumann at k = 19
        f = np.zeros(nv, dtype=np.int64)
        for c in range(ncol):
            w = wv[c]
            # thresholds <= r; K = 19 - nle; K odd (nle even) is a success; nle == 0: K > 18
            nle = np.searchsorted(_VN_THRESH, w % f18, side="right")
            ok = (nle & 1) == 0
            dec = (w <= _F18_LIMIT) & (nle > 0)
            if not dec.all():  # rare: < 4e-4 per word
                und = run & ~dec
                stuck |= und
                deep |= und & (w <= _F18_LIMIT)
                ok &= dec
            run &= ok
            f += run
        vf = v_v + f
        fin = ~(run | stuck)
        done_ids.append(v_ids[fin])
        done_v.append(vf[fin])
        if deep.any():
            for j, v in zip(v_ids[deep].tolist(), vf[deep].tolist(), strict=True):
                parked.append((j, _P_V, int(uu[j]), bool(neg[j]), 19, v))
        cont = run | (stuck & ~deep)  # all succeeded, or a rejected word (redraw it)
        v_v = vf[cont]
        v_ids = v_ids[cont]
    for j, v in zip(v_ids.tolist(), v_v.tolist(), strict=True):
        parked.append((j, _P_V, int(uu[j]), bool(neg[j]), 0, v))

    if not done_ids:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), parked
    ids = np.concatenate(done_ids)
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    vs = np.concatenate(done_v)[order].astype(np.uint64)
    y = ((uu[ids] + u64(t) * vs) // u64(s)).astype(np.int64)
    ng = neg[ids]
    keep = ~(ng & (y == 0))  # "minus zero" rejects the attempt
    return ids[keep], np.where(ng, -y, y)[keep], parked


@lru_cache(maxsize=64)
def _block_tables(t: int, s: int, ld: int, max_sub: int
                  ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], float]:
    """Per-scale constants of the block sampler: the modulus t k of von Neumann step k and
    its acceptance limit (index k; entry 0 unused), and the acceptance probability of one
    attempt, P(exp(-U/t) passes) * P(not "minus zero"), used only to size batches."""
    ks = range(2 + ld * (max_sub + 1))
    m_tab = np.array([t * max(k, 1) for k in ks], dtype=np.uint64)
    lim_tab = np.array([_limit(t * max(k, 1)) for k in ks], dtype=np.uint64)
    p_acc = (-math.expm1(-1.0)) / (t * -math.expm1(-1.0 / t))
    p_acc *= 1.0 - 0.5 * -math.expm1(-s / t)
    return m_tab, lim_tab, p_acc


def discrete_laplace_block(stream: KeyedStream, lane: int, t: int, s: int, n: int
                           ) -> npt.NDArray[np.int64]:
    """n independent samples of discrete_laplace(t, s), exactly, as an int64 array.

    A pure function of (stream, lane, t, s, n): it reads the words of `lane` from word 0,
    in an order fixed by the words themselves. CKS Algorithm 2 is rejection sampling: a
    sequence of independent attempts, each rejected or producing a sample, and the samples
    of the accepted attempts, in attempt order, are independent DLap(t/s) draws. The block
    runs many attempts at once with numpy integer operations:

    - one word per attempt gives U and the sign: r = w mod 2t, U = r >> 1, sign = r & 1
      (the sign is independent of U, so drawing it first does not change the law);
    - Bernoulli(exp(-U/t)) by von Neumann's loop, whose step k is Bernoulli(U / (t k)),
      i.e. (w mod t k) < U, _LD steps in the first vectorised sub-pass, _LD2 later;
    - V, the number of Bernoulli(exp(-1)) successes before a failure, each Bernoulli from
      one word (see _VN_THRESH), _LV of them in the first sub-pass, _LV2 later.

    Every uniform comes from its own fresh word by exact rejection (see _limit). The
    unbounded loops run vectorised for at most _MAX_SUB sub-passes; attempts still
    unfinished are parked with their exact state. After the vectorised region (at most
    _MAX_PASSES batches of attempts), the scalar code completes the parked attempts in
    attempt order, reading the words of the lane that follow, and the output is the first
    n accepted attempts in attempt order; if there are fewer than n, the rest are fresh
    scalar draws from the same cursor. So every output has exactly the DLap(t/s) law and
    the outputs are independent.

    Limit: t <= BLOCK_MAX_T (2^48) keeps the uint64 arithmetic exact; a larger t falls
    back to n scalar draws on a cursor over the same lane.
    """
    t = _check_int("t", t, 1)
    s = _check_int("s", s, 1)
    n = _check_int("n", n, 0)
    out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return out
    if t > BLOCK_MAX_T:
        cur = WordCursor(stream, lane, 0)
        for i in range(n):
            out[i] = discrete_laplace(cur, t, s)
        return out

    m_tab, lim_tab, p_acc = _block_tables(t, s, max(_LD, _LD2), _MAX_SUB)

    src = _Words(stream, lane, 10 * n)
    got_ids: list[npt.NDArray[np.int64]] = [np.empty(0, dtype=np.int64)]
    got_vals: list[npt.NDArray[np.int64]] = [np.empty(0, dtype=np.int64)]
    parked: list[tuple[int, int, int, bool, int, int]] = []
    base = 0  # attempt number of the first attempt of the batch
    have = 0
    for _ in range(_MAX_PASSES):
        need = n - have
        if need <= 0:
            break
        a = math.ceil(need / p_acc + 3.0 * math.sqrt(need) + 4)
        ok, vals, pk = _run_attempts(src, a, t, s, m_tab, lim_tab)
        got_ids.append(ok + base)
        got_vals.append(vals)
        parked.extend((j + base, st, u, ng, k, v) for j, st, u, ng, k, v in pk)
        have += len(ok) + len(pk)  # parked attempts may still succeed
        base += a

    ids = np.concatenate(got_ids)
    vals = np.concatenate(got_vals)
    cur = WordCursor(stream, lane, src.pos)
    if parked:
        extra_ids: list[int] = []
        extra_vals: list[int] = []
        parked.sort()  # attempt order (attempt numbers are unique)
        for j, stage, u, ng, k, v in parked:
            y = _resume_attempt(cur, t, s, stage, u, ng, k, v)
            if y is not None:
                extra_ids.append(j)
                extra_vals.append(y)
        if extra_ids:
            ids = np.concatenate([ids, np.array(extra_ids, dtype=np.int64)])
            vals = np.concatenate([vals, np.array(extra_vals, dtype=np.int64)])
            order = np.argsort(ids, kind="stable")
            vals = vals[order]
    m = min(n, len(vals))
    out[:m] = vals[:m]
    for i in range(m, n):
        out[i] = discrete_laplace(cur, t, s)
    return out


class LaplaceBank:
    """An addressable, reproducible sequence of DLap(t/s) samples: draw(i) is the i-th.

    Sample i lives in chunk c = i // chunk, computed as
    discrete_laplace_block(stream, lane=c + 1, t, s, chunk) (lane 0 is left to scalar
    cursors). A mechanism stores only the index in its state. draw(i) does not depend on
    the order of calls (a chunk is a pure function of its lane). The two most recently
    used chunks are kept (chunk * 8 bytes each), so a caller that looks a few draws ahead
    across a chunk boundary (the SVT's ⊥-run prefix) does not recompute the chunk it
    still consumes; sequential use costs one vectorised block per `chunk` draws plus well
    under a microsecond per draw.
    """

    __slots__ = ("_base", "_old", "_old_c", "_vals", "chunk", "s", "stream", "t")

    def __init__(self, stream: KeyedStream, t: int, s: int = 1, chunk: int = 1024) -> None:
        self.stream = stream
        self.t = _check_int("t", t, 1)
        self.s = _check_int("s", s, 1)
        self.chunk = _check_int("chunk", chunk, 1)
        # Samples as a compact array.array: indexing it yields Python ints several times
        # faster than numpy scalars, at 8 bytes per sample.
        self._vals: array.array[int] = array.array("q")
        # Index of the first sample of the current chunk; the initial value is so far
        # below 0 that no index passes the fast-path range check before a chunk exists.
        self._base = -(1 << 80)
        self._old: array.array[int] = array.array("q")  # the previously current chunk
        self._old_c = -1

    def _load(self, c: int) -> None:
        """Make chunk c current (computing it unless it is the previous one)."""
        cur_c = self._base // self.chunk if self._base >= 0 else -1
        if c == cur_c:
            return
        if c == self._old_c:
            vals = self._old
        else:
            if c + 1 >= 1 << 96:
                raise InvalidParameterError("LaplaceBank index out of range")
            arr = discrete_laplace_block(self.stream, c + 1, self.t, self.s, self.chunk)
            vals = array.array("q", arr.tobytes())
        if cur_c >= 0:
            self._old, self._old_c = self._vals, cur_c
        self._vals, self._base = vals, c * self.chunk

    def block(self, c: int) -> npt.NDArray[np.int64]:
        """The samples of chunk c as a read-only array."""
        c = _check_int("chunk index", c, 0)
        self._load(c)
        out: npt.NDArray[np.int64] = np.frombuffer(self._vals, dtype=np.int64)
        return out

    def draw(self, index: int) -> int:
        """The index-th sample (index >= 0)."""
        j = index - self._base
        if 0 <= j < self.chunk and type(index) is int:  # the common, sequential case
            return self._vals[j]
        index = _check_int("index", index, 0)
        c, j = divmod(index, self.chunk)
        self._load(c)
        return self._vals[j]

    def __repr__(self) -> str:
        return f"LaplaceBank(label={self.stream.label!r}, t={self.t}, s={self.s})"


# --------------------------------------------------------------------------- closed forms


def _log1mexp(a: float) -> float:
    """log(1 - exp(a)) for a < 0, stable at both ends (Maechler 2012)."""
    if a > -math.log(2.0):
        return math.log(-math.expm1(a))
    return math.log1p(-math.exp(a))


def dlap_log_sf(k: int, t: int, s: int = 1) -> float:
    """log P(Z > k) for Z ~ discrete_laplace(t, s); finite for any integer k.

    With q = exp(-s/t): P(Z > k) = q^(k+1) / (1 + q) for k >= 0, and by symmetry
    1 - q^(-k) / (1 + q) for k < 0.
    """
    k = int(k)
    t = _check_int("t", t, 1)
    s = _check_int("s", s, 1)
    lam = s / t
    log1pq = math.log1p(math.exp(-lam))
    if k >= 0:
        return -(k + 1) * lam - log1pq
    return _log1mexp(k * lam - log1pq)


def dlap_sf(k: int, t: int, s: int = 1) -> float:
    """P(Z > k) for Z ~ discrete_laplace(t, s) (see dlap_log_sf)."""
    k = int(k)
    t = _check_int("t", t, 1)
    s = _check_int("s", s, 1)
    if k >= 0:
        return math.exp(dlap_log_sf(k, t, s))
    lam = s / t
    return -math.expm1(k * lam - math.log1p(math.exp(-lam)))
