"""What a reset can and cannot do on one vLLM version with one connector layout.

`assess()` turns the capability table into per-operation answers (works / silent no-op /
missing) and a verdict; `matrix()` is the versions x capabilities table behind docs/compat.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from packaging.version import Version

from kvctl.facts.capabilities import CapabilityTable, table
from kvctl.facts.pausing import pause_rejects

Status = Literal["works", "silent-no-op", "missing", "not-applicable", "unknown"]
Verdict = Literal["hard-reset", "hard-reset-with-master-clear", "no-hard-reset"]
OPERATIONS = ("prefix_cache", "external_store", "mm_cache", "encoder_cache", "pause")
OPERATION_TITLES = {
    "prefix_cache": "local prefix cache",
    "external_store": "external store (connector)",
    "mm_cache": "multimodal cache",
    "encoder_cache": "encoder cache",
    "pause": "pause / resume",
}


@dataclass
class Operation:
    name: str
    status: Status
    detail: str


@dataclass
class CompatReport:
    vllm_version: str
    version_source: str
    layout: list[str]  # connector names, MultiConnector first then its children
    layout_source: str
    operations: list[Operation]
    verdict: Verdict
    reasons: list[str] = field(default_factory=list)  # why the verdict is not "hard-reset"
    fixes: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)  # true, but not blocking the verdict
    # this release's own calls that wipe every deployment on a shared master (kvctl.facts.shared_master):
    # {connector, since, source, calls, message, isolation}; None when none does
    shared_master: dict[str, Any] | None = None
    # for a deployment that salts each request with its weight version instead of resetting
    # (kvctl.facts.salting): {takes_salt, tiers: [{tier, salt, detail, source}], isolates, verdict, fixes}
    salt: dict[str, Any] | None = None

    def meets_hard_reset(self, with_master: bool = False) -> bool:
        """Can kvctl guarantee a hard reset? with_master: kvctl reset will be given --master."""
        return self.verdict == "hard-reset" or (with_master and self.verdict == "hard-reset-with-master-clear")

    def operation(self, name: str) -> Operation:
        return next(op for op in self.operations if op.name == name)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def leaf_connectors(kv_transfer_config: dict[str, Any] | None) -> list[str]:
    """The connectors that hold KV (MultiConnector replaced by its children)."""
    if not kv_transfer_config or not kv_transfer_config.get("kv_connector"):
        return []
    name = str(kv_transfer_config["kv_connector"])
    extra = kv_transfer_config.get("kv_connector_extra_config") or {}
    children = extra.get("connectors") if isinstance(extra, dict) else None
    if name == "MultiConnector" and isinstance(children, list):
        return [n for c in children if isinstance(c, dict) for n in leaf_connectors(c)]
    return [name]


def cache_prefix_of(kv_transfer_config: dict[str, Any] | None) -> str | None:
    """The cache_prefix of the Mooncake store connector in a config (a MultiConnector's child
    included): the prefix of this deployment's keys on the master (`<cache_prefix>@...`)."""
    if not kv_transfer_config:
        return None
    extra = kv_transfer_config.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        return None
    if kv_transfer_config.get("kv_connector") == "MooncakeStoreConnector":
        prefix = extra.get("cache_prefix")
        return str(prefix) if prefix else None
    children = extra.get("connectors") if isinstance(extra.get("connectors"), list) else []
    found = [cache_prefix_of(c) for c in children if isinstance(c, dict)]
    return next((p for p in found if p), None)


def layout_of(kv_transfer_config: dict[str, Any] | None) -> list[str]:
    if not kv_transfer_config or not kv_transfer_config.get("kv_connector"):
        return []
    top = str(kv_transfer_config["kv_connector"])
    leaves = leaf_connectors(kv_transfer_config)
    return [top] + leaves if top == "MultiConnector" else leaves


def assess(version: Version, kv_transfer_config: dict[str, Any] | None,
           version_source: str = "--vllm-version", layout_source: str = "") -> CompatReport:
    t = table()
    leaves = leaf_connectors(kv_transfer_config)
    report = CompatReport(
        vllm_version=str(version), version_source=version_source,
        layout=layout_of(kv_transfer_config), layout_source=layout_source,
        operations=[], verdict="hard-reset",
    )
    report.operations = [
        _prefix_cache(t, version),
        _external_store(t, version, leaves, report),
        _simple(t, version, "mm_cache", "http.reset_mm_cache", "POST /reset_mm_cache"),
        _simple(t, version, "encoder_cache", "http.reset_encoder_cache", "POST /reset_encoder_cache"),
        _pause(t, version),
    ]
    _conclude(t, version, report)
    report.shared_master = _shared_master(version, leaves)
    from kvctl.facts.salting import assess_salt

    report.salt = assess_salt(version, leaves).to_dict()
    return report


