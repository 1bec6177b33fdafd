"""The worker process on Faust: the app and its agents, the state tables on RocksDB and
their recovery, acks, metrics and fencing. The only package of the project that imports
faust, aiokafka, rocksdict or mode (tests/test_structure.py)."""
