"""`python -m processor keygen`: write a fresh random noise key file (mode 0600)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from processor.commandline import CommandParser
from processor.errors import print_error


def cmd_keygen(argv: Sequence[str], stdout: TextIO, stderr: TextIO) -> int:
    p = CommandParser(prog="python -m processor keygen", allow_abbrev=False,
                      description="Write a fresh 256-bit noise key as hex (mode 0600). "
                      "Missing directories of the path are created with mode 0700.")
    p.add_argument("path", help="the key file to write (mode 0600; e.g. secrets/noise.key, "
                   "a directory the repository's .gitignore excludes)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    args = p.parse_args(argv)
    from processor.keyfile import make_private_dirs, write_key

    try:
        # The README's `keygen secrets/noise.key` on a fresh clone: the directory is
        # created, private to its owner like the key inside it.
        make_private_dirs(Path(args.path).parent)
        write_key(args.path, overwrite=args.force)
    except FileExistsError:
        print_error(f"{args.path!r} exists (use --force to overwrite)", stderr)
        return 2
    except OSError as exc:
        print_error(f"cannot write {args.path!r}: {exc.strerror}", stderr)
        return 2
    print(f"wrote a new noise key to {args.path}", file=stdout)
    return 0



def main_keygen(argv: Sequence[str]) -> int:
    return cmd_keygen(argv, sys.stdout, sys.stderr)

