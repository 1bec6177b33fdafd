"""A vectorised simulator of the counters of Section 8: many runs at once.

`simulate(name, x, eps, delta, rng)` takes a batch of input streams x (runs x T, values
in {0, 1}) and returns the releases y (runs x T) of one mechanism, one independent run
per row. It draws from the same distributions as the step-wise core (processor/core):
every constant and calibration comes from the core through params.py; only the random
generator differs (numpy's Generator here, keyed ChaCha20 in the core).

Continuous versus grid noise. The core draws discrete Laplace / discrete Gaussian noise
on the 2^-16 grid; here Laplace and Gaussian noise are continuous. The two agree up to
that grid (a shift of at most 2^-16 per draw, far below every noise scale used here:
the smallest is a Gaussian sigma of order 1 and a Laplace scale of 4/eps_p >= 1.3).
SimPart's checkpoint gaps are integers in the core and here (discrete Laplace on the
integers, drawn exactly as a difference of two geometric variables).

Where the algorithm is sequential (SVT in ECC's Part and in PartitionCC) the simulator
loops over ticks with numpy operations across runs; everything else is batched: the
square-root factorization noise is a causal convolution done with the FFT, and the
releases scheduled at checkpoints are laid out with one scatter and one forward fill.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt
from scipy import fft as sfft

from processor.simulator import params

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: mechanism names understood by `simulate` (registry names of the core)
MECHANISMS = ("basecc", "partitioncc", "gaussiancc", "simecc", "ecc")

#: ticks of per-tick Laplace noise drawn at once in the SVT loop (bounds memory)
_SVT_BLOCK = 512


# --------------------------------------------------------------------------- noise


def _causal_conv(z: npt.NDArray[np.float32], c: FloatArray) -> npt.NDArray[np.float32]:
    """out[:, i] = sum_{j <= i} c[j] z[:, i - j] for each row, via the FFT.

    Single precision: the noise values are O(1..1e4) and the relative rounding of a float32
    FFT (~1e-6) is far below the noise itself; it halves the time and memory.
    """
    n = z.shape[1]
    size = sfft.next_fast_len(2 * n - 1, real=True)
    fz = sfft.rfft(z, size, axis=1)
    fz *= sfft.rfft(c[:n].astype(np.float32), size)
    return np.asarray(sfft.irfft(fz, size, axis=1)[:, :n], dtype=np.float32)


def _tree_noise(node_sigma: float, runs: int, n: int,
                rng: np.random.Generator) -> npt.NDArray[np.float32]:
    """Noise of a Gaussian tree (bounded.GaussianTree) at local times 1..n: the sum, over the
    set bits j of tau, of the node of level j with index (tau >> j) - 1."""
    out = np.zeros((runs, n), dtype=np.float32)
    tau = np.arange(1, n + 1)
    j = 0
    while (1 << j) <= n:
        nodes = rng.standard_normal((runs, n >> j), dtype=np.float32)
        nodes *= np.float32(node_sigma)
        use = np.flatnonzero((tau >> j) & 1)
        out[:, use] += nodes[:, (tau[use] >> j) - 1]
        j += 1
    return out


@dataclass(frozen=True)
class CCParts:
    """The unbounded CC's noise before scaling: e_t = a * A[:, K(t)] + b[k(t)] * Q[:, t].

    A[:, j] is the sum of the first j interval releases' unit normals (A[:, 0] = 0), K(t)
    the number of intervals completed at t, Q the inner bounded counter's noise with unit
    sigma (0 at the last tick of each interval), k(t) the 0-based interval of t. The scales
    a and b (cc_scales) are the only place eps and delta enter, so one draw of the parts
    serves every eps exactly.
    """

    A: FloatArray
    Q: npt.NDArray[np.float32]
    completed: IntArray  # K(t), t = 1..n
    level: IntArray  # k(t) - 1, t = 1..n


def cc_parts(runs: int, n: int, rng: np.random.Generator, base: str = params.BASE) -> CCParts:
    """Draw the standardised parts of the CC noise (see CCParts) for t = 1..n."""
    if base not in params.BASES:
        raise ValueError(f"unknown base {base!r}")
    q = np.zeros((runs, n), dtype=np.float32)
    levels = max(1, n.bit_length())
    acc = np.zeros((runs, levels + 1), dtype=np.float64)
    k = 1
    while (1 << (k - 1)) <= n:
        start = 1 << (k - 1)  # first tick of I_k (1-based)
        end = (1 << k) - 1  # last tick of I_k
        length = min(end, n) - start + 1
        # The core's inner counter of I_k has horizon 2^{k-1} - 1: it is read only before
        # the interval's last tick, where p_k takes over (cc.py module docstring).
        inner = min(length, start - 1)
        if inner > 0 and base == "tree":
            q[:, start - 1 : start - 1 + inner] = _tree_noise(1.0, runs, inner, rng)
        elif inner > 0 and base == "blt":
            z = rng.standard_normal((runs, inner), dtype=np.float32)
            q[:, start - 1 : start - 1 + inner] = _causal_conv(z, params.blt_coeffs(inner))
        elif inner > 0:
            z = rng.standard_normal((runs, inner), dtype=np.float32)
            q[:, start - 1 : start - 1 + inner] = _causal_conv(z, params.sqrt_coeffs(inner))
        if end <= n:
            acc[:, k] = acc[:, k - 1] + rng.standard_normal(runs)
        k += 1
    completed, level = _interval_index(n)
    return CCParts(acc, q, completed, level)


@lru_cache(maxsize=16)
def _interval_index(n: int) -> tuple[IntArray, IntArray]:
    """(K(t), k(t) - 1) for t = 1..n: intervals completed at t, and t's own interval."""
    completed = np.array([(v + 1).bit_length() - 1 for v in range(1, n + 1)], dtype=np.int64)
    level = np.array([v.bit_length() - 1 for v in range(1, n + 1)], dtype=np.int64)
    return completed, level


