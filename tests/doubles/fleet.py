"""Runs the HTTP test doubles on ``127.0.0.1``: :class:`DoubleFleet`.

Part of :mod:`tests.doubles` (see its docstring); imports nothing from ``kvctl``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Iterable
from typing import Any

from aiohttp import web

from .master import MasterDouble
from .server import LOOPBACK, DoubleServer
from .vllm import VllmDouble


# --------------------------------------------------------------------------------------------
# The fleet: one loop thread, one port per server
# --------------------------------------------------------------------------------------------
class DoubleFleet:
    """Runs test doubles on ``127.0.0.1`` (one port each) in one background asyncio thread.

    ::

        store = SharedStore()
        with DoubleFleet(replicas=[VllmDouble(store=store) for _ in range(4)],
                         masters=[MasterDouble(store)]) as fleet:
            fleet.urls               # ["http://127.0.0.1:PORT", ...] in replica order
            fleet.master_addresses   # ["127.0.0.1:PORT", ...]
            url = fleet.add(VllmDouble(version="0.22.0", store=store))

    All servers share one aiohttp application; each port has its own listening socket (bound
    to port 0 by the fleet, so the port is known before listening) and requests are dispatched
    by the socket's local port. ``stop()`` (or leaving the ``with``) closes everything; pending
    slow handlers are cancelled after ``shutdown_timeout`` seconds.
    """

    def __init__(self, replicas: Iterable[VllmDouble] = (),
                 masters: Iterable[MasterDouble] = (), *,
                 shutdown_timeout: float = 0.25) -> None:
        self.replicas: list[VllmDouble] = []
        self.masters: list[MasterDouble] = []
        self._pending_replicas = list(replicas)
        self._pending_masters = list(masters)
        self._shutdown_timeout = shutdown_timeout
        self._servers: dict[int, DoubleServer] = {}
        self._sites: dict[int, web.BaseSite] = {}
        self._held: dict[int, socket.socket] = {}    # ports of refusing servers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> DoubleFleet:
        if self._loop is not None:
            return self
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="double-fleet", daemon=True)
        self._thread.start()
        ready.wait()
        self._call(self._setup())
        replicas, masters = self._pending_replicas, self._pending_masters
        self._pending_replicas, self._pending_masters = [], []
        self._call(self._open_many([*replicas, *masters]))
        self.replicas.extend(replicas)
        self.masters.extend(masters)
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            self._call(self._shutdown(), timeout=30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()
            self._loop = self._thread = self._runner = None
            for server in self._servers.values():
                server._refuse_hook = None
                server._fleet = None
            self._servers.clear()
            self._sites.clear()
            for sock in self._held.values():
                sock.close()
            self._held.clear()

    def __enter__(self) -> DoubleFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- membership -------------------------------------------------------------------------------
    def add(self, replica: VllmDouble) -> str:
        """Start one more replica; returns its URL."""
        self._require_started()
        self._call(self._open_many([replica]))
        self.replicas.append(replica)
        return replica.url

    def add_master(self, master: MasterDouble) -> str:
        """Start one more master; returns its ``127.0.0.1:PORT`` address."""
        self._require_started()
        self._call(self._open_many([master]))
        self.masters.append(master)
        return master.address

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    @property
    def master_addresses(self) -> list[str]:
        return [m.address for m in self.masters]

    @property
    def master_urls(self) -> list[str]:
        return [m.url for m in self.masters]

    def replica_at(self, url: str) -> VllmDouble:
        for replica in self.replicas:
            if replica.url == url.rstrip("/"):
                return replica
        raise KeyError(url)

    # -- internals --------------------------------------------------------------------------------
    def _require_started(self) -> None:
        if self._loop is None:
            raise RuntimeError("DoubleFleet is not started (use `with DoubleFleet(...)`)")

    def _in_loop_thread(self) -> bool:
        return self._thread is not None and threading.get_ident() == self._thread.ident

    def _call(self, coro: Awaitable[Any], timeout: float = 60) -> Any:
        assert self._loop is not None
        if self._in_loop_thread():
            raise RuntimeError("blocking DoubleFleet call from inside its own loop")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        return future.result(timeout)

    async def _setup(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None,
                                     shutdown_timeout=self._shutdown_timeout)
        await self._runner.setup()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        # Handlers whose client already hung up (e.g. a delay fault the client timed out on)
        # are not awaited by aiohttp's shutdown: cancel them so the loop closes cleanly.
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        transport = request.transport
        port = transport.get_extra_info("sockname")[1] if transport is not None else None
        server = self._servers.get(port) if port is not None else None
        if server is None:
            return web.Response(status=404, text="404 Not Found")
        return await server._serve(request)

    async def _open_many(self, servers: list[DoubleServer]) -> None:
        for server in servers:
            if server._fleet is not None:
                raise ValueError(f"{server!r} already runs in a fleet")
            server._fleet = self
        await asyncio.gather(*(self._open(s) for s in servers))

    async def _open(self, server: DoubleServer) -> None:
        assert self._runner is not None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # a server may ask for a fixed port (the fake vLLM interpreter serves on --port)
        sock.bind((LOOPBACK, getattr(server, "requested_port", None) or 0))
        port = sock.getsockname()[1]
        server.port = port
        self._servers[port] = server
        server._refuse_hook = lambda s=server: self._refuse(s)
        if server.faults.refuse:
            self._held[port] = sock    # bound but never listening: connections are refused
            return
        site = web.SockSite(self._runner, sock, backlog=1024)
        await site.start()
        self._sites[port] = site

    def _refuse(self, server: DoubleServer) -> None:
        if self._loop is None or server.port is None:
            return
        if self._in_loop_thread():
            self._loop.create_task(self._close_port(server.port))
        else:
            self._call(self._close_port(server.port), timeout=10)

    async def _close_port(self, port: int) -> None:
        site = self._sites.pop(port, None)
        if site is not None:
            await site.stop()
            # Hold the port (bound, not listening) so nothing else in the fleet can take it:
            # connections keep being refused for as long as the fleet runs.
            holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                holder.bind((LOOPBACK, port))
            except OSError:
                holder.close()
            else:
                self._held[port] = holder
        if self._runner is not None and self._runner.server is not None:
            for handler in self._runner.server.connections:
                transport = handler.transport
                if transport is None:
                    continue
                sockname = transport.get_extra_info("sockname")
                if sockname and sockname[1] == port:
                    transport.abort()
