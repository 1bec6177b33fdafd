"""ECC, SimECC and W: skip against ⊥ updates, restore, validation, next_due, accuracy
against the explicit bounds, state growth, the wrapper's end-of-stream padding.

Deterministic checks use fixed seeds. The accuracy check is statistical: the bound holds
for all ticks of a run with probability >= 1 - beta, so the number of failing runs is
compared with the Binomial(R, beta) 99.9% quantile (false-alarm rate <= 0.1%); its control
is a deliberately broken ECC (CC replaced by the interval sum alone) that must fail.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pytest
from scipy import stats

from processor.core.ecc import ECC, SimECC, ecc_part_term, simecc_gap_bound
from processor.core.errors import InvalidInputError, StateFormatError
from processor.core.grid import UNIT, to_units
from processor.core.params import ecc_parameters, simecc_parameters
from processor.core.partition import Part, SimPart, part_tau
from processor.core.rng import NoiseKey
from processor.core.svt import SVT, svt_threshold
from processor.core.wrapper import W, w_padding_shift

EPS_FAST, DELTA_FAST = 200.0, 1e-3  # checkpoints every ~20 events: many events per test
MECHS = [ECC, SimECC]
Mech = type[ECC] | type[SimECC]


def mixed_stream(n: int, seed: int, density: float = 0.5) -> list[float | None]:
    rng = np.random.default_rng(seed)
    out: list[float | None] = []
    for r, v in zip(rng.random(n), rng.random(n), strict=True):
        out.append(None if r >= density else (1.0 if v < 0.7 else round(float(v), 3)))
    return out


def runs_of(xs: list[float | None]) -> list[tuple[float | None, int]]:
    """(value, 1) for an event, (None, k) for a run of k ⊥."""
    out: list[tuple[float | None, int]] = []
    for x in xs:
        if x is None and out and out[-1][0] is None:
            out[-1] = (None, out[-1][1] + 1)
        else:
            out.append((x, 1))
    return out


def test_parameters_are_the_papers() -> None:
    p = ecc_parameters(2.0, 1e-6)
    assert p.eps_part == 2.0 / 51
    assert p.tau == pytest.approx(1 + 408 * math.log(math.pi**2 / 2e-6) / 2.0)
    assert p.cc_eps == p.bcc_eps == pytest.approx(8.0 / 27)
    assert p.cc_delta == pytest.approx(math.exp(-38.0 / 27) * 1e-6 / 16)
    assert p.bcc_delta == pytest.approx(2 * p.cc_delta)
    q = simecc_parameters(2.0, 1e-6)
    assert q.mu == 3 + math.ceil(102 * math.log(2 * math.pi**2 / 3e-6) / 2.0)
    assert (q.eps_part, q.cc_delta) == (p.eps_part, p.cc_delta)


@pytest.mark.parametrize("cls", MECHS)
def test_skip_equals_bottom_updates_draw_for_draw(cls: Mech) -> None:
    """skip(k) and k update(None) give the same releases, changes and state, exactly."""
    key = NoiseKey.from_seed(31)
    a, b = cls(EPS_FAST, DELTA_FAST, key, "c"), cls(EPS_FAST, DELTA_FAST, key, "c")
    xs = mixed_stream(4000, 1, density=0.3)
    for x, k in runs_of(xs):
        if x is not None:
            assert a.update(x) == b.update(x)
            continue
        dense: list[tuple[int, float]] = []
        for _ in range(k):
            before = a.y
            if a.update(None) != before:
                dense.append((a.t, a.y))
        assert b.skip(k) == dense
        assert a.t == b.t and a.y == b.y
    assert a.to_bytes() == b.to_bytes()
    assert a.y > 0  # checkpoints did happen


@pytest.mark.parametrize("cls", MECHS)
def test_next_due_is_pure_and_exact(cls: Mech) -> None:
    """next_due() changes nothing; skipping to just before it changes nothing but t; at
    it, something internal happens (a checkpoint or a release)."""
    key = NoiseKey.from_seed(32)
    m = cls(EPS_FAST, DELTA_FAST, key, "c")
    for x in mixed_stream(300, 2):
        m.update(x)
    hits = dues = 0
    for _ in range(60):
        st = m.to_bytes()
        d = m.next_due()
        assert m.to_bytes() == st and m.next_due() == d
        if d is not None and d - m.t < 10**6:
            y = m.y
            assert m.skip(d - 1 - m.t) == [] and m.y == y
            inner_before = _inner(m)
            m.update(None)
            dues += 1
            hits += _inner(m) != inner_before
        for _ in range(3):
            m.update(1.0)
    assert hits == dues >= 8


def _inner(m: ECC | SimECC) -> Any:
    """Private decision state (test only): partition index and scheduled releases."""
    return (m._part.l, m._sched.to_state(), m._y)


@pytest.mark.parametrize("cls", MECHS)
def test_restore_and_continue_is_identical(cls: Mech) -> None:
    key = NoiseKey.from_seed(33)
    xs = mixed_stream(3000, 3, density=0.4)
    ref = cls(EPS_FAST, DELTA_FAST, key, "c")
    want = [ref.update(x) for x in xs]
    rng = np.random.default_rng(4)
    cuts = sorted(int(c) for c in rng.integers(1, len(xs), 6))
    m = cls(EPS_FAST, DELTA_FAST, key, "c")
    got: list[float] = []
    for i, x in enumerate(xs):
        if i in cuts:
            m.next_due()  # a query in between must not matter either
            m = cls.from_bytes(m.to_bytes(), key)
        got.append(m.update(x))
    assert got == want and m.to_bytes() == ref.to_bytes()


@pytest.mark.parametrize("cls", [*MECHS, W])
def test_invalid_input_raises_and_leaves_state(cls: type[ECC] | type[SimECC] | type[W]) -> None:
    key = NoiseKey.from_seed(34)
    m = cls(EPS_FAST, DELTA_FAST, key, "c")
    for x in mixed_stream(50, 5):
        m.update(x)
    st = m.to_bytes()
    for bad in (float("nan"), float("inf"), -0.1, 1.5, "1", True, [1]):
        with pytest.raises(InvalidInputError):
            m.update(bad)  # type: ignore[arg-type]
        assert m.to_bytes() == st
    for n in (-1, 1.5, True):
        with pytest.raises(InvalidInputError):
            m.skip(n)  # type: ignore[arg-type]
        assert m.to_bytes() == st


def test_state_rejects_other_mechanism() -> None:
    key = NoiseKey.from_seed(35)
    with pytest.raises(StateFormatError):
        SimECC.from_bytes(ECC(1.0, 1e-5, key).to_bytes(), key)


class _IntervalOnlyCC:
    """Broken CC for the control: 'counts' only the last interval sum."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def step(self, u: int) -> int:
        return u

    def alpha(self, beta: float, t: int) -> float:
        return float(self.inner.alpha(beta, t))

    def alpha_max(self, beta: float, t: int) -> float:
        return float(self.inner.alpha_max(beta, t))

    def to_state(self) -> dict[str, Any]:
        return dict(self.inner.to_state())


