"""Which servers a fleet command talks to: replicas (vLLM URLs) and the Mooncake master(s); one
resolver (`resolve_targets`) for every command (reset, status, probe, the Python API).

Sources, merged in this order: `--run NAME` (a fleet started by `kvctl serve`; with `--ray ADDRESS`,
as that Ray cluster records it), `--inventory FILE`, `--url URL` (repeatable), env KVCTL_URLS
(comma- or space-separated) when neither is given. `--master HOST:PORT` (the admin/metrics HTTP port)
and `--master-rpc HOST:PORT` (the RPC port) override the run's or inventory's, env KVCTL_MASTER(_RPC)
when none names one; a live run's record gives a missing RPC port, or the admin port for an RPC port
given as --master (with a note). The plan asks the servers for the rest (kvctl.reset.addresses).

Inventory (YAML):

    master: 127.0.0.1:9003        # the master's admin/metrics HTTP port (not its RPC port); an HA
                                  # group: a list, or "a:9003,b:9003" (kvctl finds the leader)
    master_rpc: 127.0.0.1:50051   # optional: its RPC port, for clearing only this deployment's keys
                                  # (HA: the leader reports its own; else one per master, same order)
    cache_prefix: rl-run-7        # optional: this deployment's key prefix on the master
    tenant_id: default            # optional: the Mooncake tenant its mooncake.json names (vLLM >= 0.28)
    replicas:
      - url: http://127.0.0.1:8000
        name: a                   # optional (default: host:port)
        api_key_env: VLLM_API_KEY # optional: env var holding the key for /v1 routes
        connector: MooncakeStoreConnector   # optional: else learned from /server_info
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from kvctl import yamlio
from kvctl.errors import UsageError
from kvctl.facts.cache_prefix import check_cache_prefix

if TYPE_CHECKING:
    from kvctl.serve.runs import RunRecord

URLS_ENV = "KVCTL_URLS"
MASTER_ENV = "KVCTL_MASTER"  # the master's admin/metrics HTTP address(es), as --master
MASTER_RPC_ENV = "KVCTL_MASTER_RPC"  # its RPC address(es), as --master-rpc
RUN_FILE_HINT = "run.json in its run folder"


@dataclass(frozen=True)
class Replica:
    url: str
    name: str
    api_key_env: str | None = None
    connector: str | None = None  # as declared by the user; None = learn it from the server

    def api_key(self) -> str | None:
        """The key, read from its env var at call time (never stored, never printed)."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None


@dataclass(frozen=True)
class Fleet:
    """The replicas a command acts on and the Mooncake master(s) they share: one representation for
    one master and for an HA group alike (`masters` in the order given; kvctl finds the leader)."""

    replicas: list[Replica]
    # host:port of each master's admin/metrics HTTP port; more than one: an HA group
    masters: tuple[str, ...] = ()
    cache_prefix: str | None = None
    sources: list[str] = field(default_factory=list)
    # host:port of the masters' RPC ports, in the same order (or one for the group): Mooncake's store
    # client removes one deployment's keys through it (the admin HTTP API can only clear everything)
    master_rpcs: tuple[str, ...] = ()
    # where each came from, for messages: "--master", "$KVCTL_MASTER", "--inventory FILE", "run NAME's record"
    master_source: str | None = None
    master_rpc_source: str | None = None
    notes: tuple[str, ...] = ()  # what the resolver learned or changed (the plan repeats them)
    # The Mooncake tenant the replicas' mooncake.json names (vLLM's /server_info does not show it): the
    # inventory's tenant_id, or the run's rendered one. None: not declared (kvctl.reset.tenancy)
    tenant_id: str | None = None
    # The run whose own embedded master the fleet uses, no other live run recording it (kvctl.reset.wide)
    embedded_master_of: str | None = None

    @property
    def master(self) -> str | None:
        """The first master (the only one, unless an HA group)."""
        return self.masters[0] if self.masters else None

    @property
    def master_rpc(self) -> str | None:
        return self.master_rpcs[0] if self.master_rpcs else None

    @property
    def master_group(self) -> tuple[str, ...]:
        return self.masters

    @property
    def rpc_group(self) -> tuple[str, ...]:
        return self.master_rpcs


class NoTargets(UsageError):
    """Nothing named and no live run to default to (the CLI lists the runs it knows)."""


