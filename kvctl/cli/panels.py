"""Help screens: the option groups (Rich help panels) of every command, in one table, and the tidying
that keeps Typer's type labels out of them.

Why here and not on each option: the panels of a command are one decision (what a reader looks for
first), so they live together, keyed by command and option; the declarations stay about what an
option does. `tidy()` applies them, once per build of the click command tree (kvctl.cli.root).

What `tidy()` does to each command of the tree, and why:

* panels: `rich_help_panel` from PANELS. An option a paneled command has but PANELS does not name
  stays in Typer's own "Options" panel (shown first: nothing is hidden; tests/unit/cli/
  test_help_pty.py names it, so that it gets a place).
* metavars: Typer 0.29 prints its type labels (``<bool>`` after every flag, ``<str>``, ``<path>``,
  ``<list[str]>``) where click printed a metavar, and ``{NAME}`` for a required argument in the
  usage line. A flag gets an empty metavar (nothing after it); an option without one gets its own
  name in capitals (``--host HOST``, as argparse does) or its choices (``verl|json``); an argument
  shows only its name (usage: ``NAME``, ``[NAME]`` when optional, ``NAME...`` when repeatable).
* help text: Typer's rich markup mode joins the lines of the first paragraph only; the later ones
  keep every line break of the docstring, so a paragraph wrapped at 100 columns in the source came
  out in ragged pieces at 80. Each paragraph is joined into one; a paragraph that starts with
  ``\\b`` (click's and Typer's mark for "keep my lines") keeps its lines, without the mark.

Only click's public attributes are set (``metavar``, ``help``, ``rich_help_panel``), except for
arguments: Typer 0.29 labels an argument's type even when it has a metavar, in
``display_type_rich`` and ``_usage_display_name``; the per-parameter ``display_type_rich`` and click's
public ``get_usage_pieces`` are replaced on those objects only where the Typer in use has them (with
another Typer these two lines do nothing and its own labels show).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["PANELS", "tidy", "tidy_tree", "unpaneled"]

_TARGETS = ("Targets", ["--run", "--url", "--inventory", "--master", "--master-admin", "--master-rpc", "--ray",
                        "--state-dir"])
_OUTPUT = ("Output", ["--output", "--no-headers", "--json", "--help"])

# command path -> its panels in order, each (title, options by their long name); the Arguments panel
# (Typer's) comes first
PANELS: dict[str, list[tuple[str, list[str]]]] = {
    "reset": [
        _TARGETS,
        ("What to clear", ["--connector", "--no-mm", "--no-encoder", "--whole-master"]),
        ("Verification", ["--verify", "--evidence", "--probe-prompts", "--allow-mixed-weights"]),
        ("Safety and timing", ["--dry-run", "--pause", "--pause-mode", "--pause-timeout", "--clear-timeout", "--timeout",
                               "--retries", "--concurrency"]),
        _OUTPUT,
    ],
    "weights update": [
        ("Weights", ["--from", "--version", "--remote-path", "--resume-failed"]),
        _TARGETS,
        ("Verification", ["--verify", "--probe-prompts"]),
        ("Reset and timing", ["--dry-run", "--whole-master", "--reload-timeout", "--pause-timeout",
                              "--clear-timeout", "--timeout", "--retries", "--concurrency"]),
        _OUTPUT,
    ],
    "serve": [
        ("Replicas", ["--template", "--set", "--template-path", "--replicas", "--vllm-python", "--host",
                      "--base-port", "--allow-remote-admin", "--health-timeout"]),
        ("Mooncake master", ["--master", "--master-rpc", "--master-admin", "--master-arg"]),
        ("Run", ["--run", "--name", "--replace", "--detach", "--state-dir"]),
        ("Ray", ["--ray", "--ray-master-resource"]),
        _OUTPUT,
    ],
    "status": [_TARGETS, ("Checks", ["--checksums", "--timeout", "--watch", "--interval"]), _OUTPUT],
    "weights show": [_TARGETS, ("Checks", ["--checksums", "--timeout"]), _OUTPUT],
    "probe": [_TARGETS, ("Probe", ["--prompts", "--max-tokens", "--tolerance", "--timeout"]), _OUTPUT],
}


def tidy(command: Any, help_names: list[str], path: tuple[str, ...] = ()) -> None:
    """Panels, metavars and help paragraphs for `command` (at `path` under the root), and the help of
    the commands under it (their first paragraph is its Commands panel). One command, not the tree:
    a run tidies the commands its arguments name (kvctl.cli.root), a few milliseconds less each."""
    if getattr(command, "_kvctl_tidied", False):
        return
    for each in [command, *getattr(command, "commands", {}).values()]:
        if each.help and not getattr(each, "_kvctl_reflowed", False):
            each.help = reflow(each.help)
            each._kvctl_reflowed = True
    panel_of = {opt: title for title, opts in PANELS.get(" ".join(path), []) for opt in opts}
    help_option = _help_option(command, help_names)
    for param in [*command.params, *([help_option] if help_option is not None else [])]:
        if param.param_type_name == "argument":
            _tidy_argument(param)
            continue
        _tidy_option(param)
        title = next((panel_of[o] for o in [*param.opts, *param.secondary_opts] if o in panel_of), None)
        if title is not None and hasattr(param, "rich_help_panel"):
            param.rich_help_panel = title
    command._kvctl_tidied = True


def tidy_tree(command: Any, help_names: list[str], path: tuple[str, ...] = ()) -> None:
    """`tidy` for every command of the tree (tests render them all)."""
    tidy(command, help_names, path)
    for name, sub in getattr(command, "commands", {}).items():
        tidy_tree(sub, help_names, (*path, name))


def unpaneled(command: Any, help_names: list[str], path: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """The options of a command with panels that PANELS does not place (tests: nothing is left out)."""
    found: dict[str, list[str]] = {}
    key = " ".join(path)
    if key in PANELS:
        placed = {opt for _, opts in PANELS[key] for opt in opts}
        params = [*command.params, _help_option(command, help_names)]
        missing = [max(p.opts, key=len) for p in params if p is not None and p.param_type_name == "option"
                   and not getattr(p, "hidden", False) and not placed & {*p.opts, *p.secondary_opts}]
        if missing:
            found[key] = missing
    for name, sub in getattr(command, "commands", {}).items():
        found.update(unpaneled(sub, help_names, (*path, name)))
    return found


def reflow(text: str) -> str:
    """Each paragraph on one line (Typer's rich mode keeps the line breaks of all but the first);
    a paragraph that starts with \\b keeps its lines."""
    import inspect

    body, formfeed, rest = inspect.cleandoc(text).partition("\f")
    paragraphs = []
    for paragraph in body.split("\n\n"):
        if paragraph.startswith("\b"):
            paragraphs.append(paragraph.lstrip("\b").strip("\n"))
        else:
            paragraphs.append(" ".join(line.strip() for line in paragraph.splitlines() if line.strip()))
    return "\n\n".join(p for p in paragraphs if p) + formfeed + rest


def _help_option(command: Any, help_names: list[str]) -> Any:
    """The command's -h/--help option: click makes it for the first context and keeps it; made here
    with the same names, so that it too gets an empty metavar and its panel."""
    import typer

    try:
        return command.get_help_option(typer.Context(command, help_option_names=help_names))
    except (AttributeError, TypeError):  # another click/Typer: Typer's own help option, untouched
        return None


def _tidy_option(param: Any) -> None:
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        param.metavar = ""  # a flag takes no value: nothing after its name (Typer 0.29 prints <bool>)
    elif param.metavar is None:
        param.metavar = _choices(param) or param.name.upper()


def _choices(param: Any) -> str | None:
    """`a|b|c` for an option of choices (an Enum or Literal), from Typer's own label `<a|b|c>`; None
    for any other option, or with a Typer that labels them otherwise."""
    if not getattr(getattr(param, "type_descriptor", None), "is_choice", False):
        return None
    try:
        label = param.display_type_rich(None)
    except Exception:  # noqa: BLE001 - a label is not worth a failed --help
        return None
    match = re.fullmatch(r"<([^<>]+)>", label or "")
    return match.group(1) if match else None


def _tidy_argument(param: Any) -> None:
    if param.metavar is None:
        param.metavar = param.name.upper()
    if hasattr(param, "display_type_rich"):  # Typer >= 0.26: no <str>/<path> beside the argument's name
        param.display_type_rich = lambda ctx: None
    if hasattr(param, "_usage_display_name"):  # Typer >= 0.26 writes {NAME} for a required one
        param.get_usage_pieces = lambda ctx, _p=param: [_usage_name(_p)]


def _usage_name(param: Any) -> str:
    name = param.metavar
    if name.startswith("["):  # kvctl wrote it as it wants it shown ([RUN], [RUN]...)
        return name
    if not param.required:
        name = f"[{name}]"
    if param.nargs != 1 and not name.endswith("..."):
        name += "..."
    return name
