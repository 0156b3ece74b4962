"""What reaches vLLM's environment from a script: `export`, `declare -x`, `set -a`, a command's own
`A=b cmd` prefix. A name the servers read assigned on its own line and never exported stays a shell
variable: bash passes only exported names to the programs it starts, so `vllm serve` on a later
line runs without it. The reader is version-free: which names count is one list
(kvctl.facts.env_vars.server_reads), the same for every release.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from kvctl.facts.env_vars import server_reads
from kvctl.validate.model import ERROR, Artifact, Problem
from kvctl.validate.readers.shell_words import Token

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REFERENCE = re.compile(r"\$(?:\{(?P<braced>\w+)[^}]*\}|(?P<plain>[A-Za-z_]\w*))")
_ASSIGNED = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\+?=")
_DECLARERS = ("declare", "typeset", "local", "readonly")


def exporting(tokens: list[Token]) -> bool:
    """`export ...`, or `declare -x ...` (and typeset/local/readonly with an x among the options)."""
    if not tokens:
        return False
    if tokens[0].text == "export":
        return not any(t.text.startswith("-") and "n" in t.text for t in tokens[1:])  # export -n unexports
    return tokens[0].text in _DECLARERS and any(t.text.startswith("-") and "x" in t.text for t in tokens[1:])


def bare_names(tokens: list[Token]) -> list[str]:
    """The NAMEs `export NAME` / `declare -x NAME` exports without giving a value."""
    return [t.text for t in tokens[1:] if _NAME.match(t.text)]


def is_launch(tokens: list[Token]) -> int | None:
    """The index of the word that starts vLLM's server (`vllm serve`, `.../vllm serve`, `python -m
    vllm.entrypoints...`), wherever it is in the command (after env, nohup, numactl ...)."""
    words = [t.text for t in tokens]
    for index, word in enumerate(words):
        after = words[index + 1] if index + 1 < len(words) else ""
        if (word == "vllm" or word.endswith("/vllm")) and after == "serve":
            return index
        if word == "-m" and after.startswith("vllm.entrypoints"):
            return index
    return None


class _State(Protocol):
    """The reader's shell state (shell.py's _Shell): what the script has set and exported so far."""

    variables: dict[str, str]
    exported: dict[str, str]

    def expand(self, text: str) -> str: ...


@dataclass
class Exports:
    """Assignments the servers would need but bash keeps in the script, until a launch shows it.
    `seen` runs on every command before the shell state takes it in."""

    allexport: bool = False  # `set -a`: every later assignment is exported
    pending: dict[str, list[int]] = field(default_factory=dict)  # name -> lines assigned, unexported
    used: set[str] = field(default_factory=set)  # names the script itself reads as $NAME

    def seen(self, tokens: list[Token], found: list[tuple[Token, str, str]], shell: _State) -> None:
        """`found`: the command's assignments (shell.assignments). Exports what bash exports and
        the state would not (`export NAME`, `declare -x`, anything under `set -a`), and keeps
        each server name assigned on its own line without export."""
        words = [t.text for t in tokens]
        self._options(words)
        self.used.update(_references(words))
        if words[:1] == ["unset"]:
            for name in words[1:]:
                self.pending.pop(name, None)
        pure = bool(found) and len(found) == len(tokens) and not tokens[0].opens_array
        if exporting(tokens) or (pure and self.allexport):
            for token, name, raw in found:
                shell.exported[name] = shell.expand(raw)
            for name in bare_names(tokens) if exporting(tokens) else ():
                if name in shell.variables:  # `export NAME` exports the value it has
                    shell.exported[name] = shell.variables[name]
                self.pending.pop(name, None)
            for _, name, _ in found:
                self.pending.pop(name, None)
        elif pure:
            for token, name, raw in found:
                self._assigned(name, token.line, raw, name in shell.exported)

    def _options(self, words: list[str]) -> None:
        """`set -a`, `set -ea`, `set -o allexport` turn allexport on; the `+` forms turn it off."""
        if words[:1] != ["set"]:
            return
        for index, word in enumerate(words[1:], start=1):
            long = word[1:] == "o" and words[index + 1:index + 2] == ["allexport"]
            if word[:1] in ("-", "+") and word[1:2] != "-" and ("a" in word[1:] or long):
                self.allexport = word[0] == "-"

    def _assigned(self, name: str, line: int, raw: str, exported: bool) -> None:
        """NAME=value on its own line. Left alone: exported names (a container's env, an earlier
        export: assigning keeps them exported), names the servers do not read, and values built
        from the name itself (PATH-like `A=$A:x` extends a name the environment exports)."""
        if exported or not server_reads(name) or _refers(raw, name):
            self.pending.pop(name, None)
            return
        self.pending.setdefault(name, []).append(line)

    def launch(self, tokens: list[Token], env: dict[str, str], file: str) -> list[Problem]:
        """At a vLLM launch: each pending name it does not get (not set by the command itself,
        not read by the script as a variable) is a dropped setting, said at its assignment."""
        start = is_launch(tokens)
        if start is None:
            return []
        own = {m["name"] for t in tokens[:start] if (m := _ASSIGNED.match(t.text))}  # env A=b vllm ...
        line, problems = tokens[start].line, []
        for name in sorted(self.pending):
            if name in env or name in own or name in self.used:
                continue
            for assigned in self.pending.pop(name):
                problems.append(_unexported(file, name, assigned, line))
        return problems


def _references(words: list[str]) -> set[str]:
    """Names the words read as $NAME / ${NAME...} (an assignment's value, not its name)."""
    values = [w.split("=", 1)[1] if _ASSIGNED.match(w) else w for w in words]
    return {m["braced"] or m["plain"] for value in values for m in _REFERENCE.finditer(value)}


def _refers(raw: str, name: str) -> bool:
    return any((m["braced"] or m["plain"]) == name for m in _REFERENCE.finditer(raw))


def _unexported(file: str, name: str, assigned: int, launch: int) -> Problem:
    return Problem(f"{file}:{assigned} {name}",
                   f"{name} is set but not exported: vllm serve on line {launch} does not see it (bash "
                   "passes only exported variables to the programs it starts), so the server runs as if "
                   f"{name} were not set",
                   f"write `export {name}=...` on line {assigned} (or `export {name}` before line {launch}, "
                   f"or put {name}=... in front of the vllm serve command)", ERROR, dropped=True)


def with_env_lines(artifacts: list[Artifact], tokens: list[Token], env: Mapping[str, str],
                   set_at: Mapping[str, int]) -> list[Artifact]:
    """The command's kv_transfer_configs, each knowing the line that set every name of its
    environment ("env.NAME": its own `A=b` prefix, else the script's line), where the checks
    locate a problem with that name."""
    lines = {f"env.{name}": line for name, line in set_at.items() if name in env and line}
    for token in tokens:
        match = _ASSIGNED.match(token.text)
        if not match:
            break
        lines[f"env.{match['name']}"] = token.line
    for artifact in artifacts:
        if artifact.kind == "kv_transfer_config" and artifact.lines is not None:
            artifact.lines.update(lines)
    return artifacts
