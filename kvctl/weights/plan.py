"""The weight-update plan: what each replica can do, from its live version, before anything is paused.

`plan_update()` plans the hard reset that follows the reload (kvctl.reset.plan: connector, mm and
encoder caches, scoped as reset does), then checks every replica against the capability table: a
reload from a folder (`collective_rpc reload_weights(weights_path=)`, vLLM >= 0.16.0), a version
label when --version asks for one (/update_weight_version), and whether it reports a weight version
(/weight_info) and checksums (/weight_checker). A replica that cannot take a needed step refuses the
whole update, naming the version it needs: a fleet half on new weights is what this command prevents.
Nothing here pauses, reloads or prints.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvctl.errors import UsageError
from kvctl.facts.capabilities import table
from kvctl.facts.versions import parse_version
from kvctl.reset.plan import Plan, ResetOptions, plain_data, plan_reset
from kvctl.targets import Fleet
from kvctl.transport.pool import HttpPool
from kvctl.transport.vllm_client import PAUSE_TIMEOUT

RELOAD_TIMEOUT = 600.0  # one reload reads every weight from disk: minutes on a large model
RELOAD = ("http.collective_rpc", "rpc.reload_weights.weights_path")  # both needed to reload from a path


@dataclass
class WeightsOptions:
    from_path: str  # a folder of *.safetensors (on this machine, or on the servers' with remote_path)
    version: str | None = None  # the weight version label to set after the reload (/update_weight_version)
    remote_path: bool = False  # from_path is on the servers' machines: not checked here
    verify: bool = False
    probe_prompts: list[str] | None = None
    dry_run: bool = False
    resume_failed: bool = False  # resume a replica whose reload failed anyway (it may serve other weights)
    timeout: float = 10.0
    retries: int = 2
    concurrency: int = 256
    pause_timeout: float = PAUSE_TIMEOUT
    reload_timeout: float = RELOAD_TIMEOUT
    whole_master: bool = False
    clear_timeout: float = 15.0
    weights_path: str = field(default="", init=False)  # what the servers are sent: absolute

    def check(self) -> WeightsOptions:
        """UsageError for options no update can run with (the CLI's and the Python API's one check)."""
        self.reset_options()  # its numbers and probe rules first: one wording for both commands
        if isinstance(self.reload_timeout, bool) or not isinstance(self.reload_timeout, (int, float)) \
                or not 0 < self.reload_timeout < math.inf:
            raise UsageError(f"--reload-timeout must be a number of seconds > 0, got {self.reload_timeout!r}",
                             f"e.g. --reload-timeout={RELOAD_TIMEOUT:g}")
        if self.version is not None:
            _check_label(self.version)
        self.weights_path = _check_path(self.from_path, self.remote_path)
        self.from_path = str(self.from_path)  # a Path from Python: the receipt is plain data
        return self

    def reset_options(self) -> ResetOptions:
        """The hard reset after the reload: local prefix cache, the store (scoped as reset scopes it),
        mm and encoder caches, always paused (the reload happens inside that pause)."""
        return ResetOptions(connector=True, mm=True, encoder=True, verify=self.verify, pause=True,
                            dry_run=self.dry_run, timeout=self.timeout, retries=self.retries,
                            concurrency=self.concurrency, pause_timeout=self.pause_timeout,
                            whole_master=self.whole_master, clear_timeout=self.clear_timeout,
                            probe_prompts=self.probe_prompts,
                            # the plan sees the old weights; the new ones' checksums are compared after
                            allow_mixed_weights=self.verify).check()


def _check_label(version: object) -> None:
    if not isinstance(version, str) or not version.strip() \
            or any(unicodedata.category(c).startswith("C") for c in version):
        raise UsageError(f"--version must be a non-empty label without control characters, got {version!r}",
                         "e.g. --version=step-120")


def _check_path(from_path: object, remote: bool) -> str:
    """The absolute folder the servers are sent. A relative path would be read from each server's own
    working directory, and one that is not a folder there makes vLLM try a Hugging Face download
    (model_loader/default_loader.py `_prepare_weights`: not os.path.isdir -> download)."""
    if not isinstance(from_path, (str, Path)) or not str(from_path).strip():
        raise UsageError(f"--from must be a folder of *.safetensors, got {from_path!r}",
                         "e.g. --from=/checkpoints/step-120")
    path = Path(from_path).expanduser()
    if remote:
        if not path.is_absolute():
            raise UsageError(f"--from {from_path}: with --remote-path the folder must be an absolute path "
                             "(each server would read a relative one from its own working directory)",
                             "give the folder's absolute path as the servers see it")
        return str(path)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a folder"
        raise UsageError(f"--from {from_path}: {what} on this machine",
                         "give the checkpoint folder (its *.safetensors files); if it lives only on the servers' "
                         "machines, add --remote-path and kvctl will not look for it here")
    if not any(path.glob("*.safetensors")):
        raise UsageError(f"--from {from_path}: no *.safetensors file in it (vLLM's reload reads the weights "
                         "from those files)", "point --from at the folder that holds the model's *.safetensors")
    return str(path.resolve())


# -- plan ---------------------------------------------------------------------------------
@dataclass
class ReplicaWeightsPlan:
    name: str
    url: str
    vllm_version: str | None = None
    version_before: str | None = None  # its /weight_info (None: not reported)
    reports_version: bool = False  # /weight_info (0.27+)
    sets_version: bool = False  # /update_weight_version will be sent
    reports_checksums: bool = False  # /weight_checker (0.32+)
    error: str | None = None


@dataclass
class WeightsPlan:
    options: WeightsOptions
    reset: Plan
    replicas: list[ReplicaWeightsPlan]
    error: str | None = None  # the update is refused: nothing will be paused or sent
    hint: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = plain_data(self)
        data["reset"] = self.reset.to_dict()
        return data


async def plan_update(fleet: Fleet, options: WeightsOptions, http: HttpPool | None = None) -> WeightsPlan:
    """Plan the reset (which reads each replica's weight version too), check every replica can take each step."""
    reset = await plan_reset(fleet, options.reset_options(), http)
    replicas = [ReplicaWeightsPlan(r.name, r.url, r.version, error=r.error,
                                   version_before=r.weights.version if r.weights is not None else None)
                for r in reset.replicas]
    plan = WeightsPlan(options, reset, replicas)
    if reset.error:
        plan.error, plan.hint = f"the cache reset that follows the reload cannot run: {reset.error}", reset.hint
        return plan
    for rp in replicas:
        _plan_replica(rp, options)
    _refuse_unfit(plan)
    return plan


def _plan_replica(rp: ReplicaWeightsPlan, options: WeightsOptions) -> None:
    if rp.error is not None:
        return
    t = table()
    version = parse_version(rp.vllm_version or "0")
    missing = [c for c in RELOAD if not t.has(version, c)]
    if missing:
        since = max((t.capability(c).span.since or "0" for c in missing), key=parse_version)
        rp.error = (f"vLLM {version} cannot reload weights from a folder: collective_rpc "
                    f"reload_weights(weights_path=) first in {since}")
        return
    rp.reports_version = t.has(version, "http.weight_info")
    rp.reports_checksums = t.has(version, "http.weight_checker")
    if options.version is not None:
        if not t.has(version, "http.update_weight_version"):
            since = t.capability("http.update_weight_version").span.since
            rp.error = f"--version needs /update_weight_version, which vLLM {version} lacks (first in {since})"
            return
        rp.sets_version = True


def _refuse_unfit(plan: WeightsPlan) -> None:
    """Every replica or none: one left on the old weights would serve beside the others."""
    unfit = [r for r in plan.replicas if r.error is not None]
    if not unfit:
        if not any(r.reports_checksums for r in plan.replicas):
            plan.notes.append("no replica reports weight checksums (/weight_checker, vLLM >= 0.32.0): "
                              "the reload is judged by vLLM's answers alone")
        return
    plan.error = ("cannot update every replica, so none is touched: "
                  + "; ".join(f"{r.name}: {r.error}" for r in unfit))
    needs = {"--version" if "--version" in (r.error or "") else "reload" for r in unfit}
    fixes = []
    if "reload" in needs:
        fixes.append(f"upgrade vLLM on those replicas to >= {table().capability(RELOAD[1]).span.since}")
    if "--version" in needs:
        fixes.append("leave --version out, or upgrade them to >= "
                     f"{table().capability('http.update_weight_version').span.since}")
    unreachable = [r for r in unfit if r.vllm_version is None]
    if unreachable:
        fixes.append("bring the unreachable ones back (or leave them out of the targets)")
    plan.hint = "; ".join(fixes)


__all__ = ["RELOAD_TIMEOUT", "ReplicaWeightsPlan", "WeightsOptions", "WeightsPlan", "plan_update"]
