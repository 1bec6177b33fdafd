"""schedList (Algorithm 4): the releases ECC has scheduled for future ticks.

Update(t_hat, v) schedules v at t_hat; Check(t) is the maximum value scheduled at t, or
None. Only the maximum per tick is ever read, so only it is stored (same outputs, smaller
state). It holds released (noisy) values only: pure post-processing.
"""

from __future__ import annotations

from typing import Any

#: The entries of every empty list (most of them, most of the time): only `update` adds to
#: entries, and it replaces this dict first.
_NONE: dict[int, int] = {}


class SchedList:
    """Scheduled releases: tick -> the largest value scheduled for it (units)."""

    __slots__ = ("_at",)

    def __init__(self, entries: dict[int, int] | None = None) -> None:
        self._at: dict[int, int] = dict(entries) if entries else _NONE

    def update(self, t_hat: int, v: int) -> None:
        """Schedule v for tick t_hat (keeps the maximum per tick)."""
        old = self._at.get(t_hat)
        if old is None or v > old:
            if self._at is _NONE:
                self._at = {}
            self._at[t_hat] = v

    def check(self, t: int) -> int | None:
        """The maximum value scheduled at t, or None."""
        return self._at.get(t)

    def compact(self, t: int) -> None:
        """Drop entries at ticks <= t (they can never be checked again)."""
        if any(k <= t for k in self._at):
            self._at = {k: v for k, v in self._at.items() if k > t} or _NONE

    def next_after(self, t: int) -> int | None:
        """The earliest scheduled tick > t, or None."""
        if not self._at:
            return None
        later = [k for k in self._at if k > t]
        return min(later) if later else None

    def __len__(self) -> int:
        return len(self._at)

    def to_state(self) -> list[list[int]]:
        """Sorted [tick, value] pairs."""
        return [[k, v] for k, v in sorted(self._at.items())]

    @classmethod
    def from_state(cls, state: Any) -> SchedList:
        return cls({int(k): int(v) for k, v in state})
