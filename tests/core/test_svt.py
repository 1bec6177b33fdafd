"""SVT (Algorithm 1): the firing-time law of the dense path and of the fast skip path
against the exact formula, and the skip path's cost.

Statistical checks use fixed seeds and reject at p < 1e-3 (false-alarm rate 0.1% per
check for a correct implementation; with fixed seeds the outcome is deterministic). Each
has a control: the same check against the law with a wrong constant must reject.
"""

from __future__ import annotations

import hashlib
import math
import random
from array import array

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from processor.core.grid import UNIT
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers.scalar import discrete_laplace
from processor.core.svt import (
    HORIZON,
    PREFIX,
    SCALAR_DRAWS,
    SVT,
    svt_scales,
    svt_threshold,
    svt_threshold_units,
)

ALPHA = 1e-3
EPS = 8.0
TAU = 1.0
K = 10  # bins 1..K and "no fire within K"


def dlap_pmf_grid(t: int, width: float = 40.0) -> tuple[npt.NDArray[np.int64],
                                                         npt.NDArray[np.float64]]:
    """Support and pmf of DLap(t) (units) truncated at width * t (mass lost < e^-40)."""
    m = int(width * t)
    z = np.arange(-m, m + 1, dtype=np.int64)
    q = math.exp(-1.0 / t)
    return z, (1 - q) / (1 + q) * np.exp(-np.abs(z) / t)


def dlap_sf_vec(k: npt.NDArray[np.int64], t: int) -> npt.NDArray[np.float64]:
    """P(Z > k) for Z ~ DLap(t), vectorised closed form."""
    q = math.exp(-1.0 / t)
    kf = k.astype(np.float64)
    pos = np.exp(-(kf + 1) / t) / (1 + q)
    neg = 1 - np.exp(np.minimum(kf, 0) / t) / (1 + q)
    return np.where(k >= 0, pos, neg)


def svt_first_fire_law(eps: float, tau: float, inputs: list[int], const: float = 8.0
                       ) -> npt.NDArray[np.float64]:
    """Exact P(first ⊤ at step s), s = 1..len(inputs), and P(none), by summing over Z_0.

    Given Z_0 the steps are independent: step s fires iff Z_s > floor(thr_s * UNIT) + Z_0
    - v_s. `const` is the factor in front of ln(...) (8 in the paper; controls change it).
    """
    t0, t1 = svt_scales(eps)
    z0, p0 = dlap_pmf_grid(t0)
    alive = p0.copy()
    out = []
    for s, v in enumerate(inputs, start=1):
        thr = math.floor((tau + (const / eps) * math.log(s + math.ceil(12 / eps))) * UNIT)
        q = dlap_sf_vec(thr + z0 - v, t1)
        out.append(float(np.sum(alive * q)))
        alive = alive * (1 - q)
    out.append(float(np.sum(alive)))
    return np.array(out)


def chi2_p(counts: npt.NDArray[np.int64], law: npt.NDArray[np.float64]) -> float:
    """Goodness of fit p-value; bins with expected count < 5 are merged into a neighbour."""
    n = counts.sum()
    exp = law / law.sum() * n
    obs_m: list[float] = []
    exp_m: list[float] = []
    acc_o = acc_e = 0.0
    for o, e in zip(counts, exp, strict=True):
        acc_o += o
        acc_e += e
        if acc_e >= 5:
            obs_m.append(acc_o)
            exp_m.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0:
        obs_m[-1] += acc_o
        exp_m[-1] += acc_e
    return float(stats.chisquare(obs_m, exp_m).pvalue)


def histogram(times: list[int | None], k: int) -> npt.NDArray[np.int64]:
    h = np.zeros(k + 1, dtype=np.int64)
    for f in times:
        h[k if f is None else f - 1] += 1
    return h


V = int(1.0 * UNIT) + int(TAU * UNIT)  # v - tau = 1 event: firing spread over steps


def dense_times(seed: int, n: int, inputs: list[int]) -> list[int | None]:
    key = NoiseKey.from_seed(seed)
    out: list[int | None] = []
    for i in range(n):
        svt = SVT(EPS, TAU, key, f"svt/{i}")
        f = None
        for s, v in enumerate(inputs, start=1):
            if svt.feed(v):
                f = s
                break
        out.append(f)
    return out


def skip_times(seed: int, n: int, v: int, horizon: int) -> list[int | None]:
    key = NoiseKey.from_seed(seed)
    return [SVT(EPS, TAU, key, f"svt/{i}").first_fire(v, horizon) for i in range(n)]


