"""The native sampler (native/, samplers/native.py) against the Python reference, bit for
bit: the same keystream words, the same draws, the same cursor position after each draw,
the same errors, and through ECC and SimECC the same releases and the same state bytes.

Deterministic (fixed keys and labels, no statistics): no false alarms. Controls: a run
read one word off, or with another label, must disagree, so agreement is not vacuous.
Skipped when the extension is not installed, unless DPC_SAMPLERS=native (CI) makes a
missing extension an error at import.
"""

from __future__ import annotations

import importlib
import types
from array import array
from collections.abc import Iterator

import numpy as np
import pytest

from processor.core import rng, svt
from processor.core.ecc import ECC, SimECC
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers import block, native, scalar
from processor.core.samplers.scalar import F18_LIMIT_INT, U64_MAX

NATIVE = native.load("auto")
pytestmark = pytest.mark.skipif(NATIVE is None, reason="dpc_native is not installed")

#: Scales: t = 1 (U consumes no word), small, the reference's run limit 2^48 and beyond
#: it, and up to U64_MAX; s from 1 to far above t ("minus zero" rejected most of the time).
SCALES = [(1, 1), (1, 7), (2, 1), (3, 2), (7, 1), (100, 1), (2 ** 16 + 1, 3),
          (1 << 48, 1), ((1 << 48) + 1, 5), ((1 << 63) + 12345, 1), (U64_MAX, 1),
          (U64_MAX, U64_MAX), (5, 1000), (2, U64_MAX), (1000, 999_999)]


