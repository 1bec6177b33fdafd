"""Typed errors of the privacy core: the core branch of processor.errors' hierarchy."""

from __future__ import annotations

from processor.errors import ProcessorError


class CoreError(ProcessorError):
    """Base class of every error the core raises on purpose."""


class InvalidInputError(CoreError, ValueError):
    """An input that is not in [0, 1] or ⊥ (None): NaN, infinity, wrong type, out of range.

    Raised before any state changes, so the mechanism is exactly as it was.
    """

    def __init__(self, value: object, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(f"invalid input {_short_repr(value)}: {reason}")


def _short_repr(value: object, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters; never raises (repr of an int with more
    than 4300 digits does)."""
    try:
        r = repr(value)
    except Exception:  # any failing __repr__: name the type only
        return f"<{type(value).__name__}>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


class InvalidParameterError(CoreError, ValueError):
    """A mechanism parameter outside its domain (eps <= 0, delta not in (0, 1), ...)."""


class StateFormatError(CoreError, ValueError):
    """Serialized state that cannot be restored: wrong magic, version, mechanism or parameters.

    `key` is the store key of the value (e.g. "c/<counter>", "p/3") once a caller that
    knows it has set it (the stream operator does), None before: the core decodes bytes
    without knowing where they were stored."""

    error_prefix = "state: "
    key: str | None = None


class StateParameterError(StateFormatError):
    """A restored state whose inner mechanism parameters (for ECC and SimECC: the (eps,
    delta) of CC and BCC, their labels) are not the ones the plan of its stored (eps, delta,
    calibration) gives. The state would continue under a privacy guarantee nobody
    configured, so it is refused, never silently continued. `field` names the parameter;
    the values in the message are public parameters (never noise or sums)."""

    def __init__(self, mechanism: str, field: str, stored: object, planned: object) -> None:
        self.mechanism = mechanism
        self.field = field
        self.stored = stored
        self.planned = planned
        super().__init__(f"{mechanism} state does not match its plan: {field} is "
                         f"{stored!r} in the state, {planned!r} in the plan")


def state_error_detail(exc: BaseException) -> str:
    """Why restoring a state failed, without quoting any value of the state.

    State fields hold private quantities (noise, interval sums, scheduled releases), and
    the messages of int()/float() conversions quote the offending value, so a restore
    error names only the missing field (our own key) or the exception type.
    """
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        return f"missing field {exc.args[0]!r}"
    return f"a field has the wrong type or value ({type(exc).__name__})"


class NoiseKeyError(CoreError):
    """A noise key that is missing, unreadable or too short. Never a silent weak default."""

    error_prefix = "noise key: "
