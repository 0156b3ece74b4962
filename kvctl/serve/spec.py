"""What a fleet to start looks like (`ServeSpec`), the checks that need no process (`check_spec`),
and the error a failed start raises (`ServeError`): shared by the local and the Ray paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvctl.errors import KvctlError, UsageError
from kvctl.facts.cache_prefix import check_cache_prefix
from kvctl.serve import runs
from kvctl.serve.parallel import check_dp_ports, parallel_layout
from kvctl.serve.vllm_launch import is_loopback, owned_flags_in

DEFAULT_HEALTH_TIMEOUT = 600.0


class ServeError(KvctlError):
    """The fleet could not be started; everything it had started is stopped again."""


@dataclass
class ServeSpec:
    model: str
    template: str = "mooncake-store"
    overrides: dict[str, str] = field(default_factory=dict)
    replicas: int = 1
    # "embedded", or where vLLM connects to a running master: its RPC address HOST:PORT or an HA group's
    # etcd://... (the CLI's --master-rpc; serve.master_flags turns the CLI's flags into these two)
    master: str = "embedded"
    master_admin: str | None = None  # admin/metrics HOST:PORT of that master (the CLI's --master; status/reset)
    host: str = "127.0.0.1"
    base_port: int | None = None
    name: str | None = None
    vllm_python: str | None = None
    extra_args: list[str] = field(default_factory=list)
    master_args: list[str] = field(default_factory=list)  # more mooncake_master flags (embedded master only)
    allow_remote_admin: bool = False
    state_dir: str | None = None
    template_path: str | None = None
    health_timeout: float = DEFAULT_HEALTH_TIMEOUT
    replace: bool = False  # a live run of this name is stopped first (else refused)
    foreground: bool = False  # the caller supervises the run after start_run returns (kvctl serve without --detach)
    ray: str | None = None  # a Ray cluster's address (auto: the running one): start the fleet there (kvctl.serve.ray_start)
    ray_master_resource: str | None = None  # with ray: the master goes on a node with this custom resource
    # Not on the CLI; for measuring candidate settings (benchmarks/transfer.py):
    replica_env: list[dict[str, str]] = field(default_factory=list)  # per replica, applied last
    metadata: str = "p2p"  # transfer-engine metadata: "p2p" (P2PHANDSHAKE) or "http" (the embedded master's)


# A run's replicas each take a port and a vLLM server's memory (~3 GB on the CPU, a GPU's share on
# a GPU); far past what one machine or a Ray cluster runs per deployment, and the port search has a bound.
MAX_REPLICAS = 1024


def check_spec(spec: ServeSpec) -> None:
    """Refusals that need no process: bad counts, and dev-mode servers beyond loopback."""
    if spec.model.startswith("-"):  # serve passes unknown options on to vLLM: a mistyped one lands here as MODEL
        raise UsageError(f"kvctl serve: {spec.model!r} is not a kvctl serve option, and MODEL must come first",
                         "kvctl serve -h lists serve's options; vLLM's own flags go after MODEL "
                         "(kvctl serve MODEL -- --max-model-len 2048)")
    if spec.replicas < 1:
        raise UsageError(f"--replicas {spec.replicas}: need at least 1")
    if spec.replicas > MAX_REPLICAS:
        raise UsageError(f"--replicas {spec.replicas}: at most {MAX_REPLICAS} replicas per run (each is a vLLM "
                         "server with its own port and its own memory)",
                         f"start several runs (--name), each of at most {MAX_REPLICAS} replicas")
    if spec.base_port is not None and not 1024 <= spec.base_port <= 65536 - spec.replicas:
        raise UsageError(f"--base-port {spec.base_port} is not a usable port for {spec.replicas} replica(s)",
                         f"give a port from 1024 to {65536 - spec.replicas} (below 1024 are privileged ports), "
                         "or leave it out to use free ports")
    if spec.name is not None:
        runs.check_name(spec.name)
    elif spec.replace:
        raise UsageError("--replace needs --run NAME", "name the run to replace, e.g. --run rl --replace")
    owned = owned_flags_in(spec.extra_args)
    if owned:
        flag, instead = owned[0]
        raise UsageError(f"{flag} after -- would override what kvctl serve sets (vLLM takes the last one)",
                         f"use kvctl serve's {instead} instead")
    check_dp_ports(parallel_layout(spec.extra_args), spec.replicas)  # bad sizes, multi-host layouts, shared DP ports
    if not is_loopback(spec.host) and not spec.allow_remote_admin:
        raise remote_admin_refused(f"--host {spec.host}", "keep --host 127.0.0.1, or pass --allow-remote-admin "
                                                          "on a network you trust")
    if "cache_prefix" in spec.overrides:  # the scope of every clear of this run's keys: refused before anything starts
        check_cache_prefix(spec.overrides["cache_prefix"], "--set cache_prefix")
    if spec.master != "embedded":
        master_endpoints(spec.master)
    check_master_args(spec)


def master_endpoints(master: str, flag: str = "--master-rpc") -> list[tuple[str, int]]:
    """(host, port) of each endpoint of the address vLLM connects to: the master's RPC address HOST:PORT, or
    an HA group's etcd `etcd://HOST:PORT;HOST:PORT` (Mooncake's master_server_address form, mooncake-store
    client_service.h)."""
    fix = "give the master's RPC address HOST:PORT, or etcd://HOST:PORT[;HOST:PORT...] for an HA group"
    if "://" in master and not master.startswith("etcd://"):
        raise UsageError(f"{flag} {master}: only etcd:// names an HA group (a redis-backed HA master is not in "
                         "Mooncake's published wheels)", fix)
    parts = master.removeprefix("etcd://").split(";") if master.startswith("etcd://") else [master]
    out = []
    for part in parts:
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"{flag} {master}: '{part}' is not HOST:PORT", fix)
        out.append((host.strip("[]"), int(port)))
    return out


def check_master_args(spec: ServeSpec) -> None:
    """--master-arg: gflags `--name=value` (or `--name` for a boolean), only for a master kvctl starts; every
    flagfile replaced by the flags it holds, all checked (kvctl.serve.master_args)."""
    from kvctl.serve.master_args import checked_master_args

    if spec.master_args and spec.master != "embedded":
        raise UsageError("--master-arg sets flags of the master kvctl serve starts (--master embedded), "
                         f"not of the one at {spec.master}", "pass those flags to that master where it is started")
    spec.master_args = checked_master_args(spec.master_args, spec.allow_remote_admin)


def check_servable(spec: ServeSpec) -> None:
    """kvctl serve starts alike replicas of one kv_transfer_config; a prefill/decode layout needs two roles,
    a bootstrap port per prefill server and a proxy, so it is refused here and kept for `config render`."""
    from kvctl.config import templates
    from kvctl.facts.kv_transfer import disaggregation_connectors

    template = templates.load(spec.template, spec.template_path)
    paired = disaggregation_connectors(template.kv_transfer_config)
    if paired:
        raise UsageError(
            f"template {template.name} uses {', '.join(dict.fromkeys(paired))}, a prefill/decode connector: it needs "
            "a producer and a consumer server per pair, a bootstrap port per prefill server and a proxy in front, "
            "and kvctl serve starts alike replicas of one role",
            f"render each side with `kvctl config render {template.name} --set role=producer` (and "
            "role=consumer), start each server with its own VLLM_MOONCAKE_BOOTSTRAP_PORT and Mooncake's proxy "
            "(python -m mooncake.vllm_v1_proxy_server) in front (docs/gpu.md, \"Prefill/decode\"); kvctl serve runs "
            "mooncake-store, mooncake-store-standalone and lmcache-mooncake")


def remote_admin_refused(what: str, fix: str) -> UsageError:
    """Dev-mode routes have no authentication: binding them beyond loopback needs explicit consent."""
    return UsageError(
        f"{what} would expose the replicas' dev-mode routes beyond this machine: {DEV_MODE_ROUTES}, and the "
        "master's admin port; none of them has authentication (--api-key guards only /v1)", fix)


# What VLLM_SERVER_DEV_MODE=1 opens (vLLM 0.32.0: entrypoints/serve/dev/*/api_router.py and
# entrypoints/rl/, registered in entrypoints/launchers/api_server/routers.py:40): kvctl needs the
# reset, pause and server_info routes, and with them comes the rest.
DEV_MODE_ROUTES = ("/collective_rpc (any method on every worker, e.g. reload_weights from a path), /update_weights "
                   "and the weight-transfer routes, /sleep, /wake_up, /pause, /resume, /abort_requests, "
                   "/reset_prefix_cache, /reset_mm_cache, /reset_encoder_cache, /server_info")
