"""The native sampler (native/, samplers/native.py) against the Python reference, bit for
bit: the same keystream words, the same draws, the same cursor position after each draw,
the same errors, and through ECC and SimECC the same releases and the same state bytes.

Deterministic (fixed keys and labels, no statistics): no false alarms. Controls: a run
read one word off, or with another label, must disagree, so agreement is not vacuous.
Skipped when the extension is not installed, unless DPC_SAMPLERS=native (CI) makes a
missing extension an error at import.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from processor.core import rng
from processor.core.ecc import ECC, SimECC
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers import native, scalar
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
        for start, n in [(0, 1), (0, 8), (5, 3), (7, 2), (8, 17), (1021, 40)]:
            want = stream.word_array(lane, start, n).tobytes()
            assert NATIVE.keystream(stream.derived_key(), lane, start, n) == want
    # the lane's last block, and past it
    stream = KeyedStream(NoiseKey.from_seed(1), "end")
    last = (1 << 35) - 8
    assert NATIVE.keystream(stream.derived_key(), 3, last, 8) == \
        stream.word_array(3, last, 8).tobytes()
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


def test_mode_switch() -> None:
    assert native.load("reference") is None
    assert native.load("native") is NATIVE
    with pytest.raises(ImportError, match="DPC_SAMPLERS"):
        native.load("fast")
