"""What the published ledger says each counter ran under, and the provenance that gives
the operator in replay.

The worker never changes a counter's parameters: a counter keeps the mechanism, epsilon,
delta and calibration it was created with, keyed under the noise identity of the
configuration it was created under, whatever the later configurations say
(on_parameter_change = "keep"); a configuration change only changes the fingerprint its
later releases carry, announced by a "reconfigured" ledger entry from the tick of its first
release under it. Replay, given the current configuration, takes from the published ledger
what the timeline cannot tell (`LedgerHistory`): per counter, the parameters and
fingerprint of its "created" entry and the fingerprint in force at each tick (the entry
with the largest since_tick <= t). `LedgerProvenance` hands exactly that to the operator
(`provenance.Provenance`); everything else is recomputed from the timeline and the key,
and every recomputed entry and release is compared byte for byte, so a ledger that lies
about a counter makes its recomputed releases (or entries) differ. A ledger entry replay
cannot use is an "inconsistent" difference with the reason (parameters the configuration
validation refuses, a creation under the current fingerprint with other parameters than
it gives, two creations of one counter...).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from processor.core import registry
from processor.core.api import Counter
from processor.core.rng import NoiseKey
from processor.stream.model.config import ConfigError, Settings, with_overrides
from processor.stream.model.families import family_of
from processor.stream.model.identity import counter_id, key_fingerprint, noise_identity
from processor.stream.model.lifetime import (
    UnitClaim,
    family_objects,
    gate_bound,
    recorded_gates,
    statement,
)
from processor.stream.model.provenance import ConfiguredProvenance, Parameters, parameters_of
from processor.stream.replay.report import Difference, RecordKey


@dataclass
class LedgerHistory:
    """What the published ledger says each counter ran under (module docstring): the
    parameters and fingerprint of its creation, and its fingerprints by since_tick. Only
    entries of this deployment's key are used; `problems` lists the entries replay could
    not use ("inconsistent" differences, with the reason)."""

    #: counter -> (parameters, fingerprint) of its "created" entry.
    created: dict[str, tuple[Parameters, str]] = field(default_factory=dict)
    #: counter -> its entries' since_ticks (sorted) and the fingerprints in force from them.
    since: dict[str, tuple[list[int], list[str]]] = field(default_factory=dict)
    #: fingerprint -> the parameters its configuration gives a new counter (the current
    #: configuration's; an earlier one's from the counters created under it: a creation
    #: always runs the configured parameters).
    configured: dict[str, Parameters] = field(default_factory=dict)
    #: (counter, fingerprint) -> the `parameters` label of its entry: used only for a
    #: fingerprint whose configuration replay cannot know (no counter created under it).
    labels: dict[tuple[str, str], str] = field(default_factory=dict)
    #: counter -> the creation tag of its "created" entry.
    creation: dict[str, str] = field(default_factory=dict)
    #: fingerprint -> the per-unit guarantee its entries state (lifetime.statement).
    claims: dict[str, UnitClaim | None] = field(default_factory=dict)
    #: D, the largest gate delta0 of the families' records on the ledger and of the
    #: configured families (lifetime.gate_bound): what every user-mode entry states.
    gate: float | None = None
    problems: list[Difference] = field(default_factory=list)
    #: The published releases and ledger entries, as given (`published`).
    sources: tuple[Iterable[bytes | None], ...] = ()
    _published: frozenset[bytes] | None = field(default=None, compare=False, repr=False)

    @property
    def published(self) -> frozenset[bytes]:
        """The published releases and ledger entries (bytes): which of the positions a
        restart may have had the worker computed (`recompute`). Made at the first use:
        only a counter declared after its start needs it, and at a million counters the
        set of a few million records costs about a second and hundreds of MB."""
        if self._published is None:
            self._published = frozenset(v for vs in self.sources for v in vs if v)
        return self._published

    def fingerprint_at(self, counter: str, t: int) -> str | None:
        """The fingerprint of the entry of `counter` in force at local tick t, if any."""
        got = self.since.get(counter)
        if got is None:
            return None
        i = bisect_right(got[0], t) - 1
        return got[1][i] if i >= 0 else None


def _entry_parameters(d: Mapping[str, Any]) -> Parameters:
    p = (d["mechanism"], d["epsilon"], d["delta"], d.get("calibration", "paper"))
    if not (isinstance(p[0], str) and isinstance(p[3], str)
            and type(p[1]) is float and type(p[2]) is float):
        raise TypeError("mechanism, epsilon, delta or calibration of the wrong type")
    return p


def ledger_dicts(values: Iterable[bytes | None]) -> Iterator[dict[str, Any]]:
    """The published values that look like ledger entries (the rest are "malformed"
    differences already: `comparison`), decoded one at a time: a million decoded entries
    held at once would be gigabytes."""
    for raw in values:
        try:
            d = orjson.loads(raw or b"")
        except orjson.JSONDecodeError:
            continue
        if type(d) is dict and type(d.get("counter")) is str:
            yield d


def _unusable(d: Mapping[str, Any], key_id: str, ticks: Mapping[int, str],
              key: bool) -> str | None:
    """Why replay can take nothing from the ledger entry `d` (None: it can), given the
    fingerprints its counter's entries read so far put in force (`ticks`); `key`: the
    counter is an open family's key, whose created entry starts at its admission tick
    (families.py)."""
    fp, since, kind = d.get("fingerprint"), d.get("since_tick"), d.get("entry")
    if d.get("key_id") != key_id:
        return (f"announced under the noise key {d.get('key_id')!r}, not this "
                f"deployment's ({key_id}): not used")
    if type(fp) is not str or type(since) is not int or since < 1 or kind not in (
            "created", "reconfigured"):
        return "no fingerprint, since_tick or entry kind replay can use"
    if (kind == "created") != (since == 1) and not (key and kind == "created"):
        return (f"a {kind!r} entry from tick {since}: created entries start at "
                "tick 1, reconfigured ones after it")
    if ticks.get(since, fp) != fp:
        return f"two fingerprints in force from tick {since}: {ticks[since]} and {fp}"
    return None


def _checked_parameters(d: Mapping[str, Any], per_event: Settings,
                        refusals: dict[tuple[object, ...], str | None],
                        ) -> Parameters | str:
    """The parameters of the created entry `d`, or why the configuration validation
    refuses them: the per-event parameters alone (in user mode the configuration derives
    them from its unit target, which an earlier configuration's need not be).

    Validating settings is linear in the declared counters, and nearly every entry
    repeats one configuration's parameters: `refusals` keeps the outcome per distinct
    parameters (`_distinct`)."""
    try:
        params = _entry_parameters(d)
    except (TypeError, KeyError) as exc:
        return str(exc)
    memo = _distinct(params)
    if memo not in refusals:
        try:
            with_overrides(per_event, mechanism=params[0], epsilon=params[1],
                           delta=params[2], calibration=params[3])
            refusals[memo] = None
        except (ConfigError, TypeError, KeyError) as exc:
            refusals[memo] = str(exc)
    refused = refusals[memo]
    return params if refused is None else refused


def _distinct(params: Parameters) -> tuple[object, ...]:
    """A key equal for two parameters exactly when their floats are the same floats:
    -0.0 == 0.0, but the validation's message names the value given and replay
    recomputes with the entry's own float, so a zero goes by its repr (floats other than
    zeros are equal only when they are the same float: JSON has no NaN)."""
    mechanism, eps, delta, calibration = params
    if eps and delta:
        return params
    return (mechanism, repr(eps), repr(delta), calibration)


def ledger_history(settings: Settings, key: NoiseKey, ledger: Iterable[bytes | None],
                   releases: Collection[bytes | None] = ()) -> LedgerHistory:
    """Read the published ledger into a LedgerHistory for `settings` (the current
    configuration) and `key`, checking each entry replay takes anything from; the
    published `releases` only serve to place a restart (`recompute`)."""
    ledger = list(dict.fromkeys(ledger))  # identical re-sends (after a crash) count once
    # Every start records its families' gates before it makes a key: D is the ledger's
    # largest (the configuration's only before any start recorded one).
    recorded = recorded_gates(family_objects(ledger))
    h = LedgerHistory(sources=(ledger, releases),
                      gate=max(recorded.values()) if recorded else gate_bound(settings, {}))
    current = settings.fingerprint()
    key_id = key_fingerprint(key)
    # The operator's own reading of the settings: what a new counter runs with.
    configured_now = ConfiguredProvenance(settings, key).configured_parameters()
    per_event = with_overrides(
        settings, privacy_unit="event", unit_epsilon=None, unit_delta=None,
        max_events_per_counter=1, max_counters_per_unit=1, unit_derivation="coupling",
        unit_confirm_migration=False)
    h.configured[current] = configured_now
    entries: dict[str, dict[int, str]] = {}
    # Distinct parameters -> why the validation refuses them (None: it accepts them).
    refusals: dict[tuple[object, ...], str | None] = {}
    by_fingerprint: dict[str, dict[RecordKey, Parameters]] = {}
    # Nearly every counter has the parameters, fingerprint and since_ticks of many others:
    # one object for each distinct one (a million counters hold a few).
    shared: dict[tuple[tuple[object, ...], str], tuple[Parameters, str]] = {}
    histories: dict[tuple[tuple[int, ...], tuple[str, ...]], tuple[list[int], list[str]]] = {}
    families = settings.families
    problems = h.problems
    for d in ledger_dicts(ledger):
        name = d["counter"]
        k: RecordKey = (name, str(d.get("creation", "")), str(d.get("fingerprint", "")))
        reason = _unusable(d, key_id, entries.get(name, {}),
                           bool(families) and family_of(name) in families)
        if reason is not None:
            problems.append(Difference("ledger", k, "inconsistent", reason))
            continue
        fp, since, kind = d["fingerprint"], d["since_tick"], d["entry"]
        # The first entry of a fingerprint stating anything says what it states.
        if fp not in h.claims:
            stated = statement(d)
            if stated is not None:
                h.claims[fp] = (None if stated.claim is None
                                else replace(stated.claim, gate_delta0=h.gate))
        ticks = entries.setdefault(name, {})
        label = d.get("parameters")
        if type(label) is str:
            h.labels[name, fp] = label
        if kind != "created":
            ticks[since] = fp
            continue
        if name in h.created:
            if h.creation[name] == k[1]:
                continue  # the same creation published twice differently: "conflicting"
            problems.append(Difference(
                "ledger", k, "inconsistent", "a second creation of the counter (the worker "
                "refuses to create an announced counter again): not used"))
            continue
        params = _checked_parameters(d, per_event, refusals)
        if isinstance(params, str):
            problems.append(Difference(
                "ledger", k, "inconsistent", f"the configuration validation refuses its "
                f"parameters ({params}): recomputed with the configured ones"))
            continue
        if fp == current:
            if params != configured_now:
                problems.append(Difference(
                    "ledger", k, "inconsistent", f"created under the current "
                    f"configuration's fingerprint with {params}, but that configuration "
                    f"gives {configured_now}"))
                continue
        else:
            by_fingerprint.setdefault(fp, {})[k] = params
        ticks[since] = fp
        # The entry's own floats (`_distinct`) are what replay recomputes with.
        h.created[name] = shared.setdefault((_distinct(params), fp), (params, fp))
        h.creation[name] = str(d.get("creation", ""))
    for fp, made in by_fingerprint.items():
        if len(set(made.values())) == 1:
            h.configured[fp] = next(iter(made.values()))
            continue
        # One configuration gives every counter it creates the same parameters. Which
        # entry lies the ledger cannot tell (the releases can): each counter is
        # recomputed with its own, and fp's configuration stays unknown.
        listing = "; ".join(f"{k[0]!r}: {p}" for k, p in sorted(made.items()))
        h.problems += [Difference("ledger", k, "inconsistent",
                                  f"counters created under fingerprint {fp} disagree on "
                                  f"the parameters it gives ({listing})") for k in made]
    for name, ticks in entries.items():
        order = tuple(sorted(ticks))
        fps = tuple(ticks[t] for t in order)
        h.since[name] = histories.setdefault((order, fps), (list(order), list(fps)))
    return h


class LedgerProvenance:
    """Replay's `provenance.Provenance`: each counter's parameters, noise identity and
    fingerprints as `history` (the published ledger) says it ran under; a counter the
    ledger does not know runs as the configuration `settings` says."""

    def __init__(self, settings: Settings, key: NoiseKey, history: LedgerHistory) -> None:
        self.settings = settings
        self.key = key
        self.history = history
        self.configured = ConfiguredProvenance(settings, key)
        self._identities: dict[str, str] = {}

    def _identity(self, fingerprint: str) -> str:
        got = self._identities.get(fingerprint)
        if got is None:
            got = self._identities[fingerprint] = noise_identity(
                self.settings, self.key, fingerprint)
        return got

    def make_mechanism(self, name: str) -> Counter:
        created = self.history.created.get(name)
        if created is None:
            return self.configured.make_mechanism(name)
        (mechanism, eps, delta, calibration), fp = created
        made: Counter = registry.make(mechanism, eps, delta, self.key,
                                      counter_id(self._identity(fp), name),
                                      calibration=calibration)
        return made

    def creation_identity(self, name: str) -> str:
        created = self.history.created.get(name)
        return (self.configured.creation_identity(name) if created is None
                else self._identity(created[1]))

    def fingerprint_at(self, name: str, t: int) -> str:
        return (self.history.fingerprint_at(name, t)
                or self.configured.fingerprint_at(name, t))

    def runs_configured(self, name: str, c: Counter, fingerprint: str) -> bool:
        known = self.history.configured.get(fingerprint)
        if known is None:
            return self.history.labels.get((name, fingerprint)) == "configured"
        return parameters_of(c) == known

    def configured_parameters(self) -> Parameters:
        return self.configured.configured_parameters()

    def unit_claim(self, fingerprint: str) -> UnitClaim | None:
        """What the published entries under `fingerprint` state per unit (the worker
        computed it at its start from the ledger before them), else the configuration's."""
        if fingerprint in self.history.claims:
            return self.history.claims[fingerprint]
        claim = self.configured.unit_claim(fingerprint)
        return None if claim is None else replace(claim, gate_delta0=self.history.gate)

    def check_parameters(self, name: str, c: Counter) -> None:
        """No refusal: replay recomputes what the worker ran, and a counter runs with the
        parameters of its creation (the ledger's), whatever the current configuration."""
