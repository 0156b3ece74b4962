"""Checks of a mooncake.json (the file MOONCAKE_CONFIG_PATH names), as the connector that reads it
reads it, for one vLLM release. Knows nothing of file formats.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlparse

from packaging.version import Version

from kvctl.facts.capabilities import table
from kvctl.facts.sizes import parse_size
from kvctl.facts.versions import parse_version
from kvctl.validate.model import Collector, Problem, did_you_mean, join, placeholder

MOONCAKE_MODES = ("embedded", "standalone-store")
MOONCAKE_PROTOCOLS = ("tcp", "rdma")
# Other transports of Mooncake builds (vLLM passes protocol to Mooncake unchecked).
OTHER_TRANSPORTS = ("nvlink", "nvlink_intra", "ascend", "hip", "cxl", "efa", "barex", "nvmeof")
P2P_HANDSHAKE = "P2PHANDSHAKE"
STORE_CONNECTOR = "MooncakeStoreConnector"
# Keys vLLM's MooncakeStoreConfig reads from MOONCAKE_CONFIG_PATH (FACTS §4; local_hostname is
# handled on its own: people write it, v1 does not read it).
MOONCAKE_KEYS = ("metadata_server", "master_server_address", "protocol", "device_name", "mode",
                 "global_segment_size", "local_buffer_size", "enable_offload", "tenant_id")


def validate_mooncake_config(
    cfg: Any,
    version: Version | str,
    where: str = "mooncake.json",
    lines: Mapping[str, int] | None = None,
    reader: Literal["vllm", "lmcache"] | None = None,
    readers: tuple[str, ...] = (),
) -> list[Problem]:
    """Problems with the file MOONCAKE_CONFIG_PATH names, as the connector that reads it reads it.

    `readers`: the connectors configured next to it (a bundle, a manifest), else inferred from the
    version: vLLM's V1 MooncakeStoreConnector, the V0 Mooncake connectors (0.8.5-0.10.x), or
    LMCache's Mooncake backend (reader="lmcache"), which reads other keys: only the checks common
    to all apply to it.
    """
    v, out = parse_version(version), Collector(lines)
    if not isinstance(cfg, Mapping):
        out.error(where, f"{where} must be a JSON object, got {type(cfg).__name__}",
                  'write it like {"master_server_address": "127.0.0.1:50051", ...}')
        return out.problems
    who = reader_of(v, readers, cfg) if reader != "lmcache" else Reader("lmcache", None, None)
    if who.kind == "none":
        out.drop(where, f"no connector of vLLM {v} reads this mooncake.json: {who.why}",
                 "drop the file, or configure a connector that reads it")
        return out.problems
    if who.kind == "v0-pipe":
        _check_pipe(cfg, where, out)
        _check_mooncake_keys(cfg, where, out, who, v)
        return out.problems
    _check_master_address(cfg.get("master_server_address"),
                          join(where, "master_server_address"), out)
    _check_metadata_server(cfg.get("metadata_server"), join(where, "metadata_server"), out)
    _check_protocol(cfg, where, out)
    sizes = {key: _check_size(cfg, key, where, out)
             for key in ("global_segment_size", "local_buffer_size")}
    if sizes["local_buffer_size"] == 0:
        out.error(join(where, "local_buffer_size"), "local_buffer_size is 0: a Mooncake client "
                  "needs a transfer buffer > 0 to write (vLLM raises ValueError)",
                  'e.g. "local_buffer_size": "128MB"')
    if who.kind == "v1-store":
        _check_mode(cfg, v, where, out, sizes["global_segment_size"])
        _check_versioned_keys(cfg, v, where, out)
    if who.kind in ("v1-store", "v0-store"):
        _check_mooncake_keys(cfg, where, out, who, v)
    return out.problems


@dataclass(frozen=True)
class Reader:
    kind: str  # "v1-store" | "v0-store" | "v0-pipe" | "lmcache" | "none"
    connector: str | None
    keys: tuple[str, ...] | None  # the keys it reads, when the facts say
    why: str = ""  # for "none": why nothing reads it


# A V0 MooncakeConnector (pipe) config names its peers; a store config names a master.
_PIPE_KEYS = ("prefill_url", "decode_url")


def reader_of(v: Version, readers: tuple[str, ...], cfg: Mapping[str, Any] | None = None) -> Reader:
    """Which connector reads the mooncake.json in `v`: among the connectors configured with it
    when the input says, else the one its keys are written for."""
    t = table()
    pipe = cfg is not None and any(k in cfg for k in _PIPE_KEYS)
    wanted = readers or (("MooncakeConnector",) if pipe else (STORE_CONNECTOR,))
    for name in wanted:
        registered = t.registered(v, name)
        if registered is None or name not in (STORE_CONNECTOR, "MooncakeConnector"):
            continue
        keys = t.mooncake_json_keys(v, name)
        if registered.generation == "v0":
            kind = "v0-pipe" if name == "MooncakeConnector" else "v0-store"
            return Reader(kind, name, keys)
        if name == STORE_CONNECTOR:
            return Reader("v1-store", name, keys or MOONCAKE_KEYS)
    if "LMCacheConnectorV1" in readers or (not readers and not pipe and t.registered(v, STORE_CONNECTOR) is None
                                          and t.registered(v, "LMCacheConnectorV1") is not None):
        return Reader("lmcache", None, None)
    name = wanted[0]
    history = t.connector_history(name) or "never registered"
    if name == "MooncakeConnector" and t.registered(v, name) is not None:
        why = f"its V1 {name} takes its settings from kv_connector_extra_config, not a mooncake.json"
    else:
        why = f"it is written for {'the V0 ' if pipe else ''}{name} ({history})"
    return Reader("none", None, None, why)


def _check_pipe(cfg: Mapping[str, Any], where: str, out: Collector) -> None:
    """The V0 MooncakeConnector's transfer-engine config: it splits prefill_url / decode_url."""
    for key in (*_PIPE_KEYS, "metadata_server"):
        if not isinstance(cfg.get(key), str) or not cfg.get(key):
            out.error(join(where, key), f"{key} is missing or not a string: the V0 MooncakeConnector "
                      "needs it to reach its peer", f'e.g. "{key}": "HOST:PORT"')


