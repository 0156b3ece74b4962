"""`kvctl config`: list, show, render and validate templates and configs."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from kvctl.cli.errors import EXIT_FAILED, handle_errors
from kvctl.cli.options import (FileArg, JsonOpt, NoHeadersOpt, OutputOpt, SetOpt, TemplateArg, TemplatePathOpt,
                               VllmVersionOpt, output_options)

app = typer.Typer(help="Render and check kv_transfer_config, mooncake.json and server env from templates.",
                  no_args_is_help=True)


class Format(str, Enum):
    verl = "verl"
    vllm_args = "vllm-args"
    json = "json"
    env = "env"
    mooncake = "mooncake"


@app.command("list")
@output_options
@handle_errors
def list_templates(template_path: TemplatePathOpt = None, output_format: OutputOpt = None,
                   no_headers: NoHeadersOpt = False, json_out: JsonOpt = False) -> None:
    """List templates: name, vLLM range, description (-o wide adds the connectors column)."""
    from rich.markup import escape

    from kvctl.cli import output
    from kvctl.config import templates

    rows = [
        {"name": t.name, "connectors": t.connectors(), "vllm": _range(t), "description": t.description,
         "origin": t.origin}
        for t in templates.load_all(template_path)
    ]
    if json_out:
        return output.print_json(rows)
    # the description names the connectors: their column (22 wide) is -o wide's, so 80 columns fit
    table = output.table("template", "connectors", "vLLM", "description", wrap=("connectors", "description"),
                         wide_only=("connectors",))
    for row in rows:
        name = escape(row["name"]) + ("" if row["origin"] == "built-in" else " [dim](user)[/]")
        table.add_row(name, escape(", ".join(row["connectors"])), escape(row["vllm"]), escape(row["description"]))
    output.show(table)


@app.command("show")
@output_options
@handle_errors
def show_template(
    name: TemplateArg,
    template_path: TemplatePathOpt = None,
    output_format: OutputOpt = None,
    no_headers: NoHeadersOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Show a template's parameters (default, help with the type; -o wide: a type column), layout and notes."""
    from rich.markup import escape

    from kvctl.cli import output
    from kvctl.config import templates

    t = templates.load(name, template_path)
    params = [{"name": p.name, "type": p.describe_type(), "default": p.default, "help": p.help}
              for p in t.parameters.values()]
    if json_out:
        return output.print_json({"name": t.name, "description": t.description, "vllm": _range(t),
                                  "connectors": t.connectors(), "origin": t.origin,
                                  "parameters": params, "notes": list(t.notes)})
    output.show(f"[bold]{escape(t.name)}[/]  ({escape(t.origin)})\n{escape(t.description)}\n"
                f"connectors: {escape(', '.join(t.connectors()))}   vLLM: {escape(_range(t))}")
    # the type joins the help (a table of four columns is 101 wide); -o wide gives it its own column
    table = output.table("parameter", "type", "default", "help", wrap=("help",), wide_only=("type",))
    for p in params:
        default = ("[dim](unset)[/]" if p["default"] is None
                   else escape(repr(p["default"]) if p["default"] == "" else str(p["default"])))
        helptext = escape(p["help"]) if output.wide() else f"{escape(p['help'])} [dim]({escape(p['type'])})[/]"
        table.add_row(escape(p["name"]), escape(p["type"]), default, helptext)
    output.show(table)
    for line in t.notes:
        output.show(f"[dim]note:[/] {escape(line)}")
    output.show(f"render it: kvctl config render {escape(t.name)} --format FORMAT",
                soft_wrap=True)  # a command: never broken (and under 80 columns)
    output.show("  FORMAT: verl, vllm-args, json, env or mooncake; --set KEY=VALUE (repeatable) sets a parameter")


