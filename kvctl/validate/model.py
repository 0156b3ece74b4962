"""What validation works on and produces: located artifacts in, located problems out.

A reader turns an input (a JSON file, a shell script, a Kubernetes manifest, ...) into Artifacts:
one config each (a kv_transfer_config, a mooncake.json, an env, an LMCache config) with the line
of every key. Checks see only Artifacts, never file formats.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

ERROR = "error"
WARNING = "warning"

ArtifactKind = Literal["kv_transfer_config", "mooncake", "env", "lmcache", "kv_offloading", "verl"]
_LAST_STEP = re.compile(r"(\.?[^.\[\]]+|\[\d+\])$")  # last ".key", "key" or "[i]"


@dataclass(frozen=True)
class Problem:
    where: str  # "FILE:LINE path.to.key" when from a file, else the dotted path
    message: str  # what is wrong: names the field, the value, the vLLM version
    fix: str  # how to fix it, concretely
    severity: str  # "error" | "warning"
    # vLLM starts and silently does nothing with a setting the config states (a misspelled key it
    # ignores, a file no connector reads): an error by default, a warning with --allow-dropped.
    dropped: bool = False


class SourceLines(dict[str, int]):
    """Dotted path -> 1-based line of its key in `file`, so a problem says where to look."""

    def __init__(self, file: str, lines: Mapping[str, int] | None = None) -> None:
        super().__init__(lines or {})
        self.file = file

    def shifted(self, prefix: str, base: int) -> SourceLines:
        """These lines (counted from 1 inside an embedded text) moved to start at file line `base`,
        their paths put under `prefix`."""
        out = SourceLines(self.file)
        for path, line in self.items():
            out[join(prefix, path) if path else prefix] = base + line - 1
        return out


class Environment(dict[str, str]):
    """A server's environment, knowing which names a tool sets rather than the input (a Helm
    chart's own variables): checks report those as warnings, since the file cannot change them."""

    def __init__(self, values: Mapping[str, str] | None = None,
                 set_by: Mapping[str, str] | None = None) -> None:
        super().__init__(values or {})
        self.set_by = dict(set_by or {})  # name -> who sets it, e.g. "the production-stack chart"


@dataclass(frozen=True)
class Artifact:
    """One config found in an input, with where each of its keys is."""

    kind: ArtifactKind
    data: Any
    where: str  # dotted name of the block, the root of every problem's path
    lines: SourceLines
    origin: str = ""  # how the reader found it, e.g. "vllm serve (line 3)"
    # Connector names that read this artifact when the input says (a bundle, a ConfigMap next to
    # a launch line); empty: the checks infer it from the vLLM version.
    readers: tuple[str, ...] = ()
    # Environment set for the same command (`A=b vllm serve`, `export A=b`, a container's env):
    # some verdicts depend on it (VLLM_USE_V1=0 selects the V0 engine and its connectors).
    env: Mapping[str, str] = field(default_factory=dict)
    # vLLM Python API the script called to build it ("KVTransferConfig.from_cli"): readers are
    # version-free, so they record the call and python_api.py says which releases lack it.
    calls: tuple[str, ...] = ()
    # The line of the first comment in a JSON file read without its comments (0: none): whatever
    # reads the file with json.load refuses it.
    json_comments: int = 0
    # Keys set one by one on top of a framework's own config (Hydra overrides without '+'): the
    # fields it does not set may come from that config, so a missing one is not a certain error.
    partial: bool = False
    # The other `--options` of the vLLM launch line this config came from, (word without =value, line):
    # kvctl.validate.serve_flags judges them against the release's parser (on one artifact a command).
    options: tuple[tuple[str, int], ...] = ()
    # "verl": read from verl's engine_kwargs.vllm (a verl config or its Hydra overrides), where
    # verl's own rules apply on top of vLLM's (kvctl.validate.verl)
    framework: str = ""
    # What kvctl could not read of the config as a whole ("it uses $P_CONFIG, set on line 2 by a
    # command substitution ..."): no verdict rests on the keys it lacks.
    unread: str = ""
    # The option a launch line gives the config to when it is not --kv-transfer-config
    # (`--kv-connector-config`): serve_flags says the config never reaches vLLM through it.
    carrier: str = ""


@dataclass(frozen=True)
class HydraOverride:
    """One `[+|++|~]key=value` word of a command line (verl's entry point is a Hydra app)."""

    prefix: str  # "", "+", "++" or "~"
    key: str  # dotted
    value: Any  # scalars parsed as JSON; anything else as written
    line: int


