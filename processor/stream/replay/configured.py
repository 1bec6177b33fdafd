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

from collections.abc import Iterable, Mapping
from typing import Any

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
    cannot have been announced yet."""
    entries = ledger_dicts(ledger)
    if not entries:
        return []
    by_counter: dict[str, list[Mapping[str, Any]]] = {}
    for e in entries:
        by_counter.setdefault(e["counter"], []).append(e)
    out: list[str] = []
    due = {c for c, start in settings.counters.items() if start <= now_ms}
    unannounced = due - set(by_counter)
    if unannounced:
        out.append(f"counters {_names(unannounced)} are configured but on no ledger entry")
    fingerprints = {str(e.get("fingerprint")) for e in entries}
    if settings.fingerprint() not in fingerprints:
        out.append(f"the configuration's fingerprint {settings.fingerprint()[:12]} is on no "
                   f"ledger entry (the ledger has {_names(f[:12] for f in fingerprints)})")
    key_ids = {str(e.get("key_id")) for e in entries}
    if key_fingerprint(key) not in key_ids:
        out.append(f"the noise key (fingerprint {key_fingerprint(key)}) is not the ledger's "
                   f"({_names(key_ids)})")
    configured = {"mechanism": settings.mechanism, "epsilon": settings.epsilon,
                  "delta": settings.delta, "tick_ms": settings.tick_ms,
                  "calibration": settings.calibration}
    changed: dict[str, set[str]] = {}
    for name, own in by_counter.items():
        if name not in settings.counters or any(e.get("parameters") == "stored" for e in own):
            continue  # "stored": the counter keeps its own on purpose (on_parameter_change)
        wanted = {**configured, "start_ms": settings.counters[name]}
        for field, value in wanted.items():
            if all(e.get(field, value) != value for e in own):
                changed.setdefault(field, set()).add(name)
    for field, names in sorted(changed.items()):
        out.append(f"{field} differs from the ledger's for {_names(names)}")
    return out
