"""Empirical privacy audit: distinguishing tests on neighbouring streams (Section 8 spirit).

No I/O, but outside the pure core: the audit runs the core's counters and judges them
with numpy and scipy statistics, and the core never imports it. statistics.py (the
bounds and the verdict), runs.py (streams, releases, scores), plans.py (which pair and
score per mechanism, the pair search), diagnostics.py (white-box checks of ECC and
SimECC); the command is processor/commands/audit.py.

The audit runs a mechanism many times (independently keyed runs) on two edit
neighbours x (`x0`) and x' (`x1`, the insertion neighbour of x), reduces each run's whole
release stream y_1..y_T to one real score, and turns the two samples of scores into lower
bounds on epsilon. If the mechanism is (eps, delta)-DP then for every event E

    P_x(E) <= e^eps P_x'(E) + delta   and   P_x'(E) <= e^eps P_x(E) + delta,

so any event gives eps >= ln((P_a(E) - delta) / P_b(E)) for (a, b) either order.

Two bounds, each a valid lower bound with confidence 1 - alpha/2 (so the verdict
"some bound > eps" has false-alarm rate at most alpha for a correct mechanism):

- `empirical_bound` (any mechanism, no assumption): the runs of each stream are split in
  halves. On the first (selection) half, every threshold c among the observed scores, both
  events {s >= c} and {s <= c} and both orders are scored; the best is then evaluated on
  the second (estimation) half only, with one-sided Clopper-Pearson bounds at level
  alpha/4 each: P_a(E) from below, P_b(E) from above. The choice is independent of the
  estimate, so the search costs nothing. This bound can never exceed
  `attainable_bound(n)` ~ ln(n / ln(4/alpha)) for n estimation runs per stream.
- `known_null_bound` (mechanisms whose noise law is known): the score is standardised so
  that on x it is exactly N(0, 1) under the law the mechanism claims (for example the
  likelihood-ratio statistic of GaussianCC). P_x(E) is then computed, not estimated, so
  thresholds far in the tail are usable and the bound is not capped by the number of runs;
  only P_x'(E) is estimated (Clopper-Pearson at alpha/4, threshold chosen on a held-out
  half). Its validity rests on the claimed law, so `null_law_check` tests the scores on x
  against N(0, 1) (Kolmogorov-Smirnov); a mismatch is itself a failure.

- `exact_pair_bound` / `pmf_pair_bound` (known laws): the claimed law's exact privacy
  profile on the pair (Gaussian: the pair's mu |d|_C; PartitionCC: only its release ticks
  are sampled; the Laplace tree: the computed laws of its leaf score). Not capped by runs.

ECC and SimECC hide their partition behind BCC's noise and leak far less than eps on any
testable pair, so no bound on their releases can catch a partition with too little noise
or a plan that under-charges the shift; `plan_check` (exact: what the counter's parameters
and noise scales deliver, recomputed independently of processor.core.tight),
`ecc_partition_check` / `simecc_partition_check` (the partition's law over the whole run,
in windows, against independent samplers of Algorithms 1 and 5) and
`gaussian_counters_check` (CC's and BCC's noise against the sigma their (eps, delta)
promise) do, under both calibrations. `unit_accounting` recomputes what a privacy unit
gets from the per-event parameters without processor/core/unit.py. `plan_for`,
`default_streams` and `search_pair` say which streams and which score each mechanism gets
(docs/audit.md).

`AuditError` is raised when the audit cannot say anything: a score that is constant over
all runs (typically: the mechanism released nothing in the window) gives no test at all.
"""
