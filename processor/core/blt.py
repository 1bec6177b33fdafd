"""The BLT base counter: a buffered linear Toeplitz factorisation of the prefix-sum matrix.

In plain words: the counter keeps a handful of exponentially decaying sums of its inputs
(the "buffers"), mixes them into a correlated stream w_t = (C x)_t, adds independent
Gaussian noise to each w_t, and undoes the mixing with a second set of buffers to get
y_t = (A C^{-1} (C x + z))_t = s_t + (B z)_t, B = A C^{-1}. Its noise is as small as the
square-root factorisation's (worst-case sigma at most 1.014x its for every horizon up to
10^7, 1.022x at 2^36; `bench/bench_base.py`, `docs/base-counter.md`), with O(d) state and
time per tick, d = len(THETA) = 7.

The factorisation. C is the lower-triangular Toeplitz matrix with c_0 = 1 and
c_k = sum_i omega_i theta_i^(k-1) for k >= 1 (a BLT, Dvijotham, McMahan, Pillutla, Steinke
and Thakurta 2024): w_t = x_t + sum_i omega_i S_i(t) with S_i(t + 1) = theta_i S_i(t) + x_t.
Its inverse is a recursion with the same constants: u_t = v_t - sum_i omega_i D_i(t),
D_i(t + 1) = theta_i D_i(t) + u_t, and y_t = u_1 + ... + u_t. The constants are dyadic
rationals THETA_NUM / 2^PARAM_BITS, OMEGA_NUM / 2^PARAM_BITS, fitted once (`bench/
bench_base.py --fit 7`) so that max column norm of C times max row norm of B stays within
a few percent of the square root's for every horizon n <= 2^36 (beyond, the ratio grows:
1.43x at 2^40; a longer-lived deployment needs a refit and a new BLT_VERSION).

Exactness on the lattice (the privacy argument, `docs/privacy-notes.md`):
1. Inputs are integer units. The encoder runs in fixed point with FRAC_BITS bits below the
   unit and floor rounding; every w~_t is an integer number of 2^-FRAC_BITS units with
   |w~_t - (C x)_t| <= ENC_ERR_ULPS ulps, for every input stream.
2. The released vector is v_t = round(w~_t + sigma G_t) on that fine lattice, G_t ~ N(0, 1)
   i.i.d., drawn exactly (`samplers.scalar.rounded_gaussian`: Karney's algorithm, rounding decided
   on lazily drawn digits). That is post-processing of the continuous Gaussian mechanism
   on w~, whose L2 sensitivity for one input changed by `sensitivity` units is at most
   sensitivity * ||column 1 of C|| + 2 ENC_ERR_ULPS 2^-FRAC_BITS sqrt(n) (`blt_l2`), so
   sigma = analytic_gaussian_sigma(eps, delta, blt_l2), rounded up to the fine lattice,
   gives (eps, delta)-DP with no lattice correction.
3. The decoder and the final rounding to units are deterministic functions of v
   (post-processing), run in the same fixed point.
So the releases are exact integer units, the privacy loss is exactly the continuous
Gaussian mechanism's, and a restored counter continues bit for bit.

Accuracy: y_t - s_t = sigma (B G)_t + rounding terms whose sum is below 2^-20 units for
t < 2^40, plus the final rounding (half a unit); `blt_sigma` adds one unit for all of them
to sigma ||row t of B||.

Stored state: the tick, the cursor position and the 2d + 1 fixed-point integers (decimal
strings: they exceed 64 bits), with the constants' version BLT_VERSION; a state of another
version is refused (StateFormatError naming it).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache
from typing import Any, Self

import numpy as np

from processor.core.bounded import (
    UnitCounter,
    check_eps_delta,
    check_positive_int,
    check_units,
    from_parameters,
)
from processor.core.bounded import (
    state_field as _get,
)
from processor.core.calibration import analytic_gaussian_sigma
from processor.core.errors import InvalidInputError, StateFormatError
from processor.core.grid import UNIT
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers.scalar import rounded_gaussian

#: Version of the constants below; a stored state names it (a refit bumps it).
BLT_VERSION = 1
#: Fixed-point bits below one grid unit for every internal value.
FRAC_BITS = 48
#: Bits of the dyadic constants.
PARAM_BITS = 52
#: theta_i * 2^PARAM_BITS and omega_i * 2^PARAM_BITS (fitted by bench/bench_base.py --fit).
THETA_NUM: tuple[int, ...] = (
    4503599627185462, 4503599614098876, 4503598970218906, 4503574078861640,
    4502439760727742, 4460308520702824, 3456636204387218,
)
OMEGA_NUM: tuple[int, ...] = (
    48222550457, 316633606366, 2017043094262, 13063778929347,
    86556094524975, 494702155484640, 1634942812864188,
)

THETA = tuple(n / (1 << PARAM_BITS) for n in THETA_NUM)
OMEGA = tuple(n / (1 << PARAM_BITS) for n in OMEGA_NUM)

#: |w~_t - (C x)_t| in ulps (2^-FRAC_BITS units): each buffer's floor errors (< 1 ulp a
#: tick) decay by theta_i, so |S~_i - S_i| < 1 / (1 - theta_i); the mixing adds < 1 per
#: buffer. Rounded up, plus one.
ENC_ERR_ULPS = 1 + math.ceil(sum(
    o / ((1 << PARAM_BITS) - t) + 1 for o, t in zip(OMEGA_NUM, THETA_NUM, strict=True)))

#: Added to sigma(t) (units): the final rounding (half a unit) and every fixed-point
#: rounding of the encoder, the noise and the decoder (below 2^-20 units for t < 2^40).
SIGMA_SLACK = 1.0
#: Relative allowance for the float evaluation of the norms below (tested against exact
#: sums to 1e-9).
NORM_REL_SLACK = 1e-6

_ONE = 1 << FRAC_BITS
_HALF = 1 << (FRAC_BITS - 1)


def _geo(q: float, n: int) -> float:
    """sum_{k<n} r^k for r = 1 - q in (-1, 1), given q exactly (no cancellation near 1)."""
    if n <= 0:
        return 0.0
    if q < 0.5:
        return -math.expm1(n * math.log1p(-q)) / q
    return (1.0 - (1.0 - q) ** n) / q


@lru_cache(maxsize=4096)
def blt_col_norm2(n: int) -> float:
    """||column 1 of C||^2 over horizon n: 1 + sum_{i,j} omega_i omega_j G(theta_i theta_j,
    n - 1), G(r, m) = sum_{k<m} r^k (the largest column: C is lower-triangular Toeplitz)."""
    n = int(n)
    if n <= 0:
        return 0.0
    total = 1.0
    for oi, ti in zip(OMEGA, THETA_NUM, strict=True):
        for oj, tj in zip(OMEGA, THETA_NUM, strict=True):
            # 1 - theta_i theta_j from the integers: the float product would lose the
            # relative precision of 1 - r (about 1e-6 at the slowest buffer).
            total += oi * oj * _geo(_one_minus(ti * tj), n - 1)
    return total


@lru_cache(maxsize=256)
def _one_minus(tt: int) -> float:
    """1 - tt / 2^(2 PARAM_BITS), correctly rounded."""
    return float(Fraction((1 << (2 * PARAM_BITS)) - tt, 1 << (2 * PARAM_BITS)))


def _decoder_matrices() -> tuple[np.ndarray, np.ndarray]:
    """(M_a, X): the decoder's impulse response b_t = e^T M_a^t x_1 with state
    (D_1..D_d, b_{t-1}), M_a = [[diag(theta) - 1 omega^T, 0], [-omega^T, 1]], x_1 = 1."""
    d = len(THETA)
    th = np.array(THETA)
    om = np.array(OMEGA)
    m = np.zeros((d + 1, d + 1))
    m[:d, :d] = np.diag(th) - np.outer(np.ones(d), om)
    m[d, :d] = -om
    m[d, d] = 1.0
    x1 = np.ones(d + 1)
    return m, np.outer(x1, x1)


@lru_cache(maxsize=1)
def _doubling_table() -> list[tuple[np.ndarray, np.ndarray]]:
    """[(M_a^(2^j), sum_{t<2^j} M_a^t X M_a^tT)] for j = 0..62."""
    m, x = _decoder_matrices()
    out = [(m, x)]
    for _ in range(62):
        p, s = out[-1]
        out.append((p @ p, s + p @ s @ p.T))
    return out


@lru_cache(maxsize=1 << 16)
def blt_row_norm2(t: int) -> float:
    """||row t of B||^2 = sum_{k<t} b_k^2, b the impulse response of the decoder (B is
    lower-triangular Toeplitz): O(d^3 log t) by doubling sums of M_a^k X M_a^kT."""
    t = int(t)
    if t <= 0:
        return 0.0
    table = _doubling_table()
    d1 = len(THETA) + 1
    acc = np.zeros((d1, d1))
    power = np.eye(d1)
    j = 0
    rest = t
    while rest:
        if rest & 1:
            p, s = table[j]
            acc = acc + power @ s @ power.T
            power = power @ p
        rest >>= 1
        j += 1
    return float(acc[-1, -1])


def blt_decoder_coeffs(n: int) -> np.ndarray:
    """b_0..b_{n-1}, the impulse response of the decoder (row t of B is b_{t-1}..b_0), in
    float64 for the vectorised simulator: with M = diag(theta) - 1 omega^T = V diag(phi)
    V^-1 and a_j = -(omega^T V)_j (V^-1 1)_j, b_k = 1 + sum_j a_j (1 - phi_j^k) / (1 - phi_j)
    (every a_j / (1 - phi_j) has the same sign, so nothing cancels but the final 1 - ...)."""
    n = int(n)
    d = len(THETA)
    m = np.diag(np.array(THETA)) - np.outer(np.ones(d), np.array(OMEGA))
    phi, v = np.linalg.eig(m)
    a = -(np.array(OMEGA) @ v) * np.linalg.solve(v, np.ones(d))
    k = np.arange(n, dtype=np.float64)
    out = np.ones(n, dtype=np.complex128)
    for aj, pj in zip(a, phi, strict=True):
        out += aj * (1.0 - np.power(pj, k)) / (1.0 - pj)
    return np.ascontiguousarray(out.real)


def blt_l2(n: int, sensitivity: int) -> float:
    """The L2 sensitivity (units) of the fixed-point encoder output over horizon n when one
    input changes by at most `sensitivity` units (step 2 of the module docstring)."""
    col = math.sqrt(blt_col_norm2(n)) * (1.0 + NORM_REL_SLACK)
    return sensitivity * col + 2.0 * ENC_ERR_ULPS / _ONE * math.sqrt(n)


@lru_cache(maxsize=4096)
def blt_scale(eps: float, delta: float, n: int, sensitivity: int) -> int:
    """sigma of each G_t in ulps (2^-FRAC_BITS units), rounded up to an integer."""
    sigma = analytic_gaussian_sigma(eps, delta, blt_l2(n, sensitivity))
    return math.ceil(Fraction(sigma) * _ONE)


def blt_sigma(eps: float, delta: float, horizon: int, t: int, sensitivity: int = UNIT) -> float:
    """An upper bound (units) on the std of y_t - s_t of BLTCounter(eps, delta, horizon):
    sigma ||row t of B|| (the Gaussian part, exact up to NORM_REL_SLACK) + SIGMA_SLACK."""
    t, horizon = int(t), int(horizon)
    if t <= 0:
        return 0.0
    sigma = blt_scale(eps, delta, horizon, sensitivity) / _ONE
    return sigma * math.sqrt(blt_row_norm2(t)) * (1.0 + NORM_REL_SLACK) + SIGMA_SLACK


def blt_gauss_sigma(eps: float, delta: float, horizon: int, t: int,
                    sensitivity: int = UNIT) -> float:
    """The Gaussian part of blt_sigma alone (for comparisons of the factorisations)."""
    if t <= 0:
        return 0.0
    return (blt_scale(eps, delta, horizon, sensitivity) / _ONE
            * math.sqrt(blt_row_norm2(t)))


def sqrt_norm2_at(ts: list[int]) -> list[float]:
    """sum_{k<t} c_k^2 of the square-root factorisation (c_k = binom(2k, k) / 4^k) at each
    t in ts, by the recurrence c_k = c_{k-1} (2k - 1) / (2k) in chunks of 2^20 (memory
    O(2^20) whatever t). The reference the BLT's sigma is compared with."""
    want = sorted({int(t) for t in ts if int(t) > 0})
    got: dict[int, float] = {}
    carry_c, carry_sum, start = 1.0, 0.0, 0
    chunk = 1 << 20
    top = want[-1] if want else 0
    while start < top:
        j = np.arange(start, min(start + chunk, top), dtype=np.float64)
        ratio = np.ones_like(j)
        pos = j > 0
        ratio[pos] = (2.0 * j[pos] - 1.0) / (2.0 * j[pos])
        cs = np.cumprod(ratio) * carry_c
        cum = np.cumsum(cs * cs) + carry_sum
        for t in want:
            if start < t <= start + len(j):
                got[t] = float(cum[t - start - 1])
        carry_c, carry_sum, start = float(cs[-1]), float(cum[-1]), start + len(j)
    return [got.get(int(t), 0.0) for t in ts]


