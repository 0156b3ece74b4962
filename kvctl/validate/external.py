"""Connectors vLLM imports from outside its sources (kv_connector_module_path): judged where
kvctl knows the code (the connectors Mooncake's wheel ships, kvctl.facts.external_connectors),
said to be unchecked otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from kvctl.facts.capabilities import table
from kvctl.facts.external_connectors import known_external
from kvctl.validate.model import Collector


def check_external(name: str, module_path: str, v: Version, path: str, out: Collector) -> None:
    """A connector vLLM imports from outside its sources: judged where kvctl knows the code
    (Mooncake's wheel), else said to be unchecked."""
    known = known_external(module_path, name)
    if known is None:
        package = module_path.split(".")[0]
        out.warn(path, f"kvctl cannot check {name} from {module_path}: vLLM {v} imports it at start "
                 f"(ModuleNotFoundError unless the package '{package}' is installed on every server, "
                 "AttributeError if it has no class of that name)",
                 f"make sure '{package}' is installed on the servers and defines {name}")
        return
    if not known.takes_kv_cache_config and table().has(v, "factory.external_connector_needs_kv_cache_config"):
        since = table().capability("factory.external_connector_needs_kv_cache_config").span.since
        out.error(path, f"vLLM {v} refuses {name} from {module_path}: its constructor takes (vllm_config, "
                  f"role) in every Mooncake release ({known.where}), and from vLLM {since} an external "
                  "connector must take kv_cache_config: ValueError 'uses deprecated 2-argument "
                  "constructor signature' at start",
                  f"drop kv_connector_module_path to use vLLM's own {name}" if table().registered(v, name)
                  else "use a connector vLLM registers (e.g. MooncakeConnector without a module path)")


def loads_external_code(cfg: Mapping[str, Any], v: Version) -> bool:
    """Does vLLM `v` import a connector of this config (or a child) from its
    kv_connector_module_path whose code kvctl does not know?"""
    extra = cfg.get("kv_connector_extra_config")
    children = extra.get("connectors") if isinstance(extra, Mapping) else None
    if any(isinstance(c, Mapping) and loads_external_code(c, v) for c in children or ()):
        return True
    name, module_path = cfg.get("kv_connector"), cfg.get("kv_connector_module_path")
    if not isinstance(module_path, str) or not module_path or not isinstance(name, str):
        return False
    imported = table().connector_lookup(v) == "module_path" or table().registered(v, name) is None
    return imported and known_external(module_path, name) is None
