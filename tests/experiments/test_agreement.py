"""The vectorised simulator against the step-wise core, mechanism by mechanism.

For each mechanism, R_CORE runs of the core (processor.core.registry.make with
NoiseKey.from_seed, one counter_id per run) and R_SIM runs of the simulator are fed
independent Section 8 block streams (rates 0.1/0.9 in blocks of 10, challenge bit and
neighbour as in the attack) of a small horizon, at parameters where the data-dependent
parts act within that horizon (checkpoints occur). The two samples of y - s are compared
by four two-sample tests:

1. per-tick means of y_t - s_t: Welch's t-test at every tick, Bonferroni over ticks;
2. per-tick spread of y_t - s_t: Brown-Forsythe (Levene, median-centred), Bonferroni;
3. release counts (ticks where y changes), Mann-Whitney U (identical constants for the
   mechanisms that change every tick are compared exactly instead);
4. the attack statistic S: two-sample Kolmogorov-Smirnov.

False-alarm rate: each test is run at ALPHA / 4 (its per-tick version Bonferroni-corrected),
so a correct simulator is rejected with probability at most ALPHA = 1e-3 per mechanism (the
tests' approximations are accurate at these sample sizes). Seeds are fixed, so each
outcome is deterministic. Each mechanism has a control: the simulator with one constant
deliberately wrong (noise sigma halved, partition threshold doubled, SimPart's mu doubled)
must be rejected by the same procedure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from scipy import stats

from processor.core import registry
from processor.core.cc import DEFAULT_BASE
from processor.core.rng import NoiseKey
from processor.experiments import attack
from processor.simulator import params
from processor.simulator import simulate as sim

ALPHA = 1e-3
R_CORE = 300
R_SIM = 3000


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    eps: float
    delta: float
    horizon: int
    base: str  # base of the CC inside, as the core's instance uses it
    core_params: dict[str, Any]
    calibration: str = "paper"


CASES = {
    "basecc": Case("basecc", 2.0, 1e-5, 128, "sqrt", {"base": "sqrt"}),
    "gaussiancc": Case("gaussiancc", 5.0, 1e-5, 128, "sqrt", {}),
    "partitioncc": Case("partitioncc", 5.0, 1e-5, 256, "sqrt", {"base": "sqrt", "horizon": 256}),
    # The core's ECC and SimECC build their CC and BCC with the default base (blt).
    "simecc": Case("simecc", 100.0, 1e-3, 256, DEFAULT_BASE, {}),
    "ecc": Case("ecc", 100.0, 1e-3, 256, DEFAULT_BASE, {}),
}


@dataclasses.dataclass(frozen=True)
class Sample:
    err: np.ndarray  # y - s, runs x T
    changes: np.ndarray  # number of ticks t >= 2 with y_t != y_{t-1}, per run
    stat: np.ndarray  # the attack statistic S, per run


def _sample(y: np.ndarray, x: np.ndarray, rates: np.ndarray) -> Sample:
    return Sample(y - np.cumsum(x, axis=1), np.sum(np.diff(y, axis=1) != 0, axis=1),
                  attack.statistic(y, rates))


def _core_sample(case: Case) -> Sample:
    rates = attack.block_rates(case.horizon)
    x, _ = attack.draw_trials(rates, R_CORE, np.random.default_rng(101))
    key = NoiseKey.from_seed(7)
    y = np.empty(x.shape, dtype=np.float64)
    for r in range(R_CORE):
        c = registry.make(case.name, case.eps, case.delta, key, f"run{r}", **case.core_params)
        y[r] = [c.update(float(v)) for v in x[r]]
    return _sample(y, x, rates)


def _sim_sample(case: Case, seed: int = 202) -> Sample:
    rates = attack.block_rates(case.horizon)
    x, _ = attack.draw_trials(rates, R_SIM, np.random.default_rng(seed))
    y = sim.simulate(case.name, x, case.eps, case.delta, np.random.default_rng(seed + 1),
                     base=case.base, calibration=case.calibration)
    return _sample(y, x, rates)


def p_values(a: Sample, b: Sample) -> dict[str, float]:
    """The four p-values (per-tick ones already Bonferroni-corrected)."""
    ticks = a.err.shape[1]
    out: dict[str, float] = {}
    with np.errstate(all="ignore"):
        pm = stats.ttest_ind(a.err, b.err, axis=0, equal_var=False).pvalue
        out["mean"] = float(min(1.0, np.nanmin(pm) * ticks))
        pv = [stats.levene(a.err[:, t], b.err[:, t], center="median").pvalue
              for t in range(ticks)]
        out["spread"] = float(min(1.0, np.nanmin(pv) * ticks))
    if np.ptp(a.changes) == 0 and np.ptp(b.changes) == 0:
        out["changes"] = 1.0 if a.changes[0] == b.changes[0] else 0.0
    else:
        out["changes"] = float(stats.mannwhitneyu(a.changes, b.changes).pvalue)
    out["stat"] = float(stats.ks_2samp(a.stat, b.stat).pvalue)
    return out


def rejected(p: dict[str, float]) -> bool:
    return min(p.values()) < ALPHA / len(p)


_CORE: dict[str, Sample] = {}


def core(name: str) -> Sample:
    if name not in _CORE:
        _CORE[name] = _core_sample(CASES[name])
    return _CORE[name]


@pytest.mark.parametrize("name", list(CASES))
def test_simulator_agrees_with_core(name: str) -> None:
    """Simulator and core are the same distribution (false-alarm rate <= 1e-3)."""
    p = p_values(core(name), _sim_sample(CASES[name]))
    assert not rejected(p), p


#: The tight calibration (processor.core.tight): same procedure and false-alarm rate; the
#: paper-calibrated simulator is the control (other constants, it must be rejected).
TIGHT = {m: Case(m, 100.0, 1e-3, 256, DEFAULT_BASE, {"calibration": "tight"}, "tight")
         for m in ("simecc", "ecc")}


@pytest.mark.parametrize("name", list(TIGHT))
def test_simulator_agrees_with_core_tight(name: str) -> None:
    c = _core_sample(TIGHT[name])
    assert not rejected(p_values(c, _sim_sample(TIGHT[name])))
    assert rejected(p_values(c, _sim_sample(dataclasses.replace(TIGHT[name],
                                                                calibration="paper"))))


def _halve(fn: Callable[..., float]) -> Callable[..., float]:
    return lambda *a: 0.5 * fn(*a)


def _double_tau(fn: Callable[..., params.SvtPlan]) -> Callable[..., params.SvtPlan]:
    def wrong(*a: Any) -> params.SvtPlan:
        plan = fn(*a)
        return dataclasses.replace(plan, tau_l=2.0 * plan.tau_l)

    return wrong


@pytest.fixture
def wrong_constant(request: pytest.FixtureRequest,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    name = request.param
    if name == "basecc":
        monkeypatch.setattr(params, "sqrt_z_sigma", _halve(params.sqrt_z_sigma))
        monkeypatch.setattr(params, "gaussian_constant", _halve(params.gaussian_constant))
    elif name == "gaussiancc":
        orig = params.gaussiancc_sigmas
        monkeypatch.setattr(params, "gaussiancc_sigmas", lambda *a: 0.5 * orig(*a))
        monkeypatch.setattr(sim, "_SIG_CACHE", {})
    elif name == "partitioncc":
        monkeypatch.setattr(params, "partitioncc_plan", _double_tau(params.partitioncc_plan))
    elif name == "ecc":
        monkeypatch.setattr(params, "part_plan", _double_tau(params.part_plan))
    elif name == "simecc":
        orig_sp = params.simpart
        monkeypatch.setattr(params, "simpart",
                            lambda *a: (orig_sp(*a)[0], 2 * orig_sp(*a)[1]))
    yield


@pytest.mark.parametrize("wrong_constant", list(CASES), indirect=True)
def test_control_wrong_constant_is_rejected(wrong_constant: None,
                                            request: pytest.FixtureRequest) -> None:
    """Control: the same procedure rejects a simulator with one wrong constant."""
    name = request.node.callspec.params["wrong_constant"]
    p = p_values(core(name), _sim_sample(CASES[name]))
    assert rejected(p), p
