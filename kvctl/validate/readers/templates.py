"""Jinja-style templates (run.sh.j2, config.json.jinja, ...): every branch read, none guessed.

A template's values are not known to kvctl (the tool that renders it fills them from its own
config), so rendering it once with made-up values would judge a file nobody runs. Instead each
`{% if %}` / `{% elif %}` / `{% else %}` choice is enumerated: one rendering per truth assignment
of the distinct conditions (the same condition takes the same branch everywhere, as it does when
rendered), and each rendering is read as the file its inner suffix says. `{{ expr }}` stays in the
text: kvctl treats `{{` as a placeholder it does not judge (model.placeholder). Tags are removed
in place, newlines kept, so every line number is the template's own. Other tags (`{% for %}`,
`{% set %}`, `{% include %}`) are removed and their bodies read once, as written. No Jinja engine
is imported: nothing in the template is ever executed.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import replace

from kvctl.validate.model import Artifact, Problem

_TAG = re.compile(r"\{%-?\s*(?P<word>\w+)(?P<expr>.*?)-?%\}|\{#.*?#\}", re.S)
MAX_CONDITIONS = 6  # 64 renderings; a template with more is read with all true, then all false


def is_templated(text: str) -> bool:
    return "{%" in text or "{#" in text


def conditions(text: str) -> list[str]:
    """The distinct `if` / `elif` conditions, in order of first use."""
    seen: dict[str, None] = {}
    for match in _TAG.finditer(text):
        if match["word"] in ("if", "elif"):
            seen.setdefault(match["expr"].strip(), None)
    return list(seen)


def render(text: str, truth: dict[str, bool]) -> str:
    """`text` with each conditional block kept or blanked by `truth`, tags removed in place."""
    out, last = [], 0
    stack: list[list[bool]] = []  # per open `if`: [this branch is on, some branch was taken]
    def on() -> bool:
        return all(frame[0] for frame in stack)
    for match in _TAG.finditer(text):
        out.append(_keep(text[last:match.start()], on()))
        out.append("\n" * match[0].count("\n"))
        last = match.end()
        word, expr = match["word"], (match["expr"] or "").strip()
        if word == "if":
            taken = truth.get(expr, False)
            stack.append([taken, taken])
        elif word == "elif" and stack:
            stack[-1][0] = not stack[-1][1] and truth.get(expr, False)
            stack[-1][1] = stack[-1][1] or stack[-1][0]
        elif word == "else" and stack:
            stack[-1][0] = not stack[-1][1]
        elif word == "endif" and stack:
            stack.pop()
    out.append(_keep(text[last:], on()))
    return "".join(out)


def _keep(chunk: str, on: bool) -> str:
    return chunk if on else "\n" * chunk.count("\n")


def renderings(text: str) -> Iterator[tuple[str, str]]:
    """(label, rendered text) for each branch choice: "" when the text has no conditions."""
    names = conditions(text)
    if not names:
        yield "", render(text, {})
        return
    choices = itertools.product((True, False), repeat=len(names)) if len(names) <= MAX_CONDITIONS \
        else [(True,) * len(names), (False,) * len(names)]
    for values in choices:
        truth = dict(zip(names, values))
        label = ", ".join(f"{name} {'true' if value else 'false'}" for name, value in truth.items())
        yield label, render(text, truth)


ReadText = Callable[[str], tuple[list[Artifact], list[Problem], str]]


def read_template(text: str, read_text: ReadText) -> tuple[str, list[Artifact], list[Problem]]:
    """Every branch read by `read_text`: (format, artifacts, problems), each distinct config and
    problem once, a config's origin naming the branch it comes from."""
    artifacts: list[Artifact] = []
    problems: list[Problem] = []
    seen: set[str] = set()
    fmt = ""
    for label, rendered in renderings(text):
        found, met, fmt = read_text(rendered)
        for artifact in found:
            key = repr((artifact.kind, artifact.data, sorted(artifact.lines.items())))
            if key not in seen:
                seen.add(key)
                origin = f"{artifact.origin}, template branch: {label}" if label else artifact.origin
                artifacts.append(replace(artifact, origin=origin))
        problems += [p for p in met if p not in problems]
    return fmt, artifacts, problems


# Go templates (Helm chart templates/*.yaml): `{{ ... }}` actions, the chart fills them in.
GO_PLACEHOLDER = "${chart}"  # a value filled in later: kvctl does not judge it (model.placeholder)


def go_template_placeholders(text: str) -> str:
    """A Helm template YAML read as YAML: a line that is only actions (`{{- if .Values.x }}`,
    `{{ toYaml .Values.env | nindent 8 }}`) is blanked, every other action becomes a placeholder
    value; newlines are kept, so every line number is the template's own. One pass with str.find:
    linear, whatever the text (an unclosed `{{` ends the scan)."""
    out, i = [], 0
    while (start := text.find("{{", i)) >= 0:
        end = text.find("}}", start + 2)
        if end < 0:
            break
        out += [text[i:start], "\x00" + "\n" * text.count("\n", start, end)]  # \x00: an action
        i = end + 2
    out.append(text[i:])
    lines = "".join(out).split("\n")
    return "\n".join("" if line.strip() and not line.replace("\x00", "").strip()
                     else line.replace("\x00", GO_PLACEHOLDER) for line in lines)
