"""Bounded-horizon continual counters on the integer grid, and the UnitCounter interface.

A UnitCounter counts non-negative integer grid units (see grid.py). Its `sensitivity`
(in units) is the most one neighbouring stream changes one input; the noise is calibrated
to it. `step(u)` consumes one input and returns the noisy prefix-sum estimate in units.

Every random draw comes from a WordCursor over KeyedStream(key, label); the cursor position
is part of the state, so a restored counter draws exactly what an uninterrupted one would.

- GaussianTree: the binary tree mechanism with discrete Gaussian node noise. O(log horizon)
  state; node noise is drawn once, when the node completes. The production base counter.
- SqrtFactor: the square-root factorisation of the all-ones lower-triangular matrix
  (Lemma A.1 / Henzinger et al.). Its noise B z is a real-valued combination of discrete
  Gaussian draws z (drawn on the unit grid), so its releases are rounded to the nearest
  unit after a float computation: it is NOT the exact-grid production path, it keeps every
  past draw (linear memory), and it exists for bounded runs and experiments.
- tree_reference: a dense recomputation of the tree used by tests to check the fast tree.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import lru_cache
from typing import Any, ClassVar, Self, TypeVar

import numpy as np

from processor.core.calibration import analytic_gaussian_sigma
from processor.core.errors import InvalidInputError, InvalidParameterError, StateFormatError
from processor.core.grid import UNIT
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers.scalar import (
    discrete_gaussian,
    discrete_laplace,
    gaussian_sigma2_units,
    laplace_scale_units,
)

# ---------------------------------------------------------------------------------------------
# Parameter checks and public helper functions (also used by the vectorised simulator)
# ---------------------------------------------------------------------------------------------


def check_eps_delta(eps: object, delta: object, *, delta_used: bool = True) -> tuple[float, float]:
    """Validate (eps, delta): eps finite and > 0; delta in (0, 1) when the mechanism uses it."""
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps):
        raise InvalidParameterError(f"eps must be a finite number, got {eps!r}")
    if eps <= 0:
        raise InvalidParameterError(f"eps must be > 0, got {eps!r}")
    if isinstance(delta, bool) or not isinstance(delta, int | float) or math.isnan(delta):
        raise InvalidParameterError(f"delta must be a number, got {delta!r}")
    if delta_used and not 0 < delta < 1:
        raise InvalidParameterError(f"delta must be in (0, 1), got {delta!r}")
    if not delta_used and not 0 <= delta < 1:
        raise InvalidParameterError(f"delta must be in [0, 1), got {delta!r}")
    return float(eps), float(delta)


def check_positive_int(name: str, v: object) -> int:
    """Validate a positive integer parameter (bool rejected)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidParameterError(f"{name} must be a positive integer, got {v!r}")
    return v


def check_units(u: object) -> int:
    """Validate one UnitCounter input: a non-negative int (bool rejected)."""
    if isinstance(u, bool) or not isinstance(u, int) or u < 0:
        raise InvalidInputError(u, "a unit counter takes a non-negative integer")
    return u


def tail_factor(beta: float, t: int) -> float:
    """sqrt(2 ln(pi^2 t^2 / (3 beta))): the uniform-over-time Gaussian tail factor (Lemma 3.12).

    With failure probability beta_t = 6 beta / (pi^2 t^2) at tick t, a union bound over all
    ticks fails with probability at most beta.
    """
    if not 0 < beta < 1:
        raise InvalidParameterError(f"beta must be in (0, 1), got {beta!r}")
    x = math.pi**2 * t * t / (3.0 * beta)
    if math.isinf(x):
        # A tiny beta (BCC's eta at large eps or tiny delta) overflows the quotient, not
        # the factor: take it in log space. Only where the direct form overflows, so every
        # finite value (and every release BCC shifts by it) stays bit for bit as before.
        return math.sqrt(2.0 * (math.log(math.pi**2 / 3.0) + 2.0 * math.log(t)
                                - math.log(beta)))
    return math.sqrt(2.0 * math.log(x))


@lru_cache(maxsize=4096)
def gaussian_sigma2(eps: float, delta: float, l2_sensitivity: float) -> tuple[int, int]:
    """The discrete Gaussian parameter sigma^2 in units^2 (num, den), rounded up, for an
    (eps, delta) release of an L2-sensitivity `l2_sensitivity` (units) query."""
    return gaussian_sigma2_units(analytic_gaussian_sigma(eps, delta, l2_sensitivity))


