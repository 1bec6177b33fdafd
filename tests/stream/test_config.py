"""Configuration: TOML file + DPC_* environment overrides, typed errors naming the field,
secrets absent from repr, the privacy fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest

from processor.core.bounded import check_eps_delta
from processor.core.errors import InvalidParameterError
from processor.stream.model.config import (
    ConfigError,
    Settings,
    load_settings,
    validate_settings,
    with_overrides,
)

EXAMPLE = Path(__file__).parents[2] / "deploy" / "config.example.toml"

BASE = """
app_id = "demo"
bootstrap_servers = "broker-a:9092"
tick_ms = 500
epsilon = 0.5
[topics]
input = "events"
[counters]
a = 0
b = "2026-01-01T00:00:00Z"
"""


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return str(p)


def test_example_config_loads_and_documents_every_field() -> None:
    s = load_settings(str(EXAMPLE), env={})
    assert s.counters["signups"] == 1_767_225_600_000
    text = EXAMPLE.read_text()
    # The example's choices for a new deployment, each beside the built-in default it
    # departs from (which stays: a deployment that left the field out keeps it).
    base = Settings()
    for field, chosen in (("mechanism", "simecc"), ("calibration", "tight"),
                          ("tick_ms", 100)):
        assert getattr(s, field) == chosen and getattr(base, field) != chosen
        block = text.split(f"\n{field} =")[0].rsplit("\n\n", 1)[-1].rsplit("=", 1)[-1]
        default = getattr(base, field)
        assert f"Built-in default: {default if isinstance(default, int) else repr(default)}" \
            in block.replace("\n# ", " ").replace('"', "'"), field
    names = {f for f in Settings.__dataclass_fields__ if f not in ("security", "topics")}
    names |= set(s.security.__dataclass_fields__) | set(s.topics.__dataclass_fields__)
    missing = {n for n in names if f"{n} =" not in text and f"[{n}]" not in text}
    assert missing == set()


def test_file_then_env_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    s = load_settings(path, env={})
    assert (s.app_id, s.bootstrap_servers, s.tick_ms, s.epsilon) == (
        "demo", "broker-a:9092", 500, 0.5)
    assert s.topics.input == "events" and s.topics.timeline == "dpc-timeline"
    assert dict(s.counters) == {"a": 0, "b": 1_767_225_600_000}
    env = {"DPC_EPSILON": "2.5", "DPC_TICK_MS": "250", "DPC_TOPIC_INPUT": "ev2",
           "KAFKA_BOOTSTRAP_SERVERS": "k:1", "DPC_ALLOW_UNDECLARED": "true",
           "DPC_SECURITY_PROTOCOL": "SASL_SSL", "DPC_SASL_MECHANISM": "PLAIN",
           "DPC_SASL_USERNAME": "u", "DPC_SASL_PASSWORD": "hunter2-secret",
           "DPC_NOISE_KEY_FILE": "/run/secrets/key", "DPC_COUNTERS": "x=1000, y=0"}
    s = load_settings(path, env=env)
    assert (s.epsilon, s.tick_ms, s.topics.input, s.bootstrap_servers) == (2.5, 250, "ev2",
                                                                          "k:1")
    assert s.allow_undeclared and s.noise_key_file == "/run/secrets/key"
    assert dict(s.counters) == {"x": 1000, "y": 0}
    assert s.security.sasl_password == "hunter2-secret"
    s = load_settings(path, env={"DPC_CHECKPOINT_MS": "4000", "DPC_CHECKPOINT_RECORDS": "50"})
    assert (s.checkpoint_ms, s.checkpoint_records) == (4000, 50)
    s = load_settings(write(tmp_path, "checkpoint_ms = 2500\n" + BASE), env={})
    assert (s.checkpoint_ms, s.checkpoint_records) == (2500, Settings().checkpoint_records)
    with pytest.raises(ConfigError, match="checkpoint_records"):
        with_overrides(s, checkpoint_records=0)
    # DPC_BOOTSTRAP_SERVERS wins over the legacy KAFKA_BOOTSTRAP_SERVERS.
    s = load_settings(path, env={"KAFKA_BOOTSTRAP_SERVERS": "k:1", "DPC_BOOTSTRAP_SERVERS": "d:2"})
    assert s.bootstrap_servers == "d:2"


def test_checkpoint_interval_is_set_or_derived() -> None:
    """checkpoint_ms wins when set; 0 (the default) derives twice lateness + tick, within
    0.5 s and 10 s."""
    s = with_overrides(Settings(), counters={"a": 0})
    assert s.checkpoint_ms == 0 and s.checkpoint_interval_ms() == 2 * (2000 + 1000)
    assert with_overrides(s, checkpoint_ms=700).checkpoint_interval_ms() == 700
    assert with_overrides(s, tick_ms=100, lateness_ms=100).checkpoint_interval_ms() == 500
    assert with_overrides(s, lateness_ms=60_000).checkpoint_interval_ms() == 10_000
    with pytest.raises(ConfigError, match="checkpoint_ms"):
        with_overrides(s, checkpoint_ms=-1)


def test_secrets_absent_from_repr(tmp_path: Path) -> None:
    env = {"DPC_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "DPC_SASL_MECHANISM": "SCRAM-SHA-256",
           "DPC_SASL_USERNAME": "svc", "DPC_SASL_PASSWORD": "p4ssw0rd-XYZ"}
    s = load_settings(write(tmp_path, BASE), env=env)
    for text in (repr(s), str(s), repr(s.security), str(s.security)):
        assert "p4ssw0rd-XYZ" not in text
    assert "svc" in repr(s.security)  # the username is not secret


@pytest.mark.parametrize("text,env,field", [
    (BASE, {"DPC_EPSILON": "0"}, "epsilon"),
    (BASE, {"DPC_EPSILON": "nan"}, "epsilon"),
    (BASE, {"DPC_EPSILON": "lots"}, "epsilon"),
    (BASE, {"DPC_DELTA": "1"}, "delta"),
    (BASE, {"DPC_BETA": "0"}, "beta"),
    (BASE, {"DPC_TICK_MS": "0"}, "tick_ms"),
    (BASE, {"DPC_TICK_MS": "1.5"}, "tick_ms"),
    (BASE, {"DPC_PARTITIONS": "0"}, "partitions"),
    (BASE, {"DPC_LATENESS_MS": "-1"}, "lateness_ms"),
    (BASE, {"DPC_HEARTBEAT_TICKS": "0"}, "heartbeat_ticks"),
    (BASE, {"DPC_CHECKPOINT_MS": "-1"}, "checkpoint_ms"),
    (BASE, {"DPC_CHECKPOINT_MS": "2.5"}, "checkpoint_ms"),
    (BASE, {"DPC_CHECKPOINT_RECORDS": "0"}, "checkpoint_records"),
    (BASE, {"DPC_MECHANISM": "gaussiancc"}, "mechanism"),
    (BASE, {"DPC_ALLOW_UNDECLARED": "maybe"}, "allow_undeclared"),
    (BASE, {"DPC_SECURITY_PROTOCOL": "TLS"}, "security.security_protocol"),
    (BASE, {"DPC_SECURITY_PROTOCOL": "SASL_SSL"}, "security.sasl_mechanism"),
    (BASE, {"DPC_SECURITY_PROTOCOL": "SASL_SSL", "DPC_SASL_MECHANISM": "PLAIN",
            "DPC_SASL_USERNAME": "u"}, "security.sasl_password"),
    (BASE, {"DPC_SSL_CERTFILE": "c.pem"}, "security.ssl_keyfile"),
    (BASE, {"DPC_TOPIC_INPUT": "bad topic!"}, "topics.input"),
    (BASE, {"DPC_TOPIC_LEDGER": "dpc-private-counts"}, "topics"),
    (BASE, {"DPC_COUNTERS": "a=1"}, "counters.a"),  # not a multiple of tick_ms
    (BASE, {"DPC_COUNTERS": "a"}, "counters"),
    (BASE, {"DPC_COUNTERS": "a=2026-01-01T00:00:00"}, "counters.a"),  # no zone
    (BASE, {"DPC_COUNTERS": ""}, "counters"),  # none declared
    ("epsilonn = 1\n" + BASE, {}, "epsilonn"),
    ("[topics]\ninputt = 'x'\n[counters]\na = 0\n", {}, "topics.inputt"),
    ("[security]\npassword = 'x'\n[counters]\na = 0\n", {}, "security.password"),
    ("topics = 3\n", {}, "topics"),
    ("epsilon = \n", {}, "config"),
    ("app_id = ''\n[counters]\na = 0\n", {}, "app_id"),
])
def test_typed_errors_name_the_field(tmp_path: Path, text: str, env: dict[str, str],
                                     field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), env=env)
    assert info.value.field == field
    assert str(info.value).startswith(field + ":")
    assert isinstance(info.value, ValueError)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(str(tmp_path / "nope.toml"), env={})
    assert info.value.field == "config"


def test_fingerprint_covers_privacy_settings_only(tmp_path: Path) -> None:
    """Changing eps, delta, mechanism, tick, a start or the counter set changes it;
    brokers, topics, credentials, heartbeat and beta do not."""
    s = load_settings(write(tmp_path, BASE), env={})
    fp = s.fingerprint()
    assert len(fp) == 64 and fp == load_settings(write(tmp_path, BASE), env={}).fingerprint()
    for change in ({"epsilon": 0.6}, {"delta": 1e-7}, {"mechanism": "simecc"},
                   {"tick_ms": 250}, {"counters": {"a": 0}},
                   {"counters": {"a": 500, "b": 1_767_225_600_000}},
                   {"allow_undeclared": True}):
        assert with_overrides(s, **change).fingerprint() != fp, change
    for same in ({"bootstrap_servers": "x:1"}, {"app_id": "other"}, {"heartbeat_ticks": 5},
                 {"beta": 0.01}, {"lateness_ms": 0}, {"partitions": 8},
                 {"checkpoint_ms": 5000}, {"checkpoint_records": 10}):
        assert with_overrides(s, **same).fingerprint() == fp, same


def test_defaults_without_file_need_a_counter() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(None, env={})
    assert info.value.field == "counters" and "give --config F" in str(info.value)
    s = load_settings(None, env={"DPC_COUNTERS": "a=0"})
    assert s == with_overrides(Settings(), counters={"a": 0})
    assert hash(s) == hash(with_overrides(Settings(), counters={"a": 0}))  # usable as a key


@pytest.mark.parametrize("eps,delta", [
    (1.0, 1e-6), (0.0, 1e-6), (-1.0, 1e-6), (float("inf"), 1e-6),
    (float("nan"), 1e-6), (1.0, 0.0), (1.0, 1.0), (1.0, -1e-9), (1.0, float("nan")),
    (0.0, 2.0),
])
def test_eps_delta_rule_is_the_cores(eps: float, delta: float) -> None:
    """Settings accept exactly the (eps, delta) the core's parameter check accepts, and a
    rejection names the field to fix (epsilon first when both are bad)."""
    base = with_overrides(Settings(), counters={"a": 0})
    try:
        check_eps_delta(eps, delta)
        core_ok = True
    except InvalidParameterError:
        core_ok = False
    if core_ok:
        assert with_overrides(base, epsilon=eps, delta=delta).epsilon == eps
        return
    with pytest.raises(ConfigError) as info:
        with_overrides(base, epsilon=eps, delta=delta)
    eps_ok = eps > 0 and eps != float("inf")
    assert info.value.field == ("delta" if eps_ok else "epsilon")


# The real limits of the core at the configuration check's horizon (CHECK_TICKS), found by
# bisection: with delta = 1e-6, BCC's eta underflows (InvalidParameterError) above epsilon
# ~855 (the error bounds are computed in log space where they would overflow, so they no
# longer set the limit); with epsilon = 1, a float-to-int conversion overflows near 1e-308.
@pytest.mark.parametrize("mechanism", ["ecc", "simecc"])
@pytest.mark.parametrize("eps,delta,field", [
    (850.0, 1e-6, None), (860.0, 1e-6, "epsilon"), (1000.0, 1e-6, "epsilon"),
    (1e6, 1e-6, "epsilon"), (1e308, 1e-6, "epsilon"),
    (1.0, 1e-300, None), (1.0, 1e-307, None), (1.0, 1e-308, "delta"),
    (1.0, 5e-324, "delta"), (500.0, 1e-300, "delta"), (5e5, 1e-300, "epsilon"),
])
def test_unusable_parameters_stop_the_load_naming_the_field(
        tmp_path: Path, mechanism: str, eps: float, delta: float, field: str | None) -> None:
    """epsilon = 1000, 1e6, 1e308 and delta = 1e-300 passed validation and crashed at the
    first marker: the load builds the mechanism once and stops with a
    ConfigError naming the field. Values at the limit still load."""
    path = tmp_path / "c.toml"
    path.write_text(f'mechanism = "{mechanism}"\nepsilon = {eps!r}\ndelta = {delta!r}\n'
                    "[counters]\na = 0\n")
    if field is None:
        assert load_settings(str(path), env={}).epsilon == eps
        return
    with pytest.raises(ConfigError) as info:
        load_settings(str(path), env={})
    assert info.value.field == field
    assert mechanism in info.value.message


def test_on_parameter_change_is_refuse_or_keep(tmp_path: Path) -> None:
    base = with_overrides(Settings(), counters={"a": 0})
    assert base.on_parameter_change == "refuse"
    assert with_overrides(base, on_parameter_change="keep").on_parameter_change == "keep"
    with pytest.raises(ConfigError) as info:
        with_overrides(base, on_parameter_change="restart")
    assert info.value.field == "on_parameter_change"


@pytest.mark.parametrize("name", ["sign ups", "a,b", "a=b", 'q"uote', " lead", "-dash",
                                  "tab\there", ""])
def test_counter_names_outside_the_pattern_are_refused(name: str) -> None:
    """Declared counter names match COUNTER_NAME_PATTERN (documented in
    deploy/config.example.toml): one ConfigError naming the field and the rule."""
    with pytest.raises(ConfigError, match="counters"):
        validate_settings(Settings(counters={name: 0}))


@pytest.mark.parametrize("name", ["signups", "api.v2/latency_ms", "zähler", "a:b@c+d-e",
                                  "_x", "9lives"])
def test_counter_names_in_the_pattern_are_accepted(name: str) -> None:
    """Controls: names of every allowed character class, any script's letters."""
    validate_settings(Settings(counters={name: 0}))
    assert name in load_settings(None, env={"DPC_COUNTERS": f"{name}=0"}).counters


def test_the_example_documents_the_counter_name_pattern() -> None:
    from processor.stream.model.config import COUNTER_NAME_PATTERN

    assert COUNTER_NAME_PATTERN in EXAMPLE.read_text()
