"""`kvctl salt check`: does a per-version cache_salt isolate every tier of a live fleet? (proof, no reset)"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from kvctl.cli.errors import finish_with_receipt, handle_errors
from kvctl.cli.options import InventoryOpt, JsonOpt, RayOpt, RunOpt, RunPosArg, StateDirOpt, UrlsOpt, one_run
from kvctl.cli.options import NoHeadersOpt, OutputOpt, output_options
from kvctl.errors import UsageError

app = typer.Typer(help="Versioned caches: prove that a per-version cache_salt isolates every tier.",
                  no_args_is_help=True)


@app.command("check")
@output_options
@handle_errors
def check(
    run_arg: RunPosArg = None,
    run: RunOpt = None,
    url: UrlsOpt = None,
    inventory: InventoryOpt = None,
    salts: Annotated[Optional[list[str]], typer.Option("--salt", metavar="SALT", help="A cache_salt to compare (give two: the first primes, the second must not reuse its KV). Default: two fresh random salts.")] = None,
    versions: Annotated[Optional[list[str]], typer.Option("--weight-version", metavar="V", help="Two weight versions instead of --salt, made salts with --salt-format, as your loop sends them.")] = None,
    salt_format: Annotated[str, typer.Option("--salt-format", metavar="TEXT", help="How a weight version becomes a salt ({version} is replaced), e.g. 'weight-version:{version}'.")] = "{version}",
    settle: Annotated[float, typer.Option("--settle", metavar="S", help="Seconds between priming a prompt on one replica and reading it on the next (the connector stores asynchronously).")] = 3.0,
    timeout: Annotated[float, typer.Option("--timeout", metavar="S", help="Per-request timeout in seconds.")] = 120.0,
    ray: RayOpt = None,
    state_dir: StateDirOpt = None,
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Per replica and tier (local prefix cache, external store): isolated, LEAKS or unproven.

    Fresh random prompts, no reset, no pause (a paused replica gets no request): a prompt salted with the first salt, then with the second (must reuse nothing), then with the first again (must hit: the positive control). The store tier is read on the next replica, which never saw the prompt. Exit 0 isolated everywhere, 1 a tier LEAKS, 2 bad usage, 3 unproven somewhere (a control failed: the report says why).
    """
    from kvctl.reset.salting import SaltOptions, check_salt_isolation, salts_of_versions
    from kvctl.targets import build_fleet

    run = one_run(run_arg, run, "salt check")
    if salts and versions:
        raise UsageError("give --salt or --weight-version, not both")
    if salts is not None and len(salts) != 2:
        raise UsageError(f"--salt takes two salts, got {len(salts)}", "e.g. --salt v7 --salt v8")
    pair = salts_of_versions(versions, salt_format) if versions else (tuple(salts) if salts else None)
    options = SaltOptions(salts=pair, settle=settle, timeout=timeout).check()  # type: ignore[arg-type]
    fleet = build_fleet(url, inventory, None, run=run, state_dir=state_dir, ray=ray, masters_from_env=False)
    finish_with_receipt(check_salt_isolation(fleet, options), json_out,
                        "the salt check did not finish, nothing was judged", _print)


def _print(report: Any) -> None:
    from rich.markup import escape

    from kvctl.cli import output

    table = output.table("replica", "connector", "tier", "verdict", "why", wrap=("why",), wide_only=("connector",))
    style = {"isolated": "green", "LEAKS": "bold red", "unproven": "yellow"}
    for r in report.replicas:
        for t in (r.local, r.store):
            why = f"{t.reason}; fix: {t.hint}" if t.hint else t.reason
            table.add_row(escape(r.name), escape(r.connector or "-"), "local prefix cache" if t.tier == "local"
                          else "external store", f"[{style[t.verdict]}]{t.verdict}[/]", escape(why))
    output.show(table)
    color = "green" if report.exit_code == 0 else "red" if report.exit_code == 1 else "yellow"
    output.show(f"[{color}]{escape(report.summary)}[/] [dim](salts {escape(report.salts[0])!s} / "
                f"{escape(report.salts[1])}, {report.seconds:.2f} s)[/]")