def accuracy_failures(cls: Mech, broken: bool, runs: int, n: int, seed: int,
                      beta: float) -> int:
    """Number of runs where |y_t - s_t| > error_bound(beta) at some checked tick."""
    key = NoiseKey.from_seed(seed)
    fails = 0
    for r in range(runs):
        m = cls(EPS_FAST, DELTA_FAST, key, f"acc/{r}")
        if broken:
            m._cc = _IntervalOnlyCC(m._cc)  # type: ignore[assignment]
        s = 0
        bad = False
        for i, x in enumerate(mixed_stream(n, 100 + r, density=0.6)):
            s += to_units(x)
            m.update(x)
            if i % 25 == 24 and abs(m.y - s / UNIT) > m.error_bound(beta):
                bad = True
        fails += bad
    return fails


@pytest.mark.parametrize("cls", MECHS)
def test_accuracy_within_the_explicit_bound(cls: Mech) -> None:
    beta, runs = 0.05, 12
    limit = int(stats.binom.ppf(0.999, runs, beta))
    assert accuracy_failures(cls, False, runs, 1500, 36, beta) <= limit
    assert accuracy_failures(cls, True, runs, 1500, 36, beta) > limit  # control


@pytest.mark.parametrize("cls", MECHS)
def test_state_size_grows_logarithmically(cls: Mech) -> None:
    """1%-dense stream at eps = 1, delta = 1e-5: the state at t = 10^6 is small and barely
    larger than at t = 10^4."""
    key = NoiseKey.from_seed(37)
    m = cls(1.0, 1e-5, key, "size")
    rng = np.random.default_rng(7)
    sizes = {}
    for target in (10**4, 10**6):
        while m.t < target:
            m.update(1.0)
            m.skip(min(int(rng.geometric(0.01)) - 1, target - m.t))
        sizes[target] = len(m.to_bytes())
    assert sizes[10**6] < 2500
    assert sizes[10**6] - sizes[10**4] < 500


