"""Async HTTP client for a vLLM OpenAI-compatible server (only what kvctl reads or calls)."""

from __future__ import annotations

from typing import Any

import httpx
from packaging.version import Version

from kvctl.errors import KvctlError
from kvctl.versions import version_from_server_payload

DEFAULT_TIMEOUT = 10.0


class ServerError(KvctlError):
    """A vLLM server could not be reached or answered something unusable."""


class VllmClient:
    def __init__(self, base_url: str, timeout: float = DEFAULT_TIMEOUT,
                 client: httpx.AsyncClient | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = client or httpx.AsyncClient(timeout=timeout)
        self._owns_client = client is None

    async def __aenter__(self) -> VllmClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def _get_json(self, path: str, **params: Any) -> Any:
        url = f"{self.base_url}{path}"
        try:
            response = await self._client.get(url, params=params or None)
        except httpx.HTTPError as exc:
            raise ServerError(f"{url}: {type(exc).__name__}: {exc}".rstrip(": "),
                              "check the URL and that the server is up (kvctl status)") from None
        if response.status_code == 404 and path == "/server_info":
            raise ServerError(f"{url}: 404: the server runs without dev mode",
                              "start it with VLLM_SERVER_DEV_MODE=1, or pass --template/--config")
        if response.status_code != 200:
            raise ServerError(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
        try:
            return response.json()
        except ValueError:
            raise ServerError(f"{url}: answer is not JSON: {response.text[:200]!r}") from None

    async def version(self) -> Version:
        """GET /version -> {"version": "0.32.0+cpu"}."""
        return version_from_server_payload(await self._get_json("/version"))

    async def server_info(self) -> dict[str, Any]:
        """GET /server_info?config_format=json (dev mode, 0.13+): the whole vllm_config."""
        return await self._get_json("/server_info", config_format="json")

    async def kv_transfer_config(self) -> dict[str, Any] | None:
        """The kv_transfer_config the server runs with (None: no connector)."""
        info = await self.server_info()
        config = info.get("vllm_config", info) if isinstance(info, dict) else {}
        ktc = config.get("kv_transfer_config") if isinstance(config, dict) else None
        return ktc if isinstance(ktc, dict) else None
