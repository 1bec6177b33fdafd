"""The container image, the compose stack and the Kubernetes manifests, checked without a
container engine (there is none on the development machine; deploy/README.md says what was
not run).

What is checked:
- the Dockerfile's entry command is what a test runs: `python -m processor worker --config
  <the mounted config>`, with the compose config and the ConfigMap's config at the paths the
  image mounts them, in process (config read, validated, key read) and as a real process
  (it gets as far as asking the configured brokers);
- the HEALTHCHECK command, run against the real metrics listener of
  processor/stream/worker/metrics.py, passes while /healthz answers and fails when nothing does;
- the build context the .dockerignore lets through holds what the build copies, and never a
  key file;
- compose.yaml and the manifests parse, and every port, probe path, file path, secret, config
  and volume they name exists in the other files and agrees with the configs.

Every checking function returns a list of problems; each test also feeds it one deliberately
wrong input (a control) and expects that problem reported, so none of them passes vacuously.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

import processor.stream.worker.app as worker_app
from processor.commands.main import main as cli_main
from processor.core.rng import NoiseKey
from processor.keyfile import write_key
from processor.stream.model.config import (
    SETTINGS_ENV_VARS,
    Settings,
    load_settings,
    with_overrides,
)
from processor.stream.model.records import Event, parse_input
from processor.stream.worker.metrics import Surface

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
DOCKERIGNORE = DEPLOY / "docker" / "Dockerfile.dockerignore"
COMPOSE_CONFIG = DEPLOY / "docker" / "config.compose.toml"
COMPOSE = DEPLOY / "compose.yaml"
K8S = DEPLOY / "k8s"
DEMO_PRODUCER = DEPLOY / "docker" / "demo_producer.py"
# Where the image expects its mounts (the Dockerfile's header says so; the checks below
# verify the compose file, the manifests and both configs use exactly these).
KEY_PATH = "/run/secrets/dpc-noise-key"
STATE_DIR = "/var/lib/dpc"
CONFIG_PATH = "/etc/dpc/config.toml"
#: A key for the staged runs: fixed bytes, so a test can tell it was the one read.
TEST_SECRET = bytes(range(32))


# ----------------------------------------------------------------------------- Dockerfile


@dataclass(frozen=True)
class Image:
    """What the Dockerfile's final stage declares."""

    entry: list[str]          # ENTRYPOINT + CMD, exec form
    volumes: list[str]
    exposed: list[int]
    user: str
    healthcheck: list[str]    # HEALTHCHECK CMD, exec form
    copies: list[str]         # sources of COPY instructions that read the build context


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: comments dropped, continuations joined."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def _exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def parse_image(text: str) -> Image:
    """The final stage of a Dockerfile (exec-form ENTRYPOINT/CMD/HEALTHCHECK only: shell
    forms would run under /bin/sh, which the checks below do not model)."""
    stages: list[list[tuple[str, str]]] = []
    for instr, args in dockerfile_instructions(text):
        if instr == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instr, args))
    final = stages[-1]
    entry: list[str] = []
    cmd: list[str] = []
    volumes: list[str] = []
    exposed: list[int] = []
    user = "root"
    health: list[str] = []
    copies: list[str] = []
    for instr, args in final:
        if instr == "ENTRYPOINT":
            entry = _exec_form(args)
            cmd = []  # an ENTRYPOINT resets an inherited CMD
        elif instr == "CMD":
            cmd = _exec_form(args)
        elif instr == "VOLUME":
            volumes += _exec_form(args) if args.startswith("[") else args.split()
        elif instr == "EXPOSE":
            exposed += [int(p.split("/")[0]) for p in args.split()]
        elif instr == "USER":
            user = args
        elif instr == "HEALTHCHECK":
            _opts, sep, rest = args.partition("CMD ")
            assert sep, "HEALTHCHECK without CMD"
            health = _exec_form(rest.strip())
    for stage in stages:
        for instr, args in stage:
            if instr == "COPY" and "--from=" not in args:
                copies += shlex.split(args)[:-1]
    return Image(entry + cmd, volumes, exposed, user, health, copies)


