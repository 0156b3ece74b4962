"""The shared-master hazard: a fleet's own vLLM calls that wipe every deployment's keys on the
Mooncake master it shares, whatever cache_prefix scopes kvctl's clears.

From vLLM 0.23.0 MooncakeStoreConnector.reset_cache() is a master-wide `remove_all(force=True)`
(vllm_facts.json: connector.py:203), and three calls reach it: a connector reset
(reset_prefix_cache(reset_connector=True), HTTP reset_external=true: verl sends it after every
weight sync), a sleep at level >= 1 (EngineCore.sleep -> pause_scheduler(clear_cache=level >= 1)) and
a pause with its default clear_cache=true (_finish_pause -> _reset_caches(reset_connector=True)), the
last two from 0.23.0 (capability http.pause.clear_cache_resets_connector; FACTS sections 2, 9). From
0.34.0 /sleep takes reset_connector (default true; dev/sleep/api_router.py:31): a sleep wipes only
with its default.

What isolates (measured on a real mooncake_master 0.3.13.post1, docs/reset.md "Shared masters"): a
master per deployment; or, from vLLM 0.28 (it reads tenant_id from mooncake.json and sets its store
client up with it), a tenant per deployment on a master started with multi-tenancy, where a client's
remove_all(force=True) removed only its own tenant's keys. A default master ignores tenants.

Used by compat check, config validate, the reset plan, status and doctor: one wording.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from packaging.version import Version

from kvctl.facts.capabilities import table
from kvctl.facts.versions import parse_version

STORE_CONNECTOR = "MooncakeStoreConnector"
PAUSE_RESETS = "http.pause.clear_cache_resets_connector"  # sleep resets through the same pause (0.23+)
TENANT = "mooncake.tenant_id"
# The master flags that make tenants namespaces (without them every tenant shares one namespace).
MULTI_TENANT_FLAGS = "--enable_multi_tenants=true --tenant_quota_connector_uri=FILE"
QUOTA_FILE = "version: 1, tenants: [{name: TENANT, quota: 4GB}, ...]"

CONNECTOR_RESET = ("connector reset (POST /reset_prefix_cache?reset_external=true; Python "
                   "reset_prefix_cache(reset_connector=True), which verl sends after every weight sync)")
SLEEP = "sleep (POST /sleep, level 1 or 2; Python sleep(level>=1))"
# From vLLM 0.34.0 a sleep can keep the connector (SLEEP_KEEPS): only its default still wipes.
SLEEP_KEEPS = "http.sleep.reset_connector"
SLEEP_DEFAULT = ("sleep with the default reset_connector=true (POST /sleep, level 1 or 2, without "
                 "reset_connector=false; Python sleep(level>=1))")
DEFAULT_PAUSE = ("pause with the default clear_cache=true (POST /pause without clear_cache=false; "
                 "Python pause_generation())")


@dataclass(frozen=True)
class MasterWipe:
    """Which of a release's own calls wipe the whole master through `connector`, since when."""

    version: str
    connector: str
    calls: tuple[str, ...]
    since: str  # the first release whose connector reset is master-wide
    source: str

    @property
    def call_names(self) -> str:
        """'sleep, default pause, connector reset' (short, for tables)."""
        short = {CONNECTOR_RESET: "connector reset", SLEEP: "sleep", SLEEP_DEFAULT: "default sleep",
                 DEFAULT_PAUSE: "default pause"}
        return ", ".join(short[c] for c in self.calls)

    def message(self, who: str | None = None) -> str:
        """One sentence: what wipes the master, on which releases, and why a cache_prefix does not help."""
        who = who or f"vLLM {self.version}"
        return (f"{who} wipes EVERY deployment's keys on a shared Mooncake master ({self.connector}'s reset is "
                f"a master-wide remove_all(force=True) from vLLM {self.since}, {self.source}) on every "
                f"{_join(self.calls)}; a cache_prefix scopes only kvctl's own clears, not these")


def master_wipe(version: str | Version, layout: Iterable[str] | None) -> MasterWipe | None:
    """The hazard for a replica of `version` running the connectors `layout` (MultiConnector's children
    included), or None when none of its connector resets reaches the whole master."""
    v = parse_version(version)
    t = table()
    wide = [n for n in (layout or ()) if t.connector_reset_is_master_wide(v, n)]
    if not wide:
        return None
    sleep = SLEEP_DEFAULT if t.has(v, SLEEP_KEEPS) else SLEEP
    calls = [sleep, DEFAULT_PAUSE] if t.has(v, PAUSE_RESETS) else []
    since, source = _first_master_wide(wide[0])
    return MasterWipe(str(v), wide[0], tuple(calls + [CONNECTOR_RESET]), since, source)


def isolation(version: str | Version | None = None) -> str:
    """What keeps other deployments' keys, said for `version` (None: any release)."""
    private = "give each deployment its own Mooncake master (kvctl serve starts one per run)"
    tenant_since = table().capability(TENANT).span.since
    return _isolation(version, private, tenant_since) + _sleep_keeps(version)


def _sleep_keeps(version: str | Version | None) -> str:
    """From 0.34.0 a trainer that sleeps its engines can stop that one wipe (not its connector resets)."""
    since = table().capability(SLEEP_KEEPS).span.since
    if version is not None and not table().has(parse_version(version), SLEEP_KEEPS):
        return ""
    return (f"; from vLLM {since} a trainer's sleep can also spare the store (POST /sleep?reset_connector=false, "
            "LLM.sleep(reset_connector=False)), though its connector resets still wipe it")


def _isolation(version: str | Version | None, private: str, tenant_since: str) -> str:
    if version is not None and not table().has(parse_version(version), TENANT):
        return (f"{private}; Mooncake tenants need vLLM >= {tenant_since} (the first to read tenant_id), "
                "so on this release a private master is the only isolation")
    return (f"{private}; or (vLLM >= {tenant_since}) a tenant per deployment, tenant_id in each mooncake.json, "
            f"on a master started with {MULTI_TENANT_FLAGS} (a YAML file listing every tenant: {QUOTA_FILE}); "
            "a default master ignores tenant_id, and kvctl counts and verifies only the default tenant's keys")


def _first_master_wide(name: str) -> tuple[str, str]:
    rows = table().facts["connectors"].get(name, {}).get("reset_cache", [])
    wide = [r for r in rows if any("remove_all(" in c for c in r.get("calls", []))]
    first = min(wide, key=lambda r: Version(r["since"]))
    return first["since"], f"{first.get('file', '?').rsplit('/', 1)[-1]}:{first.get('line', '?')}"


def _join(items: tuple[str, ...]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
