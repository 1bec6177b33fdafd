"""Every constant the simulator uses, taken from the step-wise core.

The vectorised simulator must draw from exactly the distributions of the step-wise core
(processor/core), so it never restates a constant or a calibration: it asks the core's
pure functions (calibration.py, cc.py, baselines.py, ecc.py, svt.py, partition.py).
This module is the one place where those imports happen, so the simulator and the
experiments built on it (processor/experiments) read like the paper and a change in the
core reaches them automatically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from processor.core import baselines as _bl
from processor.core import blt as _blt
from processor.core import bounded as _bd
from processor.core import cc as _cc
from processor.core import params as _params
from processor.core import partition as _part
from processor.core import svt as _svt
from processor.core.grid import UNIT
from processor.core.samplers.scalar import laplace_scale_units

#: the bounded counter inside CC: the square-root factorization, as in the paper's
#: experiments ("blt", the stream's default base, and "tree", the default before it, are
#: also simulated)
BASE = "sqrt"
BASES = ("sqrt", "tree", "blt")

FloatArray = npt.NDArray[np.float64]


@lru_cache(maxsize=256)
def gaussian_constant(eps: float, delta: float) -> float:
    """C_{eps,delta} (sensitivity 1) as the core uses it: sigma^2 rounded up in units^2."""
    num, den = _bd.gaussian_sigma2(eps, delta, float(UNIT))
    return math.sqrt(num / den) / UNIT


@lru_cache(maxsize=256)
def sqrt_z_sigma(eps: float, delta: float, horizon: int) -> float:
    """sigma of the z's of the (eps, delta) square-root counter of this horizon (sens. 1)."""
    num, den = _bd.sqrt_z_sigma2(eps, delta, horizon, UNIT)
    return math.sqrt(num / den) / UNIT


def sqrt_coeffs(n: int) -> FloatArray:
    """c_j = binom(2j, j) / 4^j for j < n (the square-root factorization's Toeplitz column)."""
    return np.asarray(_bd.sqrt_coeffs(n), dtype=np.float64)


@lru_cache(maxsize=256)
def blt_z_sigma(eps: float, delta: float, horizon: int) -> float:
    """sigma of the Gaussians G_t of the (eps, delta) BLT counter of this horizon, in
    events (blt.blt_scale, in 2^-FRAC_BITS units, rounded up)."""
    return _blt.blt_scale(eps, delta, horizon, UNIT) / float(1 << _blt.FRAC_BITS) / UNIT


def blt_coeffs(n: int) -> FloatArray:
    """b_0..b_{n-1}: the BLT decoder's impulse response (its noise is sum_j b_j G_{t-j})."""
    return np.asarray(_blt.blt_decoder_coeffs(n), dtype=np.float64)


@lru_cache(maxsize=256)
def tree_node_sigma(eps: float, delta: float, horizon: int) -> float:
    """Node noise sigma of the (eps, delta) Gaussian tree of this horizon (sensitivity 1)."""
    num, den = _bd.tree_node_sigma2(eps, delta, horizon, UNIT)
    return math.sqrt(num / den) / UNIT


def cc_sigma(eps: float, delta: float, t: int, base: str = BASE) -> float:
    """Std of y_t - s_t of the unbounded CC with (eps, delta) and this base, sensitivity 1."""
    return float(_cc.cc_sigma(eps, delta, t, base, UNIT)) / UNIT


@lru_cache(maxsize=64)
def bcc_shift_table(eps: float, delta: float, n: int, base: str = BASE) -> FloatArray:
    """The shift BCC with (eps, delta) adds before rounding up at its l-th step,
    cc.bcc_offset(eps, delta, l) in counts, for l = 1..n (index l - 1)."""
    return np.array([_cc.bcc_offset(eps, delta, i, base, UNIT) / UNIT for i in range(1, n + 1)],
                    dtype=np.float64)


def gaussiancc_sigmas(eps: float, delta: float, horizon: int) -> FloatArray:
    """Per-tick noise std of GaussianCC (Algorithm 6) for t = 1..horizon."""
    return np.array(
        [_bl.gaussiancc_sigma(eps, delta, t) for t in range(1, horizon + 1)], dtype=np.float64
    )


@dataclass(frozen=True)
class SvtPlan:
    """The sequential partition of ECC (Part) or PartitionCC, as plain numbers.

    SVT instance l (1, 2, ...) starts right after checkpoint l-1 with a noisy threshold
    base_l + Z0, Z0 ~ Lap(2/eps_svt), where base_l = tau_l; at its k-th step (k = 1, 2, ...)
    it compares intsum + Z_k, Z_k ~ Lap(4/eps_svt), against base_l + growth[k-1] + Z0.
    """

    eps_svt: float
    tau: float
    #: Laplace scales of Z0 and of the per-tick Z_k (events; the core's rounded-up scales)
    scale0: float
    scale: float
    #: tau_l for l = 1..max_instances (index l - 1)
    tau_l: FloatArray
    #: the local-step part of the threshold for k = 1..horizon (index k - 1)
    growth: FloatArray


