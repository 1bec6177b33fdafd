"""privacy_unit = "user": configuration, the input's unit field, the ledger's unit fields
(docs/privacy-unit.md). Pure: no Kafka, no randomness.

Includes the fuzz category of unit ids (missing, empty, too long, non-string, lone
surrogates, nested): every bad id is dead-lettered with its own reason, none crashes, and
the good ids at the edges (1 byte, exactly MAX_UNIT_ID bytes, non-ASCII) are accepted.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jsonschema
import orjson
import pytest

from processor.core import unit
from processor.core.grid import GRID_BITS, UNIT
from processor.stream.model.config import (
    ConfigError,
    Settings,
    load_settings,
    with_overrides,
    with_unit,
)
from processor.stream.model.records import (
    LEDGER_UNIT_HEADERS,
    MAX_UNIT_ID,
    Event,
    LedgerEntry,
    Rejection,
    parse_input,
    unit_ledger_fields,
)

SCHEMAS = Path(__file__).parents[2] / "schemas"
NOW = 1_767_225_600_000
EVENT = with_overrides(Settings(), counters={"signups": NOW - 3_600_000})
USER = with_unit(EVENT, 4.0, 1e-6, 3, 2)

USER_TOML = """
app_id = "demo"
privacy_unit = "user"
[unit]
epsilon = 4.0
delta = 1e-6
max_events_per_counter = 3
max_counters_per_unit = 2
[counters]
a = 0
"""


def _write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return str(p)


# ---------------------------------------------------------------------- configuration


def test_user_mode_derives_the_counters_parameters(tmp_path: Path) -> None:
    s = load_settings(_write(tmp_path, USER_TOML), env={})
    # The default mechanism (ECC, the paper's constants): the k-edit coupling applies.
    p = unit.derive(4.0, 1e-6, 3, 2, mechanism=s.mechanism, calibration=s.calibration)
    assert p.method == unit.METHOD_COUPLED
    assert (s.privacy_unit, s.epsilon, s.delta) == ("user", p.event_epsilon, p.event_delta)
    assert s.unit_parameters() == p
    # Environment overrides reach the [unit] fields.
    s2 = load_settings(_write(tmp_path, USER_TOML), env={"DPC_MAX_EVENTS_PER_COUNTER": "1"})
    assert s2.max_events_per_counter == 1
    assert s2.epsilon == unit.derive(4.0, 1e-6, 1, 2, mechanism=s2.mechanism,
                                     calibration=s2.calibration).event_epsilon


def test_unit_derivation_basic_keeps_the_earlier_parameters(tmp_path: Path) -> None:
    """unit.derivation = "basic" (file or DPC_UNIT_DERIVATION) derives by group privacy
    and basic composition only: what user-mode deployments made before the coupling run
    with. Controls: the default differs from it here; an unknown value is refused."""
    basic = unit.derive(4.0, 1e-6, 3, 2)
    text = USER_TOML.replace("[unit]", '[unit]\nderivation = "basic"')
    s = load_settings(_write(tmp_path, text), env={})
    assert (s.unit_derivation, s.epsilon, s.delta) == (
        "basic", basic.event_epsilon, basic.event_delta)
    s2 = load_settings(_write(tmp_path, USER_TOML), env={"DPC_UNIT_DERIVATION": "basic"})
    assert (s2.epsilon, s2.delta) == (basic.event_epsilon, basic.event_delta)
    default = load_settings(_write(tmp_path, USER_TOML), env={})
    assert default.unit_derivation == "coupling" and default.epsilon != basic.event_epsilon
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, USER_TOML.replace("[unit]", '[unit]\nderivation = "x"')),
                      env={})
    assert err.value.field == "unit.derivation"
    with pytest.raises(ConfigError):
        with_overrides(EVENT, unit_derivation="basic")


def test_event_mode_is_unchanged() -> None:
    """Default: no unit, the same fingerprint as before the feature (the dict it hashed
    then, recomputed here), no unit fields in the ledger."""
    s = Settings(counters={"a": 0})
    assert s.privacy_unit == "event" and s.unit_parameters() is None
    before = {"mechanism": s.mechanism, "epsilon": s.epsilon, "delta": s.delta,
              "tick_ms": s.tick_ms, "counters": [["a", 0]],
              "allow_undeclared": False, "grid_bits": GRID_BITS, "contribution_bound": 1}
    assert s.fingerprint() == hashlib.sha256(
        orjson.dumps(before, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert unit_ledger_fields(s) == {}
    # Control: the user mode's fingerprint differs (the bounds and target are in it).
    assert USER.fingerprint() != EVENT.fingerprint()


@pytest.mark.parametrize("text,field", [
    (USER_TOML.replace('app_id = "demo"', 'app_id = "demo"\nepsilon = 1.0'), "epsilon"),
    (USER_TOML.replace("delta = 1e-6\n", ""), "unit.delta"),
    (USER_TOML.replace("max_counters_per_unit = 2", "max_counters_per_unit = 0"),
     "unit.max_counters_per_unit"),
    (USER_TOML.replace("max_events_per_counter = 3", "max_events_per_counter = 2.5"),
     "unit.max_events_per_counter"),
    (USER_TOML.replace("epsilon = 4.0", "epsilon = -1"), "unit.epsilon"),
    (USER_TOML.replace("delta = 1e-6", "delta = 1.5"), "unit.delta"),
    (USER_TOML.replace("[unit]", "[unit]\nepsilonn = 1"), "unit.epsilonn"),
    (USER_TOML.replace('privacy_unit = "user"', 'privacy_unit = "person"'), "privacy_unit"),
    (USER_TOML.replace('privacy_unit = "user"', ""), "unit"),
    (USER_TOML.replace('privacy_unit = "user"', 'privacy_unit = "user"\n'
                       'allow_undeclared = true'), "allow_undeclared"),
    # A target the mechanism cannot run with once divided by k m: named as the unit's.
    # (eps 5000 / (3 * 2) = 833 per event: BCC's eta underflows above ~792 at delta 1e-6).
    (USER_TOML.replace("epsilon = 4.0", "epsilon = 5000.0"), "unit"),
])
def test_bad_unit_configuration_names_the_field(tmp_path: Path, text: str,
                                                field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, text), env={})
    assert err.value.field.startswith(field), err.value


def test_settings_built_by_hand_must_carry_the_derivation() -> None:
    """Control of validate_settings: user mode with a hand-set epsilon is refused."""
    with pytest.raises(ConfigError) as err:
        with_overrides(USER, epsilon=1.0)
    assert err.value.field == "epsilon"
    with pytest.raises(ConfigError):
        with_overrides(EVENT, max_events_per_counter=2)


# ---------------------------------------------------------------------- input


def _ev(**fields: object) -> bytes:
    return orjson.dumps({"counter": "signups", "ts": NOW, **fields})


def test_user_mode_events_carry_their_unit() -> None:
    assert parse_input(_ev(user="alice"), USER, NOW, 2, 7) == Event(
        "signups", NOW, UNIT, 2, 7, "alice")
    # Event mode: accepted by the schema, not used.
    assert parse_input(_ev(user="alice"), EVENT, NOW) == Event("signups", NOW, UNIT)


UNIT_FUZZ: list[tuple[str, bytes]] = [
    ("unit_missing", _ev()),
    ("unit_missing", _ev(user=None)),
    ("invalid_unit", _ev(user="")),
    ("invalid_unit", _ev(user="x" * (MAX_UNIT_ID + 1))),
    ("invalid_unit", _ev(user="é" * (MAX_UNIT_ID // 2 + 1))),  # 258 bytes, 129 chars
    ("invalid_unit", _ev(user=7)),
    ("invalid_unit", _ev(user=True)),
    ("invalid_unit", _ev(user=["alice"])),
    ("invalid_unit", _ev(user={"id": "alice"})),
    ("invalid_unit", b'{"counter": "signups", "ts": %d, "user": "\\ud800"}' % NOW),
    ("invalid_unit", b'{"counter": "signups", "ts": %d, "user": "a\\udfffb"}' % NOW),
]


@pytest.mark.parametrize("reason,raw", UNIT_FUZZ)
def test_bad_unit_ids_are_dead_lettered_with_their_reason(reason: str, raw: bytes) -> None:
    got = parse_input(raw, USER, NOW)
    assert isinstance(got, Rejection) and got.reason == reason
    assert "alice" not in got.detail and "\ud800" not in got.detail


@pytest.mark.parametrize("uid", ["a", "x" * MAX_UNIT_ID, "é" * (MAX_UNIT_ID // 2), "👤u"])
def test_unit_ids_at_the_edges_are_accepted(uid: str) -> None:
    got = parse_input(_ev(user=uid), USER, NOW)
    assert isinstance(got, Event) and got.unit == uid


def test_input_schema_agrees_with_the_parser_on_units() -> None:
    schema = json.loads((SCHEMAS / "input-event.schema.json").read_text())
    v = jsonschema.Draft202012Validator(schema)
    assert v.is_valid(orjson.loads(_ev(user="alice")))
    assert not v.is_valid(orjson.loads(_ev(user="")))
    assert not v.is_valid(orjson.loads(_ev(user=7)))


# ---------------------------------------------------------------------- ledger


def test_user_mode_ledger_entry_carries_the_unit_bounds_and_both_guarantees() -> None:
    p = USER.unit_parameters()
    assert p is not None
    entry = LedgerEntry(counter="signups", mechanism="ecc", epsilon=USER.epsilon,
                        delta=USER.delta, tick_ms=1000, start_ms=0, key_id="0" * 16,
                        creation="0" * 32,
                        **unit_ledger_fields(USER))
    doc = orjson.loads(entry.to_json())
    assert doc["schema_version"] == 2 and entry.headers() == list(LEDGER_UNIT_HEADERS)
    assert (doc["privacy_unit"], doc["unit_field"]) == ("user", "user")
    assert (doc["contribution_bound"], doc["max_counters_per_unit"]) == (3, 2)
    assert (doc["unit_epsilon"], doc["unit_delta"]) == (4.0, 1e-6)
    assert (doc["epsilon"], doc["delta"]) == (p.event_epsilon, p.event_delta)
    schema = json.loads((SCHEMAS / "ledger-entry.schema.json").read_text())
    v = jsonschema.Draft202012Validator(schema)
    assert v.is_valid(doc)
    # Controls: a v2 entry without its unit fields, a v1 entry with them.
    assert not v.is_valid({k: x for k, x in doc.items() if k != "unit_epsilon"})
    assert not v.is_valid(dict(doc, schema_version=1))
    # Event mode: the version-1 bytes, no unit field at all.
    ev = LedgerEntry(counter="signups", mechanism="ecc", epsilon=1.0, delta=1e-6,
                     tick_ms=1000, start_ms=0, key_id="0" * 16, creation="0" * 32)
    assert b'"unit_' not in ev.to_json() and orjson.loads(ev.to_json())["schema_version"] == 1
    assert v.is_valid(orjson.loads(ev.to_json()))