def _check_master_address(value: Any, path: str, out: Collector) -> None:
    if placeholder(value):
        return
    fix = 'set "master_server_address": "HOST:PORT" (mooncake_master --rpc_port, default 50051)'
    if value is None or value == "":
        out.error(path, "master_server_address is missing: the store client cannot reach a master",
                  fix)
        return
    if not isinstance(value, str):
        out.error(path, f"master_server_address must be a \"host:port\" string, got {value!r}", fix)
        return
    if value.startswith("etcd://"):
        return  # HA masters found through etcd: a list kvctl does not parse
    host, sep, port = value.rpartition(":")
    if "://" in host or not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        out.error(path, f"master_server_address {value!r} is not host:port with a numeric port",
                  'e.g. "master_server_address": "127.0.0.1:50051"'
                  + (" (no scheme)" if "://" in value else ""))


def _check_metadata_server(value: Any, path: str, out: Collector) -> None:
    if placeholder(value):
        return
    fix = f'use "{P2P_HANDSHAKE}" (no metadata server) or "http://HOST:PORT/metadata"'
    if not isinstance(value, str) or not value:
        out.error(path, f"metadata_server is missing or not a string ({value!r}): the transfer "
                  "engine cannot start", fix)
    elif value == P2P_HANDSHAKE:
        return
    elif value.upper() == P2P_HANDSHAKE:
        out.error(path, f"metadata_server {value!r} must be written {P2P_HANDSHAKE} exactly; "
                  "anything else is taken as a metadata server address", f'use "{P2P_HANDSHAKE}"')
    elif value.startswith(("http://", "https://")):
        if not urlparse(value).hostname:
            out.error(path, f"metadata_server {value!r} has no host", fix)
    elif not value.startswith(("etcd://", "redis://")):
        out.warn(path, f"metadata_server {value!r} is neither {P2P_HANDSHAKE} nor an http(s) URL; "
                 "Mooncake takes it as an etcd address", fix)


