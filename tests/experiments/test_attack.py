"""The Section 8 attack, its statistics and the Table 1 read-off, against exact answers."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from processor.experiments import attack, figures
from processor.experiments.cli import main_experiment
from processor.simulator.simulate import cc_scales, gaussiancc_sigma_vector


def test_block_rates_alternate_from_low() -> None:
    p = attack.block_rates(45, 0.1, 0.9, 10)
    assert p[:10].tolist() == [0.1] * 10
    assert p[10:20].tolist() == [0.9] * 10
    assert p[40:].tolist() == [0.1] * 5


def test_trials_insert_a_one_and_shift() -> None:
    rates = attack.block_rates(50)
    x, b = attack.draw_trials(rates, 400, np.random.default_rng(1))
    x2, b2 = attack.draw_trials(rates, 400, np.random.default_rng(1))
    assert np.array_equal(b, b2) and np.array_equal(x, x2)
    assert 100 < b.sum() < 300
    assert np.all(x[b, 0] == 1)
    # a run with b = 1 is the b = 0 stream of the same draws shifted by one tick
    rng = np.random.default_rng(1)
    raw = (rng.random((400, 50)) < rates[None, :]).astype(np.int8)
    assert np.array_equal(x[b, 1:], raw[b, :-1])
    assert np.array_equal(x[~b], raw[~b])


def test_statistic_and_threshold_equal_the_paper_sums() -> None:
    """S and theta against a literal loop over t = 2..T of the paper's formulas."""
    rng = np.random.default_rng(2)
    rates = attack.block_rates(37, 0.2, 0.7, 4)
    y = rng.normal(size=(3, 37)).cumsum(axis=1)
    for r in range(3):
        s_loop = 0.0
        for t in range(1, 37):  # 0-based t = 1..T-1 is the paper's t = 2..T
            dp = rates[t] - rates[t - 1]
            dy = y[r, t] - y[r, t - 1]
            s_loop += (rates[t] - dy) * dp
        assert attack.statistic(y, rates)[r] == pytest.approx(s_loop, rel=1e-12, abs=1e-9)
    theta = 0.5 * sum((rates[t] - rates[t - 1]) ** 2 for t in range(1, 37))
    assert attack.threshold(rates) == pytest.approx(theta)


def test_advantage_known_answers() -> None:
    """Exact release (y = s): the attack wins almost always; a constant release: the guess
    is constant so the advantage is 2 P(b = guess) - 1 ~ 0. Both with the 95% interval.
    (False-alarm: the noiseless advantage is > 0.99 with overwhelming probability at
    T = 10^4; the constant one lies in its own CP interval around 0 at rate 95%, and the
    fixed seed makes it deterministic.)"""
    rates = attack.block_rates(10_000)
    x, b = attack.draw_trials(rates, 2000, np.random.default_rng(3))
    s = np.cumsum(x, axis=1).astype(np.float64)
    exact = attack.advantage(int(np.sum(attack.guesses(s, rates) == b)), b.size)
    assert exact.value > 0.99 and exact.low > 0.98
    flat = attack.advantage(int(np.sum(attack.guesses(np.zeros_like(s), rates) == b)), b.size)
    assert flat.low <= 0.0 <= flat.high


def test_clopper_pearson_closed_forms() -> None:
    """k = 0 and k = n have closed forms; the interval contains k/n and is symmetric."""
    n = 50
    lo, hi = attack.clopper_pearson(0, n)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / n))
    lo, hi = attack.clopper_pearson(n, n)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / n))
    lo, hi = attack.clopper_pearson(17, n)
    lo2, hi2 = attack.clopper_pearson(n - 17, n)
    assert lo < 17 / n < hi
    assert lo == pytest.approx(1 - hi2) and hi == pytest.approx(1 - lo2)
    with pytest.raises(ValueError):
        attack.clopper_pearson(5, 4)


def test_rmse_and_standard_error() -> None:
    y = np.array([[1.0, 1.0], [3.0, 3.0]])
    s = np.zeros((2, 2))
    r = attack.per_run_rmse(y, s)
    assert r.tolist() == [1.0, 3.0]
    m, se = attack.mean_se(r)
    assert m == 2.0 and se == pytest.approx(math.sqrt(2.0) / math.sqrt(2))


def _pt(m: str, eps: float, rmse: float, hi: float) -> figures.Point:
    return figures.Point("", m, eps, 1e-5, 100, 10, 0.1, 0.9, 10, rmse, 0.1, hi - 0.01, 0.0, hi)