def test_threshold_formula() -> None:
    assert svt_threshold(2.0, 1.0, 1) == pytest.approx(1.0 + 4.0 * math.log(1 + 6))
    thr = svt_threshold(0.3, 5.0, 17)
    assert svt_threshold_units(0.3, 5.0, 17) == math.floor(thr * UNIT)


N_RUNS = 2000


@pytest.fixture(scope="module")
def dense_const() -> npt.NDArray[np.int64]:
    return histogram(dense_times(11, N_RUNS, [V] * K), K)


@pytest.fixture(scope="module")
def skip_const() -> npt.NDArray[np.int64]:
    return histogram(skip_times(12, N_RUNS, V, K), K)


def test_dense_firing_time_matches_exact_law(dense_const: npt.NDArray[np.int64]) -> None:
    """Dense feeds on a constant input vs the exact law (p < 1e-3 rejects); control: the
    law with 4 instead of 8 in the threshold is rejected by the same samples."""
    assert chi2_p(dense_const, svt_first_fire_law(EPS, TAU, [V] * K)) > ALPHA
    assert chi2_p(dense_const, svt_first_fire_law(EPS, TAU, [V] * K, const=4.0)) < ALPHA


def test_dense_firing_time_varying_input() -> None:
    """A rising input (0, 0.5, 1, ... events above tau): exact law fits, control rejects."""
    inputs = [int(TAU * UNIT) + j * UNIT // 2 for j in range(K)]
    h = histogram(dense_times(13, N_RUNS, inputs), K)
    assert chi2_p(h, svt_first_fire_law(EPS, TAU, inputs)) > ALPHA
    assert chi2_p(h, svt_first_fire_law(EPS, TAU, inputs, const=4.0)) < ALPHA


def test_first_fire_matches_exact_law_and_dense(dense_const: npt.NDArray[np.int64],
                                                skip_const: npt.NDArray[np.int64]) -> None:
    """first_fire(v, K) vs the exact law, and vs dense feeds (two-sample chi-square,
    p < 1e-3 rejects). Control: a skip path with the wrong constant is rejected by both."""
    law = svt_first_fire_law(EPS, TAU, [V] * K)
    assert chi2_p(skip_const, law) > ALPHA
    assert stats.chi2_contingency(np.vstack([dense_const, skip_const])).pvalue > ALPHA

    class WrongSVT(SVT):
        __slots__ = ()

        def _k(self, v: int, s: int) -> int:
            thr = math.floor((self.tau + (4.0 / self.eps)
                              * math.log(s + math.ceil(12 / self.eps))) * UNIT)
            return thr + self.z0 - v

    key = NoiseKey.from_seed(12)
    wrong = histogram([WrongSVT(EPS, TAU, key, f"svt/{i}").first_fire(V, K)
                       for i in range(N_RUNS)], K)
    assert chi2_p(wrong, law) < ALPHA
    assert stats.chi2_contingency(np.vstack([dense_const, wrong])).pvalue < ALPHA


def svt_class(prefix: int) -> type[SVT]:
    """SVT with another number of dense steps at the start of a ⊥ run."""
    if prefix == SVT.prefix:
        return SVT

    class Variant(SVT):
        __slots__ = ()

    Variant.prefix = prefix
    return Variant


@pytest.mark.parametrize("prefix", [PREFIX, 3, 0])
def test_plan_matches_exact_law(prefix: int) -> None:
    """const_step (dense prefix, then the presampled plan) has the law of dense feeds;
    control as above. prefix 0 puts every step on the plan, 3 splits the range."""
    key = NoiseKey.from_seed(14)
    cls = svt_class(prefix)
    times: list[int | None] = []
    for i in range(N_RUNS):
        svt = cls(EPS, TAU, key, f"svt/{i}")
        d = svt.due(V)
        f = None
        for s in range(1, K + 1):
            if svt.const_step(V):
                f = s
                break
        assert (d if d is not None and d <= K else None) == f  # plan and steps agree
        times.append(f)
    h = histogram(times, K)
    assert chi2_p(h, svt_first_fire_law(EPS, TAU, [V] * K)) > ALPHA
    assert chi2_p(h, svt_first_fire_law(EPS, TAU, [V] * K, const=4.0)) < ALPHA


def test_first_fire_cost_does_not_grow_with_n() -> None:
    """The skip lane reads O(1) words whatever n is (here: n up to 10^15)."""
    key = NoiseKey.from_seed(15)
    used = []
    for n in (10, 10**3, 10**6, 10**9, 10**15):
        for i in range(20):
            svt = SVT(EPS, TAU, key, f"c/{n}/{i}")
            svt.first_fire(0, n)  # input far below threshold: rarely fires
            used.append(svt.to_state()["p"])
    assert max(used) <= 40


def test_due_is_pure_and_restore_continues_identically() -> None:
    key = NoiseKey.from_seed(16)
    a = SVT(EPS, TAU, key, "r")
    for _ in range(3):
        a.feed(0)
    before = a.to_state()
    d1 = a.due(UNIT)
    assert a.to_state() == before and a.due(UNIT) == d1
    b = SVT(EPS, TAU, key, "r", dict(before))
    ra = [a.const_step(UNIT) for _ in range(5)] + [a.feed(3 * UNIT)]
    rb = [b.const_step(UNIT) for _ in range(5)] + [b.feed(3 * UNIT)]
    assert ra == rb and a.to_state() == b.to_state()


def test_prefix_steps_skip_and_restore_agree() -> None:
    """Inside and across the dense prefix of a ⊥ run, due() is pure, advance(k) equals k
    const_steps draw for draw, and a restore at any step continues identically."""
    key = NoiseKey.from_seed(17)
    v = int(TAU * UNIT) - 2 * UNIT  # below the threshold: fires rarely
    for k in range(PREFIX + 3):
        a = SVT(EPS, TAU, key, "p")
        b = SVT(EPS, TAU, key, "p")
        a.feed(v)
        b.feed(v)
        d = a.due(v)
        assert a.due(v, k) == (d if d is not None and d <= k else None)
        if d is not None and d <= k:
            continue
        for _ in range(k):
            assert not a.const_step(v)
        b.advance(v, k)
        assert a.to_state() == b.to_state()
        c = SVT(EPS, TAU, key, "p", dict(b.to_state()))
        assert [a.const_step(v) for _ in range(5)] == [c.const_step(v) for _ in range(5)]
        assert a.to_state() == c.to_state()


def test_due_with_a_limit_after_one_without_equals_a_fresh_answer() -> None:
    """due(v, within) answered from the remembered due(v) (no limit) equals what an
    instance restored from the same state computes, for every limit, whether the firing
    step is in the dense prefix, on the plan or nowhere; advance then consumes the
    prefix's draws (at once) exactly as const_step does one by one."""
    key = NoiseKey.from_seed(27)
    answers = set()
    for i in range(160):
        a = SVT(EPS, TAU, key, f"lim/{i}")
        offset_events = [-2.0, -1.0, -0.5, 0.0][i % 4]
        v = a.z0 + svt_threshold_units(EPS, TAU, 1) + int(offset_events * UNIT)
        if any(a.feed(v) for _ in range(i // 4 % 3)):
            continue  # halted
        for run in range(PREFIX + 2):
            d = a.due(v)
            answers.add(d if d is None or d <= PREFIX else "plan")
            for within in [0, 1, 2, PREFIX - 1, PREFIX, PREFIX + 1, 50, 10**6]:
                fresh = SVT(EPS, TAU, key, f"lim/{i}", dict(a.to_state()))
                assert a.due(v, within) == fresh.due(v, within), (i, run, within)
                assert a.due(v) == d
            if d is not None and d <= 1:
                break
            b = SVT(EPS, TAU, key, f"lim/{i}", dict(a.to_state()))
            b.const_step(v)
            a.advance(v, 1)  # one step at a time: many states
            assert a.to_state() == b.to_state()
    assert {None, "plan"} <= answers and answers & set(range(1, PREFIX + 1))


@pytest.mark.parametrize("bad", [{"r": -1}, {"r": PREFIX + 1}, {"r": 0, "f": None}])
def test_svt_state_out_of_range_is_refused(bad: dict[str, object]) -> None:
    st = SVT(EPS, TAU, NoiseKey.from_seed(18), "s").to_state()
    st.update(bad)
    with pytest.raises(ValueError):
        SVT(EPS, TAU, NoiseKey.from_seed(18), "s", st)


class _ExactOnlySVT(SVT):
    """The plan sampler with its float fast path switched off (decimal bounds only)."""

    __slots__ = ()
    _exact_only = True


@pytest.mark.parametrize("offset_events", [-3.0, -0.5, 0.0, 0.5, 2.0, 40.0])
def test_plan_float_and_decimal_paths_agree(offset_events: float) -> None:
    """The float fast path decides only what the rigorous decimal path decides: same
    firing step and same words consumed, for inputs from far below to above the
    threshold, over the unbounded horizon and a short range."""
    key = NoiseKey.from_seed(19)
    fired = 0
    for i in range(150):
        a = SVT(EPS, TAU, key, f"a/{i}")
        b = _ExactOnlySVT(EPS, TAU, key, f"a/{i}")
        v = int((TAU + offset_events) * UNIT) + svt_threshold_units(EPS, 0.0, 1)
        for start, end in ((1, HORIZON), (5, 50), (1000, HORIZON)):
            got = a._sample(v, start, end, 0)
            assert got == b._sample(v, start, end, 0)
            fired += got[0] is not None
    assert fired > 0


class _TopWordStream(KeyedStream):
    """The skip lane with word 0 replaced: conditions U on a tiny interval near 1."""

    __slots__ = ("first",)

    def __init__(self, inner: KeyedStream, first: int) -> None:
        super().__init__(inner._noise_key, inner.label)
        self.first = first

    def word_array(self, lane: int, start: int, n: int) -> array[int]:
        out = super().word_array(lane, start, n)
        if start == 0 and n > 0:
            out[0] = self.first
        return out


def _fires_at_first_step(cls: type[SVT], q_log2: float, n: int, seed: int,
                         top_bits: int = 12) -> tuple[int, float]:
    """n instances with q_1 = P(step 1 fires) about 2^q_log2, each with the first word of
    its skip lane uniform among the top 2^top_bits words (U in [1 - 2^(top_bits-64), 1));
    returns how many first_fire(v, 1) fire and the exact conditional probability
    q_1 2^(64 - top_bits)."""
    key = NoiseKey.from_seed(seed)
    rng = np.random.default_rng(seed)
    t1 = svt_scales(EPS)[1]
    hits = 0
    want = 0.0
    for i in range(n):
        svt = cls(EPS, TAU, key, f"tiny/{i}")
        k = round((-q_log2 - 1) * math.log(2) * t1)  # e^{-(k+1)/t1}/(1+e^{-1/t1}) ~ 2^q_log2
        v = svt_threshold_units(EPS, TAU, 1) + svt.z0 - k
        q = math.exp(-(k + 1) / t1) / (1 + math.exp(-1 / t1))
        want = q * 2.0 ** (64 - top_bits)
        top = (1 << 64) - (1 << top_bits) + int(rng.integers(0, 1 << top_bits))
        stream = _TopWordStream(svt._scan.stream, top)
        svt._scan.stream = stream
        hits += svt.first_fire(v, 1) is not None
    return hits, want


def test_firing_law_at_tiny_probability() -> None:
    """P(fire at a step with q ~ 2^-57), measured where it is visible: conditioned on U in
    [1 - 2^-52, 1) (the first word of the skip lane among its top 2^12 values), step 1
    fires with probability exactly q 2^52 ~ 1/32. Binomial test, p < 1e-3 rejects
    (false-alarm rate 0.1%, fixed seeds). A float sampler cannot see probabilities below
    its uniform's resolution (the float64 plan of state version 1 gave 0 hits here).
    Control: a sampler whose q is halved (threshold one t1 ln 2 higher) is rejected."""
    hits, want = _fires_at_first_step(SVT, -57.0, 6000, 20)
    assert 0.02 < want < 0.05
    assert stats.binomtest(hits, 6000, want).pvalue > ALPHA

    class HalfQ(SVT):
        __slots__ = ()

        def _k(self, v: int, s: int) -> int:
            return super()._k(v, s) + round(math.log(2) * self._t1)

    bad, _ = _fires_at_first_step(HalfQ, -57.0, 6000, 20)
    assert stats.binomtest(bad, 6000, want).pvalue < ALPHA


def test_firing_law_below_one_word_of_resolution() -> None:
    """q ~ 2^-65 is below what one 64-bit word can resolve: with the first word at its
    maximum (U in [1 - 2^-64, 1)), step 1 fires with probability q 2^64 ~ 1/2, decided
    only by further words (the decimal path extends U). Binomial test as above; control:
    q halved is rejected."""
    hits, want = _fires_at_first_step(SVT, -65.0, 1500, 21, top_bits=0)
    assert 0.3 < want < 0.7
    assert stats.binomtest(hits, 1500, want).pvalue > ALPHA

    class HalfQ(SVT):
        __slots__ = ()

        def _k(self, v: int, s: int) -> int:
            return super()._k(v, s) + round(math.log(2) * self._t1)

    bad, _ = _fires_at_first_step(HalfQ, -65.0, 1500, 21, top_bits=0)
    assert stats.binomtest(bad, 1500, want).pvalue < ALPHA


def test_plan_law_over_long_ranges() -> None:
    """The plan alone (prefix 0) against the exact law over 2 * 10^4 steps, conditional on
    each instance's Z_0: the number of instances fired by step n vs the sum of their exact
    probabilities 1 - prod_{s<=n} (1 - q_s) (normal approximation of the Poisson binomial,
    |z| > 3.29 rejects: false-alarm rate 0.1% per n, fixed seed). Control: the law with
    7 instead of 8 in the threshold is rejected."""
    key = NoiseKey.from_seed(40)
    cls = svt_class(0)
    v = int(TAU * UNIT) + UNIT
    ns = np.array([10, 1000, 20_000])
    steps = np.arange(1, ns[-1] + 1)
    t1 = svt_scales(EPS)[1]
    thr = [np.floor((TAU + (c / EPS) * np.log(steps + math.ceil(12 / EPS))) * UNIT)
           .astype(np.int64) - v for c in (8.0, 7.0)]
    hits = np.zeros(len(ns))
    exact = np.zeros((2, len(ns)))
    var = np.zeros((2, len(ns)))
    for i in range(1500):
        svt = cls(EPS, TAU, key, f"law/{i}")
        f = svt.due(v)
        for c in range(2):
            p = 1.0 - np.cumprod(1.0 - dlap_sf_vec(thr[c] + svt.z0, t1))[ns - 1]
            exact[c] += p
            var[c] += p * (1 - p)
        hits += [f is not None and f <= n for n in ns]
    z = (hits - exact) / np.sqrt(var)
    assert np.all(np.abs(z[0]) < 3.29), z
    assert np.any(np.abs(z[1]) > 3.29), z


def _sparse_trace(eps: float, tau: float) -> list[object]:
    """due / advance / const_step / feed on a sparse input, as the operator drives an SVT
    (a fixed key and seed), and the final state."""
    rng = random.Random(3)
    svt = SVT(eps, tau, NoiseKey(bytes(range(32))), "pin/svt")
    out: list[object] = []
    v = 0
    for _ in range(200):
        if svt.halted:
            break
        d = svt.due(v)
        out.append(d)
        gap = rng.randrange(1, 30)
        if d is not None and d <= gap:
            svt.advance(v, d - 1)
            out.append(svt.const_step(v))
            continue
        svt.advance(v, gap)
        v += rng.randrange(0, 3) * UNIT // 2
        out.append(svt.feed(v))
    out.append(sorted(svt.to_state().items()))
    return out


@pytest.mark.parametrize(("eps", "tau", "n", "digest"), [
    (1.0, 8.0, 185, "08f7a5edf960838707b17c672f97a32e8212a53bad1b454e8539e6da9543c996"),
    (0.1, 40.0, 401, "3d71323c3515799b356774b9b53e5795e6fd559c716a012420c83c00ab359363"),
    (5.0, 1.0, 27, "dd1383076036507afa5c459731d84a503d41ac26edcd59d8b782da605dcfe1b3"),
])
def test_sparse_svt_trace_is_pinned(eps: float, tau: float, n: int, digest: str) -> None:
    """Every answer and the final state of a sparse drive, pinned to the values the SVT
    gave when it drew its look-ahead one scalar sample at a time."""
    out = _sparse_trace(eps, tau)
    assert len(out) == n
    assert hashlib.sha256(repr(out).encode()).hexdigest() == digest


def test_looked_ahead_draws_equal_the_scalar_ones() -> None:
    """The draws due() looks at ahead (one run of the sampler, remembered in the
    instance) are the scalar draws of the "/z" stream, value and position; an instance
    that never looks ahead consumes the same ones, step for step, with the same state."""
    key = NoiseKey.from_seed(21)
    eps, tau = 1.0, 8.0
    a = SVT(eps, tau, key, "ahead")
    b = SVT(eps, tau, key, "ahead")
    cur = WordCursor(KeyedStream(key, "ahead/z"), 0, 0)
    scalar = [(discrete_laplace(cur, svt_scales(eps)[1]), cur.position)
              for _ in range(SCALAR_DRAWS + 8)]
    v = -4 * UNIT  # far below the threshold: the instance does not halt
    for r in range(SCALAR_DRAWS // PREFIX + 2):
        a.due(v)
        ahead = list(zip(a._ahead[::2], a._ahead[1::2], strict=True))
        assert ahead == scalar[a.draws:a.draws + len(ahead)]
        assert len(ahead) == min(PREFIX, max(0, SCALAR_DRAWS - a.draws))
        for _ in range(PREFIX + r % 3):
            assert a.const_step(v) == b.const_step(v)
        assert not a.feed(v) and not b.feed(v)
        assert a.to_state() == b.to_state()
    assert a.draws > SCALAR_DRAWS  # the bank's draws came after the scalar ones