@dataclass
class Targets:
    """A resolved fleet and, when it came from --run, the run's record (its processes, its master)."""

    fleet: Fleet
    run: RunRecord | None = None


def normalize_url(url: str, where: str) -> str:
    """`host:port` or a URL -> `http://host:port` (no trailing slash); UsageError if unusable."""
    text = url.strip()
    if not text:
        raise UsageError(f"{where}: empty URL", "give http://HOST:PORT")
    if "://" not in text:
        text = f"http://{text}"
    parsed = _parse(text, url, where, "give http://HOST:PORT")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise UsageError(f"{where}: '{redact(url)}' is not an http(s) URL", "give http://HOST:PORT")
    _refuse_credentials(parsed, url, where)
    try:
        parsed.port
    except ValueError:
        raise UsageError(f"{where}: '{url}' has a bad port", "give http://HOST:PORT") from None
    if parsed.path.strip("/") or parsed.query or parsed.fragment or parsed.params:
        # kvctl calls the server's own routes (/reset_prefix_cache, ...): a path here would be dropped
        raise UsageError(f"{where}: '{url}' has a path or query; kvctl needs the server's base URL",
                         f"give {parsed.scheme}://{parsed.netloc}")
    if parsed.port is not None:  # ':041001' is port 41001: one spelling, so duplicates are seen
        host = f"[{parsed.hostname}]" if ":" in (parsed.hostname or "") else parsed.hostname
        return f"{parsed.scheme}://{host}:{parsed.port}"
    return text.rstrip("/")


def normalize_master(address: str, where: str, port_kind: str = "admin") -> str:
    """HOST:PORT of a master's admin/metrics HTTP port (or, port_kind="rpc", its RPC port)."""
    example = ("the master's RPC port, e.g. 127.0.0.1:50051" if port_kind == "rpc"
               else "the master's admin/metrics port, e.g. 127.0.0.1:9003")
    text = address.strip()
    if "://" in text:
        if port_kind == "rpc":
            raise UsageError(f"{where}: '{redact(address)}' is a URL; the RPC port takes HOST:PORT",
                             f"give {example}")
        parsed = _parse(text, address, where, f"give {example}")
        if parsed.scheme not in ("http", "https"):
            raise UsageError(f"{where}: '{redact(address)}' is not an http address of a Mooncake master",
                             "give HOST:PORT of its admin/metrics port, e.g. 127.0.0.1:9003")
        _refuse_credentials(parsed, address, where)
        text = parsed.netloc
    host, sep, port = text.rpartition(":")
    bare_ipv6 = ":" in host and not (host.startswith("[") and host.endswith("]"))
    if not sep or not host or bare_ipv6 or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{where}: '{redact(address)}' is not HOST:PORT", f"give {example}")
    return text


def normalize_masters(addresses: str | list[str], where: str, port_kind: str = "admin") -> tuple[str, ...]:
    """One master or an HA group: "a:9003,b:9003" (or a YAML list) -> each normalized, in order."""
    parts = addresses.split(",") if isinstance(addresses, str) else list(addresses)
    parts = [p for p in (str(x).strip() for x in parts) if p]
    if not parts:
        raise UsageError(f"{where}: no master address", "give HOST:PORT, or several comma-separated for an HA group")
    multi = len(parts) > 1
    found = tuple(normalize_master(p, f"{where} #{i + 1}" if multi else where, port_kind) for i, p in enumerate(parts))
    if len(set(found)) != len(found):
        raise UsageError(f"{where}: a master is listed twice ({', '.join(found)})", "list each master once")
    return found