# ---------------------------------------------------------------------------------- W


def test_w_pads_and_halts() -> None:
    key = NoiseKey.from_seed(38)
    eps, delta = 4.0, 1e-3
    w = W(eps, delta, key, "w")
    for x in mixed_stream(200, 8):
        w.update(x)
    st = w.to_bytes()
    c = w.padding()
    assert c == W.from_bytes(st, key).padding()  # deterministic: a keyed draw
    out = w.end()
    assert len(out) == c and w.t == 200 + c and w.ended
    with pytest.raises(InvalidInputError):
        w.update(None)
    with pytest.raises(InvalidInputError):
        w.skip(1)
    # restore before end and end again: the same padding and releases
    w2 = W.from_bytes(st, key)
    assert w2.end() == out
    # the padding's law: mean near the shift (DLap is symmetric), spread of scale 2/eps
    pads = [W(eps, delta, key, f"p/{i}").padding() for i in range(400)]
    shift = w_padding_shift(eps, delta)
    assert abs(np.mean(pads) - shift) < 0.3 and min(pads) >= 0


# ------------------------------------------------------- the explicit partition constants


def test_simecc_gap_bound_holds_and_control_fails() -> None:
    """Lemma 6.4 with explicit constants: in >= 1 - beta of the runs every SimPart gap with
    index l <= t + 1 is <= simecc_gap_bound(beta, t). Failing runs are compared with the
    Binomial(R, beta) 99.9% quantile (false-alarm rate <= 0.1%). Control: the bound without
    its noise allowance (mu + ceil(4 ln(l)/eps_p)) fails in most runs."""
    eps, delta, beta, t, runs = 51.0, 1e-3, 0.05, 300, 1000
    p = simecc_parameters(eps, delta)
    bound = simecc_gap_bound(eps, delta, beta, t)
    key = NoiseKey.from_seed(39)
    fails = fails_ctrl = 0
    for r in range(runs):
        sp = SimPart(p.eps_part, p.mu, key, f"g/{r}")
        prev, bad, bad_ctrl = 0, False, False
        while sp.l <= t + 1 and prev <= t:
            nxt = sp.next_due()
            gap = nxt - prev
            bad |= gap > bound
            bad_ctrl |= gap > p.mu + math.ceil(4 * math.log(sp.l) / p.eps_part)
            sp.advance(nxt - 1 - sp.t)
            sp.step()
            prev = nxt
        fails += bad
        fails_ctrl += bad_ctrl
    limit = int(stats.binom.ppf(0.999, runs, beta))
    assert fails <= limit < fails_ctrl


def test_ecc_part_term_holds_and_control_fails() -> None:
    """Lemma 4.4 1(b) with explicit constants: whenever Part answers ⊥ at tick t, its
    intsum is <= ecc_part_term(beta, t), in >= 1 - beta of the runs (same binomial check).
    Control: the term without its noise allowance (threshold only) fails in most runs."""
    eps, delta, beta, ticks, runs = 200.0, 1e-3, 0.05, 150, 120
    p = ecc_parameters(eps, delta)
    key = NoiseKey.from_seed(40)
    fails = fails_ctrl = 0
    for r in range(runs):
        part = Part(p.eps_part, p.tau, key, f"pt/{r}")
        bad = bad_ctrl = False
        for t in range(1, ticks + 1):
            if not part.step(UNIT):
                s = part.intsum / UNIT
                bad |= s > ecc_part_term(eps, delta, beta, t)
                thr = svt_threshold(p.eps_part, part_tau(p.tau, part.l, p.eps_part), t)
                bad_ctrl |= s > thr
        fails += bad
        fails_ctrl += bad_ctrl
    limit = int(stats.binom.ppf(0.999, runs, beta))
    assert fails <= limit < fails_ctrl


