"""The shared-master hazard in a config: a deployment that expects to share its Mooncake master (a
cache_prefix) or a verl trainer that sleeps and resets its engines every step, on a vLLM whose own
sleep, default pause and connector reset wipe every deployment's keys on that master
(kvctl.facts.shared_master). A warning: vLLM starts, and a deployment alone on its master loses
nothing of anyone else's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from kvctl.facts.shared_master import STORE_CONNECTOR, isolation, master_wipe
from kvctl.facts.verl import FREE_CACHE_ENGINE, HYBRID_ENGINE, VERL_RELEASE
from kvctl.validate.model import Collector, placeholder, value_at

_FALSE = ("false", "no", "off", "0")


def check_prefix_isolation(cfg: Mapping[str, Any], v: Version, path: str, out: Collector) -> None:
    """A cache_prefix says "this master is shared": say that this deployment's own vLLM wipes the others."""
    name = cfg.get("kv_connector")
    wipe = master_wipe(v, [name]) if isinstance(name, str) else None
    if wipe is None:
        return
    out.warn(path, f"cache_prefix {cfg.get('kv_connector_extra_config', {}).get('cache_prefix')!r} does not "
             f"isolate this deployment on a shared master: {wipe.message(f'its own vLLM {v}')}", isolation(v))


def check_verl_shared_master(tree: dict[str, Any], connectors: set[str], v: Version, path: str,
                             out: Collector) -> None:
    """verl resets the connector after every weight sync and, in a hybrid rollout, sleeps every engine
    each step: on a release where both reach MooncakeStoreConnector's master-wide remove_all, a verl
    job wipes every other deployment on its master every step."""
    if STORE_CONNECTOR not in connectors:
        return
    wipe = master_wipe(v, [STORE_CONNECTOR])
    if wipe is None:
        return
    # vllm_async_server.py:864-870 (clear_kv_cache, after every weight load), :841/:849 (wake_up),
    # :892 (resume_kv_cache): reset_prefix_cache(reset_connector=True) in every rollout mode
    calls = ("reset_prefix_cache(reset_connector=True) after every weight sync "
             "(verl/workers/rollout/vllm_rollout/vllm_async_server.py:870, and :841, :849, :892)")
    hybrid = _on(value_at(tree, HYBRID_ENGINE)) and _on(value_at(tree, FREE_CACHE_ENGINE))
    if hybrid and "sleep" in wipe.call_names:
        # the trainer's workers are the rollout (replica.py:131-137 init_hybrid -> RolloutMode.HYBRID);
        # sleep() -> _sleep_hybrid -> engine.sleep(level 1 or 2) (vllm_async_server.py:853-858, 1307-1316)
        calls = ("sleep(level=1 or 2) of every engine each step, its rollout being hybrid "
                 f"({HYBRID_ENGINE} and {FREE_CACHE_ENGINE} are true, verl's defaults; "
                 "vllm_async_server.py:853-858, :1307-1316), and " + calls)
    out.warn(path, f"verl {VERL_RELEASE} calls {calls}; on vLLM {v} each of these is {STORE_CONNECTOR}'s "
             f"master-wide remove_all(force=True) (from vLLM {wipe.since}, {wipe.source}): every other "
             "deployment on this job's Mooncake master loses its keys every step, whatever cache_prefix "
             "kvctl scopes its own clears to", isolation(v))


def _on(value: Any) -> bool:
    """verl's booleans, default true (None: not set; a placeholder is not judged, taken as the default)."""
    if value is None or placeholder(value):
        return True
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE
    return bool(value)