def config_path_of(entry: list[str]) -> str | None:
    """The --config argument of the entry command."""
    for i, arg in enumerate(entry):
        if arg == "--config" and i + 1 < len(entry):
            return entry[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def check_entry(entry: list[str]) -> list[str]:
    problems = []
    if entry[:4] != ["python", "-m", "processor", "worker"]:
        problems.append(f"entry command {entry[:4]} is not python -m processor worker")
    if config_path_of(entry) != CONFIG_PATH:
        problems.append(f"entry command reads config {config_path_of(entry)!r}, "
                        f"not {CONFIG_PATH}")
    return problems


def healthcheck_url(cmd: list[str]) -> str:
    urls: list[str] = [u for arg in cmd for u in re.findall(r"https?://[^'\"\s]+", arg)]
    assert len(urls) == 1, cmd
    return urls[0]


def check_settings_against_image(settings: Settings, image: Image) -> list[str]:
    """A config the image runs: key at the secret mount, state on the volume, the metrics
    ports exposed and reachable from outside the container, the health check on them."""
    problems = []
    if settings.noise_key_file != KEY_PATH:
        problems.append(f"noise_key_file {settings.noise_key_file!r} is not {KEY_PATH}")
    if settings.state_dir not in image.volumes:
        problems.append(f"state_dir {settings.state_dir!r} is not a VOLUME {image.volumes}")
    if settings.metrics_port not in image.exposed:
        problems.append(f"metrics_port {settings.metrics_port} not in EXPOSE {image.exposed}")
    if settings.public_metrics and settings.public_metrics_port not in image.exposed:
        problems.append(f"public_metrics_port {settings.public_metrics_port} not in EXPOSE")
    if settings.metrics_host in ("127.0.0.1", "localhost", "::1"):
        problems.append(f"metrics_host {settings.metrics_host}: probes from outside the "
                        "container cannot reach it")
    url = urllib.parse.urlsplit(healthcheck_url(image.healthcheck))
    if url.port != settings.metrics_port:
        problems.append(f"HEALTHCHECK port {url.port} is not metrics_port "
                        f"{settings.metrics_port}")
    if url.path != "/healthz":
        problems.append(f"HEALTHCHECK path {url.path} is not /healthz")
    return problems


@pytest.fixture(scope="module")
def image() -> Image:
    return parse_image(DOCKERFILE.read_text())


def test_dockerfile_entry_command_and_image_user(image: Image) -> None:
    assert check_entry(image.entry) == []
    assert image.user.split(":")[0] not in ("root", "0", "")
    assert STATE_DIR in image.volumes
    # Controls: another subcommand, another config path.
    wrong = ["python", "-m", "processor", "replay", "--config", CONFIG_PATH]
    assert any("not python -m processor worker" in p for p in check_entry(wrong))
    other = ["python", "-m", "processor", "worker", "--config", "/etc/dpc/other.toml"]
    assert any("not /etc/dpc/config.toml" in p for p in check_entry(other))


def test_dockerfile_parsing_joins_continuations_and_resets_cmd() -> None:
    text = ("FROM a AS b\nCMD [\"x\"]\nFROM c\n# c\nCMD [\"old\"]\n"
            "ENTRYPOINT [\"p\", \\\n  \"q\"]\nEXPOSE 1 2/tcp\n")
    img = parse_image(text)
    assert img.entry == ["p", "q"]
    assert img.exposed == [1, 2]


def _staged_config(config_text: str, root: Path) -> Path:
    """The config file as the container sees it, under `root`: the container paths of the
    key and the state directory moved under `root` (nothing else changes), the key written
    there (mode 0600), the file at root + CONFIG_PATH."""
    for container_path in (KEY_PATH, STATE_DIR):
        config_text = config_text.replace(f'"{container_path}"',
                                          f'"{root}{container_path}"')
    key = Path(f"{root}{KEY_PATH}")
    key.parent.mkdir(parents=True, exist_ok=True)
    write_key(key, TEST_SECRET)
    config = Path(f"{root}{CONFIG_PATH}")
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(config_text)
    return config


def _rooted_argv(entry: list[str], root: Path) -> list[str]:
    """The entry command's arguments after `python -m processor`, absolute paths under root."""
    return [f"{root}{a}" if a.startswith("/") else a for a in entry[3:]]


def run_entry_in_process(entry: list[str], config_text: str, root: Path,
                         monkeypatch: pytest.MonkeyPatch
                         ) -> tuple[int, list[tuple[Settings, NoiseKey]]]:
    """Run the entry command through processor.commands.main.main, with the broker-facing part
    (run_worker) replaced by a recorder: everything before it (argument parsing, config
    loading and validation, key reading) runs as in the container."""
    _staged_config(config_text, root)
    ran: list[tuple[Settings, NoiseKey]] = []

    def fake_run_worker(settings: Settings, key: NoiseKey, *, loglevel: str = "warning",
                        phases: Sequence[tuple[str, float]] = ()) -> int:
        ran.append((settings, key))
        return 0

    monkeypatch.setattr(worker_app, "run_worker", fake_run_worker)
    for var in SETTINGS_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    return cli_main(_rooted_argv(entry, root)), ran


def _config_texts() -> Iterator[tuple[str, str]]:
    yield "compose", COMPOSE_CONFIG.read_text()
    yield "configmap", configmap_config_text(load_k8s())


@pytest.mark.parametrize("which", ["compose", "configmap"])
def test_entry_command_runs_each_shipped_config(which: str, image: Image, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    text = dict(_config_texts())[which]
    code, ran = run_entry_in_process(image.entry, text, tmp_path, monkeypatch)
    assert code == 0 and len(ran) == 1
    settings, key = ran[0]
    assert settings.noise_key_file == f"{tmp_path}{KEY_PATH}"
    assert settings.state_dir == f"{tmp_path}{STATE_DIR}"
    assert key.derive("probe") == NoiseKey(TEST_SECRET).derive("probe")
    # The unstaged config is the one the container reads: valid, and it fits the image.
    shipped = load_settings(str(_write(tmp_path / "shipped.toml", text)), {})
    assert check_settings_against_image(shipped, image) == []


def test_entry_command_control_wrong_paths_fail(image: Image, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    text = COMPOSE_CONFIG.read_text()
    # The image reading a config path nobody mounts.
    other = [*image.entry[:4], "--config", "/etc/dpc/other.toml"]
    code, ran = run_entry_in_process(other, text, tmp_path / "a", monkeypatch)
    assert code == 2 and ran == []
    assert "cannot read" in capsys.readouterr().err
    # A config whose key path is not where the secret is mounted.
    wrong_key = text.replace(f'"{KEY_PATH}"', '"/run/secrets/elsewhere"')
    code, ran = run_entry_in_process(image.entry, wrong_key, tmp_path / "b", monkeypatch)
    assert code == 2 and ran == []
    assert "noise key" in capsys.readouterr().err
    # The same checks on settings that do not fit the image.
    shipped = load_settings(str(COMPOSE_CONFIG), {})
    for change, expected in ((dict(metrics_port=9000), "metrics_port 9000"),
                             (dict(state_dir="/data"), "state_dir"),
                             (dict(noise_key_file="/k"), "noise_key_file"),
                             (dict(metrics_host="127.0.0.1"), "metrics_host")):
        problems = check_settings_against_image(with_overrides(shipped, **change), image)
        assert any(expected in p for p in problems), (change, problems)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.timeout(180)
def test_entry_command_as_a_process_reaches_the_configured_brokers(image: Image,
                                                                   tmp_path: Path) -> None:
    """The literal command (`python` is this test's interpreter) with the compose config:
    it reads the config and the key, then asks the brokers (kafka:9092 does not resolve
    here) and stops with one `error:` line naming them, exit 2. A config or key problem
    would stop it earlier with another message (the control)."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS_ENV_VARS}
    _staged_config(COMPOSE_CONFIG.read_text(), tmp_path)
    argv = [sys.executable, *image.entry[1:3], *_rooted_argv(image.entry, tmp_path)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=150,
                          cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "the Kafka brokers at kafka:9092 do not answer" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    # Control: without the key file the same command stops at the key, before any broker.
    Path(f"{tmp_path}{KEY_PATH}").unlink()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 2 and "error: noise key" in done.stderr, done.stderr


# ----------------------------------------------------------------------------- health check


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def live_surface() -> Iterator[Surface]:
    """The worker's real metrics listener (metrics.Surface), on a free loopback port."""
    settings = with_overrides(load_settings(str(COMPOSE_CONFIG), {}), metrics_host="127.0.0.1",
                              metrics_port=_free_port(), public_metrics=False)
    surface = Surface(settings, lambda: {})
    surface.start(None, probe_lag=False)
    try:
        yield surface
    finally:
        surface.close()


def http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def check_served(port: int, paths: list[str]) -> list[str]:
    """Paths the metrics listener does not serve (404)."""
    return [f"{p} is not served by processor/stream/worker/metrics.py" for p in paths
            if http_status(port, p) == 404]


def test_healthcheck_command_against_the_real_listener(image: Image,
                                                       live_surface: Surface) -> None:
    port = live_surface.settings.metrics_port
    url = healthcheck_url(image.healthcheck)
    # The command as written, pointed at this test's port (the port itself is checked
    # against metrics_port in check_settings_against_image).
    cmd = [sys.executable if i == 0 else arg.replace(":9464/", f":{port}/")
           for i, arg in enumerate(image.healthcheck)]
    assert image.healthcheck[0] == "python" and ":9464/" in url
    assert subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    assert check_served(port, ["/healthz", "/readyz", "/metrics"]) == []
    assert check_served(port, ["/health"]) != []  # control: an unserved path is caught
    live_surface.close()
    # Control: nothing listening, the health check fails.
    assert subprocess.run(cmd, capture_output=True, timeout=60).returncode != 0


# ----------------------------------------------------------------------------- .dockerignore


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parent
    directories decides; a `!` pattern re-includes."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        rx = _pattern_regex(raw[1:] if negate else raw)
        if any(rx.match(p) for p in prefixes):
            excluded = not negate
    return excluded


def read_dockerignore(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines()
            if ln.strip() and not ln.strip().startswith("#")]


def check_build_context(patterns: list[str], image: Image) -> list[str]:
    """What the build copies passes the ignore file; keys and local state never do."""
    problems = []
    needed = [*image.copies, "processor/__main__.py", "processor/stream/worker/app.py"]
    problems += [f"{p} is excluded from the build context" for p in needed
                 if dockerignore_excludes(patterns, p)]
    secret_like = ["deploy/docker/secrets/dpc-noise-key", "deploy/k8s/secrets/noise.key",
                   ".venv/bin/python", ".dpc-state/x", "secrets/noise.key"]
    problems += [f"{p} would enter the build context" for p in secret_like
                 if not dockerignore_excludes(patterns, p)]
    return problems


def test_build_context(image: Image) -> None:
    patterns = read_dockerignore(DOCKERIGNORE.read_text())
    assert set(image.copies) >= {"pyproject.toml", "README.md", "processor"}
    # setuptools reads the readme named in pyproject.toml.
    assert 'readme = "README.md"' in (ROOT / "pyproject.toml").read_text()
    assert check_build_context(patterns, image) == []
    assert dockerignore_excludes(patterns, "processor/core/__pycache__/x.pyc")
    # Controls: without the allow-list entry the package is missing; without the leading
    # `*` every key file enters the context.
    no_pkg = [p for p in patterns if p != "!processor"]
    assert any("processor/__main__.py" in p for p in check_build_context(no_pkg, image))
    no_star = [p for p in patterns if p != "*"]
    assert any("noise" in p for p in check_build_context(no_star, image))


# ----------------------------------------------------------------------------- compose


def load_compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc


def _secret_target(entry: str | Mapping[str, Any]) -> tuple[str, str]:
    """(secret name, path in the container) of a service's secrets entry."""
    if isinstance(entry, str):
        return entry, f"/run/secrets/{entry}"
    target = str(entry.get("target", entry["source"]))
    return str(entry["source"]), target if target.startswith("/") else f"/run/secrets/{target}"


def _git_ignored(path: Path) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT,
                          capture_output=True).returncode == 0


def _compose_port_problems(worker: Mapping[str, Any], settings: Settings,
                           image: Image) -> list[str]:
    """The metrics ports are published, EXPOSEd by the image, on loopback only."""
    problems: list[str] = []
    published = {}
    for p in worker.get("ports", []):
        parts = str(p).split(":")
        # "HOST_PORT:CONTAINER_PORT" alone publishes on every interface of the host.
        host_ip = parts[0] if len(parts) == 3 else "0.0.0.0"
        published[int(parts[-1])] = host_ip
    for port in (settings.metrics_port, settings.public_metrics_port):
        if port not in published:
            problems.append(f"port {port} is not published")
        elif port not in image.exposed:
            problems.append(f"published port {port} is not EXPOSEd by the image")
    problems += [f"port {port} published beyond the host's loopback"
                 for port, ip in published.items() if ip != "127.0.0.1"]
    return problems


def _compose_producer_problems(producer: Mapping[str, Any], worker: Mapping[str, Any],
                               configs: Mapping[str, Any]) -> list[str]:
    """The demo producer runs the worker's image and config, without the noise key."""
    problems: list[str] = []
    p_configs = {c["target"]: (COMPOSE.parent / configs[c["source"]]["file"]).resolve()
                 for c in producer["configs"]}
    script = producer["entrypoint"][1]
    if p_configs.get(script) != DEMO_PRODUCER:
        problems.append(f"demo producer script {script} is not {DEMO_PRODUCER}")
    if p_configs.get(CONFIG_PATH) != COMPOSE_CONFIG:
        problems.append("demo producer does not read the worker's config")
    if producer.get("image") != worker.get("image") or \
            producer.get("build") != worker["build"]:
        problems.append("the demo producer does not run the worker's image")
    if producer.get("secrets"):
        problems.append("the demo producer must not get the noise key")
    return problems


def check_compose(doc: Mapping[str, Any], image: Image) -> list[str]:
    problems: list[str] = []
    services = doc["services"]
    kafka, worker, producer = services["kafka"], services["worker"], services["demo-producer"]
    if not str(kafka["image"]).startswith("apache/kafka:"):
        problems.append(f"broker image {kafka['image']} is not the official apache/kafka")
    env = kafka["environment"]
    if "broker" not in env["KAFKA_PROCESS_ROLES"] or "controller" not in \
            env["KAFKA_PROCESS_ROLES"]:
        problems.append("broker is not a single KRaft broker+controller node")
    build = worker["build"]
    if (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() != DOCKERFILE:
        problems.append(f"worker builds {build}, not {DOCKERFILE}")
    configs = doc["configs"]
    mounted = {c["target"]: (COMPOSE.parent / configs[c["source"]]["file"]).resolve()
               for c in worker["configs"]}
    if mounted.get(CONFIG_PATH) != COMPOSE_CONFIG:
        problems.append(f"worker's {CONFIG_PATH} is {mounted.get(CONFIG_PATH)}")
    settings = load_settings(str(COMPOSE_CONFIG), {})
    secrets = dict(_secret_target(s) for s in worker.get("secrets", []))
    if settings.noise_key_file not in secrets.values():
        problems.append(f"no secret mounted at noise_key_file {settings.noise_key_file}")
    for name in secrets:
        if name not in doc.get("secrets", {}):
            problems.append(f"secret {name} is not defined")
            continue
        key_file = COMPOSE.parent / doc["secrets"][name]["file"]
        if not _git_ignored(key_file):
            problems.append(f"secret file {key_file} is not git-ignored")
    volume_targets = {str(v).split(":")[1] for v in worker.get("volumes", [])}
    if settings.state_dir not in volume_targets:
        problems.append(f"state_dir {settings.state_dir} is not a volume {volume_targets}")
    for v in worker.get("volumes", []):
        source = str(v).split(":")[0]
        if not source.startswith((".", "/")) and source not in (doc.get("volumes") or {}):
            problems.append(f"volume {source} is not defined")
    problems += _compose_port_problems(worker, settings, image)
    host, _, port_s = settings.bootstrap_servers.partition(":")
    if host not in services or f"PLAINTEXT://{host}:{port_s}" not in \
            env["KAFKA_ADVERTISED_LISTENERS"]:
        problems.append(f"bootstrap_servers {settings.bootstrap_servers} is not the broker "
                        "service's advertised listener")
    return problems + _compose_producer_problems(producer, worker, configs)


def test_compose_references(image: Image) -> None:
    doc = load_compose()
    assert check_compose(doc, image) == []
    controls: list[tuple[str, Any, str]] = [
        ("worker.ports", ["127.0.0.1:9999:9999", "127.0.0.1:9465:9465"], "port 9464"),
        ("worker.ports", ["9464:9464", "127.0.0.1:9465:9465"], "beyond the host's loopback"),
        ("worker.secrets", [{"source": "dpc-noise-key", "target": "other"}], "noise_key_file"),
        ("worker.volumes", ["dpc-state:/data"], "state_dir"),
        ("worker.volumes", ["nowhere:/var/lib/dpc"], "volume nowhere"),
        ("kafka.image", "bitnami/kafka:3.9", "apache/kafka"),
        ("demo-producer.secrets", ["dpc-noise-key"], "must not get the noise key"),
        ("demo-producer.image", "python:3.11-slim", "worker's image"),
    ]
    for where, value, expected in controls:
        bad = copy.deepcopy(doc)
        service, field_name = where.split(".")
        bad["services"][service][field_name] = value
        problems = check_compose(bad, image)
        assert any(expected in p for p in problems), (where, problems)
    bad = copy.deepcopy(doc)
    bad["secrets"]["dpc-noise-key"]["file"] = "./docker/noise.key"  # not git-ignored
    assert any("git-ignored" in p for p in check_compose(bad, image))


def _load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_producer_events_fit_the_compose_config() -> None:
    producer = _load_module(DEMO_PRODUCER)
    settings = load_settings(str(COMPOSE_CONFIG), {})
    plan = producer.TrafficPlan()
    assert producer.undeclared(plan, settings) == []
    base_ms = int(time.time() * 1000)
    records = producer.window_records(plan, 30.0, 7, 3 * settings.tick_ms, base_ms)
    parsed = [parse_input(raw, settings, base_ms + int(at_s * 1000)) for at_s, raw in records]
    events = [p for p in parsed if isinstance(p, Event)]
    # Every counter gets events; the rejected ones are the plan's deliberately bad records.
    assert {e.counter for e in events} == set(plan.counters)
    assert len(events) == sum(r.valid for r in plan.records)
    # Control: a config that declares only one of the counters.
    narrow = with_overrides(settings, counters={"signups": settings.counters["signups"]})
    assert producer.undeclared(plan, narrow) == ["purchases", "incidents"]


# ----------------------------------------------------------------------------- Kubernetes


def load_k8s() -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> manifest, for every resource the kustomization lists."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    out: dict[tuple[str, str], dict[str, Any]] = {("Kustomization", ""): kustomization}
    for resource in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / resource).read_text()):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def configmap_config_text(docs: Mapping[tuple[str, str], Mapping[str, Any]]) -> str:
    sts = _statefulset(docs)
    volume = _volume(sts, _mount(sts, "/etc/dpc")["name"])
    cm = docs[("ConfigMap", volume["configMap"]["name"])]
    return str(cm["data"][volume["configMap"]["items"][0]["key"]])


def _statefulset(docs: Mapping[tuple[str, str], Mapping[str, Any]]) -> Mapping[str, Any]:
    (sts,) = [d for (kind, _), d in docs.items() if kind == "StatefulSet"]
    return sts


def _container(sts: Mapping[str, Any]) -> Mapping[str, Any]:
    c: Mapping[str, Any]  # the parsed YAML is untyped; a container is a mapping
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    return c


def _mount(sts: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    m: Mapping[str, Any]
    (m,) = [m for m in _container(sts)["volumeMounts"] if m["mountPath"] == path]
    return m


def _volume(sts: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    v: Mapping[str, Any]
    (v,) = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == name]
    return v


def _port_number(container: Mapping[str, Any], port: int | str) -> int | None:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    return named.get(port)


def _k8s_probe_problems(container: Mapping[str, Any], served: Mapping[str, bool],
                        settings: Settings) -> list[str]:
    """Each probe gets the path metrics.py serves for it, on metrics_port."""
    problems: list[str] = []
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"),
                        ("startupProbe", "/healthz")):
        get = container.get(probe, {}).get("httpGet")
        if get is None:
            problems.append(f"{probe} missing")
            continue
        if get["path"] != path or not served.get(get["path"], False):
            problems.append(f"{probe} path {get['path']} is not {path} served by metrics.py")
        if _port_number(container, get["port"]) != settings.metrics_port:
            problems.append(f"{probe} port {get['port']} is not metrics_port "
                            f"{settings.metrics_port}")
    return problems


def _k8s_service_problems(docs: Mapping[tuple[str, str], Mapping[str, Any]],
                          sts: Mapping[str, Any], container: Mapping[str, Any],
                          settings: Settings) -> list[str]:
    """The Services select the worker pods and target the ports the config serves."""
    problems: list[str] = []
    labels = sts["spec"]["template"]["metadata"]["labels"]
    services = {name: d for (kind, name), d in docs.items() if kind == "Service"}
    if sts["spec"]["serviceName"] not in services:
        problems.append(f"serviceName {sts['spec']['serviceName']} is not a listed Service")
    targets = set()
    for name, svc in services.items():
        if any(labels.get(k) != v for k, v in svc["spec"]["selector"].items()):
            problems.append(f"Service {name} selects no worker pod")
        for p in svc["spec"]["ports"]:
            number = _port_number(container, p.get("targetPort", p["port"]))
            if number is None:
                problems.append(f"Service {name} targets an unknown port {p.get('targetPort')}")
            targets.add(number)
    if {settings.metrics_port, settings.public_metrics_port} - targets:
        problems.append("a metrics port has no Service")
    return problems


def check_k8s(docs: Mapping[tuple[str, str], Mapping[str, Any]], image: Image,
              served: Mapping[str, bool], workdir: Path) -> list[str]:
    """`served`: probe path -> whether the metrics listener serves it; `workdir`: where
    the ConfigMap's embedded config is written for load_settings."""
    problems: list[str] = []
    kustomization = docs[("Kustomization", "")]
    problems += [f"kustomization resource {r} does not exist"
                 for r in kustomization["resources"] if not (K8S / r).is_file()]
    sts = _statefulset(docs)
    pod = sts["spec"]["template"]
    container = _container(sts)
    settings = load_settings(str(_write(workdir / "config.toml",
                                        configmap_config_text(docs))), {})

    def mount_of(path: str) -> Mapping[str, Any] | None:
        found = [m for m in container["volumeMounts"]
                 if m["mountPath"] == path or path.startswith(m["mountPath"].rstrip("/") + "/")]
        return found[0] if found else None

    # config: the ConfigMap's item lands at the path the entry command reads
    cfg_mount = mount_of(CONFIG_PATH)
    if cfg_mount is None:
        problems.append(f"nothing mounted at {CONFIG_PATH}")
    else:
        vol = _volume(sts, cfg_mount["name"])
        items = {i["path"]: i["key"] for i in vol["configMap"].get("items", [])}
        rel = CONFIG_PATH.removeprefix(cfg_mount["mountPath"].rstrip("/") + "/")
        if ("ConfigMap", vol["configMap"]["name"]) not in docs or rel not in items:
            problems.append(f"{CONFIG_PATH} is not an item of a listed ConfigMap")
    # noise key: the Secret's file at noise_key_file, from the kustomize secretGenerator
    key_mount = mount_of(settings.noise_key_file or "")
    if key_mount is None or key_mount["mountPath"] != settings.noise_key_file:
        problems.append(f"no secret file mounted at noise_key_file {settings.noise_key_file}")
    else:
        vol = _volume(sts, key_mount["name"])
        generated = {g["name"]: dict(f.split("=", 1) for f in g["files"])
                     for g in kustomization.get("secretGenerator", [])}
        secret = vol.get("secret", {})
        files = generated.get(secret.get("secretName"), {})
        item_paths = {i["path"]: i["key"] for i in secret.get("items", [])}
        if key_mount.get("subPath") not in item_paths or \
                item_paths[key_mount["subPath"]] not in files:
            problems.append("the key mount is not a file of a generated Secret")
        for source in files.values():
            if not _git_ignored(K8S / source):
                problems.append(f"secret source {source} is not git-ignored")
    # state: a PersistentVolumeClaim template mounted at state_dir
    claims = {c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])}
    state_mount = mount_of(settings.state_dir)
    if state_mount is None or state_mount["mountPath"] != settings.state_dir or \
            state_mount["name"] not in claims:
        problems.append(f"state_dir {settings.state_dir} is not a PersistentVolumeClaim")
    # ports and probes
    ports = {p["containerPort"] for p in container.get("ports", [])}
    for port in (settings.metrics_port, settings.public_metrics_port):
        if port not in ports or port not in image.exposed:
            problems.append(f"port {port} is not a container port EXPOSEd by the image")
    problems += _k8s_probe_problems(container, served, settings)
    # services: select the pods, target the ports the config serves
    problems += _k8s_service_problems(docs, sts, container, settings)
    # the pod's user is the image's
    uid = pod["spec"]["securityContext"]["runAsUser"]
    if str(uid) != image.user.split(":")[0]:
        problems.append(f"runAsUser {uid} is not the image's USER {image.user}")
    return problems


