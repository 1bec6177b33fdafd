"""The network-partition phase run small (processor/devtools/campaign.py
`partition_phase`, processor/devtools/proxy.py) and its checkers.

- `check_published` compares every published release with a recomputation from the
  timeline: a value short of or ahead of it, a key it does not recompute, a due key not
  published, and a (counter, tick) published with two values are each flagged;
- `check_changelog` flags a state value whose timeline offset (`value_offset`) is below
  one written before it for the same key.

Every check is exact: a correct system has none of these (false-alarm rate 0). Controls:
synthetic streams with one wrong value of each kind; on a real deployment, a forged
release (value off by one, up and down) published next to the worker's and a stale
partition value re-appended to the changelog must be flagged, while the untouched topics
pass. The partition run itself (one blackhole of worker A past the 10 s session timeout)
passes because the state layer keeps values monotone (docs/state.md).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from processor.devtools.campaign import (
    CAMPAIGN_SETTINGS,
    KillDriver,
    campaign_counters,
    changelog_went_back,
    check_changelog,
    check_published,
    compare_published,
    partition_phase,
    value_offset,
)
from processor.devtools.deployment import Deployment
from processor.devtools.proxy import ProxiedKafka
from processor.stream.kafka import kafka_io
from processor.stream.model.records import Release
from processor.stream.model.state import PartitionState
from tests.stream.test_app_e2e import TEST_SECRET


def _release(counter: str, tick: int, value: float, kind: str = "change") -> Release:
    return Release(counter, tick, tick * 200, 200, value, kind,  # type: ignore[arg-type]
                   "simecc", 500.0, 0.0, 1.0, 0.05, "fp")


def _published(*rs: Release) -> list[dict[str, object]]:
    return [orjson.loads(r.to_json()) for r in rs]


def test_compare_published_flags_each_kind_of_violation() -> None:
    """A published prefix equal to the recomputation passes; each planted wrong value is
    flagged as what it is."""
    mine = [_release("a", t, float(t)) for t in range(1, 6)] + [_release("b", 1, 3.0)]
    due = [("a", t, "change") for t in range(1, 4)]
    good = compare_published(mine, due, _published(*mine[:4]))
    assert good.ok and good.compared == 4 and good.violations == 0, good.as_dict()
    # A prefix of a counter's releases (through tick 3, its due ones) is no violation.
    assert compare_published(mine, due, _published(*mine[:3])).ok

    short = compare_published(mine, due, _published(*mine[:3], _release("a", 4, 3.5)))
    assert (short.short, short.ahead, short.conflicting_ticks) == (1, 0, 0)
    ahead = compare_published(mine, due, _published(*mine[:4], _release("a", 4, 4.5)))
    assert (ahead.short, ahead.ahead, ahead.conflicting_ticks) == (0, 1, 1)
    assert ahead.max_abs_error == 0.5 and ahead.counters_affected == 1
    other_kind = compare_published(mine, due, _published(*mine[:3],
                                                         _release("a", 4, 4.0, "heartbeat")))
    assert other_kind.unexpected == 1
    missing = compare_published(mine, due, _published(*mine[:2]))
    assert missing.missing == 1  # tick 3 is due (committed) and absent
    gap = compare_published(mine, due, _published(*mine[:3], mine[4]))
    assert gap.missing == 1  # tick 4 absent although tick 5 of the counter is published


def _cl(partition: int, offset: int, key: bytes, value: bytes | None) -> kafka_io.KafkaRecord:
    return kafka_io.KafkaRecord("cl", partition, offset, key, value, (), 0)


def _pvalue(marker_offset: int) -> bytes:
    ps = PartitionState()
    ps.marker_offset = ps.applied = marker_offset
    ps.key_id = "k"
    return ps.to_bytes()


def test_changelog_checker_flags_a_value_that_goes_back() -> None:
    """Offsets that only grow pass (tombstones and legacy values carry none); a partition
    value with an older offset written after a newer one, and left last (what compaction
    keeps), is flagged; written over again by a newer one, it is a stale write only."""
    ok = [_cl(0, 0, b"p/0", _pvalue(3)), _cl(0, 1, b"u/0/5", b"DPU\x01[]"),
          _cl(0, 2, b"p/0", _pvalue(3)), _cl(0, 3, b"p/0", _pvalue(9)),
          _cl(1, 0, b"p/1", _pvalue(1)), _cl(0, 4, b"u/0/5", None)]
    rep = changelog_went_back(ok)
    assert rep.ok and rep.decoded == 4 and rep.keys == 3, rep.as_dict()
    back = changelog_went_back([*ok, _cl(0, 5, b"p/0", _pvalue(4))])
    assert (back.went_back, back.keys_went_back, back.stale_writes) == (1, 1, 1), \
        back.as_dict()
    over = changelog_went_back([*ok, _cl(0, 5, b"p/0", _pvalue(4)), _cl(0, 6, b"p/0",
                                                                        _pvalue(9))])
    assert over.ok and over.stale_writes == 1, over.as_dict()
    assert "p/0: timeline offset 9 at changelog 0:3, then 4 at 0:5" in back.examples[0]
    assert value_offset(b"c/x", b"garbage") is None
    assert value_offset(b"p/0", _pvalue(7)) == 7


def test_checkers_catch_a_forged_release_and_a_stale_state_value(
        deployment_factory: Callable[..., Deployment]) -> None:
    """One worker, no fault: the published stream equals the recomputation and the
    changelog never goes back. Controls on the same topics: a release published again
    with its value one higher and another one lower (a (counter, tick) with two values),
    and the first partition value re-appended to the changelog, are each flagged."""
    dep = deployment_factory(campaign_counters(6, int(time.time() * 1000)), name="pchk",
                             secret=TEST_SECRET, **{**CAMPAIGN_SETTINGS, "partitions": 2})
    driver = KillDriver(dep, random.Random(14), bad_share=0.0)
    dep.worker.start()
    driver.feed(200)
    dep.wait_releases(lambda rs: len(rs) >= 20, timeout_s=90)
    driver.feed(100)
    assert driver.drain_and_stop([dep.worker], timeout_s=120), driver.counts
    clean = check_published(dep)
    assert clean.ok and clean.compared >= 20, clean.as_dict()
    log = check_changelog(dep)
    assert log.ok and log.decoded > 0, log.as_dict()

    first, second = dep.releases()[:2]
    forged = [(None, orjson.dumps({**first, "value": first["value"] + 1.0})),
              (None, orjson.dumps({**second, "value": second["value"] - 1.0}))]
    kafka_io.produce_all(dep.conf, dep.topics.counts, forged)
    caught = check_published(dep)
    assert (caught.ahead, caught.short, caught.conflicting_ticks) == (1, 1, 2), \
        caught.as_dict()

    from processor.stream.kafka.topics import changelog_topic

    topic = changelog_topic(dep.settings)
    records = [r for r in kafka_io.iter_topic(dep.conf, topic, timeout_s=60)
               if r.key is not None and r.key.startswith(b"p/")]
    stale = min(records, key=lambda r: value_offset(r.key or b"", r.value) or 0)
    assert max(value_offset(r.key or b"", r.value) or 0 for r in records
               if r.key == stale.key) > (value_offset(stale.key or b"", stale.value) or 0)
    assert stale.value is not None  # a state value, not a tombstone (those carry no offset)
    kafka_io.produce_all(dep.conf, topic, [(stale.key, stale.value)])
    assert check_changelog(dep).went_back >= 1


@pytest.fixture
def proxied_kafka(local_kafka_available: None) -> Iterator[ProxiedKafka]:
    kafka = ProxiedKafka(1, start_timeout=180.0)
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


def test_a_worker_blackholed_past_the_session_timeout_publishes_nothing_wrong(
        proxied_kafka: ProxiedKafka, tmp_path: Path) -> None:
    """Two workers of one deployment (4 timeline partitions, 400 counters, 100 events/s),
    worker A through the proxy; A blackholed for 13-15 s (past the 10 s session timeout,
    so its partitions move to B), healed, then drain and clean stop. Every checker must
    find nothing: no lost or twice-counted event, no published value short of or ahead of
    the recomputation, no (counter, tick) with two values, no changelog value going back,
    and `python -m processor replay` identical."""
    out = partition_phase(proxied_kafka, tmp_path, random.Random(14),
                          plan=["blackhole_long"], counters=400, rate=200.0, settle_s=15.0,
                          durations={"blackhole_long": (16.0, 18.0)})
    print("partition run:", out)
    assert out["driver"]["faults_blackhole_long"] == 1
    assert out["proxy"]["accepted"] > 0  # A's connections really went through the proxy
    assert out["caught_up"], out["driver"]
    assert out["published"]["violations"] == 0, out["published"]
    assert out["published"]["conflicting_ticks"] == 0, out["published"]
    assert out["changelog"]["went_back"] == 0, out["changelog"]
    assert out["replay_cli"]["exit"] == 0, out["replay_cli"]
    assert out["ok"], out
