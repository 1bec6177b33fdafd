"""A loopback TCP proxy that can cut a client off from its brokers, and a LocalKafka whose
brokers advertise it (the campaign's network-partition phase).

`TcpProxy` forwards each of its routes (a listening port on 127.0.0.1 -> a target port on
127.0.0.1) and can fail them the two ways an operator's network does:

- `blackhole()`: nothing moves in either direction, and every connection stays open, as
  behind a partitioned switch or a frozen NIC. The proxy stops reading both sides, so what
  a client writes meanwhile waits in the kernel's socket buffers and arrives when the
  route heals (as TCP's retransmissions would deliver it), and a connection accepted
  meanwhile reaches its target only then;
- `reset()`: every open connection is closed with a RST and new ones are refused (the
  listening sockets are closed) until `heal()`;
- `heal()`: forward again (listening again after a reset).

A Kafka client learns every broker's address from the metadata the broker sends it, so a
proxy in front of the bootstrap address alone would see only the first connection.
`ProxiedKafka` is a `LocalKafka` whose every node has a second listener, PROXIED, bound
to a port of its own and advertised at the proxy's port for that node: a client that
bootstraps through `proxied_bootstrap` is given the proxy's addresses in every metadata
response, so all its connections go through the proxy, while every other client (the
other workers, the campaign's producers and checkers) uses the ordinary listener.
Plaintext only.

The proxy runs its own event loop in a daemon thread; its methods are called from any
other thread and return once the change is in force. Loopback only, no logging of data.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import struct
import threading
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar

from processor.devtools.kafka.cluster import LocalKafka
from processor.devtools.kafka.node import Node
from processor.devtools.kafka.tools import free_port
from processor.errors import ProcessorError

HOST: Final = "127.0.0.1"
#: How much one read moves (Kafka fetch responses are larger; any size works).
CHUNK: Final = 65536

Mode = Literal["forward", "blackhole", "reset"]
T = TypeVar("T")


class ProxyError(ProcessorError, RuntimeError):
    """The proxy could not start (a port taken) or was used after close()."""


@dataclass(eq=False)  # hashed by identity: kept in a set
class _Conn:
    """One proxied connection: the client's and the target's transports."""

    client: asyncio.StreamWriter
    target: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


@dataclass
class ProxyStats:
    """What went through (counts only)."""

    accepted: int = 0
    refused_in_reset: int = 0
    reset_connections: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


class TcpProxy:
    """Forward `routes` (listen port -> target port, both on 127.0.0.1); see the module
    docstring. Use as a context manager, or start() / close()."""

    def __init__(self, routes: Mapping[int, int]) -> None:
        if not routes:
            raise ValueError("a proxy needs at least one route")
        self.routes = dict(routes)
        self.stats = ProxyStats()
        self._mode: Mode = "forward"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.Server] = []
        self._conns: set[_Conn] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._flowing: asyncio.Event | None = None

    @property
    def mode(self) -> Mode:
        return self._mode

    # -- life cycle

    def start(self) -> TcpProxy:
        if self._loop is not None:
            raise ProxyError("proxy already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="tcp-proxy",
                                        daemon=True)
        self._thread.start()
        try:
            self._call(self._start())
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop listening, close every connection, stop the loop."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(30.0)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(30.0)
        loop.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- faults

    def blackhole(self) -> None:
        """Stop forwarding both ways; connections stay open (module docstring)."""
        self._call(self._set_blackhole())

    def reset(self) -> None:
        """RST every connection and refuse new ones until heal()."""
        self._call(self._reset())

    def heal(self) -> None:
        """Forward again (and listen again after a reset)."""
        self._call(self._heal())

    def connections(self) -> int:
        """Connections open through the proxy right now."""
        return self._call(self._count())

    # -- the loop's side

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise ProxyError("proxy not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30.0)

    async def _count(self) -> int:
        return len(self._conns)

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        await self._listen()

    async def _listen(self) -> None:
        for listen, target in self.routes.items():
            try:
                server = await asyncio.start_server(
                    functools.partial(self._handle, target=target), HOST, listen,
                    reuse_address=True)
            except OSError as exc:
                raise ProxyError(f"cannot listen on {HOST}:{listen}: {exc}") from None
            self._servers.append(server)

    async def _unlisten(self) -> None:
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        for server in servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5.0)

    async def _set_blackhole(self) -> None:
        assert self._flowing is not None
        self._mode = "blackhole"
        self._flowing.clear()

    async def _reset(self) -> None:
        assert self._flowing is not None
        self._mode = "reset"
        # Pumps woken later must not forward anything of the old connections.
        self._flowing.clear()
        await self._unlisten()
        for conn in list(self._conns):
            self.stats.reset_connections += 1
            self._abort(conn)

    async def _heal(self) -> None:
        assert self._flowing is not None
        if not self._servers:
            await self._listen()
        self._mode = "forward"
        self._flowing.set()

    async def _shutdown(self) -> None:
        await self._unlisten()
        for conn in list(self._conns):
            self._abort(conn)
        # End every connection handler before the loop stops (one waiting for a heal
        # would otherwise be destroyed pending).
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    def _abort(self, conn: _Conn) -> None:
        for w in (conn.client, conn.target):
            if w is not None:
                _rst(w)
        for t in conn.tasks:
            t.cancel()
        self._conns.discard(conn)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      target: int) -> None:
        assert self._flowing is not None
        me = asyncio.current_task()
        if me is not None:
            self._handlers.add(me)
            me.add_done_callback(self._handlers.discard)
        if self._mode == "reset":  # accepted just before the listener closed
            self.stats.refused_in_reset += 1
            _rst(writer)
            return
        self.stats.accepted += 1
        conn = _Conn(writer)
        self._conns.add(conn)
        try:
            # In a blackhole the connection is open on the client's side but reaches
            # nothing until the route heals (a SYN lost behind a partitioned switch is
            # retried; a connection the client gives up on meanwhile is closed then).
            await self._flowing.wait()
            if conn not in self._conns:
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(HOST, target)
            except OSError:
                self._abort(conn)
                return
            conn.target = up_writer
            if conn not in self._conns:  # reset while connecting
                _rst(up_writer)
                return
            conn.tasks = [asyncio.create_task(self._pump(reader, up_writer, "up")),
                          asyncio.create_task(self._pump(up_reader, writer, "down"))]
            for t in conn.tasks:
                self._handlers.add(t)
                t.add_done_callback(self._handlers.discard)
            await asyncio.wait(conn.tasks, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # Cancelled by close(): end quietly (asyncio's server callback would report
            # a cancelled handler as an error).
            pass
        finally:
            if conn in self._conns:
                self._conns.discard(conn)
                for t in conn.tasks:
                    t.cancel()
                for w in (conn.client, conn.target):
                    if w is not None:
                        w.close()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                    direction: Literal["up", "down"]) -> None:
        assert self._flowing is not None
        try:
            while True:
                # Neither read nor write while blackholed: what the sender writes stays in
                # its socket buffers (then its send blocks), as behind a dead switch.
                await self._flowing.wait()
                data = await src.read(CHUNK)
                if not data:
                    return
                await self._flowing.wait()
                dst.write(data)
                await dst.drain()
                if direction == "up":
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with a RST, not a FIN (SO_LINGER 0), as a reset connection looks."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# ------------------------------------------------------------------ a proxied LocalKafka


#: The proxied listener's name (and its security protocol: PLAINTEXT).
PROXIED_LISTENER: Final = "PROXIED"


class ProxiedKafka(LocalKafka):
    """A plaintext LocalKafka whose nodes also listen on a PROXIED listener, advertised at
    a `TcpProxy` port (module docstring). After start(), `proxy` forwards each node's
    proxy port to its PROXIED port, and a client bootstrapped at `proxied_bootstrap`
    talks to the brokers only through it. stop() closes the proxy too."""

    def __init__(self, nodes: int = 1, **kwargs: Any) -> None:
        if kwargs.get("security", "plaintext") != "plaintext":
            raise ValueError("ProxiedKafka is plaintext only")
        super().__init__(nodes, **kwargs)
        #: node index -> (proxy's listening port, the node's PROXIED port)
        self.proxy_ports: dict[int, tuple[int, int]] = {}
        self.proxy: TcpProxy | None = None

    def _properties(self, node: Node, voters: str) -> str:
        # Called once per node at each start attempt (a retry picks new ports), before the
        # node is launched: the ports are chosen here.
        front, back = free_port(), free_port()
        self.proxy_ports[node.index] = (front, back)
        props: dict[str, str] = {}
        for line in super()._properties(node, voters).splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.partition("=")
                props[k] = v
        props["listeners"] += f",{PROXIED_LISTENER}://{HOST}:{back}"
        props["advertised.listeners"] += f",{PROXIED_LISTENER}://{HOST}:{front}"
        props["listener.security.protocol.map"] += f",{PROXIED_LISTENER}:PLAINTEXT"
        header = f"# Written by processor.devtools.proxy for node {node.index}.\n"
        return header + "".join(f"{k}={v}\n" for k, v in props.items())

    def start(self) -> ProxiedKafka:
        super().start()
        try:
            self.proxy = TcpProxy(dict(self.proxy_ports.values())).start()
        except BaseException:
            super().stop()
            raise
        return self

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None
        super().stop()

    @property
    def proxied_bootstrap(self) -> str:
        """Bootstrap servers of the proxied listeners (through the proxy)."""
        return ",".join(f"{HOST}:{front}" for _i, (front, _b) in sorted(self.proxy_ports.items()))
