"""Launch lines: shell scripts, `vllm serve ...` lines, kvctl's vllm-args.txt, verl Hydra overrides.

Finds every `--kv-transfer-config` (also `=`-joined, underscored and dotted forms such as
`--kv-transfer-config.kv_connector X`) and every Hydra override of a `kv_transfer_config` path, in
every command of the text, with the line each starts on. Scripts are read, never run: variables
assigned in the script are expanded where a config uses them, heredoc bodies (a mooncake.json
written with `cat > f <<EOF`) are read as documents, and what kvctl cannot evaluate is said.
"""

from __future__ import annotations

import io
import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from kvctl import yamlio
from kvctl.errors import UsageError
from kvctl.validate.model import ERROR, WARNING, Artifact, Problem, SourceLines
from kvctl.validate.readers.documents import loads, text_lines

_PUNCTUATION = ";&|()<>\n"  # shlex groups runs of these into one token, e.g. "&\n"
_FLAG = re.compile(r"^--kv[-_]transfer[-_]config(?P<dotted>(?:\.[\w-]+)+)?(?:=(?P<value>.*))?$", re.S)
# verl / Hydra: [+|++|~]a.b.kv_transfer_config[.key]=value
_HYDRA = re.compile(r"^(?:\+\+|\+|~)?(?P<path>(?:[\w-]+\.)*kv_transfer_config)(?P<dotted>(?:\.[\w-]+)+)?="
                    r"(?P<value>.*)$", re.S)
_ASSIGN = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$", re.S)
_DECLARE = {"export", "local", "declare", "readonly", "typeset"}
_HYDRA_FLOW_KEY = re.compile(r"([{,]\s*)([\w.-]+):(?=[^\s/])")  # {a:1,b:x} -> {a: 1,b: x}
_VARIABLE = re.compile(r"\$(?:\{(?P<braced>\w+)\}|(?P<plain>[A-Za-z_]\w*))")
_JSON_STRING = re.compile(r'"(?:\\.|[^"\\])*"')
_HEREDOC = re.compile(r"<<(?P<dash>-?)\s*(?P<quote>['\"]?)(?P<word>\w+)(?P=quote)")
_MARKERS = ("--kv-transfer-config", "--kv_transfer_config")
_MAX_DEPTH = 3  # strings holding launch lines holding strings ...
# Launch scripts are kilobytes; POSIX word splitting in Python reads ~1 MB a second.
MAX_SCRIPT_BYTES = 1024 * 1024

# Reads a heredoc body that is a document (JSON / YAML); given by the structured reader, which
# this module does not import.
DocumentReader = Callable[[str, str, int], tuple[list[Artifact], list[Problem]]]


@dataclass(frozen=True)
class Token:
    text: str
    line: int  # file line where the token starts


@dataclass
class Command:
    tokens: list[Token]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def program(self) -> str:
        """A short name for the origin of a config: 'vllm serve', 'python -m vllm...', ..."""
        words = [t.text for t in self.tokens if not _ASSIGN.match(t.text)][:3]
        if words[:2] == ["vllm", "serve"] or (words and words[0].endswith("/vllm")):
            return "vllm serve"
        if "-m" in words:
            return f"python -m {words[words.index('-m') + 1]}" if words[-1] != "-m" else "python -m"
        return words[0] if words else "arguments"


