"""kvctl's async HTTP layer: one small httpcore connection pool per host, behind one `request`.

Why httpcore rather than httpx's client: a fleet reset sends about seven calls to each of up to
thousands of replicas, and httpx's client layer (URL model, cookies, auth, redirects, hooks) was
~40% of kvctl's CPU per call at 1024 replicas (profiled; benchmarks/fanout.py). kvctl needs none
of it: GET/POST, query parameters, JSON. httpcore is httpx's own transport, so connection
handling, timeouts and TLS are the same.

One pool per host, not one for all: httpcore scans a pool's idle connections on every request,
which is quadratic across a fleet. Proxy variables (HTTP_PROXY, ...) are not used: kvctl talks to
its replicas and masters directly, and their admin routes should never go through a proxy.
"""

from __future__ import annotations

import json as jsonlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode, urlsplit

import httpcore

from kvctl._version import __version__

C = TypeVar("C", bound="HttpClientBase")


ErrorKind = Literal["timeout", "connect", "other"]


_USER_AGENT = f"kvctl/{__version__}".encode()


# httpcore's failures that mean "no usable HTTP answer" (httpx calls these TransportError)
_TRANSPORT_ERRORS = (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
                     httpcore.UnsupportedProtocol, httpcore.ProxyError, OSError)


@dataclass(frozen=True)
class HttpResponse:
    status: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not."""
        return jsonlib.loads(self.content)


class HttpStream:
    """A response being read (HttpPool.stream): its status, then its body in chunks."""

    def __init__(self, response: httpcore.Response) -> None:
        self.status = response.status
        self._response = response

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's chunks as they arrive (the socket's reads: ~64 KiB each)."""
        return self._response.aiter_stream()  # type: ignore[return-value]

    async def head(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body (an error answer's message); the rest is not read."""
        got = b""
        async for chunk in self.chunks():
            got += chunk
            if len(got) >= limit:
                break
        return got[:limit]


class TransportError(Exception):
    """No HTTP answer: refused, unreachable, timed out, or the connection broke mid-call."""

    def __init__(self, kind: ErrorKind, cause: BaseException, name: str | None = None) -> None:
        detail = str(cause)
        name = name or type(cause).__name__  # the large-fleet transport names causes as httpcore does
        super().__init__(f"{name}: {detail}" if detail else name)
        self.kind = kind
        self.cause_name = name
        self.detail = detail


class HttpPool:
    """Connection pools by host (scheme, host, port), created on first use; close with `aclose`."""

    def __init__(self, max_connections_per_host: int = 4, keepalive: bool = True) -> None:
        self._per_host = max_connections_per_host
        self._keepalive = keepalive  # False: each call closes its connection (see fd_budget)
        self._pools: dict[tuple[str, str, int | None], httpcore.AsyncConnectionPool] = {}

    async def request(self, method: str, url: str, *, params: dict[str, Any] | None = None,
                      json: Any = None, headers: dict[str, str] | None = None,
                      timeout: float = 10.0) -> HttpResponse:
        """One request, body read in full. Raises TransportError when no HTTP answer came."""
        url = with_query(url, params)
        head = [(b"User-Agent", _USER_AGENT), (b"Accept", b"*/*")]
        head += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
        content = b""
        if json is not None:
            content = jsonlib.dumps(json).encode()
            head += [(b"Content-Type", b"application/json")]
        if method != "GET":
            head.append((b"Content-Length", str(len(content)).encode()))
        limits = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        try:
            response = await self._pool(url).request(method, url, headers=head, content=content,
                                                     extensions={"timeout": limits})
        except _TRANSPORT_ERRORS as exc:
            raise TransportError(_kind(exc), exc) from exc
        return HttpResponse(response.status, response.content)

    @asynccontextmanager
    async def stream(self, method: str, url: str, *, params: dict[str, Any] | None = None,
                     timeout: float = 10.0) -> AsyncIterator[HttpStream]:
        """One request whose body is read piece by piece (`HttpStream.chunks`), never held whole: a
        master's listing of millions of keys. `timeout` bounds the connect and each read, not the whole
        body. Raises TransportError when no HTTP answer came or the body broke off."""
        url = with_query(url, params)
        head = [(b"User-Agent", _USER_AGENT), (b"Accept", b"*/*")]
        limits = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        try:
            async with self._pool(url).stream(method, url, headers=head,
                                              extensions={"timeout": limits}) as response:
                yield HttpStream(response)
        except _TRANSPORT_ERRORS as exc:
            raise TransportError(_kind(exc), exc) from exc

    def _pool(self, url: str) -> httpcore.AsyncConnectionPool:
        parts = urlsplit(url)
        key = (parts.scheme, parts.hostname or "", parts.port)
        pool = self._pools.get(key)
        if pool is None:
            ssl = default_ssl_context() if parts.scheme == "https" else None
            pool = self._pools[key] = httpcore.AsyncConnectionPool(
                ssl_context=ssl, max_connections=self._per_host,
                max_keepalive_connections=self._per_host if self._keepalive else 0)
        return pool

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()

    async def __aenter__(self) -> HttpPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class HttpClientBase:
    """Owns an HttpPool unless one is passed in (a fleet operation shares one); async context manager."""

    def __init__(self, pool: HttpPool | None = None) -> None:
        self._http = pool or HttpPool()
        self._owns_pool = pool is None

    async def __aenter__(self: C) -> C:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_pool:
            await self._http.aclose()


def _kind(exc: BaseException) -> ErrorKind:
    if isinstance(exc, httpcore.TimeoutException):
        return "timeout"
    if isinstance(exc, (httpcore.ConnectError, ConnectionError)):
        return "connect"
    return "other"


def default_ssl_context() -> Any:
    """httpx's default context (certifi's CA bundle; SSL_CERT_FILE / SSL_CERT_DIR honoured), for
    both transports: built on the first https URL (loading the CA bundle costs ~30 ms), again only
    when those variables change."""
    return _ssl_context_for(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@lru_cache(maxsize=4)
def _ssl_context_for(cert_file: str | None, cert_dir: str | None) -> Any:
    import httpx  # it reads the variables itself; they are this cache's key

    return httpx.create_ssl_context()


def with_query(url: str, params: dict[str, Any] | None) -> str:
    """`url` with `params` appended as its query (after any query it already has)."""
    if not params:
        return url
    return f"{url}{'&' if '?' in url else '?'}{urlencode(_query_values(params))}"


def _query_values(params: dict[str, Any]) -> dict[str, str]:
    """Booleans as vLLM's FastAPI routes expect them (true/false), everything else as str."""
    return {k: ("true" if v is True else "false" if v is False else str(v)) for k, v in params.items()}


__all__ = ["HttpClientBase", "HttpPool", "HttpResponse", "HttpStream", "TransportError"]
