"""`kvctl status`: is every replica up, what does it run, how often does its prefix cache hit."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any, Optional

import typer

from kvctl.cli.errors import handle_errors
from kvctl.cli.options import (InventoryOpt, JsonOpt, MasterOpt, NoHeadersOpt, OutputOpt, RayOpt, RunOpt, RunPosArg,
                               StateDirOpt, TimeoutOpt, UrlsOpt, one_run, output_options)
from kvctl.errors import UsageError


@output_options
@handle_errors
def status(
    run_arg: RunPosArg = None,
    run: RunOpt = None,
    url: UrlsOpt = None,
    inventory: InventoryOpt = None,
    master: MasterOpt = None,
    master_rpc: Annotated[Optional[str], typer.Option(
        "--master-rpc", metavar="HOST:PORT",
        help="The Mooncake master's RPC port (mooncake_master --rpc_port, e.g. 127.0.0.1:50051), as kvctl reset "
             "takes it (the same target flags work for both; status checks it, it sends nothing there). "
             "Default: $KVCTL_MASTER_RPC.")] = None,
    ray: RayOpt = None,
    state_dir: StateDirOpt = None,
    timeout: TimeoutOpt = 5.0,
    checksums: Annotated[bool, typer.Option(
        "--checksums", help="Also ask each replica for its weight checksums (POST /weight_checker, vLLM 0.32+, "
                            "dev mode) and show one digest per replica. vLLM hashes every weight for it, "
                            "holding generation meanwhile: seconds on a large model.")] = False,
    watch: Annotated[bool, typer.Option(
        "--watch", "-w", help="Check again every --interval seconds until Ctrl-C (then exit 0): a terminal "
                              "is redrawn; piped, one block per check after a timestamp line; with --json, "
                              "one JSON object per line.")] = False,
    interval: Annotated[float, typer.Option("--interval", metavar="S", help="With --watch: seconds between checks.")] = 2.0,
    count: Annotated[Optional[int], typer.Option("--count", hidden=True, help="With --watch: stop after N checks.")] = None,
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Health, version, weights, model and prefix-cache hit rates of every replica, and the Mooncake master's keys.

    Targets: RUN or --run RUN (a fleet started by kvctl serve, with its master and processes; with --ray ADDRESS, as that Ray cluster records it, its processes checked by their actors), --url/--inventory/$KVCTL_URLS, or else the only live run; --master takes one master or an HA group (a:9003,b:9003). Read-only (GETs only; --checksums adds a POST that changes nothing). Replicas of a fleet with a master that report different weight versions (or checksums) are flagged MIXED: their KV mixes in one store. Exit 0 every replica healthy (and the master reachable when one is targeted, and no mixed weights), 1 otherwise, 2 bad usage.
    """
    from kvctl.status import fleet_status
    from kvctl.targets import NoTargets, resolve_targets

    run = one_run(run_arg, run, "status")
    if timeout <= 0:
        raise UsageError("--timeout must be > 0")
    if not interval > 0 or interval == float("inf") or (count is not None and count < 1):
        raise UsageError(f"--interval must be a number of seconds > 0, got {interval!r}" if count is None or count >= 1
                         else "--count must be >= 1")
    if run is not None and (url or inventory is not None):
        raise UsageError("give --run NAME or --url/--inventory, not both",
                         "--run reads the replicas and the master from the run record")
    try:
        targets = resolve_targets(run, url, inventory, master, master_rpc, state_dir=state_dir, ray=ray,
                                  default_to_live_run=True)
    except NoTargets:
        if not json_out:  # the runs it could look at; still exit 2: nothing was checked
            _show_known_runs(state_dir)
        raise
    import asyncio  # lazily: --help and other commands do not need it

    def check() -> Any:
        return asyncio.run(fleet_status(targets.fleet.replicas, targets.fleet.masters, timeout, run=targets.run,
                                        cache_prefix=targets.fleet.cache_prefix, checksums=checksums,
                                        state_dir=state_dir, tenant_id=targets.fleet.tenant_id))

    if watch:
        raise typer.Exit(_watch(check, interval, count, json_out))
    result = check()
    if json_out:
        from kvctl.cli import output

        output.print_json(result.to_dict())
    else:
        _print(result)
    raise typer.Exit(result.exit_code)


def _watch(check: Callable[[], Any], interval: float, count: int | None, json_out: bool) -> int:
    """status --watch: check, print, sleep, until Ctrl-C (exit 0) or `count` checks (the last one's exit code)."""
    from kvctl.cli import output

    done = 0
    try:
        while True:
            result = check()  # the previous frame stays on screen while the replicas answer
            done += 1
            if json_out:
                output.print_json_line(result.to_dict())
            else:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
                output.redraw(f"kvctl status at {stamp}, every {interval:g} s" + (
                    "" if output.piped() else " (Ctrl-C stops)"), lambda: _print(result))
            if count is not None and done >= count:
                return int(result.exit_code)
            time.sleep(interval)
    except KeyboardInterrupt as exc:  # Ctrl-C: the way to stop watching, not a failure
        from kvctl.cli.errors import SignalInterrupt

        if isinstance(exc, SignalInterrupt):  # SIGTERM/SIGHUP under --json: handle_errors says so
            raise
        return 0