def tokenize(text: str, base_line: int = 1) -> list[list[Token]]:
    """Split `text` into commands of tokens (POSIX quoting; `\\` line continuations joined;
    `#` comments dropped). ValueError for unbalanced quotes."""
    # A continuation is 2 characters replaced by 2 spaces: offsets still match `text`.
    joined = text.replace("\\\r\n", "   ").replace("\\\n", "  ")
    lexer = shlex.shlex(io.StringIO(joined), posix=True, punctuation_chars=_PUNCTUATION)
    lexer.whitespace, lexer.whitespace_split, lexer.commenters = " \t\r", True, ""
    commands: list[list[Token]] = [[]]
    in_comment = array = False
    lines = _NewlineCounter(text)
    while True:
        try:
            word = lexer.get_token()
        except ValueError as exc:  # unbalanced quotes: say where the quoted text starts
            start = base_line + text.count("\n", 0, lexer.instream.tell()) - lexer.token.count("\n")
            raise ValueError(f"line {start}: {str(exc).lower()}") from None
        if word is None or word == lexer.eof:
            break
        if in_comment or word.startswith("#"):
            in_comment = "\n" not in word
            if in_comment:
                continue
        if not word.strip(_PUNCTUATION):  # ; & && | || ( ) newline: the command ends
            if "(" in word and commands[-1] and commands[-1][-1].text.endswith("="):
                array = True  # NAME=( ... ): an array's words may span lines
                continue
            if array and ")" not in word:
                continue
            array = False
            commands.append([])
            continue
        end = max(lexer.instream.tell() - 1, 0)
        lines.advance(end)
        commands[-1].append(Token(word, base_line + lines.newlines - word.count("\n")))
    return [c for c in commands if c]


@dataclass
class _NewlineCounter:
    """Newlines before an offset, counted once as offsets only grow (a count from 0 for every
    token made a 1 MB script take 40 s)."""

    text: str
    offset: int = 0
    newlines: int = 0

    def advance(self, offset: int) -> None:
        if offset > self.offset:
            self.newlines += self.text.count("\n", self.offset, offset)
            self.offset = offset


@dataclass
class _Shell:
    """What a script has set so far, as it would be when each command runs."""

    variables: dict[str, str] = field(default_factory=dict)
    exported: dict[str, str] = field(default_factory=dict)

    def command(self, tokens: list[Token]) -> Command | None:
        """The command with its environment, or None for a pure assignment (remembered)."""
        if tokens and tokens[0].text in _DECLARE:
            exported = tokens[0].text == "export"
            for token in tokens[1:]:
                match = _ASSIGN.match(token.text)
                if match:
                    self.remember(match["name"], self.expand(match["value"]), exported)
            return None
        env = dict(self.exported)
        index = 0
        while index < len(tokens) and _ASSIGN.match(tokens[index].text) and \
                not _HYDRA.match(tokens[index].text):
            match = _ASSIGN.match(tokens[index].text)
            env[match["name"]] = self.expand(match["value"])
            index += 1
        if index == len(tokens):  # NAME=value on its own: a shell variable from now on
            for name, value in env.items():
                if name not in self.exported:
                    self.remember(name, value)
            return None
        return Command(tokens[index:], env)

    def remember(self, name: str, value: str, exported: bool = False) -> None:
        """Record NAME=value; a value only running the script gives ($(...), $((...)), `...`,
        cut by the tokenizer to a trailing '$') is forgotten rather than guessed."""
        if value.endswith("$") or "$(" in value or "`" in value:
            self.variables.pop(name, None)
            self.exported.pop(name, None)
            return
        self.variables[name] = value
        if exported:
            self.exported[name] = value

    def expand(self, text: str) -> str:
        """$NAME and ${NAME} replaced where the script set NAME; others left as written."""
        def value(match: re.Match[str]) -> str:
            name = match["braced"] or match["plain"]
            return self.variables.get(name, self.exported.get(name, match[0]))

        return _VARIABLE.sub(value, text)


def read_launch_text(text: str, file: str, base_line: int = 1,
                     documents: DocumentReader | None = None) -> tuple[list[Artifact], list[Problem]]:
    """kv_transfer_config artifacts (one per command that sets one), the configs in heredoc
    bodies, and problems met while reading (a value that is not JSON, what kvctl cannot evaluate)."""
    if len(text) > MAX_SCRIPT_BYTES:
        raise UsageError(f"{file}: {len(text)} bytes of shell text is more than kvctl reads as a "
                         f"launch script ({MAX_SCRIPT_BYTES // 1024} KB)",
                         "give the script that starts vLLM, or the kv_transfer_config itself")
    return _Reader(file, documents).read(text, base_line, _Shell(), depth=0)


