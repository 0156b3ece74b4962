"""kvctl's messages as the Python API's caller reads them: the same text with each CLI flag named by
its keyword (`pass --master HOST:PORT` -> `pass master="HOST:PORT"`).

Every message (errors, hints, receipt lines) is written once, in the CLI's words; `FLAGS` is the one
table of the flags of the commands the API stands beside (kvctl reset, probe, weights update, salt
check) and
their keywords, and `for_python` renders a message with it. A suggested command (`kvctl runs --ray
ADDRESS`) keeps its flags: it is run in a shell either way. tests/unit/test_api_words.py checks the
table against the CLI and renders every message of the modules the API runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

from kvctl.errors import KvctlError

T = TypeVar("T")

# flag -> (keyword, kind). Kinds: "true"/"false" a switch (keyword=True/False); "str", "num" one
# value; "list" several (urls=[...]); "prompts" the CLI's FILE of prompts, the API's list of them
FLAGS: dict[str, tuple[str, str]] = {
    # targets (kvctl.targets)
    "--run": ("run", "str"), "--url": ("urls", "list"), "--inventory": ("inventory", "str"),
    "--master": ("master", "str"), "--master-rpc": ("master_rpc", "str"), "--ray": ("ray", "str"),
    "--state-dir": ("state_dir", "str"),
    # kvctl reset (and the reset inside kvctl weights update)
    "--connector": ("connector", "true"), "--no-mm": ("mm", "false"), "--no-encoder": ("encoder", "false"),
    "--verify": ("verify", "true"), "--pause": ("pause", "true"), "--no-pause": ("pause", "false"),
    "--pause-timeout": ("pause_timeout", "num"), "--pause-mode": ("pause_mode", "str"),
    "--evidence": ("evidence", "str"), "--whole-master": ("whole_master", "true"),
    "--clear-timeout": ("clear_timeout", "num"), "--probe-prompts": ("probe_prompts", "prompts"),
    "--allow-mixed-weights": ("allow_mixed_weights", "true"), "--dry-run": ("dry_run", "true"),
    "--timeout": ("timeout", "num"), "--retries": ("retries", "num"), "--concurrency": ("concurrency", "num"),
    # kvctl probe
    "--prompts": ("prompts", "prompts"), "--max-tokens": ("max_tokens", "num"), "--tolerance": ("tolerance", "num"),
    # kvctl weights update
    "--from": ("from_path", "str"), "--version": ("version", "str"), "--remote-path": ("remote_path", "true"),
    "--resume-failed": ("resume_failed", "true"), "--reload-timeout": ("reload_timeout", "num"),
    # kvctl salt check
    "--salt": ("salts", "list"), "--weight-version": ("versions", "list"), "--salt-format": ("salt_format", "str"),
    "--settle": ("settle", "num"),
}

# --flag, then its value (--flag=VALUE) or its metavar (--flag HOST:PORT) when one follows
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?:=([^\s),;]+)|( [A-Z](?:[A-Z0-9_:]*[A-Z0-9])?(?![\w-]))( \(repeatable\))?)?")
# a suggested command: its flags stay flags (it runs in a shell)
_COMMAND = re.compile(r"\bkvctl (?:reset|probe|salt|status|stop|serve|runs|rm|weights|config|compat|doctor|logs|version)\b")
# where a clause ends: a command suggested before one does not reach past it
_CLAUSE_END = re.compile(r"[;()]|, |: ")
# the message fields of receipts and reports (never names, URLs, prompts or paths)
TEXT_FIELDS = frozenset({"error", "hint", "summary", "reason", "tolerance_reason", "notes", "pause_notes", "remaining",
                         "state", "weight_note", "checksum_note", "detail", "local_only", "master_clear_reason"})


# a message may name the keyword beside its flag ("--whole-master (whole_master=True)", "master= in
# Python"): the API's rendering names it once
_PY_REMARKS = re.compile(r" ?\((?:[a-z_]+=[^\s,;:)]*(?:, | and | or ))*[a-z_]+=[^\s,;:)]* in Python\)")
_PY_REMARK = re.compile(r"([;,] )?\b[a-z_]+=[^\s,;:)]* in Python([:,;] )?")
_TWICE = re.compile(r"\b(([a-z_]+)=[^\s()]*) \(\2=[^()]*\)")


def for_python(text: str) -> str:
    """`text` with each flag of FLAGS named as the API's keyword, outside suggested commands."""
    if "--" not in text and " in Python" not in text:
        return text
    text = _PY_REMARKS.sub("", text)
    text = _PY_REMARK.sub(lambda m: m.group(1) if m.group(1) and m.group(2) else "", text)
    return _TWICE.sub(r"\1", _FLAG.sub(lambda m: _render(m, text), text))


def _render(m: re.Match[str], text: str) -> str:
    flag, value, meta, repeatable = m.group(1), m.group(2), m.group(3), m.group(4)
    if flag not in FLAGS or _in_command(text, m.start()):
        return m.group(0)
    keyword, kind = FLAGS[flag]
    if kind in ("true", "false"):  # a switch takes no value: what followed it is the sentence's
        rest = (f"={value}" if value else "") + (meta or "") + (repeatable or "")
        return f"{keyword}={kind == 'true'}" + rest
    if value is not None:
        return f"{keyword}={value}" if kind == "num" else f'{keyword}=["{value}"]' if kind == "list" \
            else f'{keyword}="{value}"'
    if meta is not None:
        meta = meta.strip()
        return {"num": f"{keyword}={meta}", "list": f'{keyword}=["{meta}", ...]',
                "prompts": f'{keyword}=["prompt", ...]'}.get(kind, f'{keyword}="{meta}"')
    return keyword


def _in_command(text: str, at: int) -> bool:
    """Whether the flag at `at` belongs to a command suggested earlier in its clause."""
    start = 0
    for end in _CLAUSE_END.finditer(text, 0, at):
        start = end.end()
    return _COMMAND.search(text, start, at) is not None


def error_for_python(exc: KvctlError) -> KvctlError:
    """The error itself, its message and hint in the API's words (its class and exit code kept)."""
    exc.message = for_python(exc.message)
    exc.hint = for_python(exc.hint) if exc.hint else exc.hint
    exc.args = (exc.message, *exc.args[1:])
    return exc


@contextmanager
def python_errors() -> Iterator[None]:
    """Errors kvctl raises inside, re-raised in the API's words."""
    try:
        yield
    except KvctlError as exc:
        error_for_python(exc)
        raise


def receipt_for_python(receipt: T) -> T:
    """A receipt or report with each of its message fields (TEXT_FIELDS) in the API's words, in place."""
    _walk(receipt, set())
    return receipt


_RECEIPT_MODULES = ("kvctl.reset.", "kvctl.weights.")


def _walk(node: Any, seen: set[int]) -> None:
    if id(node) in seen:
        return
    seen.add(id(node))
    if is_dataclass(node) and not isinstance(node, type):
        if not type(node).__module__.startswith(_RECEIPT_MODULES) or type(node).__dataclass_params__.frozen:
            return  # not a receipt's own part (a target, a facts table): nothing of it is a message
        for f in fields(node):
            value = getattr(node, f.name)
            if f.name in TEXT_FIELDS:
                setattr(node, f.name, _text(value))
            else:
                _walk(value, seen)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in TEXT_FIELDS:
                node[key] = _text(value)
            else:
                _walk(value, seen)
    elif isinstance(node, (list, tuple)):
        for item in node:
            _walk(item, seen)


def _text(value: Any) -> Any:
    if isinstance(value, str):
        return for_python(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [for_python(v) for v in value]
    return value
