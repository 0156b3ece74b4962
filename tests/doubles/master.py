"""HTTP TEST DOUBLES of the Mooncake master's admin/metrics port: :class:`MasterDouble`, :class:`OldMasterFront`.

Part of :mod:`tests.doubles` (see its docstring); imports nothing from ``kvctl``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .faults import Call, Faults
from .server import LOOPBACK, DoubleServer, _phrase
from .store import SharedStore


# --------------------------------------------------------------------------------------------
# Mooncake master double
# --------------------------------------------------------------------------------------------
class MasterDouble(DoubleServer):
    """TEST DOUBLE of ``mooncake_master``'s admin/metrics HTTP port over a :class:`SharedStore`.

    Routes (payloads as captured from a real 0.3.13 master):
        * ``GET /health`` -> ``{"status": "ok", "role": "leader", "ha_state": "serving",
          "service_ready": true, "leader_address": null, "view_version": null}``
          (503 + ``service_ready: false`` when ``healthy`` is False).
        * ``GET /metrics`` -> Prometheus text, integers without ``.0``: ``master_key_count 3``,
          ``master_allocated_bytes``, ``master_total_capacity_bytes``,
          ``master_active_clients``, ``master_remove_all_requests_total``,
          ``master_remove_all_failures_total``.
        * ``GET /metrics/summary`` -> one text line.
        * ``GET /get_all_keys`` -> one key a line (empty body when empty).
        * ``GET /query_key?key=K`` -> 200 ``{"success": true, "data": [...]}`` or 404
          ``{"success": false, "error_code": -704, "error_message": "OBJECT_NOT_FOUND"}``.
        * ``GET /batch_query_keys?keys=a,b``.
        * ``POST /api/v1/remove_all[?force=true|1]`` -> ``{"success": true, "removed_count": N}``;
          without force, keys under a read lease survive. ``tenant_id`` is ignored unless ``tenants``.
        * ``GET /api/v1/tenant_quotas`` -> 409 ``{"success": false, "error_code": -1011, "error_message":
          "UNAVAILABLE_IN_CURRENT_MODE"}`` (multi-tenancy off), or with ``tenants`` (a master started with
          ``--enable_multi_tenants=true``) 200 ``{"success": true, "data": [{"tenant_id": T, "charged_bytes":
          B, ...}]}``. ``tenants`` maps each tenant other than ``default`` to the keys it holds: as on a real
          0.3.13.post1 master they are counted by ``master_key_count`` but never listed (the listing is the
          default tenant's, the store), and ``remove_all`` with ``tenant_id=T`` removes only T's keys
          (without it, every tenant's).
        * anything else (including ``GET /api/v1/remove_all``) -> 404 text ``404 Not Found``.
    """

    kind = "master"

    def __init__(self, store: SharedStore | None = None, *, faults: Faults | None = None,
                 healthy: bool = True, active_clients: int = 0, name: str | None = None,
                 tenants: dict[str, int] | None = None) -> None:
        super().__init__(faults, name)
        self.store = store if store is not None else SharedStore()
        self.tenants = tenants  # None: multi-tenancy off; else each other tenant's (unlisted) key count
        self.healthy = healthy
        self.active_clients = active_clients
        self.remove_all_requests = 0
        self.remove_all_failures = 0

    def __repr__(self) -> str:
        where = f" {self.address}" if self.port else ""
        return f"MasterDouble({self.name or ''}{where}, {len(self.store)} keys)"

    def _fault_response(self, status: int) -> web.Response:
        return web.Response(status=status, text=f"{status} {_phrase(status)}")

    @staticmethod
    def _not_found() -> web.Response:
        return web.Response(status=404, body=b"404 Not Found")

    async def _route(self, request: web.Request, call: Call) -> web.StreamResponse:
        key = (request.method, request.path)
        if key == ("GET", "/health"):
            return web.json_response({
                "status": "ok", "role": "leader",
                "ha_state": "serving" if self.healthy else "starting",
                "service_ready": self.healthy, "leader_address": None, "view_version": None,
            }, status=200 if self.healthy else 503)
        if key == ("GET", "/metrics"):
            return web.Response(body=self.metrics_text().encode(),
                                headers={"Content-Type": "text/plain; version=0.0.4"})
        if key == ("GET", "/metrics/summary"):
            return web.Response(text=(
                f"role=leader, state=serving, service_ready={str(self.healthy).lower()}, "
                f"master={{Keys: {len(self.store)} (soft-pinned: 0) | "
                f"Clients: {self.active_clients}}}"), content_type="text/plain")
        if key == ("GET", "/get_all_keys"):
            keys = self.store.keys()
            return web.Response(body="".join(f"{k}\n" for k in keys).encode(),
                                headers={"Content-Type": "text/plain; version=0.0.4"})
        if key == ("GET", "/query_key"):
            wanted = call.query.get("key", "")
            if wanted in self.store:
                return web.json_response({"success": True, "data": [self._replica()]})
            return web.json_response({"success": False, "error_code": -704,
                                      "error_message": "OBJECT_NOT_FOUND"}, status=404)
        if key == ("GET", "/batch_query_keys"):
            raw = call.query.get("keys", "")
            keys = [k for k in raw.split(",") if k]
            if not keys:
                return web.json_response({"success": False,
                                          "error": "No keys provided. Use ?keys=key1,key2,..."},
                                         status=400)
            data = {k: ({"ok": True, "values": [self._replica()]} if k in self.store
                        else {"ok": False, "error": "OBJECT_NOT_FOUND"}) for k in keys}
            return web.json_response({"success": True, "data": data})
        if key == ("POST", "/api/v1/remove_all"):
            self.remove_all_requests += 1
            if self.faults.says_success_false(request.path):
                self.remove_all_failures += 1
                return web.json_response({"success": False, "error_code": -1,
                                          "error_message": "INTERNAL_ERROR"})
            force = call.query.get("force", "").lower() in ("true", "1")
            tenant = call.query.get("tenant_id") if self.tenants is not None else None
            removed = 0
            if tenant is None or tenant == "default":
                removed += self.store.remove_all(force=force)
            for name in [t for t in (self.tenants or {}) if tenant is None or t == tenant]:
                removed, self.tenants[name] = removed + self.tenants[name], 0  # type: ignore[index]
            return web.json_response({"success": True, "removed_count": removed})
        if key == ("GET", "/api/v1/tenant_quotas"):
            if self.tenants is None:
                return web.json_response({"success": False, "error_code": -1011,
                                          "error_message": "UNAVAILABLE_IN_CURRENT_MODE"}, status=409)
            held = {"default": len(self.store), **self.tenants}
            return web.json_response({"success": True, "data": [
                {"tenant_id": name, "requested_quota_bytes": 1 << 30, "effective_quota_bytes": 1 << 25,
                 "charged_bytes": n * self.store.bytes_per_key, "admission_closed": False, "over_quota": False,
                 "has_explicit_policy": True} for name, n in sorted(held.items())]})
        return self._not_found()

    def _replica(self) -> dict[str, Any]:
        return {"size_": self.store.bytes_per_key, "buffer_address_": 140732000000000,
                "protocol_": "tcp", "transport_endpoint_": f"{LOOPBACK}:15000"}

    def metrics_text(self) -> str:
        n = len(self.store) + sum((self.tenants or {}).values())  # every tenant's keys, as a real master counts
        rows = [
            ("master_allocated_bytes", "gauge",
             "Total memory bytes currently allocated across all segments",
             n * self.store.bytes_per_key),
            ("master_total_capacity_bytes", "gauge",
             "Total memory capacity across all mounted segments", self.store.capacity_bytes),
            ("master_key_count", "gauge", "Total number of keys managed by the master", n),
            ("master_soft_pin_key_count", "gauge",
             "Total number of soft-pinned keys managed by the master", 0),
            ("master_active_clients", "gauge", "Total number of active clients",
             self.active_clients),
            ("master_remove_all_requests_total", "counter",
             "Total number of Remove all requests received", self.remove_all_requests),
            ("master_remove_all_failures_total", "counter",
             "Total number of failed Remove all requests", self.remove_all_failures),
        ]
        out = []
        for name, kind, doc, value in rows:
            out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name} {int(value)}"]
        return "\n".join(out) + "\n"


class OldMasterFront(DoubleServer):
    """TEST DOUBLE of a ``mooncake_master`` older than 0.3.12.post1, which has no HTTP
    ``remove_all`` (``POST /api/v1/remove_all`` -> 404 ``404 Not Found``, as any unknown route),
    standing in front of a REAL master: every other admin request is forwarded to it, so the keys
    and counts are the real master's. (No old mooncake_master can be installed here.)"""

    kind = "master"

    def __init__(self, real_admin: str, *, name: str | None = None) -> None:
        super().__init__(None, name)
        self.real_admin = real_admin

    async def _route(self, request: web.Request, call: Call) -> web.StreamResponse:
        if request.path == "/api/v1/remove_all":
            return web.Response(status=404, body=b"404 Not Found")
        import aiohttp

        url = f"http://{self.real_admin}{request.path_qs}"
        async with aiohttp.ClientSession(trust_env=False) as session, \
                session.request(request.method, url, data=await request.read()) as answer:
            return web.Response(status=answer.status, body=await answer.read(),
                                content_type=answer.content_type)
