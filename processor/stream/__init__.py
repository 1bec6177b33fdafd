"""The stream layer: configuration, input validation, the timeline and the operator.

`config`, `records` and `operator` are pure (no Kafka, no Faust) and run the same offline
(replay, tests) and online; only `app` (the Faust wiring) talks to Kafka.
"""
