"""The tight calibration through the stream layer's pure parts (no broker): the setting,
its fingerprint, the counters the operator makes, the ledger entry that names the
calibration, and the refusal of a restored counter made under the other one.
"""

from __future__ import annotations

import pytest

from processor.core.grid import to_units
from processor.core.rng import NoiseKey
from processor.stream.model.config import ConfigError, Settings, validate_settings, with_overrides
from processor.stream.model.operator import Operator
from processor.stream.model.provenance import ParameterChangeError
from processor.stream.model.records import Event, LedgerEntry, encode_batch, encode_marker
from processor.stream.model.state import DictStore
from tests.stream.helpers import apply_now

KEY = NoiseKey.from_seed(7)
TICK = 1000


def _settings(**kw: object) -> Settings:
    base: dict[str, object] = dict(partitions=1, tick_ms=TICK, mechanism="simecc",
                                   epsilon=10.0, delta=1e-6, heartbeat_spread=False)
    base.update(kw)
    return with_overrides(Settings(), counters={"a": 0}, **base)


def _run(s: Settings, store: DictStore, offset: int, last: int) -> list[LedgerEntry]:
    op = Operator(s, KEY)
    ledger: list[LedgerEntry] = []
    for tick in range(last):
        rec = encode_batch([Event("a", tick * TICK, to_units(1.0), -1, -1)])
        ledger += apply_now(op, store, 0, offset, rec).ledger
        ledger += apply_now(op, store, 0, offset + 1, encode_marker(tick)).ledger
        offset += 2
    return ledger


def test_setting_is_checked_and_fingerprinted_only_when_tight() -> None:
    paper, tight = _settings(), _settings(calibration="tight")
    assert paper.calibration == "paper"
    assert paper.fingerprint() == _settings(calibration="paper").fingerprint()
    assert tight.fingerprint() != paper.fingerprint()
    with pytest.raises(ConfigError) as err:
        validate_settings(_settings(calibration="Tight"))
    assert err.value.field == "calibration"


def test_ledger_names_the_calibration_and_a_change_is_refused() -> None:
    store = DictStore()
    ledger = _run(_settings(calibration="tight"), store, 0, 6)
    assert [(e.counter, e.calibration) for e in ledger] == [("a", "tight")]
    # Restored under a configuration that says "paper": refused, naming the field.
    changed = _settings(calibration="tight")
    changed = with_overrides(changed, calibration="paper")
    with pytest.raises(ParameterChangeError) as err:
        _run(changed, store, 100, 8)
    assert err.value.field == "calibration" and err.value.counter == "a"
    # Control: the default calibration is recorded as "paper".
    assert [e.calibration for e in _run(_settings(), DictStore(), 0, 6)] == ["paper"]
