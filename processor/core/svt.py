"""The sparse vector technique of Algorithm 1 (SVT), computed exactly on grid units.

SVT with parameters (eps, tau) draws Z_0 ~ Lap(2/eps) once and, at its local step t,
Z_t ~ Lap(4/eps), and fires (outputs ⊤ and halts) the first time
v_t + Z_t > tau + (8/eps) ln(t + ceil(12/eps)) + Z_0.
Here v_t, Z_0 and Z_t are integers in grid units (discrete Laplace on the 2^-16 lattice,
scale rounded up to whole units), so the test is an integer against a real threshold:
k > r iff k > floor(r). The threshold is public, so rounding it is a public choice that
does not touch privacy (the SVT lemmas hold for any threshold). The scales are inflated
slightly so that the shift argument of Lemma 4.15 holds on the lattice too.

Two ways to advance:

- dense, `feed(v)`: one step with input v, Z_t read at the draw index kept in state
  (first SCALAR_DRAWS from a scalar cursor, then from a vectorised LaplaceBank);
- skip, `first_fire(v, n)` and the presampled plan: given Z_0 (which the instance holds),
  the steps are independent and step s fires with probability q_s = P(Z > k_s),
  k_s = floor(threshold_s * UNIT) + Z_0 - v. q_s is non-increasing in s, so the first
  firing time is sampled by thinning: on each dyadic block [2^j, 2^{j+1}) of the local
  step counter, candidates come at the constant rate q at the block start (one Exp(1)
  draw carried across blocks by memorylessness), and a candidate at s is accepted with
  probability q_s / q_block. q_s decays like 1/s^2, so the expected number of candidates
  is O(1) and the work is one pass over at most 62 blocks, whatever n is. The skip path
  reads its own WordCursor, whose position is in state.

Because the steps are independent given Z_0, a plan sampled for a constant input can be
dropped at any step s when the input changes: the plan only said "no fire before s", an
event of the noise of steps before s, and step s onwards uses fresh draws.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from processor.core.grid import UNIT
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers import (
    LaplaceBank,
    bernoulli_float,
    discrete_laplace,
    laplace_scale_units,
    uniform01,
)

#: Local steps beyond this are "never": no stream reaches 2^62 ticks.
HORIZON = 1 << 62

#: The first dense draws of an instance are scalar samples from lane 0 of the "/z" stream
#: (position in state); later ones come from the LaplaceBank on the same stream (lanes 1..).
#: A bank chunk costs a few ms to fill, so an instance that halts after a few steps (most
#: instances in Part) never pays for one; a long-lived one gets vectorised draws.
SCALAR_DRAWS = 64

#: Dense steps at the start of every run of constant input (see SVT).
PREFIX = 8


def svt_threshold(eps: float, tau: float, t: int) -> float:
    """The SVT threshold at local step t >= 1, in events: tau + (8/eps) ln(t + ceil(12/eps))."""
    return tau + (8.0 / eps) * math.log(t + math.ceil(12.0 / eps))


def svt_threshold_units(eps: float, tau: float, t: int) -> int:
    """floor(svt_threshold * UNIT): an integer k exceeds the real threshold iff k > this."""
    return math.floor(svt_threshold(eps, tau, t) * UNIT)


#: Scale inflation for the grid. The shift-stability argument (Lemma 4.15) moves Z_0 by
#: 5/3 and Z_t by 8/3, which are not whole grid units; on the lattice the shift rounds up to
#: ceil(shift * UNIT) units, up to 1/(shift * UNIT) < 2^-16 relatively more privacy loss.
#: Scales 2^-14 larger cover that with room to spare.
SVT_GRID_INFLATION = 1.0 + 2.0**-14


def svt_scales(eps: float) -> tuple[int, int]:
    """(scale of Z_0, scale of Z_t) in units: ceil(2/eps * UNIT * (1 + 2^-14)) and
    ceil(4/eps * UNIT * (1 + 2^-14)) (see SVT_GRID_INFLATION)."""
    return (laplace_scale_units(2.0 / eps * SVT_GRID_INFLATION),
            laplace_scale_units(4.0 / eps * SVT_GRID_INFLATION))


class SVT:
    """One SVT instance (Algorithm 1) on integer unit inputs, with an exact fast skip.

    `label` names the instance's randomness: Z_0 and the per-step Z_t come from
    KeyedStream(key, label + "/z0" | "/z"), the skip path from label + "/skip".

    Steps on a constant input (⊥ ticks, `const_step`) come in runs. The first PREFIX
    steps of a run are dense steps (a fresh Z_t each, the next draws of the "/z"
    sequence); from the (PREFIX+1)-th step on the run follows a presampled plan (the skip
    lane). Short runs, the common case on a busy stream, so never pay for a plan, and the
    rule is a pure function of the state (`run` counts the dense steps of the current run),
    so `skip`, `advance` and one `const_step` at a time consume exactly the same draws.
    """

    #: dense steps at the start of each ⊥ run (a class attribute so tests can vary it)
    prefix: ClassVar[int] = PREFIX

    __slots__ = (
        "_ahead",
        "_b8",
        "_bank",
        "_c",
        "_cached",
        "_cursor",
        "_has_plan",
        "_lam",
        "_log1pq",
        "_scan",
        "_t1",
        "_zahead",
        "_zpos",
        "draws",
        "eps",
        "halted",
        "plan",
        "run",
        "steps",
        "tau",
        "z0",
    )

    def __init__(
        self, eps: float, tau: float, key: NoiseKey, label: str,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.eps = eps
        self.tau = tau
        t0, self._t1 = svt_scales(eps)
        # the threshold and q_s with the exact float operations of svt_threshold_units and
        # dlap_sf, constants hoisted (same values, bit for bit)
        self._b8 = 8.0 / eps
        self._c = math.ceil(12.0 / eps)
        self._lam = 1 / self._t1
        self._log1pq = math.log1p(math.exp(-self._lam))
        zstream = KeyedStream(key, label + "/z")
        self._bank = LaplaceBank(zstream, self._t1)
        #: scalar draws looked at ahead of consumption (by `due`): (value, cursor after)
        self._ahead: list[tuple[int, int]] = []
        self._zahead = WordCursor(zstream, 0, 0)
        self._cursor = WordCursor(KeyedStream(key, label + "/skip"), 0, 0)
        #: a reader of the skip lane that keeps its ChaCha20 chunk between plans
        self._scan = WordCursor(self._cursor.stream, 0, 0)
        #: (start step, skip position, v) -> (firing step or None, skip position after)
        self._cached: tuple[tuple[int, int, int], tuple[int | None, int]] | None = None
        if state is None:
            self.z0 = discrete_laplace(WordCursor(KeyedStream(key, label + "/z0")), t0)
            self.steps = 0
            self.draws = 0
            self._zpos = 0
            self.halted = False
            self.run = 0
            #: committed plan: the local step at which the constant input fires (None: never)
            self.plan: int | None = None
            self._has_plan = False
        else:
            self.z0 = int(state["z0"])
            self.steps = int(state["n"])
            self.draws = int(state["d"])
            self._cursor.position = int(state["p"])
            self._zpos = int(state["zp"])
            self._zahead.position = self._zpos
            self.halted = bool(state["h"])
            self.run = int(state["r"])
            self._has_plan = "f" in state
            self.plan = None if state.get("f") is None else int(state["f"])
            if (min(self.steps, self.draws, self._cursor.position, self._zpos) < 0
                    or not 0 <= self.run <= self.prefix
                    or (self._has_plan and self.run != self.prefix)):
                raise ValueError("SVT state out of range")

    def to_state(self) -> dict[str, Any]:
        """The instance as a small dict (Z_0, step and draw counters, cursor positions,
        dense steps of the current ⊥ run, plan)."""
        d: dict[str, Any] = {"z0": self.z0, "n": self.steps, "d": self.draws,
                             "p": self._cursor.position, "zp": self._zpos,
                             "h": self.halted, "r": self.run}
        if self._has_plan:
            d["f"] = self.plan
        return d

    # -- the comparison -------------------------------------------------------------------

    def _k(self, v: int, s: int) -> int:
        """Step s fires iff Z_s > k_s (all integers, units); k_s = svt_threshold_units +
        Z_0 - v, computed with the same float operations."""
        return math.floor((self.tau + self._b8 * math.log(s + self._c)) * UNIT) + self.z0 - v

    def fire_probability(self, v: int, s: int) -> float:
        """q_s: the probability that local step s fires on input v, given Z_0 (float;
        the same operations as dlap_sf)."""
        k = self._k(v, s)
        if k >= 0:
            return math.exp(-(k + 1) * self._lam - self._log1pq)
        return -math.expm1(k * self._lam - self._log1pq)

    # -- the per-step draws Z_t -------------------------------------------------------------

    def _peek(self, i: int) -> int:
        """Draw number i >= draws without consuming it (scalar draws are remembered)."""
        if i >= SCALAR_DRAWS:
            return self._bank.draw(i - SCALAR_DRAWS)
        j = i - self.draws
        ahead = self._ahead
        while len(ahead) <= j:
            z = discrete_laplace(self._zahead, self._t1)
            ahead.append((z, self._zahead.position))
        return ahead[j][0]

    def _take(self) -> int:
        """Consume the next draw: the first SCALAR_DRAWS from the scalar cursor, then the
        bank."""
        i = self.draws
        self.draws = i + 1
        if i >= SCALAR_DRAWS:
            return self._bank.draw(i - SCALAR_DRAWS)
        if self._ahead:
            z, self._zpos = self._ahead.pop(0)
            return z
        z = discrete_laplace(self._zahead, self._t1)
        self._zpos = self._zahead.position
        return z

    # -- dense path -----------------------------------------------------------------------

    def feed(self, v: int) -> bool:
        """One step with input v (units); True (⊤) halts the instance. Drops any plan and
        ends the current ⊥ run."""
        if self.halted:
            raise RuntimeError("SVT has halted")
        self._has_plan = False
        self.plan = None
        self.run = 0
        self.steps += 1
        fired = self._take() > self._k(v, self.steps)
        self.halted = fired
        return fired

    # -- skip path ------------------------------------------------------------------------

    def _sample(self, v: int, start: int, end: int, pos: int) -> tuple[int | None, int]:
        """First firing step in [start, end) on constant input v, reading the skip lane
        from word `pos`; returns (step or None, position after). Pure in the state."""
        cur = self._scan
        cur.position = pos
        s = start
        while s < end:
            exp1 = -math.log1p(-uniform01(cur))
            cand: int | None = None
            rate = 0.0
            while s < end:
                bend = min(1 << s.bit_length(), end)  # end of the dyadic block holding s
                rate = self.fire_probability(v, s)
                if s & (s - 1) == 0 and rate <= 0.5 and exp1 > self._tail_hazard(s, rate):
                    s = end  # the candidates of all remaining blocks need more hazard
                    break
                if rate >= 1.0:
                    cand = s
                    break
                if rate <= 0.0:
                    s = end  # q is non-increasing: nothing can fire from here on
                    break
                hazard = -math.log1p(-rate)
                length = bend - s
                if exp1 < hazard * length:
                    cand = s + int(exp1 / hazard)
                    break
                exp1 -= hazard * length
                s = bend
            if cand is None:
                return None, cur.position
            if rate >= 1.0 or bernoulli_float(cur, min(1.0, self.fire_probability(v, cand) / rate)):
                return cand, cur.position
            s = cand + 1
        return None, cur.position

    def _tail_hazard(self, s: int, q: float) -> float:
        """An upper bound on the total candidate hazard of the blocks from s = 2^J on,
        given q = q_s <= 1/2 (so k_s >= 0 and P(Z > k) = e^{-(k+1)/t1}/(1+e^{-1/t1})).

        k_{s'} - k_s >= (8 UNIT/eps) ln((s'+c)/(s+c)) - 1, so q_{s'} <= e^{1/t1} q_s
        ((s'+c)/(s+c))^{-g}, g = 8 UNIT / (eps t1) > 1, and sum_{s'>=s} q_{s'} <= S :=
        e^{1/t1} q_s (1 + (s+c)/(g-1)). Block J contributes s h(q_s); a later block j has
        2^j h(q_{2^j}) <= 4 * (sum of q over block j-1), so all later blocks add <= 4 S.
        If the Exp(1) budget exceeds this, no candidate ever comes: the answer is "never".
        """
        g = 8.0 * UNIT / (self.eps * self._t1)
        if g <= 1.0:
            return math.inf
        c = math.ceil(12.0 / self.eps)
        tail = math.exp(1.0 / self._t1) * q * (1.0 + (s + c) / (g - 1.0))
        return s * -math.log1p(-q) + 4.0 * tail + 1e-9

    def first_fire(self, v: int, n: int) -> int | None:
        """Advance up to n steps on the constant input v; return the offset k in 1..n of
        the step at which SVT fires (and halts), or None if it does not fire (n steps
        advanced). Exact law of n dense feeds; cost does not grow with n. Reads the skip
        lane only (no dense prefix); afterwards a ⊥ run starts afresh."""
        if self.halted:
            raise RuntimeError("SVT has halted")
        self._has_plan = False
        self.plan = None
        self.run = 0
        step, pos = self._sample(v, self.steps + 1, self.steps + 1 + n, self._cursor.position)
        self._cursor.position = pos
        if step is None:
            self.steps += n
            return None
        k = step - self.steps
        self.steps = step
        self.halted = True
        return k

    def _planned(self, v: int) -> int | None:
        """The plan for constant input v after the dense prefix of the current run
        (computed once, cached; a pure function of the state)."""
        if self._has_plan:
            return self.plan
        key = (self.steps + 1 + self.prefix - self.run, self._cursor.position, v)
        if self._cached is None or self._cached[0] != key:
            self._cached = (key, self._sample(v, key[0], HORIZON, key[1]))
        return self._cached[1][0]

    def due(self, v: int, within: int | None = None) -> int | None:
        """Steps until the instance fires if the input stays v (None: never). With
        `within`, None also means "not within that many steps", and a far plan is not
        computed when the dense prefix covers them. Does not change the state: the
        answer is a pure function of it."""
        if self.halted:
            raise RuntimeError("SVT has halted")
        m = self.prefix - self.run
        for i in range(m):
            if within is not None and i >= within:
                return None
            if self._peek(self.draws + i) > self._k(v, self.steps + i + 1):
                return i + 1
        if within is not None and m >= within:
            return None
        f = self._planned(v)
        if f is None or (within is not None and f - self.steps > within):
            return None
        return f - self.steps

    def _commit(self, v: int) -> None:
        if not self._has_plan:
            f = self._planned(v)
            assert self._cached is not None
            self._cursor.position = self._cached[1][1]
            self.plan = f
            self._has_plan = True

    def const_step(self, v: int) -> bool:
        """One step whose input equals the previous one (or the first step): a dense step
        within the run's prefix, else follows the presampled plan (no per-step noise)."""
        if self.halted:
            raise RuntimeError("SVT has halted")
        if self.run < self.prefix:
            self.run += 1
            self.steps += 1
            fired = self._take() > self._k(v, self.steps)
        else:
            self._commit(v)
            self.steps += 1
            fired = self.plan == self.steps
        self.halted = fired
        return fired

    def advance(self, v: int, k: int) -> None:
        """k steps on constant input v that do not fire (due(v) > k), consuming what k
        const_step calls would."""
        if k <= 0:
            return
        if self.due(v, k) is not None:
            raise ValueError("advance would cross the planned firing step")
        j = min(k, self.prefix - self.run)
        for _ in range(j):
            self._take()
        self.run += j
        self.steps += j
        if k > j:
            self._commit(v)
            self.steps += k - j
