"""The audit's power against its controls (deliberately broken mechanisms), and its
verdict on the real counters, under both calibrations.

False-alarm rates. A sampling verdict is a test at alpha = 0.05 (alpha/2 per bound); each
law check (KS) adds 0.001. The exact checks (plan check, exact-pair bounds) sample nothing
but the law checks they stand on: for a correct mechanism they fail with probability 0
(the plan check) or only if the law check they rest on has falsely accepted a wrong law.
Seeds are fixed, so every outcome is deterministic.

Controls (each must FAIL, built here, never in processor/core): the swap-only counters
BaseCC, PartitionCC and the Laplace tree at eps = 1; tight plans charging CC for 1 or 2 of
its 4 shift steps or BCC for 1 of its 2; ECC and SimECC with their partition noise divided
by 2 and 4 under both calibrations; GaussianCC with 1/5 of its noise (the late-run,
CC/BCC and unit-derivation controls are in test_audit_whole_run.py). The correct ECC and
SimECC must PASS every check under both calibrations. docs/audit.md tabulates which check
catches which control.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from processor.audit.diagnostics import ecc_partition_check, plan_check, simecc_partition_check
from processor.audit.plans import make_streams, plan_for
from processor.audit.runs import audit
from processor.commands.audit import core_backend, main_audit, run_audit, sim_backend
from processor.core import tight
from processor.core.baselines import GaussianCC, gaussiancc_sigma2_units
from processor.core.ecc import ECC, SimECC
from processor.core.grid import UNIT
from processor.core.partition import Part, SimPart, part_tau
from processor.core.rng import NoiseKey
from processor.core.samplers.scalar import discrete_gaussian, discrete_laplace
from processor.core.svt import SVT

ALPHA = 0.05
DELTA = 1e-6
KEY = NoiseKey.from_seed(41)


# --------------------------------------------------------------------- swap-only, eps = 1


def test_basecc_fails_at_eps_1_by_the_exact_pair_bound() -> None:
    """BaseCC (release every tick, Gaussian law known): the pair's mu |d|_C is computed,
    not sampled; on 400 alternating events it already exceeds what (1, 1e-6) allows."""
    x0, x1 = make_streams("alternating", 400, 1)
    plan = plan_for("basecc", 1.0, DELTA, x0, x1, "lr")
    res = run_audit(sim_backend("basecc", 1.0, DELTA, 3, {}), plan, 200, eps=1.0,
                    delta=DELTA, alpha=ALPHA)
    exact = next(b for b in res.bounds if b.method == "exact-pair")
    assert res.null_law_ok and not res.passed and exact.eps_lb > 1.5, res


def test_tree_fails_at_eps_1() -> None:
    """The Laplace tree on 1000 alternating events: the leaf score's law is computed
    exactly on both streams (exact-pair bound far above 1) and its law on x holds (KS)."""
    x0, x1 = make_streams("alternating", 1000, 1)
    plan = plan_for("tree", 1.0, DELTA, x0, x1, "leaves")
    res = run_audit(core_backend("tree", 1.0, DELTA, 5, {}), plan, 150, eps=1.0,
                    delta=DELTA, alpha=ALPHA)
    exact = next(b for b in res.bounds if b.method == "exact-pair")
    assert res.null_law_ok and not res.passed and exact.eps_lb > 3.0, res


# --------------------------------------------------------------------- GaussianCC / 5


class FifthNoiseGaussianCC(GaussianCC):
    """Control: GaussianCC with 1/5 of its noise (sigma^2 / 25)."""

    def _step(self, u: int) -> int:
        num, den = gaussiancc_sigma2_units(self.eps, self.delta, self._t + 1)
        self._s += u
        return self._s + discrete_gaussian(self._cur, num, den * 25)


def test_gaussiancc_with_a_fifth_of_its_noise_fails_the_noise_law() -> None:
    """The exact-pair bound computes the claimed law, which is not this counter's: the
    noise-law check (KS of the standardised scores on x) is what catches it."""
    x0, x1 = make_streams("empty", 63, 1)
    plan = plan_for("gaussiancc", 1.0, DELTA, x0, x1, "lr")
    res = audit(lambda c: FifthNoiseGaussianCC(1.0, DELTA, KEY, c), x0, x1, 200, eps=1.0,
                delta=DELTA, score=plan.score, alpha=ALPHA, known_null=True)
    assert not res.null_law_ok and not res.passed, res
    good = run_audit(core_backend("gaussiancc", 1.0, DELTA, 6, {}), plan, 200, eps=1.0,
                     delta=DELTA, alpha=ALPHA)
    assert good.passed, good


# --------------------------------------------------------------------- under-charged plans


@pytest.fixture
def steps() -> Iterator[Any]:
    """Set the planner's step counts (the control), restored afterwards."""
    saved = (tight.CC_STEPS, tight.BCC_STEPS)

    def set_(cc: int, bcc: int) -> None:
        tight.CC_STEPS, tight.BCC_STEPS = cc, bcc
        tight._plan.cache_clear()

    yield set_
    set_(*saved)


