"""Replay against a live run: late events, idle gaps and a crash, then `python -m processor
replay` reports "identical"; a tampered or forged published record is detected (controls).
Also, without a broker: the recomputation (BatchCommit over the timeline) and `compare`."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import orjson
import pytest

from processor.stream import kafka_io
from processor.stream.commit import BatchCommit, CollectingPublisher
from processor.stream.operator import Operator
from processor.stream.replay import compare, main_replay, recompute_timeline
from processor.stream.state import DictStore
from tests.stream.test_app_e2e import (
    Live,
    live_factory,  # noqa: F401  (the fixture, re-exported for this module)
    now_ms,
)


@pytest.mark.kafka
def test_replay_identical_after_live_run_then_detects_tampering(
        live_factory: Callable[..., Live],  # noqa: F811
        capsys: pytest.CaptureFixture[str]) -> None:
    """Live run: a burst, late events (their ticks already sealed), an idle gap, a SIGKILL
    and restart, a second burst; an idle counter throughout. Replay exits 0 ("identical").
    Controls: a published change record re-sent with its value altered makes replay exit 1
    naming that (counter, tick); a forged record for a tick never released does too."""
    tick = 100
    start = (now_ms() // tick) * tick - 30 * tick
    live = live_factory({"p": start, "q": start, "quiet": start}, name="replay",
                        mechanism="ecc", epsilon=500.0)
    live.worker.start()
    live.wait_releases(lambda rs: len(rs) > 0, timeout_s=90)
    now = now_ms()
    first = [orjson.dumps({"counter": "p", "ts": now + 500}) for _ in range(40)]
    first += [orjson.dumps({"counter": "q", "ts": start + 2 * tick}) for _ in range(10)]  # late
    live.produce(first)
    live.wait_releases(lambda rs: any(r["counter"] == "p" and r["kind"] == "change"
                                      for r in rs), timeout_s=60)
    live.worker.kill()
    live.worker.start()
    now2 = now_ms()
    # After an idle gap (p's queue has drained or not: either way it is in the log).
    second = [orjson.dumps({"counter": "q", "ts": now2 + 1000 + 50 * k, "value": 0.75})
              for k in range(30)]
    second += [orjson.dumps({"counter": "p", "ts": start + tick})]  # late again
    live.produce(second)
    end_tick = (now2 + 1000 + 60 * tick) // tick - start // tick + 1
    live.wait_releases(lambda rs: {r["counter"] for r in rs if r["tick"] >= end_tick}
                       == {"p", "q", "quiet"}, timeout_s=120)
    assert live.worker.stop() == 0, live.worker.log_tail()

    argv = ["--config", str(live.config)]
    capsys.readouterr()
    assert main_replay(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("identical"), out

    # Control 1: a published change record, re-sent with a different value.
    recs = [orjson.loads(r.value or b"")
            for r in kafka_io.iter_topic(live.conf, live.topics.counts)]
    victim = next(r for r in recs if r["kind"] == "change" and r["counter"] == "p")
    forged = dict(victim, value=victim["value"] + 1.0)
    kafka_io.produce_all(live.conf, live.topics.counts,
                         [(victim["counter"].encode(), orjson.dumps(forged))])
    assert main_replay(argv) == 1
    out = capsys.readouterr().out
    assert f"('p', {victim['tick']}, 'change')" in out, out

    # Control 2 (on a fresh comparison target): a record for a tick that was never released
    # is reported too; it sorts before the altered one only if its tick is smaller, so just
    # check the count of differences grows.
    extra = dict(victim, tick=victim["tick"] + 100_000)
    kafka_io.produce_all(live.conf, live.topics.counts,
                         [(victim["counter"].encode(), orjson.dumps(extra))])
    assert main_replay(argv) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT (2 differences" in out, out


def test_recompute_splits_at_the_settled_offsets_and_compare_finds_differences() -> None:
    """recompute_timeline equals one BatchCommit pass over each partition; releases of
    records at or past the settled offset are reported apart; compare accepts identical
    re-sends and missing unsettled records, and names a changed value."""
    from tests.stream.test_operator import KEY, TICK, StepFactory, random_timeline, settings
    from tests.stream.test_operator import to_records as records_of

    rng = random.Random(8)
    s = settings({"a": 100 * TICK, "b": 100 * TICK}, heartbeat_ticks=3)
    records = records_of(random_timeline(rng, ["a", "b"], 100, 30, 0.5), 3)
    timeline = {0: [kafka_io.KafkaRecord("tl", 0, off, None, r, (), 0)
                    for off, r in enumerate(records)]}
    pub = CollectingPublisher()
    bc = BatchCommit(Operator(s, KEY, factory=StepFactory(2, 3)), DictStore(), pub)
    for off, r in enumerate(records):
        asyncio.run(bc.commit(0, [(off, r)]))
    mark = len(records) // 2
    got = recompute_timeline(s, KEY, timeline, {0: mark},
                             operator=Operator(s, KEY, factory=StepFactory(2, 3)))
    assert got.settled + got.unsettled == pub.releases and got.records == len(records)
    assert got.settled and got.unsettled
    mine = [r.to_json() for r in got.settled]
    later = [r.to_json() for r in got.unsettled]
    assert compare(mine, mine + mine[:3], later) == (0, None)
    assert compare(mine, mine + later[:2], later) == (0, None)
    changed = orjson.loads(mine[0])
    changed["value"] += 1.0
    n, first = compare(mine, [orjson.dumps(changed), *mine[1:]], later)
    assert n == 1 and first is not None and "value" in first
    assert compare(mine, mine[1:], later)[0] == 1  # a settled release never published
