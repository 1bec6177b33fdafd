"""The loopback TCP proxy of the network-partition phase (processor/devtools/proxy.py):
forward, blackhole (nothing moves, connections stay open, held data arrives at the heal),
reset (RST, then refused until the heal), heal. Against a local echo server, no Kafka.

Each check is exact; the waits are bounded socket timeouts. Control: the same read that
must time out in a blackhole gets its echo through the forwarding proxy, so a timeout is
the blackhole's doing, not the echo server's.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from processor.devtools.kafka.tools import free_port
from processor.devtools.proxy import ProxyError, TcpProxy

#: How long a read waits to conclude nothing is coming through a blackhole.
QUIET_S = 0.5


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A threaded echo server on 127.0.0.1 (each connection echoes until EOF)."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(data)

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield port
    stop.set()
    t.join(5)
    srv.close()


@pytest.fixture
def proxy(echo_port: int) -> Iterator[TcpProxy]:
    with TcpProxy({free_port(): echo_port}) as p:
        yield p


def _connect(p: TcpProxy) -> socket.socket:
    port = next(iter(p.routes))
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def _echo(s: socket.socket, payload: bytes, timeout: float = 5.0) -> bytes:
    s.settimeout(timeout)
    s.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_forward_then_blackhole_holds_data_until_heal(proxy: TcpProxy) -> None:
    s = _connect(proxy)
    assert _echo(s, b"hello") == b"hello"  # control: the path works
    proxy.blackhole()
    s.sendall(b"held")
    s.settimeout(QUIET_S)
    with pytest.raises(TimeoutError):
        s.recv(100)
    # The connection is still open (no EOF, no reset) and so is a new one.
    late = _connect(proxy)
    late.sendall(b"late")
    late.settimeout(QUIET_S)
    with pytest.raises(TimeoutError):
        late.recv(100)
    assert proxy.connections() == 2
    proxy.heal()
    s.settimeout(5)
    assert s.recv(100) == b"held"  # what was written in the blackhole arrives after it
    late.settimeout(5)
    assert late.recv(100) == b"late"
    assert _echo(s, b"again") == b"again"
    s.close()
    late.close()


def test_reset_closes_connections_and_refuses_until_heal(proxy: TcpProxy) -> None:
    s = _connect(proxy)
    assert _echo(s, b"x") == b"x"
    proxy.reset()
    s.settimeout(5)
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        # A RST: the read fails (or returns EOF and the next send fails).
        if s.recv(10) == b"":
            s.sendall(b"y")
            s.recv(10)
    port = next(iter(proxy.routes))
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    assert proxy.stats.reset_connections == 1
    proxy.heal()
    again = _connect(proxy)
    assert _echo(again, b"back") == b"back"
    again.close()
    s.close()


def test_a_closed_proxy_refuses_calls(echo_port: int) -> None:
    p = TcpProxy({free_port(): echo_port}).start()
    p.close()
    with pytest.raises(ProxyError):
        p.blackhole()


def test_proxied_kafka_advertises_the_proxy_to_clients_that_bootstrap_there(
        local_kafka_available: None) -> None:
    """A client bootstrapped at the proxied listener is told the proxy's address for the
    broker (so all its connections go through it), a client of the ordinary listener the
    broker's own; in a blackhole only the proxied client loses the broker. Control: the
    ordinary client still answers during the blackhole."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from processor.devtools.proxy import ProxiedKafka

    with ProxiedKafka(1, start_timeout=180.0) as kafka:
        assert kafka.proxy is not None
        proxied = AdminClient({"bootstrap.servers": kafka.proxied_bootstrap, "log_level": "0"})
        direct = AdminClient({"bootstrap.servers": kafka.bootstrap_servers, "log_level": "0"})
        via = [f"{b.host}:{b.port}" for b in proxied.list_topics(timeout=30).brokers.values()]
        own = [f"{b.host}:{b.port}" for b in direct.list_topics(timeout=30).brokers.values()]
        assert via == [kafka.proxied_bootstrap] and own == [kafka.bootstrap_servers]
        assert kafka.proxy.stats.bytes_down > 0
        kafka.proxy.blackhole()
        fresh = AdminClient({"bootstrap.servers": kafka.proxied_bootstrap, "log_level": "0"})
        with pytest.raises(KafkaException):
            fresh.list_topics(timeout=3)
        assert direct.list_topics(timeout=30).brokers  # control
        kafka.proxy.heal()
        assert fresh.list_topics(timeout=30).brokers
