"""`kvctl weights`: new weights on every replica with every cache cleared (update), and what each runs (show)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kvctl.cli.errors import finish_with_receipt, handle_errors
from kvctl.cli.options import (InventoryOpt, JsonOpt, MasterOpt, MasterRpcOpt, RayOpt, RunOpt, RunPosArg, StateDirOpt,
                               UrlsOpt, one_run)
from kvctl.cli.options import NoHeadersOpt, OutputOpt, output_options

app = typer.Typer(help="Update the weights of every replica as one verified fleet operation, and show what each runs.",
                  no_args_is_help=True)


@app.command("update")
@output_options
@handle_errors
def update(
    from_path: Annotated[Path, typer.Option("--from", metavar="PATH", show_default=False, help="The folder of the new weights (*.safetensors), as the servers will read it: each reloads it in place (collective_rpc reload_weights, vLLM >= 0.16.0, dev mode).")],
    version: Annotated[Optional[str], typer.Option("--version", metavar="V", help="Label the new weights (POST /update_weight_version, vLLM >= 0.27.0); GET /weight_info then says V.")] = None,
    run_arg: RunPosArg = None,
    run: RunOpt = None,
    url: UrlsOpt = None,
    inventory: InventoryOpt = None,
    master: MasterOpt = None,
    master_rpc: MasterRpcOpt = None,
    remote_path: Annotated[bool, typer.Option("--remote-path", help="PATH is on the servers' machines, not this one: kvctl does not look for it here (it must be absolute).")] = False,
    verify: Annotated[bool, typer.Option("--verify", help="Prove the caches hold nothing of the old weights: master key count 0 and a canary prompt with no cache hit after the update.")] = False,
    probe_prompts: Annotated[Optional[Path], typer.Option("--probe-prompts", metavar="FILE", help="With --verify: check these prompts by content after the update (kvctl probe); only a match verifies. One prompt a line, or JSONL.")] = None,
    resume_failed: Annotated[bool, typer.Option("--resume-failed", help="Resume a replica whose reload failed anyway. Without it such a replica stays paused: it must not serve other weights beside the others in one cache namespace.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; send nothing but version/config reads.")] = False,
    reload_timeout: Annotated[float, typer.Option("--reload-timeout", metavar="S", help="Seconds one reload may take (it reads every weight from disk).")] = 600.0,
    pause_timeout: Annotated[float, typer.Option("--pause-timeout", metavar="S", help="Seconds one /pause may take (it waits for in-flight requests).")] = 120.0,
    whole_master: Annotated[bool, typer.Option("--whole-master", help="Clear every key on the master, other deployments' too (as kvctl reset --whole-master).")] = False,
    clear_timeout: Annotated[float, typer.Option("--clear-timeout", metavar="S", help="Seconds a master clear may retry keys it skipped.")] = 15.0,
    timeout: Annotated[float, typer.Option("--timeout", metavar="S", help="Per-call timeout in seconds (not the reload's: --reload-timeout).")] = 10.0,
    retries: Annotated[int, typer.Option("--retries", metavar="N", help="Retries per call for refused connections, timeouts and 5xx (never for the reload).")] = 2,
    concurrency: Annotated[int, typer.Option("--concurrency", metavar="N", help="Replicas handled at once.")] = 256,
    ray: RayOpt = None,
    state_dir: StateDirOpt = None,
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Reload new weights on every replica, set their version, and hard-reset every cache, while the fleet is paused.

    Plans from each replica's live version and refuses before anything is paused when a replica cannot take a step. Pause every replica; reload PATH; set the version; clear the local prefix cache, the Mooncake store (scoped as kvctl reset scopes it), mm and encoder caches; resume; verify (checksums equal on every replica where vLLM reports them). Exit 0 all updated, 1 none updated or refused, 2 bad usage, 3 partial (the replicas not updated are named, with the commands that finish or undo them).
    """
    from kvctl.targets import build_fleet
    from kvctl.weights.execute import update_fleet
    from kvctl.weights.plan import WeightsOptions

    run = one_run(run_arg, run, "weights update")
    options = WeightsOptions(str(from_path), version=version, remote_path=remote_path, verify=verify,
                             dry_run=dry_run, resume_failed=resume_failed, timeout=timeout, retries=retries,
                             concurrency=concurrency, pause_timeout=pause_timeout, reload_timeout=reload_timeout,
                             whole_master=whole_master, clear_timeout=clear_timeout)
    if probe_prompts is not None:
        from kvctl.reset.probe import load_prompts

        options.probe_prompts = load_prompts(probe_prompts)
    options.check()
    fleet = build_fleet(url, inventory, master, run=run, state_dir=state_dir, master_rpc=master_rpc, ray=ray)
    # SIGINT, SIGTERM and SIGHUP: every replica kvctl paused is resumed, the receipt says each one's state;
    # before there is one (the plan, the checksums, the canaries) nothing was changed
    finish_with_receipt(update_fleet(fleet, options, on_plan=None if json_out else _say_pause_notes), json_out,
                        "before anything was paused or reloaded: nothing was changed", _print)