def tree_levels(horizon: int) -> int:
    """Number of tree levels that hold a complete node within [1, horizon]: each input is in
    exactly one complete node per level, so this is the L2 sensitivity multiplier squared."""
    return horizon.bit_length()


def tree_node_sigma2(eps: float, delta: float, horizon: int, sensitivity: int) -> tuple[int, int]:
    """Node noise sigma^2 (num, den) in units^2 of a GaussianTree."""
    return gaussian_sigma2(eps, delta, sensitivity * math.sqrt(tree_levels(horizon)))


def tree_sigma(eps: float, delta: float, horizon: int, t: int, sensitivity: int = UNIT) -> float:
    """Exact std (units) of y_t - s_t of GaussianTree(eps, delta, horizon, sensitivity):
    the prefix [1, t] is the sum of popcount(t) independent nodes."""
    t, horizon = int(t), int(horizon)  # numpy integers from the simulator
    if t <= 0:
        return 0.0
    num, den = tree_node_sigma2(eps, delta, horizon, sensitivity)
    return math.sqrt(num / den * t.bit_count())


@lru_cache(maxsize=64)
def _sqrt_coeffs_cached(n: int) -> np.ndarray:
    if n <= 0:
        return np.empty(0, dtype=np.float64)
    j = np.arange(1, n, dtype=np.float64)
    c = np.empty(n, dtype=np.float64)
    c[0] = 1.0
    # c_j = c_{j-1} * (2j - 1) / (2j): the Taylor coefficients of (1 - x)^(-1/2).
    c[1:] = np.cumprod((2.0 * j - 1.0) / (2.0 * j))
    c.setflags(write=False)
    return c


def sqrt_coeffs(n: int) -> np.ndarray:
    """c_0..c_{n-1}, c_j = binom(2j, j) / 4^j (read-only float64 array)."""
    return _sqrt_coeffs_cached(int(n))


@lru_cache(maxsize=64)
def _sqrt_prefix_norm2(n: int) -> np.ndarray:
    """cum[t] = sum_{j<t} c_j^2 for t = 0..n."""
    c = sqrt_coeffs(n)
    out = np.zeros(n + 1, dtype=np.float64)
    out[1:] = np.cumsum(c * c)
    out.setflags(write=False)
    return out


def sqrt_z_sigma2(eps: float, delta: float, horizon: int, sensitivity: int) -> tuple[int, int]:
    """sigma^2 (num, den) in units^2 of each z_i of SqrtFactor:
    (C_{eps,delta} * sensitivity * ||column 1 of B||)^2, rounded up."""
    col = math.sqrt(float(_sqrt_prefix_norm2(horizon)[horizon]))
    return gaussian_sigma2(eps, delta, sensitivity * col)


def sqrt_sigma(eps: float, delta: float, horizon: int, t: int, sensitivity: int = UNIT) -> float:
    """Std (units) of the noise of SqrtFactor at t: sigma_z * sqrt(sum_{j<t} c_j^2).
    (Release rounding to the nearest unit adds at most half a unit, not counted here.)"""
    t, horizon = int(t), int(horizon)
    if t <= 0:
        return 0.0
    num, den = sqrt_z_sigma2(eps, delta, horizon, sensitivity)
    return math.sqrt(num / den * float(_sqrt_prefix_norm2(horizon)[t]))


def dlap_variance(t: int, s: int = 1) -> float:
    """Variance of the discrete Laplace distribution with scale b = t/s on the integers."""
    r = math.exp(-s / t)
    return 2.0 * r / (1.0 - r) ** 2


def laplace_tree_scale(eps: float, horizon: int, sensitivity: int) -> int:
    """Node scale (units, integer, rounded up) of LaplaceTreeBounded: levels * sensitivity / eps
    (L1 sensitivity of the node vector = levels * sensitivity)."""
    return laplace_scale_units(tree_levels(horizon) * sensitivity / (eps * UNIT))


def laplace_tree_sigma(eps: float, horizon: int, t: int, sensitivity: int = UNIT) -> float:
    """Exact std (units) of y_t - s_t of LaplaceTreeBounded."""
    if t <= 0:
        return 0.0
    return math.sqrt(dlap_variance(laplace_tree_scale(eps, horizon, sensitivity)) * t.bit_count())


# ---------------------------------------------------------------------------------------------
# The interface
# ---------------------------------------------------------------------------------------------


