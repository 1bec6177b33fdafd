"""The demo overlay: what the demo knows and the processor never publishes, handed to the
view through a local file (never through a topic).

The demo (`processor.devtools.demo`) computes its own true count per counter from the
events it produced, and counts the dead letters by reason from the (private) dead-letter
topic. It writes them to a file of mode 0600 in its own run directory with `write_overlay`;
`python -m processor view --demo-file F` reads it with `OverlayFile` and shows it next to
the public data, labelled as the demo's. Outside demo mode there is no such file and the
page shows public data only.

Format (JSON object, every field optional):
  truth         {counter: [[tick, true count], ...]}  a step function, the ticks where it changed
  dead_letters  {reason: number of records}
  produced      {"events": n, "bad": n}               what the demo has produced so far
  note          a line of text the page shows above the charts
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import orjson


def write_overlay(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Replace `path` with `data` in one rename (a reader never sees half a file);
    mode 0600: the true counts are as private as the input."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(orjson.dumps(data))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class OverlayFile:
    """Reads the overlay file again only when it changed; `version` names the content."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._version = 0  # a small counter: the page compares it in JavaScript
        self._stamp: tuple[int, int] | None = None
        self._data: dict[str, Any] | None = None

    def read(self) -> tuple[int, dict[str, Any] | None]:
        """(version, content); version 0 and None while the file is missing or unreadable."""
        try:
            st = self.path.stat()
        except OSError:
            return 0, None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                data = orjson.loads(self.path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                return self._version, self._data
            self._stamp = stamp
            if type(data) is dict:
                self._version, self._data = self._version + 1, data
        return self._version, self._data
