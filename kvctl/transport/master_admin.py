"""An async admin client for the Mooncake master's HTTP port.

`MasterAdmin` talks to the master's admin/metrics HTTP port (`--metrics_port`, default 9003):
`GET /health`, `GET /metrics` (Prometheus text), `GET /get_all_keys` (one key a line) and
`POST /api/v1/remove_all?force=true` (`{"success": true, "removed_count": N}`). A non-forced
remove_all leaves every key that holds a read lease (`--default_kv_lease_ttl`, 10 s by default),
so a hard reset must always force. The process that runs a master is kvctl.serve.master_process.

Importing this module never imports mooncake (the master is a separate executable) and defers
prometheus_client to the calls that need it: `kvctl reset` stays light.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kvctl.errors import KvctlError
from kvctl.transport.http import HttpClientBase, HttpPool, HttpResponse, TransportError

DEFAULT_TIMEOUT = 5.0
# The least time the calls whose work grows with the keys held may take to answer: a listing (each read)
# and remove_all. The master answers either only when done: 1,000,000 vLLM keys took 3-6 s for
# remove_all and ~3.5 s to list on a loaded 2-core machine (benchmarks/scale.json), so 5,000,000 take
# tens of seconds, far over a reset's 10 s --timeout, which still bounds every other call.
SLOW_TIMEOUT = 120.0
# A listing line longer than this is no key (vLLM's are ~100 bytes): the answer is not a key listing,
# and a server that never sends a newline must not grow kvctl's memory without end.
MAX_KEY_LINE = 1 << 20


_ADMIN_HINT = ("check that the address is the master's admin/metrics port (mooncake_master "
               "--metrics_port, default 9003; not its RPC port 50051) and that the master is running")


class MasterError(KvctlError):
    """The Mooncake master could not be reached, started, stopped, or answered something unusable."""


# --------------------------------------------------------------------------------------------
# Admin client


class NoHttpRemoveAll(MasterError):
    """The master predates the HTTP remove_all (Mooncake 0.3.12.post1): 404."""


class NotLeader(MasterError):
    """HTTP 503 from a data route: in HA mode a standby (or a leader still warming up, or one that
    just lost its lease) refuses with error_code -1011 "service plane is not active"."""


@dataclass(frozen=True)
class HaInfo:
    """What one master says about leadership (GET /health; GET /role where /health has no role).

    Seen on mooncake_master 0.3.13.post1 with --enable_ha and an etcd backend:
    leader  {"status":"ok","role":"leader","ha_state":"serving","service_ready":true,
             "leader_address":"127.0.0.1:50051","view_version":2}   (ha_state "leader_warmup" and
             service_ready false for ~5 s after it wins the election)
    standby {"status":"ok","role":"standby","ha_state":"standby","service_ready":false,
             "leader_address":"127.0.0.1:50051","view_version":2}
    Without HA the same master says role "leader", leader_address and view_version null.
    leader_address is the leader's RPC address (its --rpc_address:--rpc_port), as clients see it.
    """

    role: str | None  # "leader" | "standby" | ...; None: this master has no HA routes
    ha_state: str | None = None
    service_ready: bool | None = None
    leader_rpc: str | None = None
    view_version: int | None = None


@dataclass(frozen=True)
class MasterMetrics:
    """The few master gauges and counters kvctl reads (from `GET /metrics`).

    Fields other than key_count are None when this master version does not export them.
    """

    key_count: int
    allocated_bytes: int | None
    total_capacity_bytes: int | None
    active_clients: int | None
    remove_all_requests_total: int | None


_METRIC_FIELDS = {
    "key_count": "master_key_count",
    "allocated_bytes": "master_allocated_bytes",
    "total_capacity_bytes": "master_total_capacity_bytes",
    "active_clients": "master_active_clients",
    "remove_all_requests_total": "master_remove_all_requests_total",
}


@dataclass(frozen=True)
class Tenancy:
    """Whether a master keeps tenants apart (GET /api/v1/tenant_quotas, Mooncake 0.3.12+), and each
    tenant's charged bytes when it does. Seen on 0.3.13.post1: without --enable_multi_tenants it answers 409
    UNAVAILABLE_IN_CURRENT_MODE and every tenant shares one namespace (GET /get_all_keys lists them all);
    with it, 200 and a list of {tenant_id, charged_bytes, ...}, and /get_all_keys and /query_key see only
    the default tenant while master_key_count counts every tenant's keys."""

    mode: str  # "off" (one namespace) | "on" (tenants isolated) | "unknown"
    charged_bytes: dict[str, int] | None = None  # tenant -> bytes its keys hold (mode "on")
    detail: str = ""