class UnitCounter(ABC):
    """A continual counter over non-negative integer units (internal building block).

    `step(u)` returns the noisy prefix-sum estimate in units (an exact int). `sigma(t)` is
    the exact std of y_t - s_t from the construction; `alpha(beta, t)` the bound that holds
    simultaneously for all t with probability >= 1 - beta.
    """

    kind: ClassVar[str]
    sensitivity: int

    @property
    @abstractmethod
    def t(self) -> int:
        """Inputs consumed so far."""

    @abstractmethod
    def step(self, u: int) -> int: ...

    @abstractmethod
    def sigma(self, t: int) -> float: ...

    def alpha(self, beta: float, t: int) -> float:
        """sigma(t) * sqrt(2 ln(pi^2 t^2 / (3 beta))) (the paper, Lemma 3.12)."""
        if t <= 0:
            return 0.0
        return self.sigma(t) * tail_factor(beta, t)

    @abstractmethod
    def to_state(self) -> dict[str, Any]: ...

    @classmethod
    @abstractmethod
    def from_state(cls, state: dict[str, Any], key: NoiseKey) -> Self: ...


def state_field(state: dict[str, Any], name: str, typ: type | tuple[type, ...]) -> Any:
    """Read one typed field of a state dict or raise StateFormatError."""
    if not isinstance(state, dict) or name not in state:
        raise StateFormatError(f"state lacks field {name!r}")
    v = state[name]
    if (isinstance(v, bool) and typ is not bool) or not isinstance(v, typ):
        raise StateFormatError(f"state field {name!r} has the wrong type")
    return v


_get = state_field  # the short local name the from_state methods read best with

T = TypeVar("T")


def from_parameters(make: Callable[[float, float, int, NoiseKey, str, int], T],
                    state: dict[str, Any], key: NoiseKey, what: str) -> T:
    """A horizon counter (eps, delta, horizon, key, label, sensitivity) rebuilt from its
    state's parameters ("e", "d", "n", "lab", "sen"); StateFormatError naming `what` when
    its constructor refuses them."""
    try:
        return make(_get(state, "e", float), _get(state, "d", float), _get(state, "n", int),
                    key, _get(state, "lab", str), _get(state, "sen", int))
    except InvalidParameterError as exc:
        raise StateFormatError(f"bad {what} parameters: {exc}") from None


# ---------------------------------------------------------------------------------------------
# Binary trees (Gaussian and Laplace node noise)
# ---------------------------------------------------------------------------------------------


class _BinaryTree(UnitCounter):
    """Binary tree over [1, horizon] with O(log horizon) state.

    The dyadic decomposition of [1, t] uses, for every set bit h of t, the complete node of
    size 2^h ending at t with its low h bits cleared: that is the most recently completed
    node of level h. So keeping the noise of the latest completed node per level is enough,
    and y_t = s_t + sum over set bits h of t of noise[h].

    A node of level h ending at j 2^h is used by some prefix only if j is odd (a "left"
    node); for even j no prefix ever reads it. Its noise is therefore never drawn: at tick
    t exactly one node is drawn, the one of level v2(t) (the lowest set bit of t). Nodes
    that are never released cost no privacy, and every released node is drawn once, when
    it completes (the dense reference draws in the same order).
    """

    __slots__ = ("_cur", "_noise", "_s", "_t", "eps", "horizon", "label", "sensitivity")

    def __init__(self, eps: float, horizon: int, key: NoiseKey, label: str,
                 sensitivity: int) -> None:
        self.horizon = check_positive_int("horizon", horizon)
        self.sensitivity = check_positive_int("sensitivity", sensitivity)
        self.eps = eps
        self.label = label
        self._cur = WordCursor(KeyedStream(key, label))
        self._noise = [0] * tree_levels(horizon)
        self._s = 0
        self._t = 0

    @property
    def t(self) -> int:
        return self._t

    @abstractmethod
    def _draw(self) -> int:
        """One node's noise in units."""

    def step(self, u: int) -> int:
        """Consume u units; return s_t + the noise of the dyadic nodes covering [1, t]."""
        u = check_units(u)
        if self._t >= self.horizon:
            raise InvalidInputError(u, "bounded counter horizon exhausted")
        self._t += 1
        self._s += u
        t = self._t
        # The one node needed from this tick on: level v2(t), ending at t.
        self._noise[(t & -t).bit_length() - 1] = self._draw()
        noise = 0
        h = 0
        rest = t
        while rest:
            if rest & 1:
                noise += self._noise[h]
            rest >>= 1
            h += 1
        return self._s + noise

    def _base_state(self) -> dict[str, Any]:
        return {"n": self.horizon, "sen": self.sensitivity, "lab": self.label, "t": self._t,
                "s": self._s, "p": self._cur.position, "z": list(self._noise)}

    def _restore_base(self, state: dict[str, Any]) -> None:
        t = _get(state, "t", int)
        s = _get(state, "s", int)
        p = _get(state, "p", int)
        z = _get(state, "z", list)
        if not 0 <= t <= self.horizon or s < 0 or p < 0 or len(z) != len(self._noise):
            raise StateFormatError("tree state out of range")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in z):
            raise StateFormatError("tree noise must be integers")
        self._t, self._s, self._cur.position, self._noise = t, s, p, list(z)


