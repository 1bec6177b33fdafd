"""Partitioning subroutines: Part (Algorithm 3, data-dependent, via SVT) and SimPart
(Algorithm 5, data-independent)."""

from __future__ import annotations

import math


def part_tau(tau: float, l: int, eps_p: float) -> float:  # noqa: E741
    """Threshold of the l-th SVT instance inside Part: tau + 16 ln(l) / eps_p (l >= 1)."""
    return tau + 16.0 * math.log(l) / eps_p


def simpart_gap(mu: int, l: int, eps_p: float, z: int) -> int:  # noqa: E741
    """Ticks from a SimPart checkpoint to the next one, for sample index l >= 1 and noise z:
    max(1, mu + ceil(4 ln(l) / eps_p) + z). For l = 1 this is max(1, mu + z)."""
    return max(1, mu + math.ceil(4.0 * math.log(l) / eps_p) + z)
