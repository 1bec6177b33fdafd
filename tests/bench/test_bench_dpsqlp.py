"""bench/bench_dpsqlp.py --broker: the worker as deployed (a child process on a real
broker, events sent by `python -m processor send`) publishes exactly what the stream's
stages publish in process from the same events, settings and key: every change release
(counter, tick, value) and every key's ledger entry, at its first release. A tiny
instance (10 keys, 500 ticks of 10 ms, a target loose enough that keys are admitted
within it: (300, 1e-2) per user, delta_sel 1e-2); the DP-SQLP parameters admit nothing
this early. Controls that the comparison must flag: the in-process run with one event
left out, and with another deployment's noise identity. Waits have deadlines; no
synchronising sleep."""

from __future__ import annotations

import sys
from pathlib import Path

from processor.stream.model.config import with_overrides
from processor.stream.model.families import key_counter

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_dpsqlp  # noqa: E402


def test_end_to_end_publishes_what_the_stages_publish_in_process(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    # The family starts `lead` seconds after the deployment is made; every event must
    # reach the timeline before its tick is sealed, else it is counted later (a run the
    # in-process stages do not replay: docs/time.md). That is a matter of the machine's
    # load, not a verdict: a run with late events is made again with a longer lead.
    for lead in (10.0, 30.0, 90.0):
        run = bench_dpsqlp.end_to_end(
            0, 10, 1.1, 1, 1, [250, 500], "simecc", "paper", kafka_bootstrap, tmp_path,
            tick_ms=10, lead_s=lead, heartbeat_ticks=25, partitions=4, eps_u=300.0,
            delta_u=1e-2, delta_sel=1e-2, timeout_s=120.0 + lead)
        if run.check["late_events"] == 0:
            break
    check = run.check
    assert (check["late_events"], check["dead_letters"]) == (0, 0), check
    assert check["events_on_timeline"] == sum(len(b) for b in run.batches)
    assert check["agree"] and check["horizon_figures_same"], check
    # Not vacuous: keys were admitted, announced and released within the run.
    assert check["keys_announced"] >= 5 and check["changes_compared"] >= 20, check
    half, full = run.rows
    assert half["keys_retained"] < full["keys_retained"] == check["keys_announced"]

    # Controls. One event of a released key left out: the in-process records differ.
    released = {c for c, *_ in run.releases if c.startswith("f[")}
    batches = [list(b) for b in run.batches]
    i = next(i for i, e in enumerate(batches[0])
             if key_counter("f", f"k{e.key}") in released)
    del batches[0][i]
    rels, ledger, dead = bench_dpsqlp.in_process(run.settings, run.key, batches, 1, 10)
    assert not bench_dpsqlp.compare(run.releases, run.ledger, run.dead_letters, rels,
                                    ledger, dead, run.last)["agree"]
    # Another deployment's noise identity (its app id): other noise, other records.
    other = with_overrides(run.settings, app_id=run.settings.app_id + "-other")
    rels, ledger, dead = bench_dpsqlp.in_process(other, run.key, run.batches, 1, 10)
    control = bench_dpsqlp.compare(run.releases, run.ledger, run.dead_letters, rels, ledger,
                                   dead, run.last)
    assert not control["agree"], control
    print(f"dpsqlp end to end: lead {lead:g} s, {check['changes_compared']} change "
          f"releases and {check['keys_announced']} keys announced, the same in process")