def _show_known_runs(state_dir: str | None) -> None:
    from kvctl.cli.runs import show_runs
    from kvctl.serve import runs

    found = runs.summaries(state_dir)
    if found:
        show_runs(found, runs.runs_dir(state_dir))


def _print(result: Any) -> None:
    from rich.markup import escape

    from kvctl.cli import output

    if result.run is not None:
        _print_run(result.run)
    # 80 columns: the model is a line under the table (one for replicas that serve the same) and the
    # hit rates are percentages; -o wide: a model column and the token counts
    table = output.table("replica", "health", "version", "weights", "model", "local hits", "store hits",
                         wide_only=("model",))
    for r in result.replicas:
        table.add_row(escape(r.name), _health_cell(r), escape(r.version or "?"), _weights_cell(r),
                      escape(", ".join(r.models) or "?"),
                      _rate_cell(r.local_hit_rate, r.counters, "local"),
                      _rate_cell(r.external_hit_rate, r.counters, "external"))
    output.show(table)
    if not output.wide():
        _print_models(result.replicas)
    for r in result.replicas:
        if r.error:
            style = "red" if not r.healthy else "yellow"
            where = "" if r.url.endswith("//" + r.name) else f" ({escape(r.url)})"
            output.show(f"[{style}]{escape(r.name)}[/]{where}: {escape(r.error)}")
    for problem in result.weights_mixed:
        output.show(f"[bold red]mixed weights:[/] {escape(problem)}")
    for m in result.masters:  # one master, or each of an HA group (the leader serves, standbys say not ready)
        output.show(_master_line(m))
    if result.shared_master:
        output.show(f"[yellow]shared master:[/] {escape(result.shared_master['message'])}")
        output.show(f"  isolation: {escape(result.shared_master['isolation'])}")
    style = "green" if result.ok else "red"
    output.show(f"[{style}]{escape(result.summary)}[/] [dim]({result.elapsed_s:.2f} s)[/]")


def _print_run(run: Any) -> None:
    from rich.markup import escape

    from kvctl.cli import output
    from kvctl.serve.runs import human_age

    state_style = {"running": "green", "starting": "yellow"}.get(run.state, "red")
    age = human_age(time.time() - run.created)
    where = f"Ray cluster {run.ray}" + (f", {run.dir}" if run.dir else "") if run.ray else run.dir
    output.show(f"run [bold]{escape(run.name)}[/]: [{state_style}]{escape(run.state)}[/], "
                f"template {escape(run.template)}, model {escape(run.model)}, started {age} ago "
                f"[dim]({escape(where)})[/]")
    if run.error:
        output.show(f"  [red]recorded error:[/] {escape(run.error)}")
    if run.processes:
        procs = ", ".join(f"{escape(p.name)} (pid {p.pid}{escape(' on ' + p.node) if p.node else ''}) "
                          + ("[green]alive[/]" if p.alive else "[red]gone[/]") for p in run.processes)
        output.show(f"  processes: {procs}")


def _health_cell(r: Any) -> str:
    if r.healthy:
        return "[green]ok[/]"
    return f"[bold red]{r.health}[/]"


def _weights_cell(r: Any) -> str:
    """'v2 (3f9a1c0b22de)': the weight version and, when read, the checksum digest; '?' when unknown
    (why: --json's weight_note)."""
    from rich.markup import escape

    if r.weight_version is None and r.weight_digest is None:
        return "[dim]?[/]"
    text = escape(r.weight_version or "?")
    if r.weight_digest:
        text += f" [dim]({escape(r.weight_digest)})[/]"
    return text + (" [bold red]workers differ[/]" if r.weight_disagreeing else "")


def _rate_cell(rate: float | None, counters: dict[str, Any] | None, kind: str) -> str:
    if counters is None:
        return "[dim]?[/]"
    hits, queries = counters.get(f"{kind}_hits"), counters.get(f"{kind}_queries")
    if hits is None or queries is None:
        return "[dim]not exported[/]"
    if rate is None:
        return "[dim]no queries[/]"
    from kvctl.cli import output

    return f"{rate:.1%}" + (f" [dim]({hits:.0f}/{queries:.0f} tokens)[/]" if output.wide() else "")


def _print_models(replicas: list[Any]) -> None:
    from kvctl.cli import output

    output.per_value("model", ((r.name, ", ".join(r.models) or "?") for r in replicas))


def _master_line(m: Any) -> str:
    from rich.markup import escape

    head = f"master {escape(m.address)}: "
    if m.key_count is None:
        return head + f"[bold red]not reachable[/]: {escape(m.error or 'no answer')}"
    state = "[green]reachable[/]" if m.reachable else "[bold red]not ready[/]"
    memory = human_bytes(m.allocated_bytes)
    if m.total_capacity_bytes is not None:
        memory += f" of {human_bytes(m.total_capacity_bytes)}"
    line = f"{head}{state}, {m.key_count} key(s), {memory} allocated"
    if m.active_clients is not None:
        line += f", {m.active_clients} client(s)"
    if m.error:
        line += f" ({escape(m.error)})"
    return line


def human_bytes(value: int | None) -> str:
    """1536 -> '1.5 KiB' (powers of 1024, like Mooncake's sizes)."""
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
