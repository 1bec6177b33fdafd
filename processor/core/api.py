"""The contract every counter in the core fulfils (see tests/core/test_contract.py).

A counter is a step operator over ticks. Tick t = 1, 2, ... receives x_t in [0, 1] or
None (⊥, "no event this tick") and releases y_t, an estimate of s_t = x_1 + ... + x_t.

- update(x) -> y_t. Validates x first (InvalidInputError, state untouched), then steps.
  update_units(u) is the same step with x given in grid units (x = u / UNIT).
- skip(n) advances n ⊥ ticks; same output distribution as n updates with None, at a cost
  that does not grow with n wherever the algorithm allows. Returns the ticks inside the
  skipped range where y changed, as (t, y) pairs in increasing t; `y` is then y_{t+n}.
- to_bytes() / from_bytes(data, key): explicit, versioned state. Restoring at any tick
  and continuing gives exactly the outputs of never stopping.
- next_due(): the next tick at which a run of ⊥ ticks can change anything (None: never).
- error_bound(beta): a bound on |y_t - s_t| at the current tick that holds with
  probability >= 1 - beta, computed from public quantities only (parameters and t).

Releases are exact multiples of 2^-GRID_BITS (see grid.py); y is that value as a float.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, NamedTuple, Self

from processor.core.errors import InvalidInputError
from processor.core.grid import check_units, from_units
from processor.core.rng import NoiseKey

Change = tuple[int, float]


class IdleView(NamedTuple):
    """What an encoded state answers without a decode (`Counter.idle_view`): exactly
    what the restored counter's `mechanism`, `eps`, `delta`, `t`, `y`, `next_due()` and
    `bound_key()` would."""

    mechanism: str
    eps: float
    delta: float
    t: int
    y: float
    next_due: int | None
    bound_key: tuple[object, ...]


class Counter(ABC):
    """A private continual counter as a step operator."""

    # Lets a subclass that lists its own slots go without a __dict__ (a mechanism per
    # declared counter: 100,000 on one worker).
    __slots__ = ()

    mechanism: ClassVar[str]
    #: True when the mechanism is private for edit neighbours (the queue shift).
    edit_private: ClassVar[bool]

    eps: float
    delta: float
    counter_id: str

    @property
    @abstractmethod
    def t(self) -> int:
        """Ticks processed so far."""

    @property
    @abstractmethod
    def y(self) -> float:
        """The last release y_t (0.0 before the first tick)."""

    @abstractmethod
    def update(self, x: float | None) -> float: ...

    def update_units(self, u: int) -> float:
        """update(u / UNIT) with the input already on the grid (0: ⊥ is not this; an
        empty tick is update(None) or skip). Mechanisms that step in units override it."""
        return self.update(from_units(check_units(u)))

    def skip(self, n: int) -> list[Change]:
        """Default: n ⊥ updates (exact, O(n)); fast mechanisms override."""
        check_skip(n)
        changes: list[Change] = []
        for _ in range(n):
            before = self.y
            after = self.update(None)
            if after != before:
                changes.append((self.t, after))
        return changes

    def next_due(self) -> int | None:
        """The earliest tick > t at which a run of ⊥ inputs could change y or any internal
        decision (a checkpoint, a scheduled release), or None if never.

        The stream layer uses it so that a marker touches only counters with something due:
        skipping to any tick before next_due() changes nothing but t. Mechanisms whose output
        moves at every tick (fresh noise per tick) keep this default. Mechanisms that
        presample a future event keep the sample in their state, so it is deterministic.
        """
        return self.t + 1

    @classmethod
    def advance_state(cls, data: bytes, k: int, key: NoiseKey | None = None) -> bytes | None:
        """The state `data` (of to_bytes) after k ⊥ ticks short of next_due(), computed
        on the encoded state, when that is exact without a noise key, or with `key` (the
        counter's, as from_bytes takes it) without a full decode: equal to
        from_bytes(data, key).skip(k) then to_bytes(). None where it is not (the default:
        it never is); then the caller decodes."""
        return None

    @classmethod
    def idle_view(cls, data: bytes, key: NoiseKey | None = None) -> IdleView | None:
        """What `from_bytes(data, key)` would answer about its parameters, tick, value and
        next_due(), read off the encoded state `data` (of to_bytes) without a noise key,
        or with `key` without a full decode, where that is exact (an idle counter
        restored needs no decode to beat). None where it is not (the default: it never
        is); then the caller decodes."""
        return None

    @abstractmethod
    def to_bytes(self) -> bytes: ...

    @classmethod
    @abstractmethod
    def from_bytes(cls, data: bytes, key: NoiseKey) -> Self: ...

    @abstractmethod
    def error_bound(self, beta: float = 0.05) -> float: ...

    def bound_key(self) -> tuple[object, ...]:
        """Everything error_bound depends on besides beta and t (a cache key)."""
        return (self.mechanism, self.eps, self.delta)

    def error_bound_at(self, t: int, beta: float = 0.05) -> float:
        """error_bound(beta) as of tick t <= self.t (a change reported inside a skip).
        Default: the bound at the current tick, valid where the bound never decreases in
        t; mechanisms whose bound can decrease override it (it depends on t only)."""
        return self.error_bound(beta)


def check_skip(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidInputError(n, "skip needs a non-negative integer")
    return n