@pytest.mark.parametrize("cc_steps,bcc_steps", [(1, 2), (2, 2), (4, 1)])
@pytest.mark.parametrize("mechanism", ["ecc", "simecc"])
@pytest.mark.parametrize("eps,delta", [(3.0, 1e-3), (10.0, 1e-6), (150.0, 1e-5)])
def test_a_plan_charging_fewer_shift_steps_fails_the_plan_check(
        steps: Any, cc_steps: int, bcc_steps: int, mechanism: str, eps: float,
        delta: float) -> None:
    """The planner's own account agrees with its (wrong) step counts; the audit's
    recomputation uses the proof's 4 and 2 (delta 0.085 for CC at 1 of 4, SimECC at eps 3,
    delta 1e-3). Control: the correct plan passes the same check."""
    cls = ECC if mechanism == "ecc" else SimECC
    good = plan_check(cls(eps, delta, KEY, "g", calibration="tight"), eps, delta)
    assert good.passed and good.delta_delivered <= delta, good
    steps(cc_steps, bcc_steps)
    plan = tight.tight_plan(mechanism, eps, delta)
    assert tight.account(plan).delta_total <= delta  # the planner is fooled
    bad = plan_check(cls(eps, delta, KEY, "b", calibration="tight"), eps, delta)
    assert not bad.passed and bad.delta_delivered > 2 * delta, bad


