"""What a script has set so far, as it would be when each command runs: its variables (expanded
as bash expands them, shell_expand.py), which of them are exported, which hold a value only running
the script gives, and each command with its environment."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvctl.validate.readers.shell_expand import UNKNOWN, expand, substitution
from kvctl.validate.readers.shell_words import Token

# verl / Hydra: [+|++|~]a.b.kv_transfer_config[.key]=value
HYDRA = re.compile(r"^(?:\+\+|\+|~)?(?P<path>(?:[\w-]+\.)*kv_transfer_config)(?P<dotted>(?:\.[\w-]+)+)?="
                    r"(?P<value>.*)$", re.S)
ASSIGN = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$", re.S)
_DECLARE = {"export", "local", "declare", "readonly", "typeset"}


@dataclass
class Command:
    tokens: list[Token]
    env: dict[str, str] = field(default_factory=dict)
    array: str = ""  # NAME when the words are the items of an array NAME=( ... )

    @property
    def program(self) -> str:
        """A short name for the origin of a config: 'vllm serve', 'python -m vllm...', ..."""
        if self.array:
            return f"array {self.array}"
        words = [t.text for t in self.tokens if not ASSIGN.match(t.text)][:3]
        if words[:2] == ["vllm", "serve"] or (words and words[0].endswith("/vllm")):
            return "vllm serve"
        if "-m" in words:
            return f"python -m {words[words.index('-m') + 1]}" if words[-1] != "-m" else "python -m"
        return words[0] if words and not words[0].startswith("-") else "arguments"


def assignments(tokens: list[Token]) -> list[tuple[Token, str, str]]:
    """(token, NAME, raw value) of the assignments a command makes: every NAME=value after
    export/local/declare, else the leading NAME=value words (`A=b vllm serve ...`)."""
    if tokens and tokens[0].text in _DECLARE:
        words = tokens[1:]
    else:
        words = []
        for token in tokens:
            if not ASSIGN.match(token.text) or HYDRA.match(token.text):
                break
            words.append(token)
    return [(t, m["name"], m["value"]) for t in words if (m := ASSIGN.match(t.text))]


@dataclass
class Shell:
    """What a script has set so far, as it would be when each command runs."""

    variables: dict[str, str] = field(default_factory=dict)
    exported: dict[str, str] = field(default_factory=dict)

    lines: dict[str, int] = field(default_factory=dict)  # where each variable was last set
    unknown: dict[str, tuple[int, str]] = field(default_factory=dict)  # NAME -> (line, what set it)
    at: int = 0  # the line being read (where a ${NAME:=default} sets NAME)

    def command(self, tokens: list[Token]) -> Command | None:
        """The command with its environment, or None for a pure assignment (remembered)."""
        self.at = tokens[0].line if tokens else self.at
        if tokens and tokens[0].opens_array:  # NAME=( items ): no string value kvctl keeps
            name = tokens[0].text.rstrip("+=")
            self.variables.pop(name, None)
            self.exported.pop(name, None)
            return Command(tokens[1:], dict(self.exported), array=name) if len(tokens) > 1 else None
        if tokens and tokens[0].text == ":":  # `: ${NAME:=default}`: only its expansions' effects
            for token in tokens[1:]:
                self.at = token.line
                self.expand(token.text)
            return None
        found = assignments(tokens)
        if tokens and tokens[0].text in _DECLARE:
            for token, name, value in found:
                self.remember(name, self.expand(value), tokens[0].text == "export", token.line)
            return None
        env = dict(self.exported)
        env.update((name, self.expand(value)) for _, name, value in found)
        if len(found) == len(tokens):  # NAME=value on its own: a shell variable from now on
            for token, name, _ in found:
                self.remember(name, env[name], name in self.exported, token.line)
            return None
        return Command(tokens[len(found):], env)

    def remember(self, name: str, value: str, exported: bool = False, line: int = 0) -> None:
        """Record NAME=value; a value only running the script gives ($(...), $((...)), `...`)
        is not guessed: NAME is known to be set, to a value kvctl cannot read (unknown)."""
        what = substitution(value) or ("a value ending in $" if value.endswith("$") else None)
        if what:
            for known in (self.variables, self.exported, self.lines):
                known.pop(name, None)
            self.unknown[name] = (line, what)
            return
        self.unknown.pop(name, None)
        self.variables[name] = value
        self.lines[name] = line
        if exported:
            self.exported[name] = value

    def line_of(self, name: str) -> int | None:
        """The line that set NAME, when the script set it to a value kvctl kept."""
        return self.lines.get(name) if name in self.variables else None

    def lookup(self, name: str) -> str | None:
        """NAME's value, UNKNOWN (set to what kvctl cannot evaluate), or None (not set here)."""
        if name in self.unknown:
            return UNKNOWN
        return self.variables.get(name, self.exported.get(name))

    def expand(self, text: str) -> str:
        """$NAME, ${NAME} and the ${NAME:-default} forms as bash expands them where the script
        set NAME (a default where it did not); others left as written."""
        return expand(text, self.lookup,
                      lambda name, value: self.remember(name, value, name in self.exported, self.at))

    def why_unknown(self, name: str) -> str | None:
        """'set on line N by a command substitution ...' for a name kvctl cannot evaluate."""
        if name not in self.unknown:
            return None
        line, what = self.unknown[name]
        return f"set{f' on line {line}' if line else ''} by {what}, which kvctl does not run"
