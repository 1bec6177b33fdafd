"""Replay forks its recomputation jobs only where a fork cannot deadlock: never next to a
live librdkafka client, whose native threads Python's thread count does not see (a fork
there hung a child forever on a lock one of them held). Checked in a fresh interpreter:
the pytest process itself runs other threads."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import gc
from processor.stream.kafka import kafka_io
from processor.stream.replay import single_threaded
print(single_threaded())
p = kafka_io.make_producer({"bootstrap.servers": "127.0.0.1:9", "log_level": "0"})
print(single_threaded())
del p
gc.collect()
print(single_threaded())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_no_fork_next_to_a_live_kafka_client() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    # fresh: safe; a live producer (control: its threads are seen): not; destroyed: safe
    assert out == ["True", "False", "True"]
