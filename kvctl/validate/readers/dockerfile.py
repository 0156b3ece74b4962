"""Dockerfiles and Containerfiles: the command the image runs, with the environment it sets.

The final stage (after the last FROM) is the image: its ENV instructions are the server's
environment (`ENV K=V K2=V2` and the legacy `ENV K V`; ARG is build-time only), and the command is
ENTRYPOINT + CMD as Docker joins them (exec form `["vllm", "serve", ...]` is argv; shell form runs
under `/bin/sh -c`, and a shell-form ENTRYPOINT ignores CMD). An image FROM vLLM's own
(`vllm/vllm-openai`) without an ENTRYPOINT runs vLLM's (`vllm serve` since 0.7, the api_server module
before): its CMD is the server's arguments. RUN lines build the image: not read.
"""

from __future__ import annotations

import json
import re

from kvctl.validate.model import Artifact, Environment, Problem
from kvctl.validate.readers.serve_args import runs_vllm
from kvctl.validate.readers.shell import Command, configs_in_command, read_launch_text
from kvctl.validate.readers.shell_words import Token

_INSTRUCTION = re.compile(r"^\s*([A-Za-z]+)\s+(.*)$", re.S)
_ENV_PAIR = re.compile(r"""([A-Za-z_][A-Za-z0-9_]*)=("(?:\\.|[^"\\])*"|'[^']*'|\S*)""")
VLLM_ENTRYPOINT = ["vllm", "serve"]


def is_dockerfile(name: str, text: str) -> bool:
    """A Dockerfile by its name (Dockerfile, Containerfile, x.Dockerfile, Dockerfile.gpu) whose
    first instruction is FROM (or ARG before it)."""
    if not any(k in name.lower() for k in ("dockerfile", "containerfile")):
        return False
    first = next((line for _, line in _instructions(text)), "").split(None, 1)
    return bool(first) and first[0].upper() in ("FROM", "ARG")


def read_dockerfile(text: str, file: str) -> tuple[list[Artifact], list[Problem]]:
    stage = _final_stage(list(_instructions(text)))
    env, base, entry, cmd = Environment(), "", None, None
    for line, instruction in stage:
        match = _INSTRUCTION.match(instruction)
        if not match:
            continue
        keyword, rest = match.group(1).upper(), match.group(2).strip()
        if keyword == "FROM":
            base = rest.split()[0] if rest.split() else ""
        elif keyword == "ENV":
            env.update(_env(rest))
        elif keyword in ("CMD", "ENTRYPOINT"):
            # the last of each wins; ENTRYPOINT resets only a CMD inherited from the base image
            # (Docker's builder keeps one set earlier in the same stage), which kvctl does not see
            form = (line, _exec_form(rest), rest)
            entry, cmd = (form, cmd) if keyword == "ENTRYPOINT" else (entry, form)
    return _command(entry, cmd, base, env, file)


def _command(entry, cmd, base: str, env: Environment, file: str) -> tuple[list[Artifact], list[Problem]]:  # noqa: ANN001
    """The configs of the command the image runs."""
    if entry is None and cmd is None:
        return [], []
    shell_form = next((f for f in (entry, cmd) if f is not None and f[1] is None), None)
    if shell_form is not None and (shell_form is entry or entry is None):
        return read_launch_text(shell_form[2], file, shell_form[0], env=env)
    words: list[Token] = []
    if entry is not None:
        words += [Token(w, entry[0]) for w in entry[1]]
    elif runs_vllm(None, base):
        words += [Token(w, cmd[0]) for w in VLLM_ENTRYPOINT]
    if cmd is not None and cmd[1] is not None:
        words += [Token(w, cmd[0]) for w in cmd[1]]
    problems: list[Problem] = []
    return configs_in_command(Command(words, env), file, problems), problems


def _instructions(text: str):  # noqa: ANN202 - Iterator[tuple[int, str]]
    """(line, instruction) with `\\` continuations joined and comment lines dropped."""
    start, parts = 0, []
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not parts and (not stripped or stripped.startswith("#")):
            continue
        if parts and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        start = start if parts else number
        if stripped.endswith("\\"):
            parts.append(stripped[:-1])
            continue
        parts.append(stripped)
        yield start, " ".join(parts)
        parts = []
    if parts:
        yield start, " ".join(parts)


def _final_stage(instructions: list[tuple[int, str]]) -> list[tuple[int, str]]:
    starts = [i for i, (_, text) in enumerate(instructions) if text.split(None, 1)[0].upper() == "FROM"]
    return instructions[starts[-1]:] if starts else instructions


def _exec_form(rest: str) -> list[str] | None:
    """["a", "b"] as argv, or None for the shell form."""
    if not rest.startswith("["):
        return None
    try:
        words = json.loads(rest)
    except json.JSONDecodeError:
        return None  # Docker runs an invalid JSON array as a shell-form command too
    return [str(w) for w in words] if isinstance(words, list) else None


def _env(rest: str) -> dict[str, str]:
    if "=" not in rest.split(None, 1)[0]:  # legacy `ENV KEY value with spaces`
        key, _, value = rest.partition(" ")
        return {key: value.strip()}
    return {k: v[1:-1] if v[:1] in "\"'" and v[-1:] == v[:1] and len(v) > 1 else v
            for k, v in _ENV_PAIR.findall(rest)}