def cc_scales(eps: float, delta: float, n: int,
              base: str = params.BASE) -> tuple[float, FloatArray]:
    """(a, b): a = sigma of one interval release, b[k - 1] = sigma of the inner counter's
    draws in I_k (horizon 2^{k-1} - 1; 0 when I_k has no inner counter), from the core."""
    a = params.gaussian_constant(eps / 2, delta / 2)
    b = np.zeros(max(1, n.bit_length()), dtype=np.float64)
    for k in range(2, b.size + 1):
        h = (1 << (k - 1)) - 1
        b[k - 1] = (params.tree_node_sigma(eps / 2, delta / 2, h) if base == "tree"
                    else params.blt_z_sigma(eps / 2, delta / 2, h) if base == "blt"
                    else params.sqrt_z_sigma(eps / 2, delta / 2, h))
    return a, b


def cc_noise(eps: float, delta: float, runs: int, n: int, rng: np.random.Generator,
             base: str = params.BASE) -> FloatArray:
    """y_t - s_t of the unbounded CC (Lemma 3.12) with (eps, delta), for t = 1..n, one
    independent run per row (it does not depend on the input).

    Interval I_k = [2^{k-1}, 2^k - 1]: the completed intervals contribute one
    N(0, C_{eps/2,delta/2}^2) each; inside the running interval a bounded (eps/2, delta/2)
    counter of horizon 2^{k-1} - 1 (as in cc.py) adds sum_{j<i} c_j z_{i-j},
    z ~ N(0, sigma_z^2) with sigma_z = C * ||c|| from bounded.sqrt_z_sigma2; at t = 2^k - 1
    the release is l_t alone (the interval's own p_k replaces the bounded counter).
    With base "tree" the bounded counter is the core's Gaussian tree instead.
    """
    parts = cc_parts(runs, n, rng, base)
    a, b = cc_scales(eps, delta, n, base)
    out = parts.A[:, parts.completed] * a
    out += parts.Q * b[parts.level][None, :]
    return out