@dataclass(frozen=True)
class KeyCount:
    """One listing's count: every key listed, and those whose name starts with the prefix asked for."""

    total: int
    matching: int  # 0 without a prefix


class KeyCounter:
    """Counts a one-key-a-line listing fed in chunks, never holding more than a chunk and one line.

    The prefix is matched on bytes (its UTF-8), as b"\\n" + prefix at each line start: bytes.count
    runs in C, and the needle cannot overlap itself (its only newline is its first byte). Lines that
    are empty (or only "\\r") are no key, as when the listing was split into strings."""

    def __init__(self, prefix: str | None = None, shape: str | None = None) -> None:
        raw = prefix.encode() if prefix is not None else None
        # None: nothing to match (no prefix, or one with a newline, which no line of the listing has)
        self._needle = None if raw is None or b"\n" in raw else b"\n" + raw
        # `shape`: a regex (^...$) a matching line must also match whole (a deployment's exact key shape,
        # kvctl.facts.cache_prefix.key_pattern); tried only on blocks where the prefix occurs
        self._shape = re.compile(b"(?m)" + shape.encode().replace(b"$", b"\r?$")) if shape else None
        self._carry = b""
        self.total = self.matching = 0

    def feed(self, chunk: bytes) -> None:
        """Count the complete lines in carry + chunk; keep the unfinished last line. ValueError for a
        line over MAX_KEY_LINE bytes."""
        data = self._carry + chunk if self._carry else chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            self._carry = data
        else:
            self._count(data[:cut])
            self._carry = data[cut + 1:]
        if len(self._carry) > MAX_KEY_LINE:
            raise ValueError(f"a line of over {MAX_KEY_LINE} bytes without a newline: not a key listing")

    def result(self) -> KeyCount:
        """The count, with the last line when the listing did not end in a newline."""
        if self._carry:
            self._count(self._carry)
            self._carry = b""
        return KeyCount(self.total, self.matching)

    def _count(self, block: bytes) -> None:
        """`block`: whole lines joined by newlines (the last one's newline cut off)."""
        if block[:1] in (b"\n", b"\r", b"") or block[-1:] == b"\n" or b"\n\n" in block or b"\n\r" in block:
            self._count_lines(block)  # an empty line (or one starting with \r) somewhere: line by line
            return
        self.total += block.count(b"\n") + 1
        if self._needle is not None:
            hits = (b"\n" + block).count(self._needle)
            self.matching += len(self._shape.findall(block)) if hits and self._shape is not None else hits

    def _count_lines(self, block: bytes) -> None:
        needle = None if self._needle is None else self._needle[1:]
        for line in block.split(b"\n"):
            if line.rstrip(b"\r"):
                self.total += 1
                if needle is not None and line.startswith(needle) \
                        and (self._shape is None or self._shape.match(line.rstrip(b"\r"))):
                    self.matching += 1


def admin_base_url(address: str) -> str:
    """`host:port`, `[v6]:port` or a URL -> `http://host:port` (no trailing slash)."""
    address = address.strip()
    if not address:
        raise MasterError("empty Mooncake master address",
                          "pass the master's admin address as host:port, e.g. 127.0.0.1:9003")
    if "://" not in address:
        address = f"http://{address}"
    return address.rstrip("/")