def _check_protocol(cfg: Mapping[str, Any], where: str, out: Collector) -> None:
    path, protocol = join(where, "protocol"), cfg.get("protocol")
    if placeholder(protocol):
        return
    if protocol is None:
        out.warn(path, "protocol is not set: it defaults to rdma, which needs RDMA NICs "
                 "(and device_name)", 'set "protocol": "tcp" unless the hosts have RDMA NICs')
    elif not isinstance(protocol, str):
        out.error(path, f"protocol must be a string, got {protocol!r}", 'use "tcp" or "rdma"')
        return
    elif protocol not in MOONCAKE_PROTOCOLS + OTHER_TRANSPORTS:
        # vLLM hands it to Mooncake unchecked; only a Mooncake build with that transport takes it.
        known = MOONCAKE_PROTOCOLS + OTHER_TRANSPORTS
        out.warn(path, f"protocol {protocol!r} is not a Mooncake transport ({', '.join(known)}): "
                 "the store client fails to start unless this Mooncake build has it",
                 did_you_mean(protocol.lower(), known) + 'use "tcp" or "rdma"')
        return
    device = cfg.get("device_name")
    if device is not None and not isinstance(device, str):
        out.error(join(where, "device_name"), f"device_name must be a string, got {device!r}",
                  'e.g. "device_name": "mlx5_0" (or "" for tcp)')
    elif protocol == "rdma" and not device:
        out.warn(join(where, "device_name"), "protocol is rdma but device_name is empty: Mooncake "
                 "must find RDMA devices itself and fails on hosts without them",
                 'set "device_name" (e.g. "mlx5_0"; list them with ibv_devices) '
                 'or use "protocol": "tcp"')


def _check_size(cfg: Mapping[str, Any], key: str, where: str, out: Collector) -> int | None:
    """Bytes of a size key, or None when absent or wrong (then reported)."""
    if key not in cfg:
        return None
    value, path = cfg[key], join(where, key)
    if placeholder(value):
        return None
    try:
        size = parse_size(value)
    except ValueError as exc:
        out.error(path, f"{key}: {exc}", f'e.g. "{key}": "256MB"')
        return None
    return size


def _check_mode(cfg: Mapping[str, Any], v: Version, where: str, out: Collector,
                segment: int | None) -> None:
    """mode (0.22+) decides whether this server must contribute memory (global_segment_size)."""
    mode, path = cfg.get("mode"), join(where, "mode")
    has_mode = table().has(v, "mooncake.mode")
    if "mode" in cfg and mode not in MOONCAKE_MODES:
        out.error(path, f"mode {mode!r} is not embedded or standalone-store (vLLM raises "
                  "ValueError)",
                  did_you_mean(mode, MOONCAKE_MODES) + 'use "embedded" or "standalone-store"')
        return
    since = table().capability("mooncake.mode").span.since
    if "mode" in cfg and not has_mode:
        out.drop(path, f"vLLM {v} does not read mode; it always runs embedded",
                 f"remove mode, or upgrade vLLM to >= {since} for {mode}")
    seg_path = join(where, "global_segment_size")
    if not has_mode:
        if segment == 0:
            out.warn(seg_path, f"global_segment_size is 0 and vLLM {v} always runs embedded: this "
                     "server contributes no memory to the store",
                     'e.g. "global_segment_size": "256MB"')
        return
    effective = mode or "embedded"  # vLLM's default
    if effective == "embedded" and segment == 0:
        default = "" if mode else " (the default)"
        out.error(seg_path, f"global_segment_size is 0 in embedded mode{default}: vLLM raises "
                  "ValueError (embedded mode requires global_segment_size > 0)",
                  'give it memory (e.g. "256MB"), or set "mode": "standalone-store" with a '
                  "separate store server")
    elif effective == "standalone-store" and segment != 0:
        given = ("not set (vLLM defaults it to 4 GiB)" if segment is None
                 else repr(cfg.get("global_segment_size")))
        out.error(seg_path, f"mode is standalone-store but global_segment_size is {given}: vLLM "
                  "raises ValueError (standalone-store requires global_segment_size == 0)",
                  'set "global_segment_size": 0 (the store server holds the memory)')


