"""`kvctl reset`: a verified, version-aware hard reset of a fleet."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kvctl.cli.errors import finish_with_receipt, handle_errors
from kvctl.cli.options import (InventoryOpt, JsonOpt, MasterOpt, MasterRpcOpt, RayOpt, RunOpt, RunPosArg, StateDirOpt,
                               UrlsOpt, one_run)
from kvctl.cli.options import NoHeadersOpt, OutputOpt, output_options
from kvctl.errors import UsageError

OP_COLUMNS = (("pause", "pause"), ("prefix_cache", "prefix cache"), ("mm_cache", "mm cache"),
              ("encoder_cache", "encoder cache"), ("resume", "resume"))


@output_options
@handle_errors
def reset(
    run_arg: RunPosArg = None,
    run: RunOpt = None,
    url: UrlsOpt = None,
    inventory: InventoryOpt = None,
    master: MasterOpt = None,
    master_rpc: MasterRpcOpt = None,
    connector: Annotated[bool, typer.Option("--connector", help="Also clear the external (Mooncake) store: reset_external=true, and a forced master clear where the connector cannot.")] = False,
    no_mm: Annotated[bool, typer.Option("--no-mm", help="Skip /reset_mm_cache.")] = False,
    no_encoder: Annotated[bool, typer.Option("--no-encoder", help="Skip /reset_encoder_cache.")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Prove it: master key count 0 and a canary prompt with no cache hit after the reset.")] = False,
    pause: Annotated[Optional[bool], typer.Option("--pause/--no-pause", help="Pause generation first (in-flight requests finish) and always resume after. Default: on with --connector (vLLM's store reset wants no new puts while it drains).", show_default=False)] = None,
    pause_mode: Annotated[Optional[str], typer.Option("--pause-mode", metavar="wait|keep", help="How kvctl's pause treats in-flight requests: wait for them, or keep them frozen (the reset preempts them; they are recomputed after the resume, none waited for). Default: wait; keep on vLLM >= 0.33 without a KV connector (a wait pause there answers new requests 503).", show_default=False)] = None,
    evidence: Annotated[Optional[Path], typer.Option("--evidence", metavar="FILE", help="With --verify: check the canaries `kvctl evidence take` primed before the weight update (content proof across it); those left pending on replicas paused by their owner are checked by `kvctl evidence check FILE` after the resume. The file is updated in place.")] = None,
    pause_timeout: Annotated[float, typer.Option("--pause-timeout", metavar="S", help="Seconds one /pause may take (tried twice); a failed pause resumes every paused replica and resets nothing.")] = 120.0,
    whole_master: Annotated[bool, typer.Option("--whole-master", help="Clear every key on the master, other deployments' too. Without it a fleet with a cache_prefix loses only its own keys (<cache_prefix>@...), and vLLM's master-wide connector reset is not used.")] = False,
    clear_timeout: Annotated[float, typer.Option("--clear-timeout", metavar="S", help="Seconds a master clear may retry keys it skipped (puts still in flight, replication tasks).")] = 15.0,
    probe_prompts: Annotated[Optional[Path], typer.Option("--probe-prompts", metavar="FILE", help="With --verify: also check these prompts by content, as kvctl probe does (one a line, or JSONL); only a match verifies. Tolerances: docs/reset.md.")] = None,
    allow_mixed_weights: Annotated[bool, typer.Option("--allow-mixed-weights", help="With --verify: pass although replicas sharing one store namespace serve different weights (their KV mixes in it once resumed).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; send nothing but version/config reads.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", metavar="S", help="Per-call timeout in seconds.")] = 10.0,
    retries: Annotated[int, typer.Option("--retries", metavar="N", help="Retries per call for refused connections, timeouts and 5xx.")] = 2,
    concurrency: Annotated[int, typer.Option("--concurrency", metavar="N", help="Replicas handled at once.")] = 256,
    ray: RayOpt = None,
    state_dir: StateDirOpt = None,
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Hard-reset every replica: local prefix cache, external store (--connector), mm and encoder caches.

    Plans from each replica's live version and fails before sending anything when the reset could not be complete; the receipt records each replica's weight version. A replica paused by its owner (or asleep) is left so and gets no canary: its store is proven by the master's count, its content check waits (--evidence, then kvctl evidence check). Exit 0 all reset (and verified when asked), 1 nothing reset or the plan failed, 2 bad usage, 3 partial (or a check pending). More: docs/reset.md.
    """
    from kvctl.reset.evidence import Evidence
    from kvctl.reset.execute import hard_reset_fleet
    from kvctl.reset.plan import ResetOptions
    from kvctl.targets import build_fleet

    run = one_run(run_arg, run, "reset")
    if probe_prompts is not None and not verify:
        raise UsageError("--probe-prompts checks the reset by content: it needs --verify",
                         "add --verify (or run kvctl probe on its own)")
    if evidence is not None and not verify:
        raise UsageError("--evidence proves the reset with canaries primed before the update: it needs --verify",
                         "add --verify")
    options = ResetOptions(connector=connector, mm=not no_mm, encoder=not no_encoder, verify=verify,
                           pause=pause, dry_run=dry_run, timeout=timeout, retries=retries, concurrency=concurrency,
                           pause_timeout=pause_timeout, whole_master=whole_master, clear_timeout=clear_timeout,
                           allow_mixed_weights=allow_mixed_weights, pause_mode=pause_mode).check()
    if probe_prompts is not None:
        from kvctl.reset.probe import load_prompts

        options.probe_prompts = load_prompts(probe_prompts)
    fleet = build_fleet(url, inventory, master, run=run, state_dir=state_dir, master_rpc=master_rpc, ray=ray)
    # SIGINT, SIGTERM and SIGHUP all end in the receipt's "interrupted ..., resumed" (kvctl.interrupt); before
    # there is one (the plan, the canaries) nothing was changed
    proof = Evidence.load(evidence) if evidence is not None else None

    async def reset_and_record() -> Any:
        receipt = await hard_reset_fleet(fleet, options, proof, on_plan=None if json_out else say_pause_notes)
        if proof is not None and evidence is not None and not receipt.dry_run:
            proof.save(evidence)  # the canaries checked now cannot prove a second reset
        return receipt

    finish_with_receipt(reset_and_record(), json_out, "before anything was paused or reset: nothing was changed", _print)


