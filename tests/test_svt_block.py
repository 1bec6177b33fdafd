"""The planner's model of an ECC block (processor/simulator/svt_block.py): the chunked,
thinned simulation has the law of the step-by-step one.

Each case runs both on 512 runs with their own fixed seeds and compares the mean and the
10th, 50th and 90th percentiles of the fire step within 3%. Over these cases the runs'
spread is 3-11% of the mean, so each mean's standard error is at most 0.5% and a false
alarm on a mean is beyond 4 standard errors of the difference (below 1e-4 a case; the
seeds are fixed, so a run is reproducible). Control: a chunk's candidate bound that
ignores the chunk's own events (too low a firing probability, so thinning under-fires) is
off by more than 5% where events are dense enough to move the gap within a chunk.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from processor.core import svt
from processor.core.svt import svt_threshold
from processor.simulator import params, svt_block
from processor.simulator.params import svt_growth
from processor.simulator.svt_block import block_steps, step_by_step

RUNS = 512
# (eps_p, tau, p): Part's epsilon, threshold and event probability per step. The fourth is
# ECC's tight calibration at epsilon 1 with 1% of ticks carrying an event (a block of about
# 180,000 steps, nearly all of them in chunks far from the threshold); the fifth a short
# block on dense events, mostly stepped through.
CASES = [(0.05, 2000.0, 0.2), (1.0, 500.0, 0.05), (0.5, 300.0, 0.5), (0.105, 1174.0, 0.01),
         (2.0, 20.0, 0.9)]


def _summary(fired: np.ndarray) -> np.ndarray:
    return np.array([fired.mean(), *np.percentile(fired, [10, 50, 90])])


@pytest.mark.parametrize(("eps_p", "tau", "p"), CASES)
def test_chunked_block_has_the_step_by_step_law(eps_p: float, tau: float, p: float) -> None:
    reference = _summary(step_by_step(eps_p, tau, p, RUNS, np.random.default_rng(7)))
    chunked = _summary(block_steps(eps_p, tau, p, RUNS, np.random.default_rng(20240)))
    assert np.all(np.abs(chunked / reference - 1) <= 0.03), (chunked, reference)


@pytest.mark.parametrize(("eps_p", "tau", "p"), CASES[:3])
def test_control_a_bound_without_the_chunk_s_events_under_fires(
        eps_p: float, tau: float, p: float, monkeypatch: pytest.MonkeyPatch) -> None:
    reference = step_by_step(eps_p, tau, p, RUNS, np.random.default_rng(7)).mean()
    monkeypatch.setattr(svt_block, "lowest_gap", lambda threshold, count, events:
                        threshold - count)
    late = block_steps(eps_p, tau, p, RUNS, np.random.default_rng(20240)).mean()
    assert late / reference - 1 > 0.05


def test_a_block_that_cannot_close_is_infinite(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the step limit lowered, runs that have not fired by then count as never."""
    monkeypatch.setattr(svt_block, "MAX_STEPS", 10_000)
    assert np.isinf(block_steps(0.1, 5000.0, 0.001, 8, np.random.default_rng(1))).all()


def test_growth_is_the_svt_threshold_over_steps() -> None:
    steps = np.array([1, 2, 17, 4096, 10**6])
    for eps_p in (0.02, 0.1, 1.0):
        assert np.allclose(svt_growth(eps_p, steps),
                           [svt_threshold(eps_p, 0.0, int(k)) for k in steps],
                           rtol=1e-12, atol=0)


def test_growth_refuses_a_core_threshold_of_another_form(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: were the core's threshold to grow otherwise, the array form is refused."""
    monkeypatch.setattr(svt, "svt_threshold",
                        lambda eps, tau, t: tau + (8.0 / eps) * math.log(t + 1))
    params._svt_growth_checked.cache_clear()
    try:
        with pytest.raises(AssertionError, match="svt_threshold is not"):
            svt_growth(0.5, np.array([1, 2]))
    finally:
        params._svt_growth_checked.cache_clear()
