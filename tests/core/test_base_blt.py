"""The BLT base counter (processor/core/blt.py): exactness, restore, sigma against the square
root, and the law of its noise.

Statistical tests: Kolmogorov-Smirnov at a false-alarm rate of 1e-3 each (critical value
1.949 / sqrt(N), asymptotic; the lattice of the rounded draws moves the statistic by less
than 1e-3 of that), fixed seeds, so each run is deterministic; each has broken variants it
must reject.
"""

from __future__ import annotations

import math
from array import array
from fractions import Fraction

import numpy as np
import pytest
from scipy.special import ndtr

from processor.core import blt
from processor.core.blt import (
    BLTCounter,
    blt_col_norm2,
    blt_gauss_sigma,
    blt_reference,
    blt_row_norm2,
    sqrt_norm2_at,
)
from processor.core.bounded import tree_levels
from processor.core.cc import BCC, DEFAULT_BASE, UnboundedCC, cc_sigma
from processor.core.errors import StateFormatError
from processor.core.grid import UNIT
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers import scalar as samplers

KEY = NoiseKey.from_seed(7)
KS_CRIT = 1.949  # sqrt(-ln(1e-3 / 2) / 2): P(sqrt(N) D > 1.949) ~ 1e-3 under the null


def _inputs(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    choice = [0, 0, UNIT, UNIT, UNIT // 2, 19661]
    return [choice[i] for i in rng.integers(0, len(choice), n)]


def _exact_c(n: int) -> list[Fraction]:
    one = Fraction(1, 1 << blt.PARAM_BITS)
    th = [Fraction(v) * one for v in blt.THETA_NUM]
    om = [Fraction(v) * one for v in blt.OMEGA_NUM]
    return [Fraction(1)] + [sum((o * t ** (k - 1) for o, t in zip(om, th, strict=True)),
                                Fraction(0)) for k in range(1, n)]


# --------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("eps", [1.0, 60.0])
def test_fast_counter_equals_the_dense_reference(eps: float) -> None:
    xs = _inputs(70, 1)
    c = BLTCounter(eps, 1e-5, 100, KEY, f"ref{eps}")
    want = blt_reference(c, KEY, xs)
    assert [c.step(u) for u in xs] == want


def test_encoder_error_within_its_bound() -> None:
    """|w~_t - (C x)_t| <= ENC_ERR_ULPS ulps (what the sensitivity adds), on a stream that
    fills the buffers: ones for 250 ticks. (C x)_t exactly, from exact buffers."""
    one = Fraction(1, 1 << blt.PARAM_BITS)
    th = [Fraction(v) * one for v in blt.THETA_NUM]
    om = [Fraction(v) * one for v in blt.OMEGA_NUM]
    exact_buf = [Fraction(0)] * len(th)
    enc = BLTCounter(1.0, 1e-5, 250, KEY, "enc")
    worst = Fraction(0)
    for _ in range(250):
        w = enc.encode(UNIT)
        exact = UNIT + sum((o * b for o, b in zip(om, exact_buf, strict=True)), Fraction(0))
        exact_buf = [t * b + UNIT for t, b in zip(th, exact_buf, strict=True)]
        worst = max(worst, abs(w - exact * (1 << blt.FRAC_BITS)))
    assert 0 < worst <= blt.ENC_ERR_ULPS


def test_column_norm_against_60_digit_arithmetic() -> None:
    """The sensitivity's column norm (privacy-relevant) at long horizons: the closed form
    in 60-digit decimal arithmetic from the exact dyadic constants."""
    from decimal import Decimal, localcontext

    with localcontext() as ctx:
        ctx.prec = 60
        one = Decimal(2) ** (2 * blt.PARAM_BITS)
        for n in (10**4, 10**7, 1 << 36):
            total = Decimal(1)
            for oi, ti in zip(blt.OMEGA_NUM, blt.THETA_NUM, strict=True):
                for oj, tj in zip(blt.OMEGA_NUM, blt.THETA_NUM, strict=True):
                    r = Decimal(ti * tj) / one
                    total += Decimal(oi * oj) / one * (1 - r ** (n - 1)) / (1 - r)
            assert blt_col_norm2(n) == pytest.approx(float(total), rel=1e-12)


def test_norms_match_exact_and_float_recurrences() -> None:
    c = _exact_c(40)
    for n in (1, 2, 5, 40):
        assert blt_col_norm2(n) == pytest.approx(float(sum(v * v for v in c[:n])), rel=1e-12)
    # b = impulse response of the decoder (exact C^{-1} then prefix sums)
    g: list[Fraction] = []
    for i in range(40):
        g.append((1 if i == 0 else 0) - sum((c[i - j] * g[j] for j in range(i)), Fraction(0)))
    b = np.cumsum([float(v) for v in g])
    for t in (1, 2, 7, 40):
        assert blt_row_norm2(t) == pytest.approx(float(np.sum(b[:t] ** 2)), rel=1e-10)
    # a float run of the decoder recursion to 2^15 (an independent computation)
    th, om = np.array(blt.THETA), np.array(blt.OMEGA)
    d = np.zeros(len(th))
    total, acc, sums = 0.0, 0.0, {}
    for t in range(1, (1 << 15) + 1):
        u = (1.0 if t == 1 else 0.0) - float(om @ d)
        d = th * d + u
        total += u
        acc += total * total
        if t in (100, 1000, 1 << 15):
            sums[t] = acc
    for t, v in sums.items():
        assert blt_row_norm2(t) == pytest.approx(v, rel=1e-9)
    # the simulator's coefficients: the same b
    coef = blt.blt_decoder_coeffs(1 << 15)
    assert np.allclose(coef[:40], b, rtol=1e-9, atol=0)
    assert float(np.sum(coef**2)) == pytest.approx(sums[1 << 15], rel=1e-9)


def test_restore_continues_identically_and_refuses_other_versions() -> None:
    xs = _inputs(120, 2)
    a = BLTCounter(3.0, 1e-6, 200, KEY, "r")
    want = [a.step(u) for u in xs]
    b = BLTCounter(3.0, 1e-6, 200, KEY, "r")
    got = []
    for i, u in enumerate(xs):
        if i in (1, 17, 64, 119):
            b = BLTCounter.from_state(b.to_state(), KEY)
        got.append(b.step(u))
    assert got == want
    st = b.to_state()
    st["v"] = blt.BLT_VERSION + 1
    with pytest.raises(StateFormatError, match=f"version {blt.BLT_VERSION + 1}"):
        BLTCounter.from_state(st, KEY)
    for field, bad in (("we", ["1x"] * len(blt.THETA_NUM)), ("ys", 5), ("wd", ["1"])):
        st = b.to_state()
        st[field] = bad
        with pytest.raises(StateFormatError):
            BLTCounter.from_state(st, KEY)


def test_cc_default_is_blt_and_old_tree_states_still_restore() -> None:
    assert DEFAULT_BASE == "blt"
    assert UnboundedCC(1.0, 1e-5, KEY, "d").base == "blt"
    xs = _inputs(90, 3)
    for cls_args in (("tree",), ("blt",)):
        base = cls_args[0]
        ref = UnboundedCC(1.0, 1e-5, KEY, "o", UNIT, base)
        want = [ref.step(u) for u in xs]
        c = UnboundedCC(1.0, 1e-5, KEY, "o", UNIT, base)
        got = [c.step(u) for u in xs[:50]]
        c = UnboundedCC.from_state(c.to_state(), KEY)
        assert c.base == base
        got += [c.step(u) for u in xs[50:]]
        assert got == want
    bcc = BCC(1.0, 1e-5, KEY, "b", UNIT, "tree")
    for d in (1, 0, 2, 1):
        bcc.step(d)
    again = BCC.from_state(bcc.to_state(), KEY)
    assert again._cc.base == "tree" and again.step(1) == bcc.step(1)


# --------------------------------------------------------------------------- sigma ratio


def _grid() -> list[int]:
    return sorted({*(10**k for k in range(8)), *(3 * 10**k for k in range(7)),
                   *((1 << k) - 1 for k in range(1, 24)), 10**7 - 1})


def _tree_worst(n: int) -> float:
    return math.sqrt(tree_levels(n) * max(n.bit_count(), n.bit_length() - 1))


def test_worst_case_sigma_within_1_1_of_the_square_root_up_to_1e7() -> None:
    """Bounded counter of horizon n: max_t sigma_t = (Gaussian constant) ||col 1 of C||
    ||row n of B|| against the square root's (constant) sum_{k<n} c_k^2, closed forms.
    Control: the old tree base must fail the same check."""
    ns = _grid()
    s2 = sqrt_norm2_at(ns)
    ratios = [math.sqrt(blt_col_norm2(n) * blt_row_norm2(n)) / s for n, s in zip(ns, s2,
                                                                               strict=True)]
    assert max(ratios) <= 1.1, max(zip(ratios, ns, strict=True))
    assert min(ratios) >= 1.0 - 1e-9  # the square root is optimal up to ~1% (a sanity check)
    tree = [_tree_worst(n) / s for n, s in zip(ns, s2, strict=True)]
    assert max(tree) > 1.1 and all(r > 1.1 for n, r in zip(ns, tree, strict=True) if n >= 100)


def test_unbounded_cc_sigma_within_1_1_of_base_sqrt_at_every_t_checked() -> None:
    eps, delta = 1.0, 1e-5
    ts = sorted({*range(1, 64), *((1 << k) - 2 for k in range(2, 17)),
                 *((1 << k) + 1 for k in range(2, 17)), 1000, 30000, 99999})
    r_blt = [cc_sigma(eps, delta, t, "blt") / cc_sigma(eps, delta, t, "sqrt") for t in ts]
    assert max(r_blt) <= 1.1
    r_tree = [cc_sigma(eps, delta, t, "tree") / cc_sigma(eps, delta, t, "sqrt") for t in ts]
    assert max(r_tree) > 1.1  # control


def test_blt_sigma_is_an_upper_bound_on_the_gaussian_part() -> None:
    c = BLTCounter(1.0, 1e-5, 1000, KEY, "s")
    for t in (1, 10, 1000):
        assert c.sigma(t) >= blt_gauss_sigma(1.0, 1e-5, 1000, t) + blt.SIGMA_SLACK - 1e-6
        assert c.sigma(t) <= blt_gauss_sigma(1.0, 1e-5, 1000, t) * (1 + 2e-6) + 1.0


# --------------------------------------------------------------------------- the noise law


def _ks(samples: np.ndarray, cdf: np.ndarray) -> float:
    """sqrt(N) * KS distance of samples from a continuous cdf evaluated at the sorted
    samples (the two-sided statistic at the jump points)."""
    n = len(samples)
    i = np.arange(1, n + 1)
    return float(math.sqrt(n) * max(np.max(i / n - cdf), np.max(cdf - (i - 1) / n)))


def _draws(scale: int, n: int, label: str, sampler: str = "rounded_gaussian_reference"
           ) -> np.ndarray:
    cur = WordCursor(KeyedStream(KEY, label))
    draw = getattr(samplers, sampler)
    return np.sort(np.array([draw(cur, scale) for _ in range(n)], dtype=np.float64))


def test_rounded_gaussian_law_and_broken_variants(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference's law (the fast sampler makes its draws: the tests below)."""
    n, scale = 6000, 1000
    x = _draws(scale, n, "law")
    assert _ks(x, ndtr(x / scale)) < KS_CRIT
    # control 1: the right sampler, judged against a 10% smaller sigma
    assert _ks(x, ndtr(x / (0.9 * scale))) > KS_CRIT
    # the fast sampler's draws are the same ones
    assert np.array_equal(x, _draws(scale, n, "law", "rounded_gaussian"))
    # control 2: Karney's step N4 broken (always accept): a different law
    monkeypatch.setattr(samplers, "_karney_b", lambda cur, k, x: True)
    y = _draws(scale, n, "law")
    assert _ks(y, ndtr(y / scale)) > KS_CRIT


class _ListStream(KeyedStream):
    """A lane of given words (then zeros): the rare branches of the samplers on demand."""

    def __init__(self, words: list[int]) -> None:
        super().__init__(KEY, "list")
        self._words = words

    def word_array(self, lane: int, start: int, n: int) -> array[int]:
        out = self._words[start : start + n]
        return array("Q", [*out, *([0] * (n - len(out)))])


def _special_words(n: int, seed: int) -> list[int]:
    """Random words, with words that take the rare branches mixed in: 0 (von Neumann's
    K beyond its table, in both one-word Bernoullis), the largest word (rejected by both),
    repeated words (lazy uniforms tied on a digit), and the tables' thresholds."""
    rng = np.random.default_rng(seed)
    special = [0, 1, samplers.U64_MAX, samplers.F18_LIMIT_INT, samplers._H_LIMIT,
               samplers._H_LIMIT + 1, samplers.F18_LIMIT_INT + 1, *samplers.VN_THRESHOLDS,
               *samplers._H_TH]
    out: list[int] = []
    while len(out) < n:
        r = rng.random()
        if r < 0.04:
            out.append(special[int(rng.integers(len(special)))])
        elif r < 0.08 and out:
            out.append(out[-1])  # a tie with the word before
        elif r < 0.10 and len(out) > 1:
            out.extend(out[-2:])  # a tie of two digits
        else:
            out.append(int(rng.integers(0, 1 << 64, dtype=np.uint64)))
    return out


SCALES = [1, 2, 3, 1000, (1 << 20) + 7, (1 << 66) + 12345, (1 << 72) - 1, 3 << 130]


def _fast_equals_reference(words: list[int], draws: int, scale: int) -> bool:
    a, b = WordCursor(_ListStream(words)), WordCursor(_ListStream(words))
    for _ in range(draws):
        if (samplers.rounded_gaussian(a, scale), a.position) != (
                samplers.rounded_gaussian_reference(b, scale), b.position):
            return False
    return True


@pytest.mark.parametrize("scale", SCALES)
def test_fast_rounded_gaussian_is_the_reference_draw_for_draw(scale: int) -> None:
    """Value and cursor position after each draw, on the keyed stream from random start
    positions (windows that end mid-draw) and on lanes full of rare-branch words."""
    rng = np.random.default_rng(scale % 1000)
    for i in range(20):
        pos = int(rng.integers(0, 1 << 30))
        a = WordCursor(KeyedStream(KEY, f"fast/{i}"), i, pos)
        b = WordCursor(KeyedStream(KEY, f"fast/{i}"), i, pos)
        for _ in range(150):
            assert (samplers.rounded_gaussian(a, scale), a.position) == (
                samplers.rounded_gaussian_reference(b, scale), b.position)
    for seed in range(4):
        assert _fast_equals_reference(_special_words(30_000, seed), 800, scale)


def test_a_fast_sampler_reading_digits_out_of_order_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: the lazy uniforms' digits drawn in the other order on a tie (y's digit
    before z's) give other draws, which the comparison above must see."""
    words = _special_words(30_000, 0)
    assert _fast_equals_reference(words, 800, 1000)

    def swapped(w: array[int], i: int, z: list[int], y: list[int]) -> tuple[bool, int]:
        j = 0
        while True:
            if len(y) <= j:
                y.append(w[i])
                i += 1
            if len(z) <= j:
                z.append(w[i])
                i += 1
            if z[j] != y[j]:
                return z[j] < y[j], i
            j += 1

    monkeypatch.setattr(samplers, "_rg_less", swapped)
    assert not _fast_equals_reference(words, 800, 1000)


def test_a_draw_longer_than_the_window_is_the_reference_s() -> None:
    """A lane that keeps a lazy uniform tied for more than _RG_MAX words: the fast path
    gives up and the reference makes the draw (the same value and position)."""
    tie = [12345] * (3 * samplers._RG_MAX)
    words = [samplers.U64_MAX // 3, 7, *tie, 9, 8, *_special_words(2000, 5)]
    assert _fast_equals_reference(words, 40, 1000)


def test_counter_noise_has_the_stated_sigma_and_a_broken_decoder_is_rejected() -> None:
    """y_t - s_t at t = 12 over 1200 independent counters (labels) against
    N(0, blt_gauss_sigma(12)^2); control: the same counters with the decoder's buffers
    removed (prefix sums of w + z: noise of another law)."""

    class NoDecoder(BLTCounter):
        def decode(self, v: int) -> int:
            self._ysum += v
            return (self._ysum + (1 << (blt.FRAC_BITS - 1))) >> blt.FRAC_BITS

    xs = _inputs(12, 4)
    s = sum(xs)
    sig = blt_gauss_sigma(0.5, 1e-5, 16, 12)

    def errors(cls: type[BLTCounter]) -> np.ndarray:
        out = []
        for i in range(1200):
            c = cls(0.5, 1e-5, 16, KEY, f"law/{i}")
            y = 0
            for u in xs:
                y = c.step(u)
            out.append(y - s)
        return np.sort(np.array(out, dtype=np.float64))

    e = errors(BLTCounter)
    assert _ks(e, ndtr(e / sig)) < KS_CRIT
    bad = errors(NoDecoder)
    assert _ks(bad, ndtr(bad / sig)) > KS_CRIT


def test_simecc_state_written_with_the_tree_base_restores_and_continues() -> None:
    """A SimECC stored before the switch (its CC and BCC name base "tree") restores as
    trees and continues exactly as if never stopped; a fresh SimECC runs the BLT."""
    from processor.core import registry
    from processor.core.ecc import SimECC

    def old_style() -> SimECC:
        c = SimECC(150.0, 1e-5, KEY, "old")
        c._cc = UnboundedCC(c._cc.eps, c._cc.delta, KEY, c._cc.label, UNIT, "tree")
        c._bcc = BCC(c._bcc.eps, c._bcc.delta, KEY, c._bcc.label, UNIT, "tree")
        return c

    xs = [float(v) for v in np.random.default_rng(5).integers(0, 2, 400)]
    ref = old_style()
    want = [ref.update(x) for x in xs]
    c = old_style()
    got = [c.update(x) for x in xs[:250]]
    data = c.to_bytes()
    r = registry.restore(data, KEY)
    assert isinstance(r, SimECC) and r._cc.base == "tree" and r._bcc._cc.base == "tree"
    got += [r.update(x) for x in xs[250:]]
    assert got == want
    assert SimECC(150.0, 1e-5, KEY, "new")._cc.base == "blt"


def test_one_word_bernoulli_exp_minus_half() -> None:
    """Frequency of Bernoulli(exp(-1/2)) over 40,000 draws: two-sided z-test at a false-alarm
    rate of 1e-3 (|z| < 3.29); control: the same draws judged against exp(-0.47)."""
    cur = WordCursor(KeyedStream(KEY, "half"))
    n = 40_000
    hits = sum(samplers._bernoulli_exp_minus_half(cur) for _ in range(n))

    def z(p: float) -> float:
        return (hits / n - p) / math.sqrt(p * (1 - p) / n)

    assert abs(z(math.exp(-0.5))) < 3.29
    assert abs(z(math.exp(-0.47))) > 3.29


class _LoopBLT(BLTCounter):
    """The encoder and decoder as per-buffer loops (the form the fast ones replaced)."""

    def encode(self, u: int) -> int:
        x = u << blt.FRAC_BITS
        w = x
        enc = self._enc
        for i, (tn, on) in enumerate(zip(blt.THETA_NUM, blt.OMEGA_NUM, strict=True)):
            e = enc[i]
            w += (on * e) >> blt.PARAM_BITS
            enc[i] = ((tn * e) >> blt.PARAM_BITS) + x
        return w

    def decode(self, v: int) -> int:
        dec = self._dec
        u = v
        for i, on in enumerate(blt.OMEGA_NUM):
            u -= (on * dec[i]) >> blt.PARAM_BITS
        for i, tn in enumerate(blt.THETA_NUM):
            dec[i] = ((tn * dec[i]) >> blt.PARAM_BITS) + u
        self._ysum += u
        return (self._ysum + (1 << (blt.FRAC_BITS - 1))) >> blt.FRAC_BITS


class _NoZeroShortcutBroken(_LoopBLT):
    """Control: a zero input read as one unit while the buffers are zero."""

    def encode(self, u: int) -> int:
        return super().encode(1 if not u and not any(self._enc) else u)


def _loop_equals_fast(cls: type[BLTCounter], inputs: list[int]) -> bool:
    a = BLTCounter(0.5, 1e-6, len(inputs), KEY, "loop", UNIT)
    b = cls(0.5, 1e-6, len(inputs), KEY, "loop", UNIT)
    return all(a.step(u) == b.step(u) and a.to_state() == b.to_state() for u in inputs)


def test_encoder_and_decoder_equal_their_loop_form_with_runs_of_zeros() -> None:
    """Releases and states step for step against the loop form, on streams that start
    with zeros (the shortcut of zero buffers), then mix zeros and inputs (buffers that
    decay); control: the loop form broken on the zero shortcut's case differs."""
    rng = np.random.default_rng(11)
    for n in (50, 400):
        xs = [0] * (n // 4) + [int(v) if r < 0.5 else 0 for r, v in
                               zip(rng.random(n), rng.integers(0, 3 * UNIT, n), strict=True)]
        assert _loop_equals_fast(_LoopBLT, xs)
        assert not _loop_equals_fast(_NoZeroShortcutBroken, xs)
