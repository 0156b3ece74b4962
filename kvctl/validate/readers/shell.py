"""Launch lines: shell scripts, `vllm serve ...` lines, kvctl's vllm-args.txt, verl Hydra overrides.

Finds every `--kv-transfer-config` (also `=`-joined, underscored and dotted forms such as
`--kv-transfer-config.kv_connector X`) and every Hydra override of a `kv_transfer_config` path, in
every command of the text, with the line each starts on. Scripts are read, never run: variables
assigned in the script are expanded where a config uses them, heredoc bodies (a mooncake.json
written with `cat > f <<EOF`) are read as documents, and what kvctl cannot evaluate is said.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any


from kvctl.errors import UsageError
from kvctl.facts.bundle_layout import VERL_PATH
from kvctl.validate.model import ERROR, WARNING, Artifact, Problem, SourceLines
from kvctl.validate.readers.documents import text_lines
from kvctl.validate.readers.flag_value import VARIABLE as _VARIABLE
from kvctl.validate.readers import carrier
from kvctl.validate.readers.flag_value import parse_value, scalar
from kvctl.validate.readers.merge import merge_held
from kvctl.validate.readers.offload_args import FLAG as OFFLOAD_FLAG, MARKERS as OFFLOAD_MARKERS, in_words, located
from kvctl.validate.readers.serve_args import launch_options
from kvctl.validate.readers.shell_env import Exports, exporting, with_env_lines
from kvctl.validate.readers.shell_expand import substitution
from kvctl.validate.readers.shell_state import ASSIGN as _ASSIGN, HYDRA as _HYDRA, Command, Shell as _Shell, assignments
from kvctl.validate.readers.shell_words import MAX_SKIPPED, Skipped, Token, split_commands
from kvctl.validate.readers.verl import verl_in_words

_FLAG = re.compile(r"^--kv[-_]transfer[-_]config(?P<dotted>(?:\.[\w-]+)+)?(?:=(?P<value>.*))?$", re.S)
_HYDRA_FLOW_KEY = re.compile(r"([{,]\s*)([\w.-]+):(?=[^\s/])")  # {a:1,b:x} -> {a: 1,b: x}
_WHOLE_VARIABLE = re.compile(r"^\$(?:\{(?P<braced>\w+)\}|(?P<plain>[A-Za-z_]\w*))$")
_MOONCAKE_KEYS = ("master_server_address", "metadata_server")  # a mooncake.json has one
_HEREDOC = re.compile(r"<<(?P<dash>-?)\s*(?P<quote>['\"]?)(?P<word>\w+)(?P=quote)")
_MARKERS = ("--kv-transfer-config", "--kv_transfer_config") + OFFLOAD_MARKERS
_MAX_DEPTH = 3  # strings holding launch lines holding strings ...
# Launch scripts are kilobytes; word splitting in Python reads ~1 MB a second.
MAX_SCRIPT_BYTES = 1024 * 1024

# Reads a heredoc body that is a document (JSON / YAML); given by the structured reader, which
# this module does not import.
DocumentReader = Callable[[str, str, int], tuple[list[Artifact], list[Problem]]]


def tokenize(text: str, base_line: int = 1) -> list[list[Token]]:
    """Split `text` into commands of words (bash quoting and nesting, `\\` continuations joined,
    `#` comments dropped); commands kvctl cannot split are left out (split_commands says which)."""
    return split_commands(text, base_line).commands


def is_config_flag(word: str) -> bool:
    """--kv-transfer-config in any of its spellings (=value, dotted, underscored)."""
    return bool(_FLAG.match(word))


def read_launch_text(text: str, file: str, base_line: int = 1, documents: DocumentReader | None = None,
                     env: Mapping[str, str] | None = None) -> tuple[list[Artifact], list[Problem]]:
    """kv_transfer_config artifacts (one per command that sets one, and one per variable holding
    one), the configs in heredoc bodies, and problems met while reading (a value that is not
    JSON, a command kvctl cannot split, what kvctl cannot evaluate). `env`: the environment the
    text runs with (a container's env)."""
    if len(text) > MAX_SCRIPT_BYTES:
        raise UsageError(f"{file}: {len(text)} bytes of shell text is more than kvctl reads as a "
                         f"launch script ({MAX_SCRIPT_BYTES // 1024} KB)",
                         "give the script that starts vLLM, or the kv_transfer_config itself")
    shell = _Shell(dict(env or {}), dict(env or {}))
    reader = _Reader(file, documents)
    reader.read(text, base_line, shell, depth=0)
    artifacts = merge_held(reader.artifacts, reader.held)
    if not artifacts and not reader.problems:
        reader.problems += _commented_out(text, file, base_line)
    return artifacts, reader.problems


def _commented_out(text: str, file: str, base_line: int) -> list[Problem]:
    """A script whose only kv_transfer_config is in a comment (a usage example): said, since vLLM
    then starts with no KV connector at all."""
    for number, line in enumerate(text.split("\n"), start=base_line):
        comment = line.lstrip()
        if comment.startswith("#") and ("kv_transfer_config" in comment or "kv-transfer-config" in comment):
            return [Problem(f"{file}:{number}", "the only kv_transfer_config here is in a comment: the "
                            "script starts vLLM with no KV connector (nothing is offloaded or transferred)",
                            "uncomment it (or pass it as the script's arguments) if the servers should use "
                            "a connector", WARNING)]
    return []


@dataclass
class _Reader:
    file: str
    documents: DocumentReader | None
    artifacts: list[Artifact] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    held: list[Artifact] = field(default_factory=list)  # configs in variables (merge_held)
    exports: Exports = field(default_factory=Exports)  # assignments bash keeps from vLLM (shell_env.py)

    def read(self, text: str, base_line: int, shell: _Shell, depth: int) -> None:
        bodies: list[tuple[str, int, bool]] = []  # read when the script reaches them (expanded then)
        text = self._heredocs(text, base_line, bodies)
        split = split_commands(text, base_line)
        self.problems += [self._skipped(s) for s in split.skipped]
        for tokens in split.commands:
            while bodies and tokens and bodies[0][1] <= tokens[0].line:
                self._body(bodies.pop(0), shell)
            self._nested(tokens, shell, depth)
            self._variables(tokens, shell)
            self.exports.seen(tokens, assignments(tokens), shell)
            command = shell.command(tokens)
            if command is not None:
                self.problems += self.exports.launch(tokens, command.env, self.file)
                self.artifacts += with_env_lines(configs_in_command(
                    command, self.file, self.problems, shell.expand, shell.line_of, shell.why_unknown),
                    tokens, command.env, shell.lines)
        for body in bodies:
            self._body(body, shell)

    def _body(self, body: tuple[str, int, bool], shell: _Shell) -> None:
        """A heredoc body, with the variables bash expands in it where its word is unquoted
        (`<<JSON`: "${SEGMENT_SIZE}" is the value the script set, or its default)."""
        text, first_line, expands = body
        self._read_body(shell.expand(text) if expands else text, first_line)

    def _skipped(self, skipped: Skipped) -> Problem:
        """A command kvctl could not split: said at its line, the rest of the file still read. An
        error when it holds a --kv-transfer-config (that config cannot be checked, and if the
        quote is really unclosed bash stops the script there: 'unexpected EOF')."""
        lines = f"line {skipped.line}" if skipped.first == skipped.last else \
            f"lines {skipped.first}-{skipped.last}"
        then = (f"after {MAX_SKIPPED} such commands kvctl stopped reading" if skipped.gave_up else
                f"kvctl skipped {lines} and read the rest of the file")
        holds_config = any(m in skipped.text for m in _MARKERS)
        if holds_config:
            then += ", so the --kv-transfer-config there is not checked"
        return Problem(f"{self.file}:{skipped.line}",
                       f"kvctl cannot split {lines} into shell words: {skipped.what} opened on line "
                       f"{skipped.line} is never closed as kvctl reads it (bash would stop the script "
                       f"there with 'unexpected EOF'); {then}",
                       "close or escape the quote (inside '...' write '\\'' for a quote); if bash runs "
                       "the script as it is, check that command's kv_transfer_config on its own",
                       ERROR if holds_config else WARNING)

    def _variables(self, tokens: list[Token], shell: _Shell) -> None:
        """A variable whose value is a kv_transfer_config or a mooncake.json is a config even when
        no command of this file uses it (another script, a container's env may)."""
        for token, name, raw in assignments(tokens):
            value = shell.expand(raw)
            stripped = value.lstrip()
            if not stripped.startswith("{"):
                continue
            line = token.line + value[:len(value) - len(stripped)].count("\n")
            artifact = config_in_text(stripped, self.file, line)
            if artifact is not None:  # exported, the name itself is in the servers' environment
                env = {**shell.exported, **({name: value} if exporting(tokens) else {})}
                self.held.append(replace(artifact, origin=f"variable {name} (line {token.line})", env=env))

    def _nested(self, tokens: list[Token], shell: _Shell, depth: int) -> None:
        """Words that hold a whole launch line (`ARGS="... --kv-transfer-config '{...}'"`, an
        `sh -c` script): read them as launch text of their own."""
        for token in tokens:
            body = _ASSIGN.match(token.text)
            inner = body["value"] if body else token.text
            if _FLAG.match(token.text) or OFFLOAD_FLAG.match(token.text) or not any(m in inner for m in _MARKERS):
                continue
            before = len(self.artifacts)
            if depth < _MAX_DEPTH:
                self.read(inner, token.line, shell, depth + 1)
            if body:  # say which variable held the line (a function or eval runs it later)
                self.artifacts[before:] = [replace(a, origin=f"{a.origin} in variable {body['name']}")
                                           for a in self.artifacts[before:]]
            if len(self.artifacts) == before and not any(p.where.startswith(f"{self.file}:{token.line}")
                                                         for p in self.problems):
                self.problems.append(Problem(
                    f"{self.file}:{token.line}", "--kv-transfer-config appears inside a string kvctl "
                    "does not evaluate (a shell function or eval builds the command)",
                    "validate the kv_transfer_config itself (a JSON file), or the command as run",
                    WARNING))

    def _heredocs(self, text: str, base_line: int, bodies: list[tuple[str, int, bool]]) -> str:
        """Cut heredoc bodies out of `text` (their lines left empty, so line numbers hold) into
        `bodies` (text, first line, expanded by bash), each read as a document or launch text."""
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
            bodies.append((body, base_line + start, not match["quote"]))
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


def config_in_text(text: str, file: str, line: int) -> Artifact | None:
    """The kv_transfer_config (a JSON / YAML-flow mapping with kv_connector or kv_role) or the
    mooncake.json (JSON with a master or metadata address) that `text`, at file line `line`, is."""
    parsed = parse_value(text, json_only=False)
    if isinstance(parsed, str) and '\\"' in text:  # '{\"a\": 1}' kept for a later eval
        text = text.replace('\\"', '"')
        parsed = parse_value(text, json_only=False)
    if isinstance(parsed, str):
        return None
    if "kv_connector" in parsed or "kv_role" in parsed:
        kind = "kv_transfer_config"
    elif any(k in parsed for k in _MOONCAKE_KEYS) and isinstance(parse_value(text, True), dict):
        kind = "mooncake"
    else:
        return None
    return Artifact(kind, parsed, kind, text_lines(text, kind, file, line))


@dataclass
class _Pending:
    """One command's kv_transfer_config, assembled from a whole value and/or dotted keys."""

    data: dict[str, Any] = field(default_factory=dict)
    lines: SourceLines | None = None
    line: int = 0
    hydra_path: str = ""
    via: str = ""  # the variable the value came from: "KV_CONFIG (line 3)"
    whole: bool = False  # a whole value was given (not only keys one by one)
    whole_line: int = 0  # where the last whole value was
    whole_keys: list[str] = field(default_factory=list)  # the keys it set
    adds: bool = False  # a Hydra override added a key the base config lacks (+key=...)
    unread: str = ""  # what kvctl could not read of a whole value ("$P_CONFIG, set by ...")


def configs_in_command(command: Command, file: str, problems: list[Problem],
                       expand: Callable[[str], str] = lambda text: text,
                       line_of: Callable[[str], int | None] = lambda name: None,
                       unknown: Callable[[str], str | None] = lambda name: None) -> list[Artifact]:
    """The kv_transfer_config one command sets. `line_of(NAME)`: where the variable a flag's
    whole value names ("$KV_CONFIG") was set, so the config's keys are located in its text;
    `unknown(NAME)`: why a name holds what kvctl cannot evaluate (a command substitution)."""
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
            line = _from_variable(pending, value, line, line_of)
            _take(pending, flag["dotted"], value, line, file, problems, True, expand, unknown)
        elif hydra:
            pending.hydra_path = hydra["path"]
            pending.adds = pending.adds or token.text.startswith("+")
            _take(pending, hydra["dotted"], hydra["value"], token.line, file, problems, False, expand, unknown)
    found = [] if pending.lines is None else [_artifact(pending, command)]
    if not found:  # JSON handed to vLLM through another flag: read, so the flag is judged
        found = _carried(command, file, expand)
    verl = verl_in_words([(t.text, t.line) for t in tokens], file)  # verl's own rules, judged apart
    offload = in_words([(t.text, t.line) for t in tokens], file, problems, expand)  # --kv-offloading-size
    found += [located(offload, file, "", f"{command.program} (line {min(v[1] for v in offload.values())})",
                      found[0] if found else None, command.env)] if offload else []
    # the line's other options, judged per release: only where kvctl already reads it as vLLM's
    options = launch_options([(t.text, t.line) for t in tokens]) if found else ()
    found = [replace(found[0], options=options), *found[1:]] if options else found
    return found + ([verl] if verl is not None else [])


def _carried(command: Command, file: str, expand: Callable[[str], str]) -> list[Artifact]:
    """The config a launch line gives to a flag other than --kv-transfer-config (readers/carrier.py)."""
    carried = carrier.carried([(t.text, t.line) for t in command.tokens], expand)
    if carried is None:
        return []
    origin = f"{command.program} (line {carried.line}), given to {carried.flag}"
    if carrier.is_transfer_config(carried.config):
        lines = text_lines(carried.value, "kv_transfer_config", file, carried.line)
        return [Artifact("kv_transfer_config", carried.config, "kv_transfer_config", lines, origin=origin,
                         env=command.env, carrier=carried.flag)]
    return [Artifact("kv_transfer_config", {}, "kv_transfer_config",
                     SourceLines(file, {"kv_transfer_config": carried.line}), origin=origin, env=command.env,
                     carrier=carried.flag, unread=f"the value of {carried.flag} is no kv_transfer_config")]


def _artifact(pending: _Pending, command: Command) -> Artifact:
    via = f", its value from {pending.via}" if pending.via else ""
    # Hydra overrides without '+' change keys a framework's base config already has: the keys
    # they do not name (kv_role, ...) may come from that config or the framework's code.
    partial = bool(pending.hydra_path) and not pending.whole and not pending.adds
    return Artifact("kv_transfer_config", pending.data, "kv_transfer_config", pending.lines,
                    origin=f"{'Hydra override' if pending.hydra_path else command.program} "
                           f"(line {pending.line}){via}", env=command.env, partial=partial,
                    framework="verl" if pending.hydra_path == ".".join(VERL_PATH) else "",
                    unread=pending.unread)


def _from_variable(pending: _Pending, raw: str, line: int, line_of: Callable[[str], int | None]) -> int:
    """The line to locate a flag's value at: the variable's own line when the value is one
    variable the script set (its keys are in that text), else the flag's."""
    whole = _WHOLE_VARIABLE.match(raw)
    set_at = line_of(whole["braced"] or whole["plain"]) if whole else None
    if not set_at:
        return line
    pending.line = pending.line or line  # the origin names the flag's line
    pending.via = f"{whole['braced'] or whole['plain']} (line {set_at})"
    return set_at


def _take(pending: _Pending, dotted: str | None, raw: str, line: int, file: str, problems: list[Problem],
          json_only: bool, expand: Callable[[str], str], unknown: Callable[[str], str | None]) -> None:
    value = expand(raw)
    if pending.lines is None:
        pending.lines, pending.line = SourceLines(file, {"kv_transfer_config": line}), pending.line or line
    if dotted:  # --kv-transfer-config.kv_role kv_both: one key (vLLM parses the value as JSON or text)
        keys = dotted.strip(".").split(".")
        node = pending.data
        for key in keys[:-1]:
            node = node.setdefault(key, {}) if isinstance(node.get(key, {}), dict) else {}
        node[keys[-1]] = scalar(value)
        pending.lines["kv_transfer_config." + ".".join(keys)] = line
        return
    if pending.whole:  # a second whole value: argparse (and Hydra) keep the last one
        _replace_whole(pending, line, file, problems)
    pending.whole, pending.whole_line = True, line
    text = value if json_only else _HYDRA_FLOW_KEY.sub(r"\1\2: ", value)
    parsed = parse_value(text, json_only)
    if isinstance(parsed, str) and '\\"' in text:
        # `"{\"a\": 1}"` held in a variable for a later eval: read it as the eval would.
        text = text.replace('\\"', '"')
        parsed = parse_value(text, json_only)
    if isinstance(parsed, str):
        _unparsed(pending, value, raw, parsed, f"{file}:{line} kv_transfer_config", problems, unknown)
        return
    pending.data.update(parsed)
    pending.whole_keys = list(parsed)
    pending.lines.update(text_lines(text, "kv_transfer_config", file, line))


def _unparsed(pending: _Pending, value: str, raw: str, parsed: str, where: str, problems: list[Problem],
              unknown: Callable[[str], str | None]) -> None:
    """A whole value that is not a JSON object: an error where kvctl read all of it; where a
    variable (or a substitution) holds what kvctl cannot see, that is said and the config is
    unread (no verdict rests on it), the rest of the command still checked."""
    unexpanded = _VARIABLE.search(value)
    name = unexpanded and (unexpanded["braced"] or unexpanded["plain"])
    why = name and unknown(name)
    what = substitution(value)
    if why:
        hint = f"it uses {unexpanded[0]}, {why}"
    elif unexpanded:
        hint = f"it uses {unexpanded[0]}, which the script does not set (its environment may)"
    elif what:
        hint = f"it is {what}, which kvctl does not run"
    else:
        hint = "it is built from shell variables" if value != raw else ""
    if not hint:
        problems.append(Problem(where, f"the kv_transfer_config value is not a JSON object: {parsed}",
                                "write it as '{\"kv_connector\": ..., \"kv_role\": ...}' (vLLM parses "
                                "it with json.loads)", ERROR))
        return
    pending.unread = hint
    problems.append(Problem(where, f"kvctl cannot read the kv_transfer_config ({hint}): it is not "
                            "checked, the rest of the command is", "validate the kv_transfer_config as the "
                            "servers receive it (the JSON itself, or the script's output)", WARNING))


def _replace_whole(pending: _Pending, line: int, file: str, problems: list[Problem]) -> None:
    """The earlier whole value is not used: vLLM's parser keeps the last --kv-transfer-config."""
    for key in pending.whole_keys:
        pending.data.pop(key, None)
        for path in [p for p in pending.lines if p == f"kv_transfer_config.{key}"
                     or p.startswith(f"kv_transfer_config.{key}.")]:
            del pending.lines[path]
    problems.append(Problem(f"{file}:{pending.whole_line} kv_transfer_config",
                            f"the command gives the kv_transfer_config twice (lines {pending.whole_line} "
                            f"and {line}): vLLM keeps the last one, so this one is not used",
                            "give it once", ERROR, dropped=True))
