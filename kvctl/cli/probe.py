"""`kvctl probe`: does any replica serve KV computed with other weights? (content, not counts)"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kvctl.cli.errors import finish_with_receipt, handle_errors
from kvctl.cli.options import InventoryOpt, JsonOpt, RayOpt, RunOpt, RunPosArg, StateDirOpt, UrlsOpt, one_run
from kvctl.cli.options import NoHeadersOpt, OutputOpt, output_options
from kvctl.errors import UsageError

PromptsOpt = Annotated[
    Optional[Path],
    typer.Option("--prompts", metavar="FILE", help="Prompts to check: one per line, JSONL with a \"prompt\" field, or a .json list. Default: kvctl's fixed probe prompt."),
]


@output_options
@handle_errors
def probe(
    run_arg: RunPosArg = None,
    run: RunOpt = None,
    url: UrlsOpt = None,
    inventory: InventoryOpt = None,
    prompts: PromptsOpt = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", metavar="N", help="Greedy tokens compared per prompt.")] = 4,
    tolerance: Annotated[Optional[float], typer.Option("--tolerance", metavar="X", help="Largest log-probability difference still a match, for every replica. Default: each replica's own, from its dtype (GET /server_info): 1e-3 in float32, 0.25 in bfloat16/float16 or when the dtype is unknown (docs/reset.md).")] = None,
    timeout: Annotated[float, typer.Option("--timeout", metavar="S", help="Per-request timeout in seconds.")] = 120.0,
    ray: RayOpt = None,
    state_dir: StateDirOpt = None,
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Content-level proof: each prompt as is and with a fresh cache_salt (computed from scratch), compared.

    A replica whose plain answer differs from its fresh one (a token, the number of tokens, how it ended, the log-probabilities) serves stale KV (e.g. computed before a weight update). Exit 0 all match, 1 STALE found, 2 bad usage, 3 inconclusive somewhere (the report says why and how to fix it: no cache_salt in that vLLM, a cache that ignores the salt, a near-tie, an answer out of vLLM's layout).
    """
    from kvctl.reset.probe import ProbeOptions, load_prompts, probe_fleet
    from kvctl.targets import build_fleet

    run = one_run(run_arg, run, "probe")
    if max_tokens < 1 or not timeout > 0 or (tolerance is not None and not tolerance >= 0):
        raise UsageError("--max-tokens must be >= 1, --timeout > 0 and --tolerance >= 0")
    fleet = build_fleet(url, inventory, None, run=run, state_dir=state_dir, ray=ray, masters_from_env=False)
    texts = load_prompts(prompts) if prompts else None
    options = ProbeOptions(max_tokens=max_tokens, timeout=timeout, tolerance=tolerance)
    # SIGINT, SIGTERM and SIGHUP end the probe alike: a message and 128 + the signal (it changes nothing)
    finish_with_receipt(probe_fleet(fleet, texts, options), json_out, "the probe did not finish, nothing was judged",
                        _print)


def _print(report: Any) -> None:
    from rich.markup import escape

    from kvctl.cli import output

    # 80 columns: version and tolerance are -o wide's (each replica's tolerance is a line below)
    table = output.table("replica", "version", "tolerance", "prompt", "verdict", "why", wrap=("prompt", "why"),
                         wide_only=("version", "tolerance"))
    style = {"match": "green", "STALE": "bold red", "inconclusive": "yellow"}
    for r in report.replicas:
        tolerance = "" if r.tolerance is None else f"{r.tolerance:g}"
        if r.error:
            table.add_row(escape(r.name), escape(r.version or "?"), tolerance, "", "[yellow]inconclusive[/]",
                          escape(_why(r.error, r.hint)))
        for p in r.results:
            table.add_row(escape(r.name), escape(r.version or "?"), tolerance, escape(p.prompt),
                          f"[{style[p.verdict]}]{p.verdict}[/]", escape(_why(p.reason, p.hint)))
    output.show(table)
    for r in report.replicas:  # why each replica's comparison used its tolerance
        if r.tolerance_reason and report.tolerance is None:
            output.show(f"[dim]tolerance {r.tolerance:g} for {escape(r.name)}: {escape(r.tolerance_reason)}[/]")
    color = "green" if report.exit_code == 0 else "red" if report.exit_code == 1 else "yellow"
    given = "per replica" if report.tolerance is None else f"{report.tolerance:g} given"
    output.show(f"[{color}]{escape(report.summary)}[/] [dim](tolerance {given}, {report.seconds:.2f} s)[/]")


def _why(reason: str, hint: str | None) -> str:
    return f"{reason}; fix: {hint}" if hint else reason
