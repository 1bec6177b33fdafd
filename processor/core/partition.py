"""Partitioning subroutines of ECC: Part (Algorithm 3, data-dependent, through SVT) and
SimPart (Algorithm 5, data-independent).

Both are step operators over ticks with `step(u) -> bool` (True is ⊤, a checkpoint at this
tick), `next_due()` (the tick at which a run of ⊥ inputs would give the next ⊤, None if
never; a pure function of the state) and `advance(k)` (k ⊥ ticks that `next_due` says
are quiet). Inputs are grid units (grid.py); SimPart ignores them.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from processor.core.grid import UNIT
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers.scalar import discrete_laplace_into, laplace_scale_units
from processor.core.svt import SVT


def part_tau(tau: float, l: int, eps_p: float) -> float:  # noqa: E741
    """Threshold of the l-th SVT instance inside Part: tau + 16 ln(l) / eps_p (l >= 1)."""
    return tau + 16.0 * math.log(l) / eps_p


#: part_tau for Part's SVTs: one float per (tau, l, eps_p), whatever the counters using it.
_shared_tau = lru_cache(maxsize=4096, typed=True)(part_tau)


def simpart_gap(mu: int, l: int, eps_p: float, z: int) -> int:  # noqa: E741
    """Ticks from a SimPart checkpoint to the next one, for sample index l >= 1 and noise z:
    max(1, mu + ceil(4 ln(l) / eps_p) + z). For l = 1 this is max(1, mu + z)."""
    return max(1, mu + math.ceil(4.0 * math.log(l) / eps_p) + z)


@lru_cache(maxsize=256, typed=True)  # asked at every SimPart construction and restore
def simpart_scale(eps_p: float) -> tuple[int, int]:
    """SimPart's DLap(2/eps_p) on the integers as the rational scale t/s = ceil(2/eps_p *
    UNIT) / UNIT: rounded up, so never less noise than the paper's."""
    return laplace_scale_units(2.0 / eps_p), UNIT


class Part:
    """Algorithm 3: SVT_l with (eps_p, part_tau(tau, l, eps_p)) on intsum; restart on ⊤.

    The l-th SVT draws from KeyedStream(key, f"{label}/svt{l}/..."). Ticks whose input
    adds nothing (⊥ or 0) leave intsum unchanged, so they follow the SVT's presampled plan
    for that constant input; other ticks are dense SVT steps.
    """

    __slots__ = ("_key", "_label", "_svt", "eps_p", "intsum", "l", "t", "tau")

    def __init__(self, eps_p: float, tau: float, key: NoiseKey, label: str,
                 state: dict[str, Any] | None = None) -> None:
        self.eps_p = eps_p
        self.tau = tau
        self._key = key
        self._label = label
        if state is None:
            self.l = 1
            self.intsum = 0
            self.t = 0
            self._svt = self._new_svt(None)
        else:
            self.l = int(state["l"])
            self.intsum = int(state["s"])
            self.t = int(state["t"])
            self._svt = self._new_svt(state["svt"])

    def _new_svt(self, st: dict[str, Any] | None) -> SVT:
        return SVT(self.eps_p, _shared_tau(self.tau, self.l, self.eps_p), self._key,
                   f"{self._label}/svt{self.l}", st)

    def to_state(self) -> dict[str, Any]:
        """l, intsum, tick and the running SVT's state."""
        return {"l": self.l, "s": self.intsum, "t": self.t, "svt": self._svt.to_state()}

    def step(self, u: int) -> bool:
        """One tick with u units (0 for ⊥); True at a checkpoint."""
        self.t += 1
        if u == 0:
            fired = self._svt.const_step(self.intsum)
        else:
            self.intsum += u
            fired = self._svt.feed(self.intsum)
        return self._after(fired)

    def _after(self, fired: bool) -> bool:
        """On ⊤: a checkpoint; start the next SVT instance on a fresh interval sum."""
        if fired:
            self.l += 1
            self.intsum = 0
            self._svt = self._new_svt(None)
        return fired

    def step_dense(self, u: int) -> bool:
        """One tick through the dense SVT path even for ⊥ (reference for tests)."""
        self.t += 1
        self.intsum += u
        return self._after(self._svt.feed(self.intsum))

    def skip_to_fire(self, n: int) -> int | None:
        """Up to n ⊥ ticks through SVT.first_fire (not the plan); the tick of the
        checkpoint if one occurs (then the ticks after it are not consumed), else None."""
        k = self._svt.first_fire(self.intsum, n)
        if k is None:
            self.t += n
            return None
        self.t += k
        self._after(True)
        return self.t

    def next_due(self, limit: int | None = None) -> int | None:
        """The tick of the next checkpoint if only ⊥ follows (None: never). With `limit`
        (a tick), None also when it is after `limit` (saves computing a far plan)."""
        k = self._svt.due(self.intsum, None if limit is None else max(0, limit - self.t))
        return None if k is None else self.t + k

    def advance(self, k: int) -> None:
        """k quiet ⊥ ticks (the caller checked t + k < next_due())."""
        if k > 0:
            self._svt.advance(self.intsum, k)
            self.t += k


class SimPart:
    """Algorithm 5: checkpoints at data-independent times, t_1 = max(1, mu + Z_1),
    t_l = t + max(1, mu + ceil(4 ln(l)/eps_p) + Z_l), Z_l ~ DLap(2/eps_p) on the integers.

    Draws come from WordCursor(KeyedStream(key, label)); skipping jumps straight to the
    next checkpoint, so skip and ⊥ steps consume exactly the same draws.
    """

    __slots__ = ("_cur", "_scale", "eps_p", "l", "mu", "next", "t")

    def __init__(self, eps_p: float, mu: int, key: NoiseKey, label: str,
                 state: dict[str, Any] | None = None) -> None:
        self.eps_p = eps_p
        self.mu = mu
        self._scale = simpart_scale(eps_p)
        self._cur = WordCursor(KeyedStream(key, label), 0, 0)
        if state is None:
            self.t = 0
            self.l = 1
            self.next = simpart_gap(mu, 1, eps_p, self._draw())
        else:
            self.t = int(state["t"])
            self.l = int(state["l"])
            self.next = int(state["c"])
            self._cur.position = int(state["p"])

    def _draw(self) -> int:
        # the run's sampler: the same draw and position as discrete_laplace on the cursor
        # (unchecked: simpart_scale's ints are >= 1)
        out: list[int] = []
        discrete_laplace_into(self._cur, self._scale[0], 1, out, self._scale[1])
        return out[0]

    def to_state(self) -> dict[str, Any]:
        """Tick, sample index, next checkpoint, cursor position."""
        return {"t": self.t, "l": self.l, "c": self.next, "p": self._cur.position}

    def step(self, u: int = 0) -> bool:
        """One tick (the input is ignored); True at a checkpoint."""
        self.t += 1
        if self.t != self.next:
            return False
        self.l += 1
        self.next = self.t + simpart_gap(self.mu, self.l, self.eps_p, self._draw())
        return True

    def next_due(self, limit: int | None = None) -> int:
        """The tick of the next checkpoint (`limit` is accepted for Part's signature)."""
        return self.next

    def advance(self, k: int) -> None:
        """k ticks before the next checkpoint (t + k < next_due())."""
        if self.t + k >= self.next:
            raise ValueError("advance would cross the next checkpoint")
        self.t += k
