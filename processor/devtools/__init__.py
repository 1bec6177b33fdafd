"""Development tooling: a local Kafka broker, isolated deployments, the demo.

Used by the demo, the tests and the benchmarks; the processor's runtime path (`worker`,
`replay`, the core) never imports anything from here. Importing this package is cheap:
each module imports what it needs itself.
"""
