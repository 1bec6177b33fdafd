"""Provenance: what a counter runs under, the one seam between the operator and replay.

The operator asks a `Provenance` how a new counter's mechanism is made, the noise
identity its creation is tagged under, the configuration fingerprint its release at a
tick carries, whether a mechanism runs with the parameters a configuration gives a new
counter (a ledger entry's `parameters` label), and whether a restored counter may go on
at all (`check_parameters`). The worker answers from its one configuration
(`ConfiguredProvenance`, the operator's default); replay answers from what the published
ledger says each counter ran under (`replay.history.LedgerProvenance`). Both also say
what a ledger entry states per unit (`unit_claim`: lifetime.py). Everything else
the operator does is the same code for both.
"""

from __future__ import annotations

from typing import Protocol

from processor.core import registry
from processor.core.api import Counter
from processor.core.rng import NoiseKey
from processor.errors import RefusedError
from processor.stream.model.config import Settings
from processor.stream.model.identity import (
    calibration_of,
    counter_id,
    key_fingerprint,
    noise_identity,
)
from processor.stream.model.lifetime import UnitClaim
from processor.stream.model.lifetime import plain as plain_claim
from processor.stream.model.state import CounterFactory

#: (mechanism, epsilon, delta, calibration) a counter runs with.
Parameters = tuple[str, float, float, str]

#: The names the parameter check and its error give the fields of `Parameters`.
PARAMETER_FIELDS = ("mechanism", "epsilon", "delta", "calibration")


def parameters_of(c: Counter) -> Parameters:
    """The parameters a mechanism instance runs with."""
    return (c.mechanism, c.eps, c.delta, calibration_of(c))


class ParameterChangeError(RefusedError):
    """A counter restored from state whose mechanism, epsilon or delta differs from the
    settings, while on_parameter_change = "refuse". Raised before anything of the record
    is published. The counter is declared or on the ledger (a restored counter was
    announced or will be at its first marker), the parameters are public: the message
    names both, with the choices."""

    def __init__(self, counter: str, field_name: str, stored: object,
                 configured: object) -> None:
        self.counter = counter
        self.field = field_name
        super().__init__(
            f"{field_name}: counter {counter!r} runs with {field_name} = {stored!r} "
            f"(its stored state) but the configuration says {configured!r}. Set "
            f"{field_name} back to {stored!r}, or set on_parameter_change = \"keep\" to "
            "continue every existing counter under its stored parameters (new counters "
            "get the configured ones), or start a new deployment (new app_id and new "
            "private-count and ledger topics) to use the new parameters for all.")


class Provenance(Protocol):
    """What a counter runs under (module docstring)."""

    def make_mechanism(self, name: str) -> Counter:
        """The mechanism of a new counter `name`."""
        ...

    def creation_identity(self, name: str) -> str:
        """The noise identity a creation of `name` is tagged under
        (`identity.creation_tag`)."""
        ...

    def fingerprint_at(self, name: str, t: int) -> str:
        """The configuration fingerprint a release of `name` at local tick t carries."""
        ...

    def runs_configured(self, name: str, c: Counter, fingerprint: str) -> bool:
        """Whether `c` runs with the parameters the configuration of `fingerprint` gives
        a new counter (a ledger entry's `parameters`: "configured" or "stored")."""
        ...

    def configured_parameters(self) -> Parameters:
        """The parameters a new counter of the current configuration runs with."""
        ...

    def check_parameters(self, name: str, c: Counter) -> None:
        """Raise if the restored counter `name`, running `c`, may not go on."""
        ...

    def unit_claim(self, fingerprint: str) -> UnitClaim | None:
        """The per-unit guarantee a ledger entry under `fingerprint` states (user mode;
        None: the configuration's own derivation, or event mode)."""
        ...


class CalibratedRegistry:
    """The core registry (a CounterFactory) making counters under the configured
    calibration; a restored counter keeps the one stored in its state."""

    def __init__(self, calibration: str) -> None:
        self._calibration = calibration

    def make(self, name: str, eps: float, delta: float, key: NoiseKey,
             counter_id: str) -> Counter:
        return registry.make(name, eps, delta, key, counter_id,
                             calibration=self._calibration)

    def restore(self, data: bytes, key: NoiseKey) -> Counter:
        return registry.restore(data, key)


