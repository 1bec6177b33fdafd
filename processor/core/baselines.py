"""The baseline counters of Section 8, as public Counters (processor/core/api.py).

- BaseCC ("basecc"): the unbounded CC of Lemma 3.12 on [0, 1] inputs. Private for 1-step
  (swap) neighbours only, not for the queue shift.
- PartitionCC ("partitioncc"): Dwork, Naor, Reingold, Rothblum 2015, Theorem 3.1, as the
  paper's Section 8 runs it (see `partitioncc_parameters` for our reading). Swap only.
- GaussianCC ("gaussiancc"): Algorithm 6: a fresh Gaussian release of s_t at every tick,
  composed with Gaussian DP. Private for edit neighbours; error grows like sqrt(t) ln t.
- LaplaceTree ("tree"): the binary tree mechanism with Laplace noise (pure eps-DP) made
  unbounded by the doubling trick (see `LaplaceTree`). Swap only.

All noise is discrete (Gaussian or Laplace) on the 2^-16 grid, drawn from the keyed
generator at positions kept in the state, so every release is an exact multiple of 2^-16.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from processor.core import state as state_codec
from processor.core.api import Counter
from processor.core.bounded import (
    check_eps_delta,
    check_positive_int,
    dlap_variance,
    laplace_tree_scale,
)
from processor.core.bounded import (
    state_field as _get,
)
from processor.core.calibration import gdp_mu
from processor.core.cc import UnboundedCC, cc_sigma, psum_laplace_scale
from processor.core.errors import InvalidParameterError, StateFormatError, state_error_detail
from processor.core.grid import UNIT, check_units, to_units
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers.scalar import (
    discrete_gaussian,
    discrete_laplace,
    gaussian_sigma2_units,
)
from processor.core.samplers.scalar import laplace_scale_units as _lap_units

STATE_VERSION = 1


def gauss_tail(sigma: float, beta: float) -> float:
    """sigma * sqrt(2 ln(2 / beta)): Pr[|N(0, sigma^2)| >= this] <= beta (one tick).
    Also valid for the discrete Gaussian, whose tails are no heavier at the same sigma."""
    if not 0 < beta < 1:
        raise InvalidParameterError(f"beta must be in (0, 1), got {beta!r}")
    return sigma * math.sqrt(2.0 * math.log(2.0 / beta))


def _check_id(counter_id: object) -> str:
    if not isinstance(counter_id, str):
        raise InvalidParameterError("counter_id must be a string")
    return counter_id


class _GridCounter(Counter):
    """Shared plumbing: parameters, y in units, versioned state via state.pack/unpack.

    Subclasses implement `_step(u) -> int` (units), `_payload()` and `_load(payload, key)`.
    """

    _y: int
    _t: int

    @property
    def t(self) -> int:
        return self._t

    @property
    def y(self) -> float:
        return self._y / UNIT

    def update(self, x: float | None) -> float:
        """Validate x (InvalidInputError, nothing changes), then release y_t."""
        return self.update_units(to_units(x))

    def update_units(self, u: int) -> float:
        self._y = self._step(check_units(u))
        self._t += 1
        return self._y / UNIT

    @abstractmethod
    def _step(self, u: int) -> int: ...

    @abstractmethod
    def _payload(self) -> dict[str, Any]: ...

    @classmethod
    @abstractmethod
    def _load(cls, p: dict[str, Any], key: NoiseKey) -> Self: ...

    def to_bytes(self) -> bytes:
        p = self._payload()
        p.update(e=self.eps, d=self.delta, id=self.counter_id, t=self._t, y=self._y)
        return state_codec.pack(self.mechanism, STATE_VERSION, p)

    @classmethod
    def from_bytes(cls, data: bytes, key: NoiseKey) -> Self:
        p = state_codec.unpack(data, cls.mechanism, STATE_VERSION)
        try:
            obj = cls._load(p, key)
            t, y = _get(p, "t", int), _get(p, "y", int)
        except StateFormatError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise StateFormatError(
                f"{cls.mechanism} state is invalid: {state_error_detail(exc)}") from None
        if t < 0:
            raise StateFormatError("negative tick in state")
        obj._t, obj._y = t, y
        return obj


# ---------------------------------------------------------------------------------------------
# BaseCC
# ---------------------------------------------------------------------------------------------


class BaseCC(_GridCounter):
    """The unbounded CC of Lemma 3.12 on [0, 1] inputs (swap neighbours only).

    params: base="tree" (GaussianTree inside each interval, O(log t) state, default) or
    "sqrt" (square-root factorisation, linear state, float noise rounded to the grid).
    """

    mechanism: ClassVar[str] = "basecc"
    edit_private: ClassVar[bool] = False

    def __init__(self, eps: float, delta: float, key: NoiseKey, counter_id: str = "",
                 base: str = "tree") -> None:
        self.eps, self.delta = check_eps_delta(eps, delta)
        self.counter_id = _check_id(counter_id)
        if base not in ("tree", "sqrt"):
            raise InvalidParameterError(f"basecc base must be 'tree' or 'sqrt', got {base!r}")
        self._cc = UnboundedCC(self.eps, self.delta, key, f"{counter_id}/basecc", UNIT, base)
        self._t = 0
        self._y = 0

    def _step(self, u: int) -> int:
        return self._cc.step(u)

    def error_bound(self, beta: float = 0.05) -> float:
        """Per-tick Gaussian tail of sigma_t (plus half a unit of rounding for base sqrt)."""
        slack = 0.5 if self._cc.base == "sqrt" and self._t > 0 else 0.0
        return (gauss_tail(self._cc.sigma(self._t), beta) + slack) / UNIT

    def _payload(self) -> dict[str, Any]:
        return {"cc": self._cc.to_state()}

    @classmethod
    def _load(cls, p: dict[str, Any], key: NoiseKey) -> Self:
        cc = UnboundedCC.from_state(_get(p, "cc", dict), key)
        obj = cls(_get(p, "e", float), _get(p, "d", float), key, _get(p, "id", str), cc.base)
        if cc.label != obj._cc.label or cc.eps != obj.eps or cc.delta != obj.delta:
            raise StateFormatError("basecc inner counter does not match")
        if cc.t != _get(p, "t", int):
            raise StateFormatError("basecc tick mismatch")
        obj._cc = cc
        return obj


# ---------------------------------------------------------------------------------------------
# LaplaceTree
# ---------------------------------------------------------------------------------------------


class LaplaceTree(_GridCounter):
    """The binary tree mechanism with (discrete) Laplace noise, pure eps-DP, unbounded.

    Reading of "unbounded by growing the tree": the tree grows one dyadic block at a time.
    Ticks are split into I_k = [2^{k-1}, 2^k - 1]; the sum of each completed block is
    released once with DLap(2/eps) (the top of the tree, eps/2 in total since blocks are
    disjoint), and inside the running block a fresh bounded Laplace tree (tutorial
    construction, node scale levels / (eps/2)) counts that block (eps/2). Each input touches
    one block sum and one bounded tree: eps-DP for swap neighbours. `delta` is accepted
    for the common constructor and ignored (recorded as given).
    """

    mechanism: ClassVar[str] = "tree"
    edit_private: ClassVar[bool] = False

    def __init__(self, eps: float, delta: float, key: NoiseKey, counter_id: str = "") -> None:
        self.eps, self.delta = check_eps_delta(eps, delta, delta_used=False)
        self.counter_id = _check_id(counter_id)
        self._cc = UnboundedCC(self.eps, 0.0, key, f"{counter_id}/ltree", UNIT, "laplace")
        self._t = 0
        self._y = 0

    def _step(self, u: int) -> int:
        return self._cc.step(u)

    def error_bound(self, beta: float = 0.05) -> float:
        """Union bound over the m discrete Laplace terms in y_t - s_t: each |Y_i| with scale
        b_i exceeds b_i ln(2m/beta) with probability <= beta/m."""
        t = self._t
        if t == 0:
            return 0.0
        k_done = (t + 1).bit_length() - 1
        scales = [psum_laplace_scale(self.eps, UNIT)] * k_done
        start = 1 << k_done
        if t != start - 1:
            node = laplace_tree_scale(self.eps / 2, start - 1, UNIT)
            scales += [node] * (t - start + 1).bit_count()
        m = len(scales)
        return sum(scales) * math.log(2.0 * m / beta) / UNIT

    def sigma_units(self, t: int) -> float:
        """Exact std of y_t - s_t in units."""
        return self._cc.sigma(t)

    def _payload(self) -> dict[str, Any]:
        return {"cc": self._cc.to_state()}

    @classmethod
    def _load(cls, p: dict[str, Any], key: NoiseKey) -> Self:
        cc = UnboundedCC.from_state(_get(p, "cc", dict), key)
        obj = cls(_get(p, "e", float), _get(p, "d", float), key, _get(p, "id", str))
        if cc.label != obj._cc.label or cc.eps != obj.eps or cc.base != "laplace":
            raise StateFormatError("tree inner counter does not match")
        if cc.t != _get(p, "t", int):
            raise StateFormatError("tree tick mismatch")
        obj._cc = cc
        return obj


# ---------------------------------------------------------------------------------------------
# GaussianCC (Algorithm 6)
# ---------------------------------------------------------------------------------------------


def gaussiancc_a(t: int) -> float:
    """a_t = 1 / (1.85 sqrt(t) ln(t + 1)): square-summable with sum a_t^2 <= 1."""
    return 1.0 / (1.85 * math.sqrt(t) * math.log(t + 1))


def gaussiancc_sigma2_units(eps: float, delta: float, t: int) -> tuple[int, int]:
    """sigma_t^2 = 1 / (mu a_t)^2 in units^2, rounded up to a rational (num, den)."""
    mu = _gdp_mu_cached(eps, delta)
    return gaussian_sigma2_units(UNIT / (mu * gaussiancc_a(t)))


def gaussiancc_sigma(eps: float, delta: float, t: int) -> float:
    """Std of y_t - s_t of GaussianCC, in events (from the rounded-up grid sigma^2)."""
    t = int(t)
    if t <= 0:
        return 0.0
    num, den = gaussiancc_sigma2_units(eps, delta, t)
    return math.sqrt(num / den) / UNIT


_MU_CACHE: dict[tuple[float, float], float] = {}


def _gdp_mu_cached(eps: float, delta: float) -> float:
    k = (eps, delta)
    if k not in _MU_CACHE:
        _MU_CACHE[k] = float(gdp_mu(eps, delta))
    return _MU_CACHE[k]


class GaussianCC(_GridCounter):
    """Algorithm 6: at tick t release s_t + N(0, 1/(mu a_t)^2) (discrete Gaussian in units).

    mu = gdp_mu(eps, delta). Each prefix sum has sensitivity 1 under edit neighbours, the
    release at t is (mu a_t)-GDP, and sum a_t^2 <= 1 makes the whole stream mu-GDP, hence
    (eps, delta)-DP. Private for edit neighbours.
    """

    mechanism: ClassVar[str] = "gaussiancc"
    edit_private: ClassVar[bool] = True

    def __init__(self, eps: float, delta: float, key: NoiseKey, counter_id: str = "") -> None:
        self.eps, self.delta = check_eps_delta(eps, delta)
        self.counter_id = _check_id(counter_id)
        self.mu = _gdp_mu_cached(self.eps, self.delta)
        self._cur = WordCursor(KeyedStream(key, f"{counter_id}/gaussiancc"))
        self._s = 0
        self._t = 0
        self._y = 0

    def _step(self, u: int) -> int:
        num, den = gaussiancc_sigma2_units(self.eps, self.delta, self._t + 1)
        self._s += u
        return self._s + discrete_gaussian(self._cur, num, den)

    def error_bound(self, beta: float = 0.05) -> float:
        return gauss_tail(gaussiancc_sigma(self.eps, self.delta, self._t), beta)

    def _payload(self) -> dict[str, Any]:
        return {"s": self._s, "p": self._cur.position}

    @classmethod
    def _load(cls, p: dict[str, Any], key: NoiseKey) -> Self:
        obj = cls(_get(p, "e", float), _get(p, "d", float), key, _get(p, "id", str))
        s, pos = _get(p, "s", int), _get(p, "p", int)
        if s < 0 or pos < 0:
            raise StateFormatError("gaussiancc state out of range")
        obj._s, obj._cur.position = s, pos
        return obj


# ---------------------------------------------------------------------------------------------
# PartitionCC (DNRR 2015, Theorem 3.1)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionCCParams:
    """Constants of PartitionCC for (eps, delta, horizon T).

    eps_svt: budget of the partition (AboveThreshold restarted after every block);
    tau: the block threshold in events; svt_rho_scale / svt_nu_scale: Laplace scales of
    the threshold noise and the per-tick noise (events); cc_eps, cc_delta: the BaseCC run
    on the block sums.
    """

    eps_svt: float
    tau: float
    svt_rho_scale: float
    svt_nu_scale: float
    cc_eps: float
    cc_delta: float
    horizon: int


#: Failure probability the threshold is set for: with probability 1 - PARTITION_BETA
#: no SVT noise over the T ticks exceeds alpha_SVT, so every block holds between 0 and
#: 2 tau + 1 events.
PARTITION_BETA = 0.05


def svt_alpha(eps_svt: float, n: int, beta: float) -> float:
    """AboveThreshold accuracy over n queries (Dwork-Roth Thm 3.24 with Lap(2/e), Lap(4/e)):
    8 (ln n + ln(2/beta)) / eps."""
    return 8.0 * math.log(2.0 * max(n, 1) / beta) / eps_svt


def partitioncc_parameters(eps: float, delta: float, horizon: int) -> PartitionCCParams:
    """Our reading of DNRR 2015 Theorem 3.1 as run in Section 8 (horizon T known).

    Half of eps runs the private partition: an AboveThreshold instance (threshold noise
    Lap(2/eps_svt), per-tick noise Lap(4/eps_svt)) compares the running block sum with tau
    and, on firing, closes the block and restarts with fresh threshold noise. A 1-step change
    lies in exactly one block; before it nothing differs and after that block closes the
    restarted instances see identical inputs, so the partition costs eps_svt. tau =
    alpha_SVT(T, 0.05) = 8 ln(2T / 0.05) / eps_svt, so blocks carry Theta(log T / eps)
    events. The other half (and all of delta) runs BaseCC on the block sums: one changed
    input changes one block sum by at most 1. Output changes only when a block closes.
    """
    eps, delta = check_eps_delta(eps, delta)
    horizon = check_positive_int("horizon", horizon)
    e_svt = eps / 2.0
    return PartitionCCParams(
        eps_svt=e_svt,
        tau=svt_alpha(e_svt, horizon, PARTITION_BETA),
        svt_rho_scale=2.0 / e_svt,
        svt_nu_scale=4.0 / e_svt,
        cc_eps=eps / 2.0,
        cc_delta=delta,
        horizon=horizon,
    )


class PartitionCC(_GridCounter):
    """DNRR 2015 Theorem 3.1 (see `partitioncc_parameters`); params: horizon (T), base.

    Swap neighbours only. Beyond the horizon it stays private; only its accuracy bound
    degrades (we use max(t, T) in the bound).
    """

    mechanism: ClassVar[str] = "partitioncc"
    edit_private: ClassVar[bool] = False

    DEFAULT_HORIZON = 10_000

    def __init__(self, eps: float, delta: float, key: NoiseKey, counter_id: str = "",
                 horizon: int = DEFAULT_HORIZON, base: str = "tree") -> None:
        self.eps, self.delta = check_eps_delta(eps, delta)
        self.counter_id = _check_id(counter_id)
        if base not in ("tree", "sqrt"):
            raise InvalidParameterError(f"partitioncc base must be 'tree' or 'sqrt', got {base!r}")
        self.params = partitioncc_parameters(self.eps, self.delta, horizon)
        self._tau_u = math.ceil(self.params.tau * UNIT)
        self._rho_t = _lap_units(self.params.svt_rho_scale)
        self._nu_t = _lap_units(self.params.svt_nu_scale)
        self._cur = WordCursor(KeyedStream(key, f"{counter_id}/partitioncc/svt"))
        self._cc = UnboundedCC(self.params.cc_eps, self.params.cc_delta, key,
                               f"{counter_id}/partitioncc/cc", UNIT, base)
        self._isum = 0
        self._rho: int | None = None   # threshold noise of the running block, drawn lazily
        self._t = 0
        self._y = 0

    @property
    def blocks(self) -> int:
        """Blocks closed so far (public: the output changes exactly then)."""
        return self._cc.t

    def _step(self, u: int) -> int:
        if self._rho is None:
            self._rho = discrete_laplace(self._cur, self._rho_t)
        self._isum += u
        nu = discrete_laplace(self._cur, self._nu_t)
        if self._isum + nu > self._tau_u + self._rho:
            y = self._cc.step(self._isum)
            self._isum = 0
            self._rho = None
            return y
        return self._y

    def error_bound(self, beta: float = 0.05) -> float:
        """|y_t - s_t| <= (events of the open block) + (BaseCC error at the last block):
        tau + alpha_SVT(max(t, T), beta/2) + 1, plus the per-tick Gaussian tail of the block
        counter with beta/2."""
        if self._t == 0:
            return 0.0
        n = max(self._t, self.params.horizon)
        open_block = self.params.tau + svt_alpha(self.params.eps_svt, n, beta / 2) + 1.0
        return open_block + gauss_tail(self._cc.sigma(self._cc.t), beta / 2) / UNIT

    def _payload(self) -> dict[str, Any]:
        return {"T": self.params.horizon, "b": self._cc.base, "is": self._isum,
                "rho": self._rho, "p": self._cur.position, "cc": self._cc.to_state()}

    @classmethod
    def _load(cls, p: dict[str, Any], key: NoiseKey) -> Self:
        obj = cls(_get(p, "e", float), _get(p, "d", float), key, _get(p, "id", str),
                  _get(p, "T", int), _get(p, "b", str))
        cc = UnboundedCC.from_state(_get(p, "cc", dict), key)
        if cc.label != obj._cc.label or cc.eps != obj._cc.eps or cc.delta != obj._cc.delta:
            raise StateFormatError("partitioncc inner counter does not match")
        isum, pos = _get(p, "is", int), _get(p, "p", int)
        rho = p.get("rho")
        if isum < 0 or pos < 0 or not (rho is None or (isinstance(rho, int)
                                                       and not isinstance(rho, bool))):
            raise StateFormatError("partitioncc state out of range")
        obj._cc, obj._isum, obj._rho, obj._cur.position = cc, isum, rho, pos
        return obj


def laplace_tree_sigma_units(eps: float, t: int) -> float:
    """Exact std (units) of y_t - s_t of LaplaceTree(eps) (for the simulator)."""
    return cc_sigma(eps, 0.0, t, "laplace", UNIT)


__all__ = [
    "PARTITION_BETA",
    "BaseCC",
    "GaussianCC",
    "LaplaceTree",
    "PartitionCC",
    "PartitionCCParams",
    "dlap_variance",
    "gauss_tail",
    "gaussiancc_a",
    "gaussiancc_sigma",
    "gaussiancc_sigma2_units",
    "laplace_tree_sigma_units",
    "partitioncc_parameters",
    "svt_alpha",
]
