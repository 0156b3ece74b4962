"""A recording stand-in of kvctl's four API calls, for the placement tests: each call notes what the
fleet was doing (window and the weights each replica served) when the hook made it. It answers as the
contract says: a paused or sleeping replica gets no canary, its check is pending."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.doubles import VllmDouble
from tests.lib.verl_stand_ins import window


@dataclass
class FakeReplicaResult:
    name: str
    reset: bool
    error: str | None = None


@dataclass
class FakeReceipt:
    ok: bool
    replicas: list[FakeReplicaResult]
    pending: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    summary: str = ""
    exit_code: int = 0
    plan: Any = field(default_factory=lambda: type("Plan", (), {"error": None, "hint": None})())

    @property
    def failed(self) -> bool:  # kvctl.reset.receipt.Receipt.failed: a pending check is no failure
        return any(not r.reset for r in self.replicas) or bool(self.stale)

    def metrics(self, prefix: str = "kvctl/") -> dict[str, float]:
        return {f"{prefix}ok": float(self.ok), f"{prefix}verified": float(self.ok),
                f"{prefix}replicas": float(len(self.replicas)), f"{prefix}pending_replicas": float(len(self.pending)),
                f"{prefix}stale_replicas": float(len(self.stale)), f"{prefix}total_s": 0.01}


@dataclass
class FakeEvidence:
    urls: list[str]


@dataclass
class Call:
    op: str  # evidence | reset | check
    urls: list[str]
    windows: list[str]
    weights: list[Any]
    evidence: bool = False
    master: str | None = None


class FakeApi:
    def __init__(self, doubles: list[VllmDouble], replicas: list[Any] | None = None) -> None:
        self.by_url = {d.url: d for d in doubles}
        self.replica_of = {r.double.url: r for r in replicas or []}
        self.calls: list[Call] = []
        self.fail = 0  # so many reset/check calls answer not ok (then ok)
        self.stale = False

    def _note(self, op: str, urls: list[str], evidence: Any = None, master: str | None = None) -> Call:
        doubles = [self.by_url[u] for u in urls]
        call = Call(op, list(urls), [window(d, self.replica_of.get(d.url)) for d in doubles],
                    [getattr(d, "weights", None) for d in doubles], evidence is not None, master)
        self.calls.append(call)
        return call

    def _receipt(self, call: Call) -> FakeReceipt:
        pending = [u for u, w in zip(call.urls, call.windows, strict=True) if w in ("paused", "asleep")]
        failing = self.fail > 0
        self.fail -= 1 if failing else 0
        ok = not failing
        results = [FakeReplicaResult(u, ok, None if ok else "HTTP 500") for u in call.urls]
        stale = list(call.urls) if self.stale else []
        pending = pending if ok else []
        exit_code = 1 if not ok or stale else 3 if pending else 0  # as kvctl's: pending is exit code 3
        return FakeReceipt(exit_code == 0, results, pending, stale,
                           f"{len(call.urls)} replica(s) {'ok' if ok else 'failed'}", exit_code)

    async def take_evidence_async(self, urls: list[str], timeout: float = 10.0) -> FakeEvidence:
        self._note("evidence", urls)
        return FakeEvidence(list(urls))

    async def hard_reset_async(self, urls: list[str], *, master: str | None = None, evidence: Any = None,
                               **kwargs: Any) -> FakeReceipt:
        return self._receipt(self._note("reset", urls, evidence, master))

    async def check_evidence_async(self, evidence: Any, urls: list[str], master: str | None = None,
                                   **kwargs: Any) -> FakeReceipt:
        return self._receipt(self._note("check", urls, evidence, master))

    def install(self, monkeypatch: Any) -> FakeApi:
        from kvctl import api

        for name in ("take_evidence_async", "hard_reset_async", "check_evidence_async"):
            monkeypatch.setattr(api, name, getattr(self, name), raising=False)
        return self

    def ops(self) -> list[tuple[str, list[str], list[Any]]]:
        """(op, windows, weights) of each call: what the assertions read."""
        return [(c.op, c.windows, c.weights) for c in self.calls]