class GaussianTree(_BinaryTree):
    """Binary tree mechanism with discrete Gaussian node noise, horizon `horizon`.

    Each input lies in one complete node per level (`levels` = horizon.bit_length()), so
    the node vector has L2 sensitivity sensitivity * sqrt(levels); every node gets discrete
    Gaussian noise with sigma = analytic_gaussian_sigma(eps, delta, that sensitivity),
    sigma^2 rounded up on the unit grid. (eps, delta)-DP for 1-step neighbours.
    """

    kind = "gtree"
    __slots__ = ("_s2", "delta")

    def __init__(self, eps: float, delta: float, horizon: int, key: NoiseKey, label: str,
                 sensitivity: int = UNIT) -> None:
        eps, delta = check_eps_delta(eps, delta)
        super().__init__(eps, horizon, key, label, sensitivity)
        self.delta = delta
        self._s2 = tree_node_sigma2(eps, delta, self.horizon, self.sensitivity)

    def _draw(self) -> int:
        return discrete_gaussian(self._cur, self._s2[0], self._s2[1])

    def sigma(self, t: int) -> float:
        return tree_sigma(self.eps, self.delta, self.horizon, t, self.sensitivity)

    def to_state(self) -> dict[str, Any]:
        d = self._base_state()
        d.update(k=self.kind, e=self.eps, d=self.delta)
        return d

    @classmethod
    def from_state(cls, state: dict[str, Any], key: NoiseKey) -> Self:
        if _get(state, "k", str) != cls.kind:
            raise StateFormatError("not a GaussianTree state")
        obj = from_parameters(cls, state, key, "GaussianTree")
        obj._restore_base(state)
        return obj


class LaplaceTreeBounded(_BinaryTree):
    """Binary tree mechanism with discrete Laplace node noise (pure eps-DP, the tutorial's
    construction): node scale levels * sensitivity / eps in units, rounded up."""

    kind = "ltree"
    __slots__ = ("_scale",)

    def __init__(self, eps: float, horizon: int, key: NoiseKey, label: str,
                 sensitivity: int = UNIT) -> None:
        eps, _ = check_eps_delta(eps, 0.0, delta_used=False)
        super().__init__(eps, horizon, key, label, sensitivity)
        self._scale = laplace_tree_scale(eps, self.horizon, self.sensitivity)

    def _draw(self) -> int:
        return discrete_laplace(self._cur, self._scale)

    def sigma(self, t: int) -> float:
        return laplace_tree_sigma(self.eps, self.horizon, t, self.sensitivity)

    def to_state(self) -> dict[str, Any]:
        d = self._base_state()
        d.update(k=self.kind, e=self.eps)
        return d

    @classmethod
    def from_state(cls, state: dict[str, Any], key: NoiseKey) -> Self:
        if _get(state, "k", str) != cls.kind:
            raise StateFormatError("not a LaplaceTreeBounded state")
        try:
            obj = cls(_get(state, "e", float), _get(state, "n", int), key, _get(state, "lab", str),
                      _get(state, "sen", int))
        except InvalidParameterError as exc:
            raise StateFormatError(f"bad LaplaceTreeBounded parameters: {exc}") from None
        obj._restore_base(state)
        return obj


