"""ECC's and W's per-tick error bound (processor/core/bounds.py, ecc_bound): coverage on
several stream shapes, the core counters, and the bound's public properties.

Every statistical check states its false-alarm rate (a binomial quantile with a union
over the checks of one case) and has controls it must reject: half the bound, and a bound
that forgets the lag (CC's noise only).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from processor.core.bounds import _ecc_model, _ecc_windows, ecc_bound, gaussian_upper
from processor.core.cc import DEFAULT_BASE
from processor.core.ecc import ECC
from processor.core.errors import InvalidParameterError
from processor.core.params import ecc_parameters
from processor.core.rng import NoiseKey
from processor.core.wrapper import W
from processor.simulator.simulate import simulate

BETA = 0.05
DELTA = 1e-5
ALARM = 1e-3  # false-alarm rate of each test case (all its checks together)


def _miss_limit(runs: int, checks: int) -> int:
    """Misses allowed at one check if P(miss) <= BETA: a false alarm over `checks` checks
    with probability <= ALARM (union bound)."""
    return int(stats.binom.ppf(1.0 - ALARM / checks, runs, BETA))


def _streams(runs: int, horizon: int, tau: float) -> dict[str, npt.NDArray[np.int8]]:
    """Stream shapes (the same stream in every run, but the sparse one):
    dense (all ones, where every tick of lag is an event), sparse (Bernoulli 0.05),
    bursty (150 ones every 500 ticks), late (zeros, then ones from T/2: the SVT has run
    for T/2 steps and its threshold has grown) and stall, adversarial for the SVT (0.9 tau
    ones, then 3.6 tau zeros, repeated: the interval sum waits just under the threshold)."""
    rng = np.random.default_rng(1)
    out = {"dense": np.ones(horizon, dtype=np.int8)}
    bursty = np.zeros(horizon, dtype=np.int8)
    for s in range(0, horizon, 500):
        bursty[s:s + 150] = 1
    late = np.zeros(horizon, dtype=np.int8)
    late[horizon // 2:] = 1
    stall = np.zeros(horizon, dtype=np.int8)
    k = max(1, int(0.9 * tau))
    for s in range(0, horizon, 5 * k):
        stall[s:s + k] = 1
    tiled = {name: np.tile(x, (runs, 1)) for name, x in
             {**out, "bursty": bursty, "late": late, "stall": stall}.items()}
    tiled["sparse"] = (rng.random((runs, horizon)) < 0.05).astype(np.int8)
    return tiled


@pytest.mark.parametrize(("eps", "calibration"), [(5.0, "paper"), (10.0, "paper"),
                                                 (10.0, "tight"), (150.0, "paper")])
def test_simulated_coverage_on_stream_shapes(eps: float, calibration: str) -> None:
    """The vectorised simulator (the core's distributions) with the stream's default base,
    600 runs of 2500 ticks on five stream shapes, at 10 ticks each: misses at most beta at
    every (stream, tick) (false alarm <= 1e-3 over the 50 checks). Controls, rejected by
    the same test: half the bound, and the CC-only bound (the lag forgotten)."""
    runs, horizon = 600, 2500
    ticks = np.unique(np.geomspace(20, horizon, 10).astype(int))
    bound = np.array([ecc_bound(eps, DELTA, BETA, int(t), DEFAULT_BASE, calibration)
                      for t in ticks])
    m = _ecc_model(eps, DELTA, DEFAULT_BASE, calibration)
    n_hi = np.array([_ecc_windows(m.svt, int(t), BETA / 20.0).n - 1 for t in ticks])
    cc_only = np.array([gaussian_upper(BETA / 2) * max(m.cc.sd(j) for j in range(1, n + 1))
                        if n >= 1 else 0.0 for n in n_hi])
    streams = _streams(runs, horizon, ecc_parameters(eps, DELTA, calibration).tau)
    limit = _miss_limit(runs, len(streams) * ticks.size)
    rejected = {"half": False, "cc_only": False}
    for i, (name, x) in enumerate(streams.items()):
        y = simulate("ecc", x, eps, DELTA, np.random.default_rng([7, i]), DEFAULT_BASE,
                     calibration)
        err = np.abs(y - np.cumsum(x, axis=1))[:, ticks - 1]
        miss = (err > bound).sum(axis=0)
        assert miss.max() <= limit, (name, ticks.tolist(), miss.tolist(), limit)
        rejected["half"] |= bool(((err > bound / 2).sum(axis=0) > limit).any())
        rejected["cc_only"] |= bool(((err > cc_only).sum(axis=0) > limit).any())
    assert all(rejected.values()), rejected


@pytest.mark.parametrize(("cls", "eps"), [(ECC, 150.0), (W, 300.0)])
def test_core_counter_coverage_per_tick(cls: type[ECC] | type[W], eps: float) -> None:
    """The step-wise core counters (W runs ECC(eps/2, delta/2)) on all-ones input, 150 runs:
    at each of 4 ticks the fraction of runs with |y_t - s_t| > error_bound is at most beta
    (false alarm <= 1e-3). error_bound_at(t) is error_bound() at t. Control: half the bound
    is rejected."""
    runs, ticks = 150, (60, 120, 250, 500)
    limit = _miss_limit(runs, len(ticks))
    miss = dict.fromkeys(ticks, 0)
    half = dict.fromkeys(ticks, 0)
    key = NoiseKey.from_seed(5)
    for r in range(runs):
        c = cls(eps, DELTA, key, f"cov/{r}")
        for t in range(1, ticks[-1] + 1):
            c.update(1.0)
            if t in miss:
                err = abs(c.y - t)
                b = c.error_bound(BETA)
                assert b == c.error_bound_at(t, BETA)
                miss[t] += err > b
                half[t] += err > b / 2
    assert all(m <= limit for m in miss.values()), (miss, limit)
    assert any(m > limit for m in half.values()), half


def test_w_bound_is_its_inner_ecc_and_keys_the_calibration() -> None:
    key = NoiseKey.from_seed(6)
    w = W(20.0, 1e-6, key, "w")
    tight = W(20.0, 1e-6, key, "w", calibration="tight")
    w.skip(3000)
    tight.skip(3000)
    assert w.error_bound(BETA) == w._inner.error_bound(BETA) == ecc_bound(
        10.0, 5e-7, BETA, 3000, w._inner._bcc.base)
    assert w.error_bound_at(100, BETA) == ecc_bound(10.0, 5e-7, BETA, 100,
                                                    w._inner._bcc.base)
    # the operator caches bounds by bound_key(): it must tell the calibrations apart
    assert w.bound_key() != tight.bound_key()
    assert w.error_bound(BETA) != tight.error_bound(BETA)


@pytest.mark.parametrize(("eps", "calibration"), [(1.0, "paper"), (10.0, "paper"),
                                                 (10.0, "tight"), (150.0, "paper")])
def test_bound_is_nondecreasing_and_t_before_any_block(eps: float,
                                                       calibration: str) -> None:
    """Non-decreasing in t (sampled, and tick by tick across the switch to blocks at 2^12
    and the CC's interval end 2^12 - 1); it is t itself while no block can have closed
    (the error is then s_t, which can be t)."""
    prev = 0.0
    ts = sorted({*range(1, 200), *np.geomspace(200, 10**6, 60).astype(int).tolist(),
                 *range(4000, 4200)})
    for t in ts:
        b = ecc_bound(eps, DELTA, BETA, t, DEFAULT_BASE, calibration)
        assert b >= prev, (t, b, prev)
        prev = b
    tau = ecc_parameters(eps, DELTA, calibration).tau
    small = max(1, int(tau / 4))
    assert ecc_bound(eps, DELTA, BETA, small, DEFAULT_BASE, calibration) == float(small)


def test_large_t_is_finite_and_below_the_union_bound() -> None:
    key = NoiseKey.from_seed(8)
    c = ECC(10.0, DELTA, key, "big")
    c.skip(10**7)
    b = c.error_bound(BETA)
    assert math.isfinite(b) and 0 < b < 10**4
    assert b == c.error_bound_at(10**7, BETA)
    assert ecc_bound(10.0, DELTA, BETA, 0) == 0.0
    for beta in (0.0, 1.0):
        with pytest.raises(InvalidParameterError):
            ecc_bound(10.0, DELTA, beta, 100)
