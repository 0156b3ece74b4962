"""The root command's behaviour (the app is built with `cls=KvctlGroup`; Typer's public `cls` hook):

* its help screens tidied once the command tree is built (kvctl.cli.panels);
* `--debug` taken anywhere before `--`, after the subcommand too (`kvctl reset ... --debug`), as
  `kvctl --debug reset ...`;
* every usage error click or Typer raises (no such option or command, missing or extra argument, bad
  value), from the root or any command under it, printed as kvctl prints its own errors (`error:` /
  `  fix:`, exit 2), and when the command line asks for JSON (`json_asked`: --json, -o json,
  --output json, --output=json, -ojson, any case) also as the JSON error object on stdout.

Errors are caught in make_context (the root's own options) and invoke (every subcommand's context is
made inside it), so this holds for `kvctl` run from a shell and for CliRunner.invoke(app) in tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

__all__ = ["KvctlGroup", "json_asked"]

DEBUG_FLAG = "--debug"
OUTPUT_OPTIONS = ("--output", "-o")  # kvctl.cli.options.OutputOpt: `-o json` is --json
VALUED_SHORT = "n"  # short options that take a value (logs -n N): a cluster ends at one


def _usage_error_class() -> type[Exception]:
    """click's UsageError, from Typer's public BadParameter (Typer 0.26 moved click inside typer._click;
    older ones use click itself): whichever click this Typer runs on."""
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


_USAGE_ERROR = _usage_error_class()


class KvctlGroup(TyperGroup):
    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._json_asked = False
        self._command_path = "kvctl"

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        args = hoist_debug(list(args)) if parent is None else list(args)
        self._json_asked = json_asked(args)
        if parent is None:
            words = command_words(self, args)
            self._command_path = " ".join([info_name or self.name or "kvctl", *words])
            self._tidy(words)
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except _USAGE_ERROR as exc:
            self._report(exc)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _USAGE_ERROR as exc:
            self._report(exc)

    def _tidy(self, words: list[str]) -> None:
        """Help panels and metavars for the commands the arguments name (their help may be shown);
        here, not in __init__: Typer adds --install-completion to the root after that."""
        from kvctl.cli.panels import tidy

        names = list((self.context_settings or {}).get("help_option_names", ["--help"]))
        command = self
        tidy(command, names)
        for depth, word in enumerate(words, start=1):
            command = command.commands[word]
            tidy(command, names, tuple(words[:depth]))

    def _report(self, exc: Any) -> None:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `kvctl config`: Typer shows the help itself
            raise exc
        from kvctl.cli.errors import report_usage_error

        report_usage_error(exc, self._json_asked, self._command_path)


def hoist_debug(args: list[str]) -> list[str]:
    """`--debug` anywhere before `--` moves in front of the subcommand, where the root option reads it."""
    head = _before_double_dash(args)
    if DEBUG_FLAG not in head:
        return args
    return [DEBUG_FLAG, *[a for a in head if a != DEBUG_FLAG], *args[len(head):]]


def json_asked(args: Sequence[str]) -> bool:
    """Whether the arguments ask for JSON, in any spelling click parses as it: --json, --output json,
    --output=json, -o json, -ojson, and -o at the end of a cluster of flags (-qo json, -qojson); the
    value in any case (-o is case-insensitive). Read from the raw arguments: a usage error can come
    before click has parsed -o, and the answer to it must be JSON all the same."""
    head = _before_double_dash(args)
    for i, arg in enumerate(head):
        value: str | None = None
        if arg == "--json":
            return True
        if arg.startswith("--output="):
            value = arg.partition("=")[2]
        elif arg in OUTPUT_OPTIONS:
            value = head[i + 1] if i + 1 < len(head) else None
        elif arg.startswith("-") and not arg.startswith("--"):
            for j, letter in enumerate(arg[1:], start=1):
                if letter in VALUED_SHORT:
                    break
                if letter == "o":
                    value = arg[j + 1:] or (head[i + 1] if i + 1 < len(head) else None)
                    break
        if value is not None and value.lower() == "json":
            return True
    return False


def command_words(root: Any, args: Sequence[str]) -> list[str]:
    """["weights", "update"]: the command the arguments name (for its help, and for an error click
    raises without its context, such as a missing option value); the root's and the groups' options
    are flags, so the first word that is not a command ends it."""
    words: list[str] = []
    command = root
    for arg in _before_double_dash(args):
        if arg.startswith("-"):
            continue
        command = getattr(command, "commands", {}).get(arg)
        if command is None:
            break
        words.append(arg)
    return words


def _before_double_dash(args: Sequence[str]) -> list[str]:
    """The arguments kvctl parses: after `--` come vLLM's own (kvctl serve MODEL -- ...)."""
    return list(args[:args.index("--")]) if "--" in args else list(args)