def test_table1_reads_the_smallest_error_whose_upper_limit_meets_the_bound() -> None:
    pts = [_pt("basecc", 0.1, 100.0, 0.02), _pt("basecc", 0.2, 50.0, 0.07),
           _pt("basecc", 0.4, 20.0, 0.12), _pt("simecc", 1.0, 9.0, 0.3)]
    tab = {(e.mechanism, e.bound): e for e in figures.table1(pts)}
    assert tab[("basecc", 0.1)].rmse == 50.0 and tab[("basecc", 0.1)].epsilon == 0.2
    assert tab[("basecc", 0.05)].rmse == 100.0
    assert tab[("simecc", 0.1)].rmse is None
    text = figures.format_table1(figures.table1(pts))
    assert "none in sweep" in text and "50.00" in text


def test_eps_sweep_is_the_papers() -> None:
    paper = [0.10, 0.19, 0.38, 0.73, 1.4, 2.8, 5.4, 10, 20, 40, 77, 150]
    assert len(figures.EPS_SWEEP) == 12
    # the paper prints two significant digits (and 2.78 in Figure 2's caption)
    assert [float(f"{e:.2g}") for e in figures.EPS_SWEEP] == paper
    assert figures.EPS_SWEEP[5] == pytest.approx(2.78, abs=0.005)


def test_fig1a_command_writes_the_csv_columns_and_is_seeded(tmp_path: object) -> None:
    """A tiny fig1a run writes the required columns, one row per (mechanism, eps), and the
    same seed reproduces the same numbers."""
    from pathlib import Path

    out = Path(str(tmp_path))
    argv = ["fig1a", "--runs", "20", "--horizon", "200", "--eps", "1", "50", "--out",
            str(out / "a"), "--seed", "3", "--no-progress", "--mechanisms", "basecc", "simecc"]
    assert main_experiment(argv) == 0
    argv[argv.index(str(out / "a"))] = str(out / "b")
    assert main_experiment(argv) == 0
    rows = list(csv.DictReader((out / "a" / "fig1a.csv").open()))
    need = {"mechanism", "epsilon", "delta", "horizon", "runs", "rmse", "rmse_se", "advantage",
            "advantage_low", "advantage_high"}
    assert need <= set(rows[0])
    assert [(r["mechanism"], float(r["epsilon"])) for r in rows] == [
        ("basecc", 1.0), ("basecc", 50.0), ("simecc", 1.0), ("simecc", 50.0)]
    for r in rows:
        assert float(r["advantage_low"]) <= float(r["advantage"]) <= float(r["advantage_high"])
    assert (out / "a" / "fig1a.csv").read_text() == (out / "b" / "fig1a.csv").read_text()
    assert (out / "a" / "fig1a.png").stat().st_size > 1000
    assert main_experiment(["fig1a", "--runs", "1", "--out", str(out / "c")]) == 2


