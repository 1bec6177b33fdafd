"""The command line: `python deploy/kafka.py fetch | start | start-cluster | stop | status`
(also `python -m processor.devtools.kafka.cli`)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from processor.devtools.kafka.cluster import (
    LocalKafka,
    broker_ids,
    client_files,
    read_client_properties,
    remove_client_files,
    write_client_files,
)
from processor.devtools.kafka.fetch import LIBS_DIR_ENV, default_libs_dir, fetch, is_fetched
from processor.devtools.kafka.tls import SECURITY_MODES
from processor.devtools.kafka.tools import (
    DEFAULT_LIBS_DIR,
    DEFAULT_STATE_FILE,
    LocalKafkaError,
    ToolMissingError,
)
from processor.errors import print_error

# Exit codes of the command line.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_MISSING_TOOL = ToolMissingError.exit_code


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data


def _cmd_fetch(args: argparse.Namespace, maven_args: list[str]) -> int:
    libs = Path(args.libs_dir).resolve() if args.libs_dir else None
    target = libs or default_libs_dir()
    if not args.force and is_fetched(target):
        print(f"Kafka jars already in {target} (cached; --force to fetch again)", file=sys.stderr)
        return EXIT_OK
    started = time.monotonic()
    path = fetch(libs, maven_args, force=args.force, log=sys.stderr)
    jars = len(list(path.glob("*.jar")))
    took = time.monotonic() - started
    print(f"fetched {jars} jars into {path} in {took:.1f}s", file=sys.stderr)
    return EXIT_OK


def _cmd_start(args: argparse.Namespace, nodes: int) -> int:
    state_file = Path(args.state_file)
    old = _read_state(state_file)
    if old is not None:
        attached = LocalKafka.attach(old)
        if any(attached.is_alive(i) for i in range(attached.nodes)):
            running = str(old.get("bootstrap_servers"))
            wanted = [f"127.0.0.1:{p}" for p in args.ports.split(",")] if args.ports else None
            if ((wanted is None or running.split(",") == wanted)
                    and attached.nodes == nodes
                    and old.get("security", "plaintext") == args.security):
                # The broker asked for runs already (the demo's, say): use it, do not
                # stop it (that would delete the topics it keeps).
                # The address on both streams: standard output is for scripts (the demo
                # reads it), the line on stderr is whole without it.
                print(f"a local Kafka is already running at {running} (kept as it is)",
                      file=sys.stderr)
                print(running, flush=True)
                return EXIT_OK
            print(
                f"a local Kafka is already running on {running}, not as asked: use it "
                f"(export KAFKA_BOOTSTRAP_SERVERS={running}), or stop it first with "
                "`python deploy/kafka.py stop` (which deletes its topics)",
                file=sys.stderr,
            )
            return EXIT_FAILURE
        attached.stop()  # leftovers of a crashed run: clean them up
        state_file.unlink(missing_ok=True)
    remove_client_files(state_file)
    ports = [int(p) for p in args.ports.split(",")] if args.ports else None
    kafka = LocalKafka(
        nodes,
        ports=ports,
        num_partitions=args.partitions,
        heap=args.heap,
        libs_dir=Path(args.libs_dir).resolve() if args.libs_dir else None,
        start_timeout=args.timeout,
        die_with_parent=args.foreground,
        security=args.security,
    )
    started = time.monotonic()
    print(f"starting {nodes} Kafka node(s) on 127.0.0.1 ...", file=sys.stderr)
    kafka.start()
    took = time.monotonic() - started
    if not args.foreground:
        # Recorded before anything is printed: a print that fails (the output piped into
        # `head -1` and closed) or a Ctrl-C from here on leaves a broker `stop` can find.
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state = {**kafka.state(), "security": args.security}
        state_file.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    written: tuple[Path, Path] | None = None
    if args.security != "plaintext":
        state_file.parent.mkdir(parents=True, exist_ok=True)
        written = write_client_files(kafka, state_file)
        print(f"client settings ({args.security}, mode 0600): {written[0]} (librdkafka) and "
              f"{written[1]} (the processor's bootstrap_servers and [security])",
              file=sys.stderr)
    print(f"Kafka is up in {took:.1f}s at {kafka.bootstrap_servers}", file=sys.stderr)
    print(kafka.bootstrap_servers, flush=True)
    if written is not None:
        print(f"client properties: {written[0]}", flush=True)
    if args.foreground:
        print("running in the foreground; Ctrl-C stops it", file=sys.stderr)
        # Block the signals and wait for one, instead of a KeyboardInterrupt mid-stop.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        finally:
            kafka.stop()
            remove_client_files(state_file)
        return EXIT_OK
    print(f"stop it with: python deploy/kafka.py stop   (state in {state_file})", file=sys.stderr)
    return EXIT_OK


def _cmd_stop(args: argparse.Namespace) -> int:
    state_file = Path(args.state_file)
    state = _read_state(state_file)
    if state is None:
        print("no local Kafka is recorded as running", file=sys.stderr)
        return EXIT_OK
    LocalKafka.attach(state, stop_timeout=args.timeout).stop()
    state_file.unlink(missing_ok=True)
    remove_client_files(state_file)
    print("stopped", file=sys.stderr)
    return EXIT_OK


def _cmd_status(args: argparse.Namespace) -> int:
    state = _read_state(Path(args.state_file))
    if state is None:
        print("not running")
        return EXIT_FAILURE
    kafka = LocalKafka.attach(state)
    security: dict[str, str] | None = None
    props_file = client_files(Path(args.state_file))[0]
    if state.get("security", "plaintext") != "plaintext" and props_file.is_file():
        security = {k: v for k, v in read_client_properties(props_file).items()
                    if k != "bootstrap.servers"}
    healthy = True
    expected = {int(n["node_id"]) for n in state["nodes"]}
    for i in range(kafka.nodes):
        alive = kafka.is_alive(i)
        answer = "-"
        if alive:
            try:
                ids = broker_ids(kafka.node_bootstrap(i), timeout=5.0, security=security)
                answer = f"sees brokers {sorted(ids)}"
                healthy = healthy and ids == expected
            except Exception as exc:
                answer = f"no metadata answer ({exc})"
                healthy = False
        else:
            healthy = False
        state_word = "running" if alive else "NOT running"
        print(f"node {i} (id {kafka.node_id(i)}) {kafka.node_bootstrap(i)}: {state_word}, {answer}")
    print(f"bootstrap servers: {state['bootstrap_servers']}")
    return EXIT_OK if healthy else EXIT_FAILURE


def build_parser() -> argparse.ArgumentParser:
    """The command line's argument parser."""
    parser = argparse.ArgumentParser(
        prog="python deploy/kafka.py",
        description="Fetch, start and stop a real Apache Kafka broker on 127.0.0.1 (no Docker).",
        epilog=(
            "Exit codes: 0 ok, 1 failure (or `status`: not running), 2 usage, "
            "3 java or mvn missing. Extra -D... arguments of `fetch` go to Maven."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="download the broker jars from Maven Central (once)")
    p_fetch.add_argument("--force", action="store_true", help="fetch even if cached")
    for name, nodes, text in (
        ("start", 1, "start one combined broker+controller node in the background"),
        ("start-cluster", 3, "start three nodes (replication factor 3, min ISR 2)"),
    ):
        p = sub.add_parser(name, help=text)
        p.set_defaults(nodes=nodes)
        p.add_argument(
            "--ports", help="broker ports, comma separated, one per node (default: free)"
        )
        p.add_argument("--partitions", type=int, default=1, help="num.partitions (default 1)")
        p.add_argument("--heap", default="512m", help="JVM -Xmx per node (default 512m)")
        p.add_argument("--timeout", type=float, default=120.0, help="startup timeout, seconds")
        p.add_argument(
            "--foreground", action="store_true", help="stay in the foreground until Ctrl-C"
        )
        p.add_argument(
            "--security", choices=SECURITY_MODES, default="plaintext",
            help="secure the client listener: sasl_ssl (SCRAM-SHA-512 over TLS, user "
            "`client`, a random password) or mtls (TLS with client certificates); a fresh "
            "test CA; the client settings are written next to the state file (mode 0600) "
            "and their path printed (default plaintext)",
        )
    p_stop = sub.add_parser("stop", help="stop the nodes started by `start` and delete their data")
    p_stop.add_argument("--timeout", type=float, default=20.0, help="seconds before SIGKILL")
    sub.add_parser("status", help="show whether the nodes run and answer")
    for p in sub.choices.values():
        p.add_argument(
            "--libs-dir", help=f"jar cache (default ${LIBS_DIR_ENV} or {DEFAULT_LIBS_DIR})"
        )
        # Where `start` records its nodes for `stop` and `status`; tests use their own.
        p.add_argument("--state-file", default=str(DEFAULT_STATE_FILE), help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    maven_args = [a for a in unknown if a.startswith("-D")]
    stray = [a for a in unknown if not a.startswith("-D")]
    if stray or (maven_args and args.command != "fetch"):
        parser.print_usage(sys.stderr)
        print(f"unrecognised arguments: {' '.join(unknown)}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "fetch":
            return _cmd_fetch(args, maven_args)
        if args.command in ("start", "start-cluster"):
            return _cmd_start(args, int(args.nodes))
        if args.command == "stop":
            return _cmd_stop(args)
        return _cmd_status(args)
    except LocalKafkaError as exc:
        print_error(str(exc))
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
