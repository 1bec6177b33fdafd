"""The guarantee per unit over a deployment's whole life: what a ledger entry may state,
given every configuration the deployment ran under (its published ledger) and this one.

A ledger entry of a privacy_unit = "user" deployment states a per-unit guarantee
(`unit_epsilon`, `unit_delta`) and the bounds behind it (k = `contribution_bound`, m =
`max_counters_per_unit`). It must hold for every person over the deployment's life, so a
worker checks, at start and before it publishes anything, what this configuration would
state against what the ledger stated (`unit_claim`):

- The unit fields and every counter's per-event parameters are what every entry states:
  the derivation of the configuration (`plain`), byte-identical entries as always.
- privacy_unit changed (an entry of the other mode): refused, remedy a new deployment.
  Event mode bounds nobody's events, so a person's events counted then have no bound a
  user-mode entry could state; a user-mode entry promised its bound for the whole life.
- Otherwise (bounds, target, derivation, mechanism or calibration changed): refused unless
  the migration is confirmed (`[unit] confirm_migration = true`), and the entries then
  state the composed guarantee (`composed`): the bounding stage's kept sets persist across
  configurations (a unit never gets more than K = the largest k and M = the largest m it
  ran under), each counter keeps the per-event (eps, delta) it was made with, so by group
  privacy and basic composition (docs/privacy-unit.md, Lemmas 1 and 2) one person gets at
  most (M K max eps_i, M max delta_i S_K(eps_i)) over the per-event parameters of every
  configuration. A later start whose composed guarantee an entry already states needs
  no confirmation: nothing it states is new.
- Open families in user mode (docs/open-keys.md): a person touching keys of a family also
  incurs the admission gate's term, (1 + e^unit_epsilon) m delta0 for delta0 the largest
  any gate ever used (`gate_bound`). The worker records each family's delta0 on the
  ledger at start, before any key is made with it (`family_entries`: data-independent,
  public configuration only), and every user-mode entry of a deployment with such a record
  states `unit_delta_total` with that largest delta0, D. A start that would need a larger
  D than an entry states, or adds a family under entries stating no total, is refused
  (`unit_claim`); lowering selection_delta or removing a family keeps D and is accepted.
  A confirmed migration is refused while the ledger holds a family record: keys not
  admitted keep per-event parameters no entry shows, which `composed` would miss.

Pure: ledger values (bytes) in, a claim or a LifetimeError out.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson

from processor.core.bounded import check_eps_delta
from processor.core.errors import InvalidParameterError
from processor.core.selection import selection_delta
from processor.core.unit import METHOD, check_bound, unit_guarantee
from processor.errors import RefusedError
from processor.stream.model.config import Settings

#: The `unit_derivation` of an entry stating the composed guarantee.
METHOD_LIFETIME: Final = "lifetime:" + METHOD

#: The ledger's privacy_unit values (records.LedgerEntry) and the setting they mean.
_MODE_OF_ENTRY: Final = {"one event": "event", "user": "user"}


@dataclass(frozen=True)
class UnitClaim:
    """The per-unit fields a ledger entry states (records.unit_ledger_fields)."""

    max_events_per_counter: int
    max_counters_per_unit: int
    unit_epsilon: float
    unit_delta: float
    derivation: str
    #: The largest delta0 any open family's admission gate ever used or will use (None:
    #: the deployment never had a user-mode family; the entry then states no total).
    gate_delta0: float | None = None

    def delta_total(self) -> float | None:
        """The entry's `unit_delta_total`: unit_delta plus the gate's term for the m
        keys a person may touch (None without a family)."""
        if self.gate_delta0 is None:
            return None
        return selection_delta(self.unit_epsilon, self.unit_delta, self.gate_delta0,
                               self.max_counters_per_unit)


@dataclass(frozen=True)
class Stated:
    """What one published ledger entry states about a person: its mode, the counter's
    per-event parameters, (user mode) its unit claim and its total with the gate's term
    (`unit_delta_total`, None if it states none)."""

    mode: str
    parameters: tuple[str, float, float, str]
    claim: UnitClaim | None
    total: float | None = None


class LifetimeError(RefusedError):
    """A configuration under which a ledger entry would state a per-unit guarantee that
    does not hold over the deployment's life (module docstring). Raised at start, before
    anything is published; names the setting and the remedy (public things only: the
    ledger, the configuration, a partition number). The operator raises it too, at a
    marker, for a partition whose state counted under the other privacy_unit
    (`operator.Operator._apply_marker`: state the ledger does not reflect yet)."""

    def __init__(self, field_name: str, stated: object, configured: object,
                 migratable: bool, source: str = "the ledger",
                 remedy: str | None = None) -> None:
        self.field = field_name
        new = "start a new deployment (new app_id and new private-count and ledger topics)"
        if remedy is None:
            remedy = new
        if migratable:
            remedy = (f"set {field_name} back, or {new}, or confirm the migration "
                      "([unit] confirm_migration = true: every later ledger entry then "
                      "states the guarantee composed over every configuration, "
                      "docs/privacy-unit.md)")
        super().__init__(
            f"{field_name}: {source} states {stated!r} for this deployment but the "
            f"configuration says {configured!r}; its per-unit guarantee would not hold "
            f"over the deployment's life. To go on, {remedy}.")


def counter_parameters(entries: dict[Stated, list[str]]
                       ) -> dict[str, set[tuple[str, float, float, str]]]:
    """counter -> the per-event parameters its published entries (`entries_of`) state."""
    out: dict[str, set[tuple[str, float, float, str]]] = {}
    for st, names in entries.items():
        for name in names:
            out.setdefault(name, set()).add(st.parameters)
    return out


def ledger_objects(ledger_values: Iterable[bytes | None]) -> Iterator[dict[str, Any]]:
    """The values of a ledger topic that decode to an object naming a counter (a str
    "counter"), in order; tombstones, foreign records and undecodable values skipped."""
    for raw in ledger_values:
        if not raw:
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if type(obj) is dict and type(obj.get("counter")) is str:
            yield obj


#: The fields of an entry `statement` reads: what it states is a function of these alone.
_STATED_FIELDS: Final = ("privacy_unit", "mechanism", "epsilon", "delta", "calibration",
                         "contribution_bound", "max_counters_per_unit", "unit_epsilon",
                         "unit_delta", "unit_derivation", "unit_delta_total")


def entries_of(objects: Iterable[dict[str, Any]]) -> dict[Stated, list[str]]:
    """What the decoded ledger entries `objects` (`ledger_objects`) state -> the counters
    of the entries that state it, in the order both first appear (values that state
    nothing skipped). A ledger has an entry per counter but few distinct statements
    (every entry of one configuration states the same), so `statement` runs once per
    distinct projection of an entry on the fields it reads, keyed by that projection's
    JSON (which keeps 1 and 1.0, -0.0 and 0.0, "1" and 1, null and absent apart), and
    sees that projection only: a field it read and the key left out would show as absent
    in every answer, never as a stale one."""
    out: dict[Stated, list[str]] = {}
    counters_of: dict[bytes, list[str] | None] = {}
    for obj in objects:
        projection: dict[str, Any] = {f: obj[f] for f in _STATED_FIELDS if f in obj}
        key = orjson.dumps(projection)
        if key in counters_of:
            names = counters_of[key]
        else:
            st = statement(projection)
            names = counters_of[key] = None if st is None else out.setdefault(st, [])
        if names is not None:
            names.append(obj["counter"])
    return out


def statement(obj: dict[str, Any]) -> Stated | None:
    """What the decoded ledger entry `obj` states (None: not an entry of either mode)."""
    mode = _MODE_OF_ENTRY.get(obj.get("privacy_unit", "one event"))
    try:
        params = (str(obj["mechanism"]), float(obj["epsilon"]), float(obj["delta"]),
                  str(obj.get("calibration", "paper")))
        # Values no worker writes (a record that is not an entry of this deployment):
        # nothing a person's guarantee could be composed from.
        check_eps_delta(params[1], params[2])
        claim = None
        total = None
        if mode == "user":
            claim = UnitClaim(check_bound("k", obj["contribution_bound"]),
                              check_bound("m", obj["max_counters_per_unit"]),
                              float(obj["unit_epsilon"]), float(obj["unit_delta"]),
                              str(obj["unit_derivation"]))
            if "unit_delta_total" in obj:
                total = float(obj["unit_delta_total"])
    except (KeyError, TypeError, ValueError, InvalidParameterError):
        return None
    if mode is None:
        return None
    return Stated(mode, params, claim, total)


def plain(settings: Settings) -> UnitClaim | None:
    """What the configuration alone states (None in event mode), its families' largest
    gate delta0 included."""
    p = settings.unit_parameters()
    if p is None:
        return None
    return UnitClaim(p.max_events_per_counter, p.max_counters_per_unit, p.unit_epsilon,
                     p.unit_delta, p.method, configured_gate(settings))


def configured_gate(settings: Settings) -> float | None:
    """The largest gate delta0 of the configured families in user mode (None: none)."""
    if settings.privacy_unit != "user" or not settings.families:
        return None
    return max(settings.gate_delta0(f) for f in settings.families)


#: The `entry` of a family's record on the ledger (`family_entries`).
FAMILY_ENTRY: Final = "family"
_FAMILY_MARK: Final = b'"family"'


def family_objects(ledger_values: Iterable[bytes | None]) -> Iterator[dict[str, Any]]:
    """The values of a ledger topic that decode to a family record (`family_entries`)."""
    for raw in ledger_values:
        # Only a value naming the entry kind is decoded (a ledger holds a million
        # counters' entries and a few families' records).
        if not raw or _FAMILY_MARK not in raw:
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if (type(obj) is dict and obj.get("entry") == FAMILY_ENTRY
                and type(obj.get("family")) is str):
            yield obj


def recorded_gates(objects: Iterable[dict[str, Any]]) -> dict[str, float]:
    """family -> the largest gate delta0 its records (`family_objects`) state (values no
    worker writes skipped)."""
    out: dict[str, float] = {}
    for obj in objects:
        d0 = obj.get("gate_delta0")
        if type(d0) is float and 0.0 < d0 < 1.0:
            out[obj["family"]] = max(d0, out.get(obj["family"], 0.0))
    return out


def gate_bound(settings: Settings, recorded: dict[str, float]) -> float | None:
    """D: the largest delta0 any family's gate ever used or, under `settings`, will use
    (None: no user-mode family, ever)."""
    values = list(recorded.values())
    mine = configured_gate(settings)
    if mine is not None:
        values.append(mine)
    return max(values) if values else None


def family_entries(settings: Settings, recorded: dict[str, float]) -> list[tuple[bytes, bytes]]:
    """The (key, value) records a start writes to the ledger before any key is made: one
    per configured user-mode family whose gate delta0 is above what the ledger records of
    it, so the ledger always records the largest delta0 each family's gate used. Public
    configuration only, written at start (never at an event)."""
    if settings.privacy_unit != "user":
        return []
    p = settings.unit_parameters()
    assert p is not None
    out = []
    for name, fam in sorted(settings.families.items()):
        d0 = settings.gate_delta0(name)
        if d0 > recorded.get(name, 0.0):
            out.append((name.encode("utf-8"), orjson.dumps({
                "family": name, "entry": FAMILY_ENTRY, "privacy_unit": "user",
                "selection_delta": fam.selection_delta, "unit_epsilon": p.unit_epsilon,
                "max_counters_per_unit": p.max_counters_per_unit, "gate_delta0": d0})))
    return out


def configured_parameters(settings: Settings) -> tuple[str, float, float, str]:
    """The per-event parameters a new counter of `settings` is made with."""
    return (settings.mechanism, settings.epsilon, settings.delta, settings.calibration)


def composed(settings: Settings, history: Sequence[Stated]) -> UnitClaim:
    """The guarantee one person gets over the user-mode configurations of `history` and
    `settings` (module docstring): K, M the largest bounds, basic composition over the
    worst per-event parameters."""
    own = plain(settings)
    assert own is not None
    claims = [own] + [h.claim for h in history if h.claim is not None]
    k = max(c.max_events_per_counter for c in claims)
    m = max(c.max_counters_per_unit for c in claims)
    params = {configured_parameters(settings)[1:3]} | {h.parameters[1:3] for h in history}
    per = [unit_guarantee(e, d, k, m) for e, d in sorted(params)]
    return UnitClaim(k, m, max(g[0] for g in per), max(g[1] for g in per), METHOD_LIFETIME)


def unit_claim(settings: Settings, history: Sequence[Stated],
               recorded: dict[str, float] | None = None) -> UnitClaim | None:
    """The per-unit fields this start's ledger entries state (None in event mode), or
    LifetimeError naming the first setting that makes them untrue (module docstring);
    `recorded`: the families' gate delta0 the ledger records (`recorded_gates`)."""
    own = plain(settings)
    mode = settings.privacy_unit
    other = next((h for h in history if h.mode != mode), None)
    if other is not None:
        raise LifetimeError("privacy_unit", other.mode, mode, migratable=False)
    if own is None:
        return None
    if recorded and settings.unit_confirm_migration:
        # The configuration refuses a migration beside families; a family removed since
        # may have left keys not admitted, on no ledger a composition could read.
        raise LifetimeError("unit.confirm_migration", "open families' gate records",
                            "a confirmed migration", migratable=False)
    gate = gate_bound(settings, recorded or {})
    claim = _claim(settings, replace(own, gate_delta0=None), history)
    _check_totals(settings, gate, history)
    return replace(claim, gate_delta0=gate)