def dlap_int(scale: float, size: tuple[int, ...] | int, rng: np.random.Generator) -> IntArray:
    """Discrete Laplace on the integers, P(z) proportional to exp(-|z| / scale): exact, as
    the difference of two i.i.d. geometric variables with success 1 - exp(-1/scale)."""
    p = -math.expm1(-1.0 / scale)
    g1 = rng.geometric(p, size)
    g2 = rng.geometric(p, size)
    return np.asarray(g1 - g2, dtype=np.int64)


# --------------------------------------------------------------------------- partitions


def svt_partition(
    prefix: npt.NDArray[np.int32], plan: params.SvtPlan, rng: np.random.Generator
) -> tuple[IntArray, IntArray]:
    """Checkpoints of a sequence of SVT instances restarted at each firing (Part, Alg. 3).

    prefix is (T + 1) x runs: prefix[t, r] = s_t of run r (prefix[0] = 0), tick-major so
    each tick reads one contiguous row. Instance l starts after checkpoint c with a noisy
    threshold tau_l + Z0; at its k-th step it fires when
    (s_t - s_c) + Z_t > tau_l + growth[k - 1] + Z0, i.e. s_t + Z_t - growth[k-1] > thr
    with thr = s_c + tau_l + Z0 kept per run. Every tick consumes one fresh Z_t ~
    Lap(4/eps) for every run, as the core does; a fresh Z0 ~ Lap(2/eps) is drawn
    at each restart.

    Returns (times, counts): times[r, :counts[r]] are run r's checkpoint ticks in
    increasing order; the rest of the row holds T + 1.
    """
    horizon = prefix.shape[0] - 1
    runs = prefix.shape[1]
    b0, b = plan.scale0, plan.scale
    growth = plan.growth
    tau_l = plan.tau_l
    last = np.zeros(runs, dtype=np.int64)  # c: tick of the last checkpoint (0 at start)
    inst = np.zeros(runs, dtype=np.int64)  # l - 1
    thr = tau_l[0] + rng.laplace(0.0, b0, runs)
    # fired[t, r]: run r has a checkpoint at tick t (a row write per tick is cheap)
    fired_at = np.zeros((horizon + 1, runs), dtype=bool)
    flat = not bool(np.any(growth)) and not bool(np.any(tau_l != tau_l[0]))
    for t0 in range(1, horizon + 1, _SVT_BLOCK):
        t1 = min(horizon + 1, t0 + _SVT_BLOCK)
        noise = rng.laplace(0.0, b, (t1 - t0, runs))
        noise += prefix[t0:t1]
        if flat:
            _flat_block(noise, prefix[t0:t1], float(tau_l[0]), b0, thr, fired_at[t0:t1], rng)
            continue
        for t in range(t0, t1):
            hit = noise[t - t0] - growth[t - last - 1] > thr
            fired = np.flatnonzero(hit)
            if fired.size == 0:
                continue
            fired_at[t] = hit
            last[fired] = t
            inst[fired] += 1
            thr[fired] = prefix[t, fired] + tau_l[inst[fired]] + rng.laplace(0.0, b0, fired.size)
    if int(inst.max(initial=0)) >= tau_l.size:
        raise RuntimeError("more SVT instances than planned")
    return _pack_times(fired_at)


def _flat_block(noise: FloatArray, prefix: npt.NDArray[np.int32], tau: float, b0: float,
                thr: FloatArray, fired_at: npt.NDArray[np.bool_],
                rng: np.random.Generator) -> None:
    """Ticks of one block for an SVT whose threshold never changes (PartitionCC): only
    whole-row operations, no fancy indexing. A fresh Z0 is drawn for every run that fires
    (one Laplace draw per firing run, in run order), exactly as the general loop does."""
    for i in range(noise.shape[0]):
        hit = noise[i] > thr
        if not hit.any():
            continue
        fired_at[i] = hit
        k = int(np.count_nonzero(hit))
        new = prefix[i][hit] + tau + rng.laplace(0.0, b0, k)
        thr[hit] = new


