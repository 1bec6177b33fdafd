"""A restored ECC or SimECC must run under the plan of its stored (eps, delta,
calibration): CC and BCC carry their own (eps, delta) in the state, and a state whose inner
parameters differ (tampered, or written by another plan) is refused with
StateParameterError (a StateFormatError, so the stream operator's handling of undecodable
state applies), never continued silently. Deterministic: no statistics. Control: the
untampered state restores and continues exactly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from processor.core import registry
from processor.core.ecc import ECC, SimECC
from processor.core.errors import StateFormatError, StateParameterError
from processor.core.rng import NoiseKey
from processor.core.state import pack, unpack

KEY = NoiseKey.from_seed(31)
Mech = type[ECC] | type[SimECC]


def _state(cls: Mech, calibration: str, ticks: int) -> dict[str, Any]:
    c = cls(10.0, 1e-6, KEY, "a", calibration=calibration)
    for t in range(ticks):
        c.update(1.0 if t % 3 else None)
    return unpack(c.to_bytes(), cls.mechanism, cls.state_version)


def _scale_cc(cc: dict[str, Any], field: str, factor: float) -> None:
    """Multiply a UnboundedCC state's eps or delta, and its running counter's (half of it),
    consistently: the CC's own restore check then passes, as it did before the plan check."""
    cc[field] = cc[field] * factor
    if cc.get("in") is not None:
        cc["in"][field] = cc["in"][field] * factor


def _cc_eps(st: dict[str, Any]) -> None:
    _scale_cc(st["cc"], "e", 100.0)


def _cc_delta(st: dict[str, Any]) -> None:
    _scale_cc(st["cc"], "d", 10.0)


def _bcc_eps(st: dict[str, Any]) -> None:
    st["bcc"]["e"] *= 4.0
    _scale_cc(st["bcc"]["cc"], "e", 4.0)


def _top_eps(st: dict[str, Any]) -> None:
    st["eps"] = st["eps"] * 2.0  # the inner counters still at the old plan


TAMPER: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "cc eps x100": (_cc_eps, "cc eps"),
    "cc delta x10": (_cc_delta, "cc delta"),
    "bcc eps x4": (_bcc_eps, "bcc eps"),
    "top eps x2": (_top_eps, "cc eps"),
}


@pytest.mark.parametrize("cls", [ECC, SimECC])
@pytest.mark.parametrize("calibration", ["paper", "tight"])
@pytest.mark.parametrize("ticks", [5, 300])  # CC without and with a running counter
@pytest.mark.parametrize("tamper", sorted(TAMPER))
def test_tampered_state_is_refused(cls: Mech, calibration: str, ticks: int,
                                   tamper: str) -> None:
    st = _state(cls, calibration, ticks)
    fn, field = TAMPER[tamper]
    fn(st)
    data = pack(cls.mechanism, cls.state_version, st)
    with pytest.raises(StateParameterError, match=field) as err:
        registry.restore(data, KEY)  # the path the stream operator takes
    assert isinstance(err.value, StateFormatError) and err.value.field == field


@pytest.mark.parametrize("cls", [ECC, SimECC])
@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_untampered_state_restores_and_continues(cls: Mech, calibration: str) -> None:
    """Control: the same path with the state as written."""
    c = cls(10.0, 1e-6, KEY, "a", calibration=calibration)
    for t in range(300):
        c.update(1.0 if t % 3 else None)
    r = registry.restore(c.to_bytes(), KEY)
    assert [r.update(1.0) for _ in range(200)] == [c.update(1.0) for _ in range(200)]


def test_a_state_under_the_other_calibration_is_refused() -> None:
    """A paper state relabelled tight: its CC was built for the paper's plan."""
    st = _state(SimECC, "paper", 50)
    st["cal"] = "tight"
    with pytest.raises(StateParameterError, match="cc eps"):
        SimECC.from_bytes(pack("simecc", SimECC.state_version, st), KEY)


@pytest.mark.parametrize("cls", [ECC, SimECC])
def test_state_bytes_are_pack_of_the_state(cls: Mech) -> None:
    """to_bytes (pack_owned: "m" added in place) writes the bytes pack() writes of the
    same state, and leaves a given payload unchanged."""
    c = cls(10.0, 1e-6, KEY, "a")
    for t in range(40):
        c.update(1.0 if t % 3 else None)
    raw = c.to_bytes()
    st = unpack(raw, cls.mechanism, cls.state_version)
    payload = {k: v for k, v in st.items() if k != "m"}
    assert pack(cls.mechanism, cls.state_version, payload) == raw
    assert "m" not in payload
