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
- Otherwise every "uniform integer below m" reads whole 64-bit words (rejection sampling),
  so words are never split between two draws.

The float helpers at the end (`uniform01`, `geometric_failures`, `bernoulli_float`) are
NOT exact: they are for a mechanism's `skip(n)` fast path where a float64 approximation
(relative error about 2^-52 in the probability) is acceptable and documented. Each of them
consumes exactly one word.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from processor.core.errors import InvalidParameterError
from processor.core.grid import UNIT
from processor.core.rng import KeyedStream, WordCursor

__all__ = [
    "BLOCK_MAX_T",
    "LaplaceBank",
    "bernoulli_exp",
    "bernoulli_float",
    "bernoulli_frac",
    "discrete_gaussian",
    "discrete_laplace",
    "discrete_laplace_block",
    "dlap_log_sf",
    "dlap_sf",
    "gaussian_sigma2_units",
    "geometric_failures",
    "laplace_scale_units",
    "uniform01",
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


def uniform_below(cur: WordCursor, m: int) -> int:
    """An exactly uniform integer in {0, ..., m-1}, m >= 1 (any size, also > 2^64).

    Rejection on whole bits: read k = bitlen(m-1) bits (whole words, see
    WordCursor.next_bits) and retry while the value is >= m; each try succeeds with
    probability > 1/2. m == 1 returns 0 and consumes nothing.
    """
    m = _check_int("m", m, 1)
    if m == 1:
        return 0
    k = (m - 1).bit_length()
    while True:
        x = cur.next_bits(k)
        if x < m:
            return x


def bernoulli_frac(cur: WordCursor, num: int, den: int) -> bool:
    """True with probability exactly num/den (0 <= num <= den, den >= 1)."""
    den = _check_int("den", den, 1)
    num = _check_int("num", num, 0)
    if num > den:
        raise InvalidParameterError("bernoulli_frac needs num <= den")
    if num == 0:
        return False
    if num == den:
        return True
    return uniform_below(cur, den) < num


def _bernoulli_exp_le1(cur: WordCursor, num: int, den: int) -> bool:
    """Bernoulli(exp(-num/den)) for 0 <= num/den <= 1 (CKS Algorithm 1, von Neumann).

    K = 1; while Bernoulli(gamma/K): K += 1; return K odd. P(K > k) = gamma^k / k!, so
    P(K odd) = sum over odd k of (gamma^(k-1)/(k-1)! - gamma^k/k!) = exp(-gamma).
    """
    k = 1
    while bernoulli_frac(cur, num, den * k):
        k += 1
    return k % 2 == 1


def bernoulli_exp(cur: WordCursor, num: int, den: int) -> bool:
    """True with probability exactly exp(-num/den), num >= 0, den >= 1.

    For gamma = num/den > 1: floor(gamma) independent Bernoulli(exp(-1)) trials must all
    succeed, then one Bernoulli(exp(-frac(gamma))) (CKS Algorithm 1).
    """
    den = _check_int("den", den, 1)
    num = _check_int("num", num, 0)
    whole, rem = divmod(num, den)
    for _ in range(whole):
        if not _bernoulli_exp_le1(cur, 1, 1):
            return False
    return _bernoulli_exp_le1(cur, rem, den)


def discrete_laplace(cur: WordCursor, t: int, s: int = 1) -> int:
    """One sample Z with P(Z = z) proportional to exp(-|z| * s / t) (scale b = t/s).

    CKS Algorithm 2: U uniform in [0, t) accepted with probability exp(-U/t) gives the
    remainder, V (geometric: P(V >= v) = e^-v) the number of whole t's; X = U + t V has
    P(X = x) proportional to exp(-x/t); Y = floor(X / s) then has P(Y = y) proportional to
    exp(-y s/t); a fair sign, rejecting "minus zero", makes it two-sided.
    """
    t = _check_int("t", t, 1)
    s = _check_int("s", s, 1)
    while True:
        u = uniform_below(cur, t)
        if not bernoulli_exp(cur, u, t):
            continue
        v = 0
        while _bernoulli_exp_le1(cur, 1, 1):
            v += 1
        y = (u + t * v) // s
        negative = cur.next_word() >> 63 == 1
        if negative and y == 0:
            continue
        return -y if negative else y


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
        y = discrete_laplace(cur, t, 1)
        diff = abs(y) * d * t - n
        if bernoulli_exp(cur, diff * diff, den):
            return y


# --------------------------------------------------------------------------- calibration to units


def laplace_scale_units(b: float) -> int:
    """The Laplace scale b (in counts) as an integer number of grid units: ceil(b * UNIT).

    Rounded up, so the noise is never smaller than asked: DLap(ceil(b UNIT)) for a
    sensitivity of UNIT units is at least as private as Lap(b) for sensitivity 1. The
    product is exact (UNIT is a power of two), so the only rounding is the ceil.
    """
    if isinstance(b, bool) or not isinstance(b, int | float) or not math.isfinite(b) or b <= 0:
        raise InvalidParameterError(f"Laplace scale must be a finite number > 0, got {b!r}")
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
#: Why: products t * K (K <= _BLOCK_ROUNDS + 2) and U + t * V (V <= _BLOCK_ROUNDS) must stay
#: below 2^63 in uint64/int64 arithmetic; with t <= 2^48 and at most 256 rounds they do.
BLOCK_MAX_T = 1 << 48
_BLOCK_ROUNDS = 64

# States of one trial of CKS Algorithm 2 in the vectorised state machine.
_S_U = 0  # draw U uniform in [0, t)
_S_D = 1  # von Neumann for Bernoulli(exp(-U/t)): step K draws Bernoulli(U / (t K))
_S_V = 2  # geometric V: repeated Bernoulli(exp(-1)); step K draws Bernoulli(1 / K)
_S_B = 3  # the sign bit


def _step_scalar(st: int, u: int, k: int, v: int, w: int, t: int, s: int
                 ) -> tuple[int, int, int, int, int | None]:
    """One step of the trial state machine on one word w (the scalar twin of a round).

    Every step reads exactly one word and draws "uniform below m, compared with thr" by
    rejection: w is accepted when w < 2^64 - (2^64 mod m), then w mod m is exactly
    uniform on [0, m); a rejected word leaves the state unchanged (the step is retried).
    Returns the new (state, U, K, V, output or None).
    """
    if st == _S_U:
        m, thr = t, t
    elif st == _S_D:
        m, thr = t * k, u
    elif st == _S_V:
        m, thr = k, 1
    else:
        m, thr = 2, 1
    excess = (1 << 64) % m
    if w > _U64_MAX - excess:
        return st, u, k, v, None
    r = w % m
    ok = r < thr
    if st == _S_U:
        return _S_D, r, 1, 0, None
    if st == _S_D:
        if ok:
            return st, u, k + 1, v, None
        if k % 2 == 1:  # Bernoulli(exp(-U/t)) succeeded: on to the geometric part
            return _S_V, u, 2, 0, None
        return _S_U, 0, 0, 0, None
    if st == _S_V:
        # K starts at 2: the first von Neumann step, Bernoulli(1/1), always succeeds.
        if ok:
            return st, u, k + 1, v, None
        if k % 2 == 1:  # one more exp(-1) success
            return st, u, 2, v + 1, None
        return _S_B, u, k, v, None
    y = (u + t * v) // s
    negative = not ok
    if negative and y == 0:
        return _S_U, 0, 0, 0, None
    return st, u, k, v, (-y if negative else y)


def discrete_laplace_block(stream: KeyedStream, lane: int, t: int, s: int, n: int
                           ) -> npt.NDArray[np.int64]:
    """n independent samples of discrete_laplace(t, s), exactly, as an int64 array.

    A pure function of (stream, lane, t, s, n): it reads the words of `lane` from word 0.
    Each trial runs CKS Algorithm 2 as a small state machine in which every step consumes
    one fresh word (see _step_scalar). Up to _BLOCK_ROUNDS rounds run vectorised over all
    unfinished trials (round r gives the active trials, in trial order, the next words of
    the lane); every trial still unfinished after that is completed, in trial order, by
    the same state machine in scalar code reading further words of the lane. Every step
    uses a fresh uniform word, so the output law is exactly DLap(t/s) for every trial and
    trials are independent; outputs are in trial order.

    Limit: t <= BLOCK_MAX_T (2^48) keeps all uint64 arithmetic exact; larger t falls back
    to n calls of the scalar discrete_laplace on a cursor over the same lane.
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

    u64 = np.uint64
    t64 = u64(t)
    s64 = u64(s)
    idx = np.arange(n, dtype=np.int64)
    st = np.zeros(n, dtype=np.uint8)
    uu = np.zeros(n, dtype=np.uint64)
    kk = np.zeros(n, dtype=np.uint64)
    vv = np.zeros(n, dtype=np.uint64)
    # The t-dependent rejection threshold for the U step is a constant; others vary.
    t_limit = u64(_U64_MAX - (1 << 64) % t)

    # Words are fetched in large slices (prefetch) but assigned strictly by position.
    pos = 0
    buf = stream.words(lane, 0, 12 * n)
    buf_start = 0

    one = u64(1)
    two = u64(2)
    for _ in range(_BLOCK_ROUNDS):
        na = len(idx)
        if na == 0:
            break
        if pos + na > buf_start + len(buf):
            buf = stream.words(lane, pos, max(na, 4 * n))
            buf_start = pos
        w = buf[pos - buf_start: pos - buf_start + na]
        pos += na

        in_u = st == _S_U
        in_d = st == _S_D
        in_v = st == _S_V
        in_b = st == _S_B
        # m and thr per trial (see _step_scalar). For the sign step m = 2 and for the U
        # step m = t; the D step uses m = t K, the V step m = K.
        m = np.where(in_d, t64 * kk, np.where(in_v, kk, np.where(in_u, t64, two)))
        thr = np.where(in_d, uu, np.where(in_u, t64, one))
        # Accept w iff w <= 2^64 - 1 - (2^64 mod m); (~m + 1) % m == 2^64 mod m, no overflow.
        limit = np.where(in_u, t_limit, ~((~m + one) % m))
        acc = w <= limit
        r = w % m
        ok = r < thr
        succ = acc & ok
        fail = acc & ~ok
        odd = (kk & one) == one

        # U step: accepted word gives U = r, start the von Neumann loop at K = 1.
        a_u = in_u & acc
        # D step
        d_next = in_d & succ
        d_pass = in_d & fail & odd
        d_restart = in_d & fail & ~odd
        # V step
        v_next = in_v & succ
        v_more = in_v & fail & odd
        v_done = in_v & fail & ~odd
        # Sign step (always accepted: 2^64 mod 2 == 0)
        negative = in_b & ~ok
        y = (uu + t64 * vv) // s64
        b_restart = negative & (y == 0)
        b_done = in_b & ~b_restart

        uu = np.where(a_u, r, uu)
        kk = np.where(a_u, one, kk)
        kk = np.where(d_next | v_next, kk + one, kk)
        kk = np.where(d_pass | v_more, two, kk)
        vv = np.where(d_pass, u64(0), vv)
        vv = np.where(v_more, vv + one, vv)
        st = np.where(a_u, np.uint8(_S_D), st)
        st = np.where(d_pass, np.uint8(_S_V), st)
        st = np.where(d_restart | b_restart, np.uint8(_S_U), st)
        st = np.where(v_done, np.uint8(_S_B), st)

        if b_done.any():
            yi = y[b_done].astype(np.int64)
            out[idx[b_done]] = np.where(negative[b_done], -yi, yi)
            keep = ~b_done
            idx, st, uu, kk, vv = idx[keep], st[keep], uu[keep], kk[keep], vv[keep]

    if len(idx):
        cur = WordCursor(stream, lane, pos)
        for j in range(len(idx)):
            state = (int(st[j]), int(uu[j]), int(kk[j]), int(vv[j]))
            res: int | None = None
            while res is None:
                a, b, c, d, res = _step_scalar(*state, cur.next_word(), t, s)
                state = (a, b, c, d)
            out[idx[j]] = res
    return out


class LaplaceBank:
    """An addressable, reproducible sequence of DLap(t/s) samples: draw(i) is the i-th.

    Sample i lives in chunk c = i // chunk, computed as
    discrete_laplace_block(stream, lane=c + 1, t, s, chunk) (lane 0 is left to scalar
    cursors). A mechanism stores only the index in its state. draw(i) does not depend on
    the order of calls; the last few chunks are cached, so sequential use costs one
    vectorised block per `chunk` draws.
    """

    __slots__ = ("_cache", "chunk", "s", "stream", "t")

    _CACHE_CHUNKS = 2

    def __init__(self, stream: KeyedStream, t: int, s: int = 1, chunk: int = 1024) -> None:
        self.stream = stream
        self.t = _check_int("t", t, 1)
        self.s = _check_int("s", s, 1)
        self.chunk = _check_int("chunk", chunk, 1)
        self._cache: dict[int, npt.NDArray[np.int64]] = {}

    def block(self, c: int) -> npt.NDArray[np.int64]:
        """The samples of chunk c (cached)."""
        arr = self._cache.get(c)
        if arr is None:
            if c + 1 >= 1 << 96:
                raise InvalidParameterError("LaplaceBank index out of range")
            arr = discrete_laplace_block(self.stream, c + 1, self.t, self.s, self.chunk)
            if len(self._cache) >= self._CACHE_CHUNKS:
                self._cache.pop(next(iter(self._cache)))
            self._cache[c] = arr
        return arr

    def draw(self, index: int) -> int:
        """The index-th sample (index >= 0)."""
        index = _check_int("index", index, 0)
        c, j = divmod(index, self.chunk)
        return int(self.block(c)[j])

    def __repr__(self) -> str:
        return f"LaplaceBank(label={self.stream.label!r}, t={self.t}, s={self.s})"


# --------------------------------------------------------------------------- float helpers


def uniform01(cur: WordCursor) -> float:
    """A float uniform on the odd multiples of 2^-53 in (0, 1); reads one word.

    APPROXIMATE (float64): values are (2k + 1) / 2^53 for k uniform in [0, 2^52), so never
    0 or 1, and P(u < p) differs from p by at most 2^-53 for any p in [0, 1].
    """
    k = cur.next_word() >> 12
    return (2 * k + 1) / float(1 << 53)


def _check_prob(p: float, *, allow_zero: bool) -> float:
    if isinstance(p, bool) or not isinstance(p, int | float):
        raise InvalidParameterError(f"probability must be a number, got {type(p).__name__}")
    pf = float(p)
    lo_ok = pf >= 0.0 if allow_zero else pf > 0.0
    if not (lo_ok and pf <= 1.0):  # also rejects NaN
        raise InvalidParameterError(f"probability out of range: {p!r}")
    return pf


def geometric_failures(cur: WordCursor, p: float) -> int:
    """Failures before the first success of Bernoulli(p) trials, p in (0, 1]; one word.

    APPROXIMATE (float64 inversion): floor(ln u / ln(1 - p)) with u = uniform01(cur). The
    law matches Geometric(p) up to the float rounding of the logarithms (relative error
    ~1e-15 in the CDF) and the 2^-53 grid of u (so the result is < 37 / -ln(1-p)). For tiny
    p the result can be a huge Python int; it never overflows (a Fraction is used when the
    float quotient is not finite).
    """
    pf = _check_prob(p, allow_zero=False)
    u = uniform01(cur)
    if pf == 1.0:
        return 0
    lu = -math.log(u)  # > 0
    ln1p = -math.log1p(-pf)  # > 0 (p > 0), possibly subnormal
    q = lu / ln1p
    if math.isfinite(q):
        return math.floor(q)
    return math.floor(Fraction(lu) / Fraction(ln1p))


def bernoulli_float(cur: WordCursor, p: float) -> bool:
    """True with probability p up to 2^-53 (APPROXIMATE, float64); reads one word."""
    pf = _check_prob(p, allow_zero=True)
    return uniform01(cur) < pf


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