def _say_pause_notes(plan: Any) -> None:
    from kvctl.cli.reset import say_pause_notes

    say_pause_notes(plan.reset)


def _print(receipt: Any) -> None:
    from rich.markup import escape

    from kvctl.cli import output

    plan = receipt.plan
    if plan.error:
        output.err_console().print(f"[bold red]refused, nothing was paused or sent:[/] {escape(plan.error)}",
                                   soft_wrap=True)
        if plan.hint:
            output.err_console().print(f"  [bold]fix:[/] {escape(plan.hint)}", soft_wrap=True)
        return
    if receipt.dry_run:
        _print_plan(receipt)
    else:
        _print_results(receipt)
    for note in receipt.notes:
        output.show(f"[dim]note:[/] {escape(note)}")
    style = "green" if receipt.ok else "red" if receipt.exit_code == 1 else "yellow"
    output.show(f"[{style}]{escape(receipt.summary)}[/] [dim]({receipt.total_s:.2f} s)[/]")


def _print_plan(receipt: Any) -> None:
    from rich.markup import escape

    from kvctl.cli import output

    # 80 columns: vLLM is -o wide's column, and the folder (in the summary line) is in wide's cells only
    table = output.table("replica", "vLLM", "weights", "will send", "checksums", title="plan (dry run)",
                         wrap=("will send",), wide_only=("vLLM",))
    version = receipt.version
    reload = f"reload_weights({receipt.weights_path})" if output.wide() else "reload_weights"
    for r in receipt.plan.replicas:
        send = ["pause", reload] + ([f"update_weight_version({version})"] if r.sets_version else [])
        send += ["hard reset (prefix cache, store, mm, encoder)", "resume"]
        table.add_row(escape(r.name), escape(r.vllm_version or "?"), escape(r.version_before or "-"),
                      escape("\n".join(send)), "yes" if r.reports_checksums else "[dim]not reported[/]")
    output.show(table)
    reset = receipt.plan.reset
    if reset.master_clear:
        scope = (f"only this deployment's keys ('{reset.cache_prefix}@...')" if reset.master_clear_scope == "scoped"
                 else "EVERY key on the master")
        output.show(f"master {escape(reset.master or '')}: kvctl clears {escape(scope)}, because "
                    f"{escape(reset.master_clear_reason or '')}")
    for note in [*reset.pause_notes, *reset.notes]:
        output.show(f"[dim]note:[/] {escape(note)}")


def _print_results(receipt: Any) -> None:
    from rich.markup import escape

    from kvctl.cli import output

    # 80 columns: the checksums before -> after are -o wide's (equal checksums are named in the notes)
    table = output.table("replica", "version", "checksum", "reload", "reset", "state", wrap=("state",),
                         wide_only=("checksum",))
    for r in receipt.replicas:
        version = f"{r.version_before or '?'} -> {r.version_after or '?'}"
        checksum = f"{r.checksum_before or '-'} -> {r.checksum_after or '-'}"
        reload = _step_cell(r.reload)
        reset = "[green]yes[/]" if r.reset is not None and r.reset.reset else "[bold red]NO[/]"
        table.add_row(escape(r.name), escape(version), escape(checksum), reload, reset, escape(r.state))
    output.show(table)
    inside = ", ".join(f"{k} {receipt.phases.get(k, 0.0):.2f} s" for k in ("pause", "reload", "version", "reset",
                                                                           "resume"))
    if receipt.paused_seconds is not None:
        verify = f"; then verify {receipt.phases['verify']:.2f} s" if receipt.verify else ""
        output.show(f"paused {receipt.paused_seconds:.2f} s [dim]({escape(inside)}){verify}[/]")
    for r in receipt.replicas:
        if r.error:
            output.show(f"[red]{escape(r.name)}[/]: {escape(r.error)}")
        elif r.next_steps:  # updated, and still something to do (resume a replica left paused)
            output.show(f"{escape(r.name)}:")
        for step in r.next_steps:
            output.show(f"  [bold]next:[/] {escape(step)}")
        if r.checksum_note and not r.updated:
            output.show(f"  [dim]checksums: {escape(r.checksum_note)}[/]")


