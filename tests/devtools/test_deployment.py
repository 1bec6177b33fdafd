"""The isolated-deployment helper and the one key writer (processor.devtools.deployment,
processor.keyfile.write_key).

Without a broker: config files read back as the settings they were rendered from, key files
are mode 0600 however they are written (fresh, over a world-readable file, by `keygen
--force`), two deployments share no name, a worker's environment carries no settings
override, and close() removes what the helper made. With a broker (marked ``kafka``): the
five topics exist with the configured partition count.
"""

from __future__ import annotations

import stat
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from processor.commands.main import main
from processor.core.rng import NoiseKey
from processor.devtools.deployment import (
    Deployment,
    isolated_deployment,
    render_toml,
    worker_env,
    write_config,
)
from processor.keyfile import read_key, write_key
from processor.stream.kafka import kafka_io
from processor.stream.model.config import (
    SETTINGS_ENV_VARS,
    ConfigError,
    SecuritySettings,
    Settings,
    TopicSettings,
    load_settings,
    with_overrides,
)

SECRET = bytes(range(32))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def no_broker(tmp_path: Path, **kw: Any) -> Deployment:
    """A deployment that needs no broker (no topics are created)."""
    return isolated_deployment("127.0.0.1:1", {"a": 0, "b": 1000}, parent=tmp_path,
                               create_topics=False, **kw)


# ----------------------------------------------------------------------------- key writer


def test_key_file_is_0600_and_reads_back(tmp_path: Path) -> None:
    path = write_key(tmp_path / "k", SECRET)
    assert mode(path) == 0o600
    assert read_key(path).fingerprint() == NoiseKey(SECRET).fingerprint()
    fresh = write_key(tmp_path / "k2")
    assert mode(fresh) == 0o600
    assert read_key(fresh).fingerprint() != NoiseKey(SECRET).fingerprint()


def test_overwriting_a_readable_file_leaves_a_0600_key(tmp_path: Path) -> None:
    """An existing 0644 file is replaced by a 0600 one (truncating in place would keep 0644)."""
    path = tmp_path / "k"
    path.write_text("old\n")
    path.chmod(0o644)
    write_key(path, SECRET)
    assert mode(path) == 0o600
    assert read_key(path).fingerprint() == NoiseKey(SECRET).fingerprint()
    assert [p.name for p in tmp_path.iterdir()] == ["k"]  # no temporary file left


def test_no_overwrite_leaves_the_existing_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "k"
    path.write_text("old\n")
    with pytest.raises(FileExistsError):
        write_key(path, SECRET, overwrite=False)
    assert path.read_text() == "old\n"


