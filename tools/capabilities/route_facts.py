"""HTTP routes of the OpenAI API server (and its routers) plus the engine client's reset methods."""

from __future__ import annotations

import ast

from tools.capabilities.source import SourceTree, callee_name, functions, imported_names, loc, module_name, \
    own_nodes, str_const

ROUTES = ("/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/pause", "/resume",
          "/is_paused", "/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/server_info",
          # the weight-update surface (kvctl weights): version label, its reader, per-worker checksums
          "/update_weight_version", "/weight_info", "/weight_checker")
METHODS = {"get", "post", "put", "delete", "patch"}
DEV_FLAG = "VLLM_SERVER_DEV_MODE"
ENTRY = "vllm/entrypoints/"
ENGINE_FILES = ("vllm/engine/protocol.py", "vllm/v1/engine/async_llm.py")


def _route_of(deco: ast.expr) -> tuple[str, str, str] | None:
    """(path, METHOD, router variable) of a `@router.post("/x")` decorator."""
    if isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute) and deco.func.attr in METHODS:
        path = str_const(deco.args[0]) if deco.args else None
        if path in ROUTES:
            return path, deco.func.attr.upper(), ast.unparse(deco.func.value)
    return None


def _guard_chains(tree: ast.Module) -> dict[int, bool]:
    """id(node) -> whether the node only runs when VLLM_SERVER_DEV_MODE is set, lexically:
    inside `if DEV_MODE:`, in the else of `if not DEV_MODE:`, or after `if not DEV_MODE: return`."""
    guarded: dict[int, bool] = {}

    def visit(stmts: list[ast.stmt], flag: bool) -> None:
        for stmt in stmts:
            # Mark the whole statement with the outer flag; nested blocks visited below overwrite it.
            for sub in ast.walk(stmt):
                guarded[id(sub)] = flag
            if isinstance(stmt, ast.If) and DEV_FLAG in ast.unparse(stmt.test):
                negated = isinstance(stmt.test, ast.UnaryOp) and isinstance(stmt.test.op, ast.Not)
                visit(stmt.body, flag or not negated)
                visit(stmt.orelse, flag or negated)
                if negated and stmt.body and isinstance(stmt.body[-1], ast.Return):
                    flag = True  # everything after an early return is dev-only
                continue
            for block in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(stmt, block, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], (ast.stmt, ast.excepthandler)):
                    visit([s for s in inner if isinstance(s, ast.stmt)] or
                          [s for h in inner for s in getattr(h, "body", [])], flag)
    visit(tree.body, False)
    return guarded


class RouteIndex:
    """Entry-point files of one release, with what is needed to decide dev-mode gating."""

    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self.files = [f for f in tree.under(ENTRY)]
        self.guards = {f: _guard_chains(tree.parse(f)) for f in self.files if tree.parse(f)}
        # Parsed once: every lookup below scans all entry-point files.
        self.imports = {f: imported_names(f, tree.parse(f)) for f in self.guards}
        self.calls = {f: [n for n in ast.walk(tree.parse(f)) if isinstance(n, ast.Call)] for f in self.guards}

    def _enclosing(self, path: str, target: ast.AST) -> ast.AST | None:
        """The innermost function holding `target` (by line range, cheap enough per call site)."""
        best = None
        line = getattr(target, "lineno", 0)
        for func in functions(self.tree.parse(path)):
            if func.lineno <= line <= (func.end_lineno or func.lineno):
                if best is None or func.lineno >= best.lineno:
                    best = func
        return best

    def _calls_to(self, module: str, name: str) -> list[tuple[str, ast.Call]]:
        """Call sites of module.name in entry-point files (direct, or through an import alias)."""
        sites = []
        for path in self.guards:
            aliases = {a for a, (m, n) in self.imports[path].items() if m == module and n == name}
            if module_name(path) == module:
                aliases.add(name)
            if not aliases:
                continue
            for node in self.calls[path]:
                if isinstance(node.func, ast.Name) and node.func.id in aliases:
                    sites.append((path, node))
        return sites

    def _site_guarded(self, path: str, node: ast.AST, depth: int) -> bool:
        """A call site runs only in dev mode: lexically, or because every caller of its function does."""
        if self.guards[path].get(id(node)):
            return True
        func = self._enclosing(path, node)
        if func is None or depth > 4:
            return False
        sites = self._calls_to(module_name(path), func.name)
        return bool(sites) and all(self._site_guarded(p, n, depth + 1) for p, n in sites)

    def dev_only(self, path: str, handler: ast.AST, router: str) -> bool:
        if self.guards[path].get(id(handler)):
            return True
        sites = self._includes_of(path, router)
        return bool(sites) and all(self._site_guarded(p, n, 0) for p, n in sites)

    def _includes_of(self, path: str, router: str) -> list[tuple[str, ast.Call]]:
        """`app.include_router(router)` calls for the router object defined in `path`."""
        module = module_name(path)
        sites = []
        for other in self.guards:
            names = {a for a, (m, n) in self.imports[other].items() if m == module and n == router}
            if other == path:
                names.add(router)
            if not names:
                continue
            for node in self.calls[other]:
                if callee_name(node) == "include_router" and node.args:
                    if ast.unparse(node.args[0]) in names:
                        sites.append((other, node))
        return sites


