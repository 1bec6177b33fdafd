"""The admission gate of open keys (processor/core/selection.py, docs/open-keys.md).

Exact: the failure schedule sums to at most delta0 (rationals); the threshold covers every
index's tail bound and never decreases; the tail bound holds for the discrete Gaussian (its
pmf summed exactly); the total guarantee, with the release's delta recomputed by
dp-accounting, stays within the target. Statistical (fixed seeds, false-alarm rates in
each test): a key without events is admitted at most at rate delta0 over a long horizon,
while a per-tick threshold (control) admits far more; an admitted key publishes its whole
count. Restore and continue equals never stopping.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
from scipy.special import ndtri
from scipy.stats import binom

from processor.core.bounds import simecc_bound
from processor.core.cc import cc_sigma
from processor.core.ecc import ECC, SimECC
from processor.core.errors import (
    InvalidInputError,
    InvalidParameterError,
    StateFormatError,
    StateParameterError,
)
from processor.core.grid import UNIT
from processor.core.params import simecc_parameters
from processor.core.rng import NoiseKey
from processor.core.selection import (
    OpenKey,
    admission_threshold,
    failure_share,
    gate_delta0,
    replay,
    schedule_sum,
    selection_delta,
)
from processor.core.tight import tight_plan
from tests.core.test_accounting_external import _external

EPS, DELTA = 10.0, 1e-6


def _plan(eps: float = EPS, delta: float = DELTA / 2,
          calibration: str = "tight") -> tuple[float, float]:
    p = simecc_parameters(eps, delta, calibration)
    return p.cc_eps, p.cc_delta


def test_schedule_sums_to_at_most_delta0_exactly() -> None:
    d0 = Fraction(1, 10**7)
    total = Fraction(0)
    for l in range(1, 2001):  # noqa: E741
        total += failure_share(d0, l)
        assert total == schedule_sum(d0, l) < d0
    assert schedule_sum(d0, 10**18) < d0
    with pytest.raises(InvalidParameterError):
        failure_share(d0, 0)


@pytest.mark.parametrize("base", ["blt", "tree"])
def test_threshold_covers_every_index_and_never_decreases(base: str) -> None:
    cc_eps, cc_delta = _plan()
    d0 = 1e-7
    prev = 0
    ts = list(range(1, 600)) + [2**j + o for j in range(10, 41, 3) for o in (-1, 0, 1)]
    for t in ts:
        a = admission_threshold(cc_eps, cc_delta, base, t, d0)
        assert a >= prev
        prev = a
    for t in (1, 7, 100, 513, 4096):
        a = admission_threshold(cc_eps, cc_delta, base, t, d0)
        for l in range(1, t + 1):  # noqa: E741
            sd = cc_sigma(cc_eps, cc_delta, l, base, UNIT)
            h = sd * math.sqrt(2.0 * math.log(l * (l + 1) / d0)) + 1.0
            assert a >= h


@pytest.mark.parametrize("sigma", [0.7, 3.0, 12.5, 40.0])
def test_tail_bound_holds_for_the_discrete_gaussian(sigma: float) -> None:
    """P(X > x) <= exp(-x^2 / (2 sigma^2)) for X ~ N_Z(0, sigma^2) (its MGF is at most the
    continuous one's): the pmf summed to 40 sigma, where the rest is below 1e-300."""
    top = int(40 * sigma) + 40
    w = [math.exp(-z * z / (2 * sigma * sigma)) for z in range(-top, top + 1)]
    norm = math.fsum(w)
    for x in range(0, int(8 * sigma) + 2):
        tail = math.fsum(w[top + x + 1:]) / norm
        assert tail <= math.exp(-x * x / (2 * sigma * sigma)) * (1 + 1e-12)


def test_total_guarantee_with_dp_accounting() -> None:
    """Half the target delta to the releases, half to the gate: the release's delta
    recomputed with dp-accounting (tests/core/test_accounting_external.py) plus the gate's
    term stays within the target (1e-3 relative: the PLD's discretisation)."""
    for eps, delta in ((1.0, 1e-6), (10.0, 1e-6), (6.0, 1e-9)):
        for mech in ("ecc", "simecc"):
            plan = tight_plan(mech, eps, delta / 2)
            _, _, released = _external(plan)
            d0 = gate_delta0(eps, delta / 2)
            assert (1 + math.exp(eps)) * d0 <= delta / 2
            assert selection_delta(eps, released, d0) <= delta * (1 + 1e-3)
    # user mode: m keys per unit each pay the gate's term
    d0 = gate_delta0(4.0, 5e-7, keys=8)
    assert selection_delta(4.0, 5e-7, d0, keys=8) <= 1e-6 * (1 + 1e-15)
    assert selection_delta(4.0, 5e-7, d0, keys=9) > 1e-6


class _PerTick(OpenKey):
    """Control: the one-release quantile at the current index (about t/37 for this plan),
    with no union over the releases."""

    __slots__ = ()

    def threshold(self, t: int) -> int:
        cc_eps, cc_delta = _plan()
        z = float(-ndtri(self.delta0))
        return math.ceil(z * cc_sigma(cc_eps, cc_delta, max(1, t // 37), "blt", UNIT))


def _zero_keys(n: int, horizon: int, d0: float, gate: type[OpenKey] = OpenKey) -> int:
    admitted = 0
    for s in range(n):
        c = SimECC(EPS, DELTA / 2, NoiseKey.from_seed(1000 + s), f"zero-{s}", "tight")
        k = gate.first_seen(c, d0, 1)
        k.update(None)
        k.skip(horizon - 1)
        admitted += k.admitted is not None
    return admitted


def test_key_without_events_is_rarely_admitted_and_a_per_tick_gate_is_caught() -> None:
    """60 SimECC keys without events over 2^14 ticks (about 440 releases each) at
    delta0 = 0.2: at most binom.ppf(1 - 1e-3, 60, 0.2) admitted (false alarm <= 1e-3).
    Control: a per-tick threshold (the one-release 0.2-quantile) admits more than that
    (it is crossed by one of hundreds of releases nearly surely)."""
    n, horizon, d0 = 60, 1 << 14, 0.2
    limit = int(binom.ppf(1 - 1e-3, n, d0))
    assert _zero_keys(n, horizon, d0) <= limit
    assert _zero_keys(n, horizon, d0, _PerTick) > limit


def test_admitted_key_publishes_its_whole_count() -> None:
    """40 keys first seen at tick 5000 with 1500 events, then 3000 ⊥ ticks: each is
    admitted and its last published value is within the per-tick bound of SimECC at
    beta = 0.01 of the true count (at most binom.ppf(1 - 1e-3, 40, 0.01) = 3 outside:
    false alarm <= 1e-3). A release counting from admission on would miss the events
    before it (at least the threshold, several hundred events) and fail."""
    outside = 0
    for s in range(40):
        c = SimECC(EPS, DELTA / 2, NoiseKey.from_seed(s), f"key-{s}", "tight")
        k = OpenKey.first_seen(c, 1e-7, 5000)
        pub = []
        for _ in range(1500):
            pub += k.update(1.0)
        pub += k.skip(3000)
        assert k.admitted is not None and pub and pub[0][0] == k.admitted
        assert pub[0][1] * UNIT > k.threshold(k.admitted)
        bound = simecc_bound(EPS, DELTA / 2, 0.01, k.counter.t, "blt", "tight")
        outside += abs(pub[-1][1] - 1500) > bound
    assert outside <= int(binom.ppf(1 - 1e-3, 40, 0.01))


@pytest.mark.parametrize("mech", [ECC, SimECC])
def test_restore_and_continue_is_never_stopping(mech: type[ECC] | type[SimECC]) -> None:
    key = NoiseKey.from_seed(7)

    def fresh() -> OpenKey:
        return OpenKey.first_seen(mech(EPS, DELTA / 2, key, "k", "tight"), 1e-7, 300)

    steps = [("u", 1.0)] * 900 + [("s", 500)] + [("u", None)] * 50 + [("u", 1.0)] * 400
    ref = fresh()
    full = []
    for op, v in steps:
        full += ref.update(v) if op == "u" else ref.skip(int(v or 0))
    for cut in (0, 1, 450, 900, 901, 951, 1200):
        k = fresh()
        got = []
        for op, v in steps[:cut]:
            got += k.update(v) if op == "u" else k.skip(int(v or 0))
        k = OpenKey.from_bytes(k.to_bytes(), key)
        for op, v in steps[cut:]:
            got += k.update(v) if op == "u" else k.skip(int(v or 0))
        assert got == full and k.to_bytes() == ref.to_bytes()
    assert ref.admitted is not None


def test_bad_parameters_and_states_are_refused() -> None:
    key = NoiseKey.from_seed(1)
    with pytest.raises(InvalidParameterError):
        OpenKey.first_seen(SimECC(EPS, DELTA, key, "k"), 0.0, 1)
    with pytest.raises(InvalidParameterError):
        OpenKey.first_seen(SimECC(EPS, DELTA, key, "k"), 1e-7, 0)
    c = SimECC(EPS, DELTA, key, "k")
    c.update(None)
    with pytest.raises(InvalidParameterError):
        OpenKey.first_seen(c, 1e-7, 5)
    with pytest.raises(InvalidParameterError):
        admission_threshold(1.0, 1e-7, "sqrt", 10, 1e-7)
    k = OpenKey.first_seen(SimECC(EPS, DELTA, key, "k"), 1e-7, 3)
    k.update(1.0)
    k.update(None)
    good = k.to_bytes()
    for bad in (good[:-3], good.replace(b'"f":3', b'"f":0'),
                good.replace(b'"d0":1e-7', b'"d0":2.0'), good.replace(b'"c":"', b'"c":"!')):
        with pytest.raises(StateFormatError):
            OpenKey.from_bytes(bad, key)
    # delta0 as the stored float only (an int or a bool is no state to_bytes writes).
    for bad in (good.replace(b'"d0":1e-7', b'"d0":1'), good.replace(b'"d0":1e-7', b'"d0":true')):
        with pytest.raises(StateFormatError):
            OpenKey.from_bytes(bad, key)
    # A state stored under another gate's delta0 is refused, not continued under it.
    assert OpenKey.from_bytes(good, key, 1e-7).to_bytes() == good
    with pytest.raises(StateParameterError) as err:
        OpenKey.from_bytes(good, key, 2e-7)
    assert err.value.field == "delta0"


def test_bad_accounting_inputs_are_refused() -> None:
    for eps, keys in ((0.0, 1), (701.0, 1), (1.0, 0)):
        with pytest.raises(InvalidParameterError):
            selection_delta(eps, 1e-7, 1e-9, keys)
        with pytest.raises(InvalidParameterError):
            gate_delta0(eps, 1e-7, keys)
    with pytest.raises(InvalidParameterError):
        gate_delta0(1.0, 0.0)


def _stepped(mech: type[ECC] | type[SimECC], calibration: str, inputs: list[int], t: int,
             rng: random.Random) -> bytes:
    """The counter run uninterrupted through tick t, its ⊥ runs cut at random into
    single update(None) steps and skips of random lengths (as markers cut them), with
    `inputs` ([tick, units, ...]) at their ticks: its state."""
    c = mech(4.0, 1e-6, NoiseKey.from_seed(11), "pages[k]", calibration=calibration)
    at = dict(zip(inputs[::2], inputs[1::2], strict=True))
    while c.t < t:
        u = at.get(c.t + 1)
        if u is not None:
            c.update_units(u)
            continue
        stop = min([t] + [tick - 1 for tick in at if tick > c.t])
        if rng.random() < 0.3:
            c.update(None)
        else:
            c.skip(rng.randint(0, stop - c.t))
    return c.to_bytes()


@pytest.mark.parametrize("mech", [ECC, SimECC])
@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_replay_of_the_inputs_is_the_uninterrupted_counter(
        mech: type[ECC] | type[SimECC], calibration: str) -> None:
    """`replay` (a fresh counter, its inputs, exact skips between) gives, byte for byte,
    the state of the counter stepped uninterrupted with the same inputs, its ⊥ runs cut
    anywhere: over 30 random patterns (0 to 6 inputs of random size over up to 3,000
    ticks, seed 5). Control: the replay that drops one input differs from it in every
    pattern with an input."""
    rng = random.Random(5)
    dropped = 0
    for _ in range(30):
        t = rng.randint(1, 3000)
        ticks = sorted(rng.sample(range(1, t + 1), min(t, rng.randint(0, 6))))
        inputs = [v for tick in ticks for v in (tick, rng.choice([UNIT, 1, UNIT // 2]))]
        want = _stepped(mech, calibration, inputs, t, rng)
        fresh = mech(4.0, 1e-6, NoiseKey.from_seed(11), "pages[k]", calibration=calibration)
        assert replay(fresh, inputs, t).to_bytes() == want
        if inputs:
            drop = 2 * rng.randrange(len(inputs) // 2)
            fewer = inputs[:drop] + inputs[drop + 2:]
            fresh = mech(4.0, 1e-6, NoiseKey.from_seed(11), "pages[k]",
                         calibration=calibration)
            assert replay(fresh, fewer, t).to_bytes() != want
            dropped += 1
    assert dropped >= 20


def test_replay_refuses_bad_inputs_before_stepping() -> None:
    c = ECC(4.0, 1e-6, NoiseKey.from_seed(11), "k")
    for inputs, t in (([3, UNIT, 2, UNIT], 5), ([0, UNIT], 5), ([6, UNIT], 5),
                      ([2, UNIT + 1], 5), ([2], 5), ([2, True], 5)):
        with pytest.raises(InvalidInputError):
            replay(c, inputs, t)
        assert c.t == 0
    c.skip(1)
    with pytest.raises(InvalidParameterError):
        replay(c, [], 5)
