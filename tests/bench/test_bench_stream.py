"""bench/bench_stream.py's throughput phase against a real broker: it runs end to end, and
it counts an event only once its counter's mechanism has stepped it.

The check that can fail is a bound, not a statistic (no false-alarm rate to state): in the
dense load each of the 200 counters holds 20 events and steps one per 100 ms tick, so the
last events are stepped at least 19 ticks after the first ones; no honest measurement of
4,000 events can end sooner than 1.9 s after they were produced, i.e. exceed
4,000 / 1.9 = 2,105 events/s. Control: the same stage ended by the operator's
`events_queued` (what the old bench effectively counted) must break that bound, so the
bound does reject a bench that counts queued events.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 4000
COUNTERS = 200
#: 4,000 events / (19 ticks x 100 ms), rounded up with some slack.
TICK_BOUND = 2200.0


def run_bench(bootstrap: str, out: Path, *extra: str) -> list[dict[str, Any]]:
    cmd = [sys.executable, str(ROOT / "bench" / "bench_stream.py"), "--phase", "throughput",
           "--quick", "--events", str(EVENTS), "--dense-counters", str(COUNTERS), "--loads",
           "dense", "--bootstrap", bootstrap, "--json", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res: list[dict[str, Any]] = orjson.loads(out.read_bytes())["throughput"]
    return res


@pytest.mark.kafka
def test_counts_stepped_events_and_the_control_breaks_the_tick_bound(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    honest = run_bench(kafka_bootstrap, tmp_path / "honest.json",
                       "--systems", "processor-ecc", "kafka-loop")
    by = {r["system"]: r for r in honest}
    proc, loop = by["processor-ecc"], by["kafka-loop"]
    assert proc["events"] == loop["events"] == EVENTS
    assert 0 < proc["rate"] <= TICK_BOUND, proc
    assert proc["cpu_ms_per_event"] > 0 and loop["cpu_ms_per_event"] > 0
    # The split by thread group is of the same window: within the clock ticks of
    # /proc (10 ms per thread), and threads that ended in the window are only in the total.
    threads = proc["extra"]["threads"]
    assert {"main", "other python"} <= set(threads), threads
    assert 0 < sum(threads.values()) <= proc["cpu_s"] + 0.01 * 40, (threads, proc["cpu_s"])
    # The physical limit is far above the tick capacity on any machine this runs on.
    assert loop["rate"] > TICK_BOUND, loop

    control = run_bench(kafka_bootstrap, tmp_path / "control.json",
                        "--systems", "processor-ecc",
                        "--processor-metric", "dpc_operator_events_queued_total")
    assert control[0]["rate"] > TICK_BOUND, control[0]


@pytest.mark.parametrize("extra", [["--phase", "scaleout"],
                                   ["--phase", "scaleout", "--cluster", "--bootstrap", "h:1"],
                                   ["--phase", "many", "--cluster"]])
def test_kill_broker_needs_its_own_cluster(extra: list[str]) -> None:
    """A broker kill only on the bench's own three-node cluster in phase scaleout:
    otherwise one `error:` line, exit 2, before any broker or worker starts."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_stream.py"),
                           "--kill-broker", *extra], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "starting" not in proc.stdout


def test_sets_rotate_the_worker_counts_so_each_runs_first_in_turn() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_stream import rotated

    assert [rotated([1, 3], k) for k in range(3)] == [[1, 3], [3, 1], [1, 3]]
    assert [rotated([1, 2, 3], k) for k in range(3)] == [[1, 2, 3], [2, 3, 1], [3, 1, 2]]


def test_a_join_is_placed_when_every_worker_or_every_partition_has_its_member() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from stream_steady import every_worker_placed

    assert every_worker_placed({"a": [0, 1], "b": [2, 3]}, 2, 4)
    assert not every_worker_placed({"a": [0, 1, 2, 3], "b": []}, 2, 4)
    assert not every_worker_placed({"a": [0, 1], "b": [2, 3]}, 3, 4)  # one not joined yet
    # Five workers, four partitions: one member holds none, and must be allowed to.
    five = {"a": [0], "b": [1], "c": [2], "d": [3], "e": []}
    assert every_worker_placed(five, 5, 4)
    assert not every_worker_placed({**five, "d": [], "c": [2, 3]}, 5, 4)
