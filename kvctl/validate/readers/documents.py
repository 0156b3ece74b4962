"""Reading files and parsing JSON / YAML with the line of every key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from kvctl import yamlio
from kvctl.errors import UsageError
from kvctl.validate.model import SourceLines, join


def read_text(path: Path) -> str:
    """The file's text, at most yamlio.MAX_BYTES: read in one bounded read, so a device or a pipe
    that never ends (/dev/zero, a FIFO) is refused like a big file instead of read forever."""
    limit = f"more than kvctl reads ({yamlio.MAX_BYTES // (1024 * 1024)} MB)"
    try:
        with path.open("rb") as handle:
            data = handle.read(yamlio.MAX_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}", "check the path and its permissions") from None
    if len(data) > yamlio.MAX_BYTES:
        raise UsageError(f"{path}: {limit}", "give the config itself")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start}): a binary file, or another encoding",
                         "give the config as text (UTF-8)") from None


def loads(text: str) -> Any:
    """json.loads, with nesting too deep for Python's recursion limit reported as a JSON error."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to be a config", text, 0) from None


def node_lines(node: yaml.Node | None, root: str, file: str) -> SourceLines:
    """Lines of every key under a composed YAML node, with the document root named `root`."""
    lines = SourceLines(file)
    if node is not None:
        lines[root] = node.start_mark.line + 1
        _collect_lines(node, root, lines)
    return lines


def _collect_lines(node: yaml.Node, path: str, lines: SourceLines) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = join(path, key_node.value)
            lines[child] = key_node.start_mark.line + 1  # last duplicate wins, as in safe_load
            _collect_lines(value_node, child, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            child = f"{path}[{index}]"
            lines[child] = item.start_mark.line + 1
            _collect_lines(item, child, lines)


def text_lines(text: str, root: str, file: str, base: int) -> SourceLines:
    """Lines of the keys of a JSON/YAML text embedded at file line `base` (a --kv-transfer-config
    argument, a ConfigMap entry); only the root is located when the text does not compose."""
    try:
        node = yamlio.compose(text)
    except (yaml.YAMLError, RecursionError):
        node = None
    return node_lines(node, "", file).shifted(root, base) if node is not None else \
        SourceLines(file, {root: base})


def parse_document(path: Path) -> tuple[Any, yaml.Node | None]:
    """Parse a YAML or JSON file into its data and its composed node (for line numbers).

    UsageError naming the file and line for malformed input.
    """
    docs = parse_documents(path)
    if len(docs) > 1:
        raise UsageError(f"{path}: holds {len(docs)} YAML documents where one config was expected",
                         "split the file, or validate the whole file (Kubernetes manifests are read "
                         "document by document)")
    return docs[0] if docs else (None, None)


def parse_documents(path: Path, text: str | None = None) -> list[tuple[Any, yaml.Node | None]]:
    """Every document of a JSON file or a (multi-document) YAML file, with its composed node."""
    text = read_text(path) if text is None else text
    if path.suffix.lower() == ".json":
        return [_parse_json(path, text)]
    try:
        datas, nodes = yamlio.safe_load_all(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise UsageError(f"{path}{line}: not valid YAML: {problem}",
                         f"fix the YAML syntax{' at line ' + line[1:] if line else ''}") from None
    return [(d, n) for d, n in zip(datas, nodes) if d is not None] or [(None, None)]


def _parse_json(path: Path, text: str) -> tuple[Any, yaml.Node | None]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}",
                         f"fix the JSON at line {exc.lineno}") from None
    except RecursionError:
        raise UsageError(f"{path}: nested too deeply to be a config", "flatten it") from None
    try:
        yamlio.check(text)
        return data, yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:  # JSON that YAML cannot compose (e.g. tab indents): no line numbers
        return data, None


def strip_json_comments(text: str) -> tuple[str, int]:
    """`text` without `//`, `#` and `/* */` comments outside strings (newlines kept, so lines stay
    the file's), and the line of the first comment (0: none). Annotated JSON is common in docs;
    json.load refuses it, but kvctl can still say what else is wrong with it."""
    out, first, line, i, in_string = [], 0, 1, 0, False
    while i < len(text):
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\" and i + 1 < len(text):
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
            out.append(c)
        elif c == "#" or text.startswith("//", i) or text.startswith("/*", i):
            first = first or line
            end = text.find("*/", i + 2) + 2 if text.startswith("/*", i) else text.find("\n", i)
            end = len(text) if end < (2 if text.startswith("/*", i) else 0) else end
            out.append("\n" * text.count("\n", i, end))
            line += text.count("\n", i, end)
            i = end
            continue
        else:
            out.append(c)
        line += c == "\n"
        i += 1
    return "".join(out), first
