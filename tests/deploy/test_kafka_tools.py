"""Kafka's command-line tools after setup: `deploy/kafka-tool.sh` runs
kafka-topics, kafka-configs and kafka-consumer-groups from the fetched jars against a real
broker. Without the jars (setup not run) the test skips, and fails in CI. Control: an
unknown tool name is refused with exit 2 and the list of tools."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import in_ci

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "deploy" / "kafka-tool.sh"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(TOOL), *args], text=True, capture_output=True,
                          timeout=120, check=False)


def test_unknown_tool_is_refused() -> None:
    done = run("kafka-nope")
    assert done.returncode == 2 and "kafka-configs" in done.stderr


def test_topics_configs_and_groups_against_the_broker(kafka_bootstrap: str) -> None:
    tools = list((ROOT / "deploy" / ".cache" / "kafka-tools").glob("kafka-tools-*.jar"))
    if not tools or shutil.which("java") is None:
        reason = "kafka-tools jar or java missing (bash deploy/setup.sh fetches the jar)"
        if in_ci():
            pytest.fail(reason)
        pytest.skip(reason)
    topic = f"tools-{uuid.uuid4().hex[:10]}"
    done = run("kafka-topics", "--bootstrap-server", kafka_bootstrap, "--create", "--topic",
               topic, "--partitions", "2", "--replication-factor", "1")
    assert done.returncode == 0, done.stderr
    done = run("kafka-configs", "--bootstrap-server", kafka_bootstrap, "--alter",
               "--entity-type", "topics", "--entity-name", topic,
               "--add-config", "retention.ms=-1")
    assert done.returncode == 0, done.stderr
    done = run("kafka-configs", "--bootstrap-server", kafka_bootstrap, "--describe",
               "--entity-type", "topics", "--entity-name", topic)
    assert done.returncode == 0 and "retention.ms=-1" in done.stdout, done.stdout + done.stderr
    done = run("kafka-topics", "--bootstrap-server", kafka_bootstrap, "--describe",
               "--topic", topic)
    assert done.returncode == 0 and "PartitionCount: 2" in done.stdout, done.stdout
    done = run("kafka-consumer-groups", "--bootstrap-server", kafka_bootstrap, "--list")
    assert done.returncode == 0, done.stderr
    run("kafka-topics", "--bootstrap-server", kafka_bootstrap, "--delete", "--topic", topic)