def test_the_command_names_the_plan_check(steps: Any,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """End to end through the command: exit 1, caught by the plan check (the sampling
    bound stays far below eps, as the issue measured)."""
    steps(1, 2)
    rc = main_audit(["--mechanism", "simecc", "--epsilon", "3", "--delta", "1e-3",
                     "--calibration", "tight", "--backend", "sim", "--runs", "1000",
                     "--no-search", "--json"])
    out = capsys.readouterr()
    assert rc == 1 and "caught by: plan" in out.err, out.err
    assert "cannot fail" not in out.err


# --------------------------------------------------------------------- partition noise


def _noisy_svt(factor: int) -> type[SVT]:
    class QuietSVT(SVT):
        """SVT with the Laplace scales of factor * eps (1/factor of the noise), the
        thresholds of eps."""

        __slots__ = ()

        def __init__(self, eps: float, tau: float, key: NoiseKey, label: str,
                      state: dict[str, Any] | None = None) -> None:
            super().__init__(factor * eps, tau, key, label, state)
            self.eps = eps
            self._b8 = 8.0 / eps
            self._c = math.ceil(12.0 / eps)
            self._g = 8.0 * UNIT / (eps * self._t1)

    return QuietSVT


def quiet_ecc(factor: int) -> type[ECC]:
    svt = _noisy_svt(factor)

    class QuietPart(Part):
        def _new_svt(self, st: dict[str, Any] | None) -> SVT:
            return svt(self.eps_p, part_tau(self.tau, self.l, self.eps_p), self._key,
                       f"{self._label}/svt{self.l}", st)

    class QuietECC(ECC):
        """Control: ECC whose Part draws its SVT noise at 1/factor of the scale."""

        def _new_part(self, key: NoiseKey, label: str, st: dict[str, Any] | None) -> Part:
            return QuietPart(self._params.eps_part, self._params.tau, key, label, st)

    return QuietECC


def quiet_simecc(factor: int) -> type[SimECC]:
    class QuietSimPart(SimPart):
        """Draws DLap at 1/factor of its scale while reporting the right scale: only the
        law check can see it."""

        def _draw(self) -> int:
            t, s = self._scale
            return int(discrete_laplace(self._cur, max(1, t // factor), s))

    class QuietSimECC(SimECC):
        """Control: SimECC whose SimPart has 1/factor of its noise."""

        def _new_part(self, key: NoiseKey, label: str, st: dict[str, Any] | None
                      ) -> SimPart:
            return QuietSimPart(self._sparams.eps_part, self._sparams.mu, key, label, st)

    return QuietSimECC


CASES = [(m, cal, eps) for m in ("ecc", "simecc") for cal in ("paper", "tight")
         for eps in (20.0, 150.0)]


@pytest.mark.parametrize("mechanism,calibration,eps", CASES)
def test_partition_noise_divided_by_2_and_4_fails(mechanism: str, calibration: str,
                                                  eps: float) -> None:
    """The partition law check (windowed KS, 0.001 in all, of every SVT instance or gap of
    300 fresh partitions against an independent sampler of the algorithm's law) rejects a
    partition with 1/2 or 1/4 of its noise and accepts the correct one; for ECC the plan check sees
    the SVT's scale too (SimPart's control hides its scale, so only the law check can)."""
    def law(cls: Any) -> float:
        def part(c: str) -> Any:
            return cls(eps, DELTA, KEY, c, calibration=calibration)._part

        check = ecc_partition_check if mechanism == "ecc" else simecc_partition_check
        return check(part, eps, DELTA, 300, seed=2, calibration=calibration).p_value

    correct = ECC if mechanism == "ecc" else SimECC
    assert law(correct) >= 1e-3
    assert plan_check(correct(eps, DELTA, KEY, "c", calibration=calibration), eps,
                      DELTA).passed
    for factor in (2, 4):
        cls = quiet_ecc(factor) if mechanism == "ecc" else quiet_simecc(factor)
        assert law(cls) < 1e-3, (factor, law(cls))
        pc = plan_check(cls(eps, DELTA, KEY, "q", calibration=calibration), eps, DELTA)
        assert pc.passed is (mechanism == "simecc"), pc


# --------------------------------------------------------------------- real counters PASS


@pytest.mark.parametrize("mechanism", ["ecc", "simecc"])
@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_ecc_and_simecc_pass_every_check(mechanism: str, calibration: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The command at eps = 150 (sim backend for the releases; the plan and law checks
    read core counters; the default pair, the search is tested below): PASS, and it names
    what could have failed it."""
    rc = main_audit(["--mechanism", mechanism, "--epsilon", "150", "--delta", "1e-6",
                     "--calibration", calibration, "--backend", "sim", "--runs", "2000",
                     "--no-search"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "plan: ok" in err and "partition law: ok" in err
    assert "cannot fail" not in err


def test_sampling_bounds_do_not_separate_a_correct_simecc_from_its_plan() -> None:
    """Why the plan check exists: on the releases, the tight SimECC and its control that
    charges CC for 1 of 4 steps look alike (both PASS the sampling bounds at 400 runs)."""
    eps, delta = 3.0, 1e-3
    x0, x1 = make_streams("empty", 1200, 600)
    plan = plan_for("simecc", eps, delta, x0, x1, "values", calibration="tight")
    res = run_audit(sim_backend("simecc", eps, delta, 7, {"calibration": "tight"}), plan,
                    400, eps=eps, delta=delta, alpha=ALPHA)
    assert res.passed and np.isfinite(res.eps_lb), res


# --------------------------------------------------------------------- pair search


def test_pair_search_finds_a_stronger_pair_for_basecc() -> None:
    """Exact objective (the pair's mu under BaseCC's law): the search ranks every
    candidate and picks the maximum; on 600 events the best pair beats the former fixed
    pair (alternating at tick 1). Deterministic."""
    from processor.audit.plans import pair_objective, search_pair

    obj = pair_objective("basecc", 1.0, DELTA, "lr", {}, None, 0)
    best, tried = search_pair(600, 1, obj)
    fixed = next(c for c in tried if (c.pattern, c.at) == ("alternating", 1))
    assert best.objective == max(c.objective for c in tried) > fixed.objective
    assert best.how == "exact mu" and len(tried) >= 10
    # 'ones' at tick 1 moves no prefix sum before the end: scored, not chosen
    ones = next(c for c in tried if (c.pattern, c.at) == ("ones", 1))
    assert ones.objective < best.objective


def test_pair_search_by_pilot_is_keyed_apart(capsys: pytest.CaptureFixture[str]) -> None:
    """ECC (no known law): the command searches on a simulator pilot with another seed,
    reports the pair it used, and the verdict (PASS) is on fresh runs."""
    import orjson

    rc = main_audit(["--mechanism", "ecc", "--epsilon", "150", "--delta", "1e-6",
                     "--calibration", "tight", "--backend", "sim", "--runs", "1000",
                     "--json"])
    cap = capsys.readouterr()
    rep = orjson.loads(cap.out)
    ps = rep["pair_search"]
    assert rc == 0 and ps["pattern"] == rep["pattern"] and ps["at"] == rep["at"]
    assert ps["how"].startswith("pilot") and len(ps["candidates"]) >= 10
    assert "pair search:" in cap.err
