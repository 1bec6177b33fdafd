"""The stream layer's model: configuration, wire formats, stored state, the operator, the
bounding stage's rules and the one commit protocol. Pure: imports no Kafka client, no
Faust, no RocksDB (tests/test_structure.py), so replay and the tests run it offline."""
