"""What a privacy unit gets from counters built with given per-event parameters,
recomputed for the audit without processor/core/unit.py (the code it checks).

Two arguments (docs/privacy-unit.md), each written here from the lemmas: group privacy
over the edit relation then basic composition over the m counters, for every mechanism
(k eps m, delta S_k(eps) m with S_k summed term by term); and, for ECC and SimECC, the
k-edit coupling read off a fresh counter's own partition, CC and BCC:

    delta_unit = m S_k(a) delta_part + delta_G(b; sqrt(m) k mu_tot) + (1 + e^b) m eta,
    b = eps_unit - m k a,

a and delta_part the partition's loss and bad event, mu_tot and eta CC's and BCC's
(processor.audit.diagnostics). The core adds a lattice allowance on top (Step 6 of
docs/tight-calibration.md, a few parts in 10^3 at most), so a correct derivation is
below the target here; a derivation that treats the k edits as independent, or charges
the partitions for fewer edits, is not.
"""

from __future__ import annotations

import math

from processor.audit.diagnostics import gauss_delta, gaussian_terms, partition_terms
from processor.core.api import Counter

#: relative allowance of the comparison with the target (float rounding only)
UNIT_RTOL = 1e-9


def log_group_sum(k: int, eps: float) -> float:
    """ln S_k(eps), S_k = 1 + e^eps + ... + e^((k-1) eps), summed term by term around its
    largest term (no closed form: an independent computation)."""
    top = (k - 1) * eps
    return top + math.log(math.fsum(math.exp(i * eps - top) for i in range(k)))


def basic_unit_guarantee(eps: float, delta: float, k: int, m: int) -> tuple[float, float]:
    """(m k eps, m delta S_k(eps)): Lemma 1 (k insertions chained) then Lemma 2 (basic
    composition over the m counters)."""
    log_d = math.log(m) + math.log(delta) + log_group_sum(k, eps)
    return m * k * eps, min(1.0, math.exp(log_d)) if log_d < 700 else 1.0


def coupled_unit_delta(counter: Counter, k: int, m: int, unit_epsilon: float) -> float:
    """The delta a unit gets at unit_epsilon from m counters built like `counter` (a fresh
    ECC or SimECC), k edits in each, by the k-edit coupling (module docstring); 1 where the
    partitions' loss leaves no Gaussian epsilon or a term overflows."""
    a, d_part, problems = partition_terms(counter._part)  # type: ignore[attr-defined]
    mu_tot, eta = gaussian_terms(counter._cc, counter._bcc)  # type: ignore[attr-defined]
    b = unit_epsilon - m * k * a
    if problems or b <= 0.0 or b >= 700.0:
        return 1.0
    log_part = math.log(m) + math.log(d_part) + log_group_sum(k, a) if d_part > 0 else -math.inf
    part = math.exp(log_part) if log_part < 700 else math.inf
    gauss = gauss_delta(b, math.sqrt(m) * k * mu_tot)
    clamp = (1.0 + math.exp(b)) * m * eta
    return min(1.0, part + gauss + clamp)


def unit_derivation_check(eps: float, delta: float, unit_eps: float, unit_delta: float,
                          k: int, m: int, counter: Counter | None = None
                          ) -> tuple[bool, str]:
    """Exact (white box): do counters at the per-event (eps, delta) give every unit with at
    most k events per counter in at most m counters at most (unit_eps, unit_delta)? By
    basic composition for every mechanism, and for ECC and SimECC (`counter`: a fresh one
    built with (eps, delta)) also by the k-edit coupling; passes when either certifies the
    target. Recomputed here, not taken from processor/core/unit.py."""
    got_eps, got_delta = basic_unit_guarantee(eps, delta, k, m)
    tol = 1.0 + UNIT_RTOL
    ok = got_eps <= unit_eps * tol and got_delta <= unit_delta * tol
    detail = (f"recomputed without the core's unit.py: k = {k}, m = {m}: per event "
              f"({eps:.6g}, {delta:.3g}) gives a unit ({got_eps:.6g}, {got_delta:.3g}) by "
              "basic composition")
    if counter is not None:
        coupled = coupled_unit_delta(counter, k, m, unit_eps)
        ok = ok or coupled <= unit_delta * tol
        detail += f", ({unit_eps:.6g}, {coupled:.3g}) by the k-edit coupling"
    return ok, detail + f"; target ({unit_eps:.6g}, {unit_delta:.3g})"
