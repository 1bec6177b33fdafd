"""The pure privacy core: mechanisms as step operators, no Kafka, no Faust, no I/O."""