def _claim(settings: Settings, own: UnitClaim, history: Sequence[Stated]) -> UnitClaim:
    mine = configured_parameters(settings)
    if all(h.claim == own and h.parameters == mine for h in history):
        return own
    whole = composed(settings, history)
    # A confirmed migration's entries already state `whole`: this configuration adds
    # nothing to what the ledger says (the entries before it are superseded by it).
    if settings.unit_confirm_migration or any(h.claim == whole for h in history):
        return whole
    raise _first_difference(settings, own, mine, history)


def _check_totals(settings: Settings, gate: float | None, history: Sequence[Stated]) -> None:
    """Refuse a start under which an entry already written would understate a person's
    delta: with D = `gate`, each must state a total at least its claim's with D."""
    if gate is None:
        return
    field_name = "families"
    if settings.families:
        widest = max(settings.families, key=settings.gate_delta0)
        field_name = f"families.{widest}.selection_delta"
    for h in history:
        assert h.claim is not None
        need = replace(h.claim, gate_delta0=gate).delta_total()
        assert need is not None
        if h.total is None:
            raise LifetimeError(field_name, "entries with no unit_delta_total (no open "
                                "family in user mode)", f"an open family (gate delta0 {gate!r})",
                                migratable=False)
        if h.total < need:
            raise LifetimeError(field_name, f"unit_delta_total {h.total!r}",
                                f"unit_delta_total {need!r} (gate delta0 {gate!r})",
                                migratable=False, remedy="lower selection_delta back, or "
                                "start a new deployment (new app_id and new private-count "
                                "and ledger topics)")


#: The claim's fields and the settings that set them, in the order an error names them.
_CLAIM_FIELDS: Final = (("max_events_per_counter", "unit.max_events_per_counter"),
                        ("max_counters_per_unit", "unit.max_counters_per_unit"),
                        ("unit_epsilon", "unit.epsilon"), ("unit_delta", "unit.delta"),
                        ("derivation", "unit.derivation"))
_PARAMETER_FIELDS: Final = ("mechanism", "epsilon", "delta", "calibration")


def _first_difference(settings: Settings, own: UnitClaim,
                      mine: tuple[str, float, float, str],
                      history: Sequence[Stated]) -> LifetimeError:
    for h in history:
        assert h.claim is not None
        for attr, name in _CLAIM_FIELDS:
            if getattr(h.claim, attr) != getattr(own, attr):
                return LifetimeError(name, getattr(h.claim, attr), getattr(own, attr),
                                     migratable=True)
        for name, stated, configured in zip(_PARAMETER_FIELDS, h.parameters, mine,
                                            strict=True):
            if stated != configured:
                return LifetimeError(name, stated, configured, migratable=True)
    raise AssertionError("unit_claim found a difference")  # pragma: no cover
