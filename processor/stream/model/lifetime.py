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

Pure: ledger values (bytes) in, a claim or a LifetimeError out.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from processor.core.bounded import check_eps_delta
from processor.core.errors import InvalidParameterError
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


@dataclass(frozen=True)
class Stated:
    """What one published ledger entry states about a person: its mode, the counter's
    per-event parameters, and (user mode) its unit claim."""

    mode: str
    parameters: tuple[str, float, float, str]
    claim: UnitClaim | None


class LifetimeError(RefusedError):
    """A configuration under which a ledger entry would state a per-unit guarantee that
    does not hold over the deployment's life (module docstring). Raised at start, before
    anything is published; names the setting and the remedy (public things only: the
    ledger, the configuration, a partition number). The operator raises it too, at a
    marker, for a partition whose state counted under the other privacy_unit
    (`operator.Operator._apply_marker`: state the ledger does not reflect yet)."""

    def __init__(self, field_name: str, stated: object, configured: object,
                 migratable: bool, source: str = "the ledger") -> None:
        self.field = field_name
        remedy = ("start a new deployment (new app_id and new private-count and ledger "
                  "topics)")
        if migratable:
            remedy = (f"set {field_name} back, or {remedy}, or confirm the migration "
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
                         "unit_delta", "unit_derivation")


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
        if mode == "user":
            claim = UnitClaim(check_bound("k", obj["contribution_bound"]),
                              check_bound("m", obj["max_counters_per_unit"]),
                              float(obj["unit_epsilon"]), float(obj["unit_delta"]),
                              str(obj["unit_derivation"]))
    except (KeyError, TypeError, ValueError, InvalidParameterError):
        return None
    if mode is None:
        return None
    return Stated(mode, params, claim)


def plain(settings: Settings) -> UnitClaim | None:
    """What the configuration alone states (None in event mode)."""
    p = settings.unit_parameters()
    if p is None:
        return None
    return UnitClaim(p.max_events_per_counter, p.max_counters_per_unit, p.unit_epsilon,
                     p.unit_delta, p.method)


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


def unit_claim(settings: Settings, history: Sequence[Stated]) -> UnitClaim | None:
    """The per-unit fields this start's ledger entries state (None in event mode), or
    LifetimeError naming the first setting that makes them untrue (module docstring)."""
    own = plain(settings)
    mode = settings.privacy_unit
    other = next((h for h in history if h.mode != mode), None)
    if other is not None:
        raise LifetimeError("privacy_unit", other.mode, mode, migratable=False)
    if own is None:
        return None
    mine = configured_parameters(settings)
    if all(h.claim == own and h.parameters == mine for h in history):
        return own
    whole = composed(settings, history)
    # A confirmed migration's entries already state `whole`: this configuration adds
    # nothing to what the ledger says (the entries before it are superseded by it).
    if settings.unit_confirm_migration or any(h.claim == whole for h in history):
        return whole
    raise _first_difference(settings, own, mine, history)


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