_BIG = re.compile(r"-?[0-9]{1,200}")


def _big(v: object, what: str) -> int:
    """A decimal-string integer of the state (bounded length; never echoed)."""
    if not isinstance(v, str) or _BIG.fullmatch(v) is None:
        raise StateFormatError(f"BLT state field {what!r} is not a decimal integer")
    return int(v)


class BLTCounter(UnitCounter):
    """Bounded continual counter of horizon n with the BLT factorisation (module docstring).

    step(u): u >= 0 units in, the noisy prefix sum in units out; one exact rounded-Gaussian
    draw per tick from KeyedStream(key, label), never redrawn. O(d) integer operations.
    """

    kind = "blt"
    __slots__ = ("_cur", "_dec", "_enc", "_scale", "_t", "_ysum", "delta", "eps", "horizon",
                 "label", "sensitivity")

    def __init__(self, eps: float, delta: float, horizon: int, key: NoiseKey, label: str,
                 sensitivity: int = UNIT) -> None:
        self.eps, self.delta = check_eps_delta(eps, delta)
        self.horizon = check_positive_int("horizon", horizon)
        self.sensitivity = check_positive_int("sensitivity", sensitivity)
        self.label = label
        self._cur = WordCursor(KeyedStream(key, label))
        self._scale = blt_scale(self.eps, self.delta, self.horizon, self.sensitivity)
        self._enc = [0] * len(THETA_NUM)
        self._dec = [0] * len(THETA_NUM)
        self._ysum = 0
        self._t = 0

    @property
    def t(self) -> int:
        return self._t

    def encode(self, u: int) -> int:
        """w~_t in ulps for input u (units), advancing the encoder buffers."""
        enc = self._enc
        if not u and not any(enc):
            return 0  # zero buffers and a zero input stay zero (a counter fed only zeros)
        x = u << FRAC_BITS
        # integer sums: exact, so the order of the terms does not matter
        w = x + sum([(on * e) >> PARAM_BITS for on, e in zip(OMEGA_NUM, enc, strict=True)])
        self._enc = [((tn * e) >> PARAM_BITS) + x for tn, e in zip(THETA_NUM, enc, strict=True)]
        return w

    def decode(self, v: int) -> int:
        """The release in units after v (ulps), advancing the decoder buffers."""
        dec = self._dec
        u = v - sum([(on * d) >> PARAM_BITS for on, d in zip(OMEGA_NUM, dec, strict=True)])
        self._dec = [((tn * d) >> PARAM_BITS) + u for tn, d in zip(THETA_NUM, dec, strict=True)]
        self._ysum += u
        return (self._ysum + _HALF) >> FRAC_BITS

    def step(self, u: int) -> int:
        u = check_units(u)
        if self._t >= self.horizon:
            raise InvalidInputError(u, "bounded counter horizon exhausted")
        self._t += 1
        w = self.encode(u)
        return self.decode(w + rounded_gaussian(self._cur, self._scale))

    def sigma(self, t: int) -> float:
        return blt_sigma(self.eps, self.delta, self.horizon, t, self.sensitivity)

    def to_state(self) -> dict[str, Any]:
        return {"k": self.kind, "v": BLT_VERSION, "e": self.eps, "d": self.delta,
                "n": self.horizon, "sen": self.sensitivity, "lab": self.label, "t": self._t,
                "p": self._cur.position, "we": [str(v) for v in self._enc],
                "wd": [str(v) for v in self._dec], "ys": str(self._ysum)}

    @classmethod
    def from_state(cls, state: dict[str, Any], key: NoiseKey) -> Self:
        if _get(state, "k", str) != cls.kind:
            raise StateFormatError("not a BLTCounter state")
        version = _get(state, "v", int)
        if version != BLT_VERSION:
            raise StateFormatError(f"BLT state version {version} is not the supported "
                                   f"version {BLT_VERSION}")
        obj = from_parameters(cls, state, key, "BLTCounter")
        t, p = _get(state, "t", int), _get(state, "p", int)
        we, wd = _get(state, "we", list), _get(state, "wd", list)
        if not 0 <= t <= obj.horizon or p < 0 or len(we) != len(THETA_NUM) or len(wd) != len(
                THETA_NUM):
            raise StateFormatError("BLTCounter state out of range")
        obj._enc = [_big(v, "we") for v in we]
        obj._dec = [_big(v, "wd") for v in wd]
        obj._ysum = _big(_get(state, "ys", str), "ys")
        obj._t, obj._cur.position = t, p
        return obj


