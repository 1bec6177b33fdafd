"""bench/bench_unit.py --stage runs the real bounding stage: every event is kept or
dead-lettered exactly once, as many as the bounds allow, and every unit touched is
written. Deterministic (fixed seed)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_unit  # noqa: E402


def test_stage_mode_keeps_within_the_bounds_and_writes_every_unit(tmp_path: Path) -> None:
    r = bench_unit.stage_run(3000, 300, 7, tmp_path)
    assert r["kept"] + r["dead_lettered"] == 3000
    # 300 units, at most k events in each of at most m counters: at most 1,800 kept.
    assert 0 < r["kept"] <= 300 * bench_unit.K * bench_unit.M
    assert r["dead_lettered"] > 0
    # One checkpoint (fewer events than STAGE_CHECKPOINT_EVENTS): one write per unit
    # touched (at most 300) plus one per units partition.
    assert r["unit_writes_per_event"] * 3000 <= 300 + 4
    assert r["cpu_us_per_event"] > 0