@pytest.mark.parametrize("mechanism", ["basecc", "gaussiancc"])
def test_additive_sweep_equals_the_direct_path(mechanism: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's fast path (one standardised draw rescaled per eps) gives exactly the
    numbers of simulate() + attack on the same draws: with the noise generator made
    independent of eps, per-run RMSE and the advantage agree to rounding. Deterministic."""
    orig = figures._noise_rng
    monkeypatch.setattr(figures, "_noise_rng", lambda seed, m, eps, i: orig(seed, m, 0.0, i))
    setup = figures.Setup(horizon=300, runs=400, seed=11)
    eps_values = [0.5, 3.0, 40.0]
    fast = figures.additive_sweep(setup, mechanism, eps_values)
    for eps, pt in zip(eps_values, fast, strict=True):
        direct = figures.run_point(setup, mechanism, eps)
        assert pt.rmse == pytest.approx(direct.rmse, rel=1e-9)
        assert pt.rmse_se == pytest.approx(direct.rmse_se, rel=1e-6)
        assert pt.advantage == direct.advantage
    # control: a fast path that forgot the interval scales (or the sigma profile) differs
    # The originals (the objects figures imported); the patches go on figures' names.
    scales, sig = cc_scales, gaussiancc_sigma_vector
    if mechanism == "basecc":
        monkeypatch.setattr(figures, "cc_scales",
                            lambda *a: (scales(*a)[0], 0.9 * scales(*a)[1]))
    else:
        monkeypatch.setattr(figures, "gaussiancc_sigma_vector", lambda e, d, n: 0.9 * sig(e, d, n))
    wrong = figures.additive_sweep(setup, mechanism, eps_values)
    assert all(abs(a.rmse - b.rmse) > 1e-3 * b.rmse for a, b in zip(wrong, fast, strict=True))


def test_sweep_results_do_not_depend_on_jobs() -> None:
    """Worker processes change nothing: every point's noise is keyed by its own seed."""
    setup = figures.Setup(horizon=150, runs=40, seed=5)
    one = figures.sweep(setup, ["basecc", "simecc"], [1.0, 30.0], progress=False, jobs=1)
    two = figures.sweep(setup, ["basecc", "simecc"], [1.0, 30.0], progress=False, jobs=2)
    assert [p.row() for p in one] == [p.row() for p in two]


def test_fig2_histograms_are_normalised_and_placed(tmp_path: object) -> None:
    """fig2 at a small size: per hypothesis the densities integrate to 1 over the bins
    (normalised over the shown range; the CSV keeps 6 digits), theta is the paper's
    threshold, and the panels are the paper's (BaseCC and PartitionCC at eps 2.78,
    SimECC at 150)."""
    from pathlib import Path

    out = Path(str(tmp_path))
    assert main_experiment(["fig2", "--runs", "400", "--horizon", "400", "--out", str(out),
                            "--no-progress"]) == 0
    rows = list(csv.DictReader((out / "fig2.csv").open()))
    panels = sorted({(r["mechanism"], round(float(r["epsilon"]), 2)) for r in rows})
    assert panels == [("basecc", 2.78), ("partitioncc", 2.78), ("simecc", 150.0)]
    theta = attack.threshold(attack.block_rates(400))
    for m, _ in panels:
        for hyp in ("H0", "H1"):
            sel = [r for r in rows if r["mechanism"] == m and r["hypothesis"] == hyp]
            mass = sum(float(r["density"]) * (float(r["bin_right"]) - float(r["bin_left"]))
                       for r in sel)
            assert mass == pytest.approx(1.0, abs=1e-4)  # the CSV keeps 6 digits
            assert float(sel[0]["theta"]) == pytest.approx(theta, rel=1e-5)


def test_fig3_panels_vary_one_parameter_each(tmp_path: object) -> None:
    """fig3 at a small size: panels a-d change exactly the parameter the paper's panels do."""
    from pathlib import Path

    out = Path(str(tmp_path))
    assert main_experiment(["fig3", "--runs", "20", "--horizon", "100", "--eps", "5",
                            "--mechanisms", "gaussiancc", "--out", str(out),
                            "--no-progress"]) == 0
    rows = {r["panel"]: r for r in csv.DictReader((out / "fig3.csv").open())}
    assert sorted(rows) == ["a", "b", "c", "d"]
    key = ("delta", "rate_low", "rate_high", "width")
    base = tuple(float(rows["a"][k]) for k in key)
    assert base == (1e-5, 0.1, 0.9, 10.0)
    assert tuple(float(rows["b"][k]) for k in key) == (1e-5, 0.1, 0.9, 50.0)
    assert tuple(float(rows["c"][k]) for k in key) == (1e-5, 0.3, 0.7, 10.0)
    assert tuple(float(rows["d"][k]) for k in key) == (1e-9, 0.1, 0.9, 10.0)


def test_fig1b_is_error_against_horizon(tmp_path: object, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    """fig1b at a small size: one row per (horizon, mechanism), constant rate, no attack
    columns; GaussianCC's error grows with T (its sigma_t grows like sqrt(t) ln t: at
    these sizes the growth is many standard errors, so the check cannot fail by chance)."""
    from pathlib import Path

    out = Path(str(tmp_path))
    assert main_experiment(["fig1b", "--runs", "30", "--horizon", "100", "1000",
                            "--out", str(out), "--no-progress"]) == 0
    rows = list(csv.DictReader((out / "fig1b.csv").open()))
    assert [(r["mechanism"], int(r["horizon"])) for r in rows] == [
        ("ecc", 100), ("simecc", 100), ("gaussiancc", 100),
        ("ecc", 1000), ("simecc", 1000), ("gaussiancc", 1000)]
    assert all(r["rate_low"] == r["rate_high"] == "0.01" and r["advantage"] == "nan"
               for r in rows)
    g = [float(r["rmse"]) for r in rows if r["mechanism"] == "gaussiancc"]
    assert g[1] > 3 * g[0]
    # table1 from a CSV: the committed full run's file reads back
    assert main_experiment(["table1", "--csv", "docs/figures/fig1a.csv", "--out",
                            str(out / "t")]) == 0
    assert "SimECC" in capsys.readouterr().out
