"""The gate's term over a user-mode deployment's life (docs/open-keys.md, "In the stream",
and processor/stream/model/lifetime.py): every start records its families' gate delta0
on the ledger before it makes a key, every user-mode entry beside a family states
unit_delta_total with the largest delta0 any gate used, a start that would make a written
total false is refused, one that keeps every total true is accepted, and the ledger's
totals check (processor/stream/replay/gate_totals.py, apart from the worker's code) flags
an entry that states less. Pure: no Kafka. Deterministic (fixed noise key, no statistical claim).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import jsonschema
import orjson
import pytest

from processor.errors import error_line
from processor.stream.model import lifetime
from processor.stream.model.config import Settings, with_overrides, with_unit
from processor.stream.model.families import OpenFamily
from processor.stream.model.lifetime import LifetimeError, UnitClaim
from processor.stream.model.state import DictStore
from processor.stream.replay.gate_totals import check_totals
from processor.stream.worker.app import ledger_at_start
from tests.stream.test_lifetime import EVENT, KEY, USER1, _life, _values

SEL = 1e-7
FIELD = "families.pages.selection_delta"


def fam(sel: float, base: Settings = USER1) -> Settings:
    return with_overrides(base, families={"pages": OpenFamily(0, sel)})


FAM = fam(SEL)


def _start(s: Settings, ledger: list[bytes | None]
           ) -> tuple[UnitClaim | None, list[bytes | None]]:
    """A worker's start on `ledger`: the claim its entries state, and the ledger after
    the family records it writes before anything else (app.read_ledger's reading)."""
    _, claim = ledger_at_start(s, KEY, ledger)
    recorded = lifetime.recorded_gates(lifetime.family_objects(ledger))
    return claim, ledger + [v for _, v in lifetime.family_entries(s, recorded)]


def _entries(s: Settings, claim: UnitClaim | None, offset: int = 0) -> list[bytes | None]:
    """A declared counter's created entry under `s` stating `claim`."""
    return _values(_life(s, DictStore(), offset, 1, 3, claim=claim))


def _need(entry: bytes | None, gate: float) -> float:
    """What an entry must state, recomputed here (not through selection.py)."""
    obj = orjson.loads(entry or b"")
    return float(obj["unit_delta"] + (1.0 + math.exp(obj["unit_epsilon"]))
                 * obj["max_counters_per_unit"] * gate)


def test_entries_state_the_lifetime_gate_lowering_and_removing_keep_it() -> None:
    """The first start records delta0 d1; its entries (declared counters' too) state the
    total with d1. Lowering selection_delta later is accepted and records nothing: the
    entries still state d1, the largest a gate used (a key made earlier keeps d1).
    Removing the family is accepted alike. Control: entries stating the lowered
    configuration's own delta0 (what a worker without the lifetime record would write)
    are flagged by the totals check, and the next start refuses them."""
    claim, ledger = _start(FAM, [])
    d1 = FAM.gate_delta0("pages")
    assert claim is not None and claim.gate_delta0 == d1 and len(ledger) == 1
    schema = json.loads((Path(__file__).parents[2] / "schemas" / "ledger-family.schema.json"
                         ).read_text())
    v = jsonschema.Draft202012Validator(schema)
    record = orjson.loads(ledger[0] or b"")
    v.validate(record)
    assert record["gate_delta0"] == d1 and record["selection_delta"] == SEL
    assert not v.is_valid({k: x for k, x in record.items() if k != "gate_delta0"})
    ledger += _entries(FAM, claim)
    total = orjson.loads(ledger[-1] or b"")["unit_delta_total"]
    assert total == claim.delta_total()
    assert _need(ledger[-1], d1) * (1 - 1e-12) <= total <= _need(ledger[-1], d1) * (1 + 1e-9)
    assert check_totals(ledger) == []

    low = fam(SEL / 10)
    assert low.gate_delta0("pages") < d1
    claim_low, after = _start(low, ledger)
    assert after == ledger  # nothing recorded: the ledger already records more
    assert claim_low is not None and claim_low.gate_delta0 == d1
    assert orjson.loads(_entries(low, claim_low, 100)[0] or b"")["unit_delta_total"] == total
    claim_gone, after = _start(USER1, ledger)
    assert after == ledger and claim_gone is not None and claim_gone.gate_delta0 == d1
    assert orjson.loads(_entries(USER1, claim_gone)[0] or b"")["unit_delta_total"] == total
    # A migration after the family is gone is refused: its keys not admitted (their
    # per-event parameters) are on no ledger a composition could read.
    with pytest.raises(LifetimeError) as err:
        ledger_at_start(with_overrides(USER1, unit_confirm_migration=True), KEY, ledger)
    assert err.value.field == "unit.confirm_migration"

    # Control: the lowered configuration's own delta0 (lifetime.plain), as if the
    # lifetime record did not exist.
    bad = _entries(low, lifetime.plain(low), 200)
    assert [who for who, _ in check_totals(ledger + bad)] == ["a"]
    with pytest.raises(LifetimeError) as err:
        ledger_at_start(low, KEY, ledger + bad)
    assert err.value.field == FIELD


def test_raising_selection_delta_is_refused_once_an_entry_states_a_total() -> None:
    """Before any entry a larger selection_delta is accepted (nothing is stated yet) and
    recorded; once an entry states the total with d1, a start needing more is refused
    at start with one error line naming the setting, remedy a new deployment (no
    migration restates what was written)."""
    _, ledger = _start(FAM, [])
    high = fam(SEL * 10)
    claim_high, raised = _start(high, ledger)
    assert claim_high is not None and claim_high.gate_delta0 == high.gate_delta0("pages")
    assert len(raised) == 2
    assert lifetime.recorded_gates(lifetime.family_objects(raised)) == {
        "pages": high.gate_delta0("pages")}

    claim, _ = _start(FAM, ledger)
    ledger += _entries(FAM, claim)
    with pytest.raises(LifetimeError) as err:
        ledger_at_start(high, KEY, ledger)
    assert err.value.field == FIELD
    line = error_line(err.value)
    assert line.startswith(f"error: {FIELD}:") and "\n" not in line
    assert "new deployment" in line and "confirm_migration" not in line
    # A second family with a larger delta0 raises D alike.
    both = with_overrides(FAM, families={"pages": OpenFamily(0, SEL),
                                         "codes": OpenFamily(0, SEL * 10)})
    with pytest.raises(LifetimeError) as err:
        ledger_at_start(both, KEY, ledger)
    assert err.value.field == "families.codes.selection_delta"
    # Control: the same configuration restarts.
    assert _start(FAM, ledger) == (claim, ledger)


def test_adding_a_family_beside_entries_without_the_gate_term_is_refused() -> None:
    """A user-mode deployment without families wrote entries stating unit_delta only
    (version-2 bytes, no total): adding a family would make them false for a person who
    touches keys too. Refused at start. Controls: a new deployment with the family
    starts; in event mode a family writes no record and no total."""
    ledger = _entries(USER1, None)
    assert b"unit_delta_total" not in (ledger[0] or b"")
    assert lifetime.plain(USER1) is not None and lifetime.family_entries(USER1, {}) == []
    with pytest.raises(LifetimeError) as err:
        ledger_at_start(FAM, KEY, ledger)
    assert err.value.field == FIELD
    assert "\n" not in error_line(err.value)
    assert _start(FAM, [])[0] is not None
    event_fam = fam(SEL, EVENT)
    assert _start(event_fam, []) == (None, [])
    assert b"unit_delta_total" not in (_entries(event_fam, None)[0] or b"")


def test_the_totals_check_flags_what_the_family_records_contradict() -> None:
    """The independent check on a ledger: the real one passes; controls, each flagged: a
    family record whose delta0 ignores m (the factor (1 + e^eps_u) m left out), a
    declared counter's entry without the gate's term beside a family, a key's entry
    with no family record on the ledger, an entry stating a total with a smaller
    delta0 than a record names."""
    claim, ledger = _start(FAM, [])
    ledger += _entries(FAM, claim)
    assert check_totals(ledger) == []
    record = orjson.loads(ledger[0] or b"")
    entry = orjson.loads(ledger[1] or b"")

    loose = {**record, "gate_delta0": record["selection_delta"] / 2}
    # (the entry then understates what that gate costs, too)
    assert [w for w, _ in check_totals([orjson.dumps(loose), *ledger[1:]])] == ["pages", "a"]
    bare = {k: v for k, v in entry.items() if k != "unit_delta_total"}
    assert [w for w, _ in check_totals([ledger[0], orjson.dumps(bare)])] == ["a"]
    key = {**entry, "counter": "pages[x]"}
    assert [w for w, _ in check_totals([ledger[1], orjson.dumps(key)])] == ["pages[x]"]
    higher = {**record, "family": "codes", "gate_delta0": record["gate_delta0"] * 2,
              "selection_delta": record["selection_delta"] * 2}
    assert [w for w, _ in check_totals([*ledger, orjson.dumps(higher)])] == ["a"]
    # Control: the event-mode ledger and one without families have nothing to check.
    assert check_totals(_entries(USER1, None) + _entries(EVENT, None)) == []
    # Records the check reads are found however their strings are written: with every
    # "family" and "user" escaped (a value holding neither word is not decoded) they
    # are flagged as before.
    def escape(d: dict[str, object]) -> bytes:
        raw = orjson.dumps(d).replace(b"family", b"f\\u0061mily")
        raw = raw.replace(b"user", b"\\u0075ser")
        assert b"family" not in raw and b"user" not in raw and orjson.loads(raw) == d
        return raw

    assert [w for w, _ in check_totals([escape(loose), *ledger[1:]])] == ["pages", "a"]
    assert [w for w, _ in check_totals([ledger[1], escape(key)])] == ["pages[x]"]


#: SHA-256 of `_declared_only_digest` on main (c08cf25's main, before open families in
#: user mode), computed by the same function there.
DECLARED_ONLY = "d1bd2d21983f802831f372aa64bc479154a14bf66b5e6fd32d3b7276221a0054"


def _declared_only_digest() -> str:
    h = hashlib.sha256()
    for k, m in ((1, 1), (3, 2)):
        s = with_unit(with_overrides(EVENT, counters={"a": 0, "b": 0}), 4.0, 1e-6, k, m)
        for e in _life(s, DictStore(), 0, 5, 12):
            h.update(e.to_json())
    return h.hexdigest()


def test_user_mode_entries_without_families_are_byte_identical_to_main() -> None:
    """A user-mode deployment that never had a family writes no record and entries of
    exactly main's bytes (two unit bounds, two declared counters). Control: the same
    entries stating a gate's total hash differently."""
    assert _declared_only_digest() == DECLARED_ONLY
    s = with_unit(with_overrides(EVENT, counters={"a": 0, "b": 0}), 4.0, 1e-6, 1, 1)
    assert lifetime.family_entries(s, {}) == [] and lifetime.plain(s) is not None
    claim = lifetime.plain(s)
    assert claim is not None and claim.gate_delta0 is None
    with_gate = _life(s, DictStore(), 0, 5, 12,
                      claim=dataclasses.replace(claim, gate_delta0=1e-12))
    assert all(b"unit_delta_total" in e.to_json() for e in with_gate)
