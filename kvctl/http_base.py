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

from kvctl import __version__

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


# From this many replicas on, a fleet operation sends through aiohttp (kvctl/http_aio.py: HTTP parsed
# in C; a reset's CPU per request 154 µs against httpcore's 435 µs at 1024 replicas, measured;
# docs/performance.md section 2). Below it httpcore is faster end to end, because aiohttp's import
# (~70 ms) is not paid: a reset of 8 replicas took 92 ms with httpcore, 160 ms with aiohttp; of 64,
# 245 ms against 203 ms. The env variable overrides it (0: always; the tests run the fan-out tests
# on both transports with it).
FAST_MIN_HOSTS = 32
FAST_MIN_HOSTS_ENV = "KVCTL_FAST_HTTP_MIN_HOSTS"


# Files a fleet operation keeps open besides its connections: stdio, the Python files it still
# imports, a child process's pipes, the master's connection.
FD_MARGIN = 128


def fd_budget(hosts: int) -> int:
    """How many files this process may open, after raising the soft RLIMIT_NOFILE (up to the hard
    limit) to fit one kept-alive connection per host plus FD_MARGIN. A common soft limit is 1024:
    a 1024-replica reset keeps 1024 connections open between its phases and ran out of files."""
    try:
        import resource
    except ImportError:  # not a Unix
        return hosts + FD_MARGIN
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = hosts + FD_MARGIN
    if soft == resource.RLIM_INFINITY:
        return needed
    if soft >= needed:
        return soft
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target


def new_pool(hosts: int = 1) -> HttpPool:
    """The transport for an operation on `hosts` servers: httpcore, or aiohttp for large fleets.
    Connections are kept alive between calls when the file budget has room for one per host;
    otherwise each call closes its own (slower, but the operation never runs out of files: callers
    cap their concurrency with `max_concurrency`)."""
    keepalive = fd_budget(hosts) >= hosts + FD_MARGIN
    threshold = os.environ.get(FAST_MIN_HOSTS_ENV)
    if hosts >= (int(threshold) if threshold and threshold.strip().isdigit() else FAST_MIN_HOSTS):
        try:
            from kvctl.http_aio import AioHttpPool
        except ImportError:  # aiohttp missing or broken: httpcore does the same job, slower
            return HttpPool(keepalive=keepalive)
        return AioHttpPool(keepalive=keepalive)  # type: ignore[return-value]  # the same interface
    return HttpPool(keepalive=keepalive)


def max_concurrency(hosts: int, wanted: int) -> int:
    """`wanted` hosts at once, fewer when the process may not open that many connections."""
    return max(1, min(wanted, fd_budget(hosts) - FD_MARGIN))


@asynccontextmanager
async def shared_pool(pool: HttpPool | None = None, hosts: int = 1) -> AsyncIterator[HttpPool]:
    """The caller's pool when given (left open), else a new one for `hosts` servers, closed on
    exit: a fleet operation shares one pool across all its replicas and the master."""
    if pool is not None:
        yield pool
        return
    async with new_pool(hosts) as own:
        yield own


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


__all__ = ["HttpClientBase", "HttpPool", "HttpResponse", "TransportError", "max_concurrency", "new_pool",
           "shared_pool"]
