#!/usr/bin/env python3
"""Regenerate processor/_help.py, the cached `--help` text of every command
(processor.commands.main.write_help_module). Run after changing any command's options:

    .venv/bin/python deploy/update_help.py

tests/test_cli.py fails while the cache differs from the parsers.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from processor.commands.main import write_help_module

if __name__ == "__main__":
    print(f"wrote {write_help_module()}")
