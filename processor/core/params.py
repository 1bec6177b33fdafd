"""The constants of ECC (Algorithm 2) and SimECC (Section 6) for a given (eps, delta).

Its own module because two modules need them and one of those needs the other:
`ecc.py` builds the counters from them and `bounds.py` derives the public error bounds the
counters carry from them. Depends only on `bounded` (the (eps, delta) check) and `tight`
(the tight calibration's parameters), never on the counters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from processor.core.bounded import check_eps_delta
from processor.core.tight import check_calibration, tight_plan


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


def ecc_parameters(eps: float, delta: float, calibration: str = "paper") -> EccParams:
    """Part with (eps/51, 1 + 408 ln(pi^2/(2 delta))/eps); CC with (4eps/27,
    e^{-19eps/27} delta/16); BCC with (4eps/27, e^{-19eps/27} delta/8).
    calibration="tight": the parameters of processor.core.tight instead."""
    check_eps_delta(eps, delta)
    if check_calibration(calibration) == "tight":
        t = tight_plan("ecc", eps, delta)
        return EccParams(t.eps_part, t.part_param, t.cc_eps, t.cc_delta, t.bcc_eps,
                         t.bcc_delta)
    cc_eps, cc_delta, bcc_eps, bcc_delta = _cc_constants(eps, delta)
    tau = 1.0 + 408.0 * math.log(math.pi**2 / (2.0 * delta)) / eps
    return EccParams(eps / 51.0, tau, cc_eps, cc_delta, bcc_eps, bcc_delta)


def simecc_parameters(eps: float, delta: float, calibration: str = "paper") -> SimEccParams:
    """SimPart with (eps/51, mu = 3 + ceil(102 ln(2 pi^2/(3 delta))/eps)); CC, BCC as ECC.
    calibration="tight": the parameters of processor.core.tight instead."""
    check_eps_delta(eps, delta)
    if check_calibration(calibration) == "tight":
        t = tight_plan("simecc", eps, delta)
        return SimEccParams(t.eps_part, int(t.part_param), t.cc_eps, t.cc_delta, t.bcc_eps,
                            t.bcc_delta)
    cc_eps, cc_delta, bcc_eps, bcc_delta = _cc_constants(eps, delta)
    mu = 3 + math.ceil(102.0 * math.log(2.0 * math.pi**2 / (3.0 * delta)) / eps)
    return SimEccParams(eps / 51.0, mu, cc_eps, cc_delta, bcc_eps, bcc_delta)