def redact(url: str) -> str:
    """The URL without a password (for messages): http://user:pw@h:p -> http://***@h:p."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    at = rest.rfind("@", 0, (rest.find("/") + 1 or len(rest) + 1) - 1)
    if at < 0:
        return url
    return f"{scheme}{sep}***@{rest[at + 1:]}"


def _parse(text: str, original: str, where: str, fix: str) -> Any:
    try:
        return urlparse(text)
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket
        raise UsageError(f"{where}: '{redact(original)}' is not a URL ({exc})", fix) from None


def _refuse_credentials(parsed: Any, original: str, where: str) -> None:
    if parsed.username is not None or parsed.password is not None:
        raise UsageError(f"{where}: '{redact(original)}' carries credentials; kvctl does not send them and would "
                         "print them in its output",
                         "remove the user:password@ part (the dev routes have no authentication; for /v1 "
                         "name the env var that holds the key in the inventory: api_key_env: VLLM_API_KEY)")


def default_name(url: str) -> str:
    parsed = urlparse(url)
    return parsed.netloc or url


def build_fleet(urls: list[str] | None = None, inventory: Path | None = None, master: str | None = None,
                env: dict[str, str] | None = None, run: str | None = None,
                state_dir: str | None = None, master_rpc: str | None = None, ray: str | None = None,
                masters_from_env: bool = True) -> Fleet:
    """The fleet of `resolve_targets` (every command that acts on a fleet: reset, probe, the API)."""
    return resolve_targets(run, urls, inventory, master, master_rpc, state_dir=state_dir, env=env, ray=ray,
                           masters_from_env=masters_from_env).fleet


TARGET_HINT = (f"pass --run NAME (a fleet started by kvctl serve), --url URL (repeatable), "
               f"--inventory FILE, or set {URLS_ENV}")


def resolve_targets(run: str | None = None, urls: list[str] | None = None, inventory: Path | None = None,
                    master: str | None = None, master_rpc: str | None = None, *,
                    state_dir: str | Path | None = None, env: Mapping[str, str] | None = None,
                    ray: str | None = None, default_to_live_run: bool = False,
                    masters_from_env: bool = True) -> Targets:
    """The one resolver of every fleet command: merge the sources (see the module docstring) into a
    Fleet; UsageError when nothing is targeted or an entry is bad. With `ray` (a Ray cluster's
    address), --run names a run as that cluster records it. `default_to_live_run` (kvctl status):
    with nothing named, the only live run in the state dir (NoTargets when there is none).
    `masters_from_env`: False for a command that never talks to the master (probe), so that
    KVCTL_MASTER(_RPC) is not read there."""
    env = os.environ if env is None else env
    if ray is not None and run is None:
        raise UsageError("--ray needs --run NAME", f"the runs on that cluster: kvctl runs --ray {ray}")
    record = None
    if run is not None:
        record = _load_run(run, state_dir, ray)
    elif default_to_live_run and not urls and inventory is None and not env.get(URLS_ENV, "").strip():
        record = _only_live_run(state_dir)
    replicas: list[Replica] = []
    sources: list[str] = []
    cache_prefix = tenant_id = None
    inv_master: tuple[str, ...] = ()
    inv_rpc: tuple[str, ...] = ()
    inv_source: str | None = None
    if record is not None:
        replicas += [Replica(r.url, r.name) for r in record.replicas]
        recorded = record.master
        where = f"run {record.name}'s master ({RUN_FILE_HINT})"
        # an HA group's record holds every master's admin address, comma-separated, and its etcd address,
        # which is no master's RPC port (the leader reports its own)
        inv_master = normalize_masters(recorded.admin_address, where) if recorded and recorded.admin_address else ()
        inv_rpc = (recorded.rpc_address,) if recorded and recorded.rpc_address and "://" not in recorded.rpc_address \
            else ()
        cache_prefix = check_cache_prefix(record.cache_prefix, f"run {record.name}'s record ({RUN_FILE_HINT})")
        tenant_id = str(record.parameters.get("tenant_id") or "").strip() or None
        inv_source = f"run {record.name}'s record"
        sources.append(f"--run {record.name}")
    if inventory is not None:
        inv = load_inventory(inventory)
        replicas += inv.replicas
        inv_master, cache_prefix, inv_rpc = inv.master_group, inv.cache_prefix, inv.rpc_group
        tenant_id = inv.tenant_id
        inv_source = f"--inventory {inventory}"
        sources.append(f"--inventory {inventory}")
    for i, url in enumerate(urls or []):
        u = normalize_url(url, f"--url #{i + 1}")
        replicas.append(Replica(u, default_name(u)))
    if urls:
        sources.append("--url")
    if not replicas and env.get(URLS_ENV, "").strip():
        for part in env[URLS_ENV].replace(",", " ").split():
            u = normalize_url(part, URLS_ENV)
            replicas.append(Replica(u, default_name(u)))
        sources.append(URLS_ENV)
    if not replicas:
        raise UsageError("no replicas to act on", TARGET_HINT)
    _check_unique(replicas)
    masters, master_src = _master_flag(master, "--master", "admin") or (inv_master, inv_source if inv_master else None)
    if not masters and masters_from_env:
        masters, master_src = _master_flag(env.get(MASTER_ENV), MASTER_ENV, "admin") or ((), None)
    rpcs, rpc_src = _master_flag(master_rpc, "--master-rpc", "rpc") or (inv_rpc, inv_source if inv_rpc else None)
    # KVCTL_MASTER_RPC pairs with a master named the same way (flag or env): a run's or an inventory's
    # master has its own RPC address, and another one's would clear a different master
    if not rpcs and masters_from_env and master_src in (None, "--master", MASTER_ENV):
        rpcs, rpc_src = _master_flag(env.get(MASTER_RPC_ENV), MASTER_RPC_ENV, "rpc") or ((), None)
    fleet = Fleet(replicas, (), cache_prefix, sources, master_source=master_src, master_rpc_source=rpc_src,
                  tenant_id=tenant_id, embedded_master_of=_own_master(record, master_src == inv_source, state_dir))
    if masters and ray is None:
        masters, rpcs, fleet = _ask_local_runs(masters, rpcs, fleet, state_dir)
    return Targets(_with_masters(fleet, masters, rpcs, rpc_src or "--master-rpc"), record)


def _own_master(record: Any, from_record: bool, state_dir: str | Path | None) -> str | None:
    from kvctl.serve.master_flags import own_embedded_master  # the runs' records: kvctl.reset.wide asks
    return own_embedded_master(record, state_dir) if from_record else None


def _master_flag(value: str | None, where: str, port_kind: str) -> tuple[tuple[str, ...], str] | None:
    """A master address given by a flag or an env variable, normalized, with where it came from."""
    if value is None or not value.strip():
        return None
    return normalize_masters(value, where, port_kind), where


def _ask_local_runs(masters: tuple[str, ...], rpcs: tuple[str, ...], fleet: Fleet,
                    state_dir: str | Path | None) -> tuple[tuple[str, ...], tuple[str, ...], Fleet]:
    """What this machine's live runs record about a master given without its RPC address: a run
    whose master has this admin address gives its RPC address; an RPC address given as --master that a
    run records is swapped for that run's admin address (with a note). Records only: nothing is sent."""
    from dataclasses import replace

    if rpcs and fleet.master_source != "--master" and fleet.master_source != MASTER_ENV:
        return masters, rpcs, fleet
    from kvctl.serve.master_flags import recorded_masters

    known = recorded_masters(state_dir)
    for r in known:
        m = r.master
        assert m is not None and m.admin_address
        if masters == (m.rpc_address,) and m.admin_address != m.rpc_address:
            note = (f"{fleet.master_source} {m.rpc_address} is the RPC port of run {r.name}'s master, not its "
                    f"admin port: using its admin port {m.admin_address} ({RUN_FILE_HINT}); "
                    f"say --master {m.admin_address} --master-rpc {m.rpc_address}")
            fleet = replace(fleet, master_source=f"run {r.name}'s record", notes=fleet.notes + (note,))
            masters = normalize_masters(m.admin_address, f"run {r.name}'s master")
            if not rpcs:
                rpcs, fleet = (m.rpc_address,), replace(fleet, master_rpc_source=f"run {r.name}'s record")
            return masters, rpcs, fleet
    if rpcs:
        return masters, rpcs, fleet
    for r in known:
        m = r.master
        assert m is not None and m.admin_address
        if normalize_masters(m.admin_address, f"run {r.name}'s master") == masters:
            note = f"the master's RPC address {m.rpc_address}: from run {r.name}'s record (its master)"
            return masters, (m.rpc_address,), replace(fleet, master_rpc_source=f"run {r.name}'s record",
                                                     notes=fleet.notes + (note,))
    return masters, rpcs, fleet


