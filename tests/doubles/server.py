"""What every HTTP test double shares: :class:`DoubleServer` and the small HTTP/Prometheus helpers.

:class:`DoubleServer` keeps a double's call log, its :class:`~tests.doubles.faults.Faults` and its
port once a :class:`~tests.doubles.fleet.DoubleFleet` started it. Part of :mod:`tests.doubles`
(see its docstring); imports nothing from ``kvctl``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web

from .faults import Call, Faults

LOOPBACK = "127.0.0.1"


# --------------------------------------------------------------------------------------------
# Common server plumbing
# --------------------------------------------------------------------------------------------
Handler = Callable[[web.Request, Call], Awaitable[web.StreamResponse]]


class DoubleServer:
    """What every double shares: the call log, faults, its port once started."""

    kind = "server"

    def __init__(self, faults: Faults | None, name: str | None) -> None:
        self.name = name
        self.calls: list[Call] = []
        self.port: int | None = None
        self._fleet: object | None = None
        self._refuse_hook: Callable[[], None] | None = None
        self._faults = Faults()
        self.faults = faults if faults is not None else Faults()

    # -- faults -------------------------------------------------------------------------------
    @property
    def faults(self) -> Faults:
        return self._faults

    @faults.setter
    def faults(self, faults: Faults) -> None:
        object.__setattr__(faults, "_on_refuse", self._fire_refuse)
        self._faults = faults
        if faults.refuse:
            self._fire_refuse()

    def _fire_refuse(self) -> None:
        if self._refuse_hook is not None:
            self._refuse_hook()

    # -- addresses -----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError(f"{self!r} is not started (add it to a DoubleFleet)")
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def address(self) -> str:
        """``"127.0.0.1:PORT"``."""
        if self.port is None:
            raise RuntimeError(f"{self!r} is not started (add it to a DoubleFleet)")
        return f"{LOOPBACK}:{self.port}"

    # -- call log helpers ---------------------------------------------------------------------
    def calls_to(self, path: str, method: str | None = None) -> list[Call]:
        return [c for c in list(self.calls)
                if c.path == path and (method is None or c.method == method)]

    def call_paths(self) -> list[str]:
        """The paths called, in order (handy for asserting pause -> reset -> resume)."""
        return [c.path for c in list(self.calls)]

    # -- request entry point ------------------------------------------------------------------
    async def _serve(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        call = Call(request.method, request.path,
                    {k: v for k, v in request.query.items()}, time.monotonic(), body)
        self.calls.append(call)
        faults = self.faults
        if faults.refuse:   # raced with the refuse: behave like a dead peer
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=500)
        delay = faults.delay_for(request.path)
        if delay > 0:
            await asyncio.sleep(delay)
        status = faults.status_for(request.path)
        if status:
            return self._fault_response(status)
        if faults.take_failure(request.path):
            return self._fault_response(500)
        return await self._route(request, call)

    def _fault_response(self, status: int) -> web.Response:
        raise NotImplementedError

    async def _route(self, request: web.Request, call: Call) -> web.StreamResponse:
        raise NotImplementedError


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _prom_float(value: float) -> str:
    """Format a sample value the way prometheus_client does (Go-style exponents)."""
    value = float(value)
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _prom_labels(labels: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return "{" + ",".join(f'{k}="{esc(str(v))}"' for k, v in sorted(labels.items())) + "}"