def test_keygen_force_rewrites_a_readable_file_as_0600(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "key"
    path.write_text("0" * 64 + "\n")
    path.chmod(0o644)
    assert main(["keygen", str(path)]) == 2  # never overwrites by accident
    assert mode(path) == 0o644 and path.read_text() == "0" * 64 + "\n"
    assert main(["keygen", "--force", str(path)]) == 0
    assert mode(path) == 0o600
    assert path.read_text() != "0" * 64 + "\n"
    read_key(path)  # a valid key
    out = capsys.readouterr()
    assert path.read_text().strip() not in out.out + out.err  # the key is never printed


# ----------------------------------------------------------------------------- config files


def test_rendered_config_reads_back_as_the_same_settings(tmp_path: Path) -> None:
    s = with_overrides(
        Settings(), app_id="x", bootstrap_servers="h1:9092,h2:9092", partitions=3, tick_ms=250,
        epsilon=0.25, delta=1e-9, beta=0.01, heartbeat_spread=False, allow_undeclared=True,
        mechanism="simecc", noise_key_file="/run/k", state_dir="/tmp/s",
        security=SecuritySettings(security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                                  sasl_username="u", sasl_password='p"w\\d'),
        topics=TopicSettings(input="i", timeline="t", counts="c", ledger="l", deadletter="d"),
        counters={"plain": 0, "ünï_cødé": 500, "a.b:c/d@e+f-g": 750})
    path = write_config(s, tmp_path / "c.toml")
    assert mode(path) == 0o600  # it may hold a SASL password
    back = load_settings(str(path), env={})
    assert back == s
    assert back.security.sasl_password == s.security.sasl_password  # not in __eq__'s repr
    assert render_toml(back) == render_toml(s)


# ----------------------------------------------------------------------------- deployments


def test_worker_environment_has_no_settings_overrides() -> None:
    env = {"PATH": "/bin", "DPC_EPSILON": "9", "DPC_TOPIC_INPUT": "x", "DPC_COUNTERS": "a=0",
           "KAFKA_BOOTSTRAP_SERVERS": "elsewhere:9092", "DPC_SASL_PASSWORD": "pw",
           "DPC_TEST_CRASH_AT": "after_acks:1"}
    assert worker_env(env) == {"PATH": "/bin", "DPC_TEST_CRASH_AT": "after_acks:1"}
    # Every setting has its override variable in the set (so none can leak through);
    # open families are read from the file only (no variable to leak).
    names = {f"DPC_{f.name.upper()}" for f in fields(Settings)
             if f.name not in ("security", "topics", "families")}
    names |= {f"DPC_{f.name.upper()}" for f in fields(SecuritySettings)}
    names |= {f"DPC_TOPIC_{f.name.upper()}" for f in fields(TopicSettings)}
    assert names <= SETTINGS_ENV_VARS
    for var in SETTINGS_ENV_VARS - {"DPC_COUNTERS", "KAFKA_BOOTSTRAP_SERVERS"}:
        # ... and each one really is read: a nonsense value changes or breaks the settings.
        try:
            changed = load_settings(None, env={"DPC_COUNTERS": "a=0", var: "bad value!"})
        except ConfigError:
            continue
        assert changed != load_settings(None, env={"DPC_COUNTERS": "a=0"}), var


def test_deployments_share_no_name_and_write_private_files(tmp_path: Path) -> None:
    one, two = no_broker(tmp_path, secret=SECRET, epsilon=2.0), no_broker(tmp_path)
    s1, s2 = one.settings, two.settings
    assert s1.app_id != s2.app_id and one.directory != two.directory
    names1 = {getattr(s1.topics, f.name) for f in fields(TopicSettings)}
    names2 = {getattr(s2.topics, f.name) for f in fields(TopicSettings)}
    assert len(names1) == 5 and not names1 & names2
    assert s1.state_dir != s2.state_dir and s1.noise_key_file != s2.noise_key_file
    assert s1.epsilon == 2.0 and dict(s1.counters) == {"a": 0, "b": 1000}
    assert load_settings(str(one.config), env={}) == s1
    assert s1.noise_key_file is not None and mode(Path(s1.noise_key_file)) == 0o600
    assert one.key.fingerprint() == NoiseKey(SECRET).fingerprint()
    assert two.key.fingerprint() != one.key.fingerprint()  # a fresh random key by default
    assert one.conf == kafka_io.base_config(s1)
    assert not one.worker.alive() and one.worker.proc is None  # created, not started
    assert one.worker.config_path == str(one.config)


def test_added_worker_has_its_own_state_config_and_log(tmp_path: Path) -> None:
    dep = no_broker(tmp_path)
    other = dep.add_worker("b")
    assert dep.workers == [dep.worker, other]
    s = load_settings(other.config_path, env={})
    assert s.state_dir != dep.settings.state_dir
    assert s == with_overrides(dep.settings, state_dir=s.state_dir)  # same app otherwise
    assert other.log_path != dep.worker.log_path


def test_close_removes_an_owned_directory_and_keeps_a_callers(tmp_path: Path) -> None:
    with isolated_deployment("127.0.0.1:1", {"a": 0}, create_topics=False) as owned:
        assert owned.directory.is_dir() and owned.owns_directory
    assert not owned.directory.exists()
    with no_broker(tmp_path) as kept:
        pass
    assert kept.directory.is_dir() and kept.directory.parent == tmp_path  # the test's to read


def test_failed_build_leaves_no_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        no_broker(tmp_path, epsilon=-1.0)
    assert list(tmp_path.iterdir()) == []


def test_topics_exist_with_the_configured_partitions(
        deployment_factory: Callable[..., Deployment]) -> None:
    """Marked ``kafka`` through the fixture (it needs the session broker)."""
    dep = deployment_factory({"a": 0}, name="dep-test", partitions=3)
    for f in fields(TopicSettings):
        topic = getattr(dep.topics, f.name)
        assert kafka_io.partition_count(dep.conf, topic) == 3, topic
