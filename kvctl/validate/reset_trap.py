"""The reset trap: a connector that keeps KV outside vLLM's prefix cache but whose reset_cache()
does not clear it in a release, so /reset_prefix_cache?reset_external=true answers success and the
stale KV stays. A warning (vLLM starts; the trap is in what a reset then does)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from kvctl.facts.capabilities import table
from kvctl.validate.model import Collector, join


def check_reset_trap(cfg: Mapping[str, Any], v: Version, where: str, out: Collector,
                 env: Mapping[str, str]) -> None:
    """A connector that keeps KV outside vLLM's prefix cache but whose reset_cache() does not clear
    it in `v`: vLLM's reset answers success and the stale KV stays (kvctl reset clears a master)."""
    name = cfg.get("kv_connector")
    if not table().has(v, "http.reset_prefix_cache.reset_external"):
        return  # no HTTP connector reset to be fooled by (kvctl's floor says so elsewhere)
    if not isinstance(name, str) or table().registered(v, name) is None:
        return
    info = table().connector(name)
    if info is None or info.store not in ("mooncake-master", "other") or info.reset.contains(v):
        return
    on_master = info.store == "mooncake-master" and (name != "LMCacheConnectorV1"
                                                     or _lmcache_uses_mooncake(cfg, env))
    where_kv = "on the Mooncake master" if on_master else f"in {name}'s own storage"
    since = info.reset.since
    out.warn(join(where, "kv_connector"), f"on vLLM {v}, {name}'s reset_cache() does not clear "
             f"{'the Mooncake store' if on_master else 'the KV it stores'}: /reset_prefix_cache?reset_external=true answers success and "
             f"the stale KV stays {where_kv}",
             (f"upgrade vLLM to >= {since}, or " if since and not info.reset.never else "")
             + ("clear the master as part of the reset (kvctl reset --connector does)" if on_master
                else "clear that storage yourself after a weight update (restart the servers, or "
                     "the store's own tool)"))


def _lmcache_uses_mooncake(cfg: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    """LMCache keeps KV on a Mooncake master only with a mooncakestore:// remote (its config
    file, LMCACHE_REMOTE_URL, or the extra config say so)."""
    if str(env.get("LMCACHE_REMOTE_URL", "")).startswith("mooncakestore://"):
        return True
    return "mooncake" in repr(cfg.get("kv_connector_extra_config") or {}).lower()
