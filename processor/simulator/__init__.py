"""The vectorised simulator of the counters: many runs at once, from the core's constants.

simulate.py (`simulate(name, x, eps, delta, rng)`: releases of one mechanism on a batch of
input streams), params.py (every constant it uses, taken from processor/core) and
svt_block.py (how long Part's SVT takes to fire: `plan`'s model of an ECC block). Shipped
commands use it (`plan`'s quick runs, `audit --backend sim` and the audit's pair-search
pilot), so it lives outside processor/experiments, the research code of Section 8 that no
shipped command imports; the experiments build on it.
"""
