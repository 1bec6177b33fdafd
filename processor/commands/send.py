"""`python -m processor send --config F [FILE ...]`: put events on the input topic.

One event a line, from the files named or standard input: a JSON object as the input
schema has it (schemas/input-event.schema.json), or the short form
`counter[,ts[,value[,user]]]` (ts missing or empty: the wall clock when the line is read;
value missing: 1). Blank lines and lines starting with `#` are skipped. Each event is
checked exactly as ingest checks it (processor.stream.model.records.parse_input, the one
place of that rule) and sent only when it passes; a line that fails is reported on
stderr with its reason and line number, never sent. Lines are sent as they are read, so
a slow pipe (`while ...; do echo signups; sleep 1; done | ... send`) sends in step.
At the end one line on stdout says what was sent where; exit code 0 when every line was
sent, 1 when a line was refused, 2 on an error (the configuration, the brokers, an input
topic that does not exist).
"""

from __future__ import annotations

import sys
import time
from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import orjson

from processor.commandline import CommandParser
from processor.errors import print_error

if TYPE_CHECKING:
    from confluent_kafka import Producer

    from processor.stream.model.config import Settings

#: How long `send` waits for the brokers to answer before it says they do not.
PROBE_S = 5.0


def event_json(line: str, now_ms: int) -> bytes:
    """The input record of one line: a JSON object as it is, the short form
    `counter[,ts[,value[,user]]]` as the object it stands for (digits: ts in epoch ms,
    else an ISO-8601 string; a value that is no number is passed on as text, so the
    schema check names it)."""
    if line.startswith("{"):
        return line.encode("utf-8")
    fields = [f.strip() for f in line.split(",")]
    if len(fields) > 4:
        fields = [line]  # more commas than fields: the counter check refuses it whole
    obj: dict[str, Any] = {"counter": fields[0]}
    ts = fields[1] if len(fields) > 1 else ""
    obj["ts"] = now_ms if not ts else int(ts) if ts.isdigit() else ts
    if len(fields) > 2 and fields[2]:
        try:
            obj["value"] = float(fields[2]) if any(c in fields[2] for c in ".eE") \
                else int(fields[2])
        except ValueError:
            obj["value"] = fields[2]
    if len(fields) > 3 and fields[3]:
        obj["user"] = fields[3]
    return orjson.dumps(obj)


def _lines(paths: Sequence[str], stdin: TextIO) -> Iterator[tuple[str, int, str]]:
    """(source, line number, line) of each file in turn (`-` or none: standard input)."""
    for path in paths or ["-"]:
        if path == "-":
            yield from (("stdin", n, line) for n, line in enumerate(stdin, 1))
            continue
        with Path(path).open(encoding="utf-8") as f:
            yield from ((path, n, line) for n, line in enumerate(f, 1))


def send(lines: Iterable[tuple[str, int, str]], settings: Settings, producer: Producer,
         stderr: TextIO) -> tuple[Tally[str], int, list[str]]:
    """Check and produce each line; (events sent per counter, lines refused, delivery
    errors). Nothing is sent for a refused line."""
    from processor.stream.kafka.kafka_io import produce_waiting
    from processor.stream.model.records import Rejection, parse_input

    sent: Tally[str] = Tally()
    refused = 0
    failed: list[str] = []
    topic = settings.topics.input

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    for source, number, text in lines:
        line = text.strip()
        if not line or line.startswith("#"):
            continue
        now_ms = int(time.time() * 1000)
        raw = event_json(line, now_ms)
        checked = parse_input(raw, settings, now_ms)
        if isinstance(checked, Rejection):
            refused += 1
            print(f"{source}:{number}: not sent ({checked.reason}): {checked.detail}",
                  file=stderr, flush=True)
            continue
        produce_waiting(producer, topic, value=raw, on_delivery=delivered)
        producer.poll(0)
        sent[checked.counter] += 1
    return sent, refused, failed


def _topic_appears(conf: dict[str, str], topic: str, wait_s: float) -> bool:
    """Whether `topic` exists, waiting up to `wait_s` for it (the README starts the worker
    in the background and sends at once: the worker creates the topics within seconds).
    One line on stderr says what it waits for."""
    from processor.stream.kafka import kafka_io

    deadline = time.monotonic() + wait_s
    said = False
    while kafka_io.missing_topics(conf, [topic], PROBE_S):
        if time.monotonic() >= deadline:
            return False
        if not said:
            print(f"waiting up to {wait_s:g} s for the input topic {topic!r} (the worker "
                  "creates it)...", file=sys.stderr, flush=True)
            said = True
        time.sleep(0.5)
    return True


def main_send(argv: Sequence[str]) -> int:
    p = CommandParser(prog="python -m processor send",
                      description="Send events to the input topic: one a line, a JSON object "
                      "or counter[,ts[,value[,user]]] (ts empty: now; value empty: 1), each "
                      "checked as the worker checks it; refused lines are reported, not sent. "
                      "Exit 0: all sent; 1: a line was refused; 2: an error.")
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="files of events, one a line (default, or -: standard input)")
    p.add_argument("--config", help="TOML configuration (DPC_* environment overrides apply)")
    p.add_argument("--wait", type=float, default=30.0,
                   help="seconds to wait for the input topic to exist (a worker started just "
                   "before creates it; default 30)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds to wait for the brokers to acknowledge the events at the "
                   "end (default 30)")
    args = p.parse_args(list(argv))
    from processor.stream.kafka import kafka_io
    from processor.stream.model.config import load_settings

    settings = load_settings(args.config)
    conf = {**kafka_io.base_config(settings), "log_level": "0"}
    kafka_io.require_brokers(conf, PROBE_S)
    topic = settings.topics.input
    if not _topic_appears(conf, topic, args.wait):
        print_error(f"the input topic {topic!r} does not exist at "
                    f"{settings.bootstrap_servers} (waited {args.wait:g} s): start the "
                    "worker first (it creates the topics), or check [topics] input")
        return 2
    for path in args.files:
        if path != "-" and not Path(path).is_file():
            print_error(f"{path!r} is not a readable file")
            return 2
    producer = kafka_io.make_producer(conf)
    sent, refused, failed = send(_lines(args.files, sys.stdin), settings, producer,
                                 sys.stderr)
    unsent = producer.flush(args.timeout)
    if unsent or failed:
        print_error(f"{unsent} event(s) not acknowledged by {settings.bootstrap_servers} "
                    f"within {args.timeout:g} s"
                    + (f" ({failed[0]})" if failed else ""))
        return 2
    by_counter = ", ".join(f"{c} {n}" for c, n in sorted(sent.items())) or "none"
    print(f"sent {sum(sent.values())} event(s) to {topic!r} at {settings.bootstrap_servers} "
          f"({by_counter}); {refused} line(s) refused", flush=True)
    return 1 if refused else 0
