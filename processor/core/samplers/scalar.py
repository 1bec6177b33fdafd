"""Scalar exact samplers: one draw at a time from a WordCursor (conventions in the package
docstring), and the calibration of a real scale to integer grid units."""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache

import numpy as np

from processor.core.errors import InvalidParameterError
from processor.core.grid import UNIT
from processor.core.rng import WordCursor
from processor.core.samplers.native import NATIVE

__all__ = [
    "F18",
    "F18_LIMIT_INT",
    "U64_MAX",
    "VN_THRESHOLDS",
    "bern_frac",
    "bernoulli_exp",
    "bernoulli_exp_minus_one",
    "bernoulli_frac",
    "check_int",
    "discrete_gaussian",
    "discrete_laplace",
    "discrete_laplace_into",
    "discrete_laplace_run",
    "gaussian_sigma2_units",
    "laplace_scale_units",
    "rounded_gaussian",
    "rounded_gaussian_reference",
    "uniform_below",
]

U64_MAX = (1 << 64) - 1


def check_int(name: str, v: object, minimum: int) -> int:
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
    m = check_int("m", m, 1)
    if m == 1:
        return 0
    return _uniform_below(cur, m)


def bern_frac(cur: WordCursor, num: int, den: int) -> bool:
    """bernoulli_frac without argument checks (0 <= num <= den)."""
    if num == 0:
        return False
    if num >= den:
        return True
    return _uniform_below(cur, den) < num


def bernoulli_frac(cur: WordCursor, num: int, den: int) -> bool:
    """True with probability exactly num/den (0 <= num <= den, den >= 1)."""
    den = check_int("den", den, 1)
    num = check_int("num", num, 0)
    if num > den:
        raise InvalidParameterError("bernoulli_frac needs num <= den")
    return bern_frac(cur, num, den)