def blt_reference(counter: BLTCounter, key: NoiseKey, inputs: list[int]) -> list[int]:
    """Dense reference for a fresh counter's releases on `inputs` (tests only).

    Builds the explicit matrix C (exact dyadic entries c_k), computes w = C x exactly,
    draws the same G's (same key, label and order) and releases round((A C^{-1} (w + z))_t)
    by an exact triangular solve with C and prefix sums, z = the fast counter's rounded
    noise. The fast counter's w~ differs from w by at most ENC_ERR_ULPS ulps and its
    decoder rounds, so both round the same value up to far below a unit: equal releases
    except within ~2^-20 units of a half unit (probability ~2^-19 per tick).
    """
    if counter.t != 0:
        raise ValueError("reference needs a fresh counter")
    twin = BLTCounter.from_state(counter.to_state(), key)
    n = len(inputs)
    p = Fraction(1, 1 << PARAM_BITS)
    th = [Fraction(v) * p for v in THETA_NUM]
    om = [Fraction(v) * p for v in OMEGA_NUM]
    c = [Fraction(1)] + [sum((o * t ** (k - 1) for o, t in zip(om, th, strict=True)),
                             Fraction(0)) for k in range(1, n)]
    cmat = [[c[i - j] if j <= i else Fraction(0) for j in range(n)] for i in range(n)]
    w = [sum((cmat[i][j] * inputs[j] for j in range(i + 1)), Fraction(0)) for i in range(n)]
    z = [Fraction(rounded_gaussian(twin._cur, twin._scale), _ONE) for _ in range(n)]
    v = [wi + zi for wi, zi in zip(w, z, strict=True)]
    u: list[Fraction] = []
    for i in range(n):  # C u = v, C unit lower-triangular
        u.append(v[i] - sum((cmat[i][j] * u[j] for j in range(i)), Fraction(0)))
    out = []
    total = Fraction(0)
    for ui in u:
        total += ui
        out.append(math.floor(total + Fraction(1, 2)))
    return out
