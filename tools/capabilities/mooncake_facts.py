"""Generate kvctl/data/mooncake_facts.json from Mooncake's release tags (plain-text C++ parsing:
no build, no import, no network beyond the local git mirror).

    python -m tools.capabilities.mooncake_facts                  extract every release + write the file
    python -m tools.capabilities.mooncake_facts --check          exit 1 if the committed file is stale
    python -m tools.capabilities.mooncake_facts --git-dir DIR    another (bare) clone of Mooncake

Per release: the gflags `mooncake_master` defines (mooncake-store/src/master.cpp, the executable's
only source file), the HTTP routes of its admin/metrics server (every `set_http_handler<...>`
in mooncake-store/{src,include} except the servers that are not the master's metrics port), and
the vLLM V1 connectors the wheel ships (users name them with kv_connector_module_path, e.g.
`mooncake.mooncake_connector_v1`): whether each constructor takes kv_cache_config (vLLM refuses
external 2-argument connectors from 0.21.0) and whether the module reads MOONCAKE_CONFIG_PATH.
Merged into release intervals with tools.capabilities.merge.intervals, as vllm_facts.json is.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from packaging.version import InvalidVersion, Version

from tools.capabilities.merge import check_committed, dumps, intervals

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "kvctl/data/mooncake_facts.json"
DEFAULT_GIT_DIR = Path(os.environ.get("MOONCAKE_GIT_DIR", "/work/.mirror/kvcache-ai+Mooncake/repo"))
HEADER = {"schema": 1, "generated_by": "tools/capabilities (make capabilities-mooncake)",
          "source": "github.com/kvcache-ai/Mooncake tags"}
SECTIONS = ("flags", "routes", "vllm_connectors")
WHEEL_PACKAGE = "mooncake-wheel/mooncake"

MASTER_SOURCE = "mooncake-store/src/master.cpp"
ROUTE_DIRS = ("mooncake-store/src", "mooncake-store/include")
CONST_DIRS = ("mooncake-store/include", MASTER_SOURCE)
# Other HTTP servers in the same tree, not on the master's --metrics_port: the metadata server
# (--enable_http_metadata_server, its own port) and mooncake_client's server.
NOT_ADMIN_SERVERS = {"mooncake-store/src/http_metadata_server.cpp", "mooncake-store/src/real_client.cpp"}
FIRST_RELEASE = Version("0.3.0")
# PyPI releases only: v0.3.0-alpha/-beta and v0.3.11-rc1 were never published.
RELEASE_TAG = re.compile(r"^v(\d+\.\d+\.\d+(?:\.post\d+)?)$")
FLAG_TYPES = ("string", "int32", "int64", "uint32", "uint64", "bool", "double")
HTTP_METHODS = {"DEL": "DELETE"}  # cinatra's enum name -> the HTTP verb


# --------------------------------------------------------------------------------------------
# C++ text helpers


_LEXEME = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)


def strip_comments(text: str) -> str:
    """C++ text with comments blanked (newlines kept, so line numbers stay right); strings kept."""
    def blank(m: re.Match[str]) -> str:
        s = m.group()
        return s if s[0] in "\"'" else re.sub(r"[^\n]", " ", s)
    return _LEXEME.sub(blank, text)


_CLOSE = {"(": ")", "[": "]", "{": "}"}


def split_args(text: str, open_at: int) -> tuple[list[str], int]:
    """Top-level comma-separated arguments of the bracket at text[open_at]; and the index after
    its closing bracket. Strings and nested ()[]{} are skipped; `<...>` is not (rare in args)."""
    stack = [_CLOSE[text[open_at]]]
    args: list[str] = []
    start = i = open_at + 1
    while i < len(text):
        c = text[i]
        if c in "\"'":
            m = _LEXEME.match(text, i)
            i = m.end() if m else i + 1
            continue
        if c in _CLOSE:
            stack.append(_CLOSE[c])
        elif c == stack[-1]:
            stack.pop()
            if not stack:
                args.append(text[start:i].strip())
                return [a for a in args if a], i + 1
        elif c == "," and len(stack) == 1:
            args.append(text[start:i].strip())
            start = i + 1
        i += 1
    raise ValueError(f"unbalanced {text[open_at]!r} at offset {open_at}")


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


_STRING = re.compile(r'"((?:\\.|[^"\\])*)"')
_INT = re.compile(r"^(0[xX][0-9a-fA-F]+|\d+)(?:[uU]?[lL]{0,2}|[lL]{1,2}[uU]?)$")
_FLOAT = re.compile(r"^(\d+\.\d*|\.\d+|\d+(?:\.\d*)?[eE][-+]?\d+)[fFlL]?$")
_IDENT = re.compile(r"^(?:::)?(?:\w+::)*(\w+)$")


def string_literal(expr: str) -> str | None:
    """"a" "b" (adjacent literals) -> "ab"; None unless expr is only string literals."""
    expr = expr.strip()
    if not expr.startswith('"') or _STRING.sub("", expr).strip():
        return None
    return "".join(ast.literal_eval(f'"{s}"') for s in _STRING.findall(expr))


def _arith(expr: str) -> int | float | None:
    """`8ULL * 1024 * 1024` -> 8589934592: integer/float arithmetic only, else None."""
    cleaned = re.sub(r"\b(\d+)(?:[uU]?[lL]{1,2}|[uU])\b", r"\1", expr)
    try:
        tree = ast.parse(cleaned, mode="eval")
    except SyntaxError:
        return None
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.operator, ast.unaryop)
    if not all(isinstance(node, allowed) for node in ast.walk(tree)):
        return None
    try:
        value = eval(compile(tree, "<flag default>", "eval"), {"__builtins__": {}})  # noqa: S307 - numbers only
    except ArithmeticError:
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def cpp_value(expr: str, consts: dict[str, str], depth: int = 0):
    """A flag default as JSON: a literal, an arithmetic result, or a resolved constant.

    Anything else stays C++ as {"cpp": expr}, so it cannot be mistaken for a string default.
    """
    expr = " ".join(expr.split())
    if (text := string_literal(expr)) is not None:
        return text
    if expr in ("true", "false"):
        return expr == "true"
    wrapped = re.fullmatch(r"(?:std::string|static_cast<[\w:\s]+>)\s*\((.*)\)", expr)
    if wrapped:
        return cpp_value(wrapped.group(1), consts, depth)
    if _INT.match(expr):
        return int(re.sub(r"[uUlL]+$", "", expr), 0)
    if _FLOAT.match(expr):
        return float(expr.rstrip("fFlL"))
    if (number := _arith(expr)) is not None:
        return number
    if limit := re.fullmatch(r"std::numeric_limits<\s*(?:std::)?(u?)int(8|16|32|64)_t\s*>::max\(\)", expr):
        bits = int(limit.group(2)) - (0 if limit.group(1) else 1)
        return 2 ** bits - 1
    ident = _IDENT.match(expr)
    if ident and ident.group(1) in consts and depth < 4:
        resolved = cpp_value(consts[ident.group(1)], consts, depth + 1)
        if not isinstance(resolved, dict):
            return resolved
    return {"cpp": expr}


_CONST_DEF = re.compile(
    r"\b(?:constexpr|const)\b[^;{}()=]*?\b(\w+)\s*(?:\[\s*\])?\s*(?:=\s*([^;]+?)|\{([^;{}]*)\})\s*;")


def parse_constants(text: str) -> dict[str, str]:
    """`constexpr char kX[] = "1";`, `static const size_t Y = 8ULL * 1024;` -> {name: C++ expr}."""
    out: dict[str, str] = {}
    for m in _CONST_DEF.finditer(strip_comments(text)):
        out.setdefault(m.group(1), (m.group(2) or m.group(3) or "").strip())
    return out


# --------------------------------------------------------------------------------------------
# Extractors (text in, facts out: what the unit tests feed with synthetic C++)


_FLAG = re.compile(r"\bDEFINE_(" + "|".join(FLAG_TYPES) + r")\s*\(")


def parse_flags(text: str, path: str, consts: dict[str, str] | None = None) -> dict[str, dict]:
    """gflags `DEFINE_<type>(name, default, "help")` -> {name: {type, default, file, line}}."""
    consts = {**parse_constants(text), **(consts or {})}
    code = strip_comments(text)
    flags: dict[str, dict] = {}
    for m in _FLAG.finditer(code):
        args, _ = split_args(code, m.end() - 1)
        if len(args) < 2 or not re.fullmatch(r"\w+", args[0]):
            continue  # a macro that forwards DEFINE_*, not a definition
        flags[args[0]] = {"type": m.group(1), "default": cpp_value(args[1], consts),
                          "file": path, "line": line_of(code, m.start())}
    return flags


def unresolved_names(flags: dict[str, dict]) -> set[str]:
    """Identifiers behind {"cpp": ...} defaults (to look up in the headers)."""
    names = set()
    for fact in flags.values():
        if isinstance(fact["default"], dict) and (ident := _IDENT.match(fact["default"]["cpp"])):
            names.add(ident.group(1))
    return names


_HANDLER = re.compile(r"\bset_http_handler\s*<([^>]*)>\s*\(")
_QUERY = re.compile(r"\bget_(?:decode_)?query_value\s*\(\s*\"([^\"]+)\"")
_CALL_WITH_REQ = re.compile(r"\b(\w+)\s*\(\s*req\b")


def _function_body(code: str, name: str) -> str:
    """The body of `[Class::]name(...) [const] {...}` defined in this file ('' if not here)."""
    for m in re.finditer(r"\b(?:\w+::)?" + re.escape(name) + r"\s*\(", code):
        try:
            _, after = split_args(code, m.end() - 1)
        except ValueError:
            continue
        brace = re.compile(r"\s*(?:const\s*)?(?:noexcept\s*)?(?:->\s*[\w:<>, ]+)?\s*\{").match(code, after)
        if brace:
            _, end = split_args(code, brace.end() - 1)
            return code[brace.end() - 1:end]
    return ""


def query_params(code: str, body: str, depth: int = 3, seen: set[str] | None = None) -> set[str]:
    """Query parameters a handler reads: in its lambda, and in functions it hands `req` to
    (v0.3.12 moved the bodies into MasterAdminServer::HandleX(req, resp) and helpers)."""
    seen = set() if seen is None else seen
    params = set(_QUERY.findall(body))
    if depth:
        for name in set(_CALL_WITH_REQ.findall(body)) - seen:
            seen.add(name)
            params |= query_params(code, _function_body(code, name), depth - 1, seen)
    return params


def parse_routes(text: str, path: str) -> dict[str, dict]:
    """cinatra `set_http_handler<GET, POST>("/path", handler)` -> {path: {method, params, file, line}}.

    A path registered once per method (GET/PUT/DELETE /api/v1/tenant_quotas) becomes one entry
    whose method lists them all ("DELETE,GET,PUT") and whose params are the union.
    """
    code = strip_comments(text)
    routes: dict[str, dict] = {}
    for m in _HANDLER.finditer(code):
        args, _ = split_args(code, m.end() - 1)
        route = string_literal(args[0]) if args else None
        if route is None:
            continue  # a computed path: not a fixed admin route
        methods = {HTTP_METHODS.get(t.strip().split("::")[-1], t.strip().split("::")[-1])
                   for t in m.group(1).split(",") if t.strip()}
        params = query_params(code, ",".join(args[1:]))
        if route in routes:  # another method for the same path
            fact = routes[route]
            methods |= set(fact["method"].split(","))
            params |= set(fact["params"])
        else:
            fact = routes[route] = {"file": path, "line": line_of(code, m.start())}
        fact.update(method=",".join(sorted(methods)), params=sorted(params))
    return routes


# --------------------------------------------------------------------------------------------
# Git access (a bare mirror; `git show TAG:path`, never a checkout)


class GitTag:
    def __init__(self, git_dir: Path, tag: str) -> None:
        self.git_dir, self.tag = git_dir, tag

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", f"--git-dir={self.git_dir}", *args], check=True,
                              capture_output=True, text=True, errors="replace").stdout

    def exists(self, path: str) -> bool:
        return bool(self._git("ls-tree", "--name-only", self.tag, "--", path).strip())

    def read(self, path: str) -> str:
        return self._git("show", f"{self.tag}:{path}")

    def files_containing(self, pattern: str, paths: tuple[str, ...]) -> list[str]:
        try:
            out = self._git("grep", "-l", "-E", pattern, self.tag, "--", *paths)
        except subprocess.CalledProcessError as exc:
            if exc.returncode == 1:  # no match
                return []
            raise
        return sorted(line.split(":", 1)[1] for line in out.splitlines() if line)


def release_tags(git_dir: Path) -> list[tuple[str, str]]:
    """(version, tag) for every release tag >= 0.3.0 with a mooncake_master, oldest first."""
    out = subprocess.run(["git", f"--git-dir={git_dir}", "tag", "-l"], check=True,
                         capture_output=True, text=True).stdout
    found = []
    for tag in out.split():
        m = RELEASE_TAG.match(tag)
        try:
            if m and Version(m.group(1)) >= FIRST_RELEASE:
                found.append((m.group(1), tag))
        except InvalidVersion:
            continue
    found.sort(key=lambda item: Version(item[0]))
    while found and not GitTag(git_dir, found[0][1]).exists(MASTER_SOURCE):
        found.pop(0)
    return found


class ReleaseTree(Protocol):
    """What snapshot_tree reads of a release: GitTag, or the excerpt tests/lib/release_sources.py
    serves (tools/capabilities/excerpts.py: FolderTag) where no mirror is."""

    def read(self, path: str) -> str: ...

    def files_containing(self, pattern: str, paths: tuple[str, ...]) -> list[str]: ...


def snapshot(git_dir: Path, tag: str) -> dict:
    """One release's {"flags": ..., "routes": ...} read from the tag's sources."""
    return snapshot_tree(GitTag(git_dir, tag))


def snapshot_tree(tree: ReleaseTree) -> dict:
    """snapshot() on any source of one release's files."""
    flags = parse_flags(tree.read(MASTER_SOURCE), MASTER_SOURCE)
    missing = unresolved_names(flags)
    if missing:  # defaults named after constants in the store's headers (types.h, ...)
        consts: dict[str, str] = {}
        pattern = r"\b(" + "|".join(sorted(missing)) + r")\b"
        for path in tree.files_containing(pattern, CONST_DIRS):
            consts.update(parse_constants(tree.read(path)))
        for fact in flags.values():
            if isinstance(fact["default"], dict):
                fact["default"] = cpp_value(fact["default"]["cpp"], consts)
    routes: dict[str, dict] = {}
    for path in tree.files_containing(r"set_http_handler\s*<", ROUTE_DIRS):
        if path not in NOT_ADMIN_SERVERS:
            routes.update(parse_routes(tree.read(path), path))
    connectors: dict[str, dict] = {}
    for path in tree.files_containing(r"KVConnectorBase_V1", (WHEEL_PACKAGE,)):
        if path.endswith(".py"):
            connectors.update(parse_wheel_connectors(tree.read(path), path))
    return {"flags": flags, "routes": routes, "vllm_connectors": connectors}


