"""kvctl's HTTP transport for large fleets: aiohttp (HTTP parsed in C), behind HttpPool's interface.

A fleet reset sends eight calls to each replica; at hundreds of replicas the client's CPU per call
decides how long it takes, and httpcore's pure-Python stack (h11 parsing, anyio) was most of
kvctl's (profiled, docs/performance.md section 2). aiohttp parses responses in C (llhttp) and
runs on asyncio directly. Loaded only for fleets of `FAST_MIN_HOSTS` replicas or more
(kvctl.transport.pool.shared_pool): a small reset and every other command keep httpcore and never
import it.

What stays identical to HttpPool, so VllmClient's retries, timeouts and receipts do not change:
- the same `request()` signature and `HttpResponse`; no answer raises the same TransportError
  with the same kinds (timeout / connect / other);
- the timeout applies to connecting (pool wait included), and to each read, like httpcore's;
- at most `max_connections_per_host` kept-alive connections per host;
- no proxy (trust_env=False: HTTP_PROXY and friends are ignored), no redirects followed, no cookies;
- https with httpx's default context (certifi's CA bundle, SSL_CERT_FILE honoured).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from yarl import URL

from kvctl.transport.http import _USER_AGENT, HttpResponse, TransportError, default_ssl_context, with_query

_HEADERS = {"User-Agent": _USER_AGENT.decode(), "Accept": "*/*"}
_JSON_HEADERS = {**_HEADERS, "Content-Type": "application/json"}
# aiohttp's timeout classes, named as httpcore names the same failure (a receipt reads the same)
_NAMES = {"ConnectionTimeoutError": "ConnectTimeout", "SocketTimeoutError": "ReadTimeout",
          "ServerTimeoutError": "ReadTimeout", "TimeoutError": "ReadTimeout",
          "ClientConnectorError": "ConnectError", "ClientConnectorDNSError": "ConnectError"}


class AioHttpPool:
    """One aiohttp session for every host, created on first use (it needs the running loop)."""

    def __init__(self, max_connections_per_host: int = 4, keepalive: bool = True) -> None:
        self._per_host = max_connections_per_host
        self._keepalive = keepalive  # False: each call closes its connection (http_base.fd_budget)
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    async def request(self, method: str, url: str, *, params: dict[str, Any] | None = None,
                      json: Any = None, headers: dict[str, str] | None = None,
                      timeout: float = 10.0) -> HttpResponse:
        """One request, body read in full. Raises TransportError when no HTTP answer came."""
        url = with_query(url, params)
        head = _HEADERS
        data = None
        if json is not None:
            import json as jsonlib

            data, head = jsonlib.dumps(json).encode(), _JSON_HEADERS
        if headers:
            head = {**head, **headers}
        limits = self._limits(timeout)
        session = self._session or self._open()
        try:
            async with session.request(method, URL(url, encoded=True), data=data, headers=head,
                                       timeout=limits, allow_redirects=False,
                                       ssl=default_ssl_context() if url.startswith("https:") else True) as response:
                return HttpResponse(response.status, await response.read())
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            raise TransportError(_kind(exc), exc, _NAMES.get(type(exc).__name__)) from exc

    @asynccontextmanager
    async def stream(self, method: str, url: str, *, params: dict[str, Any] | None = None,
                     timeout: float = 10.0) -> AsyncIterator[AioStream]:
        """HttpPool.stream's twin: the body read piece by piece (a master's key listing)."""
        url = with_query(url, params)
        session = self._session or self._open()
        try:
            async with session.request(method, URL(url, encoded=True), headers=_HEADERS,
                                       timeout=self._limits(timeout), allow_redirects=False,
                                       ssl=default_ssl_context() if url.startswith("https:") else True) as response:
                yield AioStream(response)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            raise TransportError(_kind(exc), exc, _NAMES.get(type(exc).__name__)) from exc

    def _limits(self, timeout: float) -> aiohttp.ClientTimeout:
        limits = self._timeouts.get(timeout)
        if limits is None:
            limits = self._timeouts[timeout] = aiohttp.ClientTimeout(
                total=None, connect=timeout, sock_connect=timeout, sock_read=timeout)
        return limits

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=self._per_host, ttl_dns_cache=None,
                                         force_close=not self._keepalive)
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False,
                                              cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def __aenter__(self) -> AioHttpPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AioStream:
    """http.HttpStream's twin over an aiohttp response: status, then the body in chunks."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.status = response.status
        self._response = response

    def chunks(self) -> AsyncIterator[bytes]:
        return self._response.content.iter_any()

    async def head(self, limit: int) -> bytes:
        return await self._response.content.read(limit)


def _kind(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):  # aiohttp's timeout errors derive from it
        return "timeout"
    if isinstance(exc, (aiohttp.ClientConnectorError, ConnectionRefusedError)):
        return "connect"
    return "other"


__all__ = ["AioHttpPool"]