def parse_metrics(text: str) -> MasterMetrics:
    """Parse the master's Prometheus exposition into MasterMetrics (raises ValueError).

    Every field is an unlabeled sample, `name value [timestamp]` in the text format, so they are
    read line by line: prometheus_client's parser would import the whole prometheus_client
    package (its HTTP exposition server included: 20-48 ms) into a reset's master clear."""
    values: dict[str, float] = {}
    wanted = set(_METRIC_FIELDS.values())
    for line in text.splitlines():
        parts = line.split()
        if len(parts) in (2, 3) and parts[0] in wanted:  # comments and labeled samples never match
            values[parts[0]] = float(parts[1])  # a bad number: ValueError, as the parser raised
    if _METRIC_FIELDS["key_count"] not in values:
        raise ValueError("no master_key_count sample")
    return MasterMetrics(**{field: (int(values[name]) if name in values else None)
                            for field, name in _METRIC_FIELDS.items()})


@dataclass(frozen=True)
class PortKind:
    """What answers at an address given as a master's port (`MasterAdmin.port_kind`).

    kind: "admin" (GET /metrics answers Mooncake's master_key_count: the admin/metrics port),
    "not_http" (it accepts a connection but answers no HTTP: the RPC port, whose coro_rpc server
    closes a connection that does not speak its protocol: mooncake_master 0.3.13.post1 at once),
    "other_http" (an HTTP server that is no Mooncake master's admin port, e.g. a vLLM replica), or
    "unreachable" (refused, no answer in time, or an HTTP error status: nothing to judge by)."""

    kind: str
    detail: str = ""