def test_k8s_manifests_reference_what_exists(image: Image, live_surface: Surface,
                                            tmp_path: Path) -> None:
    port = live_surface.settings.metrics_port
    served = {p: not check_served(port, [p]) for p in ("/healthz", "/readyz", "/ready")}
    docs = load_k8s()
    assert {kind for kind, _ in docs} >= {"StatefulSet", "Service", "ConfigMap"}
    assert check_k8s(docs, image, served, tmp_path) == []
    assert not served["/ready"]

    def mutated(edit: Any) -> list[str]:
        bad = copy.deepcopy(docs)
        edit(bad)
        return check_k8s(bad, image, served, tmp_path)

    def container_of(d: Any) -> Any:
        return _container(_statefulset(d))

    def set_probe_path(d: Any) -> None:
        container_of(d)["readinessProbe"]["httpGet"]["path"] = "/ready"

    def set_probe_port(d: Any) -> None:
        container_of(d)["livenessProbe"]["httpGet"]["port"] = 8080

    def set_key_path(d: Any) -> None:
        for m in container_of(d)["volumeMounts"]:
            if m["name"] == "noise-key":
                m["mountPath"] = "/run/secrets/other"

    def set_secret_name(d: Any) -> None:
        _volume(_statefulset(d), "noise-key")["secret"]["secretName"] = "nope"

    def drop_claims(d: Any) -> None:
        _statefulset(d)["spec"]["volumeClaimTemplates"] = []

    def set_config_port(d: Any) -> None:
        cm = d[("ConfigMap", "dpc-config")]
        cm["data"]["config.toml"] = cm["data"]["config.toml"].replace(
            "metrics_port = 9464", "metrics_port = 9000")

    def set_service_target(d: Any) -> None:
        d[("Service", "dpc-worker")]["spec"]["ports"][0]["targetPort"] = "metricz"

    def set_user(d: Any) -> None:
        _statefulset(d)["spec"]["template"]["spec"]["securityContext"]["runAsUser"] = 0

    controls = [(set_probe_path, "readinessProbe path /ready"),
                (set_probe_port, "livenessProbe port 8080"),
                (set_key_path, "noise_key_file"),
                (set_secret_name, "generated Secret"),
                (drop_claims, "PersistentVolumeClaim"),
                (set_config_port, "metrics_port 9000"),
                (set_service_target, "unknown port metricz"),
                (set_user, "runAsUser 0")]
    for edit, expected in controls:
        problems = mutated(edit)
        assert any(expected in p for p in problems), (edit.__name__, problems)
