"""The root of the CLI: registers command groups and global options; nothing else."""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from kvctl._version import __version__
from kvctl.cli import compat, config, evidence, salt, weights
from kvctl.cli.coercion import install as install_coercion
from kvctl.cli.doctor import doctor
from kvctl.cli.logs import logs
from kvctl.cli.probe import probe
from kvctl.cli.reset import reset
from kvctl.cli.root import KvctlGroup
from kvctl.cli.runs import rm, runs_list
from kvctl.cli.serve import serve, stop
from kvctl.cli.status import status
from kvctl.cli.version import version

# Typer >= 0.26 would import pydantic (~0.1 s, half of a command's start-up) to turn "8" into 8:
# kvctl's plain option types are coerced without it; anything else still goes through Typer's own.
install_coercion()

app = typer.Typer(
    name="kvctl",
    help="Configure, check and hard-reset vLLM servers that offload KV cache to Mooncake.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, powershell)
    context_settings={"help_option_names": ["-h", "--help"]},
    cls=KvctlGroup,  # help panels and metavars, kvctl's error style for usage errors, --debug anywhere
)
app.add_typer(config.app, name="config")
app.add_typer(compat.app, name="compat")
app.add_typer(weights.app, name="weights")
app.add_typer(evidence.app, name="evidence")
app.add_typer(salt.app, name="salt")
app.command("reset")(reset)
app.command("probe")(probe)
app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(serve)
app.command("stop")(stop)
app.command("runs")(runs_list)
app.command("rm")(rm)
app.command("status")(status)
app.command("doctor")(doctor)
app.command("logs")(logs)
app.command("version")(version)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"kvctl {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version_callback, is_eager=True,
                                                    help="Print kvctl's version and exit.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks (same as KVCTL_DEBUG=1); also after the command.")] = False,
) -> None:
    """kvctl: configure, check and hard-reset vLLM + Mooncake deployments.

    Exit codes: 0 ok, 1 a check or operation failed, 2 bad usage or input.
    """
    if debug:
        os.environ["KVCTL_DEBUG"] = "1"


def run() -> None:
    app(prog_name="kvctl")  # also under `python -m kvctl`: completion scripts are keyed on the name