def _shared_master(version: Version, leaves: list[str]) -> dict[str, Any] | None:
    """The calls of this release that wipe a whole shared master, and what isolates (not a verdict:
    a deployment alone on its master loses nothing of anyone else's)."""
    from kvctl.facts.shared_master import isolation, master_wipe

    wipe = master_wipe(version, leaves)
    if wipe is None:
        return None
    return {"connector": wipe.connector, "since": wipe.since, "source": wipe.source, "calls": list(wipe.calls),
            "message": wipe.message(), "isolation": isolation(version)}


def _prefix_cache(t: CapabilityTable, v: Version) -> Operation:
    return Operation("prefix_cache", "works", "POST /reset_prefix_cache")


def _simple(t: CapabilityTable, v: Version, name: str, cap: str, route: str) -> Operation:
    if t.has(v, cap):
        return Operation(name, "works", route)
    return Operation(name, "missing", f"{route} first in vLLM {t.capability(cap).span.since}")


def _pause(t: CapabilityTable, v: Version) -> Operation:
    if not t.has(v, "http.pause"):
        return Operation("pause", "missing", f"/pause first in vLLM {t.capability('http.pause').span.since}")
    params = "mode=abort|wait|keep" if t.has(v, "http.pause.mode") else "wait_for_inflight_requests, clear_cache"
    gated = "dev mode" if t.has(v, "http.pause.dev_gated") else "not dev-gated"
    rejects = "|".join(m for m in ("abort", "wait") if pause_rejects(v, m))
    if rejects:  # 0.33+: EngineCore._reject_add_while_paused
        gated += (f"; paused with {rejects}, new requests get 503 engine_paused until /resume "
                  "(kvctl pauses with keep where no KV connector runs; elsewhere it says so first)")
    return Operation("pause", "works", f"POST /pause?{params} ({gated})")


def _external_store(t: CapabilityTable, v: Version, leaves: list[str], report: CompatReport) -> Operation:
    if not leaves:
        return Operation("external_store", "not-applicable", "no KV connector: nothing external to clear")
    if not t.has(v, "http.reset_prefix_cache.reset_external"):
        since = t.capability("http.reset_prefix_cache.reset_external").span.since
        return Operation("external_store", "missing",
                         f"/reset_prefix_cache has no reset_external before vLLM {since}")
    statuses = [_connector_reset(t, v, name) for name in leaves]
    worst = next((s for s in ("unknown", "silent-no-op") if any(st == s for st, _ in statuses)), "works")
    detail = "; ".join(d for _, d in statuses)
    return Operation("external_store", worst, "reset_external=true: " + detail)  # type: ignore[arg-type]


def _connector_reset(t: CapabilityTable, v: Version, name: str) -> tuple[Status, str]:
    conn = t.connector(name)
    if conn is None:
        return "unknown", f"{name}: not in kvctl's table"
    if not conn.span.contains(v):
        return "unknown", f"{name}: not in vLLM {v} (first in {conn.span.since})"
    if conn.reset.contains(v):
        return "works", f"{name} clears its store"
    if conn.reset.never:
        return "silent-no-op", f"{name} has no reset_cache in any release (reports success, clears nothing)"
    return "silent-no-op", f"{name} clears its store only from vLLM {conn.reset.since} (reports success, clears nothing)"


def _conclude(t: CapabilityTable, v: Version, report: CompatReport) -> None:
    """Verdict, reasons and fixes from the operations."""
    if not t.is_supported(v):
        report.verdict = "no-hard-reset"
        report.reasons.append(f"vLLM {v} is older than {t.min_supported}: no HTTP connector reset")
        report.fixes.append(f"upgrade vLLM to >= {_target_release(t, report.layout)}")
        return
    missing = [n for n in report.layout if t.connector_available(v, n) == "no"]
    if missing:
        report.verdict = "no-hard-reset"
        for name in missing:
            since = t.connector(name).span.since  # type: ignore[union-attr]
            report.reasons.append(f"{name} does not exist in vLLM {v}; it first appears in {since}")
            report.fixes.append(f"upgrade vLLM to >= {max(Version(since), Version(_target_release(t, [name])))}")
    elif report.operation("external_store").status in ("silent-no-op", "unknown"):
        _conclude_connector_gap(t, v, report)
    if t.is_newer_than_known(v) and not any("newer than" in c for c in report.caveats):
        report.caveats.append(f"vLLM {v} is newer than {t.newest_known}, the newest release kvctl's facts were "
                              f"checked against: every row assumes it behaves like {t.newest_known}")
    for name in ("mm_cache", "encoder_cache"):
        op = report.operation(name)
        if op.status == "missing":
            report.caveats.append(f"{OPERATION_TITLES[name]} reset is missing ({op.detail}): "
                                  "multimodal models keep it across a reset")


