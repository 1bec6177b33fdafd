"""Part (Algorithm 3), SimPart (Algorithm 5) and schedList (Algorithm 4).

Statistical checks: fixed seeds, chi-square against the exact law, reject at p < 1e-3
(false-alarm rate 0.1% per check for a correct implementation). Every one has a control:
the same samples against the law with a deliberately wrong constant must be rejected.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from processor.core.grid import UNIT
from processor.core.partition import Part, SimPart, part_tau, simpart_gap, simpart_scale
from processor.core.rng import NoiseKey
from processor.core.schedule import SchedList
from tests.core.test_svt import ALPHA, chi2_p, histogram, svt_first_fire_law

EPS_P = 8.0
TAU = 1.0
K = 10
N_RUNS = 2000

# ⊥ runs, zeros and events: intsum 1,1,1,2,2,3,4,4,4,4 (events)
PATTERN: list[int] = [UNIT, 0, 0, UNIT, 0, UNIT, UNIT, 0, 0, 0]


def intsums(xs: list[int]) -> list[int]:
    out, s = [], 0
    for u in xs:
        s += u
        out.append(s)
    return out


def part_first_checkpoints(seed: int, dense: bool) -> list[int | None]:
    key = NoiseKey.from_seed(seed)
    out: list[int | None] = []
    for i in range(N_RUNS):
        p = Part(EPS_P, TAU, key, f"p/{i}")
        f = None
        for t, u in enumerate(PATTERN, start=1):
            if p.step_dense(u) if dense else p.step(u):
                f = t
                break
        out.append(f)
    return out


def test_part_tau() -> None:
    assert part_tau(3.0, 1, 0.5) == 3.0
    assert part_tau(3.0, 4, 0.5) == 3.0 + 32.0 * math.log(4)


def test_part_first_checkpoint_law_plan_and_dense() -> None:
    """First checkpoint on a stream with ⊥ runs: the ⊥-ticks-follow-the-plan path and
    the all-dense path both fit the exact SVT_1 law; control: constant 4 instead of 8."""
    law = svt_first_fire_law(EPS_P, part_tau(TAU, 1, EPS_P), intsums(PATTERN))
    wrong = svt_first_fire_law(EPS_P, part_tau(TAU, 1, EPS_P), intsums(PATTERN), const=4.0)
    for dense, seed in ((False, 21), (True, 22)):
        h = histogram(part_first_checkpoints(seed, dense), K)
        assert chi2_p(h, law) > ALPHA
        assert chi2_p(h, wrong) < ALPHA


def test_part_restarts_with_the_next_threshold() -> None:
    """All-ones input: the first checkpoint follows SVT_1's law and the gap to the second
    SVT_2's (threshold tau + 16 ln 2 / eps_p, intsum restarted at 0). Control: the gap law
    with 8 ln 2 (a wrong restart threshold) is rejected."""
    key = NoiseKey.from_seed(23)
    first: list[int | None] = []
    gaps: list[int | None] = []
    for i in range(N_RUNS):
        p = Part(EPS_P, TAU, key, f"q/{i}")
        marks: list[int] = []
        for t in range(1, 2 * K + 1):
            if p.step(UNIT):
                marks.append(t)
                if len(marks) == 2:
                    break
        assert p.l == len(marks) + 1
        first.append(marks[0] if marks and marks[0] <= K else None)
        if marks and marks[0] <= K:  # then a gap <= K is seen within 2K ticks
            g = marks[1] - marks[0] if len(marks) > 1 else None
            gaps.append(g if g is not None and g <= K else None)
    ones = [s * UNIT for s in range(1, K + 1)]
    assert chi2_p(histogram(first, K), svt_first_fire_law(EPS_P, TAU, ones)) > ALPHA
    hg = histogram(gaps, K)
    assert chi2_p(hg, svt_first_fire_law(EPS_P, part_tau(TAU, 2, EPS_P), ones)) > ALPHA
    wrong_tau = TAU + 8.0 * math.log(2) / EPS_P
    assert chi2_p(hg, svt_first_fire_law(EPS_P, wrong_tau, ones)) < ALPHA


def test_part_skip_to_fire_law() -> None:
    """Part.skip_to_fire (SVT.first_fire) after one event: the exact law again."""
    key = NoiseKey.from_seed(24)
    times: list[int | None] = []
    for i in range(N_RUNS):
        p = Part(EPS_P, TAU, key, f"s/{i}")
        if p.step(2 * UNIT):
            times.append(1)
            continue
        f = p.skip_to_fire(K - 1)
        times.append(f)
    inputs = [2 * UNIT] * K
    assert chi2_p(histogram(times, K), svt_first_fire_law(EPS_P, TAU, inputs)) > ALPHA
    assert chi2_p(histogram(times, K),
                  svt_first_fire_law(EPS_P, TAU, inputs, const=4.0)) < ALPHA


# ------------------------------------------------------------------------------ SimPart

SP_EPS = 1.0
SP_MU = 6


def dlap_int_pmf(t: int, s: int, lo: int, hi: int) -> dict[int, float]:
    q = math.exp(-s / t)
    return {z: (1 - q) / (1 + q) * q ** abs(z) for z in range(lo, hi + 1)}


def gap_law(l: int, c4: bool = True) -> npt.NDArray[np.float64]:  # noqa: E741
    """Exact law of the l-th SimPart gap on bins 1..30 and '> 30'."""
    t, s = simpart_scale(SP_EPS)
    shift = SP_MU + (math.ceil(4 * math.log(l) / SP_EPS) if c4 else 0)
    law = np.zeros(31)
    for z, p in dlap_int_pmf(t, s, -400, 400).items():
        g = max(1, shift + z)
        law[min(g, 31) - 1] += p
    return law


def test_simpart_gaps_match_exact_law() -> None:
    """t_1 = max(1, mu + Z_1) and t_2 - t_1 = max(1, mu + ceil(4 ln 2/eps) + Z_2) exactly;
    control: the second gap without the ceil(4 ln(l)/eps) term is rejected."""
    assert simpart_gap(SP_MU, 2, SP_EPS, -1) == SP_MU + 3 - 1
    key = NoiseKey.from_seed(25)
    g1: list[int | None] = []
    g2: list[int | None] = []
    for i in range(5000):
        sp = SimPart(SP_EPS, SP_MU, key, f"sp/{i}")
        a = sp.next_due()
        sp.advance(a - 1)
        assert sp.step()
        b = sp.next_due()
        g1.append(a if a <= 30 else None)
        g2.append(b - a if b - a <= 30 else None)
    assert chi2_p(histogram(g1, 30), gap_law(1)) > ALPHA
    assert chi2_p(histogram(g2, 30), gap_law(2)) > ALPHA
    assert chi2_p(histogram(g2, 30), gap_law(2, c4=False)) < ALPHA


def test_simpart_advance_equals_steps_draw_for_draw() -> None:
    key = NoiseKey.from_seed(26)
    a, b = SimPart(SP_EPS, SP_MU, key, "x"), SimPart(SP_EPS, SP_MU, key, "x")
    marks_a = [t for t in range(1, 2001) if a.step()]
    marks_b = []
    while b.next_due() <= 2000:
        b.advance(b.next_due() - 1 - b.t)
        assert b.step()
        marks_b.append(b.t)
    b.advance(2000 - b.t)
    assert marks_a == marks_b and a.to_state() == b.to_state()
    c = SimPart(SP_EPS, SP_MU, key, "x", a.to_state())
    assert [c.step() for _ in range(300)] == [a.step() for _ in range(300)]


# ---------------------------------------------------------------------------- schedList


def test_schedlist() -> None:
    s = SchedList()
    assert s.check(5) is None and s.next_after(0) is None
    s.update(7, 10)
    s.update(7, 4)
    s.update(9, 1)
    s.update(3, 2)
    assert s.check(7) == 10 and s.check(3) == 2 and s.check(8) is None
    assert s.next_after(3) == 7 and s.next_after(7) == 9 and s.next_after(9) is None
    s.compact(7)
    assert len(s) == 1 and s.check(7) is None and s.check(9) == 1
    assert SchedList.from_state(s.to_state()).to_state() == s.to_state() == [[9, 1]]