def _load_run(run: str, state_dir: str | Path | None, ray: str | None) -> RunRecord:
    if ray is not None:
        from kvctl.serve import ray_fleet

        return ray_fleet.load(ray, run, state_dir)
    from kvctl.serve import runs

    return runs.load(run, state_dir)


def _only_live_run(state_dir: str | Path | None) -> RunRecord:
    """The only live run; NoTargets (naming the newest known run) when none is live."""
    from kvctl.serve import runs

    known = runs.list_runs(state_dir)
    if not any(r.state in runs.LIVE_STATES for r in known):
        where = f"no live kvctl run in {runs.runs_dir(state_dir)}"
        hint = TARGET_HINT + "; or start a fleet with kvctl serve"
        if known:
            newest = max(known, key=lambda r: r.created).name
            hint = (f"kvctl status --run {newest} (any run kvctl runs lists; a stopped one shows its last "
                    f"record), or pass --url URL (repeatable), --inventory FILE, or set {URLS_ENV}")
        raise NoTargets(f"nothing to show: no --run, --url, --inventory or ${URLS_ENV}, and {where}", hint)
    return runs.resolve(None, state_dir)  # several live runs: its own error asks for --run


def _with_masters(fleet: Fleet, masters: tuple[str, ...], rpcs: tuple[str, ...], rpc_where: str) -> Fleet:
    """Set the master (group) and RPC address(es); several RPC addresses pair with the masters by
    position, so their counts must match."""
    if len(rpcs) > 1 and len(rpcs) != len(masters):
        raise UsageError(f"{rpc_where}: {len(rpcs)} RPC addresses for {len(masters)} master(s)",
                         "give one RPC address per master, in the same order (or none: an HA leader reports its own)")
    from dataclasses import replace

    return replace(fleet, masters=masters, master_rpcs=rpcs)


