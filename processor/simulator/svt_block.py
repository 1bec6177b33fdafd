"""How long Part's SVT takes to fire on random input: the planner's model of an ECC block.

One run is Algorithm 1's sparse vector test on Bernoulli(p) events, one a step: at step k
with count C_k it fires when C_k + L_k > T_k, where T_k = tau + growth(k) + Z_0 (the
core's threshold and scales, through `params.svt_growth` and `params.svt_scales`) and L_k
is fresh Laplace noise of scale s1. Stepping through every step costs two draws a step, and a block
can last millions of steps when events are rare and epsilon is small.

`block_steps` samples the same law without visiting every step. Given the count C_k, a
step k + j <= k + m of the next chunk of m steps fires with probability
S(T_{k+j} - C_{k+j}) (S: the Laplace survival function), at most
q = S(T_{k+1} - C_k - B), B the chunk's events: thresholds only grow and counts only
grow, by B in all. So the chunk's B is drawn first (a binomial), then candidate steps as
a Bernoulli(q) process over the chunk (their number a binomial, their places uniform), and
each candidate, in order, fires with probability S(gap at it) / q, its count drawn from
the chunk's B placed uniformly (hypergeometric): thinning, exact in law. Far below the
threshold q * m is tiny and a chunk costs a few draws; near it, where candidates would be
many, a chunk is simulated step by step (decided before the chunk's draws, from what is
known before it). `step_by_step` is the plain simulation, the reference
`tests/test_svt_block.py` checks the two against.
"""

from __future__ import annotations

import math

import numpy as np

from processor.simulator.params import svt_growth, svt_scales

#: Steps per chunk.
CHUNK = 4096
#: A chunk whose expected candidates (q * CHUNK, from a likely bound on its events) exceed
#: this is simulated step by step.
DENSE = 4.0
#: A run that has not fired after this many steps never will at this rate: infinity.
MAX_STEPS = 10**8


def survival(gap: np.ndarray, scale: float) -> np.ndarray:
    """P(L > gap) for L ~ Laplace(0, scale), elementwise."""
    out: np.ndarray = np.where(gap >= 0, 0.5 * np.exp(-np.abs(gap) / scale),
                               1.0 - 0.5 * np.exp(-np.abs(gap) / scale))
    return out


def lowest_gap(threshold_next: np.ndarray, count: np.ndarray,
               chunk_events: np.ndarray) -> np.ndarray:
    """The lowest threshold-minus-count any step of a chunk can have: the threshold of its
    first step (thresholds grow) less the count at its end (counts grow)."""
    out: np.ndarray = threshold_next - count - chunk_events
    return out


def block_steps(eps_p: float, tau: float, p: float, runs: int,
                rng: np.random.Generator) -> np.ndarray:
    """The step at which each of `runs` runs fires (inf: not within MAX_STEPS)."""
    s0, s1 = svt_scales(eps_p)
    base = tau + rng.laplace(0.0, s0, runs)  # tau + Z_0
    fired = np.full(runs, math.inf)
    steps = np.zeros(runs, dtype=np.int64)
    count = np.zeros(runs, dtype=np.int64)
    live = np.arange(runs)
    offsets = np.arange(1, CHUNK + 1)
    spread = CHUNK * p + 6.0 * math.sqrt(CHUNK * p * (1.0 - p)) + 1.0
    while live.size:
        at, have = steps[live], count[live]
        threshold_next = base[live] + svt_growth(eps_p, at + 1)
        # Decided from what is known before the chunk: its events are likely below `spread`.
        likely = survival(lowest_gap(threshold_next, have, np.full(live.size, spread)), s1)
        dense = likely * CHUNK > DENSE
        done = np.zeros(live.size, dtype=bool)
        d = np.flatnonzero(dense)
        if d.size:
            k = at[d, None] + offsets
            counts = have[d, None] + np.cumsum(rng.random((d.size, CHUNK)) < p, axis=1)
            hit = (counts + rng.laplace(0.0, s1, (d.size, CHUNK))
                   > base[live[d], None] + svt_growth(eps_p, k))
            first = hit.any(axis=1)
            fired[live[d[first]]] = at[d[first]] + hit[first].argmax(axis=1) + 1
            done[d[first]] = True
            count[live[d]] = counts[:, -1]
        s = np.flatnonzero(~dense)
        if s.size:
            events = rng.binomial(CHUNK, p, s.size)
            q = survival(lowest_gap(threshold_next[s], have[s], events), s1)
            candidates = rng.binomial(CHUNK, q)
            for i in np.flatnonzero(candidates):
                j = s[i]
                step = _first_accepted(rng, int(candidates[i]), int(events[i]), float(q[i]),
                                       float(base[live[j]]), int(at[j]), int(have[j]),
                                       eps_p, s1)
                if step is not None:
                    fired[live[j]] = step
                    done[j] = True
            count[live[s]] = have[s] + events
        steps[live] = at + CHUNK
        live = live[~done]
        if live.size and steps[live].min() > MAX_STEPS:
            break
    return fired


def _first_accepted(rng: np.random.Generator, candidates: int, events: int, q: float,
                    base: float, at: int, have: int, eps_p: float, s1: float) -> int | None:
    """The first candidate step of a chunk that fires (None: none): `candidates` places
    drawn uniformly among the chunk's steps, the chunk's `events` placed uniformly, each
    candidate kept with probability S(its gap) / q."""
    places = np.sort(rng.choice(CHUNK, candidates, replace=False)) + 1
    seen, left_events, left_steps, before = 0, events, CHUNK, 0
    for place in places:
        take = int(place) - seen
        got = int(rng.hypergeometric(left_events, left_steps - left_events, take))
        before += got
        left_events -= got
        left_steps -= take
        seen = int(place)
        gap = base + float(svt_growth(eps_p, np.array(at + seen))) - (have + before)
        if rng.random() * q < float(survival(np.array(gap), s1)):
            return at + seen
    return None


def step_by_step(eps_p: float, tau: float, p: float, runs: int,
                 rng: np.random.Generator) -> np.ndarray:
    """The reference: every step of every run simulated (the fire step of each run)."""
    s0, s1 = svt_scales(eps_p)
    base = tau + rng.laplace(0.0, s0, runs)
    fired = np.full(runs, math.inf)
    count = np.zeros(runs)
    start = 0
    offsets = np.arange(1, CHUNK + 1)
    while np.isinf(fired).any() and start <= MAX_STEPS:
        counts = count[:, None] + np.cumsum(rng.random((runs, CHUNK)) < p, axis=1)
        hit = (counts + rng.laplace(0.0, s1, (runs, CHUNK))
               > base[:, None] + svt_growth(eps_p, start + offsets))
        new = np.isinf(fired) & hit.any(axis=1)
        fired[new] = start + hit[new].argmax(axis=1) + 1
        count = counts[:, -1]
        start += CHUNK
    return fired
