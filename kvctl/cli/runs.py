"""`kvctl runs` and `kvctl rm`: the runs kvctl serve recorded, stopped ones included, like
`docker ps -a` and `docker rm`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from kvctl.cli.completion import run_names
from kvctl.cli.errors import handle_errors
from kvctl.cli.options import JsonOpt, NoHeadersOpt, OutputOpt, RayOpt, StateDirOpt, output_options
from kvctl.errors import UsageError

if TYPE_CHECKING:
    from kvctl.serve.runs import RunSummary

RUN_STATES = ("running", "starting", "exited", "failed", "stopped", "unreadable")  # kvctl.serve.runs.RunSummary
STATE_STYLE = {"running": "green", "starting": "yellow", "exited": "bold red", "failed": "red",
               "stopped": "dim", "unreadable": "magenta"}
LEGEND = {
    "exited": "exited: recorded as running, but none of its processes is alive (crashed, or killed outside kvctl)",
    "unreadable": "unreadable: its run.json is not a kvctl run record (kvctl rm --force NAME removes it)",
}
RAY_LEGEND = "on Ray: a run on the Ray cluster at {address}, state as recorded; kvctl runs --ray {address} checks it"


@output_options
@handle_errors
def runs_list(
    ray: RayOpt = None,
    state_dir: StateDirOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print run names only, one a line, newest first (as docker ps -q).")] = False,
    states: Annotated[Optional[list[str]], typer.Option("--state", metavar="STATE", help=f"Only runs in this state (repeatable): {', '.join(RUN_STATES)}.")] = None,
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """List the runs kvctl serve recorded, stopped ones included (like docker ps -a), newest first.

    Columns: name, state, age, replicas, model (-o wide adds master and cache_prefix). The state is the recorded one checked against the processes (pid and start time): a run recorded as running whose processes are all gone shows as exited. Reuse a name that is not running with kvctl serve --run NAME (its files move to NAME/previous/); remove a run with kvctl rm NAME. With --ray ADDRESS: the runs that Ray cluster records (kvctl serve --ray), each checked by its actors; without it a Ray run is listed as recorded, unchecked. Piped, the table prints as plain columns; -q prints names only (kvctl rm $(kvctl runs -q --state exited)).
    """
    from kvctl.cli import output
    from kvctl.serve import runs

    wanted = _states(states)
    if quiet and json_out:
        raise UsageError("give -q or --json (-o json), not both", "-q prints names only; --json every field")
    if ray is not None:
        from kvctl.serve import ray_fleet

        gcs, found = ray_fleet.summaries(ray, state_dir)
        where, key, value = f"the Ray cluster at {gcs}", "ray", gcs
    else:
        found = runs.summaries(state_dir)
        where = str(runs.runs_dir(state_dir))
        key, value = "runs_dir", where
    found = [s for s in found if wanted is None or s.state in wanted]
    if json_out:
        output.print_json({key: value, "runs": [s.to_dict() for s in found]})
        return
    if quiet:
        output.print_text("".join(f"{s.name}\n" for s in found))
        return
    if not found:
        which = "" if wanted is None else " " + " or ".join(sorted(wanted))
        output.show(f"no{which} runs in {_escape(where)} (start one with kvctl serve)")
        return
    show_runs(found, where)


def _states(states: list[str] | None) -> set[str] | None:
    """The --state filter, checked: a misspelt state would list nothing and look like no runs."""
    if not states:
        return None
    wanted = {s.strip().lower() for s in states}
    unknown = sorted(wanted - set(RUN_STATES))
    if unknown:
        raise UsageError(f"--state {unknown[0]}: not a run state", f"give one of: {', '.join(RUN_STATES)}")
    return wanted


def show_runs(found: list[RunSummary], where: Path | str) -> None:
    """The runs table (also what kvctl status shows when it has nothing to look at)."""
    from kvctl.cli import output

    table = output.table("name", "state", "age", "replicas", "model", "master", "cache_prefix",
                         title=f"runs in {where}", wide_only=("master", "cache_prefix"))  # 80 columns
    for s in found:
        style = STATE_STYLE.get(s.state, "")
        table.add_row(_escape(s.name), f"[{style}]{_escape(s.state)}[/]" if style else _escape(s.state), s.age,
                      _replicas_cell(s), _escape(s.model or "?"), _escape(_master_cell(s)),
                      _escape(s.cache_prefix or "-"))
    output.show(table)
    # what a state means: under the table (wrapped at 80 columns), on stderr when it prints plain rows
    # (stdout is then rows only, for awk)
    legends = [LEGEND[state] for state in sorted({s.state for s in found} & LEGEND.keys())]
    legends += [RAY_LEGEND.format(address=a) for a in sorted({s.ray for s in found if s.ray and not s.checked})]
    for legend in legends:
        output.note(legend) if output.plain() else output.show(f"[dim]{_escape(legend)}[/]")


def _replicas_cell(s: RunSummary) -> str:
    if s.state == "unreadable":
        return "?"
    if not s.checked:
        return f"{len(s.replicas)} on Ray"
    if s.state in ("running", "starting"):
        return f"{s.replicas_live}/{len(s.replicas)} live"
    return str(len(s.replicas))


def _master_cell(s: RunSummary) -> str:
    if s.master is None:
        return "?" if s.state == "unreadable" else "-"
    return s.master["rpc_address"] + (" (embedded)" if s.master["embedded"] else "")


@handle_errors
def rm(
    names: Annotated[list[str], typer.Argument(metavar="RUN", autocompletion=run_names, help="Run name(s), as kvctl runs lists them.", show_default=False)],
    force: Annotated[bool, typer.Option("--force", "-f", help="Stop a running run first (only the processes it started), then remove it.")] = False,
    grace: Annotated[float, typer.Option("--grace", metavar="S", help="With --force: seconds between SIGTERM and SIGKILL.")] = 10.0,
    ray: RayOpt = None,
    state_dir: StateDirOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Remove runs that are not running (like docker rm): each run's folder, with its logs, config and earlier runs.

    A running run is refused (stop it first with kvctl stop NAME, or pass --force). All or nothing: an unknown name or a refused run removes none (exit 2). Only folders inside the state dir's runs/ folder are removed, never what a link points to. A Ray run's record in its cluster goes too; with --ray ADDRESS, the runs that cluster records (and their local folders, if they were started from here).
    """
    from kvctl.cli import output

    if ray is not None:
        from kvctl.serve import ray_fleet

        removed = ray_fleet.remove(ray, names, state_dir, force=force, grace=grace)
    else:
        from kvctl.serve.lifecycle import remove_runs

        removed = remove_runs(names, state_dir, force=force, grace=grace)
    if json_out:
        output.print_json({"removed": [r.to_dict() for r in removed]})
        return
    for r in removed:
        stopped = "; stopped first: " + ", ".join(f"{n} {res}" for n, res in r.stopped) if r.stopped else ""
        output.show(_escape(f"removed run {r.name} ({r.state}{stopped}): {r.dir or 'its record in the cluster'}"),
                    soft_wrap=True)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
