"""The unbounded continual counter CC (Lemma 3.12) and the biased counter BCC (Lemma 3.13).

UnboundedCC: the doubling trick. Ticks are split into intervals I_k = [2^{k-1}, 2^k - 1].
When I_k completes, p_k = (sum of I_k) + N(0, C_{eps/2,delta/2}^2 sensitivity^2) is drawn
(discrete Gaussian in units) and added to l. Inside the running interval a fresh bounded
(eps/2, delta/2) counter counts the inputs of I_k (q_t); y_t = l_t when t = 2^j - 1, else
l_t + q_t.

One refinement over the paper's text, with the same privacy argument: the inner counter of
I_k is only ever read at the first 2^{k-1} - 1 ticks of I_k (at the last tick y_t = l_t),
so it is given horizon 2^{k-1} - 1 and never sees the interval's last input, which is
protected by p_k alone. Each input still enters p_k and at most one bounded counter, so
CC is (eps, delta)-DP by composition; the tree gets one level fewer (less noise).

BCC: CC with (eps, delta/2); eta = 0.5 delta / (1 + e^eps); y_t = ceil(max(y'_t +
alpha_CC(eps, delta/2, eta, t), s_t)). It never underestimates and is an integer.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Final, Self

from processor.core.blt import BLTCounter, blt_sigma
from processor.core.bounded import (
    GaussianTree,
    LaplaceTreeBounded,
    SqrtFactor,
    UnitCounter,
    check_eps_delta,
    check_positive_int,
    check_units,
    dlap_variance,
    gaussian_sigma2,
    laplace_tree_sigma,
    sqrt_sigma,
    tail_factor,
    tree_sigma,
)
from processor.core.bounded import (
    state_field as _get,
)
from processor.core.errors import InvalidParameterError, StateFormatError
from processor.core.grid import UNIT
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers.scalar import discrete_gaussian, discrete_laplace, laplace_scale_units

#: Base counters inside the running interval. "blt" (BLTCounter, O(1) state, within 1.1x
#: of the square root's sigma; blt.py) is the default; "tree" (GaussianTree, O(log) state)
#: was the default before it (states that name it still restore as trees); "sqrt"
#: (SqrtFactor, linear state) is for experiments; "laplace" is the pure-DP variant
#: (discrete Laplace everywhere, delta unused) behind the LaplaceTree baseline.
BASES = ("tree", "sqrt", "laplace", "blt")
DEFAULT_BASE = "blt"


def _check_base(base: object) -> str:
    if base not in BASES:
        raise InvalidParameterError(f"unknown base {base!r}; valid: {', '.join(BASES)}")
    return str(base)


def psum_laplace_scale(eps: float, sensitivity: int) -> int:
    """Interval-sum scale in units for the pure-DP variant: Lap(sensitivity / (eps/2))."""
    return laplace_scale_units(2.0 * sensitivity / (eps * UNIT))


@lru_cache(maxsize=4096)
def psum_var(eps: float, delta: float, base: str, sensitivity: int) -> float:
    """Variance (units^2) of one interval-sum release p_k."""
    if base == "laplace":
        return dlap_variance(psum_laplace_scale(eps, sensitivity))
    num, den = gaussian_sigma2(eps / 2, delta / 2, float(sensitivity))
    return num / den


def _inner_sigma(eps: float, delta: float, base: str, horizon: int, tau: int,
                 sensitivity: int) -> float:
    if base == "tree":
        return tree_sigma(eps / 2, delta / 2, horizon, tau, sensitivity)
    if base == "sqrt":
        return sqrt_sigma(eps / 2, delta / 2, horizon, tau, sensitivity)
    if base == "blt":
        return blt_sigma(eps / 2, delta / 2, horizon, tau, sensitivity)
    return laplace_tree_sigma(eps / 2, horizon, tau, sensitivity)


# Cached: cc_sigma_max evaluates O(log t) of these per release, mostly the same ones.
@lru_cache(maxsize=65536)
def cc_sigma(eps: float, delta: float, t: int, base: str = DEFAULT_BASE,
             sensitivity: int = UNIT) -> float:
    """Exact std (units) of y_t - s_t of UnboundedCC(eps, delta, base, sensitivity).

    K = floor(log2(t + 1)) intervals are complete at t, each adding one p_k; if t is not
    the end of an interval, the running interval's bounded counter adds its own error at
    local time t - 2^K + 1 (horizon 2^K - 1). For base "sqrt" the release rounding (at most
    half a unit) is not included.
    """
    t = int(t)  # numpy integers from the simulator
    if t <= 0:
        return 0.0
    k_done = (t + 1).bit_length() - 1
    var = k_done * psum_var(eps, delta, base, sensitivity)
    start = 1 << k_done
    if t != start - 1:
        s = _inner_sigma(eps, delta, base, start - 1, t - start + 1, sensitivity)
        var += s * s
    return math.sqrt(var)


def cc_alpha(eps: float, delta: float, beta: float, t: int, base: str = DEFAULT_BASE,
             sensitivity: int = UNIT) -> float:
    """alpha_CC(eps, delta, beta, t) = sigma_t sqrt(2 ln(pi^2 t^2 / (3 beta))), in units."""
    if t <= 0:
        return 0.0
    return cc_sigma(eps, delta, t, base, sensitivity) * tail_factor(beta, t)


# Cached: the operator asks for the bound of every release, and ECC's bound of each t.
@lru_cache(maxsize=65536)
def cc_sigma_max(eps: float, delta: float, t: int, base: str = DEFAULT_BASE,
                 sensitivity: int = UNIT) -> float:
    """max over 1 <= l <= t of cc_sigma(l), in units: a bound on the error std at every
    step up to t.

    cc_sigma is not monotone in its step (it drops at interval ends l = 2^j - 1, and with
    the popcount of the local time inside an interval), so a caller that only knows an
    upper bound t on the step count (ECC: the number of checkpoints l <= t) must use this
    envelope, not cc_sigma(t). For the l of the interval [2^k - 1, 2^{k+1} - 2] (k intervals
    complete) the running counter is at local time tau = l - 2^k + 1 in [0, m]; its std
    grows with tau (sqrt) or with popcount(tau) (trees), so the maximum over [0, m] is at
    tau = m or at the all-ones number 2^{bitlen(m) - 1} - 1. O(log t) evaluations.
    """
    t = int(t)
    best = 0.0
    k = 1
    while (1 << k) - 1 <= t:
        first = (1 << k) - 1
        m = min(t, (1 << (k + 1)) - 2) - first
        cands = {first, first + m}
        if m >= 1:
            cands.add(first + (1 << (m.bit_length() - 1)) - 1)
        for l in cands:  # noqa: E741
            best = max(best, cc_sigma(eps, delta, l, base, sensitivity))
        k += 1
    return best


def cc_alpha_max(eps: float, delta: float, beta: float, t: int, base: str = DEFAULT_BASE,
                 sensitivity: int = UNIT) -> float:
    """max over 1 <= l <= t of cc_alpha(eps, delta, beta, l) (bounded above; units)."""
    if t <= 0:
        return 0.0
    return cc_sigma_max(eps, delta, t, base, sensitivity) * tail_factor(beta, t)


def bcc_eta(eps: float, delta: float) -> float:
    """eta = 0.5 delta / (1 + e^eps) of Lemma 3.13 (the probability BCC differs from M)."""
    return 0.5 * delta / (1.0 + math.exp(eps)) if eps < 700 else 0.0


def bcc_offset(eps: float, delta: float, t: int, base: str = DEFAULT_BASE,
               sensitivity: int = UNIT) -> float:
    """The shift BCC adds before rounding up: alpha_CC(eps, delta/2, eta, t), in units."""
    eta = bcc_eta(eps, delta)
    if eta <= 0.0:
        raise InvalidParameterError("eps too large for BCC's eta")
    return cc_alpha(eps, delta / 2, eta, t, base, sensitivity)


def bcc_alpha(eps: float, delta: float, t: int, beta: float = 0.05, base: str = DEFAULT_BASE,
              sensitivity: int = UNIT) -> float:
    """Lemma 3.13's accuracy bound of BCC, in whole counts (multiples of `sensitivity`):
    (alpha_CC(eps, delta/2, beta, t) + alpha_CC(eps, delta/2, eta, t)) / sensitivity + 1.
    With probability >= 1 - beta, 0 <= y_t - s_t <= this for all t."""
    if t <= 0:
        return 0.0
    a = cc_alpha(eps, delta / 2, beta, t, base, sensitivity)
    return (a + bcc_offset(eps, delta, t, base, sensitivity)) / sensitivity + 1.0


def bcc_alpha_max(eps: float, delta: float, t: int, beta: float = 0.05, base: str = DEFAULT_BASE,
                  sensitivity: int = UNIT) -> float:
    """An upper bound on bcc_alpha(eps, delta, l, beta) for every 1 <= l <= t (counts)."""
    if t <= 0:
        return 0.0
    eta = bcc_eta(eps, delta)
    if eta <= 0.0:
        raise InvalidParameterError("eps too large for BCC's eta")
    sig = cc_sigma_max(eps, delta / 2, t, base, sensitivity)
    return sig * (tail_factor(beta, t) + tail_factor(eta, t)) / sensitivity + 1.0


#: The running interval's counter class per base (see UnboundedCC._new_inner).
_INNER_CLASS: dict[str, type[UnitCounter]] = {
    "tree": GaussianTree, "sqrt": SqrtFactor, "laplace": LaplaceTreeBounded, "blt": BLTCounter}
#: The stored keys of the running counter's parameters, which a restore compares with the
#: ones its interval implies: kind, epsilon, delta, horizon, sensitivity, noise label
#: (core/state.py lists every short key).
_INNER_PARAMETER_KEYS: Final = ("k", "e", "d", "n", "sen", "lab")


class UnboundedCC(UnitCounter):
    """The unbounded CC of Lemma 3.12 over integer units (see module docstring).

    `step(u)` takes u >= 0 units, whose 1-step-neighbour change is at most `sensitivity`
    units, and returns the noisy prefix sum in units. Labels: p_k draws from
    f"{label}/psum"; the bounded counter of I_k from f"{label}/i{k}".
    """

    kind = "ucc"
    __slots__ = ("_inner", "_isum", "_l", "_pos", "_psum", "_t", "_y", "base", "delta", "eps",
                 "key", "label", "sensitivity")

    def __init__(self, eps: float, delta: float, key: NoiseKey, label: str,
                 sensitivity: int = UNIT, base: str = DEFAULT_BASE) -> None:
        self.base = _check_base(base)
        self.eps, self.delta = check_eps_delta(eps, delta, delta_used=self.base != "laplace")
        self.sensitivity = check_positive_int("sensitivity", sensitivity)
        self.key = key
        self.label = label
        #: words of the "/psum" stream consumed: its cursor is made per draw (one every
        #: interval, so at most log2 t of them)
        self._pos = 0
        if self.base == "laplace":
            self._psum: tuple[int, int] = (psum_laplace_scale(self.eps, self.sensitivity), 1)
        else:
            self._psum = gaussian_sigma2(self.eps / 2, self.delta / 2, float(self.sensitivity))
        self._t = 0
        self._l = 0      # sum of the released p_k (units)
        self._isum = 0   # exact sum of the running interval (units)
        self._y = 0
        self._inner: UnitCounter | None = None

    @property
    def t(self) -> int:
        return self._t

    @property
    def y(self) -> int:
        """The last release in units."""
        return self._y

    def _new_inner(self, k: int, horizon: int) -> UnitCounter:
        label = f"{self.label}/i{k}"
        eps, delta = self.eps / 2, self.delta / 2
        if self.base == "tree":
            return GaussianTree(eps, delta, horizon, self.key, label, self.sensitivity)
        if self.base == "sqrt":
            return SqrtFactor(eps, delta, horizon, self.key, label, self.sensitivity)
        if self.base == "blt":
            return BLTCounter(eps, delta, horizon, self.key, label, self.sensitivity)
        return LaplaceTreeBounded(eps, horizon, self.key, label, self.sensitivity)

    def _inner_fixed(self, k: int, horizon: int) -> dict[str, Any]:
        """The fixed fields of _new_inner(k, horizon).to_state(), without building it (a
        restore checks them; building the counter would double the restore's cost)."""
        out: dict[str, Any] = {"k": _INNER_CLASS[self.base].kind, "e": self.eps / 2,
                               "n": horizon, "sen": self.sensitivity,
                               "lab": f"{self.label}/i{k}"}
        if self.base != "laplace":
            out["d"] = self.delta / 2
        return out

    def _draw_psum(self) -> int:
        cur = WordCursor(KeyedStream(self.key, self.label, "/psum"), 0, self._pos)
        if self.base == "laplace":
            z = discrete_laplace(cur, self._psum[0])
        else:
            z = discrete_gaussian(cur, self._psum[0], self._psum[1])
        self._pos = cur.position
        return z

    def step(self, u: int) -> int:
        u = check_units(u)
        t = self._t + 1
        k = t.bit_length()           # t lies in I_k = [2^{k-1}, 2^k - 1]
        start, end = 1 << (k - 1), (1 << k) - 1
        # Everything below is infallible: validation is done.
        self._t = t
        if t == start:
            self._isum = 0
            self._inner = self._new_inner(k, start - 1) if start > 1 else None
        self._isum += u
        if t == end:
            self._l += self._isum + self._draw_psum()
            self._inner = None
            self._isum = 0
            self._y = self._l
        else:
            assert self._inner is not None
            self._y = self._l + self._inner.step(u)
        return self._y

    def sigma(self, t: int) -> float:
        return cc_sigma(self.eps, self.delta, t, self.base, self.sensitivity)

    def alpha_max(self, beta: float, t: int) -> float:
        """A bound on alpha(beta, l) for every l <= t (units): for a caller that knows
        only an upper bound t on this counter's step count (see cc_sigma_max)."""
        return cc_alpha_max(self.eps, self.delta, beta, t, self.base, self.sensitivity)

    @staticmethod
    def cc_sigma(eps: float, delta: float, t: int, base: str = DEFAULT_BASE,
                 sensitivity: int = UNIT) -> float:
        """sigma(t) without an instance (for the vectorised simulator)."""
        return cc_sigma(eps, delta, t, base, sensitivity)

    def to_state(self) -> dict[str, Any]:
        return {"k": self.kind, "e": self.eps, "d": self.delta, "sen": self.sensitivity,
                "b": self.base, "lab": self.label, "t": self._t, "l": self._l,
                "is": self._isum, "y": self._y, "p": self._pos,
                "in": None if self._inner is None else self._inner.to_state()}

    @classmethod
    def from_state(cls, state: dict[str, Any], key: NoiseKey) -> Self:
        if _get(state, "k", str) != cls.kind:
            raise StateFormatError("not an UnboundedCC state")
        try:
            obj = cls(_get(state, "e", float), _get(state, "d", float), key,
                      _get(state, "lab", str), _get(state, "sen", int), _get(state, "b", str))
        except InvalidParameterError as exc:
            raise StateFormatError(f"bad UnboundedCC parameters: {exc}") from None
        t = _get(state, "t", int)
        p = _get(state, "p", int)
        isum = _get(state, "is", int)
        if t < 0 or p < 0 or isum < 0:
            raise StateFormatError("UnboundedCC state out of range")
        obj._t, obj._l, obj._isum, obj._y = t, _get(state, "l", int), isum, _get(state, "y", int)
        obj._pos = p
        inner = state.get("in")
        k = (t + 1).bit_length()     # the interval tick t + 1 falls in
        start = 1 << (k - 1)
        expect_inner = t >= start and start > 1   # inside I_k with ticks already consumed
        if inner is None:
            if expect_inner:
                raise StateFormatError("UnboundedCC state lacks its running counter")
        else:
            if not expect_inner or not isinstance(inner, dict):
                raise StateFormatError("UnboundedCC state has an unexpected running counter")
            restored = _INNER_CLASS[obj.base].from_state(inner, key)
            a, b = restored.to_state(), obj._inner_fixed(k, start - 1)
            if (any(a.get(f) != b.get(f) for f in _INNER_PARAMETER_KEYS)
                    or restored.t != t - start + 1):
                raise StateFormatError("UnboundedCC running counter does not match")
            obj._inner = restored
        return obj


class BCC(UnitCounter):
    """The biased counter of Lemma 3.13: an integer count that never underestimates.

    `step(d)` takes the raw integer count of this step (for ECC: a number of ticks). Inside,
    the count is put on a fine lattice: d becomes d * sensitivity units of an UnboundedCC
    with (eps, delta/2) whose 1-step change is `sensitivity` units, so the discrete Gaussian
    noise lives on a grid 1/sensitivity of a count. The release is
    y_t = ceil(max(y'_t + alpha_CC(eps, delta/2, eta, t), s_t * sensitivity) / sensitivity),
    an int number of counts. (eps, delta)-DP for 1-step neighbours (one count changes by 1).
    """

    kind = "bcc"
    __slots__ = ("_cc", "_s", "_y", "delta", "eps", "eta", "label", "sensitivity")

    def __init__(self, eps: float, delta: float, key: NoiseKey, label: str,
                 sensitivity: int = UNIT, base: str = DEFAULT_BASE) -> None:
        self.eps, self.delta = check_eps_delta(eps, delta)
        self.sensitivity = check_positive_int("sensitivity", sensitivity)
        if _check_base(base) == "laplace":
            raise InvalidParameterError("BCC needs a Gaussian base ('blt', 'tree' or 'sqrt')")
        self.eta = bcc_eta(self.eps, self.delta)
        if self.eta <= 0.0:
            raise InvalidParameterError("eps too large for BCC (eta underflows)")
        self.label = label
        self._cc = UnboundedCC(self.eps, self.delta / 2, key, f"{label}/cc", self.sensitivity,
                               base)
        self._s = 0
        self._y = 0

    @property
    def t(self) -> int:
        return self._cc.t

    @property
    def y(self) -> int:
        """The last release (counts)."""
        return self._y

    @property
    def base(self) -> str:
        """The bounded counter inside (as UnboundedCC.base)."""
        return self._cc.base

    def step(self, u: int) -> int:
        """Consume a raw count d >= 0; return the biased estimate of the running total (int)."""
        d = check_units(u)
        yp = self._cc.step(d * self.sensitivity)
        self._s += d
        shift = self._cc.alpha(self.eta, self._cc.t)
        # ceil((y' + shift) / sensitivity) of a float: y' + shift is data-independent noise
        # plus s, so this is post-processing; the max with s keeps it exact on the low side.
        self._y = max(math.ceil((yp + shift) / self.sensitivity), self._s)
        return self._y

    def sigma(self, t: int) -> float:
        """Std of y'_t - s_t of the inner CC, in counts."""
        return self._cc.sigma(t) / self.sensitivity

    def alpha(self, beta: float, t: int) -> float:
        """Lemma 3.13 bound in counts: with probability >= 1 - beta, for all t,
        0 <= y_t - s_t <= alpha(beta, t)."""
        return bcc_alpha(self.eps, self.delta, t, beta, self._cc.base, self.sensitivity)

    def alpha_max(self, beta: float, t: int) -> float:
        """A bound on alpha(beta, l) for every l <= t (counts; see cc_sigma_max)."""
        return bcc_alpha_max(self.eps, self.delta, t, beta, self._cc.base, self.sensitivity)

    def to_state(self) -> dict[str, Any]:
        return {"k": self.kind, "e": self.eps, "d": self.delta, "lab": self.label, "s": self._s,
                "y": self._y, "cc": self._cc.to_state()}

    @classmethod
    def from_state(cls, state: dict[str, Any], key: NoiseKey) -> Self:
        if _get(state, "k", str) != cls.kind:
            raise StateFormatError("not a BCC state")
        cc = UnboundedCC.from_state(_get(state, "cc", dict), key)
        try:
            obj = cls(_get(state, "e", float), _get(state, "d", float), key,
                      _get(state, "lab", str), cc.sensitivity, cc.base)
        except InvalidParameterError as exc:
            raise StateFormatError(f"bad BCC parameters: {exc}") from None
        if cc.label != f"{obj.label}/cc" or cc.eps != obj.eps or cc.delta != obj.delta / 2:
            raise StateFormatError("BCC inner counter does not match")
        s, y = _get(state, "s", int), _get(state, "y", int)
        if s < 0 or y < s:
            raise StateFormatError("BCC state out of range")
        obj._cc, obj._s, obj._y = cc, s, y
        return obj
