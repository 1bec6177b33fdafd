"""The sparse vector technique of Algorithm 1 (SVT), computed exactly on grid units.

SVT with parameters (eps, tau) draws Z_0 ~ Lap(2/eps) once and, at its local step t,
Z_t ~ Lap(4/eps), and fires (outputs ⊤ and halts) the first time
v_t + Z_t > tau + (8/eps) ln(t + ceil(12/eps)) + Z_0.
Here v_t, Z_0 and Z_t are integers in grid units (discrete Laplace on the 2^-16 lattice,
scale rounded up), so the test is an integer against a real threshold: k > r iff
k > floor(r). The threshold is public, so rounding it is a public choice that does not
touch privacy (SVT is private for any threshold).
"""

from __future__ import annotations

import math

from processor.core.grid import UNIT


def svt_threshold(eps: float, tau: float, t: int) -> float:
    """The SVT threshold at local step t >= 1, in events: tau + (8/eps) ln(t + ceil(12/eps))."""
    return tau + (8.0 / eps) * math.log(t + math.ceil(12.0 / eps))


def svt_threshold_units(eps: float, tau: float, t: int) -> int:
    """floor(svt_threshold * UNIT): an integer k exceeds the real threshold iff k > this."""
    return math.floor(svt_threshold(eps, tau, t) * UNIT)