def _conclude_connector_gap(t: CapabilityTable, v: Version, report: CompatReport) -> None:
    """Some connector cannot clear its store on v: can an upgrade or a master clear fix it?"""
    failing = [n for n in report.layout if n != "MultiConnector" and _connector_reset(t, v, n)[0] != "works"]
    known = [t.connector(n) for n in failing]
    status = report.operation("external_store").status
    report.reasons.append(f"the connector reset is a {status} for {', '.join(failing)}")
    upgrades = [c.reset.since for c in known if c is not None and c.reset.since and not c.reset.never]
    if upgrades and len(upgrades) == len(failing):
        report.fixes.append(f"upgrade vLLM to >= {max(upgrades, key=Version)}")
    if all(c is not None and c.store == "mooncake-master" for c in known):
        report.verdict = "hard-reset-with-master-clear"
        report.fixes.append("let kvctl clear the Mooncake master directly: kvctl reset --connector "
                            "--master HOST:PORT (remove_all?force=true; clears the whole master)")
        return
    report.verdict = "no-hard-reset"
    if len(upgrades) < len(failing):
        report.fixes.append("no vLLM release resets " + ", ".join(
            n for n, c in zip(failing, known) if c is None or c.reset.never)
            + "'s store: clear it out of band, or move to MooncakeStoreConnector (vLLM >= 0.23.0)")


def _target_release(t: CapabilityTable, layout: list[str]) -> str:
    """The first release that resets this layout's store (or kvctl's floor)."""
    candidates = [t.min_supported]
    for name in layout:
        conn = t.connector(name)
        if conn and conn.reset.since and not conn.reset.never:
            candidates.append(Version(conn.reset.since))
    return str(max(candidates))


# -- the matrix ---------------------------------------------------------------------------
def matrix() -> dict[str, Any]:
    """Versions x capabilities, from the table alone (rows: capabilities, connectors, fields)."""
    t = table()
    versions = t.matrix_versions
    rows: list[dict[str, Any]] = []
    for cap in t.capabilities.values():
        rows.append(_row(cap.id, cap.title, cap.span, cap.source, versions))
    for conn in t.connectors.values():
        rows.append(_row(f"connector.{conn.name}", f"{conn.name} registered", conn.span, conn.source, versions))
        rows.append(_row(f"connector.{conn.name}.reset", f"{conn.name} reset clears its store",
                         conn.reset, conn.source, versions))
    for fld in t.fields.values():
        rows.append(_row(f"field.{fld.name}", f"KVTransferConfig.{fld.name}", fld.span, fld.source, versions))
    return {"versions": [str(v) for v in versions], "rows": rows}


def _row(row_id: str, title: str, span: Any, source: str, versions: list[Version]) -> dict[str, Any]:
    return {
        "id": row_id, "title": title, "since": span.since, "until": span.until, "source": source,
        "cells": {str(v): span.contains(v) for v in versions},
    }


def matrix_markdown() -> str:
    """The matrix as the Markdown table docs/compat.md embeds."""
    data = matrix()
    head = "| capability | " + " | ".join(data["versions"]) + " |"
    rule = "|---|" + "---|" * len(data["versions"])
    lines = [head, rule]
    for row in data["rows"]:
        cells = " | ".join("yes" if row["cells"][v] else "-" for v in data["versions"])
        lines.append(f"| {_md(row['title'])} | {cells} |")
    lines += ["", "Where each row comes from:", "", "| capability | since | until | source |", "|---|---|---|---|"]
    for row in data["rows"]:
        since = row["since"] or "all supported"
        lines.append(f"| {_md(row['title'])} | {since} | {row['until'] or ''} | {_md(row['source'])} |")
    return "\n".join(lines + [""] + salt_markdown()) + "\n"


def salt_markdown() -> list[str]:
    """Per connector: does it carry a request's cache_salt (capabilities.yaml salt_tiers), with the
    releases that register it and where vLLM's sources say what its keys are built from."""
    from kvctl.facts.salting import WORDS, salt_tiers

    t = table()
    lines = ["Whether each tier carries a request's `cache_salt` (a deployment that salts by weight version "
             "instead of resetting; `kvctl compat check` answers per layout, `kvctl salt check` proves it live):",
             "", "| tier | salt | vLLM releases | keys read (vLLM sources) | source |", "|---|---|---|---|---|"]
    local = t.capability("engine.cache_salt_in_block_hash")
    lines.append(f"| local prefix cache | honours | >= {local.span.since} | block hashes | {_md(local.source)} |")
    for row in salt_tiers().values():
        conn = t.connector(row.name)
        regs = t.facts["connectors"].get(row.name, {}).get("v1", [])
        since = conn.span.since if conn else min((r["since"] for r in regs), key=Version, default=None)
        keys = t.facts["connectors"].get(row.name, {}).get("salt_keys", {}).get("values", [])
        read = "; ".join(f"{k['value']} ({k['since']}{'-' + k['until'] if k.get('until') else '+'}, "
                         f"{k['file'].rsplit('/', 1)[-1]}:{k['line']})" for k in keys) or "-"
        word = row.salt if row.salt in WORDS else row.salt
        lines.append(f"| {row.name} | {word} | {'>= ' + since if since else '-'} | {_md(read)} | {_md(row.source)} |")
    return lines


def _md(text: str) -> str:
    return text.replace("|", "&#124;")
