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
  k_s = floor(threshold_s * UNIT) + Z_0 - v, non-decreasing in s, so q_s is
  non-increasing. The first firing time is sampled EXACTLY (the law of dense feeds, no
  float approximation) by thinning: a step with k_s < 0 is one exact DLap draw; from a
  step with k_s >= 0 on, on each dyadic block [b, 2^j) of the local step counter,
  candidates come with the constant per-step probability q_b (>= q_s there), and a
  candidate c is accepted with probability q_c / q_b = exp(-(k_c - k_b)/t1) (memoryless
  tail of the discrete Laplace), an exact `bernoulli_exp`. The first candidate is the
  inverse of the candidate process's survival at one uniform U, refined lazily: float
  bounds decide unless U falls within about 2^-40 (relative) of a boundary, and then
  decimal arithmetic with rigorous error bounds and more words of U decide. Every
  decision holds for all U in the interval its bits define, so the law is exact. q_s
  decays like 1/s^2, so a bound on the hazard left (`_tail_bound`) usually answers
  "never" from the first word; the work is O(1) expected words and at most one pass
  over 62 blocks, whatever n is. The skip path reads its own WordCursor, whose position
  is in state.

Because the steps are independent given Z_0, a plan sampled for a constant input can be
dropped at any step s when the input changes: the plan only said "no fire before s", an
event of the noise of steps before s, and step s onwards uses fresh draws.
"""

from __future__ import annotations

import math
from decimal import Context, Decimal, localcontext
from functools import lru_cache
from typing import Any, ClassVar

from processor.core.grid import UNIT
from processor.core.rng import KeyedStream, NoiseKey, WordCursor
from processor.core.samplers.block import LaplaceBank
from processor.core.samplers.native import NATIVE
from processor.core.samplers.scalar import (
    bernoulli_exp,
    discrete_laplace,
    discrete_laplace_into,
    laplace_scale_units,
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


#: The native plan (`SVT._sample`) takes positions below the scalar samplers' limit (far
#: from the lane's end) and values within 62 bits; the reference takes the rest.
_NATIVE_END = (1 << 35) - (1 << 20)
_I62 = 1 << 62

#: What the native plan computes as SVT does (`SVT._plan_native`).
_PLAN_METHODS = ("_k", "_sample", "_candidate_float", "_tail_bound", "_candidate_decimal",
                 "_candidate_at")

#: Relative error bound used for a float-evaluated quantity in the skip sampler. libm's
#: exp, log and log1p are within a few ulps (2^-52 each); 2^-40 leaves a factor of
#: thousands, and a decision is taken in floats only when it holds across the bound.
_REL = 2.0**-40

#: "Float bounds cannot decide": the decimal path takes over.
_UNSURE = object()


class _Uniform:
    """U uniform on (0, 1), its bits read from a cursor on demand: after `bits` bits,
    U lies in [m / 2^bits, (m + 1) / 2^bits). U is continuous, so the boundary values
    have probability 0 and a decision that holds on the whole interval is exact."""

    __slots__ = ("bits", "cur", "m")

    def __init__(self, cur: WordCursor) -> None:
        self.cur = cur
        self.m = cur.next_word()
        self.bits = 64

    def extend(self) -> None:
        """Read 64 more bits."""
        self.m = (self.m << 64) | self.cur.next_word()
        self.bits += 64

    def e_bounds_float(self) -> tuple[float, float]:
        """Float bounds (lo, hi) on E = -ln U (hi may be inf)."""
        full = 1 << self.bits
        lo = _neg_log(self.m + 1, full) * (1.0 - _REL)
        hi = math.inf if self.m == 0 else _neg_log(self.m, full) * (1.0 + _REL)
        return lo, hi


def _neg_log(num: int, full: int) -> float:
    """-ln(num / full) for 1 <= num <= full (int / int is correctly rounded in Python)."""
    if 2 * num > full:
        return -math.log1p(-((full - num) / full))
    return -math.log(num / full)


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


@lru_cache(maxsize=256, typed=True)
def _scan_constants(eps: float) -> tuple[int, int, float, int, float, float, float]:
    """(t0, t1, 8/eps, ceil(12/eps), lambda, log1p(e^-lambda), g) of an SVT with `eps`: the
    threshold and q_s with the exact float operations of svt_threshold_units and dlap_sf,
    hoisted (same values, bit for bit), and one set of objects for every SVT with `eps`."""
    t0, t1 = svt_scales(eps)
    lam = 1 / t1
    return (t0, t1, 8.0 / eps, math.ceil(12.0 / eps), lam, math.log1p(math.exp(-lam)),
            8.0 * UNIT / (eps * t1))  # q_s decays like (s + c)^-g


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
    #: skip the float fast path of the plan sampler (agreement tests only)
    _exact_only: ClassVar[bool] = False
    #: whether the extension may sample the plan: it computes this class's threshold,
    #: bounds and float path; a subclass that changes any of them (the tests' controls)
    #: is sampled by the reference (`__init_subclass__`)
    _plan_native: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._plan_native = not cls._exact_only and all(
            getattr(cls, f) is getattr(SVT, f) for f in _PLAN_METHODS)

    __slots__ = (
        "_ahead",
        "_b8",
        "_bank",
        "_c",
        "_cached",
        "_due_memo",
        "_g",
        "_has_plan",
        "_lam",
        "_log1pq",
        "_scan",
        "_skip",
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
        t0, self._t1, self._b8, self._c, self._lam, self._log1pq, self._g = (
            _scan_constants(eps))
        #: the draws after the first SCALAR_DRAWS, made at the first of them (most
        #: instances never get there)
        self._bank: LaplaceBank | None = None
        #: scalar draws looked at ahead of consumption (by `due`), flat: value, cursor
        #: after, value, ... (plain ints: no tuple per draw for the collector to walk)
        self._ahead: list[int] = []
        self._zahead = WordCursor(KeyedStream(key, label, "/z"), 0, 0)
        #: the skip lane's position (words the committed plans consumed)
        self._skip = 0
        #: a reader of the skip lane that keeps its ChaCha20 chunk between plans
        self._scan = WordCursor(KeyedStream(key, label, "/skip"), 0, 0)
        #: the last plan sampled: (start step, skip position, v, firing step or None,
        #: skip position after)
        self._cached: tuple[int, int, int, int | None, int] | None = None
        #: the last answer of `due`: its arguments and the state it read, then the answer
        self._due_memo: tuple[int | bool | None, ...] | None = None
        if state is None:
            # the run's sampler: the same draw as discrete_laplace on the cursor, cheaper
            # (unchecked: svt_scales's ints are >= 1), flat: Z_0, then the position after
            z0: list[int] = []
            discrete_laplace_into(WordCursor(KeyedStream(key, label, "/z0")), t0, 1, z0)
            self.z0 = z0[0]
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
            self._skip = int(state["p"])
            self._zpos = int(state["zp"])
            self._zahead.position = self._zpos
            self.halted = bool(state["h"])
            self.run = int(state["r"])
            self._has_plan = "f" in state
            self.plan = None if state.get("f") is None else int(state["f"])
            if (min(self.steps, self.draws, self._skip, self._zpos) < 0
                    or not 0 <= self.run <= self.prefix
                    or (self._has_plan and self.run != self.prefix)):
                raise ValueError("SVT state out of range")

    def to_state(self) -> dict[str, Any]:
        """The instance as a small dict (Z_0, step and draw counters, cursor positions,
        dense steps of the current ⊥ run, plan)."""
        d: dict[str, Any] = {"z0": self.z0, "n": self.steps, "d": self.draws,
                             "p": self._skip, "zp": self._zpos,
                             "h": self.halted, "r": self.run}
        if self._has_plan:
            d["f"] = self.plan
        return d

    # -- the comparison -------------------------------------------------------------------

    def _k(self, v: int, s: int) -> int:
        """Step s fires iff Z_s > k_s (all integers, units); k_s = svt_threshold_units +
        Z_0 - v, computed with the same float operations."""
        return math.floor((self.tau + self._b8 * math.log(s + self._c)) * UNIT) + self.z0 - v

    # -- the per-step draws Z_t -------------------------------------------------------------

    def _peek(self, i: int) -> int:
        """Draw number i >= draws without consuming it (scalar draws are remembered)."""
        if i >= SCALAR_DRAWS:
            return self._banked(i)
        j = i - self.draws
        if len(self._ahead) <= 2 * j:
            self._fill(j + 1)
        return self._ahead[2 * j]

    def _banked(self, i: int) -> int:
        """Draw number i >= SCALAR_DRAWS, from the LaplaceBank on the "/z" stream."""
        if self._bank is None:
            self._bank = LaplaceBank(self._zahead.stream, self._t1)
        return self._bank.draw(i - SCALAR_DRAWS)

    def _fill(self, n: int) -> None:
        """Look at the next n draws ahead (those among the scalar ones) in one run."""
        ahead = self._ahead
        n = min(self.draws + n, SCALAR_DRAWS) - self.draws - len(ahead) // 2
        if n > 0:
            discrete_laplace_into(self._zahead, self._t1, n, ahead)

    def _take(self) -> int:
        """Consume the next draw: the first SCALAR_DRAWS from the scalar cursor, then the
        bank. A scalar draw not looked at yet comes in one run with the draws of the next
        dense prefix: a step's draw is usually followed by a `due` that looks at those,
        and a run costs a fraction of as many single draws."""
        i = self.draws
        if i >= SCALAR_DRAWS:
            self.draws = i + 1
            return self._banked(i)
        ahead = self._ahead
        if not ahead:
            self._fill(1 + self.prefix)
        self.draws = i + 1
        z, self._zpos = ahead[0], ahead[1]
        del ahead[:2]
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
        from word `pos`; returns (step or None, position after). Pure in the state.

        Exact (see the module docstring): a step with k_s < 0 (q_s > 1/2) is one exact
        DLap draw compared with k_s; from a step s with k_s >= 0 on, candidates come with
        the constant per-step probability q_b on each dyadic block [b, ...) (b = s, then
        powers of two), located by one lazily refined uniform (_candidate); a candidate c
        in the block of b is accepted with probability q_c / q_b = exp(-(k_c - k_b)/t1),
        an exact bernoulli_exp; after a rejection the search restarts at c + 1.
        """
        cur = self._scan
        if (NATIVE is not None and self._plan_native and not self._exact_only
                and type(cur.stream) is KeyedStream
                and 0 <= pos < _NATIVE_END and start >= 1 and end <= HORIZON
                and -_I62 < v < _I62 and -_I62 < self.z0 < _I62):
            # the extension: the same float operations (libm's, as math's), words and
            # decisions, or None where this code must decide (tests/core/
            # test_native_samplers.py checks them against each other)
            got = NATIVE.svt_plan(cur.stream.derived_key(), pos, v, start, end, self.tau,
                                  self._b8, self._c, self.z0, self._t1, self._lam,
                                  self._log1pq, self._g)
            if got is not None:
                return got
        cur.position = pos
        t1 = self._t1
        s = start
        while s < end:
            k = self._k(v, s)
            if k < 0:
                if discrete_laplace(cur, t1) > k:
                    return s, cur.position
                s += 1
                continue
            u = _Uniform(cur)
            found = _UNSURE if self._exact_only else self._candidate_float(v, s, end, u)
            if found is _UNSURE:
                found = self._candidate_decimal(v, s, end, u)
            if found is None:
                return None, cur.position
            assert isinstance(found, tuple)
            c, kb = found
            if bernoulli_exp(cur, self._k(v, c) - kb, t1):
                return c, cur.position
            s = c + 1
        return None, cur.position

    def _candidate_float(self, v: int, s: int, end: int, u: _Uniform
                         ) -> tuple[int, int] | object | None:
        """The first candidate in [s, end) (with k at its block's start), None if there
        is none, or _UNSURE when float bounds cannot decide.

        E = -ln U ~ Exp(1); with cumulative candidate hazard C_j at the start of block j
        (per-step hazard h_b = -ln(1 - q_b)), the first candidate lies in block j iff
        C_j <= E < C_{j+1}, at b_j + floor((E - C_j) / h_j). Every float quantity is used
        with an error bound (_REL, far above libm's few ulps); a decision is taken only
        when it holds for every value inside the bounds, so it is the exact one.
        """
        e_lo, e_hi = u.e_bounds_float()
        lam, log1pq = self._lam, self._log1pq
        b = s
        c_mid = 0.0
        c_err = 1e-300  # also covers hazards that underflow to 0.0
        while b < end:
            kb = self._k(v, b)
            lp = -(kb + 1) * lam - log1pq  # ln q_b, k_b >= 0
            p = math.exp(lp)
            h = -math.log1p(-p)
            if e_lo - c_mid - c_err >= self._tail_bound(b, p, h):
                return None  # E exceeds all the hazard left: no candidate, ever
            rel = (abs(lp) + 4.0) * _REL
            e = min(1 << b.bit_length(), end)
            term = (e - b) * h
            n_mid = c_mid + term
            n_err = c_err + term * (rel + _REL) + n_mid * _REL
            if e_hi < n_mid - n_err:  # E < C_{j+1} (and E >= C_j was decided before)
                y_lo = (e_lo - c_mid - c_err) / (h * (1.0 + rel)) * (1.0 - _REL)
                y_hi = (e_hi - c_mid + c_err) / (h * (1.0 - rel)) * (1.0 + _REL)
                g = max(0, math.floor(y_lo))
                if g != math.floor(y_hi) or g >= e - b:
                    return _UNSURE
                return b + g, kb
            if e_lo < n_mid + n_err:
                return _UNSURE
            c_mid, c_err = n_mid, n_err
            b = e
        return None

    def _candidate_decimal(self, v: int, s: int, end: int, u: _Uniform
                           ) -> tuple[int, int] | None:
        """_candidate_float's decision in decimal arithmetic with rigorous error bounds,
        refining U (one more word) and the precision until it is decided: the slow path,
        taken with probability about 2^-30 or less per candidate search (and by the
        agreement tests, through _exact_only)."""
        level = 0
        while True:
            found = self._candidate_at(v, s, end, u, 40 + 25 * level + u.bits // 3)
            if found is not _UNSURE:
                assert found is None or isinstance(found, tuple)
                return found
            u.extend()
            level += 1

    def _candidate_at(self, v: int, s: int, end: int, u: _Uniform, prec: int
                      ) -> tuple[int, int] | object | None:
        """One attempt of _candidate_decimal at `prec` digits. Every operation of the
        context is correctly rounded (error <= 1/2 ulp, taken as r = 10^(1-prec) relative);
        each bound below adds up those errors, then doubles them."""
        ctx = Context(prec=prec)
        with localcontext(ctx):
            r = Decimal(10) ** (1 - prec)
            big = u.bits * ctx.ln(Decimal(2))  # B ln 2 >= ln m
            e_lo = big - ctx.ln(Decimal(u.m + 1))
            e_err = 8 * (u.bits + 1) * r
            lo = e_lo - e_err
            hi = Decimal("Infinity") if u.m == 0 else big - ctx.ln(Decimal(u.m)) + e_err
            lq = ctx.ln(1 + ctx.exp(-Decimal(1) / self._t1))  # ln(1 + e^{-1/t1}), < 1
            c = Decimal(0)
            c_err = Decimal(0)
            b = s
            while b < end:
                kb = self._k(v, b)
                x = Decimal(kb + 1) / self._t1
                lp = -(x + lq)
                lp_err = 2 * (2 * abs(lp) + 8) * r
                p = ctx.exp(lp)
                p_rel = 2 * (2 * lp_err + r)
                if p < Decimal("1e-6"):
                    h = p  # -ln(1 - p) = sum p^n / n; stop once p^n < p r
                    t = p
                    n = 1
                    while t > p * r:
                        n += 1
                        t *= p
                        h += t / n
                    h_rel = 2 * (2 * p_rel + (n + 4) * r)
                else:
                    h = -ctx.ln(1 - p)
                    h_rel = 2 * (2 * p_rel + (2 / p + 2) * r)
                e = min(1 << b.bit_length(), end)
                term = (e - b) * h
                n_c = c + term
                n_err = 2 * (c_err + term * (h_rel + 2 * r) + abs(n_c) * r)
                if hi < n_c - n_err:
                    y_lo = (lo - c - c_err) / h
                    y_hi = (hi - c + c_err) / h
                    y_lo -= 2 * (abs(y_lo) * (h_rel + 4 * r) + r)
                    y_hi += 2 * (abs(y_hi) * (h_rel + 4 * r) + r)
                    g = max(0, math.floor(y_lo))
                    if g != math.floor(y_hi) or g >= e - b:
                        return _UNSURE
                    return b + g, kb
                if lo < n_c + n_err:
                    return _UNSURE
                c, c_err = n_c, n_err
                b = e
            return None

    def _tail_bound(self, s: int, p: float, h: float) -> float:
        """An upper bound on the candidate hazard of all blocks from s on, given
        p = q_s <= 1/2 (k_s >= 0) and h = -ln(1 - p) (floats).

        k_{s'} - k_s >= (8 UNIT/eps) ln((s'+c)/(s+c)) - 2 (two floors of float
        thresholds), so q_{s'} <= e^{2/t1} q_s ((s'+c)/(s+c))^{-g}, g = 8 UNIT/(eps t1)
        > 1, and T := sum_{s'>=s} q_{s'} <= e^{2/t1} q_s (1 + (s+c)/(g-1)). The block
        holding s adds at most s h (it is at most s long); the next one, 2^{J+1} steps at
        rate <= q_s with h(q) <= 2q, at most 4 s q_s; each later block j, 2^j h(q_{2^j})
        <= 4 * (sum of q over block j-1) <= 4 T in all. Slack covers float rounding.
        """
        g1 = self._g - 1.0
        if g1 <= 0.0:
            return math.inf
        tail = math.exp(2.0 / self._t1) * p * (1.0 + (s + self._c) / g1)
        return (s * h + 4.0 * s * p + 4.0 * tail) * (1.0 + 2.0**-30) + 1e-300

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
        step, self._skip = self._sample(v, self.steps + 1, self.steps + 1 + n, self._skip)
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
        start, pos = self.steps + 1 + self.prefix - self.run, self._skip
        c = self._cached
        if c is None or c[0] != start or c[1] != pos or c[2] != v:
            c = self._cached = (start, pos, v, *self._sample(v, start, HORIZON, pos))
        return c[3]

    def due(self, v: int, within: int | None = None) -> int | None:
        """Steps until the instance fires if the input stays v (None: never). With
        `within`, None also means "not within that many steps", and a far plan is not
        computed when the dense prefix covers them. Does not change the state: the
        answer is a pure function of it (the last one is remembered: a skip asks, then
        its advance asks again)."""
        if self.halted:
            raise RuntimeError("SVT has halted")
        memo = self._due_memo
        if (memo is not None and memo[0] == v
                and memo[2] == self.steps and memo[3] == self.run and memo[4] == self.draws
                and memo[5] == self._has_plan and memo[6] == self.plan
                and memo[7] == self._skip):
            if memo[1] == within:
                return memo[8]
            if memo[1] is None:
                # the answer without a limit decides every limit: a skip asks next_due()
                # first, then with the skip's end, then the advance with its length
                d = memo[8]
                return None if d is None or within is None or d > within else d
        d = self._due(v, within)
        self._due_memo = (v, within, self.steps, self.run, self.draws, self._has_plan,
                          self.plan, self._skip, d)
        return d

    def _due(self, v: int, within: int | None) -> int | None:
        m = self.prefix - self.run
        n = m if within is None else min(m, within)
        # the prefix's draws in one run of the sampler (each is consumed later anyway)
        self._fill(n)
        if n:
            # k_s is non-decreasing in s: a draw at most the run's first k fires nowhere
            # in the prefix, and only a larger one needs its own step's k
            k0 = self._k(v, self.steps + 1)
            d = self.draws
            if d + n <= SCALAR_DRAWS:
                # all looked at already (_fill): one pass over the list, no call per draw
                zs = self._ahead[0 : 2 * n : 2]
                if max(zs) > k0:
                    for i, z in enumerate(zs):
                        if z > k0 and z > self._k(v, self.steps + i + 1):
                            return i + 1
            else:
                for i in range(n):
                    z = self._peek(d + i)
                    if z > k0 and z > self._k(v, self.steps + i + 1):
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
            self._skip = self._cached[4]
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
        ahead = self._ahead
        if j and self.draws + j <= SCALAR_DRAWS and len(ahead) >= 2 * j:
            # what j _take calls do, at once: the draws were looked at by `due`
            self._zpos = ahead[2 * j - 1]
            del ahead[: 2 * j]
            self.draws += j
        else:
            for _ in range(j):
                self._take()
        self.run += j
        self.steps += j
        if k > j:
            self._commit(v)
            self.steps += k - j
