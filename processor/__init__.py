"""Differentially private running counts on Kafka, private under the queue shift.

`processor.core` is the pure privacy core (no I/O); `processor.stream` is the Kafka/Faust
layer that only loads state, calls the core and saves state.
"""

__version__ = "0.1.0"
