"""A real Apache Kafka broker on loopback, without Docker: fetch, start, stop, status.

Modules, one job each: ``tools`` (where files live, the errors, tools on PATH, ports, the
child-process wrapper), ``fetch`` (the jars from Maven Central), ``tls`` (a test CA and
the stores of a secured listener), ``node`` (one broker+controller process), ``cluster``
(``LocalKafka``, readiness, client files), ``cli`` (the command line). Import a name from
the module that defines it; this package re-exports nothing.

Development tooling (the demo, the tests and the benchmarks start their brokers with
``LocalKafka``); nothing in the processor's runtime path imports it. The command line is
``python deploy/kafka.py ...`` (a thin wrapper kept where the scripts and docs expect it)
or, equivalently, ``python -m processor.devtools.kafka.cli ...``::

    python deploy/kafka.py fetch           # download the broker jars once (Maven Central)
    python deploy/kafka.py start           # one combined broker+controller node
    python deploy/kafka.py start-cluster   # three nodes, replication factor 3, min ISR 2
    python deploy/kafka.py start --security sasl_ssl   # or mtls: a secured client listener
    python deploy/kafka.py status
    python deploy/kafka.py stop

How it works: ``mvn dependency:copy-dependencies`` on ``deploy/kafka/pom.xml`` copies
``org.apache.kafka:kafka_2.13`` and its runtime dependencies into a cache directory (default
``deploy/.cache/kafka-libs``), which becomes the classpath. Each node gets a properties file
in a fresh temporary directory, its KRaft storage is formatted with
``kafka.tools.StorageTool format``, and ``kafka.Kafka`` runs as one combined
broker+controller process on 127.0.0.1. A node counts as up only when it answers a metadata
request (confluent_kafka AdminClient) that lists every broker of the cluster. Stopping sends
SIGTERM, then SIGKILL after a timeout, and removes the temporary directory.

``LocalKafka(security="sasl_ssl" | "mtls")`` secures the client listener for the tests of
the secured path: a fresh test CA and certificates (``make_tls_files``: PEM for clients,
PKCS12 stores for the broker), SCRAM-SHA-512 users created at format time
(``--add-scram``) or ``ssl.client.auth=required``; ``client_security()`` says how to connect.
The command line's ``start --security MODE`` writes that next to its state file
(``write_client_files``): a librdkafka properties file and the processor's
``bootstrap_servers`` + ``[security]`` as TOML, both mode 0600; ``stop`` removes them.

Only the Python standard library is needed to fetch (``deploy/setup.sh`` may run it with a
bare interpreter); confluent_kafka is imported when a node's readiness is checked. The
pom.xml, the broker's log4j settings and the jar cache live in the checkout's ``deploy/``
directory, so this module works from a source checkout (or an editable install) only.
"""
