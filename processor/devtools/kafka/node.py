"""One combined broker+controller process: its files, its pid, signals, its log."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from processor.devtools.kafka.tools import error_lines, tail


@dataclass
class Node:
    """One combined broker+controller process and where it lives."""

    index: int
    node_id: int
    port: int
    controller_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    pid: int | None = None  # set when attached to a node started by another process

    @property
    def config_file(self) -> Path:
        return self.directory / "server.properties"

    @property
    def logs_dir(self) -> Path:
        return self.directory / "logs"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def current_pid(self) -> int | None:
        if self.process is not None:
            return self.process.pid
        return self.pid

    def alive(self) -> bool:
        """Whether the node's process is running (and, if attached, really is this node)."""
        if self.process is not None:
            return self.process.poll() is None
        if self.pid is None:
            return False
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            return False
        # Guards against a recycled pid: the process must run this node's config file.
        return b"kafka.Kafka" in cmdline and str(self.config_file).encode() in cmdline

    def send(self, sig: int) -> None:
        pid = self.current_pid()
        if pid is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to end; True when it has."""
        if self.process is not None:
            try:
                self.process.wait(timeout=max(0.0, timeout))
            except subprocess.TimeoutExpired:
                return False
            return True
        deadline = time.monotonic() + timeout
        while self.alive():
            # Not our child, so there is nothing to wait() on: poll /proc until it is gone.
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def log_tail(self, lines: int = 40) -> str:
        """What to show when the node failed: its ERROR/FATAL lines, then the last lines.

        The cause (e.g. "Address already in use") is usually logged long before the last
        lines, which are the shutdown that followed it.
        """
        parts = []
        server_log = self.logs_dir / "server.log"
        errors = error_lines(server_log)
        if errors:
            parts.append(f"--- {server_log} (ERROR / FATAL lines) ---\n{errors}")
        for name in ("server.log", "stdout.log"):
            text = tail(self.logs_dir / name, lines)
            if text:
                parts.append(f"--- {self.logs_dir / name} (last lines) ---\n{text}")
        return "\n".join(parts) or f"(no log in {self.logs_dir})"
