"""The stream layer, one package per layer (docs/architecture.md; tests/test_structure.py
checks what each imports):

- `model`: configuration, wire formats, state, the operator, the bounding stage's rules
  and the commit protocol; pure (no Kafka client, no Faust, no RocksDB);
- `kafka`: the confluent-kafka clients (configuration, topic helpers, the producer,
  ingest), on the model;
- `worker`: the worker process on Faust, the only package importing faust, aiokafka,
  rocksdict or mode;
- `replay`: the audit, on the model and the Kafka clients, never the worker.
"""