@pytest.fixture(autouse=True)
def _reference_keystream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference reads its words through the reference cipher; a test that runs the
    production path sets rng.NATIVE back itself."""
    monkeypatch.setattr(rng, "NATIVE", None)


def _streams(count: int) -> Iterator[tuple[KeyedStream, int]]:
    for seed in range(count):
        key = NoiseKey.from_seed(seed)
        yield KeyedStream(key, f"counter/{seed}", "/z"), (seed * 7919) % 5
    yield KeyedStream(NoiseKey.from_seed(99), "edge"), (1 << 96) - 1


def _reference(stream: KeyedStream, lane: int, pos: int, t: int, s: int, n: int
               ) -> list[int]:
    cur = WordCursor(stream, lane, pos)
    out: list[int] = []
    for _ in range(n):
        out.append(scalar._discrete_laplace(cur, t, s))
        out.append(cur.position)
    return out


def _native(stream: KeyedStream, lane: int, pos: int, t: int, s: int, n: int) -> list[int]:
    assert NATIVE is not None
    return NATIVE.discrete_laplace_run(stream.derived_key(), lane, pos, t, s, n)


def test_keystream_is_the_reference_cipher() -> None:
    """The extension's words against the reference cipher (rng.py's path without it)."""
    assert NATIVE is not None
    for stream, lane in _streams(20):
        # one block, parts of one, and runs of four blocks at once and the rest
        for start, n in [(0, 1), (0, 8), (5, 3), (7, 2), (8, 17), (1021, 40), (0, 32),
                         (3, 29), (13, 1000), (4093, 777)]:
            want = stream.word_array(lane, start, n).tobytes()
            assert NATIVE.keystream(stream.derived_key(), lane, start, n) == want
    # the lane's last blocks (four at once up to its end, then one), and past it
    stream = KeyedStream(NoiseKey.from_seed(1), "end")
    for back in (8, 32, 40, 77):
        last = (1 << 35) - back
        assert NATIVE.keystream(stream.derived_key(), 3, last, back) == \
            stream.word_array(3, last, back).tobytes()
    last = (1 << 35) - 8
    with pytest.raises(ValueError):
        NATIVE.keystream(stream.derived_key(), 3, last, 9)


@pytest.mark.parametrize(("t", "s"), SCALES)
def test_draws_and_positions_agree(t: int, s: int) -> None:
    for stream, lane in _streams(12):
        for pos in (0, 3, 8, 1000):
            want = _reference(stream, lane, pos, t, s, 40)
            raw = _native(stream, lane, pos, t, s, 40)
            # the extension's run stops only where the reference must go on (a modulus t k
            # beyond 2^64, a value beyond int64): a prefix, whole below 2^48
            assert raw == want[:len(raw)], (stream.label, lane, pos, t, s)
            if t <= 1 << 48 and s < 1 << 62:
                assert len(raw) == len(want)
            cur = WordCursor(stream, lane, pos)
            got: list[int] = []
            scalar._native_into(cur, t, 40, got, s)
            assert got == want and cur.position == want[-1]


def test_rejected_words_are_exercised() -> None:
    """Over these draws the reference rejects whole words (a word above 18!'s limit in
    Bernoulli(exp(-1)), uniform_below's retries): the native path agrees through them."""
    stream = KeyedStream(NoiseKey.from_seed(7), "rejections")
    want = _reference(stream, 0, 0, 3, 1, 40_000)
    assert _native(stream, 0, 0, 3, 1, 40_000) == want
    words = stream.word_array(0, 0, want[-1])
    assert any(w > F18_LIMIT_INT for w in words)  # a rejected Bernoulli(exp(-1)) word


def test_controls_disagree() -> None:
    stream = KeyedStream(NoiseKey.from_seed(3), "control")
    want = _reference(stream, 0, 0, 100, 1, 50)
    assert _native(stream, 0, 1, 100, 1, 50) != want
    assert _native(KeyedStream(NoiseKey.from_seed(3), "control2"), 0, 0, 100, 1, 50) != want
    assert _native(stream, 1, 0, 100, 1, 50) != want


def test_into_and_scalar_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """discrete_laplace_into and discrete_laplace with the extension and without it: the
    same outputs and the same cursor positions."""
    results = []
    for mod in (NATIVE, None):
        monkeypatch.setattr(scalar, "NATIVE", mod)
        monkeypatch.setattr(rng, "NATIVE", mod)
        got: list[object] = []
        for stream, lane in _streams(6):
            for t, s in SCALES:
                cur = WordCursor(stream, lane, 5)
                flat: list[int] = []
                scalar.discrete_laplace_into(cur, t, 30, flat, s)
                one = scalar.discrete_laplace(cur, t, s)
                got.append((flat, one, cur.position))
        results.append(got)
    assert results[0] == results[1]


def test_the_lanes_end_raises_as_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Near the lane's 2^32 blocks the reference draws (its read-ahead decides where it
    raises); the extension's own run stops at the end and leaves the draw to it."""
    stream = KeyedStream(NoiseKey.from_seed(5), "end")
    pos = (1 << 35) - 60
    outs = []
    for mod in (NATIVE, None):
        monkeypatch.setattr(scalar, "NATIVE", mod)
        monkeypatch.setattr(rng, "NATIVE", mod)
        cur = WordCursor(stream, 0, pos)
        out: list[int] = []
        with pytest.raises(ValueError, match="beyond 2"):
            scalar.discrete_laplace_into(cur, 1000, 100, out, 1)
        outs.append((out, cur.position))
    assert outs[0] == outs[1]
    raw = _native(stream, 0, pos, 1000, 1, 100)
    assert 0 < len(raw) < 200  # stopped at the end
    assert raw == _reference(stream, 0, pos, 1000, 1, len(raw) // 2)


@pytest.mark.parametrize("mech", [ECC, SimECC])
def test_mechanisms_release_and_encode_the_same(mech: type[ECC] | type[SimECC],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A mixed stream (dense steps, ⊥ runs through skip) with the extension and without:
    the same releases at every step and the same state bytes, also after a restore."""
    gen = np.random.default_rng(11)
    xs = [None if r < 0.6 else 1.0 for r in gen.random(3000)]
    runs = []
    for mod in (NATIVE, None):
        monkeypatch.setattr(scalar, "NATIVE", mod)
        monkeypatch.setattr(rng, "NATIVE", mod)
        monkeypatch.setattr(block, "NATIVE", mod)
        monkeypatch.setattr(svt, "NATIVE", mod)
        key = NoiseKey.from_seed(42)
        m = mech(1.0, 1e-5, key, "c/native")
        outs: list[object] = []
        i = 0
        while i < len(xs):
            if xs[i] is None and i + 50 < len(xs) and xs[i + 1] is None:
                j = i
                while j < len(xs) and xs[j] is None:
                    j += 1
                outs.append(m.skip(j - i))
                i = j
            else:
                outs.append(m.update(xs[i]))
                i += 1
            if i % 500 < 2:
                m = type(m).from_bytes(m.to_bytes(), key)
        outs.append(m.to_bytes())
        runs.append(outs)
    assert runs[0] == runs[1]


#: Scales of the block sampler: t up to block.BLOCK_MAX_T, s from 1 to far above t.
BLOCK_SCALES = [(1, 1), (2, 1), (3, 2), (7, 1), (100, 1), (524_320, 1), (2 ** 16 + 1, 3),
                (1 << 48, 1), (5, 1000), (1000, 999_999)]


def _attempts_reference(stream: KeyedStream, lane: int, pos: int, a: int, t: int, s: int
                        ) -> tuple[list[int], list[int], list[tuple[int, ...]], int]:
    m_tab, lim_tab, _p = block._block_tables(t, s, 4, block._MAX_SUB)
    src = block._Words(stream, lane, 64)
    src.pos = pos
    ok, vals, parked = block._run_attempts(src, a, t, s, m_tab, lim_tab)
    return ok.tolist(), vals.tolist(), [tuple(p) for p in parked], src.pos


@pytest.mark.parametrize(("t", "s"), BLOCK_SCALES)
def test_block_attempts_agree(t: int, s: int) -> None:
    """block._run_attempts (numpy) against the extension's: the same accepted attempts and
    samples, the same parked attempts with their state, the same words consumed."""
    assert NATIVE is not None
    rejected = 0
    for stream, lane in _streams(12):
        for pos, a in [(0, 1), (0, 7), (3, 100), (0, 1500), (10_000, 2900)]:
            want = _attempts_reference(stream, lane, pos, a, t, s)
            got = NATIVE.discrete_laplace_attempts(stream.derived_key(), lane, pos, a, t, s)
            assert got is not None
            ids, vals, pk, after = got
            assert (ids, vals, [tuple(p) for p in pk], after) == want, (t, s, lane, pos, a)
            rejected += sum(w > F18_LIMIT_INT
                            for w in stream.word_array(lane, pos, after - pos))
    # Words rejected for the Bernoulli(exp(-1)) trials (about 3.5e-4 a word: the step
    # is redone with a fresh word) were among those compared. A parked attempt (eight
    # sub-passes, or a remainder 0 mod 18!) does not come up in any run (below 1e-15 a
    # word): the extension returns them as the reference's code does.
    assert rejected > 0


@pytest.mark.parametrize(("t", "s"), BLOCK_SCALES)
def test_block_and_bank_agree(t: int, s: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """discrete_laplace_block and a LaplaceBank's chunks with the extension and with the
    reference: the same samples (a chunk of 1,024 is what an SVT's bank computes)."""
    outs = []
    for mod in (NATIVE, None):
        monkeypatch.setattr(block, "NATIVE", mod)
        got = []
        for stream, lane in _streams(6):
            for n in (1, 5, 1024):
                got.append(block.discrete_laplace_block(stream, min(lane + 1, (1 << 96) - 1),
                                                        t, s, n).tolist())
        bank = block.LaplaceBank(KeyedStream(NoiseKey.from_seed(3), "bank"), t, s, 256)
        got.append([bank.draw(i) for i in (0, 255, 256, 3000, 1)])
        outs.append(got)
    assert outs[0] == outs[1]
    # Control: another label gives other samples, so agreement is not vacuous.
    other = block.discrete_laplace_block(KeyedStream(NoiseKey.from_seed(0), "other", "/z"),
                                         1, t, s, 1024).tolist()
    assert other != outs[0][2] or not any(outs[0][2])


def test_block_attempts_control_one_word_off() -> None:
    """The extension's attempts from a position one word off disagree with the
    reference's: the comparison above would see a shifted layout."""
    assert NATIVE is not None
    stream = KeyedStream(NoiseKey.from_seed(4), "off", "/z")
    want = _attempts_reference(stream, 1, 0, 1500, 524_320, 1)
    got = NATIVE.discrete_laplace_attempts(stream.derived_key(), 1, 1, 1500, 524_320, 1)
    assert got is not None and (got[0], got[1]) != (want[0], want[1])


#: SVT plans: epsilons of the partition's SVT (the scale t1 from about 2^17 to 2^22 units),
#: inputs from far below the threshold (a first candidate step by step, k < 0 draws) to
#: far above it (fires at once), ranges short and unbounded, from several positions.
PLAN_EPS = (0.05, 0.5, 1.0, 4.0)
PLAN_OFFSETS = (-40.0, -3.0, -0.5, 0.0, 0.5, 2.0, 8.0, 40.0)
PLAN_RANGES = ((1, svt.HORIZON), (1, 9), (9, svt.HORIZON), (5, 50), (1000, svt.HORIZON),
               (123_456, 1 << 40))


def _plans(count: int) -> Iterator[tuple[svt.SVT, int, int, int, int]]:
    """(instance, v, start, end, position) over PLAN_EPS x PLAN_OFFSETS x PLAN_RANGES."""
    key = NoiseKey.from_seed(23)
    for eps in PLAN_EPS:
        for i in range(count):
            inst = svt.SVT(eps, 10.0, key, f"plan/{eps}/{i}")
            for off in PLAN_OFFSETS:
                v = round((10.0 + off) * 65536) + svt.svt_threshold_units(eps, 0.0, 1)
                for j, (start, end) in enumerate(PLAN_RANGES):
                    yield inst, v, start, end, (i * 37 + j * 5) % 29


def _native_plan(inst: svt.SVT, v: int, start: int, end: int, pos: int
                 ) -> tuple[int | None, int] | None:
    assert NATIVE is not None
    return NATIVE.svt_plan(inst._scan.stream.derived_key(), pos, v, start, end, inst.tau,
                           inst._b8, inst._c, inst.z0, inst._t1, inst._lam, inst._log1pq,
                           inst._g)


def test_svt_plan_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    """The extension's plan (`svt_plan`) against the reference `SVT._sample` on the same
    skip lane: the same firing step (or none) and the same position after, for every
    case it decides; it decides nearly all of them, and the cases cover fired and never,
    steps with k < 0 (a whole DLap draw) and candidates (rejected and accepted)."""
    monkeypatch.setattr(svt, "NATIVE", None)
    decided = declined = fired = never = 0
    far = 0
    for inst, v, start, end, pos in _plans(12):
        want = inst._sample(v, start, end, pos)
        got = _native_plan(inst, v, start, end, pos)
        if got is None:
            declined += 1
            continue
        assert got == want, (inst.eps, v, start, end, pos)
        decided += 1
        fired += want[0] is not None
        never += want[0] is None
        far += want[0] is not None and want[0] > start + 3
    assert declined <= decided // 1000
    assert fired > 200 and never > 200 and far > 50


def test_svt_plan_through_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """`SVT._sample` with the extension (the production path) and without it agree, and
    a stream that is not the cipher's (a test's substitute words) is read by the
    reference: the extension never sees those words."""
    for inst, v, start, end, pos in _plans(3):
        monkeypatch.setattr(svt, "NATIVE", NATIVE)
        got = inst._sample(v, start, end, pos)
        monkeypatch.setattr(svt, "NATIVE", None)
        assert got == inst._sample(v, start, end, pos)

    class Shifted(KeyedStream):
        __slots__ = ()

        def word_array(self, lane: int, start: int, n: int) -> array[int]:
            return super().word_array(lane, start + 1, n)

    monkeypatch.setattr(svt, "NATIVE", NATIVE)
    differ = 0
    for inst, v, start, end, pos in _plans(2):
        want = inst._sample(v, start, end, pos)
        own = inst._scan
        inst._scan = WordCursor(Shifted(NoiseKey.from_seed(23), own.stream.label))
        differ += inst._sample(v, start, end, pos)[0] != want[0]
        inst._scan = own
    assert differ > 50


def test_svt_plan_controls_disagree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Controls: the extension's plan read one word off, or with Z_0 one scale (t1) higher, must
    disagree with the reference in many cases (so the agreement above is not vacuous)."""
    monkeypatch.setattr(svt, "NATIVE", None)
    shifted = moved = cases = 0
    for inst, v, start, end, pos in _plans(4):
        want = inst._sample(v, start, end, pos)
        off = _native_plan(inst, v, start, end, pos + 1)
        shifted += off is not None and off[0] != want[0]
        inst.z0 += inst._t1
        other = _native_plan(inst, v, start, end, pos)
        inst.z0 -= inst._t1
        moved += other is not None and other != want
        cases += 1
    assert shifted > cases // 10
    assert moved > cases // 10


def test_mode_switch() -> None:
    assert native.load("reference") is None
    assert native.load("native") is NATIVE
    with pytest.raises(ImportError, match="DPC_SAMPLERS"):
        native.load("fast")


def test_an_extension_built_from_older_sources_is_not_used(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An extension without the block attempts (built before them, setup not run again)
    is not used: the reference makes every draw (auto), or the start fails (native).
    Control: the complete extension is used."""
    assert NATIVE is not None
    stale = types.SimpleNamespace(discrete_laplace_run=NATIVE.discrete_laplace_run,
                                  keystream=NATIVE.keystream)
    monkeypatch.setattr(importlib, "import_module", lambda _name: stale)
    assert native.load("auto") is None
    with pytest.raises(ImportError, match="discrete_laplace_attempts"):
        native.load("native")
    complete = types.SimpleNamespace(**{f: getattr(NATIVE, f) for f in native.FUNCTIONS})
    monkeypatch.setattr(importlib, "import_module", lambda _name: complete)
    assert native.load("auto") is complete