@lru_cache(maxsize=8)
def part_plan(eps: float, delta: float, horizon: int, max_instances: int,
              calibration: str = "paper") -> SvtPlan:
    """ECC's Part: SVT_l with (eps_p, part_tau(tau, l, eps_p)), threshold growth of svt.py."""
    p = _params.ecc_parameters(eps, delta, calibration)
    eps_p = float(p.eps_part)
    tau = float(p.tau)
    tau_l = np.array([_part.part_tau(tau, l, eps_p) for l in range(1, max_instances + 1)])  # noqa: E741
    # svt_threshold(eps, tau_l, k) = tau_l + g(k): evaluate once with tau = 0 to get g.
    growth = np.array([_svt.svt_threshold(eps_p, 0.0, k) for k in range(1, horizon + 1)])
    b0, b = svt_scales(eps_p)
    return SvtPlan(eps_p, tau, b0, b, tau_l.astype(np.float64), growth.astype(np.float64))


@lru_cache(maxsize=8)
def partitioncc_plan(eps: float, delta: float, horizon: int, max_instances: int) -> SvtPlan:
    """PartitionCC's partition, from baselines.partitioncc_parameters (engineer H3)."""
    p = _bl.partitioncc_parameters(eps, delta, horizon)
    # DNRR15's partition is a plain AboveThreshold restarted after each block: the same
    # threshold for every instance and every step (baselines.PartitionCC._step).
    tau_l = np.full(max_instances, math.ceil(p.tau * UNIT) / UNIT)
    growth = np.zeros(horizon)
    return SvtPlan(float(p.eps_svt), float(p.tau),
                   laplace_scale_units(p.svt_rho_scale) / UNIT,
                   laplace_scale_units(p.svt_nu_scale) / UNIT, tau_l, growth)


def partitioncc_cc(eps: float, delta: float, horizon: int) -> tuple[float, float]:
    """(eps, delta) of the counter PartitionCC runs on its block sums."""
    p = _bl.partitioncc_parameters(eps, delta, horizon)
    return float(p.cc_eps), float(p.cc_delta)


@dataclass(frozen=True)
class SchedPlan:
    """The counters ECC and SimECC run on the checkpoints (CC on block sums, BCC on lengths)."""

    cc_eps: float
    cc_delta: float
    bcc_eps: float
    bcc_delta: float


def ecc_sched(eps: float, delta: float, calibration: str = "paper") -> SchedPlan:
    p = _params.ecc_parameters(eps, delta, calibration)
    return SchedPlan(float(p.cc_eps), float(p.cc_delta), float(p.bcc_eps), float(p.bcc_delta))


def simecc_sched(eps: float, delta: float, calibration: str = "paper") -> SchedPlan:
    p = _params.simecc_parameters(eps, delta, calibration)
    return SchedPlan(float(p.cc_eps), float(p.cc_delta), float(p.bcc_eps), float(p.bcc_delta))


def simpart(eps: float, delta: float, calibration: str = "paper") -> tuple[float, int]:
    """(eps_p, mu) of SimECC's SimPart."""
    p = _params.simecc_parameters(eps, delta, calibration)
    return float(p.eps_part), int(p.mu)


def simpart_scale(eps_p: float) -> float:
    """SimPart's discrete Laplace scale on the integers (partition.simpart_scale: rounded up)."""
    t, s = _part.simpart_scale(eps_p)
    return t / s


def svt_scales(eps: float) -> tuple[float, float]:
    """(scale of Z_0, scale of Z_t) of SVT with eps, in events (svt.svt_scales, rounded up)."""
    a, b = _svt.svt_scales(eps)
    return a / UNIT, b / UNIT


def svt_growth(eps: float, steps: npt.NDArray[np.int64]) -> FloatArray:
    """svt_threshold(eps, 0, k) at every step k of `steps` (the threshold's growth), as one
    array operation: (8 / eps) ln(k + ceil(12 / eps)), the form `_svt_growth_checked`
    confirms against the core on a few steps for each eps."""
    _svt_growth_checked(eps)
    out: FloatArray = (8.0 / eps) * np.log(steps + math.ceil(12.0 / eps))
    return out


@lru_cache(maxsize=64)
def _svt_growth_checked(eps: float) -> None:
    for k in (1, 2, 17, 4096, 10**6):
        core = _svt.svt_threshold(eps, 0.0, k)
        if not math.isclose((8.0 / eps) * math.log(k + math.ceil(12.0 / eps)), core,
                            rel_tol=1e-12):
            raise AssertionError("svt_threshold is not tau + (8/eps) ln(k + ceil(12/eps))")


def simpart_gap(mu: int, l: int, eps_p: float, z: int) -> int:  # noqa: E741
    """The gap from checkpoint l-1 to checkpoint l given the Laplace draw z (partition.py)."""
    return int(_part.simpart_gap(mu, l, eps_p, z))


@lru_cache(maxsize=64)
def simpart_offsets(mu: int, eps_p: float, n: int) -> npt.NDArray[np.int64]:
    """offset_l = simpart_gap(mu, l, eps_p, 0) for l = 1..n; the gap is max(1, offset_l + z).

    Checks on a few points that the core's gap really has that form, so the vectorised
    max(1, offset + z) is the same function as the core's.
    """
    off = np.array([simpart_gap(mu, i, eps_p, 0) for i in range(1, n + 1)], dtype=np.int64)
    for i in {1, 2, max(1, n // 2), n}:
        for z in (-int(off[i - 1]) - 5, -1, 0, 7):
            if simpart_gap(mu, i, eps_p, z) != max(1, int(off[i - 1]) + z):
                raise AssertionError("simpart_gap is not max(1, offset + z)")
    return off