def say_pause_notes(plan: Any) -> None:
    """What kvctl's pause will do to client requests (kvctl.reset.pausing), on stderr before it pauses."""
    from kvctl.cli import output

    for note in plan.pause_notes:
        output.note(note)


def _print(receipt: Any) -> None:
    from rich.markup import escape

    from kvctl.cli import output

    plan = receipt.plan
    if plan.error:
        output.err_console().print(f"[bold red]error:[/] plan failed, nothing was sent: {escape(plan.error)}",
                                   soft_wrap=True)  # kvctl's one error style (cli/errors._print_error)
        if plan.hint:
            output.err_console().print(f"  [bold]fix:[/] {escape(plan.hint)}", soft_wrap=True)
        if not plan.error.startswith("no replica could be planned"):
            _print_unplanned(receipt)
        return
    if receipt.dry_run:
        _print_plan(plan)
    else:
        _print_results(receipt)
    style = "green" if receipt.ok else "red" if receipt.exit_code == 1 else "yellow"
    output.show(f"[{style}]{escape(receipt.summary)}[/] [dim]({receipt.total_s:.2f} s)[/]")


def _print_unplanned(receipt: Any) -> None:
    from rich.markup import escape

    from kvctl.cli import output

    for r in receipt.replicas:
        if r.error:
            output.err_console().print(f"  {escape(r.name)}: {escape(r.error)}", soft_wrap=True)


