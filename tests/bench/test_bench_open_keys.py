"""bench/bench_stream.py's open-keys phase (bench/stream_open_keys.py): its truth, and a
tiny instance against a real broker.

The pure checks are exact: `stepped_by` on hand-made queues, and the error of a release
equal to the truth is 0 while a release one event off is 1.

On a broker (marker `kafka`): one worker, ticks of 50 ms, 50 events/s for 40 s, a head of
3 keys, epsilon 300 (an ECC key is admitted once about 120 to 160 of its events were
stepped, whatever the epsilon above 300: Part's first block; the head keys get about 14,
6.5 and 4.2 events a second, about 600, 280 and 180 in the run). What can fail, each a
bound rather than a statistic (no false-alarm rate to state):
- every key sent is in the worker's state and nothing else is (keys stored = keys sent),
  and every key admitted is a head key (a new key has one event);
- after the load the worker stepped exactly the events sent (its queues drained: a key
  passes 20 events a second, its heaviest gets 14);
- at least 2 keys are admitted, and their mean relative error against the stepped truth
  is below 0.35 (at epsilon 300 the noise is a fraction of an event; what is left is
  ECC's release delay, up to a block of Part),
  while the same releases against a control truth, each key's truth taken from another
  head key of the opposite rank by count (a truth computed for the wrong keys), err by
  more than 0.6 (0.83 with the two heaviest keys' counts, more with three): the figure
  does reject a truth that is not the key's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "bench")]

from stream_open_keys import (  # noqa: E402
    KeyFigure,
    error_summary,
    key_errors,
    report_open_ratio_range,
    stepped_by,
)


def test_stepped_by_passes_one_event_per_tick() -> None:
    assert stepped_by([], 10) == 0
    assert stepped_by([5], 4) == 0
    assert stepped_by([5], 5) == 1
    # three at tick 5 step at 5, 6, 7; one at 6 waits behind them to 8; one at 20 at 20
    ticks = [5, 5, 5, 6, 20]
    assert [stepped_by(ticks, t) for t in (5, 6, 7, 8, 19, 20)] == [1, 2, 3, 4, 4, 5]
    # a gap empties the queue: no step is carried over
    assert [stepped_by([1, 10, 10], t) for t in (1, 9, 10, 11)] == [1, 1, 2, 3]


def test_ratio_range_pairs_each_set_with_its_own_one_worker_run() -> None:
    # a drift between sets must not mix: set 1 is 1.2x, set 2 is 1.4x; pooling the sets'
    # runs (or pairing set 2's three workers with set 1's one) would say 1.0 or 1.68
    sets = [{1: {"cpu_per_stepped": 0.20}, 3: {"cpu_per_stepped": 0.24}},
            {3: {"cpu_per_stepped": 0.336}, 1: {"cpu_per_stepped": 0.24}}]
    (line,) = report_open_ratio_range(sets)
    assert "3 workers / 1 worker over 2 sets" in line
    assert "1.20-1.40 (1.20, 1.40;" in line


def test_errors_take_each_keys_last_release_against_its_truth() -> None:
    truth = {"f[a]": [1, 1, 1], "f[b]": [2]}
    rels = [{"counter": "f[a]", "tick_start_ms": 2000, "value": 2.0},
            {"counter": "f[a]", "tick_start_ms": 3000, "value": 3.0},
            {"counter": "f[b]", "tick_start_ms": 2000, "value": 2.0},
            {"counter": "clock", "tick_start_ms": 3000, "value": 9.0}]
    errs = key_errors(rels, truth, 1000)
    assert errs == [KeyFigure("f[a]", 3, 3.0, 3, 3), KeyFigure("f[b]", 2, 2.0, 1, 1)]
    assert error_summary(errs, "stepped") == {"mean": 0.5, "max": 1.0, "l2": 1.0,
                                              "mean_rel": 0.5}
    assert error_summary([], "sent") == {}


def run_phase(bootstrap: str, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, str(ROOT / "bench" / "bench_stream.py"), "--phase", "open-keys",
           "--rate", "50", "--seconds", "40", "--workers", "1", "--head-keys", "3",
           "--tick-ms", "50",
           "--epsilon", "300", "--no-restore", "--bootstrap", bootstrap, "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res: dict[str, Any] = orjson.loads(out.read_bytes())["open_keys"]["1"]
    return res


@pytest.mark.kafka
def test_tiny_open_key_run_against_its_truth_and_a_wrong_truth(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    r = run_phase(kafka_bootstrap, tmp_path / "open.json")
    assert r["keys_stored"] == r["keys_sent"] > 800, r
    assert r["head_keys_sent"] == 3
    assert r["caught_up"]
    assert r["stepped_total"] == r["events"], (r["stepped_total"], r["events"])
    assert r["keys_admitted"] >= 2 and not r["admitted_not_head"], r["keys_admitted"]
    errs = [KeyFigure(*e) for e in r["errors"]]
    assert error_summary(errs, "stepped")["mean_rel"] < 0.35, r["error_stepped"]
    # Control: the truths of the wrong keys: ranked by their count, the heaviest key gets
    # the lightest one's truth, the second the second lightest's, and so on.
    ranked = sorted(errs, key=lambda e: e.stepped)
    wrong = [KeyFigure(e.counter, e.tick, e.value, 0, w.stepped)
             for e, w in zip(ranked, reversed(ranked), strict=True)]
    assert error_summary(wrong, "stepped")["mean_rel"] > 0.6, wrong
