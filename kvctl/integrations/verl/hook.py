"""The policy of kvctl's check inside a verl run: what to do at each moment verl's weight update
gives, what a failure does to the run, and the numbers that go to verl's step metrics.

It knows nothing of verl (the managers in kvctl.integrations.verl.managers call it at verl's
places): it acts on replica URLs through kvctl's public API, in four moments of one update cycle,
per fleet (a `label`: "" for the rollout fleet, "hybrid" for the colocated set of verl's
separate-async and fully-async trainers):

1. `before_stop`: the last moment the fleet serves the OLD weights (before verl aborts, sleeps or
   updates it): kvctl.take_evidence_async primes a canary on every serving replica.
2. `after_update`: the new weights are in, verl's own reset has run, no verl request is admitted
   yet: mode "reset" hard-resets and verifies (kvctl.hard_reset_async with the evidence), mode
   "verify" only checks verl's own reset (kvctl.check_evidence_async). A replica verl left paused
   gets no canary there: its content check is pending (receipt.pending).
3. `after_resume`: verl resumed generation: the pending canaries are checked.
4. the metrics: every call leaves flat float metrics (receipt.metrics(prefix)) that the trainer
   classes merge into verl's step metrics.

policy "warn" (the default) logs and counts a failed or inconclusive check and never raises;
"raise" raises kvctl.ResetFailed (the receipt attached) once `attempts` tries, started within
`budget_s`, could not prove the fleet clean. A fleet kvctl cannot prove (rollout.data_parallel_size
> 1) is refused: logged and counted (kvctl/refused 1) under "warn", an error under "raise".
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kvctl.errors import KvctlError, UsageError
from kvctl.integrations.verl.servers import ReplicaView, ServerRecorder, run_name

log = logging.getLogger("kvctl.integrations.verl")

POLICIES = ("warn", "raise")
MODES = ("reset", "verify")
ENV = {"master": "KVCTL_MASTER", "master_rpc": "KVCTL_MASTER_RPC", "policy": "KVCTL_VERL_POLICY",
       "mode": "KVCTL_VERL_MODE", "attempts": "KVCTL_VERL_ATTEMPTS", "budget_s": "KVCTL_VERL_BUDGET_S",
       "run": "KVCTL_VERL_RUN", "state_dir": "KVCTL_STATE_DIR"}


class DataParallelRefused(UsageError):
    """A fleet whose servers front several engines each: a canary's prime and check may land on
    different engines, so kvctl cannot prove it (and will not report it clean)."""


class KvctlVerlHook:
    """kvctl's check of every weight update of a verl run (see the module docstring).

    master: the Mooncake master's admin/metrics HOST:PORT (None: $KVCTL_MASTER where the hook runs).
    run: the name the live servers are recorded under (None: verl-<trainer.experiment_name>);
    record=False records nothing. state_dir: where the record goes (None: $KVCTL_STATE_DIR, else the
    user's state dir), plus the Ray cluster's key-value store when the trainer runs under Ray.
    """

    def __init__(self, master: str | None = None, *, master_rpc: str | None = None, policy: str = "warn",
                 mode: str = "reset", attempts: int = 2, budget_s: float = 300.0, verify: bool = True,
                 timeout: float = 10.0, run: str | None = None, record: bool = True,
                 state_dir: str | None = None) -> None:
        if policy not in POLICIES:
            raise UsageError(f"policy={policy!r} is not one of {', '.join(POLICIES)}",
                             'policy="warn" logs and counts a failed check; policy="raise" stops the step')
        if mode not in MODES:
            raise UsageError(f"mode={mode!r} is not one of {', '.join(MODES)}",
                             'mode="reset" resets and verifies; mode="verify" checks verl\'s own reset')
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise UsageError(f"attempts={attempts!r} must be a whole number >= 1")
        if not isinstance(budget_s, (int, float)) or isinstance(budget_s, bool) or budget_s <= 0:
            raise UsageError(f"budget_s={budget_s!r} must be a number of seconds > 0")
        self.master, self.master_rpc, self.policy, self.mode = master, master_rpc, policy, mode
        self.attempts, self.budget_s, self.verify, self.timeout = attempts, float(budget_s), verify, timeout
        self.run, self.record, self.state_dir = run, record, state_dir
        self.experiment = self.trainer = self.model = ""  # the job, from verl's config (describe_job)
        self._fresh()

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> KvctlVerlHook:
        """Settings from the environment (names in ENV), then `overrides`. Read where it is called:
        `python -m kvctl.integrations.verl` reads them in the driver and hands the hook to verl's
        TaskRunner with the class, so they need not reach Ray's workers."""
        env = os.environ if env is None else env
        kwargs: dict[str, Any] = {}
        for key, name in ENV.items():
            value = env.get(name, "").strip()
            if value:
                kwargs[key] = value
        try:
            if "attempts" in kwargs:
                kwargs["attempts"] = int(kwargs["attempts"])
            if "budget_s" in kwargs:
                kwargs["budget_s"] = float(kwargs["budget_s"])
        except ValueError as exc:
            raise UsageError(f"{ENV['attempts']} / {ENV['budget_s']}: {exc}") from None
        return cls(**{**kwargs, **overrides})

    def _fresh(self) -> None:
        """The state of one process's run (not pickled: the hook travels to verl's TaskRunner bare)."""
        self._evidence: dict[str, Any] = {}  # label -> Evidence taken before the update
        self._pending: dict[str, Any] = {}  # label -> Evidence whose canaries wait for verl's resume
        self._metrics: dict[str, float] = {}
        self.failures = 0  # checks that did not prove the fleet clean, this run
        self.sink: dict[str, Any] | None = None  # a trainer's step metrics to write into (legacy trainer)
        self.fleets: dict[str, Any] = {}  # label -> verl CheckpointEngineManager (for the record)
        self.recorder: Any = None
        self.step: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        keep = ("master", "master_rpc", "policy", "mode", "attempts", "budget_s", "verify", "timeout", "run",
                "record", "state_dir", "experiment", "trainer", "model")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fresh()

    def __repr__(self) -> str:
        return (f"KvctlVerlHook(master={self.master!r}, policy={self.policy!r}, mode={self.mode!r}, "
                f"attempts={self.attempts}, budget_s={self.budget_s}, verify={self.verify}, run={self.run!r})")

    # -- metrics ------------------------------------------------------------------------------
    @staticmethod
    def prefix(label: str) -> str:
        return f"kvctl/{label}/" if label else "kvctl/"

    def metrics(self) -> dict[str, float]:
        """The numbers since the last consume_metrics(), flat floats, not consumed."""
        return dict(self._metrics)

    def consume_metrics(self) -> dict[str, float]:
        """The numbers since the last call, for a trainer's step metrics; cleared after."""
        out, self._metrics = self._metrics, {}
        return out

    def _put(self, values: dict[str, float]) -> None:
        self._metrics.update({k: float(v) for k, v in values.items()})
        self._metrics["kvctl/failures_total"] = float(self.failures)
        if self.sink is not None:  # the legacy trainer's actor metrics (ray_trainer.py:1719 reduces them)
            self.sink.update(self._metrics)

    # -- the four moments ----------------------------------------------------------------------
    async def before_stop(self, label: str, replicas: list[ReplicaView]) -> None:
        """Evidence while the fleet still serves the old weights (once per update cycle)."""
        if label in self._evidence or not replicas or _refusal(replicas):
            return
        started = time.monotonic()
        try:
            evidence = await _api("take_evidence_async")(urls=[r.url for r in replicas], timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001 - no evidence means a weaker proof later, never a dead run
            log.warning("kvctl: no evidence before the update of %s: %s", _fleet(label), exc)
            self._put({self.prefix(label) + "evidence": 0.0})
            return
        self._evidence[label] = evidence
        self._put({self.prefix(label) + "evidence": 1.0,
                   self.prefix(label) + "evidence_s": time.monotonic() - started})

    def forget_evidence(self, label: str) -> None:
        self._evidence.pop(label, None)

    async def after_update(self, label: str, replicas: list[ReplicaView], step: int | None = None) -> None:
        """Reset and verify (mode "reset") or check verl's own reset (mode "verify")."""
        evidence = self._evidence.pop(label, None)
        self._pending.pop(label, None)
        self.step = step if step is not None else self.step
        p = self.prefix(label)
        if not replicas:
            return
        refusal = _refusal(replicas)
        if refusal:
            self.failures += 1
            self._put({p + "refused": 1.0, p + "ok": 0.0, p + "verified": 0.0})
            if self.policy == "raise":
                raise DataParallelRefused(refusal, "set actor_rollout_ref.rollout.data_parallel_size=1, or "
                                                   "policy=\"warn\" to train on unproven")
            log.error("kvctl: %s, step %s: %s", _fleet(label), self.step, refusal)
            return
        urls = [r.url for r in replicas]
        if self.mode == "verify" and evidence is None:
            log.info("kvctl: %s, step %s: no evidence taken before this update: nothing to check",
                     _fleet(label), self.step)
            self._put({p + "checked": 0.0})
            return

        def call() -> Awaitable[Any]:
            if self.mode == "verify":
                return _api("check_evidence_async")(evidence, urls=urls, master=self.master, timeout=self.timeout)
            return _api("hard_reset_async")(urls=urls, master=self.master, master_rpc=self.master_rpc, connector=True,
                                            verify=self.verify, evidence=evidence if self.verify else None,
                                            timeout=self.timeout)

        # a canary proves one reset: a check of verl's reset cannot be repeated
        receipt = await self._attempts(label, call, 1 if self.mode == "verify" else self.attempts)
        if receipt is not None and receipt.pending and evidence is not None:
            self._pending[label] = evidence

    async def after_resume(self, label: str, replicas: list[ReplicaView]) -> None:
        """verl resumed generation: check the canaries a paused fleet could not be sent."""
        evidence = self._pending.pop(label, None)
        if evidence is None or not replicas:
            return
        urls = [r.url for r in replicas]
        # master=None: the store was counted while nothing wrote; the fleet generates again now
        check = _api("check_evidence_async")
        await self._attempts(label, lambda: check(evidence, urls=urls, master=None, timeout=self.timeout), 1,
                             sub="resume_check/")

    # -- tries, policy, numbers ------------------------------------------------------------------
    async def _attempts(self, label: str, call: Callable[[], Awaitable[Any]], attempts: int,
                        sub: str = "") -> Any:
        """Up to `attempts` tries, none started after budget_s (a running one is never cut: a reset
        cancelled midway could leave the fleet paused). Returns the last receipt (None: none came)."""
        p = self.prefix(label) + sub
        deadline = time.monotonic() + self.budget_s
        receipt, error, tries = None, None, 0
        while tries < attempts and (tries == 0 or time.monotonic() < deadline):
            tries += 1
            try:
                receipt, error = await call(), None
            except UsageError as exc:  # bad targets or settings: another try would say the same
                receipt, error = None, exc
                break
            except (KvctlError, OSError) as exc:
                receipt, error = None, exc
                continue
            if _clean(receipt):
                break
            log.warning("kvctl: %s, step %s, attempt %d of %d: %s", _fleet(label), self.step, tries, attempts,
                        receipt.summary)
        values = dict(receipt.metrics(prefix=p)) if receipt is not None else {p + "ok": 0.0, p + "verified": 0.0}
        ok = receipt is not None and _clean(receipt)
        values.update({p + "attempts": float(tries), p + "failed": float(not ok), p + "refused": 0.0})
        if not ok:
            self.failures += 1
        self._put(values)
        self.record_servers()
        if ok:
            log.info("kvctl: %s, step %s: %s", _fleet(label), self.step, receipt.summary)
            return receipt
        why = receipt.summary if receipt is not None else f"{type(error).__name__}: {error}"
        if self.policy == "raise":
            if receipt is not None:
                raise _api("ResetFailed")(receipt)
            assert error is not None
            raise error
        log.error("kvctl: %s, step %s: NOT proven clean after %d attempt(s): %s (policy warn: the run goes on; "
                  "kvctl/failures_total counts these)", _fleet(label), self.step, tries, why)
        return receipt

    # -- the record of the live servers ------------------------------------------------------------
    def describe_job(self, config: Any, trainer: str) -> None:
        """The job, from verl's config: its experiment (the record's name) and model."""
        def pick(*path: str) -> str:
            node = config
            for key in path:
                node = node.get(key) if hasattr(node, "get") else getattr(node, key, None)
                if node is None:
                    return ""
            return str(node)

        self.experiment = pick("trainer", "experiment_name")
        self.model = pick("actor_rollout_ref", "model", "path")
        self.trainer = trainer

    def start(self) -> None:
        """The recorder, in the process whose managers it records (once)."""
        if self.record and self.recorder is None:
            try:
                self.recorder = ServerRecorder(self.run or run_name(self.experiment), state_dir=self.state_dir,
                                               trainer=self.trainer, model=self.model, experiment=self.experiment)
            except KvctlError as exc:  # a bad run= name: said once, the run goes on unrecorded
                self.record = False
                log.warning("kvctl: the servers of this job are not recorded: %s", exc)

    def finish(self, state: str = "stopped", error: str | None = None) -> None:
        """The record's last word when the trainer ends (stopped, or failed with its error)."""
        if self.recorder is not None:
            self.recorder.write(self, state, error)

    def record_servers(self) -> None:
        """Rewrite the record of every fleet's live servers (kvctl.integrations.verl.servers): never
        raises, a record that cannot be written is logged."""
        if self.recorder is not None:
            self.recorder.write(self)


def _api(name: str) -> Any:
    """kvctl's public API by name (kvctl.api, or kvctl.api.loop for the training-loop calls), looked
    up at call time."""
    from kvctl import api

    if hasattr(api, name):
        return getattr(api, name)
    import kvctl.api.loop as loop

    return getattr(loop, name)


def _clean(receipt: Any) -> bool:
    """Reset and proven as far as the fleet's window allows: a check pending on a fleet its owner
    paused (receipt.pending, exit code 3) is not a failure; it is checked after the resume."""
    failed = getattr(receipt, "failed", None)
    return receipt.ok if failed is None else not failed and not getattr(receipt, "stale", None)


def _refusal(replicas: list[ReplicaView]) -> str | None:
    wide = [r for r in replicas if r.data_parallel_size > 1]
    if not wide:
        return None
    return (f"rollout.data_parallel_size={wide[0].data_parallel_size}: the HTTP server of {wide[0].name} fronts "
            f"{wide[0].data_parallel_size} engines and routes each request to any of them, so a canary primed "
            "on one may be checked on another and pass without proving anything; kvctl refuses to call such a "
            "fleet clean")


def _fleet(label: str) -> str:
    return f"the {label} rollout fleet" if label else "the rollout fleet"


_CURRENT: list[KvctlVerlHook] = []


def install(hook: KvctlVerlHook) -> KvctlVerlHook:
    """Make `hook` the one managers built by verl (checkpoint_manager_class) attach to in this process."""
    _CURRENT[:] = [hook]
    return hook


def current() -> KvctlVerlHook:
    """The hook installed in this process; else one from the environment, installed."""
    return _CURRENT[0] if _CURRENT else install(KvctlVerlHook.from_env())


__all__ = ["DataParallelRefused", "KvctlVerlHook", "ReplicaView", "current", "install"]
