"""The Python API for RL trainers: a hard reset after every weight update, without a subprocess.

    import kvctl
    receipt = kvctl.hard_reset(urls=["http://127.0.0.1:8000"], master="127.0.0.1:9003", verify=True,
                               raise_on_failure=True)

Inside a training loop (kvctl.api.loop): evidence before the update and its check after it
(`take_evidence`, `hard_reset(evidence=...)`, `check_evidence`), and `update_window_async` for loops
that move the weights themselves.

`check_salt_isolation` proves that a per-version cache_salt isolates every tier (loops that salt
instead of resetting).

Each blocking function has an async twin (`hard_reset_async`, `probe_async`) for code that runs
an event loop; the blocking one refuses to run inside a loop (UsageError) rather than nest it.

Importing kvctl does not import typer, rich, vllm, torch or mooncake.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kvctl.api.words import python_errors, receipt_for_python
from kvctl.errors import KvctlError, UsageError
from kvctl.reset.evidence import Evidence
from kvctl.reset.execute import hard_reset_fleet
from kvctl.reset.options import ResetOptions
from kvctl.reset.receipt import Receipt
from kvctl.targets import build_fleet

if TYPE_CHECKING:
    from kvctl.reset.probe import ProbeReport
    from kvctl.reset.salting import SaltReport
    from kvctl.weights.receipt import WeightsReceipt

T = TypeVar("T")


class _OperationFailed(KvctlError):
    """A fleet operation's receipt as an error: its summary, each unfinished replica's error, the
    plan's fix when the plan failed, and its exit code."""

    def __init__(self, receipt: Any, unfinished: Callable[[Any], bool]) -> None:
        details = "; ".join(f"{r.name}: {r.error}" for r in receipt.replicas if unfinished(r) and r.error)
        super().__init__(receipt.summary + (f" ({details})" if details else ""),
                         receipt.plan.hint if receipt.plan.error else None)
        self.exit_code = receipt.exit_code
        self.receipt = receipt


class KeywordTypeError(UsageError, TypeError):
    """A keyword of the Python API given a value of the wrong type (a UsageError, and a TypeError)."""