@pytest.mark.parametrize("cls", [ECC, SimECC])
@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_advance_state_equals_skip_on_the_decoded_state(cls: type[ECC] | type[SimECC],
                                                        calibration: str) -> None:
    """`advance_state` (k ⊥ ticks on the encoded state, no noise key) gives the bytes of
    decode, skip(k), encode wherever it answers, for every k short of next_due() from
    states along seeded sparse streams (runs of ⊥ of every length, checkpoints, scheduled
    releases). It answers for most quiet states past an SVT's dense prefix (so the check
    is not vacuous), and refuses every k that reaches next_due() (there the skip draws
    or releases: a control it must reject). Deterministic: fixed seeds, no false alarms."""
    rng = np.random.default_rng(7)
    key = NoiseKey.from_seed(3)
    answered = refused_due = 0
    for seed in range(6):
        c = cls(1.0, 1e-6, key, f"adv{seed}", calibration=calibration)
        for x in mixed_stream(400, seed, density=0.05):
            c.update(x)
            if rng.random() > 0.2:
                continue
            data = c.to_bytes()
            due = c.next_due()
            gap = None if due is None else due - c.t
            ks = {0, 1, 5, 1000} if gap is None else {0, 1, 5, gap - 1, gap, gap + 3}
            for k in ks:
                if k < 0:
                    continue
                got = cls.advance_state(data, k)
                if gap is not None and k >= gap:
                    assert got is None
                    refused_due += 1
                    continue
                if got is None:
                    continue
                ref = cls.from_bytes(data, key)
                assert ref.skip(k) == []
                assert got == ref.to_bytes()
                answered += 1
    # ECC's ⊥ runs mostly never fire (next_due() None): its refusals are SimECC's.
    assert answered > 100 and (cls is ECC or refused_due > 20)
    # Another mechanism's state, and a corrupt one, are refused.
    other = SimECC if cls is ECC else ECC
    assert cls.advance_state(other(1.0, 1e-6, key, "o").to_bytes(), 1) is None
    assert cls.advance_state(b"DPS\x03{", 1) is None


@pytest.mark.parametrize("cls", [ECC, SimECC])
@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_idle_view_is_what_the_decoded_state_answers(cls: type[ECC] | type[SimECC],
                                                     calibration: str) -> None:
    """`idle_view` (read off the encoded state, no noise key) equals the decoded
    counter's mechanism, eps, delta, t, y, next_due() and bound_key() wherever it
    answers, on states along seeded sparse streams (checkpoints, scheduled releases,
    long ⊥ runs by skip). It answers for most states past an SVT's dense prefix (the
    check is not vacuous) and never inside it, where next_due() needs the key's draws
    (the control: ECC states within the prefix are refused). Deterministic: fixed seeds."""
    key = NoiseKey.from_seed(5)
    answered = refused_prefix = 0
    for seed in range(6):
        c = cls(1.0, 1e-6, key, f"view{seed}", calibration=calibration)
        for i, x in enumerate(mixed_stream(300, seed, density=0.05)):
            c.update(x)
            if i % 37 == 0:
                c.skip(i)
            data = c.to_bytes()
            got = cls.idle_view(data)
            svt = orjson.loads(data[4:])["part"].get("svt")
            if svt is not None and svt["r"] < SVT.prefix:
                assert got is None
                refused_prefix += 1
                continue
            if got is None:
                continue
            ref = cls.from_bytes(data, key)
            assert got == (ref.mechanism, ref.eps, ref.delta, ref.t, ref.y, ref.next_due(),
                           ref.bound_key())
            answered += 1
    assert answered > 300 and (cls is SimECC or refused_prefix > 20)
    other = SimECC if cls is ECC else ECC
    assert cls.idle_view(other(1.0, 1e-6, key, "o").to_bytes()) is None
    assert cls.idle_view(b"DPS\x03{") is None


