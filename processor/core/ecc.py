"""ECC (Algorithm 2) and SimECC (Section 6): counters private for edit neighbours."""

from __future__ import annotations

import math
from dataclasses import dataclass

from processor.core.errors import InvalidParameterError


def _check(eps: float, delta: float) -> None:
    if not (isinstance(eps, int | float) and math.isfinite(eps) and eps > 0):
        raise InvalidParameterError(f"eps must be a finite positive number, got {eps!r}")
    if not (isinstance(delta, int | float) and 0 < delta < 1):
        raise InvalidParameterError(f"delta must be in (0, 1), got {delta!r}")


@dataclass(frozen=True)
class EccParams:
    """The constants of Algorithm 2 for (eps, delta): Part(eps/51, tau), CC and BCC."""

    eps_part: float
    tau: float
    cc_eps: float
    cc_delta: float
    bcc_eps: float
    bcc_delta: float


@dataclass(frozen=True)
class SimEccParams:
    """The constants of SimECC for (eps, delta): SimPart(eps/51, mu), CC and BCC."""

    eps_part: float
    mu: int
    cc_eps: float
    cc_delta: float
    bcc_eps: float
    bcc_delta: float


def _cc_constants(eps: float, delta: float) -> tuple[float, float, float, float]:
    shrink = math.exp(-19.0 * eps / 27.0) * delta
    return 4.0 * eps / 27.0, shrink / 16.0, 4.0 * eps / 27.0, shrink / 8.0


def ecc_parameters(eps: float, delta: float) -> EccParams:
    """Part with (eps/51, 1 + 408 ln(pi^2/(2 delta))/eps); CC with (4eps/27,
    e^{-19eps/27} delta/16); BCC with (4eps/27, e^{-19eps/27} delta/8)."""
    _check(eps, delta)
    cc_eps, cc_delta, bcc_eps, bcc_delta = _cc_constants(eps, delta)
    tau = 1.0 + 408.0 * math.log(math.pi**2 / (2.0 * delta)) / eps
    return EccParams(eps / 51.0, tau, cc_eps, cc_delta, bcc_eps, bcc_delta)


def simecc_parameters(eps: float, delta: float) -> SimEccParams:
    """SimPart with (eps/51, mu = 3 + ceil(102 ln(2 pi^2/(3 delta))/eps)); CC, BCC as ECC."""
    _check(eps, delta)
    cc_eps, cc_delta, bcc_eps, bcc_delta = _cc_constants(eps, delta)
    mu = 3 + math.ceil(102.0 * math.log(2.0 * math.pi**2 / (3.0 * delta)) / eps)
    return SimEccParams(eps / 51.0, mu, cc_eps, cc_delta, bcc_eps, bcc_delta)