def check_keyword_types(function: Callable[..., Any], values: dict[str, Any]) -> None:
    """Every bool keyword of `function` takes True or False (None too where its annotation allows it),
    every number keyword a number, a whole one where it is an int (a bool is neither): dry_run="false"
    would otherwise be a dry run. From the annotations, so a new keyword is checked as it is declared."""
    parameters = inspect.signature(function).parameters
    for name, value in values.items():
        parameter = parameters.get(name)
        if parameter is None or not isinstance(parameter.annotation, str):
            continue
        kinds = {k.strip() for k in parameter.annotation.split("|")}
        optional = "None" in kinds
        kinds.discard("None")
        if value is None and optional or not kinds or not kinds <= {"bool", "int", "float"}:
            continue
        example = parameter.default if parameter.default is not inspect.Parameter.empty else None
        got = f"got {type(value).__name__} {value!r}"
        if kinds == {"bool"}:
            if not isinstance(value, bool):
                raise KeywordTypeError(f"{name} must be True{', False or None' if optional else ' or False'}, {got}",
                                       f"e.g. {name}={example!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or "float" not in kinds \
                and not isinstance(value, int):
            what = "a number" if "float" in kinds else "a whole number"
            raise KeywordTypeError(f"{name} must be {what}{' or None' if optional else ''}, {got}",
                                   f"e.g. {name}={example!r}")


def typed_keywords(function: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """check_keyword_types on every call of an async API function, before it runs."""
    @functools.wraps(function)
    async def checked(*args: Any, **kwargs: Any) -> T:
        try:
            values = inspect.signature(function).bind_partial(*args, **kwargs).arguments
        except TypeError:  # an unknown keyword: the function itself says so
            values = {}
        check_keyword_types(function, values)
        return await function(*args, **kwargs)
    return checked


class ResetFailed(_OperationFailed):
    """The hard reset did not complete (or was not verified) on every replica. `.receipt` says why."""

    def __init__(self, receipt: Receipt) -> None:
        super().__init__(receipt, lambda r: not r.reset)


@typed_keywords
async def hard_reset_async(
    urls: list[str] | None = None,
    *,
    inventory: str | Path | None = None,
    master: str | None = None,
    master_rpc: str | None = None,
    run: str | None = None,
    state_dir: str | Path | None = None,
    ray: str | None = None,
    connector: bool = True,
    mm: bool = True,
    encoder: bool = True,
    verify: bool = False,
    pause: bool | None = None,
    dry_run: bool = False,
    timeout: float = 10.0,
    retries: int = 2,
    concurrency: int = 256,
    pause_timeout: float = 120.0,
    whole_master: bool = False,
    clear_timeout: float = 15.0,
    probe_prompts: list[str] | None = None,
    allow_mixed_weights: bool = False,
    pause_mode: str | None = None,
    evidence: Evidence | None = None,
    raise_on_failure: bool = False,
) -> Receipt:
    """Reset every cache of every replica (and the Mooncake store, with connector=True).

    Same targets and options as `kvctl reset`; returns the receipt. Each replica's window is read
    first: one paused by its owner (or asleep) is left so and gets no generation request; its store
    is proven by the master's count and, with `evidence` (take_evidence_async, before the update),
    its canary is left for check_evidence_async after the resume (`receipt.pending`, exit code 3).
    `evidence`: verify with the canaries primed before the update instead of fresh ones.
    pause_mode="keep": kvctl's pause freezes in-flight requests instead of waiting for them (the
    reset preempts them where no KV connector runs; they are recomputed after the resume); "wait" lets
    them finish; None (the default): wait, or keep on vLLM >= 0.33 without a KV connector, where a wait
    pause answers new requests 503 engine_paused (receipt.plan.pause_notes: what the pause does to them). With raise_on_failure, a receipt
    where a replica is not reset or not clean raises ResetFailed (carrying the receipt); a check
    left pending alone does not. With verify, replicas that
    share one cache namespace but serve different weights fail it, unless allow_mixed_weights.
    master=None and master_rpc=None read $KVCTL_MASTER and $KVCTL_MASTER_RPC, as the CLI does, where
    no run or inventory names the master; master is its admin/metrics port, master_rpc its RPC port.
    Bad targets raise kvctl.errors.UsageError. Errors, hints and receipt lines name these keywords
    where the CLI's name its flags (master= for --master).
    """
    with python_errors():
        options = ResetOptions(connector=connector, mm=mm, encoder=encoder, verify=verify, pause=pause,
                               dry_run=dry_run, timeout=timeout, retries=retries, concurrency=concurrency,
                               pause_timeout=pause_timeout, whole_master=whole_master, clear_timeout=clear_timeout,
                               probe_prompts=_prompts(probe_prompts), allow_mixed_weights=allow_mixed_weights,
                               pause_mode=pause_mode).check()
        fleet = build_fleet(_urls(urls), Path(inventory) if inventory else None, _address(master, "master"),
                            run=run, state_dir=str(state_dir) if state_dir else None,
                            master_rpc=_address(master_rpc, "master_rpc"), ray=ray)
        receipt = receipt_for_python(await hard_reset_fleet(fleet, options, _evidence(evidence, verify)))
    if raise_on_failure and receipt.failed:
        raise ResetFailed(receipt)
    return receipt


def hard_reset(urls: list[str] | None = None, **kwargs: object) -> Receipt:
    """Blocking twin of hard_reset_async (same arguments). Call it from code without a running loop."""
    return _blocking("hard_reset", hard_reset_async, urls, **kwargs)


@typed_keywords
async def probe_async(urls: list[str] | None = None, *, prompts: list[str] | None = None,
                      inventory: str | Path | None = None, run: str | None = None,
                      state_dir: str | Path | None = None, ray: str | None = None, max_tokens: int = 4,
                      tolerance: float | None = None, timeout: float = 120.0) -> ProbeReport:
    """Content-level check (same as `kvctl probe`): each prompt as served vs computed fresh with a
    cache_salt, per replica. Returns the report (`.exit_code`: 0 match, 1 STALE, 3 inconclusive).
    tolerance=None: each replica's own, from its dtype (kvctl/reset/tolerance.py); each
    `.replicas[i].tolerance` and `.tolerance_reason` say which was used and why.
    Targets as hard_reset's (ray: the run as that Ray cluster records it). Bad arguments raise
    kvctl.errors.UsageError."""
    from kvctl.reset.probe import ProbeOptions, check_prompts, probe_fleet

    with python_errors():
        options = ProbeOptions(max_tokens=max_tokens, timeout=timeout, tolerance=tolerance)
        options.check()  # before any replica is read
        texts = check_prompts(prompts)
        fleet = build_fleet(_urls(urls), Path(inventory) if inventory else None, None, run=run,
                            state_dir=str(state_dir) if state_dir else None, ray=ray, masters_from_env=False)
        return receipt_for_python(await probe_fleet(fleet, texts, options))


def probe(urls: list[str] | None = None, **kwargs: object) -> ProbeReport:
    """Blocking twin of probe_async (same arguments). Call it from code without a running loop."""
    return _blocking("probe", probe_async, urls, **kwargs)


@typed_keywords
async def check_salt_isolation_async(urls: list[str] | None = None, *, salts: list[str] | None = None,
                                     versions: list[str] | None = None, salt_format: str = "{version}",
                                     inventory: str | Path | None = None, run: str | None = None,
                                     state_dir: str | Path | None = None, ray: str | None = None,
                                     settle: float = 3.0, timeout: float = 120.0) -> SaltReport:
    """Proof that cache_salt isolates every tier (same as `kvctl salt check`): per replica, the local
    prefix cache and the external store, each isolated, LEAKS or unproven (why), with positive
    controls; fresh random prompts, no reset, no pause. `salts`: the two salts to compare; or
    `versions`, two weight versions made salts with `salt_format` ("{version}": the version itself);
    neither: two random salts. Returns the report (`.exit_code`: 0 isolated, 1 LEAKS, 3 unproven;
    `.to_dict()`: the CLI's --json). Targets as probe's. Bad arguments raise kvctl.errors.UsageError."""
    from kvctl.reset.salting import SaltOptions, check_salt_isolation, salts_of_versions

    with python_errors():
        if salts is not None and versions is not None:
            raise UsageError("give --salt or --weight-version, not both")
        pair = salts_of_versions(versions, salt_format) if versions is not None else \
            (tuple(salts) if isinstance(salts, (list, tuple)) else salts)
        options = SaltOptions(salts=pair, settle=settle, timeout=timeout).check()  # type: ignore[arg-type]
        fleet = build_fleet(_urls(urls), Path(inventory) if inventory else None, None, run=run,
                            state_dir=str(state_dir) if state_dir else None, ray=ray, masters_from_env=False)
        return receipt_for_python(await check_salt_isolation(fleet, options))


def check_salt_isolation(urls: list[str] | None = None, **kwargs: object) -> SaltReport:
    """Blocking twin of check_salt_isolation_async (same arguments). Call it from code without a running loop."""
    return _blocking("check_salt_isolation", check_salt_isolation_async, urls, **kwargs)


class WeightsUpdateFailed(_OperationFailed):
    """The weight update did not complete (or was not verified) on every replica. `.receipt` says why."""

    def __init__(self, receipt: WeightsReceipt) -> None:
        super().__init__(receipt, lambda r: not r.updated)


@typed_keywords
async def update_weights_async(
    from_path: str | Path,
    version: str | None = None,
    *,
    urls: list[str] | None = None,
    inventory: str | Path | None = None,
    master: str | None = None,
    master_rpc: str | None = None,
    run: str | None = None,
    state_dir: str | Path | None = None,
    ray: str | None = None,
    remote_path: bool = False,
    verify: bool = False,
    probe_prompts: list[str] | None = None,
    resume_failed: bool = False,
    dry_run: bool = False,
    reload_timeout: float = 600.0,
    pause_timeout: float = 120.0,
    whole_master: bool = False,
    clear_timeout: float = 15.0,
    timeout: float = 10.0,
    retries: int = 2,
    concurrency: int = 256,
    raise_on_failure: bool = False,
) -> WeightsReceipt:
    """New weights on every replica and every cache cleared, as `kvctl weights update` does: pause the
    fleet, reload `from_path` (a folder of *.safetensors) on each replica, set `version`, hard-reset
    (prefix cache, Mooncake store, mm and encoder caches), resume, verify. Same targets as hard_reset.

    Returns the receipt (`.to_dict()`: the CLI's --json). A replica whose reload failed stays paused
    unless resume_failed. With raise_on_failure, a replica not updated raises WeightsUpdateFailed
    (carrying the receipt); a check left open on a replica its owner paused does not (receipt.failed). Bad arguments raise kvctl.errors.UsageError.
    """
    from kvctl.weights.execute import update_fleet
    from kvctl.weights.plan import WeightsOptions

    with python_errors():
        options = WeightsOptions(from_path, version=version, remote_path=remote_path,  # type: ignore[arg-type]
                                 verify=verify, probe_prompts=_prompts(probe_prompts), dry_run=dry_run,
                                 resume_failed=resume_failed, timeout=timeout, retries=retries,
                                 concurrency=concurrency, pause_timeout=pause_timeout, reload_timeout=reload_timeout,
                                 whole_master=whole_master, clear_timeout=clear_timeout).check()
        fleet = build_fleet(_urls(urls), Path(inventory) if inventory else None, _address(master, "master"),
                            run=run, state_dir=str(state_dir) if state_dir else None,
                            master_rpc=_address(master_rpc, "master_rpc"), ray=ray)
        receipt = receipt_for_python(await update_fleet(fleet, options))
    if raise_on_failure and receipt.failed:
        raise WeightsUpdateFailed(receipt)
    return receipt


def update_weights(from_path: str | Path, version: str | None = None, **kwargs: object) -> WeightsReceipt:
    """Blocking twin of update_weights_async (same arguments). Call it from code without a running loop."""
    return _blocking("update_weights", update_weights_async, from_path, version, **kwargs)


def _evidence(evidence: object, verify: bool) -> Evidence | None:
    if evidence is None:
        return None
    if isinstance(evidence, dict):
        evidence = Evidence.from_dict(evidence)
    elif isinstance(evidence, (str, Path)):  # the file kvctl evidence take wrote (read here, not written back)
        evidence = Evidence.load(evidence)
    if not isinstance(evidence, Evidence):
        raise UsageError(f"evidence must be what kvctl.take_evidence() returned, got {type(evidence).__name__}")
    if not verify:
        raise UsageError("evidence proves a reset: it needs verify=True", "pass verify=True, or drop evidence=")
    return evidence


def _urls(urls: object) -> list[str] | None:
    """The replica URLs as a list; a lone string would be read one character at a time."""
    if urls is None:
        return None
    if isinstance(urls, (str, bytes)) or not isinstance(urls, (list, tuple)) \
            or not all(isinstance(u, str) for u in urls):
        raise UsageError(f"urls must be a list of URLs, got {type(urls).__name__}",
                         f"urls=[{urls!r}]" if isinstance(urls, str) else 'urls=["http://HOST:PORT", ...]')
    return list(urls)


def _address(value: object, name: str) -> str | None:
    """HOST:PORT (or several comma-separated, an HA group) as a string; 41100 or None in a list is a
    usage error here, not a TypeError deep inside."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return ",".join(value)
    raise UsageError(f"{name} must be 'HOST:PORT' (or a list of them for an HA group), got {value!r}",
                     f'e.g. {name}="127.0.0.1:{9003 if name == "master" else 50051}"')


def _prompts(prompts: object) -> list[str] | None:
    if prompts is None:
        return None
    from kvctl.reset.probe import check_prompts

    return check_prompts(prompts)


def _blocking(name: str, function: Callable[..., Awaitable[T]], *args: object, **kwargs: object) -> T:
    """Run an async API function to completion; refused inside a running loop (asyncio.run cannot
    nest), before its coroutine exists, so nothing is left never awaited. SIGINT, SIGTERM, SIGHUP and
    SIGQUIT interrupt it as they do the CLI (what it paused is resumed), then act as before the call."""
    from kvctl.interrupt import run_blocking

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_blocking(function(*args, **kwargs))  # a signal: the fleet resumed first (kvctl.interrupt)
    raise UsageError(f"kvctl.{name}() blocks, and it was called inside a running event loop",
                     f"await kvctl.{name}_async(...) instead")