def _von_neumann_table(den: int, levels: int) -> tuple[int, int, list[int]]:
    """For Bernoulli(exp(-1/den)) from one word: von Neumann's K (the first k with
    Bernoulli(1/(den k)) false) has P(K > k) = den^-k / k!, so with r uniform on
    [0, M), M = den^levels levels!, K > k iff r < M / (den^k k!) for k <= levels. Returns
    M, the largest word accepted for r = w mod M (larger words are rejected: exact, see
    _limit), and the thresholds in ascending order."""
    modulus = den ** levels * math.factorial(levels)
    thresholds = [modulus // (den ** k * math.factorial(k)) for k in range(levels, 0, -1)]
    return modulus, U64_MAX - (1 << 64) % modulus, thresholds


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
        while bern_frac(cur, 1, den * k):
            k += 1
        return k % 2 == 1

    return draw


F18, F18_LIMIT_INT, VN_THRESHOLDS = _von_neumann_table(1, 18)
#: True with probability exactly exp(-1), usually from a single word.
bernoulli_exp_minus_one = _one_word_bernoulli_exp(1, 18)


def _bernoulli_exp_le1(cur: WordCursor, num: int, den: int) -> bool:
    """Bernoulli(exp(-num/den)) for 0 <= num/den <= 1 (CKS Algorithm 1, von Neumann).

    K = 1; while Bernoulli(gamma/K): K += 1; return K odd. P(K > k) = gamma^k / k!, so
    P(K odd) = sum over odd k of (gamma^(k-1)/(k-1)! - gamma^k/k!) = exp(-gamma).
    """
    if num == den:
        return bernoulli_exp_minus_one(cur)
    k = 1
    while bern_frac(cur, num, den * k):
        k += 1
    return k % 2 == 1


def _bern_exp(cur: WordCursor, num: int, den: int) -> bool:
    """bernoulli_exp without argument checks."""
    whole, rem = divmod(num, den)
    for _ in range(whole):
        if not bernoulli_exp_minus_one(cur):
            return False
    return _bernoulli_exp_le1(cur, rem, den)


def bernoulli_exp(cur: WordCursor, num: int, den: int) -> bool:
    """True with probability exactly exp(-num/den), num >= 0, den >= 1.

    For gamma = num/den > 1: floor(gamma) independent Bernoulli(exp(-1)) trials must all
    succeed, then one Bernoulli(exp(-frac(gamma))) (CKS Algorithm 1).
    """
    den = check_int("den", den, 1)
    num = check_int("num", num, 0)
    return _bern_exp(cur, num, den)


def _discrete_laplace(cur: WordCursor, t: int, s: int) -> int:
    """discrete_laplace without argument checks."""
    while True:
        u = _uniform_below(cur, t) if t > 1 else 0
        if not _bernoulli_exp_le1(cur, u, t):
            continue
        v = 0
        while bernoulli_exp_minus_one(cur):
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
        t = check_int("t", t, 1)
        s = check_int("s", s, 1)
    if _native_for(cur, t, s):
        out: list[int] = []
        _native_into(cur, t, 1, out, s)
        return out[0]
    return _discrete_laplace(cur, t, s)


#: Positions from which the reference alone draws: near the lane's end (2^35 words) its
#: read-ahead decides where it raises, and that is left exactly as it is.
_NATIVE_END = (1 << 35) - (1 << 20)


def _native_for(cur: WordCursor, t: int, s: int) -> bool:
    """Whether the extension makes these draws (scales of at most 64 bits, a lane in
    range, a position far from the lane's end)."""
    return (NATIVE is not None and t <= U64_MAX and s <= U64_MAX
            and 0 <= cur.lane < 1 << 96 and 0 <= cur.position < _NATIVE_END)


def _native_into(cur: WordCursor, t: int, n: int, out: list[int], s: int) -> None:
    """discrete_laplace_into through the extension (where _native_for): the same draws
    and positions. A draw the extension leaves (a modulus or value beyond 64 bits) is made
    here by the reference."""
    assert NATIVE is not None
    key = cur.stream.derived_key()
    while n > 0:
        flat = NATIVE.discrete_laplace_run(key, cur.lane, cur.position, t, s, n)
        if flat:
            out += flat
            cur.position = flat[-1]
            n -= len(flat) // 2
        if n > 0:  # the run stopped before n draws: the next one is the reference's
            out.append(_discrete_laplace(cur, t, s))
            out.append(cur.position)
            n -= 1


#: Words per draw discrete_laplace_run asks the cursor for ahead (about 8 are used on
#: average), and the most it asks for before a draw goes to the cursor's path.
_RUN_WORDS = 12
_RUN_MAX = 256


#: Multiples k t (k = 1.._RUN_K) whose uniform draws the run's Bernoulli(exp(-u/t)) loop
#: has precomputed; a draw that gets further (probability below 1e-20) goes to the
#: cursor's path.
_RUN_K = 24
#: 18!/2! and 18!/3!: a von Neumann remainder at least the first is K = 2 (half of all
#: words), between the two K = 3 (a third), decided without the bisection.
_VN_HALF = VN_THRESHOLDS[-2]
_VN_SIXTH = VN_THRESHOLDS[-3]


@lru_cache(maxsize=64)
def _run_multiples(t: int) -> tuple[tuple[int, int], ...]:
    """(m, shift) for m = k t, k = 1.._RUN_K while m fits one word: uniform_below(m) is
    the top 64 - shift bits of a word, retried while >= m (the scales of a process are
    few: every SVT of one eps shares its t)."""
    out = []
    for k in range(1, _RUN_K + 1):
        sh = 64 - (t * k - 1).bit_length()
        if sh < 0:
            break
        out.append((t * k, sh))
    return tuple(out)


def _dlap_words(w: list[int], i: int, n: int, t: int, s: int,  # noqa: C901 (inlined)
                ms: tuple[tuple[int, int], ...], out: list[int], base: int
                ) -> tuple[int, int]:
    """n draws _discrete_laplace(cur, t, s) for 2 <= t < 2^48 read from the words w[i:]
    (w[0] at cursor position `base`) in the same order and with the same decisions,
    inlined, one loop for all draws (no call or tuple per draw); appends each draw and
    the cursor position after it to `out`, flat. ms = _run_multiples(t). Returns (draws
    made, index after the last): fewer than n when w runs out mid-draw or a rare branch
    comes up, the index then that of the unfinished draw's first word (the caller redoes
    that draw)."""
    shift = ms[0][1]
    limit = F18_LIMIT_INT
    done = 0
    start = i
    try:
        while done < n:
            start = i
            while True:
                # u = _uniform_below(t): the top bits of one word, retried while >= t
                u = w[i] >> shift
                i += 1
                while u >= t:
                    u = w[i] >> shift
                    i += 1
                # _bernoulli_exp_le1(u, t): k = 1; while bern_frac(u, t k): k += 1;
                # keep k odd. k = 1 inline (its uniform is below t, like u's); ms[k]
                # raises IndexError past the multiples it holds (the cursor's path).
                if u:
                    x = w[i] >> shift
                    i += 1
                    while x >= t:
                        x = w[i] >> shift
                        i += 1
                    if x < u:
                        k = 1
                        while True:
                            m, sh = ms[k]
                            x = w[i] >> sh
                            i += 1
                            while x >= m:
                                x = w[i] >> sh
                                i += 1
                            k += 1
                            if x >= u:
                                break
                        if not k & 1:
                            continue
                # v: while bernoulli_exp_minus_one(): v += 1 (its one-word von Neumann
                # test; K = 19 - nle, True iff K odd)
                v = 0
                while True:
                    x = w[i]
                    i += 1
                    while x > limit:
                        x = w[i]
                        i += 1
                    r = x % F18
                    if r >= _VN_HALF:
                        break  # K = 2
                    if r >= _VN_SIXTH:
                        v += 1  # K = 3
                        continue
                    nle = bisect.bisect_right(VN_THRESHOLDS, r)
                    if nle == 0:
                        raise IndexError  # K > 18 (about 1e-16): the cursor continues it
                    if not (19 - nle) & 1:
                        break
                    v += 1
                y = (u + t * v) // s
                negative = w[i] >> 63
                i += 1
                if negative:
                    if y == 0:
                        continue  # "minus zero": draw again
                    y = -y
                break
            out.append(y)
            out.append(base + i)
            done += 1
    except IndexError:
        return done, start
    return done, i


def _window(cur: WordCursor, position: int, n: int) -> list[int]:
    """At least n words of the cursor's lane from `position`, as Python ints, read past
    the cursor's buffer (which a run would otherwise fill and keep): up to the end of a
    ChaCha20 block (8 words), as the rest of the last block comes with it anyway."""
    return cur.stream.word_array(cur.lane, position, n + (-(position + n)) % 8).tolist()


def discrete_laplace_into(cur: WordCursor, t: int, n: int, out: list[int], s: int = 1
                          ) -> None:
    """n consecutive draws discrete_laplace(cur, t, s) appended to `out` flat, each draw
    followed by the cursor position after it: the same values and positions as n calls (a
    draw is a pure function of its start position), computed from a list of the lane's
    words instead of one call per word. The cursor ends after the last draw. Unchecked
    (t, s >= 1, ints): discrete_laplace_run checks."""
    if n <= 0:
        return
    if _native_for(cur, t, s):
        _native_into(cur, t, n, out, s)
        return
    if t == 1 or t.bit_length() > 48:
        for _ in range(n):
            out.append(_discrete_laplace(cur, t, s))
            out.append(cur.position)
        return
    ms = _run_multiples(t)
    base = cur.position
    w = _window(cur, base, min(_RUN_WORDS * n, _RUN_MAX))
    i = 0
    while n:
        done, i = _dlap_words(w, i, n, t, s, ms, out, base)
        n -= done
        if not n:
            break
        base += i
        cur.position = base
        if len(w) - i < _RUN_MAX:
            # the window ran out mid-draw: look further ahead and redo the draw
            w = _window(cur, base, _RUN_MAX)
        else:
            # a rare branch (or a draw longer than the window): the cursor's own path
            out.append(_discrete_laplace(cur, t, s))
            out.append(cur.position)
            n -= 1
            base = cur.position
            w = _window(cur, base, min(_RUN_WORDS * n, _RUN_MAX)) if n else []
        i = 0
    cur.position = base + i


def discrete_laplace_run(cur: WordCursor, t: int, n: int, s: int = 1
                         ) -> list[tuple[int, int]]:
    """n consecutive draws discrete_laplace(cur, t, s), each with the cursor position after
    it (discrete_laplace_into, as pairs)."""
    t = check_int("t", t, 1)
    s = check_int("s", s, 1)
    flat: list[int] = []
    discrete_laplace_into(cur, t, n, flat, s)
    return list(zip(flat[::2], flat[1::2], strict=True))


def discrete_gaussian(cur: WordCursor, sigma2_num: int, sigma2_den: int) -> int:
    """One sample Z with P(Z = z) proportional to exp(-z^2 / (2 sigma^2)), exactly.

    sigma^2 = sigma2_num / sigma2_den > 0. CKS Algorithm 3: propose Y ~ DLap(t) with
    t = floor(sigma) + 1 and accept with probability exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)).
    With sigma^2 = n/d the exponent is (|Y| d t - n)^2 / (2 n d t^2), a ratio of integers.
    """
    n = check_int("sigma2_num", sigma2_num, 1)
    d = check_int("sigma2_den", sigma2_den, 1)
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


def rounded_gaussian_reference(cur: WordCursor, scale: int) -> int:
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
    scale = check_int("scale", scale, 1)
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


#: Words a rounded_gaussian draw is first tried on (14 on average; about 6% of draws read
#: more than 32), and the most it is retried on before the reference makes the draw.
_RG_WORDS = 32
_RG_MAX = 4096
#: Bernoulli(exp(-1/2)) from one word (the table of _bernoulli_exp_minus_half).
_H_MOD, _H_LIMIT, _H_TH = _von_neumann_table(2, 16)


def _rg_less(w: array[int], i: int, z: list[int], y: list[int]) -> tuple[bool, int]:
    """_LazyUniform z.less(y) on the words w[i:]: the digits drawn in the reference's order
    (z's digit j, then y's digit j if y does not hold it yet), appended to the lists.
    Returns (z < y, the index after the last word read)."""
    j = 0
    while True:
        if len(z) <= j:
            z.append(w[i])
            i += 1
        a = z[j]
        if len(y) <= j:
            y.append(w[i])
            i += 1
        b = y[j]
        if a != b:
            return a < b, i
        j += 1


def _rg_words(w: array[int], i: int, scale: int) -> tuple[int, int]:  # noqa: C901 (inlined)
    """rounded_gaussian_reference(scale) read from the words w[i:] in the same order and
    with the same decisions, its calls inlined: (the draw, the index after its last word).
    IndexError when w runs out (the caller retries on more words); a draw's words are a
    pure function of its start position, so a retry makes the same draw."""
    mod1, lim1, th1 = F18, F18_LIMIT_INT, VN_THRESHOLDS
    modh, limh, thh = _H_MOD, _H_LIMIT, _H_TH
    h_half, h_eighth = thh[-1], thh[-2]
    bisect_right = bisect.bisect_right
    while True:
        # N1: k = the successes of Bernoulli(exp(-1/2)) before its first failure
        k = 0
        while True:
            x = w[i]
            i += 1
            while x > limh:
                x = w[i]
                i += 1
            r = x % modh
            if r >= h_half:  # K = 1 (half of all words): a success
                k += 1
                continue
            if r >= h_eighth:  # K = 2: the failure
                break
            nle = bisect_right(thh, r)
            if nle:
                ok = (17 - nle) & 1
            else:  # K > 16: von Neumann goes on at K = 17 (bern_frac(1, 2 K))
                kk = 17
                while True:
                    m = 2 * kk
                    sh = 64 - (m - 1).bit_length()
                    u = w[i] >> sh
                    i += 1
                    while u >= m:
                        u = w[i] >> sh
                        i += 1
                    if u:
                        break
                    kk += 1
                ok = kk & 1
            if not ok:
                break
            k += 1
        # N2: accept with probability exp(-k (k - 1) / 2): k (k - 1) / 2 Bernoulli(exp(-1))
        # (the remainder is 0: Bernoulli(exp(0)) reads nothing)
        if k > 1:
            ok = 1
            for _ in range(k * (k - 1) // 2):
                x = w[i]
                i += 1
                while x > lim1:
                    x = w[i]
                    i += 1
                r = x % mod1
                if r >= _VN_HALF:  # K = 2
                    ok = 0
                    break
                if r >= _VN_SIXTH:  # K = 3
                    continue
                nle = bisect_right(th1, r)
                if nle:
                    ok = (19 - nle) & 1
                else:  # K > 18: bern_frac(1, K) from K = 19
                    kk = 19
                    while True:
                        sh = 64 - (kk - 1).bit_length()
                        u = w[i] >> sh
                        i += 1
                        while u >= kk:
                            u = w[i] >> sh
                            i += 1
                        if u:
                            break
                        kk += 1
                    ok = kk & 1
                if not ok:
                    break
            if not ok:
                continue
        # N3, N4: x uniform (lazy digits); k + 1 runs of Algorithm B must all accept
        xd: list[int] = []
        m = 2 * k + 2
        sh = 64 - (m - 1).bit_length()
        accepted = True
        for _ in range(k + 1):
            y = xd
            n = 0
            while True:
                # z.less(y): digit 0 here (it decides but for 2^-64), the rest in _rg_less
                z0 = w[i]
                i += 1
                if y:
                    y0 = y[0]
                else:
                    y0 = w[i]
                    i += 1
                    y.append(y0)
                z = [z0]
                if z0 != y0:
                    if z0 > y0:
                        break
                else:
                    less, i = _rg_less(w, i, z, y)
                    if not less:
                        break
                jj = w[i] >> sh
                i += 1
                while jj >= m:
                    jj = w[i] >> sh
                    i += 1
                if jj == m - 1:
                    break
                if jj == m - 2:
                    less, i = _rg_less(w, i, [], xd)
                    if not less:
                        break
                y = z
                n += 1
            if n & 1:
                accepted = False
                break
        if accepted:
            break
    negative = w[i] >> 63
    i += 1
    # the reference's rounding, its integers halved: with X = scale (k 2^S + a), S = 64 m,
    # lo = (2 X + 2^S) // 2^(S+1) = (X + 2^(S-1)) >> S, and hi_num <= (lo + 1) den iff
    # X + scale + 2^(S-1) <= (lo + 1) 2^S
    a, m, s = 0, 0, 0
    while True:
        if len(xd) <= m:
            xd.append(w[i])
            i += 1
        a = (a << 64) | xd[m]
        m += 1
        s += 64
        half = 1 << (s - 1)
        big = scale * ((k << s) + a) + half
        lo = big >> s
        if big + scale <= (lo + 1) << s:
            return (-lo if negative else lo), i


def rounded_gaussian(cur: WordCursor, scale: int) -> int:
    """rounded_gaussian_reference(cur, scale): the same draw from the same words, ending
    at the same position, computed on the cursor's buffered words with the reference's
    calls inlined (about 3x faster; tests/core/test_base_blt.py checks them equal, value
    and position). A draw longer than _RG_MAX words is the reference's."""
    if type(scale) is not int or scale < 1:
        scale = check_int("scale", scale, 1)
    need = _RG_WORDS
    while need <= _RG_MAX:
        w, i0 = cur.window(need)
        try:
            y, i = _rg_words(w, i0, scale)
        except IndexError:
            need *= 4
            continue
        cur.position += i - i0
        return y
    return rounded_gaussian_reference(cur, scale)


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
