"""The part every kvctl HTTP client shares: an httpx.AsyncClient it owns or borrows."""

from __future__ import annotations

from typing import TypeVar

import httpx

C = TypeVar("C", bound="HttpClientBase")


class HttpClientBase:
    """Owns an httpx.AsyncClient unless one is passed in (a fleet shares one pool); async context manager."""

    def __init__(self, timeout: float, client: httpx.AsyncClient | None = None) -> None:
        self._client = client or httpx.AsyncClient(timeout=timeout)
        self._owns_client = client is None

    async def __aenter__(self: C) -> C:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()