class ConfiguredProvenance:
    """The worker's answers: every counter is made, tagged and fingerprinted under the
    one configuration `settings`, with the mechanisms of `factory` (default the core
    registry under the configured calibration)."""

    def __init__(self, settings: Settings, key: NoiseKey,
                 factory: CounterFactory | None = None,
                 unit_claim: UnitClaim | None = None) -> None:
        self.settings = settings
        #: What the entries state per unit (lifetime.unit_claim of the ledger read at
        #: start), by default the configuration's own derivation.
        self.claim = unit_claim if unit_claim is not None else plain_claim(settings)
        self.key = key
        self.factory: CounterFactory = (
            factory if factory is not None else CalibratedRegistry(settings.calibration))
        self.noise_id = noise_identity(settings, key)
        self.key_id = key_fingerprint(key)
        self.fingerprint = settings.fingerprint()
        self._configured: Parameters | None = None

    def make_mechanism(self, name: str) -> Counter:
        """The configured mechanism, keyed by `name` under this deployment's noise
        identity."""
        s = self.settings
        return self.factory.make(s.mechanism, s.epsilon, s.delta, self.key,
                                 counter_id(self.noise_id, name))

    def creation_identity(self, name: str) -> str:
        return self.noise_id

    def fingerprint_at(self, name: str, t: int) -> str:
        return self.fingerprint

    def runs_configured(self, name: str, c: Counter, fingerprint: str) -> bool:
        return parameters_of(c) == self.configured_parameters()

    def unit_claim(self, fingerprint: str) -> UnitClaim | None:
        return self.claim

    def configured_parameters(self) -> Parameters:
        """Mechanism, eps and delta read off one instance the factory makes (a throwaway
        key: nothing of it is kept or published), and the configured calibration."""
        if self._configured is None:
            s = self.settings
            new = self.factory.make(s.mechanism, s.epsilon, s.delta,
                                    NoiseKey(b"dpc/parameter-check/throwaway-key"), "check")
            self._configured = (new.mechanism, new.eps, new.delta, s.calibration)
        return self._configured

    def check_parameters(self, name: str, c: Counter) -> None:
        """THE check of a restored counter's parameters against the settings (the
        operator lets a decoded state into its cache only through here). A counter keeps
        the mechanism, epsilon and delta it was made and announced with: its state (noise
        positions, schedule) means nothing under others. With on_parameter_change =
        "refuse" (the default) a difference stops the worker (ParameterChangeError); with
        "keep" the counter continues under its stored parameters, and its releases say so
        (they are taken from the running instance). Not "restart": a fresh instance would
        republish ticks already released, with new noise, which the ledger refusal
        forbids."""
        self.check_stated(name, parameters_of(c))

    def check_stated(self, name: str, stored_parameters: Parameters) -> None:
        """check_parameters on the parameters a counter runs with, as its state or its
        ledger entry states them (the worker checks every announced counter at start,
        before it applies a record)."""
        change = self._refused_change(stored_parameters)
        if change is not None:
            # Declared names are public; an undeclared one is input until announced.
            shown = name if name in self.settings.counters else "(undeclared)"
            raise ParameterChangeError(shown, *change)

    def passes(self, stored_parameters: Parameters) -> bool:
        """Whether check_stated lets a counter with these parameters go on (whatever its
        name: the name only goes into the error)."""
        return self._refused_change(stored_parameters) is None

    def _refused_change(self, stored_parameters: Parameters
                        ) -> tuple[str, object, object] | None:
        """The first field check_stated refuses, with its stored and configured values."""
        if self.settings.on_parameter_change == "keep":
            return None
        for fname, stored, configured in zip(PARAMETER_FIELDS, stored_parameters,
                                             self.configured_parameters(), strict=True):
            if stored != configured:
                return fname, stored, configured
        return None
