"""The ledger's per-unit totals beside open families, recomputed from the ledger alone.

In user mode a person who touches keys of an open family incurs the admission gate's term
(1 + e^eps_u) m delta0 per key gate beside the releases' unit_delta (docs/open-keys.md,
the Theorem). A deployment that has or had a user-mode family records each family's
gate delta0 on the ledger (a record with `"entry": "family"`), and every user-mode entry
must state `unit_delta_total` at least unit_delta + (1 + e^unit_epsilon) m D, D the
largest delta0 any record names: a person touching keys of families made under several
selection_deltas gets at most that. This check recomputes it all from the published
bytes, apart from the worker's code (it imports nothing of the processor: an audit never
imports the code it checks, docs/audit.md), and names every record that states less;
replay's comparison reports each as "understated". Deterministic:
its false-alarm rate is 0 up to the relative tolerance REL, far below any difference a
wrong delta0 makes (a factor m, or the ratio of two selection_deltas).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Final

import orjson

#: Relative tolerance of the float comparisons (the worker rounds its totals up by one
#: ulp; this evaluation's own rounding differs by a few ulps).
REL: Final = 1e-9


def _objects(values: Iterable[bytes | None]) -> list[dict[str, Any]]:
    """The JSON objects among `values` this check reads: those that may be a family's
    record ("entry": "family") or a user-mode entry ("privacy_unit": "user"). Either
    string is in a value's bytes as written, or the value escapes a character (a
    backslash): any other value is neither, and is not decoded (at a million event-mode
    entries, seconds and a million dicts held at once)."""
    out = []
    for raw in values:
        if raw is None or (b"family" not in raw and b"user" not in raw
                           and b"\\" not in raw):
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if type(obj) is dict:
            out.append(obj)
    return out


def _num(obj: dict[str, Any], name: str) -> float | None:
    v = obj.get(name)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def check_totals(values: Iterable[bytes | None]) -> list[tuple[str, str]]:
    """(counter or family, what is wrong) for every ledger record among `values` whose
    statement about a person the families' records contradict; empty when none."""
    objects = _objects(values)
    problems: list[tuple[str, str]] = []
    gates: list[float] = []
    for obj in objects:
        if obj.get("entry") != "family" or type(obj.get("family")) is not str:
            continue
        name = obj["family"]
        d0, sel = _num(obj, "gate_delta0"), _num(obj, "selection_delta")
        eps, m = _num(obj, "unit_epsilon"), _num(obj, "max_counters_per_unit")
        if d0 is None or sel is None or eps is None or m is None or not 0 < d0 < 1:
            problems.append((name, "a family record without its gate's parameters"))
            continue
        gates.append(d0)
        if (1.0 + math.exp(eps)) * m * d0 > sel * (1.0 + REL):
            problems.append((name, f"gate delta0 {d0!r} above selection_delta / ((1 + "
                                   f"e^eps_u) m) = {sel / ((1.0 + math.exp(eps)) * m)!r}"))
    gate = max(gates, default=None)
    for obj in objects:
        counter = obj.get("counter")
        if type(counter) is not str or obj.get("privacy_unit") != "user":
            continue
        stated = _num(obj, "unit_delta_total")
        if gate is None:
            if "[" in counter:
                problems.append((counter, "a key's entry with no family record of its "
                                          "gate's delta0 on the ledger"))
            continue
        delta, eps, m = (_num(obj, "unit_delta"), _num(obj, "unit_epsilon"),
                         _num(obj, "max_counters_per_unit"))
        if delta is None or eps is None or m is None:
            continue  # not a user-mode entry replay can read: flagged as malformed there
        need = delta + (1.0 + math.exp(eps)) * m * gate
        if stated is None:
            problems.append((counter, f"no unit_delta_total beside open families (at "
                                      f"least {need!r} with the largest gate delta0 "
                                      f"{gate!r})"))
        elif stated < need * (1.0 - REL):
            problems.append((counter, f"unit_delta_total {stated!r} below {need!r} (the "
                                      f"largest gate delta0 {gate!r})"))
    return problems