@dataclass(frozen=True)
class VerlConfig:
    """A verl config (the data of an Artifact of kind "verl"): the tree a YAML file holds or its
    command line's overrides build, and those overrides."""

    tree: dict[str, Any]
    overrides: tuple[HydraOverride, ...] = ()
    # the command loads its own config (--config-name ...), which may hold keys verl's lacks
    own_config: bool = False


@dataclass
class ValidationReport:
    path: str
    kind: str  # the input's format: kv_transfer_config, verl, shell, k8s, mooncake, bundle, ...
    vllm_version: str
    problems: list[Problem] = field(default_factory=list)
    found: list[str] = field(default_factory=list)  # "kv_transfer_config at FILE:LINE (origin)"
    # values kvctl could not evaluate, not judged: "FILE:LINE path '$PORT' (a shell variable ...)"
    unread: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == WARNING]

    @property
    def dropped(self) -> list[Problem]:
        return [p for p in self.problems if p.dropped]

    @property
    def ok(self) -> bool:
        return not self.errors

    def allow_dropped(self) -> None:
        """Report silently dropped settings as warnings (exit 0): for users who know."""
        self.problems = [replace(p, severity=WARNING) if p.dropped else p for p in self.problems]

    def to_dict(self) -> dict[str, Any]:
        """Stable JSON shape for --json and CI."""
        return {
            "path": self.path,
            "kind": self.kind,
            "vllm_version": self.vllm_version,
            "ok": self.ok,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "dropped": len(self.dropped),
            "found": self.found,
            "unread": self.unread,
            "problems": [asdict(p) for p in self.problems],
        }


# -- locations --------------------------------------------------------------------------
def join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def locate(path: str, lines: Mapping[str, int] | None) -> str:
    """'FILE:LINE path' using the nearest located ancestor (a missing key points at its parent)."""
    if lines is None:
        return path
    file = getattr(lines, "file", None)
    probe = path
    while probe:
        if probe in lines:
            return f"{file}:{lines[probe]} {path}" if file else f"line {lines[probe]} {path}"
        parent = _LAST_STEP.sub("", probe)
        probe = "" if parent == probe else parent  # never loop on a path the pattern cannot cut
    return f"{file} {path}" if file else path


class Collector:
    """Accumulates problems; every check reports all it finds instead of stopping at the first."""

    def __init__(self, lines: Mapping[str, int] | None) -> None:
        self.lines = lines
        self.problems: list[Problem] = []

    def add(self, severity: str, path: str, message: str, fix: str) -> None:
        self.problems.append(Problem(locate(path, self.lines), message, fix, severity))

    def error(self, path: str, message: str, fix: str) -> None:
        self.add(ERROR, path, message, fix)

    def warn(self, path: str, message: str, fix: str) -> None:
        self.add(WARNING, path, message, fix)

    def drop(self, path: str, message: str, fix: str) -> None:
        """A setting vLLM accepts and silently does nothing with: `message` says what vLLM does
        instead (an error unless the user passes --allow-dropped)."""
        self.problems.append(Problem(locate(path, self.lines), message, fix, ERROR, dropped=True))


# -- wording ----------------------------------------------------------------------------
def closest(word: object, options: Iterable[str]) -> str | None:
    found = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: object, options: Iterable[str]) -> str:
    """"did you mean 'x'? " or "" (callers append their own full sentence after it)."""
    close = closest(word, options)
    return f"did you mean '{close}'? " if close else ""


def either(first: str, second: str) -> str:
    """'first, or second' without a dangling 'or' when `first` is empty."""
    return f"{first}, or {second}" if first else second


def find_key(node: Any, key: str, path: str) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every `key` at any depth of a dict/list tree."""
    if isinstance(node, Mapping):
        for k, val in node.items():
            child = join(path, k)
            if k == key:
                yield child, val
            yield from find_key(val, key, child)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from find_key(item, key, f"{path}[{index}]")


def value_at(data: Any, dotted: str) -> Any:
    """The value at a dotted path of a dict tree, or None."""
    for key in dotted.split("."):
        data = data.get(key) if isinstance(data, Mapping) else None
    return data


def placeholder(value: Any) -> bool:
    """A value a template or the shell fills in later ($VAR, ${VAR}, {{ .Values.x }}): kvctl
    cannot check it and does not guess."""
    return isinstance(value, str) and ("$" in value or "{{" in value)


def describe(data: Any) -> str:
    return "empty" if data is None else f"a {type(data).__name__}"