class MasterAdmin(HttpClientBase):
    """Async client for a Mooncake master's admin/metrics HTTP port.

    `address` is `host:port` of that port (or a URL). Pass `pool` to share a kvctl HttpPool
    (then it is not closed by `aclose`). Every failure raises MasterError.
    """

    def __init__(self, address: str, timeout: float = DEFAULT_TIMEOUT,
                 pool: HttpPool | None = None, slow_timeout: float | None = None) -> None:
        self.base_url = admin_base_url(address)
        self.timeout = timeout
        self.slow_timeout = slow_timeout if slow_timeout is not None else max(timeout, SLOW_TIMEOUT)
        super().__init__(pool)

    def __repr__(self) -> str:
        return f"MasterAdmin({self.base_url!r})"

    def _error(self, what: str, hint: str | None = _ADMIN_HINT) -> MasterError:
        return MasterError(f"Mooncake master at {self.base_url}: {what}", hint)

    async def _request(self, method: str, path: str, timeout: float | None = None, **params: Any) -> HttpResponse:
        url = f"{self.base_url}{path}"
        timeout = timeout or self.timeout
        try:
            return await self._http.request(method, url, params=params or None, timeout=timeout)
        except TransportError as exc:
            if exc.kind == "timeout":
                raise self._error(f"{method} {path}: no answer within {timeout:g}s "
                                  f"({exc.cause_name})") from None
            if exc.kind == "other":  # connected, no HTTP answer: most likely the master's RPC port
                raise self._error(f"{method} {path}: answers no HTTP ({exc}): is it the master's RPC port, not "
                                  "its admin port?", "give the master's admin/metrics port (mooncake_master "
                                  "--metrics_port, default 9003) as --master, and the RPC port as --master-rpc") from None
            raise self._error(f"{method} {path}: {exc}") from None

    def _check_status(self, response: HttpResponse, method: str, path: str,
                      hint: str | None = _ADMIN_HINT) -> None:
        if response.status == 503 and path != "/health":
            raise NotLeader(f"Mooncake master at {self.base_url}: {method} {path}: HTTP 503: "
                            f"{response.text[:200]!r} (not the serving leader)",
                            "give every master of the HA group (--master A,B) so kvctl finds the leader")
        if response.status != 200:
            raise self._error(f"{method} {path}: HTTP {response.status}: "
                              f"{response.text[:200]!r}", hint)

    def _json(self, response: HttpResponse, method: str, path: str) -> Any:
        try:
            return response.json()
        except ValueError:
            raise self._error(f"{method} {path}: answer is not JSON: {response.text[:200]!r}") from None

    async def health(self) -> dict[str, Any]:
        """GET /health -> e.g. {"status": "ok", "role": "leader", "service_ready": true, ...}.

        Raises MasterError unless the master says it is ok and ready to serve.
        """
        response = await self._request("GET", "/health")
        self._check_status(response, "GET", "/health")
        payload = self._json(response, "GET", "/health")
        if not isinstance(payload, dict) or payload.get("status") != "ok" \
                or payload.get("service_ready") is False:
            raise self._error(f"GET /health: not ready: {payload!r}",
                              "wait for the master to finish starting (or, with HA, point at the leader)")
        return payload

    async def ha_info(self) -> HaInfo:
        """Who leads, as this master sees it (never raises for a standby or a warming leader)."""
        response = await self._request("GET", "/health")
        payload: Any = None
        try:
            payload = response.json()
        except ValueError:
            pass  # older masters answer /health with plain text
        if not isinstance(payload, dict):
            if response.status != 200:
                self._check_status(response, "GET", "/health")
            payload = {}
        role = payload.get("role")
        if not isinstance(role, str):  # a master between /role (0.3.10.post2) and a JSON /health
            role = await self._role_route()
        leader = payload.get("leader_address")
        version = payload.get("view_version")
        ready = payload.get("service_ready")
        state = payload.get("ha_state")
        return HaInfo(role, state if isinstance(state, str) else None,
                      ready if isinstance(ready, bool) else None,
                      leader if isinstance(leader, str) and leader else None,
                      version if isinstance(version, int) and not isinstance(version, bool) else None)

    async def _role_route(self) -> str | None:
        response = await self._request("GET", "/role")
        if response.status == 404:
            return None  # Mooncake < 0.3.10.post2: no HA routes
        self._check_status(response, "GET", "/role")
        return response.text.strip() or None

    async def leader_rpc(self) -> str | None:
        """GET /leader -> the leader's RPC address from the HA backend's view (None: no view)."""
        response = await self._request("GET", "/leader")
        if response.status == 404:
            return None
        self._check_status(response, "GET", "/leader")
        payload = self._json(response, "GET", "/leader")
        address = payload.get("leader_address") if isinstance(payload, dict) else None
        return address if isinstance(address, str) and address and payload.get("present") is not False else None

    async def port_kind(self) -> PortKind:
        """Which port of a master this address is, from one GET /metrics (never raises)."""
        url = f"{self.base_url}/metrics"
        try:
            response = await self._http.request("GET", url, timeout=self.timeout)
        except TransportError as exc:
            # connected, and the connection closed or reset (or garbage came back) without an HTTP
            # answer: not an HTTP port. Refused, or silence: nothing to judge by (a busy admin port is
            # silent too)
            reached = exc.kind == "other" or exc.cause_name in ("ReadError", "WriteError")
            return PortKind("not_http" if reached else "unreachable", str(exc))
        if response.status == 200:
            try:
                parse_metrics(response.text)
                return PortKind("admin")
            except ValueError:
                return PortKind("other_http", "its GET /metrics has no master_key_count")
        if response.status == 404:  # every Mooncake master's admin port has /metrics
            return PortKind("other_http", "it has no GET /metrics (HTTP 404)")
        return PortKind("unreachable", f"GET /metrics answered HTTP {response.status}")  # a 5xx: a busy master?

    async def metrics(self) -> MasterMetrics:
        """GET /metrics, parsed with prometheus_client."""
        response = await self._request("GET", "/metrics")
        self._check_status(response, "GET", "/metrics")
        try:
            return parse_metrics(response.text)
        except ValueError as exc:
            raise self._error(f"GET /metrics: unusable Prometheus text ({exc})") from None

    async def tenancy(self) -> Tenancy:
        """GET /api/v1/tenant_quotas: does this master isolate tenants? Never raises for an answer it
        cannot read (mode "unknown", with why); only for no answer at all."""
        path = "/api/v1/tenant_quotas"
        response = await self._request("GET", path)
        try:
            payload = response.json()
        except ValueError:
            payload = None
        message = payload.get("error_message") if isinstance(payload, dict) else None
        if response.status == 404:
            return Tenancy("off", detail=f"GET {path}: 404, a master without tenant routes (Mooncake < 0.3.12)")
        if response.status == 409 and message == "UNAVAILABLE_IN_CURRENT_MODE":
            return Tenancy("off", detail=f"GET {path}: 409 {message}, multi-tenancy off")
        rows = payload.get("data") if isinstance(payload, dict) and payload.get("success") is True else None
        if response.status != 200 or not isinstance(rows, list):
            return Tenancy("unknown", detail=f"GET {path}: HTTP {response.status} {response.text[:120]!r}")
        charged = {str(r["tenant_id"]): int(r.get("charged_bytes") or 0) for r in rows
                   if isinstance(r, dict) and r.get("tenant_id") is not None}
        return Tenancy("on", charged, f"GET {path}: multi-tenancy on, tenants {', '.join(sorted(charged)) or 'none'}")

    async def all_keys(self) -> list[str]:
        """GET /get_all_keys: every key the master holds (one per line in the answer), as a list:
        for a few keys (tests, a look at a small store). Counting goes through key_counts, which
        never holds the listing (1,000,000 vLLM keys: ~90 MB of answer, ~150 MB as Python strings)."""
        response = await self._request("GET", "/get_all_keys")
        self._check_status(response, "GET", "/get_all_keys")
        return [line.rstrip("\r") for line in response.text.split("\n") if line.rstrip("\r")]

    async def key_counts(self, prefix: str | None = None, shape: str | None = None) -> KeyCount:
        """GET /get_all_keys, counted while it is read: every key, and those starting with `prefix`.

        Exact at the time of the call (the keys the master lists: Mooncake's default tenant), in
        memory bounded by one chunk of the answer and one line, whatever the number of keys (`shape`: a
        regex those starting with `prefix` must match whole to count, see KeyCounter). The
        master builds its whole answer before the first byte, so `slow_timeout` (not `timeout`)
        bounds each read: ~3.5 s per million keys on a loaded 2-core machine."""
        path = "/get_all_keys"
        counter = KeyCounter(prefix, shape)
        try:
            async with self._http.stream("GET", f"{self.base_url}{path}", timeout=self.slow_timeout) as answer:
                if answer.status != 200:
                    self._check_status(HttpResponse(answer.status, await answer.head(200)), "GET", path)
                async for chunk in answer.chunks():
                    counter.feed(chunk)
        except TransportError as exc:
            if exc.kind == "timeout":
                raise self._error(f"GET {path}: no answer within {self.slow_timeout:g}s ({exc.cause_name})",
                                  "a master builds its whole listing before it answers (seconds per million keys): "
                                  f"if it holds that many, pass a --timeout over {self.slow_timeout:g}") from None
            raise self._error(f"GET {path}: {exc}") from None
        except ValueError as exc:
            raise self._error(f"GET {path}: {exc}") from None
        return counter.result()

    async def key_count(self, prefix: str | None = None) -> int:
        """Keys in the master, or only those whose name starts with `prefix`.

        Counted from /get_all_keys while it is read (exact at the time of the call, unlike a gauge).
        """
        counted = await self.key_counts(prefix)
        return counted.total if prefix is None else counted.matching

    async def remove_all(self, force: bool = True) -> int:
        """POST /api/v1/remove_all?force=... -> the number of keys removed (within slow_timeout: the
        master answers when it has removed them all).

        Master-wide: every deployment sharing this master loses its keys. Without force, keys
        under a read lease survive, so a hard reset must keep force=True.
        """
        path = "/api/v1/remove_all"
        response = await self._request("POST", path, self.slow_timeout, force="true" if force else "false")
        if response.status == 404:
            raise NoHttpRemoveAll(f"{self.base_url}: POST {path}: HTTP 404: this master has no HTTP "
                                  "remove_all (Mooncake < 0.3.12.post1)",
                                  "give its RPC port (--master-rpc HOST:PORT) so kvctl clears it "
                                  "through Mooncake's store client, or upgrade mooncake_master to "
                                  ">= 0.3.12.post1")
        self._check_status(response, "POST", path)
        payload = self._json(response, "POST", path)
        if not isinstance(payload, dict) or payload.get("success") is not True:
            code = payload.get("error_code") if isinstance(payload, dict) else None
            message = payload.get("error_message") if isinstance(payload, dict) else None
            raise self._error(f"POST {path}: the master refused: error_code={code} "
                              f"error_message={message!r} (answer {payload!r})",
                              "check the master log; retry the reset")
        removed = payload.get("removed_count")
        if not isinstance(removed, int) or isinstance(removed, bool):
            raise self._error(f"POST {path}: answer has no integer removed_count: {payload!r}")
        return removed
