"""`python -m processor.experiments bounds` (processor/experiments/bounds.py) end to end."""

from __future__ import annotations

import csv
from pathlib import Path

from processor.experiments.cli import main_experiment


def test_bounds_command_writes_the_series(tmp_path: Path, capsys: object) -> None:
    assert main_experiment(["bounds", "--runs", "60", "--horizon", "600", "--out",
                            str(tmp_path), "--no-progress"]) == 0
    with open(tmp_path / "bounds.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["t"]) for r in rows] == list(range(1, 601))
    assert all(float(r["bound"]) >= 0 and 0 <= float(r["coverage_all_ones"]) <= 1
               for r in rows)
    # before SimPart's first checkpoint (mu = 140 at eps 10) the bound is t itself
    assert [float(r["bound"]) for r in rows[:50]] == [float(t) for t in range(1, 51)]
    assert (tmp_path / "bounds.png").stat().st_size > 0