def parse_wheel_connectors(text: str, path: str) -> dict[str, dict]:
    """"module:Class" -> {takes_kv_cache_config, reads_mooncake_config_path, file, line} for each
    class of a wheel module whose constructor takes vllm_config (a vLLM V1 connector)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    module = path.removeprefix("mooncake-wheel/").removesuffix(".py").replace("/", ".")
    reads_env = "MOONCAKE_CONFIG_PATH" in {n.value for n in ast.walk(tree)
                                            if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    found = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        params = [a.arg for a in init.args.args + init.args.kwonlyargs] if init else []
        if "vllm_config" not in params:
            continue
        found[f"{module}:{node.name}"] = {"takes_kv_cache_config": "kv_cache_config" in params,
                                          "reads_mooncake_config_path": reads_env,
                                          "file": path, "line": init.lineno}
    return found


# --------------------------------------------------------------------------------------------
# Document


def build(releases: list[str], snapshots: dict[str, dict]) -> dict:
    """The facts document: section -> name -> {"spans": [{since, until, ...fact}]}."""
    doc: dict = {**HEADER, "releases": releases}
    for section in SECTIONS:
        names = sorted({name for v in releases for name in snapshots[v][section]})
        doc[section] = {name: {"spans": intervals(releases, [snapshots[v][section].get(name) for v in releases])}
                        for name in names}
    return doc


def facts_at(doc: dict, version: str) -> dict:
    """One release's snapshot read back from the document (a version newer than every release
    gets the newest facts: PEP 440 order, as merge.facts_at does for vLLM)."""
    v = Version(version)
    out: dict = {section: {} for section in SECTIONS}
    for section in SECTIONS:
        for name, entry in doc[section].items():
            for span in entry["spans"]:
                if Version(span["since"]) <= v and (span["until"] is None or v < Version(span["until"])):
                    out[section][name] = {k: val for k, val in span.items() if k not in ("since", "until")}
    return out


def generate(git_dir: Path, only: list[str] | None = None) -> tuple[str, dict]:
    started = time.monotonic()
    tags = [(v, t) for v, t in release_tags(git_dir) if only is None or v in only]
    # One git process at a time is the cost (~30 per release): threads overlap them.
    with ThreadPoolExecutor(max_workers=8) as pool:
        snaps = list(pool.map(lambda vt: snapshot(git_dir, vt[1]), tags))
    releases = [v for v, _ in tags]
    doc = build(releases, dict(zip(releases, snaps)))
    stats = {"releases": len(releases), "seconds": round(time.monotonic() - started, 2)}
    return dumps(doc), stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.capabilities.mooncake_facts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--git-dir", type=Path, default=DEFAULT_GIT_DIR,
                        help="bare clone of github.com/kvcache-ai/Mooncake (default %(default)s)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    args = parser.parse_args(argv)
    if not (args.git_dir / "HEAD").exists() and not (args.git_dir / ".git").exists():
        parser.error(f"no git repository at {args.git_dir} (clone github.com/kvcache-ai/Mooncake, or pass --git-dir)")
    if args.check:  # the releases the committed file covers: a new upstream tag is not drift
        committed = json.loads(OUTPUT.read_text())["releases"] if OUTPUT.exists() else None
        return check_committed(OUTPUT, generate(args.git_dir, only=committed)[0], str(OUTPUT.relative_to(REPO)),
                               "make capabilities-mooncake")
    text, stats = generate(args.git_dir)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(REPO)}: {json.dumps(stats)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
