"""The stream layer's Kafka clients on confluent-kafka alone: client configuration and
topic helpers, the worker's librdkafka producer, and the ingest stage. Imports the model,
never Faust, aiokafka or RocksDB (tests/test_structure.py)."""