def _params(handler: ast.FunctionDef | ast.AsyncFunctionDef, path: str) -> dict:
    """Query/body parameters a handler reads: its arguments (minus the Request) and
    raw_request.query_params.get("x") / JSON body .get("x") reads."""
    out: dict = {}
    args = handler.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for arg, default in list(zip(positional, defaults)) + list(zip(args.kwonlyargs, args.kw_defaults)):
        annotation = ast.unparse(arg.annotation) if arg.annotation else ""
        if annotation.endswith("Request") or arg.arg == "raw_request":
            continue
        out[arg.arg] = {"spans": {"source": "argument", "default": _param_default(default), **loc(path, arg)}}
    body_vars = {t.id for n in own_nodes(handler) if isinstance(n, ast.Assign)
                 and ".json()" in ast.unparse(n.value) for t in n.targets if isinstance(t, ast.Name)}
    for node in own_nodes(handler):
        if isinstance(node, ast.Call) and callee_name(node) in ("get", "getlist") and node.args and str_const(node.args[0]):
            receiver = ast.unparse(node.func.value) if isinstance(node.func, ast.Attribute) else ""
            source = "query" if receiver.endswith("query_params") else "json body" if receiver in body_vars else None
            if source:
                default = ast.unparse(node.args[1]) if len(node.args) > 1 else None
                out.setdefault(str_const(node.args[0]), {"spans": {"source": source, "default": default, **loc(path, node)}})
    return out


def _param_default(node: ast.expr | None) -> str | None:
    """`Query(default=False)` -> 'False'; plain defaults as written."""
    if node is None:
        return None
    if isinstance(node, ast.Call) and callee_name(node) in ("Query", "Body"):
        for kw in node.keywords:
            if kw.arg == "default":
                return ast.unparse(kw.value)
        return ast.unparse(node.args[0]) if node.args else None
    return ast.unparse(node)


def _answer(handler: ast.AST) -> str:
    """The shapes a handler returns, normalised: an empty 200, or the JSON content it builds."""
    shapes = set()
    for node in own_nodes(handler):
        if isinstance(node, ast.Return):
            shapes.add(_shape(node.value))
    return " | ".join(sorted(shapes)) or "empty 200 (no return)"


def _shape(value: ast.expr | None) -> str:
    if value is None:
        return "empty 200 (None)"
    if isinstance(value, ast.Call) and callee_name(value) == "Response":
        status = next((ast.unparse(k.value) for k in value.keywords if k.arg == "status_code"), "200")
        has_body = value.args or any(k.arg == "content" for k in value.keywords)
        return f"Response {status}" + (" with body" if has_body else " empty")
    if isinstance(value, ast.Call) and callee_name(value) == "JSONResponse":
        content = next((k.value for k in value.keywords if k.arg == "content"), value.args[0] if value.args else None)
        status = next((ast.unparse(k.value) for k in value.keywords if k.arg == "status_code"), None)
        text = "JSON " + (ast.unparse(content) if content is not None else "")
        return text + (f" status={status}" if status else "")
    return ast.unparse(value)


def extract_routes(tree: SourceTree) -> dict:
    index = RouteIndex(tree)
    out: dict = {}
    for path in sorted(index.guards):
        for handler in functions(tree.parse(path)):
            for deco in handler.decorator_list:
                found = _route_of(deco)
                if found is None or found[0] in out:
                    continue  # first file in path order wins; see the report for duplicates
                route, method, router = found
                entry: dict = {"spans": {"method": method, "dev_only": index.dev_only(path, handler, router),
                                         **loc(path, deco)},
                               "answer": {"values": {"value": _answer(handler), **loc(path, handler)}}}
                params = _params(handler, path)
                if params:
                    entry["params"] = params
                out[route] = entry
    return out


def extract_engine(tree: SourceTree) -> dict:
    """Whether the engine client's reset methods exist and reset_prefix_cache takes reset_connector."""
    out: dict = {}
    for path in ENGINE_FILES:
        parsed = tree.parse(path) if path in tree.files else None
        for func in functions(parsed) if parsed else ():
            names = [a.arg for a in func.args.args + func.args.kwonlyargs]
            if func.name in ("reset_mm_cache", "reset_encoder_cache"):
                out.setdefault(func.name, {"spans": loc(path, func)})
            if func.name == "reset_prefix_cache":
                for arg in ("reset_connector", "reset_running_requests"):
                    if arg in names:
                        out.setdefault(f"reset_prefix_cache.{arg}", {"spans": loc(path, func)})
    salt = completion_field(tree, "cache_salt")
    if salt is not None:
        out["completions.cache_salt"] = {"spans": salt}
    return out


def completion_field(tree: SourceTree, field: str) -> dict | None:
    """Where the OpenAI CompletionRequest (POST /v1/completions) declares `field`, if it does
    (cache_salt: a per-request salt of the prefix-cache block hashes)."""
    for path in sorted(tree.under("vllm/entrypoints/openai/")):
        module = tree.parse(path)
        for node in ast.walk(module) if module else ():
            if isinstance(node, ast.ClassDef) and node.name == "CompletionRequest":
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                            and item.target.id == field:
                        return loc(path, item)
    return None