@dataclass
class _Reader:
    file: str
    documents: DocumentReader | None
    artifacts: list[Artifact] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def read(self, text: str, base_line: int, shell: _Shell, depth: int
             ) -> tuple[list[Artifact], list[Problem]]:
        text = self._heredocs(text, base_line)
        try:
            commands = tokenize(text, base_line)
        except ValueError as exc:
            raise UsageError(f"{self.file}: {exc}: cannot split it into shell words",
                             "close the quote (kvctl reads launch lines with POSIX shell quoting)") from None
        for tokens in commands:
            self._nested(tokens, shell, depth)
            command = shell.command(tokens)
            if command is not None:
                self.artifacts += configs_in_command(command, self.file, self.problems, shell.expand)
        return self.artifacts, self.problems

    def _nested(self, tokens: list[Token], shell: _Shell, depth: int) -> None:
        """Words that hold a whole launch line (`ARGS="... --kv-transfer-config '{...}'"`, an
        `sh -c` script): read them as launch text of their own."""
        for token in tokens:
            body = _ASSIGN.match(token.text)
            inner = body["value"] if body else token.text
            if _FLAG.match(token.text) or not any(m in inner for m in _MARKERS):
                continue
            before = len(self.artifacts)
            if depth < _MAX_DEPTH:
                try:
                    self.read(inner, token.line, shell, depth + 1)
                except UsageError:
                    pass
            if len(self.artifacts) == before and not any(p.where.startswith(f"{self.file}:{token.line}")
                                                         for p in self.problems):
                self.problems.append(Problem(
                    f"{self.file}:{token.line}", "--kv-transfer-config appears inside a string kvctl "
                    "does not evaluate (a shell function or eval builds the command)",
                    "validate the kv_transfer_config itself (a JSON file), or the command as run",
                    WARNING))

    def _heredocs(self, text: str, base_line: int) -> str:
        """Cut heredoc bodies out of `text` (their lines left empty, so line numbers hold) and
        read each as a document or as launch text."""
        lines = text.split("\n")
        index = 0
        while index < len(lines):
            match = _HEREDOC.search(lines[index])
            index += 1
            if not match or "<<<" in lines[index - 1]:
                continue
            start = index
            while index < len(lines) and (lines[index].lstrip("\t") if match["dash"] else lines[index]) \
                    != match["word"]:
                index += 1
            body = "\n".join(lines[start:index])
            lines[start:index] = [""] * (index - start)
            self._read_body(body, base_line + start)
        return "\n".join(lines)

    def _read_body(self, body: str, first_line: int) -> None:
        if self.documents is not None:
            try:
                artifacts, problems = self.documents(body, self.file, first_line)
            except UsageError:
                artifacts, problems = [], []
            if artifacts or problems:
                self.artifacts += artifacts
                self.problems += problems
                return
        if any(m in body for m in _MARKERS):
            self.read(body, first_line, _Shell(), depth=_MAX_DEPTH)


@dataclass
class _Pending:
    """One command's kv_transfer_config, assembled from a whole value and/or dotted keys."""

    data: dict[str, Any] = field(default_factory=dict)
    lines: SourceLines | None = None
    line: int = 0
    hydra_path: str = ""


