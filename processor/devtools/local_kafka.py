"""Compatibility re-export: the local broker lives in the package processor.devtools.kafka.

Kept only for bench/bench_stream.py, which another change edits at the same time and which
imports `LocalKafka` and `free_port` from here; once its two imports read
`processor.devtools.kafka.cluster` and `processor.devtools.kafka.tools`, delete this file.
Nothing else may import it.
"""

from processor.devtools.kafka.cluster import LocalKafka
from processor.devtools.kafka.tools import free_port

__all__ = ["LocalKafka", "free_port"]