def _check_versioned_keys(cfg: Mapping[str, Any], v: Version, where: str, out: Collector) -> None:
    if "tenant_id" in cfg and not table().has(v, "mooncake.tenant_id"):
        since = table().capability("mooncake.tenant_id").span.since
        out.drop(join(where, "tenant_id"), f"vLLM {v} does not read tenant_id (first read in "
                  f"{since}): keys are not isolated, this deployment shares keys with every other "
                  "user of the master", f"upgrade vLLM to >= {since} (a tenant isolates only on a master run "
                  "with --enable_multi_tenants), or give each deployment its own master (a cache_prefix scopes "
                  "kvctl's clears, not vLLM's own connector reset)")
    if "enable_offload" in cfg:
        path, value = join(where, "enable_offload"), cfg["enable_offload"]
        if not table().has(v, "mooncake.enable_offload"):
            since = table().capability("mooncake.enable_offload").span.since
            out.drop(path, f"vLLM {v} does not read enable_offload (first read in {since}): no "
                     "offload happens", f"remove it, or upgrade vLLM to >= {since}")
        elif not isinstance(value, bool) and not placeholder(value):
            from kvctl.validate.offloading import says_bool

            said = says_bool(str(value)) if isinstance(value, str) else bool(value)
            if said is not bool(value):  # bool("false") is True: what the file says does not happen
                (out.drop if said is False else out.warn)(
                    path, f"enable_offload is {value!r}, not true/false: vLLM reads it with bool(), so "
                    f"it is {bool(value)} (any non-empty string, \"false\" too, turns it on)",
                    '"enable_offload": true or false (JSON booleans)')


def _check_mooncake_keys(cfg: Mapping[str, Any], where: str, out: Collector, who: Reader,
                         v: Version) -> None:
    keys = who.keys or MOONCAKE_KEYS
    reader = f"vLLM {v}'s {'V0 ' if who.kind.startswith('v0') else ''}{who.connector}"
    for key in cfg:
        path = join(where, key)
        if key in keys or (who.kind == "v1-store" and key in MOONCAKE_KEYS):
            continue  # read, or read by another release (_check_versioned_keys says which)
        if key == "local_hostname":
            out.drop(path, f"local_hostname is not read by {reader}", _hostname_fix(v))
        else:
            out.drop(path, f"'{key}' is not a key {reader} reads; Mooncake ignores unknown keys",
                     did_you_mean(key, keys) + f"remove {key}")


def _hostname_fix(v: Version) -> str:
    """Where release `v` takes the host it registers from, from the extracted env facts:
    MOONCAKE_REQUESTER_LOCAL_HOSTNAME from 0.22.0 (rdma_utils.get_requester_local_hostname); before,
    the store worker registers get_ip(), which reads VLLM_HOST_IP (store/worker.py:566 in 0.21.0)."""
    from kvctl.facts import env_vars

    if env_vars.reads(v, "MOONCAKE_REQUESTER_LOCAL_HOSTNAME"):
        return ("export MOONCAKE_REQUESTER_LOCAL_HOSTNAME=<host> instead (else the host IP is used), "
                "and remove the key")
    since = next((s for s, _ in env_vars.history("MOONCAKE_REQUESTER_LOCAL_HOSTNAME")), None)
    later = f" (MOONCAKE_REQUESTER_LOCAL_HOSTNAME exists from vLLM {since})" if since else ""
    return (f"export VLLM_HOST_IP=<host> instead: vLLM {v} registers the host get_ip() returns, which "
            f"reads VLLM_HOST_IP{later}; and remove the key")