def _print_plan(plan: Any) -> None:
    from rich.markup import escape

    from kvctl.cli import output

    # 80 columns: weights and connector are -o wide's columns (the connector: lines under the table)
    table = output.table("replica", "version", "weights", "connector", "will send", "skipped", title="plan (dry run)",
                         wrap=("will send", "skipped"), wide_only=("weights", "connector"))
    for r in plan.replicas:
        if r.error:
            table.add_row(escape(r.name), escape(r.version or "?"), "", "", f"[red]{escape(r.error)}[/]", "")
            continue
        send = [f"{o.op}" + (f" ({', '.join(f'{k}={v}' for k, v in o.params.items())})" if o.params else "")
                for o in r.ops if not o.skip]
        skipped = [f"{o.op}: {o.skip}" for o in r.ops if o.skip]
        weights = r.weights.version if r.weights is not None else None
        table.add_row(escape(r.name), escape(r.version or "?"), _weights_cell(weights, r.weights and r.weights.digest),
                      escape(_layout(r.layout)), escape("\n".join(send)), escape("\n".join(skipped)))
    output.show(table)
    if not output.wide():
        output.per_value("connector", ((r.name, _layout(r.layout)) for r in plan.replicas if not r.error))
    for note in [*plan.pause_notes, *plan.notes]:
        output.show(f"[dim]note:[/] {escape(note)}")
    _print_master_roles(plan.master_nodes, plan.master, "at plan time", plan.master_rpc)
    if plan.master_clear and plan.master_clear_scope == "scoped":
        output.show(f"master {escape(plan.master)}: remove only this deployment's keys "
                    f"('{escape(plan.cache_prefix or '')}@...', forced) through its RPC port "
                    f"{escape(plan.master_rpc or '')}; other deployments' keys are kept"
                    + (" by this clear, NOT by this fleet's own vLLM (see the shared master note)"
                       if plan.shared_master else "")
                    + f". Because {escape(plan.master_clear_reason or '')}")
    elif plan.master_clear:
        output.show(f"master {escape(plan.master)}: POST /api/v1/remove_all?force=true: EVERY key on the "
                    "master, other deployments' too" + (" (--whole-master)" if plan.options.whole_master else "")
                    + f". Because {escape(plan.master_clear_reason or '')}")
    elif plan.master:
        output.show(f"master {escape(plan.master)}: no clear needed (vLLM clears the store)")


def _print_results(receipt: Any) -> None:
    from rich.markup import escape

    from kvctl.cli import output

    # 80 columns: one "operations" cell per replica; -o wide: a column per operation with its latency,
    # the checksum digest and the canary's signal
    wide = output.wide()
    shown = [(k, t) for k, t in OP_COLUMNS if any(o.op == k for r in receipt.replicas for o in r.ops)] if wide else []
    cols = ["replica", "version", "weights"] + [t for _, t in shown] + ([] if wide else ["operations"]) \
        + (["verify"] if receipt.verify else []) + ["reset"]
    table = output.table(*cols, wrap=() if wide else ("operations",))
    for r in receipt.replicas:
        ops = {o.op: o for o in r.ops}
        cells = [escape(r.name), escape(r.version or "?"),
                 _weights_cell(r.weight_version, r.weight_digest if wide else None)] \
            + ([_op_cell(ops.get(k)) for k, _ in shown] if wide else [_ops_cell(r.ops)])
        if receipt.verify:
            cells.append(_canary_cell(r.canary, wide))
        cells.append("[green]yes[/]" if r.reset else "[bold red]NO[/]")
        table.add_row(*cells)
    output.show(table)
    m = receipt.master
    if m is not None and (m.clear or m.keys_after is not None):
        parts = []
        if m.clear:
            what = "scoped clear" if m.scope == "scoped" else "whole-master clear"
            parts.append(f"{what} {_op_cell(m.clear)}" + (f", master said {m.removed_count} removed"
                                                         if m.removed_count is not None else ""))
        if m.keys_after is not None:
            scope = f"this deployment's ('{escape(m.cache_prefix)}@') " if m.cache_prefix else ""
            before = f"{m.keys_before} -> " if m.keys_before is not None else f"at least {m.keys_before_min} -> " \
                if m.keys_before_min is not None else "not counted -> " if m.total_before is not None else ""
            parts.append(f"{scope}keys {before}{m.keys_after}")
        if m.others_before is not None or m.others_after is not None:
            uncounted = "not counted" if m.total_before is not None else "?"
            parts.append(f"other deployments' keys {m.others_before if m.others_before is not None else uncounted} -> "
                         f"{m.others_after if m.others_after is not None else '?'}")
        output.show(f"master {escape(m.address)}{_leader_note(m)}: " + "; ".join(parts))
    if m is not None:
        _print_master_roles(m.roles or receipt.plan.master_nodes, m.address,
                            "just before the clear" if m.roles else "at plan time", m.rpc_address)
    for r in receipt.replicas:
        if r.probe is not None:
            style = {"match": "green", "STALE": "bold red"}.get(r.probe["verdict"], "yellow")
            error, tolerance = r.probe["error"], r.probe.get("tolerance")
            output.show(f"probe {escape(r.name)}: [{style}]{r.probe['verdict']}[/] over "
                        f"{len(r.probe['results'])} prompt(s)" + (f" ({escape(error)})" if error else "")
                        + ("" if tolerance is None else
                           f" [dim](tolerance {tolerance:g}: {escape(r.probe.get('tolerance_reason') or '')})[/]"))
    print_windows(receipt)
    for r in receipt.replicas:
        if r.error:
            output.show(f"[red]{escape(r.name)}[/]: {escape(r.error)}")
    if m is not None and m.error:
        output.show(f"[red]master[/]: {escape(m.error)}")
    for note in (m.notes if m is not None else []):
        output.show(f"[yellow]master[/]: {escape(note)}")
    if receipt.plan.shared_master:
        output.show(f"[yellow]{escape(receipt.plan.shared_master)}[/]")


