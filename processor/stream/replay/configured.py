"""Whether replay was given the configuration and key the ledger was written under.

Replay recomputes with the configuration and key it is given; run with another one (a
second shell without the worker's `DPC_COUNTERS`, another key file) it finds differences
that say nothing about the published topics. `ledger_mismatch` names what the given
configuration and key contradict on the published ledger: counters it declares that no
entry announced (though their start has passed), a configuration fingerprint no entry
carries, a key fingerprint no entry carries, and a counter's parameter that none of its
entries carries. Each is an absence: an entry appended to the ledger (a forgery) can
never make one, so a tampered ledger is still reported as DIFFERENT, never blamed on the
configuration. Public values only (the ledger is public; the key is named by its public
fingerprint).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any, Final

from processor.core.rng import NoiseKey
from processor.stream.model.config import Settings
from processor.stream.model.identity import key_fingerprint
from processor.stream.replay.history import ledger_dicts

#: How many names a difference lists before "and N more".
SHOWN = 3


def _names(names: Iterable[str]) -> str:
    ordered = sorted(names)
    more = f" and {len(ordered) - SHOWN} more" if len(ordered) > SHOWN else ""
    return ", ".join(ordered[:SHOWN]) + more


def ledger_mismatch(settings: Settings, key: NoiseKey, ledger: Iterable[bytes | None],
                    now_ms: int) -> list[str]:
    """What the configuration and key contradict on the ledger (empty: nothing, or no
    ledger entry to compare with). `now_ms`: a declared counter whose start lies ahead
    cannot have been announced yet. One pass, keeping per counter only which configured
    parameters some entry of it carries (`_FIELDS` bits), never the entries."""
    configured = {"mechanism": settings.mechanism, "epsilon": settings.epsilon,
                  "delta": settings.delta, "tick_ms": settings.tick_ms,
                  "calibration": settings.calibration}
    # counter -> the bits of the fields some entry of it matches; STORED: an entry says
    # "stored" (the counter keeps its own parameters on purpose: on_parameter_change).
    matched: dict[str, int] = {}
    fingerprints: set[str] = set()
    key_ids: set[str] = set()
    counters = settings.counters
    # Nearly every entry carries the configured parameters (its own start aside): one
    # comparison of a tuple of them (`_SAME`) before the field-by-field one.
    same = tuple(configured[f] for f in _SAME)
    for e in ledger_dicts(ledger):
        name = e["counter"]
        bits = matched.get(name, 0)
        fingerprints.add(str(e.get("fingerprint")))
        key_ids.add(str(e.get("key_id")))
        start = counters.get(name)
        if start is not None:
            bits |= _bits(e, start, configured, same)
        matched[name] = bits
    if not matched:
        return []
    out: list[str] = []
    due = {c for c, start in settings.counters.items() if start <= now_ms}
    unannounced = due - matched.keys()
    if unannounced:
        out.append(f"counters {_names(unannounced)} are configured but on no ledger entry")
    if settings.fingerprint() not in fingerprints:
        out.append(f"the configuration's fingerprint {settings.fingerprint()[:12]} is on no "
                   f"ledger entry (the ledger has {_names(f[:12] for f in fingerprints)})")
    if key_fingerprint(key) not in key_ids:
        out.append(f"the noise key (fingerprint {key_fingerprint(key)}) is not the ledger's "
                   f"({_names(key_ids)})")
    changed: dict[str, set[str]] = {}
    for name, bits in matched.items():
        if name not in settings.counters or bits & _STORED:
            continue
        for bit, field in enumerate(_FIELDS):
            if not bits & (1 << bit):
                changed.setdefault(field, set()).add(name)
    for field, names in sorted(changed.items()):
        out.append(f"{field} differs from the ledger's for {_names(names)}")
    return out


def _bits(e: Mapping[str, Any], start: int, configured: Mapping[str, object],
          same: tuple[object, ...]) -> int:
    """The `_FIELDS` bits of the fields the entry `e` of a counter configured to start at
    `start` carries as configured (absent: as configured), and _STORED if it says
    "stored"."""
    bits = _STORED if e.get("parameters") == "stored" else 0
    try:
        if _same_of(e) == same and e["start_ms"] == start:
            return bits | _ALL
    except KeyError:
        pass
    for bit, field in enumerate(_FIELDS):
        value = start if field == "start_ms" else configured[field]
        if e.get(field, value) == value:
            bits |= 1 << bit
    return bits


#: The parameters compared per counter, in the order of their bits.
_FIELDS: Final = ("mechanism", "epsilon", "delta", "tick_ms", "calibration", "start_ms")
_STORED: Final = 1 << len(_FIELDS)
#: Every field matched.
_ALL: Final = _STORED - 1
#: The configured fields compared as one tuple, and a getter of an entry's.
_SAME: Final = _FIELDS[:-1]
_same_of: Final = operator.itemgetter(*_SAME)
