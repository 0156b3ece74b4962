"""kvctl's command line: parses, calls kvctl's core, prints. No logic of its own."""

import sys

# httpx's __init__ imports its own command-line client (httpx._main), which pulls in click, rich's
# syntax highlighting and pygments: ~35 ms of every kvctl start that speaks HTTP, for a module kvctl
# never uses. A None entry makes that optional import fail fast, and httpx falls back to a stub
# `httpx.main`. Done here, in the CLI process kvctl owns, never in the library a user imports.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
