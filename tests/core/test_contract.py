"""The Counter contract (processor/core/api.py), checked for every registered mechanism.

Parametrized over registry.names(), so a mechanism joins this suite by registering.
Everything here is deterministic (fixed seeds); nothing is statistical.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from processor.core import registry
from processor.core import state as state_codec
from processor.core.api import Counter
from processor.core.errors import InvalidInputError, InvalidParameterError, StateFormatError
from processor.core.grid import UNIT
from processor.core.rng import NoiseKey

EPS, DELTA = 1.0, 1e-5
NAMES = registry.names()
KEY = NoiseKey.from_seed(2024)


#: A large eps too, so that mechanisms that release rarely at eps = 1 (ECC waits for a
#: checkpoint) still change their output within a short test stream.
EPS_HIGH = 200.0


#: Non-default parameterisations that must honour the contract too. "basecc[sqrt]" is the
#: dense square-root variant (linear state: exempt from the state-size check only).
VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "basecc[sqrt]": ("basecc", {"base": "sqrt"}),
    "partitioncc[T=500]": ("partitioncc", {"horizon": 500}),
}
DENSE = {"basecc[sqrt]"}
CASES = NAMES + list(VARIANTS)


def mech(case: str) -> str:
    """The registry name of a test case."""
    return VARIANTS[case][0] if case in VARIANTS else case


def make(case: str, counter_id: str = "c", key: NoiseKey = KEY, eps: float = EPS) -> Counter:
    name, params = VARIANTS.get(case, (case, {}))
    return registry.make(name, eps, DELTA, key, counter_id, **params)


def stream(n: int, seed: int) -> list[float | None]:
    """A mixed stream: ⊥, 0, 1 and fractions (some off the grid, which to_units rounds)."""
    rng = np.random.default_rng(seed)
    choices: list[float | None] = [None, None, None, 0.0, 1.0, 1.0, 0.5, 0.3, 0.75]
    return [choices[i] for i in rng.integers(0, len(choices), n)]


def run(c: Counter, xs: list[float | None]) -> list[float]:
    return [c.update(x) for x in xs]


def test_ecc_and_simecc_run_the_blt_base() -> None:
    """The suite covers the BLT base counter (processor/core/blt.py, the default of CC and
    BCC) through ECC and SimECC: every contract test below runs it."""
    for name in ("ecc", "simecc"):
        c = make(name)
        assert c._cc.base == "blt" and c._bcc._cc.base == "blt"  # type: ignore[attr-defined]


def test_registry_has_the_baselines_and_rejects_unknown_names() -> None:
    assert {"basecc", "partitioncc", "gaussiancc", "tree"} <= set(NAMES)
    with pytest.raises(InvalidParameterError, match="basecc"):
        registry.make("no-such-mechanism", EPS, DELTA, KEY)
    with pytest.raises(InvalidParameterError):
        registry.make("basecc", EPS, DELTA, KEY, "c", no_such_param=1)
    with pytest.raises(StateFormatError):
        registry.restore(state_codec.pack("no-such-mechanism", 1, {}), KEY)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("eps, delta", [(0.0, DELTA), (-1.0, DELTA), (math.nan, DELTA),
                                        (math.inf, DELTA), (EPS, 1.5), (EPS, math.nan)])
def test_invalid_parameters_are_rejected(name: str, eps: float, delta: float) -> None:
    with pytest.raises(InvalidParameterError):
        registry.make(name, eps, delta, KEY, "c")


@pytest.mark.parametrize("name", NAMES)
def test_class_attributes(name: str) -> None:
    cls = registry.MECHANISMS[name]
    assert cls.mechanism == name
    assert isinstance(cls.edit_private, bool)
    c = make(name)
    assert c.t == 0 and c.y == 0.0


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -0.1, 1.5, "1", True, [], b"\x01",
                                 2, -1, pytest.param(10**400, id="int-1e400"),
                                 pytest.param(-(10**5000), id="int-neg-1e5000")])
def test_invalid_input_raises_and_leaves_state_untouched(name: str, bad: object) -> None:
    c = make(name)
    run(c, stream(20, 1))
    before = c.to_bytes()
    with pytest.raises(InvalidInputError):
        c.update(bad)  # type: ignore[arg-type]
    assert c.to_bytes() == before
    with pytest.raises(InvalidInputError):
        c.skip(-1)
    assert c.to_bytes() == before


@pytest.mark.parametrize("name", CASES)
def test_update_units_is_update_on_the_grid(name: str) -> None:
    """update_units(u) steps exactly as update(u / UNIT) (state bytes equal after every
    tick), and refuses what is not grid units, state untouched. Control: a value off by
    one unit gives other state."""
    a, b = make(name), make(name)
    for x in stream(150, 5):
        u = round((x or 0.0) * UNIT)
        assert b.update_units(u) == a.update(u / UNIT)
        assert b.to_bytes() == a.to_bytes()
    for bad in (-1, UNIT + 1, 0.5, True, None):
        with pytest.raises(InvalidInputError):
            b.update_units(bad)  # type: ignore[arg-type]
        assert b.to_bytes() == a.to_bytes()
    a.update(1.0)
    b.update_units(UNIT - 1)
    assert b.to_bytes() != a.to_bytes()


@pytest.mark.parametrize("name", CASES)
def test_updates_are_grid_floats_and_t_advances(name: str) -> None:
    c = make(name)
    for i, x in enumerate(stream(200, 2), start=1):
        y = c.update(x)
        assert type(y) is float
        assert (y * UNIT).is_integer(), "release is not a multiple of 2^-16"
        assert c.t == i
        assert c.y == y
        b = c.error_bound(0.05)
        assert math.isfinite(b) and b >= 0


@pytest.mark.parametrize("name", CASES)
def test_bound_at_the_current_tick_and_its_cache_key_survive_a_restore(name: str) -> None:
    """error_bound_at(t) at the current tick is error_bound(); a restored counter has the
    same bound_key and bound (the operator caches bounds by bound_key, beta and t)."""
    c = make(name)
    run(c, stream(150, 4))
    assert c.error_bound_at(c.t, 0.05) == c.error_bound(0.05)
    r = type(c).from_bytes(c.to_bytes(), KEY)
    assert r.bound_key() == c.bound_key()
    assert r.error_bound(0.05) == c.error_bound(0.05)


@pytest.mark.parametrize("name", CASES)
def test_skip_reports_changes_inside_the_range(name: str) -> None:
    c = make(name)
    run(c, stream(37, 3))
    for n in (0, 1, 5, 64, 300):
        t0, y0 = c.t, c.y
        changes = c.skip(n)
        assert c.t == t0 + n
        ts = [t for t, _ in changes]
        assert ts == sorted(set(ts))
        assert all(t0 < t <= t0 + n for t in ts)
        assert all((y * UNIT).is_integer() for _, y in changes)
        assert c.y == (changes[-1][1] if changes else y0)
        c.update(1.0)


@pytest.mark.parametrize("name", CASES)
def test_skip_before_next_due_changes_nothing_but_t(name: str) -> None:
    c = make(name)
    run(c, stream(50, 4))
    due = c.next_due()
    assert due is None or due > c.t
    if due is not None and due - c.t - 1 > 0:
        y0 = c.y
        assert c.skip(due - c.t - 1) == []
        assert c.y == y0


@pytest.mark.parametrize("eps", [EPS, EPS_HIGH])
@pytest.mark.parametrize("name", CASES)
def test_restore_at_random_cut_points_continues_identically(name: str, eps: float) -> None:
    xs = stream(400, 5)
    want = run(make(name, eps=eps), xs)
    assert len(set(want)) > 1 or eps == EPS
    rng = np.random.default_rng(6)
    cuts = sorted({int(v) for v in rng.integers(1, len(xs), 4)} | {1, 255, 256})
    c = make(name, eps=eps)
    got: list[float] = []
    start = 0
    for cut in [*cuts, len(xs)]:
        got += run(c, xs[start:cut])
        data = c.to_bytes()
        c = type(c).from_bytes(data, KEY)
        assert c.to_bytes() == data, "state does not round-trip"
        r = registry.restore(data, KEY)
        assert type(r) is type(c) and r.to_bytes() == data
        start = cut
    assert got == want


@pytest.mark.parametrize("name", CASES)
def test_same_key_same_outputs_other_id_or_key_different(name: str) -> None:
    xs = stream(300, 7)
    a = run(make(name, "alpha", eps=EPS_HIGH), xs)
    assert len(set(a)) > 1
    assert run(make(name, "alpha", eps=EPS_HIGH), xs) == a
    assert run(make(name, "beta", eps=EPS_HIGH), xs) != a
    assert run(make(name, "alpha", NoiseKey.from_seed(99), eps=EPS_HIGH), xs) != a


@pytest.mark.parametrize("name", CASES)
def test_from_bytes_rejects_foreign_and_corrupt_state(name: str) -> None:
    c = make(name)
    run(c, stream(40, 8))
    data = c.to_bytes()
    cls = type(c)
    other = next(n for n in NAMES if n != mech(name))
    with pytest.raises(StateFormatError):
        cls.from_bytes(make(other).to_bytes(), KEY)
    corrupt = [
        b"",
        b"XYZ" + data[3:],                 # bad magic
        data[:3] + bytes([99]) + data[4:],  # unsupported version
        data[: len(data) // 2],            # truncated payload
        data[:4] + b"[1, 2, 3]",           # payload not a dict
    ]
    body = state_codec.unpack(data, mech(name), data[3])
    for field in [k for k in body if k != "m"]:
        for bad_value in ("x", -1, None, [1]):
            mutated = dict(body)
            mutated[field] = bad_value
            corrupt.append(state_codec.pack(mech(name), data[3], mutated))
    for bad in corrupt:
        try:
            restored = cls.from_bytes(bad, KEY)
        except StateFormatError:
            continue
        # A mutation that still parses must at least be a coherent state (e.g. a field
        # whose bad value is accepted as a valid one, like y = -1): it must round-trip.
        assert restored.to_bytes() == cls.from_bytes(restored.to_bytes(), KEY).to_bytes()
    for bad in corrupt[:5]:
        with pytest.raises(StateFormatError):
            cls.from_bytes(bad, KEY)


@pytest.mark.parametrize("name", CASES)
def test_state_stays_small(name: str) -> None:
    """State at t = 2^14 under 4 KiB, except the dense sqrt variant (linear by design)."""
    if name in DENSE:
        pytest.skip("dense square-root variant keeps every draw")
    c = make(name)
    xs = stream(1 << 10, 9)
    run(c, xs)
    c.skip((1 << 14) - len(xs))
    assert c.t == 1 << 14
    assert len(c.to_bytes()) < 4096


def _with_leaf(body: object, path: tuple[object, ...], value: object) -> object:
    """A copy of the state body with the leaf at `path` replaced."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(body, dict):
        out = dict(body)
        out[head] = _with_leaf(body[head], rest, value)
        return out
    assert isinstance(body, list) and isinstance(head, int)
    items = list(body)
    items[head] = _with_leaf(body[head], rest, value)
    return items


def _int_leaves(body: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    if isinstance(body, dict):
        return [p for k, v in body.items() for p in _int_leaves(v, (*path, k))]
    if isinstance(body, list):
        return [p for i, v in enumerate(body) for p in _int_leaves(v, (*path, i))]
    return [path] if isinstance(body, int) and not isinstance(body, bool) else []


@pytest.mark.parametrize("name", CASES)
def test_restore_errors_never_quote_state_values(name: str) -> None:
    """State holds private quantities (noise, sums, scheduled releases): a restore error
    must not echo a field's content, e.g. the ValueError text of int('31415926x')."""
    c = make(name, eps=EPS_HIGH)
    run(c, stream(40, 9))
    data = c.to_bytes()
    body = state_codec.unpack(data, mech(name), data[3])
    for path in _int_leaves(body)[:200]:
        bad = state_codec.pack(mech(name), data[3], _with_leaf(body, path, "31415926x"))  # type: ignore[arg-type]
        try:
            type(c).from_bytes(bad, KEY)
        except StateFormatError as exc:
            assert "31415926" not in str(exc), path