def _pack_times(fired_at: npt.NDArray[np.bool_]) -> tuple[IntArray, IntArray]:
    """(times, counts) from a (T + 1) x runs firing mask: times[r, :counts[r]] increasing,
    padded with T + 1."""
    horizon = fired_at.shape[0] - 1
    runs = fired_at.shape[1]
    r, t = np.nonzero(np.ascontiguousarray(fired_at.T))  # sorted by run, then tick
    counts = np.bincount(r, minlength=runs).astype(np.int64)
    width = max(1, int(counts.max(initial=0)))
    times = np.full((runs, width), horizon + 1, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    times[r, np.arange(r.size) - starts[r]] = t
    return times, counts


def simpart_times(
    eps: float, delta: float, runs: int, horizon: int, rng: np.random.Generator,
    calibration: str = "paper",
) -> tuple[IntArray, IntArray]:
    """SimECC's data-independent checkpoints (SimPart, Algorithm 5) up to the horizon.

    Gap l = max(1, offset_l + Z_l), Z_l ~ DLap(2/eps_p) on the integers, offset_l from the
    core's simpart_gap. Same (times, counts) layout as svt_partition.
    """
    eps_p, mu = params.simpart(eps, delta, calibration)
    n = 16
    while True:
        off = params.simpart_offsets(mu, eps_p, n)
        gaps = np.maximum(1, off[None, :] + dlap_int(params.simpart_scale(eps_p), (runs, n), rng))
        times = np.cumsum(gaps, axis=1)
        if n >= horizon or bool(np.all(times[:, -1] > horizon)):
            break
        # Redraw with a longer table: simpler than extending, and the law is unchanged
        # because the discarded draws are independent of everything else.
        n = min(horizon, 4 * n)
    counts = np.sum(times <= horizon, axis=1).astype(np.int64)
    times[times > horizon] = horizon + 1
    return times.astype(np.int64), counts


# --------------------------------------------------------------------------- releases


def _lay_out(
    release_at: IntArray, values: FloatArray, valid: npt.NDArray[np.bool_], horizon: int
) -> FloatArray:
    """y_t = the largest value released at tick t if any, else y_{t-1} (y_0 = 0).

    This is schedList's Check (Algorithm 4) and, with release_at = checkpoint ticks, the
    plain "hold the last checkpoint's value" of PartitionCC. Releases are put in (run, tick)
    order (already so for checkpoints), ties keep the largest, and y is the running sum of
    the changes (exact up to float rounding of the sums, ~1e-12 here).
    """
    runs = release_at.shape[0]
    width = horizon + 1
    ok = valid & (release_at <= horizon)
    rows = np.broadcast_to(np.arange(runs, dtype=np.int64)[:, None], release_at.shape)[ok]
    keys = rows * width + release_at[ok]
    vals = values[ok]
    if keys.size > 1 and not bool(np.all(keys[1:] > keys[:-1])):
        # Scheduled releases can come out of order or tie; checkpoint ticks never do.
        order = np.argsort(keys, kind="stable")
        keys, vals = keys[order], vals[order]
        first = np.ones(keys.size, dtype=bool)
        first[1:] = keys[1:] != keys[:-1]
        starts = np.flatnonzero(first)
        vals = np.maximum.reduceat(vals, starts)  # ties at one tick: the largest (schedList)
        keys = keys[starts]
    # y is piecewise constant: put each release's change at its tick and sum along the row.
    rows = keys // width
    step = np.diff(vals, prepend=0.0)
    new_row = np.ones(keys.size, dtype=bool)
    new_row[1:] = rows[1:] != rows[:-1]
    step[new_row] = vals[new_row]  # the first release of a run starts from y = 0
    board = np.zeros(runs * width, dtype=np.float64)
    board[keys] = step
    full = board.reshape(runs, width)
    np.cumsum(full, axis=1, out=full)
    return full[:, 1:]


def _checkpoint_releases(
    times: IntArray,
    counts: IntArray,
    prefix_rm: npt.NDArray[np.int32],
    plan: params.SchedPlan | None,
    cc: tuple[float, float],
    horizon: int,
    rng: np.random.Generator,
    base: str,
) -> FloatArray:
    """The releases driven by checkpoints t_1 < t_2 < ... of each run.

    CC with cc = (eps, delta) is fed the block sums, so its l-th output is s_{t_l} + e_l.
    With a plan (ECC, SimECC) BCC is fed the block lengths, so its l-th output is
    t_hat_l = ceil(max(t_l + e'_l + alpha_l, t_l)) (never before t_l) and the value is
    scheduled at t_hat_l; without one (PartitionCC) it is released at t_l.
    """
    runs = times.shape[0]
    width = int(counts.max()) if counts.size else 0
    if width == 0:
        return np.zeros((runs, horizon), dtype=np.float64)
    t_l = times[:, :width]
    valid = np.arange(width)[None, :] < counts[:, None]
    safe_t = np.where(valid, t_l, 0)
    values = np.take_along_axis(prefix_rm, safe_t, axis=1).astype(np.float64)
    values += cc_noise(cc[0], cc[1], runs, width, rng, base)
    if plan is None:
        release_at = safe_t
    else:
        # BCC (Lemma 3.13) runs CC with (eps, delta / 2) and adds alpha (bcc_alpha).
        noisy = safe_t + cc_noise(plan.bcc_eps, plan.bcc_delta / 2, runs, width, rng, base)
        noisy += params.bcc_shift_table(plan.bcc_eps, plan.bcc_delta, width, base)[None, :]
        release_at = np.ceil(np.maximum(noisy, safe_t)).astype(np.int64)
    return _lay_out(release_at, values, valid, horizon)


# --------------------------------------------------------------------------- mechanisms


def _prefix_rowmajor(x: npt.NDArray[np.integer]) -> npt.NDArray[np.int32]:
    """runs x (T + 1) prefix sums with a leading 0 column."""
    out = np.zeros((x.shape[0], x.shape[1] + 1), dtype=np.int32)
    np.cumsum(x, axis=1, out=out[:, 1:])
    return out


def _max_instances(horizon: int) -> int:
    # At most one checkpoint per tick; +2 covers the instance running at the end.
    return horizon + 2


def sim_basecc(x: npt.NDArray[np.integer], eps: float, delta: float, base: str,
               rng: np.random.Generator, calibration: str = "paper") -> FloatArray:
    """BaseCC: y = s + the unbounded CC's noise (square-root base)."""
    runs, horizon = x.shape
    y = cc_noise(eps, delta, runs, horizon, rng, base)
    y += np.cumsum(x, axis=1)
    return y


def sim_gaussiancc(x: npt.NDArray[np.integer], eps: float, delta: float, base: str,
                   rng: np.random.Generator, calibration: str = "paper") -> FloatArray:
    """GaussianCC (Algorithm 6): y_t = s_t + N(0, gaussiancc_sigma(eps, delta, t)^2)."""
    runs, horizon = x.shape
    sig = gaussiancc_sigma_vector(eps, delta, horizon)
    z = rng.standard_normal((runs, horizon), dtype=np.float32)
    y = np.cumsum(x, axis=1, dtype=np.float64)
    y += z * sig[None, :]
    return y


_SIG_CACHE: dict[tuple[float, float], FloatArray] = {}


def gaussiancc_sigma_vector(eps: float, delta: float, horizon: int) -> FloatArray:
    """GaussianCC's per-tick noise std for t = 1..horizon (the core's, cached)."""
    key = (eps, delta)
    have = _SIG_CACHE.get(key)
    if have is None or have.size < horizon:
        have = params.gaussiancc_sigmas(eps, delta, horizon)
        _SIG_CACHE[key] = have
    return have[:horizon]


def sim_simecc(x: npt.NDArray[np.integer], eps: float, delta: float, base: str,
               rng: np.random.Generator, calibration: str = "paper") -> FloatArray:
    """SimECC: SimPart checkpoints, CC on block sums, BCC on block lengths, schedList."""
    runs, horizon = x.shape
    times, counts = simpart_times(eps, delta, runs, horizon, rng, calibration)
    plan = params.simecc_sched(eps, delta, calibration)
    return _checkpoint_releases(times, counts, _prefix_rowmajor(x), plan,
                                (plan.cc_eps, plan.cc_delta), horizon, rng, base)


def sim_ecc(x: npt.NDArray[np.integer], eps: float, delta: float, base: str,
            rng: np.random.Generator, calibration: str = "paper") -> FloatArray:
    """ECC (Algorithm 2): Part's SVT checkpoints, CC on block sums, BCC on lengths, schedList."""
    _runs, horizon = x.shape
    prefix_rm = _prefix_rowmajor(x)
    svt = params.part_plan(eps, delta, horizon, _max_instances(horizon), calibration)
    times, counts = svt_partition(np.ascontiguousarray(prefix_rm.T), svt, rng)
    plan = params.ecc_sched(eps, delta, calibration)
    return _checkpoint_releases(times, counts, prefix_rm, plan,
                                (plan.cc_eps, plan.cc_delta), horizon, rng, base)


def sim_partitioncc(x: npt.NDArray[np.integer], eps: float, delta: float, base: str,
                    rng: np.random.Generator, calibration: str = "paper") -> FloatArray:
    """PartitionCC (DNRR15 Thm 3.1, horizon = T): SVT partition, then BaseCC on block sums;
    the output holds the counter's value from the last checkpoint."""
    _runs, horizon = x.shape
    prefix_rm = _prefix_rowmajor(x)
    svt = params.partitioncc_plan(eps, delta, horizon, _max_instances(horizon))
    times, counts = svt_partition(np.ascontiguousarray(prefix_rm.T), svt, rng)
    cc = params.partitioncc_cc(eps, delta, horizon)
    return _checkpoint_releases(times, counts, prefix_rm, None, cc, horizon, rng, base)


_SIMS: dict[str, Callable[[npt.NDArray[np.integer], float, float, str,
                           np.random.Generator, str], FloatArray]] = {
    "basecc": sim_basecc,
    "partitioncc": sim_partitioncc,
    "gaussiancc": sim_gaussiancc,
    "simecc": sim_simecc,
    "ecc": sim_ecc,
}


def simulate(name: str, x: npt.NDArray[np.integer], eps: float, delta: float,
             rng: np.random.Generator, base: str = params.BASE,
             calibration: str = "paper") -> FloatArray:
    """Releases y (runs x T) of mechanism `name` on the input streams x (runs x T, in {0,1}).

    `base` is the bounded counter inside every CC and BCC: "sqrt" (the paper's experiments,
    and the core's counters built with base="sqrt"), "blt" (the core's default, which the
    stream's ECC and SimECC use: the causal convolution of its Gaussians with the decoder's
    impulse response) or "tree". GaussianCC has no CC inside and ignores it.
    `calibration` ("paper" or "tight", processor.core.tight) sets ECC's and SimECC's
    constants as the core's counters built with it; the other mechanisms ignore it.

    Raises ValueError for an unknown name, a non-2-D x or values outside {0, 1}
    (nothing is computed then).
    """
    sim = _SIMS.get(name)
    if sim is None:
        raise ValueError(f"unknown mechanism {name!r}; known: {', '.join(MECHANISMS)}")
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError("x must be a runs x T array")
    if arr.size and (arr.min() < 0 or arr.max() > 1):
        raise ValueError("x must hold values in {0, 1}")
    if not (eps > 0 and 0 < delta < 1):
        raise ValueError("need eps > 0 and 0 < delta < 1")
    if base not in params.BASES:
        raise ValueError(f"unknown base {base!r}; known: {', '.join(params.BASES)}")
    return sim(arr.astype(np.int8, copy=False), float(eps), float(delta), base, rng,
               calibration)