def configs_in_command(command: Command, file: str, problems: list[Problem],
                       expand: Callable[[str], str] = lambda text: text) -> list[Artifact]:
    pending = _Pending()
    tokens = command.tokens
    for index, token in enumerate(tokens):
        flag, hydra = _FLAG.match(token.text), _HYDRA.match(token.text)
        if flag:
            value, line = flag["value"], token.line
            if value is None:
                if index + 1 >= len(tokens):
                    problems.append(Problem(f"{file}:{token.line}", f"{token.text} has no value: "
                                            "vLLM's argument parser refuses the command",
                                            "give it a JSON object", ERROR))
                    continue
                value, line = tokens[index + 1].text, tokens[index + 1].line
            _take(pending, flag["dotted"], value, line, file, problems, True, expand)
        elif hydra:
            pending.hydra_path = hydra["path"]
            _take(pending, hydra["dotted"], hydra["value"], token.line, file, problems, False, expand)
    if pending.lines is None:
        return []
    root = "kv_transfer_config"
    return [Artifact("kv_transfer_config", pending.data, root, pending.lines,
                     origin=f"{'Hydra override' if pending.hydra_path else command.program} "
                            f"(line {pending.line})", env=command.env)]


def _take(pending: _Pending, dotted: str | None, raw: str, line: int, file: str,
          problems: list[Problem], json_only: bool, expand: Callable[[str], str]) -> None:
    value = expand(raw)
    if pending.lines is None:
        pending.lines, pending.line = SourceLines(file, {"kv_transfer_config": line}), line
    if dotted:  # --kv-transfer-config.kv_role kv_both: one key (vLLM parses the value as JSON or text)
        keys = dotted.strip(".").split(".")
        node = pending.data
        for key in keys[:-1]:
            node = node.setdefault(key, {}) if isinstance(node.get(key, {}), dict) else {}
        node[keys[-1]] = _scalar(value)
        pending.lines["kv_transfer_config." + ".".join(keys)] = line
        return
    text = value if json_only else _HYDRA_FLOW_KEY.sub(r"\1\2: ", value)
    parsed = _parse_value(text, json_only)
    if isinstance(parsed, str) and '\\"' in text:
        # `"{\"a\": 1}"` held in a variable for a later eval: read it as the eval would.
        text = text.replace('\\"', '"')
        parsed = _parse_value(text, json_only)
    if isinstance(parsed, str):
        unexpanded = _VARIABLE.search(value)
        hint = (f" (it uses {unexpanded[0]}, which the script does not set)" if unexpanded else
                " (it is built from shell variables)" if value != raw else "")
        problems.append(Problem(f"{file}:{line} kv_transfer_config",
                                f"the kv_transfer_config value is not a JSON object{hint}: {parsed}",
                                "write it as '{\"kv_connector\": ..., \"kv_role\": ...}' (vLLM parses "
                                "it with json.loads)", WARNING if hint else ERROR))
        return
    pending.data.update(parsed)
    pending.lines.update(text_lines(text, "kv_transfer_config", file, line))


def _parse_value(value: str, json_only: bool) -> dict[str, Any] | str:
    """A dict, or the reason it is not one. vLLM reads the flag with json.loads; Hydra values are
    YAML-like (`{a: 1}`, `{a:1}`). Variables the script does not set stay in, as strings."""
    try:
        parsed = loads(value)
    except json.JSONDecodeError as exc:
        reason: str = exc.msg
        try:  # "enable_async_transfers": $FLAG -> "$FLAG": a placeholder the checks skip
            parsed = loads(_quote_variables(value))
        except json.JSONDecodeError:
            if json_only:
                return reason
            try:
                parsed = yamlio.safe_load(value)
            except yaml.YAMLError as yexc:
                return str(getattr(yexc, "problem", yexc))
    if not isinstance(parsed, dict):
        return f"it is a {type(parsed).__name__}"
    return parsed


def _quote_variables(text: str) -> str:
    """Quote $VAR references that stand outside JSON strings."""
    out, last = [], 0
    for string in _JSON_STRING.finditer(text):
        out.append(_VARIABLE.sub(lambda m: json.dumps(m[0]), text[last:string.start()]))
        out.append(string[0])
        last = string.end()
    out.append(_VARIABLE.sub(lambda m: json.dumps(m[0]), text[last:]))
    return "".join(out)


def _scalar(value: str) -> Any:
    try:
        return loads(value)
    except json.JSONDecodeError:
        return value
