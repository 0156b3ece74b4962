"""Which transport a fleet operation uses, and how many of its calls run at once.

A fleet of FAST_MIN_HOSTS or more replicas goes through aiohttp (kvctl.transport.aio), a smaller one
through httpcore (kvctl.transport.http); both speak the same `request()` / `TransportError`
interface. The open-file budget (`fd_budget`) decides whether connections are kept alive between
calls and caps the concurrency, so that a large fleet never runs out of files.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from kvctl.transport.http import HttpPool

# From this many replicas on, a fleet operation sends through aiohttp (kvctl/transport/aio.py: HTTP parsed
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
            from kvctl.transport.aio import AioHttpPool
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


__all__ = ["HttpPool", "fd_budget", "max_concurrency", "new_pool", "shared_pool"]
