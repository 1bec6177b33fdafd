"""The fixed grid on which every private release is computed exactly.

Inputs in [0, 1] are quantised to multiples of 2^-GRID_BITS ("units"); noise is drawn on
the same lattice, so a release is an exact integer number of units and everything derived
from it is post-processing. One event of value 1 is exactly UNIT units.
"""

from __future__ import annotations

import math

from processor.core.errors import InvalidInputError

GRID_BITS = 16
UNIT = 1 << GRID_BITS


def to_units(x: object) -> int:
    """Validate one tick's input and return it in grid units; None (⊥) is 0 units.

    Raises InvalidInputError (naming the value) for anything that is not a real number in
    [0, 1] or None. bool is rejected: True is almost always a bug upstream.
    """
    if x is None:
        return 0
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise InvalidInputError(x, f"expected a number in [0, 1] or None, got {type(x).__name__}")
    if isinstance(x, int) and not 0 <= x <= 1:  # before float(): a huge int overflows it
        raise InvalidInputError(x, "outside [0, 1]")
    xf = float(x)
    if math.isnan(xf):
        raise InvalidInputError(x, "not a number")
    if math.isinf(xf):
        raise InvalidInputError(x, "not finite")
    if xf < 0.0 or xf > 1.0:
        raise InvalidInputError(x, "outside [0, 1]")
    return round(xf * UNIT)


def check_units(u: object) -> int:
    """Validate one tick's input given in grid units (an int in [0, UNIT]; bool rejected)
    and return it: what the stream layer's queues hold, handed over without a float."""
    if isinstance(u, bool) or not isinstance(u, int):
        raise InvalidInputError(u, f"expected grid units (an int), got {type(u).__name__}")
    if not 0 <= u <= UNIT:
        raise InvalidInputError(u, f"outside [0, {UNIT}] units")
    return u


def from_units(u: int) -> float:
    """Grid units to a real number (exact: UNIT is a power of two)."""
    return u / UNIT
