"""Open counter families: keys nobody declared, counted and published only once admitted.

A family `f` declared open in the configuration (`[families] f = { open = true, ... }`)
takes events `{"counter": "f", "key": "κ"}`; each key κ is the counter named
`f[κ]` (`key_counter`): the brackets are outside the declared names' pattern, so no key's
counter is a declared counter. The key's counter runs as if declared at the family's
start (its ticks before its first event are ⊥, sealed by one exact skip; its noise keyed
by its name under the deployment's noise identity, as a declared counter's), and
`processor.core.selection.OpenKey` decides what of it is published: nothing before its
admission tick, then every release (docs/open-keys.md has the proof).

`Admission.gate` applies that rule to what one marker's sealing of a not yet admitted
key produced (`operator.Operator` collects it aside and publishes only what this returns).
Pure: no I/O.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Final

from processor.core.api import Counter
from processor.core.ecc import ECC, SimECC
from processor.core.selection import OpenKey, gate_delta0

__all__ = ["MAX_FAMILY_NAME", "MAX_KEY_BYTES", "Admission", "OpenFamily", "family_of",
           "key_counter", "key_problem"]

#: Longest key (bytes of UTF-8) and family name: a key's counter name, `f[κ]`, then stays
#: within the counter names' limit (config.MAX_COUNTER_NAME = 200 bytes).
MAX_KEY_BYTES: Final = 128
MAX_FAMILY_NAME: Final = 64


@dataclass(frozen=True, slots=True)
class OpenFamily:
    """One open family's public parameters: the start its keys are counted from (epoch
    ms, on the tick grid) and delta_sel, the delta the admission gate adds to the
    releases' (`selection.gate_delta0`)."""

    start_ms: int
    selection_delta: float

    def delta0(self, epsilon: float, keys: int = 1) -> float:
        """The gate's failure probability delta0 for `keys` keys per unit at `epsilon`:
        the per-event epsilon and one key in event mode, the unit's target epsilon and
        its m in user mode (`config.Settings.gate_delta0`)."""
        return gate_delta0(epsilon, self.selection_delta, keys)


def key_counter(family: str, key: str) -> str:
    """The counter name of `key` in `family`."""
    return f"{family}[{key}]"


def family_of(name: str) -> str | None:
    """The family a counter name belongs to (None: not a key's counter). A family name
    has no '[' (it matches the declared names' pattern), so the first '[' splits it."""
    family, bracket, rest = name.partition("[")
    if not bracket or not rest.endswith("]") or not family:
        return None
    return family


def key_problem(key: object) -> str | None:
    """Why `key` cannot name a key (the rule, never the value), or None: a non-empty
    string of at most MAX_KEY_BYTES bytes of UTF-8 (no lone surrogate) without control
    characters (which would garble the logs and the lines that quote a counter name)."""
    if not isinstance(key, str):
        return "key must be a string"
    if not key:
        return "key must not be empty"
    try:
        n = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return "key is not valid Unicode text"
    if n > MAX_KEY_BYTES:
        return f"key longer than {MAX_KEY_BYTES} bytes"
    # A printable string has no control character (str.isprintable is false for
    # every Cc character): the per-character look-up only for the others.
    if not key.isprintable() and any(unicodedata.category(ch) == "Cc" for ch in key):
        return "key contains a control character"
    return None


@dataclass(slots=True)
class Admission:
    """A key's admission state (kept in its counter state): `delta0`, its gate's failure
    probability, fixed when the key is made (a key keeps its gate as a counter keeps its
    parameters: the proof's schedule is one schedule); `first`, the key's local tick of
    its first event (None before its first marker); `admitted`, its admission tick
    (None: not admitted)."""

    delta0: float
    first: int | None = None
    admitted: int | None = None

    def gate(self, counter: Counter, before: tuple[int, float],
             changes: list[tuple[int, float]]) -> tuple[int, float] | None:
        """After one sealing of the not yet admitted key: `before` its (t, y) ahead of
        it, `changes` every (t, y) where y changed inside it, in tick order (through
        counter.t). Returns the admission tick and the release there if the gate
        admits the key in it (and records the tick), else None. The gate (`OpenKey`) is
        consulted at the key's first tick and at every change from it on: y is constant
        in between and the threshold never decreases, so no crossing is missed."""
        assert self.first is not None and self.admitted is None
        assert isinstance(counter, ECC | SimECC)  # families run ECC or SimECC (config)
        first = self.first
        t0, y = before
        points: list[tuple[int, float, bool]] = []
        if t0 < first <= counter.t:
            # y at the first tick: the last value at or before it
            at_first = y
            for t, v in changes:
                if t > first:
                    break
                at_first = v
            points.append((first, at_first, False))
        points += [(t, v, True) for t, v in changes if t >= first]
        if not points:
            return None  # nothing to consult (most seals: an input that left y as it was)
        gate = OpenKey(counter, self.delta0, first)
        points.sort(key=lambda p: p[0])
        for t, v, changed in points:
            if gate.observe(t, v, changed):
                self.admitted = t
                return t, v
        return None
