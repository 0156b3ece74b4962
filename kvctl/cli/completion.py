"""Shell completion (`kvctl --install-completion`): template and run names, a run's processes,
--set KEY= from the chosen template, --url from recorded runs.

Completion runs kvctl once per <TAB>: these read the least they can (folder listings; one run.json
for a run's processes; one template's YAML for --set; the run.json files, nothing else, for --url),
start no process check, and never raise, so a broken template path or state dir completes nothing
instead of printing a traceback into the user's prompt.

Every name offered comes from disk (run folders, run.json, template files), and a shell inserts it
into the command line as it is: only values that paste safely are offered (`_offer`), so a folder
named `x$(...)`, `a;b`, with a newline, an escape sequence or a bidi control completes nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import typer

# what a shell takes as one plain word: no whitespace, quote, $, `, ;, |, &, <, >, *, ?, [, ], (, ), \, !,
# ~, # or control character; a first character that is not '-' (an option) and at most 256 of them
_SAFE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.:/@%+=,-]{0,255}")


def _offer(values: Iterable[Any], incomplete: str) -> list[str]:
    """The values that start with `incomplete` and paste safely (_SAFE), once each, in order."""
    return [v for v in dict.fromkeys(values) if isinstance(v, str) and _SAFE.fullmatch(v) and v.startswith(incomplete)]


def _run_name(name: str) -> bool:
    """A name kvctl serve could have given a run (kvctl.serve.runs.check_name): another folder is no run."""
    from kvctl.errors import UsageError
    from kvctl.serve.runs import check_name

    try:
        return bool(check_name(name))
    except UsageError:
        return False


def template_names(incomplete: str) -> list[str]:
    try:
        from kvctl.config.templates import discover

        return _offer(discover(), incomplete)
    except Exception:  # noqa: BLE001 - completion must never fail loudly
        return []


def run_names(incomplete: str) -> list[str]:
    try:
        from kvctl.serve.runs import RUN_FILE, runs_dir

        base = runs_dir()
        names = sorted(p.parent.name for p in base.glob(f"*/{RUN_FILE}")) if base.is_dir() else []
        return _offer((n for n in names if _run_name(n)), incomplete)
    except Exception:  # noqa: BLE001
        return []


def replica_names(ctx: typer.Context, incomplete: str) -> list[str]:
    """The processes of the run named before it (kvctl logs RUN <TAB>): r0, r1, ..., master."""
    try:
        from kvctl.serve.logs import MASTER
        from kvctl.serve.runs import RUN_FILE, runs_dir

        run = ctx.params.get("run")
        if not run:
            return []
        data = json.loads((runs_dir(ctx.params.get("state_dir")) / run / RUN_FILE).read_text("utf-8"))
        names = [r["name"] for r in data.get("replicas") or []]
        if (data.get("master") or {}).get("embedded"):
            names.append(MASTER)
        return _offer(names, incomplete)
    except Exception:  # noqa: BLE001
        return []


def set_keys(ctx: typer.Context, incomplete: str) -> list[str]:
    """KEY= of the chosen template's parameters (--template, config render's NAME, else the command's
    default template); after KEY=, a choice or bool parameter's values."""
    try:
        from kvctl.config.templates import load

        given = ctx.params if ctx.params.get("name") or ctx.params.get("template") else _reparsed(ctx)
        name = given.get("template") or given.get("name") or _default(ctx, "template")
        if not name:
            return []
        params = load(name, given.get("template_path")).parameters
        key, eq, value = incomplete.partition("=")
        if not eq:
            return _offer((f"{k}=" for k in params), incomplete)
        param = params.get(key)
        values = list(param.choices) if param and param.type == "choice" else ["true", "false"] \
            if param and param.type == "bool" else []
        return _offer((f"{key}={v}" for v in values), f"{key}={value}")
    except Exception:  # noqa: BLE001
        return []


def replica_urls(incomplete: str) -> list[str]:
    """The replica URLs of runs recorded as starting or running (kvctl runs checks which still live);
    typed without a scheme (host:port), they complete without one."""
    try:
        from kvctl.serve.runs import LIVE_STATES, RUN_FILE, runs_dir

        base = runs_dir()
        urls: list[str] = []
        for path in sorted(base.glob(f"*/{RUN_FILE}")) if base.is_dir() else ():
            try:
                data = json.loads(path.read_text("utf-8"))
            except (OSError, ValueError):
                continue
            if data.get("state") in LIVE_STATES:
                urls += [r["url"] for r in data.get("replicas") or [] if isinstance(r.get("url"), str)]
        schemes = ("http://", "https://")
        plain = bool(incomplete) and not any(s.startswith(incomplete) or incomplete.startswith(s) for s in schemes)
        offered = [u.split("://", 1)[-1] if plain else u for u in urls]
        return _offer(offered, incomplete)
    except Exception:  # noqa: BLE001
        return []


def _default(ctx: typer.Context, param: str) -> Any:
    for p in ctx.command.params:
        if p.name == param:
            return p.default
    return None


def _reparsed(ctx: typer.Context) -> dict[str, Any]:
    """The command's parameters from the words typed before `--set <TAB>`. Click stops parsing at the
    option whose value is being completed and so never reaches positionals (config render NAME);
    parsed again without that option, they are there. The words come from the environment the
    completion scripts set (Typer's protocol: COMP_WORDS/COMP_CWORD for bash, _TYPER_COMPLETE_ARGS else)."""
    import os
    import shlex

    if "COMP_WORDS" in os.environ:
        words = shlex.split(os.environ["COMP_WORDS"])[1:int(os.environ.get("COMP_CWORD", "0"))]
    else:
        line = os.environ.get("_TYPER_COMPLETE_ARGS", "")
        words = shlex.split(line)[1:]
        if words and not line.endswith(" "):
            words = words[:-1]  # the word being completed
    if words and words[-1].startswith("-"):
        words = words[:-1]  # the option waiting for the value being completed
    if ctx.info_name not in words:
        return {}
    rest = words[words.index(ctx.info_name) + 1:]
    return ctx.command.make_context(ctx.info_name, rest, parent=ctx.parent, resilient_parsing=True).params
