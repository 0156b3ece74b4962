"""`kvctl evidence take | check`: a reset's proof split across a weight update.

`take` (before the update, while the fleet serves the old weights) primes a canary on every serving
replica and writes them to a file; `kvctl reset --verify --evidence FILE` checks them after the
update, and `check` checks what is left (a reset on a fleet its owner paused, or the trainer's own
reset, which kvctl did not run): a canary hit is KV from before the update, STALE.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kvctl.cli.errors import finish_with_receipt, handle_errors
from kvctl.cli.options import (
    InventoryOpt,
    JsonOpt,
    MasterOpt,
    MasterRpcOpt,
    NoHeadersOpt,
    OutputOpt,
    RayOpt,
    RunOpt,
    StateDirOpt,
    UrlsOpt,
    output_options,
)
from kvctl.errors import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL

app = typer.Typer(help="Proof across a weight update: canaries primed before it, checked after it.",
                  no_args_is_help=True)

FileArg = Annotated[Path, typer.Argument(metavar="FILE", help="The evidence file (JSON).")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", metavar="S", help="Per-call timeout in seconds.")]


@app.command("take")
@output_options
@handle_errors
def take(
    out: Annotated[Path, typer.Option("--out", metavar="FILE", help="Where to write the evidence (replaced whole).")],
    run: RunOpt = None,
    url: UrlsOpt = None,
    inventory: InventoryOpt = None,
    timeout: TimeoutOpt = 10.0,
    ray: RayOpt = None,
    state_dir: StateDirOpt = None,
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Before a weight update: prime a canary on every serving replica (none on one paused by its owner or asleep).

    After the update, `kvctl reset --verify --evidence FILE` (or `kvctl evidence check FILE` for a reset kvctl did not run) proves no replica serves KV from before it. Exit 0 a canary on every replica, 3 on some, 1 on none.
    """
    import asyncio

    from kvctl.reset.evidence import take_evidence
    from kvctl.reset.options import ResetOptions
    from kvctl.targets import build_fleet

    options = ResetOptions(verify=True, timeout=timeout).check()
    fleet = build_fleet(url, inventory, None, run=run, state_dir=state_dir, ray=ray, masters_from_env=False)
    evidence = asyncio.run(take_evidence(fleet, options))
    evidence.save(out)
    usable = sum(e.usable for e in evidence.replicas.values())
    code = EXIT_OK if usable == len(evidence.replicas) else EXIT_FAILED if usable == 0 else EXIT_PARTIAL
    if json_out:
        from kvctl.cli.output import print_json

        print_json({**evidence.to_dict(), "ok": code == EXIT_OK, "exit_code": code, "file": str(out)})
    else:
        _print_taken(evidence, out, usable)
    raise typer.Exit(code)


@app.command("check")
@output_options
@handle_errors
def check(
    file: FileArg,
    run: RunOpt = None,
    url: UrlsOpt = None,
    inventory: InventoryOpt = None,
    master: MasterOpt = None,
    master_rpc: MasterRpcOpt = None,
    timeout: TimeoutOpt = 10.0,
    ray: RayOpt = None,
    state_dir: StateDirOpt = None,
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """After the update and the reset: every canary of FILE not yet checked must show no cached token. Nothing is reset.

    Targets default to the replicas the evidence was taken on. With --master, this deployment's keys are counted too (proof only while every replica is paused). Exit 0 clean, 1 STALE or not clean, 3 a replica still paused (its check stays pending). The file is updated: a canary is checked once.
    """
    from kvctl.api.loop import check_evidence_async
    from kvctl.cli.reset import _print
    from kvctl.reset.evidence import Evidence

    evidence = Evidence.load(file)

    async def check_and_record() -> Any:
        receipt = await check_evidence_async(evidence, url, inventory=inventory, master=master, master_rpc=master_rpc,
                                             run=run, state_dir=state_dir, ray=ray, timeout=timeout)
        evidence.save(file)
        return receipt

    finish_with_receipt(check_and_record(), json_out, "nothing was checked", _print)


def _print_taken(evidence: Any, out: Path, usable: int) -> None:
    from rich.markup import escape

    from kvctl.cli import output
    from kvctl.reset.window import describe

    table = output.table("replica", "window", "canary", "note", wrap=("note",))
    for e in evidence.replicas.values():
        canary = (f"[green]primed[/] ({e.canary.primed:g} cached)" if e.usable and e.canary.primed is not None
                  else "[green]primed[/]" if e.usable else "[yellow]none[/]")
        table.add_row(escape(e.name), escape(describe(e.window)), canary, escape(e.note or ""))
    output.show(table)
    style = "green" if usable == len(evidence.replicas) else "yellow"
    output.show(f"[{style}]{usable}/{len(evidence.replicas)} canary(ies) primed in {evidence.seconds:.2f} s, "
                f"written to {escape(str(out))}[/]")


__all__ = ["app"]
