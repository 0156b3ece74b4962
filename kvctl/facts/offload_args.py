"""vLLM's native KV offloading settings per release (section "offload_args" of vllm_facts.json,
read by tools/capabilities/offload_args_facts.py): CacheConfig's kv_offloading_size /
kv_offloading_backend, and the kv_transfer_config VllmConfig._post_init_kv_transfer_config
builds from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from kvctl.facts.capabilities import _interval_at, _where, table
from kvctl.facts.versions import parse_version

SIZE, BACKEND = "kv_offloading_size", "kv_offloading_backend"


@dataclass(frozen=True)
class OffloadField:
    name: str  # kv_offloading_size
    flag: str  # --kv-offloading-size
    annotation: str  # "float | None"
    default: str | None  # as vLLM's source writes it: "None", "'native'"
    choices: tuple[str, ...]  # a Literal's values (the backend), else ()
    source: str  # "file:line in <release>"


@dataclass(frozen=True)
class Backend:
    """What _post_init_kv_transfer_config writes for one kv_offloading_backend value."""

    name: str
    connector: str | None
    env_connector: tuple[str, str] | None  # (env var, connector it picks when set): SimpleCPUOffload
    extra: dict[str, str]  # kv_connector_extra_config key -> the expression vLLM writes
    extra_mode: str | None  # "update" (into the user's extra config), "replace" (the user's dropped)
    source: str


@dataclass(frozen=True)
class OffloadArgs:
    fields: dict[str, OffloadField]
    gate: str | None  # the field whose None makes _post_init_kv_transfer_config return at once
    gate_source: str
    requires: str | None  # the field it raises without (once past the gate)
    requires_message: str | None
    kv_role: str | None  # the kv_role it writes whatever the backend
    backends: dict[str, Backend]
    source: str  # where _post_init_kv_transfer_config is
    # num_kv_ranks as vLLM computes it ("self.parallel_config.tensor_parallel_size *
    # self.parallel_config.pipeline_parallel_size"): the written sizes are divided by it
    ranks: str | None = None
    ranks_source: str = ""

    def default_backend(self) -> str | None:
        """The backend a release uses when none is given ('native' from 0.14.0)."""
        text = self.fields[BACKEND].default if BACKEND in self.fields else None
        return text.strip("'\"") if text and text != "None" else None


def _section() -> dict[str, Any]:
    return table().facts.get("offload_args", {})


def _row(entry: dict[str, Any], attr: str, v: Version) -> dict[str, Any] | None:
    rows = entry.get(attr, [])
    return _interval_at(rows.get("values", []) if isinstance(rows, dict) else rows, v)


def _field(name: str, v: Version) -> OffloadField | None:
    entry = _section().get(name, {})
    span, types = _row(entry, "spans", v), _row(entry, "types", v)
    if span is None or types is None:
        return None
    flag, choices = _row(entry, "flag", v), _row(entry, "choices", v)
    return OffloadField(name, flag["value"] if flag else "--" + name.replace("_", "-"), types.get("type", ""),
                        types.get("default"), tuple(choices["value"]) if choices else (), _where(span))


def _backend(name: str, row: dict[str, Any]) -> Backend:
    env = row.get("env_connector")
    return Backend(name, row.get("connector"), (env["env"], env["connector"]) if env else None,
                   dict(row.get("extra") or {}), row.get("extra_mode"), _where(row))


def offload_args(version: str | Version) -> OffloadArgs | None:
    """The two settings in `version`, or None where CacheConfig has neither (before 0.11.1)."""
    v = parse_version(version)
    fields = {n: f for n in (SIZE, BACKEND) if (f := _field(n, v)) is not None}
    if not fields:
        return None
    post = _section().get("post_init", {})
    span, gate, requires, role, ranks = (_row(post, a, v) for a in ("spans", "gate", "requires", "kv_role", "ranks"))
    backends = {name: _backend(name, row) for name, entry in post.get("params", {}).items()
                if (row := _row(entry, "values", v)) is not None}
    return OffloadArgs(fields, gate["value"] if gate else None, _where(gate) if gate else "",
                       requires["value"] if requires else None, requires["message"] if requires else None,
                       role["value"] if role else None, backends, _where(span) if span else "",
                       ranks["value"] if ranks else None, _where(ranks) if ranks else "")


def offload_args_since() -> str | None:
    """The first release whose CacheConfig has kv_offloading_size."""
    rows = _section().get(SIZE, {}).get("spans", [])
    return min((r["since"] for r in rows), key=Version, default=None)


def backend_changes_after(version: str | Version, backend: str) -> str | None:
    """The first release after `version` whose _post_init_kv_transfer_config writes something else
    for `backend` (0.14.0 for native after 0.13: cpu_bytes_to_use instead of num_cpu_blocks 0)."""
    v = parse_version(version)
    rows = _section().get("post_init", {}).get("params", {}).get(backend, {}).get("values", [])
    now = _interval_at(rows, v)
    changed = [r["since"] for r in rows if Version(r["since"]) > v and now is not None
               and (r.get("connector"), r.get("extra")) != (now.get("connector"), now.get("extra"))]
    return min(changed, key=Version, default=None)

