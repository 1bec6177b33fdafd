"""Command line: `python -m processor <command>`.

count       run a mechanism offline over a file of ticks (one JSON line per tick)
keygen      write a fresh random noise key file
worker      run the Faust stream processor
replay      recompute the private-count stream from the timeline topic and compare
demo        local broker + processor + bursty demo producer, private counts printed
experiment  the paper's Section 8 experiments (figures and table)
audit       empirical privacy audit of a mechanism on edit-neighbouring streams
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from importlib import import_module
from pathlib import Path
from typing import TextIO

import orjson

from processor.core.errors import CoreError, NoiseKeyError
from processor.core.rng import KEY_FORMATS, NoiseKey

# Subcommands that live in other modules; imported only when used, so `count` stays light.
_DELEGATED: dict[str, tuple[str, str]] = {
    "worker": ("processor.stream.app", "main_worker"),
    "replay": ("processor.stream.replay", "main_replay"),
    "demo": ("processor.devtools.demo", "main_demo"),
    "experiment": ("processor.experiments.cli", "main_experiment"),
    "audit": ("processor.audit_cli", "main_audit"),
}


def _count_parser() -> argparse.ArgumentParser:
    from processor.core import registry

    p = argparse.ArgumentParser(
        prog="python -m processor count",
        description="Run a private counter over ticks read one per line: a number in [0, 1], "
        "_ for a tick with no event, _*N for N such ticks. Writes {\"t\": t, \"y\": y} per tick.",
    )
    p.add_argument("--mechanism", required=True, choices=registry.names())
    p.add_argument("--epsilon", type=float, required=True)
    p.add_argument("--delta", type=float, required=True)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--key-file", help="the secret noise key (production generator)")
    src.add_argument("--seed", type=int, help="a public, reproducible key (tests, experiments)")
    p.add_argument("--key-format", choices=KEY_FORMATS, default="hex",
                   help="how --key-file is read: hex (default, what keygen writes) or raw")
    p.add_argument("--input", help="tick file (default: standard input)")
    p.add_argument("--changes", action="store_true",
                   help="print only the ticks where y changes, plus the last tick")
    p.add_argument("--counter-id", default="offline",
                   help="the counter identity the noise stream is keyed by (default: offline)")
    p.add_argument("--horizon", type=int, help="stream length T (partitioncc needs it)")
    p.add_argument("--base", choices=("tree", "sqrt"), help="basecc's bounded counter")
    return p


def cmd_count(argv: Sequence[str], stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    args = _count_parser().parse_args(argv)
    from processor.core import registry
    from processor.offline import TickSyntaxError, parse_ticks, run_counter

    try:
        key = (NoiseKey.from_file(args.key_file, args.key_format) if args.key_file
               else NoiseKey.from_seed(args.seed))
        params: dict[str, object] = {}
        if args.horizon is not None:
            params["horizon"] = args.horizon
        if args.base is not None:
            params["base"] = args.base
        counter = registry.make(args.mechanism, args.epsilon, args.delta, key, args.counter_id,
                                **params)
    except (CoreError, TypeError) as exc:
        print(f"error: {exc}", file=stderr)
        return 2
    try:
        source = open(args.input, encoding="utf-8") if args.input else stdin  # noqa: SIM115
    except OSError as exc:
        print(f"error: cannot read {args.input!r}: {exc.strerror}", file=stderr)
        return 2
    try:
        out = []
        for t, y in run_counter(counter, parse_ticks(source), changes_only=args.changes):
            out.append(orjson.dumps({"t": t, "y": y}))
            if len(out) >= 4096:
                stdout.write(b"\n".join(out).decode() + "\n")
                out.clear()
        if out:
            stdout.write(b"\n".join(out).decode() + "\n")
    except TickSyntaxError as exc:
        if out:
            stdout.write(b"\n".join(out).decode() + "\n")
        print(f"error: {exc}", file=stderr)
        return 2
    finally:
        if source is not stdin:
            source.close()
    return 0


def write_key(path: str | os.PathLike[str], secret: bytes | None = None, *,
              overwrite: bool = True) -> Path:
    """Write a noise key file as `NoiseKey.from_file` reads it: hex text, mode 0600.

    The one key writer (`keygen`, the demo, the tests and the benchmarks). A fresh random
    key unless `secret` is given. The file is mode 0600 whatever existed before: an existing
    file is never truncated in place (it would keep its old, maybe world-readable, mode);
    the key goes to a new 0600 file in the same directory that then replaces it in one
    rename, so a reader sees the old key or the new one, never half of one.
    With `overwrite=False` an existing file raises FileExistsError and is left untouched.
    """
    target = Path(path)
    text = ((NoiseKey.generate() if secret is None else secret).hex() + "\n").encode("ascii")
    if not overwrite:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        _write_private(fd, text)
        return target
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        _write_private(fd, text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _write_private(fd: int, data: bytes) -> None:
    # fchmod: os.open's mode is filtered by the umask; the key file is exactly 0600.
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def cmd_keygen(argv: Sequence[str], stdout: TextIO, stderr: TextIO) -> int:
    p = argparse.ArgumentParser(prog="python -m processor keygen",
                                description="Write a fresh 256-bit noise key as hex (mode 0600).")
    p.add_argument("path")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    args = p.parse_args(argv)
    try:
        write_key(args.path, overwrite=args.force)
    except FileExistsError:
        print(f"error: {args.path!r} exists (use --force to overwrite)", file=stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write {args.path!r}: {exc.strerror}", file=stderr)
        return 2
    print(f"wrote a new noise key to {args.path}", file=stdout)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    cmd, rest = args[0], args[1:]
    try:
        if cmd == "count":
            return cmd_count(rest, sys.stdin, sys.stdout, sys.stderr)
        if cmd == "keygen":
            return cmd_keygen(rest, sys.stdout, sys.stderr)
        if cmd in _DELEGATED:
            module, func = _DELEGATED[cmd]
            entry: Callable[[list[str]], int] = getattr(import_module(module), func)
            return int(entry(rest) or 0)
    except NoiseKeyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    print(f"unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
    return 2