def _step_cell(step: Any) -> str:
    if step.result == "ok":
        return f"[green]ok[/] {step.seconds or 0:.2f} s"
    if step.result in ("failed", "interrupted"):
        return f"[bold red]{step.result.upper()}[/]"
    return f"[dim]{step.result}[/]"


@app.command("show")
@output_options
@handle_errors
def show(
    run_arg: RunPosArg = None,
    run: RunOpt = None,
    url: UrlsOpt = None,
    inventory: InventoryOpt = None,
    master: MasterOpt = None,
    checksums: Annotated[bool, typer.Option("--checksums/--no-checksums", help="Ask each replica for its weight checksums (POST /weight_checker, vLLM >= 0.32.0) and show one digest per replica. vLLM hashes every weight for it, holding generation meanwhile: seconds on a large model.")] = True,
    timeout: Annotated[float, typer.Option("--timeout", metavar="S", help="Per-call timeout in seconds (the checksums get at least 120 s).")] = 10.0,
    ray: RayOpt = None,
    state_dir: StateDirOpt = None,
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Each replica's weight version (GET /weight_info, vLLM >= 0.27.0) and checksum digest, and whether a shared store mixes them.

    Replicas that share one cache namespace (the fleet's master and one cache_prefix, as each server's /server_info says) but report different weight versions or checksums are flagged: their KV mixes in one store. Reads only. Exit 0 every replica read and no mixing, 1 mixed weights or a replica that could not be read, 2 bad usage.
    """
    from kvctl.errors import UsageError
    from kvctl.targets import build_fleet
    from kvctl.weights.show import show_weights

    if not timeout > 0 or timeout == float("inf"):
        raise UsageError(f"--timeout must be a number of seconds > 0, got {timeout!r}")
    fleet = build_fleet(url, inventory, master, run=one_run(run_arg, run, "weights show"), state_dir=state_dir, ray=ray)
    import asyncio  # lazily: --help and other commands do not need it

    report = asyncio.run(show_weights(fleet, checksums=checksums, timeout=timeout))
    if json_out:
        from kvctl.cli import output

        output.print_json(report.to_dict())
    else:
        _print_show(report)
    raise typer.Exit(report.exit_code)


def _print_show(report: Any) -> None:
    from rich.markup import escape

    from kvctl.cli import output

    # a digest is never broken (it is compared by eye and grep); 80 columns: vLLM is -o wide's column
    table = output.table("replica", "vLLM", "weight version", "checksum", "cache namespace",
                         wrap=("weight version",), wide_only=("vLLM",))
    for r in report.replicas:
        if r.error:
            table.add_row(escape(r.name), "?", f"[red]{escape(r.error)}[/]", "", "")
            continue
        version = escape(r.weight_version) if r.weight_version is not None \
            else f"[dim]unknown ({escape(r.weight_note or '?')})[/]"
        digest = escape(r.digest) + (f" [dim]({r.workers} worker(s))[/]" if r.workers and r.workers > 1 else "") \
            if r.digest else "[dim]-[/]"
        if r.disagreeing:
            digest += f" [bold red]workers differ on {len(r.disagreeing)} shard(s)[/]"
        table.add_row(escape(r.name), escape(r.vllm_version or "?"), version, digest, _namespace_cell(r))
    output.show(table)
    for m in report.mixed:
        output.show(f"[bold red]mixed weights:[/] {escape(m.problem)}")
    if report.mixed:
        output.show("  [bold]fix:[/] kvctl weights update --from PATH on these replicas (one version everywhere), "
                    "or give deployments that are meant to differ their own cache_prefix")
    style = "green" if report.ok else "red"
    output.show(f"[{style}]{escape(report.summary)}[/] [dim]({report.elapsed_s:.2f} s)[/]")


def _namespace_cell(r: Any) -> str:
    from rich.markup import escape

    if r.namespace is None:
        known = r.connector is not None
        return "[dim]none (no shared store)[/]" if known else f"[dim]{escape(r.connector_source or '?')}[/]"
    return f"cache_prefix '{escape(r.namespace)}'" if r.namespace else "unprefixed keys"
