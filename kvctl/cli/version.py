"""`kvctl version [--json]`: kvctl's version, the vLLM and Mooncake releases its facts cover, and
what it runs on. Reads package metadata and kvctl/data only: never imports vllm, torch or mooncake."""

from __future__ import annotations

from typing import Any

from kvctl.cli.errors import handle_errors
from kvctl.cli.options import JsonOpt

_LIBRARIES = ("typer", "click", "rich")  # what draws kvctl's help and output: bug reports need them


@handle_errors
def version(json_out: JsonOpt = False) -> None:
    """Print kvctl's version, the vLLM and Mooncake releases its facts cover (first to last, how many), the vLLM installed here, and the Python, Typer, Click and Rich it runs on.

    A release newer than the last one covered is taken to do what that last one does. kvctl --version prints kvctl's version alone.
    """
    from rich.markup import escape

    from kvctl.cli import output

    info = collect()
    if json_out:
        output.print_json(info)
        return
    lines = _lines(info)
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        output.show(escape(f"{label:<{width}}  {value}"), soft_wrap=True)


def collect() -> dict[str, Any]:
    import platform
    import sys
    from importlib import metadata

    from kvctl._version import __version__
    from kvctl.facts.coverage import facts_coverage
    from kvctl.facts.versions import installed_vllm

    def dist_version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    found = installed_vllm()
    return {
        "kvctl": __version__,
        "facts": facts_coverage(),
        "vllm_installed": None if found is None else {"distribution": found.distribution,
                                                       "version": str(found.version)},
        "python": {"version": platform.python_version(), "executable": sys.executable},
        **{name: dist_version(name) for name in _LIBRARIES},
    }


def _lines(info: dict[str, Any]) -> list[tuple[str, str]]:
    facts = info["facts"]
    installed = info["vllm_installed"]
    here = "none in this Python" if installed is None else f"{installed['version']} ({installed['distribution']})"
    if installed is not None and _newer(installed["version"], facts["vllm"]["last"]):
        here += f"; newer than the facts: taken as {facts['vllm']['last']}"
    return [
        ("kvctl", info["kvctl"]),
        *((f"{name} facts", f"{f['first']} to {f['last']} ({f['count']} releases)")
          for name, f in (("vLLM", facts["vllm"]), ("Mooncake", facts["mooncake"]))),
        ("vLLM here", here),
        ("python", f"{info['python']['version']} ({info['python']['executable']})"),
        *((name, info[name] or "not installed") for name in _LIBRARIES),
    ]


def _newer(version: str, last: str) -> bool:
    from packaging.version import Version

    return Version(".".join(map(str, Version(version).release))) > Version(last)