@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_keyed_view_and_advance_inside_the_dense_prefix(calibration: str) -> None:
    """With the noise key, `idle_view` and `advance_state` also answer for ECC states
    whose SVT is inside its ⊥ run's dense prefix (a counter just created, or a few ticks
    after an event), restoring the partition alone: the view equals the decoded
    counter's answers and the advanced bytes those of decode, skip(k), encode, for k
    inside the prefix, across its end and far beyond; a k that reaches next_due() is
    refused. Every such state answers (the key is all the keyless path lacked).
    Control: the same comparisons with another key's answers fail on most states (the
    prefix's draws and where the plan starts are the key's). Deterministic: fixed seeds."""
    key, other = NoiseKey.from_seed(11), NoiseKey.from_seed(12)
    answered = advanced = refused_due = differs = 0
    states: list[bytes] = []
    for seed in range(8):
        # large eps: SVTs that fire soon (next_due() inside the prefix and past it)
        c = ECC(1.0 if seed % 2 else 500.0, 1e-6, key, f"pre{seed}", calibration=calibration)
        states.append(c.to_bytes())
        for i, x in enumerate(mixed_stream(200, seed, density=0.1 if seed % 2 else 0.5)):
            c.update(x)
            if orjson.loads(c.to_bytes()[4:])["part"]["svt"]["r"] < SVT.prefix or i % 50 == 0:
                states.append(c.to_bytes())
    for data in states:
        svt = orjson.loads(data[4:])["part"]["svt"]
        ref = ECC.from_bytes(data, key)
        want = (ref.mechanism, ref.eps, ref.delta, ref.t, ref.y, ref.next_due(),
                ref.bound_key())
        got = ECC.idle_view(data, key)
        assert got == want
        inside = svt["r"] < SVT.prefix
        if inside:
            assert ECC.idle_view(data) is None
            answered += 1
            wrong = ECC.idle_view(data, other)
            differs += wrong is None or wrong != want
        due = ref.next_due()
        gap = None if due is None else due - ref.t
        for k in {1, 3, SVT.prefix - svt["r"], SVT.prefix + 1, 40, 1000} | (
                set() if gap is None else {gap - 1, gap, gap + 2}):
            if k < 1:
                continue
            moved = ECC.advance_state(data, k, key)
            if gap is not None and k >= gap:
                assert moved is None
                refused_due += 1
                continue
            assert moved is not None
            dec = ECC.from_bytes(data, key)
            assert dec.skip(k) == []
            assert moved == dec.to_bytes()
            advanced += inside
            if inside:
                wrong_moved = ECC.advance_state(data, k, other)
                differs += wrong_moved != moved
    assert answered > 100 and advanced > 300 and refused_due > 0
    assert differs > (answered + advanced) // 2


def _skip_run(cls: Mech, seed: int) -> list[bytes]:
    """A counter of random (eps, delta, calibration) from seed: events, then skips (some
    right after others, the first from the fresh counter), the state and changes after
    each."""
    rng = np.random.default_rng(seed)
    eps = float(rng.choice([0.5, 1.0, 4.0, 10.0, EPS_FAST]))
    delta = float(rng.choice([1e-9, 1e-6, 1e-3]))
    cal = str(rng.choice(["paper", "tight"]))
    c = cls(eps, delta, NoiseKey.from_seed(seed), f"skip{seed}", calibration=cal)
    out = [orjson.dumps(c.skip(int(rng.integers(0, 200_000)))), c.to_bytes()]
    for _ in range(3):
        for x in mixed_stream(int(rng.integers(0, 400)), seed + 1000 * len(out)):
            c.update(x)
        for _ in range(int(rng.integers(1, 3))):
            out += [orjson.dumps(c.skip(int(rng.integers(0, 60_000)))), c.to_bytes()]
    c.update(1.0)
    return [*out, c.to_bytes(), orjson.dumps(c.y)]


@pytest.mark.parametrize("cls", MECHS)
def test_skip_with_the_fast_sampler_is_the_reference_s_byte_for_byte(
        cls: Mech, monkeypatch: pytest.MonkeyPatch) -> None:
    """The BLT counters inside CC and BCC draw with samplers.scalar.rounded_gaussian (the
    fast path); with the reference sampler instead, every skip (from a fresh counter,
    after events, back to back) leaves the same bytes and reports the same changes, and
    the next release is the same. Control: a fast path that reads a tied lazy uniform's
    digits in the other order is the sampler tests' control (test_base_blt.py); here, a
    sampler off by one ulp in the draws that end on an odd position must change the
    bytes (so the runs do draw)."""
    from processor.core import blt
    from processor.core.samplers import scalar

    seeds = range(10)
    fast = [_skip_run(cls, s) for s in seeds]
    monkeypatch.setattr(blt, "rounded_gaussian", scalar.rounded_gaussian_reference)
    assert [_skip_run(cls, s) for s in seeds] == fast

    def off_by_one(cur: Any, scale: int) -> int:
        v = scalar.rounded_gaussian_reference(cur, scale)
        return v + 1 if cur.position % 2 else v

    monkeypatch.setattr(blt, "rounded_gaussian", off_by_one)
    assert [_skip_run(cls, s) for s in seeds] != fast