def tree_reference(tree: _BinaryTree, key: NoiseKey, inputs: list[int]) -> list[int]:
    """Dense reference for a fresh tree's outputs on `inputs` (tests only).

    Builds every complete left node [a, b] of the tree (size 2^h, ending at j 2^h with j
    odd; right nodes are never read by any prefix) with its exact sum plus its noise, drawn
    in the order nodes complete, then releases each prefix as the sum of the noisy nodes of
    its dyadic decomposition. Uses the same key, label and parameters as `tree`, which must
    be fresh (t == 0).
    """
    if tree.t != 0:
        raise ValueError("reference needs a fresh tree")
    twin = type(tree).from_state(tree.to_state(), key)
    noisy: dict[tuple[int, int], int] = {}
    for end in range(1, len(inputs) + 1):
        size = 1
        while end % size == 0:
            if (end // size) % 2 == 1:
                start = end - size + 1
                noisy[(start, end)] = sum(inputs[start - 1 : end]) + twin._draw()
            size *= 2
    out = []
    for t in range(1, len(inputs) + 1):
        total, cursor = 0, t
        while cursor:
            width = cursor & -cursor
            total += noisy[(cursor - width + 1, cursor)]
            cursor -= width
        out.append(total)
    return out


# ---------------------------------------------------------------------------------------------
# Square-root factorisation (dense; experiments)
# ---------------------------------------------------------------------------------------------


class SqrtFactor(UnitCounter):
    """Square-root factorisation counter of horizon n: release s_t + sum_{j<t} c_j z_{t-j}.

    z_i are discrete Gaussian on the unit grid with sigma = C_{eps,delta} * sensitivity *
    ||column 1 of B|| (sigma^2 rounded up). The noise B z is a real number: the release is
    rounded to the nearest unit (post-processing). Float arithmetic, so this is not the
    exact-grid production path; it keeps every z (linear memory and state) and costs O(t)
    per step. For bounded runs and experiments only.
    """

    kind = "sqrt"
    __slots__ = ("_cur", "_s", "_s2", "_z", "delta", "eps", "horizon", "label", "sensitivity")

    def __init__(self, eps: float, delta: float, horizon: int, key: NoiseKey, label: str,
                 sensitivity: int = UNIT) -> None:
        self.eps, self.delta = check_eps_delta(eps, delta)
        self.horizon = check_positive_int("horizon", horizon)
        self.sensitivity = check_positive_int("sensitivity", sensitivity)
        self.label = label
        self._cur = WordCursor(KeyedStream(key, label))
        self._s2 = sqrt_z_sigma2(self.eps, self.delta, self.horizon, self.sensitivity)
        self._z = np.zeros(self.horizon, dtype=np.float64)  # z_i at index i - 1
        self._s = 0
        self._t = 0

    @property
    def t(self) -> int:
        return self._t

    def noise(self) -> float:
        """The real-valued noise sum_{j<t} c_j z_{t-j} at the current t."""
        t = self._t
        if t == 0:
            return 0.0
        c = sqrt_coeffs(self.horizon)[:t]
        # Elementwise product then numpy's pairwise sum: a fixed summation order, so a
        # restored counter reproduces the same float.
        return float((c * self._z[t - 1 :: -1]).sum()) if t > 1 else float(self._z[0])

    def step(self, u: int) -> int:
        u = check_units(u)
        if self._t >= self.horizon:
            raise InvalidInputError(u, "bounded counter horizon exhausted")
        z = discrete_gaussian(self._cur, self._s2[0], self._s2[1])
        self._z[self._t] = float(z)
        self._t += 1
        self._s += u
        return self._s + round(self.noise())

    def sigma(self, t: int) -> float:
        return sqrt_sigma(self.eps, self.delta, self.horizon, t, self.sensitivity)

    def to_state(self) -> dict[str, Any]:
        return {"k": self.kind, "e": self.eps, "d": self.delta, "n": self.horizon,
                "sen": self.sensitivity, "lab": self.label, "t": self._t, "s": self._s,
                "p": self._cur.position, "z": [int(v) for v in self._z[: self._t]]}

    @classmethod
    def from_state(cls, state: dict[str, Any], key: NoiseKey) -> Self:
        if _get(state, "k", str) != cls.kind:
            raise StateFormatError("not a SqrtFactor state")
        obj = from_parameters(cls, state, key, "SqrtFactor")
        t, s, p = _get(state, "t", int), _get(state, "s", int), _get(state, "p", int)
        z = _get(state, "z", list)
        if not 0 <= t <= obj.horizon or len(z) != t or s < 0 or p < 0:
            raise StateFormatError("SqrtFactor state out of range")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in z):
            raise StateFormatError("SqrtFactor noise must be integers")
        obj._t, obj._s, obj._cur.position = t, s, p
        obj._z[:t] = np.asarray(z, dtype=np.float64)
        return obj


BOUNDED_KINDS: dict[str, type[UnitCounter]] = {
    GaussianTree.kind: GaussianTree,
    LaplaceTreeBounded.kind: LaplaceTreeBounded,
    SqrtFactor.kind: SqrtFactor,
}