@app.command("render")
@handle_errors
def render(
    name: TemplateArg,
    set_: SetOpt = None,
    vllm_version: VllmVersionOpt = None,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="What to print.")] = Format.verl,
    out_arg: Annotated[Optional[str], typer.Option("--out", metavar="DIR",
                   help="Write every format into DIR as files (atomically) instead of printing.")] = None,
    template_path: TemplatePathOpt = None,
) -> None:
    """Render a template for a vLLM version (default: the installed one, else the newest known).

    Notes on what was fitted to the version go to stderr, so stdout stays pipeable.
    """
    from kvctl.cli import output
    from kvctl.config import templates
    from kvctl.config.render import render as do_render
    from kvctl.config.render import write_bundle
    from kvctl.errors import UsageError
    from kvctl.facts.capabilities import resolve_target

    if out_arg is not None and not out_arg.strip():
        raise UsageError("--out '': an empty folder name (it would mean the current folder)",
                         "give a folder, e.g. --out ./deploy (use --out . for the current folder)")
    out = Path(out_arg) if out_arg is not None else None
    overrides = templates.parse_overrides(set_ or [])
    version, source = resolve_target(vllm_version)
    template = templates.load(name, template_path)
    bundle = do_render(template, overrides, version, source, bundle_dir=out)
    text = None if out else bundle.as_format(fmt.value)  # render fully before writing anything
    for line in bundle.notes:
        output.note(line)
    if out is None:
        output.print_text(text or "")
        return
    written = write_bundle(bundle, out)
    output.err_console().print(f"wrote {len(written)} files for vLLM {version} to {out}:", highlight=False)
    for path in written:
        output.err_console().print(f"  {path}", highlight=False)


@app.command("validate")
@handle_errors
def validate(
    file: FileArg,
    vllm_version: VllmVersionOpt = None,
    json_out: JsonOpt = False,
    allow_dropped: Annotated[bool, typer.Option(
        "--allow-dropped",
        help="Report settings vLLM accepts but silently does nothing with (a misspelled key it "
             "ignores, a file no connector reads) as warnings, exit 0. Default: errors, exit 1.",
    )] = False,
) -> None:
    """Check the KV-transfer configs in a file against a vLLM release.

    FILE: a kv_transfer_config (JSON/YAML), a mooncake.json, a verl config or Hydra override line,
    a `vllm serve` launch line or script, kvctl's vllm-args.txt, a vLLM --config YAML, a Kubernetes
    manifest or Helm template, production-stack Helm values, a Dockerfile, an env file, Python
    (KVTransferConfig, LLM, Ray Serve engine_kwargs), a prime-rl TOML, an LMCache config, or a
    `config render --out` folder.

    Reports every problem with file:line, what is wrong and how to fix it; exit 1 when any is an
    error, 2 when the input cannot be read (with --json, an error object on stdout too). A
    setting vLLM silently drops is an error unless --allow-dropped.
    """
    from kvctl.cli import output
    from kvctl.errors import KvctlError
    from kvctl.facts.capabilities import resolve_target
    from kvctl.validate import validate_path

    try:
        version, source = resolve_target(vllm_version)
        report = validate_path(file, version, allow_dropped=allow_dropped)
    except KvctlError as exc:
        if json_out:
            output.print_json({"path": str(file), "ok": False, "error": {
                "message": exc.message, "fix": exc.hint, "exit_code": exc.exit_code}})
            exc.json_reported = True  # type: ignore[attr-defined]  # handle_errors prints no second one
        raise
    if json_out:
        output.print_json({**report.to_dict(), "version_source": source})
    else:
        _print_report(report, source)
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def _print_report(report, source: str) -> None:  # noqa: ANN001 - ValidationReport, imported lazily
    from rich.markup import escape

    from kvctl.cli import output

    header = f"{escape(report.path)} ({report.kind}) for vLLM {report.vllm_version} [dim]({escape(source)})[/]"
    found = "".join(f"\n  [dim]found {escape(item)}[/]" for item in report.found)
    found += "".join(f"\n  [dim]not read {escape(item)}[/]" for item in report.unread)
    if not report.problems:
        output.show(f"[green]ok[/]  {header}: no problems found{found}")
        return
    output.show(header + found)
    for p in report.problems:
        tag = " [dim](dropped by vLLM)[/]" if p.dropped else ""
        output.show(f"{output.styled(p.severity)}{tag}  [bold]{escape(p.where)}[/]\n    {escape(p.message)}\n"
                    f"    [dim]fix:[/] {escape(p.fix)}")
    errors = sum(p.severity == "error" for p in report.problems)
    warnings = len(report.problems) - errors
    verdict = "[red]invalid[/]" if errors else "[yellow]valid, with warnings[/]"
    output.show(f"{verdict}: {errors} error(s), {warnings} warning(s)")


def _range(t) -> str:  # noqa: ANN001 - Template
    return str(t.vllm) or "any"
