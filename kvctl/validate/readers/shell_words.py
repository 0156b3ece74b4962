"""Shell text split into commands of words the way bash reads a script: one command at a time.

Handles quotes ('...', "...", $'...'), backslashes and `\\` continuations, $(...), `...`, ${...}
and $((...)) nested with their own quoting, comments, arrays NAME=( ... ), redirections and the
control words of if / while / case / functions. A word keeps the text of a substitution as written
(kvctl never runs anything). A command kvctl cannot split (a quote or a $( that never closes) is
skipped and said (Skipped), and reading goes on at the next line: one bad line never costs the file.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

_PLAIN = re.compile(r"[^\s'\"\\$`;&|()<>]+")
_IN_DOUBLE = re.compile(r'[\\"$`]')
_IN_SUBST = re.compile(r"[\\'\"`$(){}#\n]")
# Words after which a new command starts on the same line (`then vllm serve ...`), and words that
# only close a block: neither is part of a command.
_CONTROL = frozenset({"if", "then", "else", "elif", "do", "while", "until", "{", "!", "time",
                      "fi", "done", "esac", "}"})
_PLACEHOLDER = re.compile(r"<[\w.:/@-]+>")
_ARRAY_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\+?=$")
# A text with more commands kvctl cannot split than this is not a script it understands: the last
# note covers the rest of the text (each skip costs a scan to the end of the text).
MAX_SKIPPED = 20
_ANSI_C = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"', "r": "\r"}


@dataclass(frozen=True)
class Token:
    text: str
    line: int  # file line where the token starts
    opens_array: bool = False  # `NAME=(`: the command's other words are the array's items


@dataclass(frozen=True)
class Skipped:
    """A command kvctl could not split into words."""

    line: int  # where the construct that never closes opens
    first: int  # first line of the skipped command
    last: int  # last line skipped (reading goes on after it)
    what: str  # "a ' quote", "a $( command substitution", ...
    text: str  # the skipped text
    gave_up: bool = False  # MAX_SKIPPED reached: the rest of the text is not read


@dataclass
class Split:
    commands: list[list[Token]] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


class _Unclosed(Exception):
    def __init__(self, what: str, offset: int) -> None:
        super().__init__(what)
        self.what, self.offset = what, offset


def split_commands(text: str, base_line: int = 1) -> Split:
    """Every command of `text` as words with the file line each starts on (`base_line` is the
    file line of the text's first line)."""
    return _Lexer(text, base_line).run()


class _Lexer:
    def __init__(self, text: str, base_line: int) -> None:
        self.text, self.base = text, base_line
        self.newlines = [m.start() for m in re.finditer("\n", text)]
        self.out = Split()

    def line(self, offset: int) -> int:
        return self.base + bisect.bisect_left(self.newlines, offset)

    def run(self) -> Split:
        position = 0
        while position < len(self.text):
            try:
                position = self._commands(position)
            except _Recover as stop:
                position = stop.resume
                if len(self.out.skipped) == MAX_SKIPPED:  # each skip rescans to the end: bound it
                    last = self.out.skipped[-1]
                    self.out.skipped[-1] = Skipped(last.line, last.first, self.line(len(self.text)),
                                                   last.what, last.text + self.text[position:], True)
                    break
        return self.out

    # -- one pass from `start` until the end, or until a command cannot be split -----------
    def _commands(self, start: int) -> int:
        text, n = self.text, len(self.text)
        state = _State(start)
        i = start
        while i < n:
            c = text[i]
            try:
                if c in " \t\r":
                    state.end_word(self)
                    i += 1
                elif c == "\\":
                    i = self._backslash(i, state)
                elif c == "\n":
                    state.end_word(self)
                    if not state.array:
                        state.end_command(self, i + 1)
                    i += 1
                elif c == "#" and not state.in_word:
                    end = text.find("\n", i)
                    i = n if end < 0 else end
                elif c in ";&|":
                    i = self._operator(i, state)
                elif c == "(":
                    i = self._open_paren(i, state)
                elif c == ")":
                    state.end_word(self)
                    state.end_command(self, i + 1)
                    i += 1
                elif c in "<>":
                    i = self._redirection(i, state)
                else:
                    i = self._word_part(i, state)
            except _Unclosed as exc:
                raise _Recover(self._skip(state, exc)) from None
        state.end_word(self)
        state.end_command(self, n)
        return n

    def _backslash(self, i: int, state: _State) -> int:
        nxt = self.text[i + 1:i + 2]
        if nxt == "\n":
            return i + 2  # a continuation: the word and the command go on
        if self.text.startswith("\r\n", i + 1):
            return i + 3
        state.add(self, i, nxt or "\\")
        return i + 2

    def _operator(self, i: int, state: _State) -> int:
        text = self.text
        if text.startswith("&>", i):  # &> file, &>> file: a redirection, not the command's end
            return self._redirection(i + 1, state)
        state.end_word(self)
        width = 2 if text[i + 1:i + 2] in ("&", "|", ";") else 1  # && || ;; |& ;&
        state.end_command(self, i + width)
        return i + width

    def _open_paren(self, i: int, state: _State) -> int:
        if state.in_word and _ARRAY_NAME.match(state.word) and not state.quoted:
            state.open_array(self)
            return i + 1
        state.end_word(self)
        state.end_command(self, i + 1)
        return i + 1

    def _redirection(self, i: int, state: _State) -> int:
        text = self.text
        placeholder = _PLACEHOLDER.match(text, i)
        if placeholder:  # `replicas=<N>` in a doc: a value to fill in, not two redirections
            state.add(self, i, placeholder[0])
            return placeholder.end()
        if text.startswith(("<(", ">("), i):  # process substitution: a word of its own
            state.end_word(self)
            end = _substitution_end(text, i + 1, "(")
            state.add(self, i, text[i:end], spans=text.find("\n", i, end) >= 0)
            return end
        if state.in_word and state.word.isdigit() and not state.quoted:
            state.word, state.in_word = "", False  # 2>&1: the fd is part of the redirection
        state.end_word(self)
        j = i
        while j < len(text) and text[j] in "<>&|-":
            j += 1
        state.drop_next = True  # the file (or heredoc word) is not one of the command's words
        return j

    def _word_part(self, i: int, state: _State) -> int:
        text = self.text
        c = text[i]
        if c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise _Unclosed("a ' quote", i)
            state.add(self, i, text[i + 1:end], quoted=True, spans="\n" in text[i:end])
            return end + 1
        if c == '"':
            return self._double(i, i + 1, state)
        if c == "`" and text.startswith("```", i):  # a Markdown fence around a doc's snippet
            end = text.find("\n", i)
            return len(text) if end < 0 else end
        if c == "`":
            end = _substitution_end(text, i, "`")
            state.add(self, i, text[i:end], spans="\n" in text[i:end])
            return end
        if c == "$":
            nxt = text[i + 1:i + 2]
            if nxt == "'":
                return self._ansi_c(i, state)
            if nxt == '"':
                return self._double(i, i + 2, state)
            if nxt in ("(", "{"):
                end = _substitution_end(text, i + 1, nxt)
                state.add(self, i, text[i:end], spans="\n" in text[i:end])
                return end
            state.add(self, i, "$")
            return i + 1
        match = _PLAIN.match(text, i)
        state.add(self, i, match[0])
        return match.end()

    def _double(self, start: int, i: int, state: _State) -> int:
        """A "..." string from `start` (its content from `i`): \\ escapes only $ ` " \\ newline."""
        text, parts = self.text, []
        while True:
            match = _IN_DOUBLE.search(text, i)
            if match is None:
                raise _Unclosed('a " quote', start)
            j = match.start()
            parts.append(text[i:j])
            c = text[j]
            if c == '"':
                state.add(self, start, "".join(parts), quoted=True, spans="\n" in text[start:j])
                return j + 1
            if c == "\\":
                nxt = text[j + 1:j + 2]
                parts.append("" if nxt == "\n" else nxt if nxt in '$`"\\' else "\\" + nxt)
                i = j + 2
            elif c == "`" or text[j + 1:j + 2] in ("(", "{"):
                end = _substitution_end(text, j if c == "`" else j + 1, c if c == "`" else text[j + 1])
                parts.append(text[j:end])
                i = end
            else:
                parts.append("$")
                i = j + 1

    def _ansi_c(self, start: int, state: _State) -> int:
        text, i, parts = self.text, start + 2, []
        while i < len(text):
            c = text[i]
            if c == "'":
                state.add(self, start, "".join(parts), quoted=True, spans="\n" in text[start:i])
                return i + 1
            if c == "\\" and i + 1 < len(text):
                parts.append(_ANSI_C.get(text[i + 1], "\\" + text[i + 1]))
                i += 2
                continue
            parts.append(c)
            i += 1
        raise _Unclosed("a $' quote", start)

    # -- recovery --------------------------------------------------------------------------
    def _skip(self, state: _State, exc: _Unclosed) -> int:
        """Skip the command that cannot be split: from its start through the line of the first
        construct that ran over a line end (a stray quote pairs with the next line's quotes), or
        of the one that never closes. Returns where reading goes on."""
        blame = min(exc.offset, state.first_span if state.first_span is not None else exc.offset)
        end = self.text.find("\n", blame)
        resume = len(self.text) if end < 0 else end + 1
        first = state.first_offset if state.first_offset is not None else blame
        self.out.skipped.append(Skipped(self.line(blame), self.line(first), self.line(blame),
                                        exc.what if blame == exc.offset else _what(self.text[blame]),
                                        self.text[first:resume]))
        return resume


def _what(opening: str) -> str:
    return {"'": "a ' quote", '"': 'a " quote', "`": "a ` command substitution"}.get(
        opening, f"a {opening} substitution")


class _Recover(Exception):
    def __init__(self, resume: int) -> None:
        super().__init__(resume)
        self.resume = resume


@dataclass
class _State:
    """The command and word being read."""

    command_start: int
    tokens: list[Token] = field(default_factory=list)
    word: str = ""
    word_start: int = 0
    in_word: bool = False
    quoted: bool = False
    array: bool = False
    drop_next: bool = False
    first_span: int | None = None  # offset of the first quote/substitution that spans lines
    first_offset: int | None = None  # where the command's first word starts

    def add(self, lexer: _Lexer, offset: int, part: str, quoted: bool = False, spans: bool = False) -> None:
        if not self.in_word:
            self.in_word, self.word_start, self.word, self.quoted = True, offset, "", False
            if self.first_offset is None:
                self.first_offset = offset
        self.word += part
        self.quoted = self.quoted or quoted
        if spans and self.first_span is None:
            self.first_span = offset

    def end_word(self, lexer: _Lexer) -> None:
        if not self.in_word:
            return
        word, self.in_word = self.word, False
        if self.drop_next:
            self.drop_next = False
            return
        if not self.tokens and not self.quoted and word in _CONTROL:
            return  # `then`, `do`, `{`, `fi` ...: the command starts after it
        self.tokens.append(Token(word, lexer.line(self.word_start)))

    def open_array(self, lexer: _Lexer) -> None:
        """`NAME=(`: the words before it (`local -a`) are a command of their own; the array's
        items, over any number of lines, are the next one."""
        name, start = self.word, self.word_start
        self.in_word = False
        self.end_command(lexer, start)
        self.tokens = [Token(name, lexer.line(start), opens_array=True)]
        self.array, self.first_offset = True, start

    def end_command(self, lexer: _Lexer, next_start: int) -> None:
        if self.tokens:
            lexer.out.commands.append(self.tokens)
        self.tokens, self.array, self.drop_next, self.first_span = [], False, False, None
        self.command_start, self.first_offset = next_start, None


def _substitution_end(text: str, i: int, opening: str) -> int:
    """Index just after the $( ... ), ${ ... }, ( ... ) or `...` whose opening character is at
    `i`, with quotes and substitutions nested inside (an explicit stack: hostile nesting cannot
    exhaust Python's recursion). _Unclosed when it never closes."""
    closer = {"(": ")", "{": "}", "`": "`"}[opening]
    what = "a ` command substitution" if opening == "`" else f"a ${opening} substitution"
    stack, j, n = [closer], i + 1, len(text)
    while stack:
        top = stack[-1]
        if top == "'":
            end = text.find("'", j)
            if end < 0:
                raise _Unclosed(what, i - (opening != "`"))
            stack.pop()
            j = end + 1
            continue
        match = _IN_SUBST.search(text, j)
        if match is None:
            raise _Unclosed(what, i - (opening != "`"))
        j, c = match.start(), match[0]
        if c == "\\":
            j += 2
        elif top == '"':
            j = _in_double(text, j, c, stack)
        elif c == top:
            stack.pop()
            j += 1
        elif c == "#" and top == ")" and (j == 0 or text[j - 1] in " \t\n"):
            end = text.find("\n", j)
            j = n if end < 0 else end
        else:
            j = _open_nested(text, j, c, stack, top)
    return j


def _in_double(text: str, j: int, c: str, stack: list[str]) -> int:
    if c == '"':
        stack.pop()
    elif c == "`" or (c == "$" and text[j + 1:j + 2] in ("(", "{")):
        stack.append("`" if c == "`" else {"(": ")", "{": "}"}[text[j + 1]])
        return j + (1 if c == "`" else 2)
    return j + 1


def _open_nested(text: str, j: int, c: str, stack: list[str], top: str) -> int:
    if c in "'\"":
        stack.append(c)
    elif c == "`":
        stack.append("`")
    elif c == "$" and text[j + 1:j + 2] in ("(", "{"):
        stack.append({"(": ")", "{": "}"}[text[j + 1]])
        return j + 2
    elif c == "(" and top == ")":
        stack.append(")")  # $(( ... )), a subshell inside
    return j + 1