def print_windows(receipt: Any) -> None:
    """Per replica not simply serving, or not fully proven: its window, what was proven and how,
    what was not, and what waits for its owner's resume."""
    from rich.markup import escape

    from kvctl.cli import output
    from kvctl.reset.window import describe

    for r in receipt.replicas:
        if r.window in (None, "serving") and not r.unproven and not r.pending and not r.rejected:
            continue
        lines = [f"{escape(r.name)}: {escape(describe(r.window))}"]
        lines += [f"  [green]proven[/] {escape(p)}" for p in r.proven]
        lines += [f"  [yellow]unproven[/] {escape(u)}" for u in r.unproven]
        lines += [f"  [yellow]pending[/] {escape(r.pending)}"] if r.pending else []
        lines += [f"  [yellow]rejected[/] {escape(r.rejected)}"] if r.rejected else []
        output.show("\n".join(lines))


def _leader_note(m: Any) -> str:
    """Which master of an HA group was used, and whether leadership moved since the plan."""
    from rich.markup import escape

    if m.leader_changed:
        return f" [yellow](the leader changed after the plan: {escape(m.leader_changed)})[/]"
    return ""


def _print_master_roles(nodes: list[Any], used: str | None, when: str, rpc: str | None = None) -> None:
    """One line per master of an HA group (several masters, or one in HA mode): its role, and which
    one kvctl used (a lone master without HA prints nothing, as before)."""
    from rich.markup import escape

    from kvctl.cli import output

    if len(nodes) < 2 and not any(n.leader_rpc or n.view_version is not None for n in nodes):
        return
    rows = []
    for n in nodes:
        mark = (" [bold]<- used[/]" + (f" (RPC {escape(rpc)})" if rpc else "")) if n.address == used else ""
        rows.append(f"  {escape(n.describe())}{mark}")
    output.show(f"Mooncake masters {when}:\n" + "\n".join(rows))


def _op_cell(op: Any) -> str:
    if op is None:
        return ""
    if op.result == "ok":
        retry = f" ({op.attempts} tries)" if op.attempts > 1 else ""
        return f"[green]ok[/] {op.latency_s * 1000:.0f} ms{retry}"
    if op.result == "skipped":
        return "[dim]skipped[/]"
    return f"[bold red]FAILED[/] {op.http_status or ''}".rstrip()


def _ops_cell(ops: list[Any]) -> str:
    """'5 ok, 8 ms' or 'prefix cache FAILED 500; 4 ok, 6 ms': every operation sent to one replica."""
    titles = dict(OP_COLUMNS)
    done = [o for o in ops if o.result == "ok"]
    failed = [f"{titles.get(o.op, o.op)} {_op_cell(o)}" for o in ops if o.result not in ("ok", "skipped")]
    skipped = sum(o.result == "skipped" for o in ops)
    parts = failed + ([f"[green]{len(done)} ok[/], {sum(o.latency_s for o in done) * 1000:.0f} ms"] if done else []) \
        + ([f"[dim]{skipped} skipped[/]"] if skipped else [])
    return "; ".join(parts) or "[dim]-[/]"


def _canary_cell(canary: Any, wide: bool = True) -> str:
    if canary is None:
        return "[dim]-[/]"
    if canary.ok:
        return "[green]0 hits[/]" + (f" [dim]({canary.signal})[/]" if wide else "")
    return "[bold red]STALE[/]" if canary.stale else "[bold red]FAILED[/]"


def _weights_cell(version: str | None, digest: str | None) -> str:
    """The weight version the replica was cleared for, and its checksum digest when read."""
    from rich.markup import escape

    if version is None and digest is None:
        return "[dim]?[/]"
    return escape(version or "?") + (f" [dim]({escape(digest)})[/]" if digest else "")


def _layout(layout: list[str] | None) -> str:
    return "unknown" if layout is None else ", ".join(layout) or "none"
