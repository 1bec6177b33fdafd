"""`python -m processor view --config F [--host H --port P] [--demo-file D]`: the live
view's web server (aiohttp, which Faust already brings).

Routes: `/` the page, `/static/<file>` its script and style (in the package: the page works
offline, no CDN), `/api/meta` the declared counters and topic names, `/api/updates` the
records after the ones the page already has (the page polls it), `/healthz`.

What it serves is public: the records of the private-count and ledger topics (read by
`feed.PublicFeed`, which reads nothing else), the names of the declared counters (the
ledger announces them too) and the two topic names. With `--demo-file` it adds the demo's
overlay (`overlay.py`): the demo's true counts and dead-letter counts, which are NOT
public; only the local demo passes that flag, and the view then listens on loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from processor.commandline import CommandParser
from processor.stream.kafka import kafka_io
from processor.stream.kafka.topics import topic_name
from processor.stream.model.config import ConfigError, Settings, load_settings
from processor.stream.model.logs import configure_logging
from processor.view.feed import PUBLIC_ROLES, FeedLog, PublicFeed
from processor.view.overlay import OverlayFile

STATIC = Path(__file__).resolve().parent / "static"
_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}
_NO_STORE = {"Cache-Control": "no-store"}
_LOOPBACK = ("127.0.0.1", "localhost", "::1")

log = logging.getLogger("processor.view")


def _int_arg(request: web.Request, name: str) -> int:
    try:
        return max(0, int(request.query.get(name, "0")))
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be an integer") from None


class ViewServer:
    """The page, the JSON it polls and the feed behind them; runs in a thread of its own
    (`start` returns once it listens, `stop` closes the server and the consumer)."""

    def __init__(self, settings: Settings, *, host: str = "127.0.0.1", port: int = 8080,
                 demo_file: str | None = None, poll_ms: int = 1000) -> None:
        if demo_file is not None and host not in _LOOPBACK:
            # The overlay is the demo's private knowledge: never on a wider network.
            raise ConfigError("host", "--demo-file needs a loopback --host")
        self.settings = settings
        self.host, self.port = host, port
        self.poll_ms = poll_ms
        self.overlay = OverlayFile(demo_file) if demo_file is not None else None
        topics = {role: topic_name(settings, role) for role in PUBLIC_ROLES}
        self.feed = PublicFeed(kafka_io.base_config(settings), topics, FeedLog())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    # -- routes

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self._index)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/api/meta", self._meta)
        app.router.add_get("/api/updates", self._updates)
        app.router.add_get("/healthz", self._healthz)
        return app

    async def _index(self, _request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html", headers=_NO_STORE)

    async def _static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        path = STATIC / name
        if "/" in name or name.startswith(".") or not path.is_file():
            raise web.HTTPNotFound()
        return web.Response(body=path.read_bytes(), headers=_NO_STORE,
                            content_type=_STATIC_TYPES.get(path.suffix, "text/plain"))

    def meta(self) -> dict[str, Any]:
        s = self.settings
        return {
            "topics": {"counts": s.topics.counts, "ledger": s.topics.ledger},
            "declared": [{"counter": c, "start_ms": start} for c, start in s.counters.items()],
            "demo": self.overlay is not None,
            "poll_ms": self.poll_ms,
        }

    async def _meta(self, _request: web.Request) -> web.StreamResponse:
        return web.json_response(self.meta(), headers=_NO_STORE)

    async def _updates(self, request: web.Request) -> web.StreamResponse:
        body = self.feed.log.since(_int_arg(request, "r"), _int_arg(request, "l"))
        if self.overlay is not None:
            version, data = self.overlay.read()
            body["demo_version"] = version
            if version != _int_arg(request, "d"):
                body["demo"] = data
        return web.json_response(body, headers=_NO_STORE)

    async def _healthz(self, _request: web.Request) -> web.StreamResponse:
        return web.Response(text=f"{self.feed.log.status}\n")

    # -- lifecycle

    def start(self, timeout_s: float = 30.0) -> ViewServer:
        self.feed.start()
        self._thread = threading.Thread(target=self._serve, name="view-http", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError("the view's web server did not start in time")
        if self._error is not None:
            self.feed.stop()
            raise self._error
        return self

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            runner = web.AppRunner(self.app(), access_log=None)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port)
            loop.run_until_complete(site.start())
            self._runner = runner
            server = getattr(site, "_server", None)
            sockets = getattr(server, "sockets", None) or []
            if sockets:  # port 0: the one the system picked
                self.port = int(sockets[0].getsockname()[1])
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(15.0)
        self.feed.stop()

    def __enter__(self) -> ViewServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def build_parser() -> argparse.ArgumentParser:
    """The options of `python -m processor view`."""
    p = CommandParser(
        prog="python -m processor view", allow_abbrev=False,
        description="Serve a web page that plots each counter's private count with its "
        "error band, live. Reads only the public private-count and ledger topics.")
    p.add_argument("--config", help="TOML configuration (DPC_* environment overrides "
                   "apply); only bootstrap_servers, security, topics and counters are used")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 in a container)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any free)")
    p.add_argument("--demo-file", help="the demo's local overlay file (its true counts and "
                   "dead letters; set by `python -m processor demo`, loopback only)")
    p.add_argument("--poll-ms", type=int, default=1000,
                   help="how often the page asks for new records (default 1000)")
    p.add_argument("--loglevel", default="warning", help="log level (default warning)")
    p.add_argument("--broker-timeout", type=float, default=kafka_io.PROBE_TIMEOUT_S,
                   help="seconds to wait at start for the brokers to answer before failing "
                   f"(default {kafka_io.PROBE_TIMEOUT_S:g})")
    return p


def main_view(argv: Sequence[str] | None = None) -> int:
    """`python -m processor view --config F`: serve the live view until SIGINT/SIGTERM."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    configure_logging(args.loglevel)
    # A bad configuration or a port in use raises: the dispatcher (processor.commands.main) makes
    # it one `error:` line and exit 2.
    settings = load_settings(args.config)
    # Brokers that do not answer (or refuse this client) stop the view at its start, as
    # they stop the worker and replay: one `error:` line naming the bootstrap servers and
    # exit 2, rather than a page that shows a raw KafkaError while the view runs on.
    kafka_io.require_brokers({**kafka_io.base_config(settings), "log_level": "0"},
                             args.broker_timeout)
    server = ViewServer(settings, host=args.host, port=args.port,
                        demo_file=args.demo_file, poll_ms=max(100, args.poll_ms))
    # Block the stop signals before any thread starts (threads inherit the mask), so they
    # reach sigwait below and never a KeyboardInterrupt in the middle of a shutdown.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    server.start()
    print(f"view: {server.url} (topics {settings.topics.counts}, {settings.topics.ledger})",
          flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        server.stop()
    return 0