def _server_key(url: str) -> tuple[str, int | None]:
    """Which server a URL reaches, for finding one listed twice: 'localhost' is 127.0.0.1, an IP is
    compared as an address (not as text), the port as a number (the scheme's default when absent)."""
    import ipaddress

    parsed = urlparse(url)
    host = (parsed.hostname or "").lower().rstrip(".")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        host = ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    return host, parsed.port or (443 if parsed.scheme == "https" else 80)


def _check_unique(replicas: list[Replica]) -> None:
    seen_urls: dict[tuple[str, int | None], str] = {}
    seen_names: set[str] = set()
    for r in replicas:
        key = _server_key(r.url)
        if key in seen_urls:
            same = "" if seen_urls[key] == r.url else f" (as {seen_urls[key]}: the same server)"
            raise UsageError(f"replica {r.url} is listed twice{same}", "list each replica once")
        if r.name in seen_names:
            raise UsageError(f"two replicas are named '{r.name}'", "give each replica a unique name")
        seen_urls[key] = r.url
        seen_names.add(r.name)


def load_inventory(path: Path) -> Fleet:
    """Read and check an inventory file (schema checked with pydantic; errors say where)."""
    import yaml
    from pydantic import BaseModel, ConfigDict, ValidationError

    class _Replica(BaseModel):
        model_config = ConfigDict(extra="forbid")
        url: str
        name: str | None = None
        api_key_env: str | None = None
        connector: str | None = None

    class _Inventory(BaseModel):
        model_config = ConfigDict(extra="forbid")
        replicas: list[_Replica]
        master: str | list[str] | None = None  # a list (or "a,b"): an HA group
        master_rpc: str | list[str] | None = None
        cache_prefix: str | None = None
        tenant_id: str | None = None

    try:
        raw: Any = yamlio.safe_load(path.read_text("utf-8"), unique_keys=True)
    except OSError as exc:
        raise UsageError(f"--inventory {path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--inventory {path}: not a text file (not UTF-8)", "give a YAML inventory") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--inventory {path}: not valid YAML: {exc}") from None
    try:
        inv = _Inventory.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise UsageError(f"--inventory {path}: {loc}: {first['msg']}{more}",
                         "see the inventory format in docs/reset.md") from None
    replicas = []
    for i, r in enumerate(inv.replicas):
        url = normalize_url(r.url, f"--inventory {path}: replicas.{i}.url")
        replicas.append(Replica(url, r.name or default_name(url), r.api_key_env, r.connector))
    masters = normalize_masters(inv.master, f"--inventory {path}: master") if inv.master else ()
    rpcs = normalize_masters(inv.master_rpc, f"--inventory {path}: master_rpc", "rpc") if inv.master_rpc else ()
    prefix = check_cache_prefix(inv.cache_prefix, f"--inventory {path}")
    tenant = (inv.tenant_id or "").strip() or None
    fleet = Fleet(replicas, (), prefix, tenant_id=tenant)
    return _with_masters(fleet, masters, rpcs, f"--inventory {path}: master_rpc")
