"""HTTP routes of the OpenAI API server (and its routers) plus the engine client's reset methods."""

from __future__ import annotations

import ast

from tools.capabilities.source import SourceTree, callee_name, find_class, functions, imported_names, loc, \
    module_name, own_nodes, str_const

ROUTES = ("/reset_prefix_cache", "/reset_mm_cache", "/reset_encoder_cache", "/pause", "/resume",
          "/is_paused", "/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/server_info",
          # the weight-update surface (kvctl weights): version label, its reader, per-worker checksums
          "/update_weight_version", "/weight_info", "/weight_checker",
          # vLLM's native weight transfer (a trainer pushes tensors, e.g. over NCCL) and the abort of
          # in-flight requests RL loops use beside /pause
          "/init_weight_transfer_engine", "/update_weights", "/start_weight_update", "/finish_weight_update",
          "/abort_requests")
METHODS = {"get", "post", "put", "delete", "patch"}
DEV_FLAG = "VLLM_SERVER_DEV_MODE"
ENTRY = "vllm/entrypoints/"
ENGINE_FILES = ("vllm/engine/protocol.py", "vllm/v1/engine/async_llm.py")
ENGINE_CORE = "vllm/v1/engine/core.py"
ENGINE_TYPES = "vllm/v1/engine/__init__.py"  # PauseMode = Literal[...]


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
        choices = _literal_values(arg.annotation)
        if choices:
            out[arg.arg]["choices"] = {"values": {"value": choices, **loc(path, arg)}}
        deprecated = _deprecated(handler, path, arg.arg)
        if deprecated:
            out[arg.arg]["deprecated"] = {"values": deprecated}
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


def _literal_values(annotation: ast.expr | None) -> list[str] | None:
    """`Annotated[Literal["a", "b"], Body(embed=True)]` or `Literal["a", "b"]` -> ["a", "b"] (sorted)."""
    for node in ast.walk(annotation) if annotation is not None else ():
        if isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] == "Literal":
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            values = [str_const(i) for i in items]
            return sorted(v for v in values if v is not None) or None
    return None


def _deprecated(handler: ast.AST, path: str, name: str) -> dict | None:
    """A parameter the handler's docstring marks `name: DEPRECATED. ...`: that line (whitespace
    folded), where it sits, and the call the handler still passes the parameter to (None: it is
    read but passed nowhere, i.e. ignored)."""
    doc = ast.get_docstring(handler, clean=False) if isinstance(handler, (ast.FunctionDef, ast.AsyncFunctionDef)) \
        else None
    if not doc:
        return None
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        text = line.strip()
        if text.startswith(f"{name}:") and "DEPRECATED" in text:
            # the entry runs on over its indented continuation lines
            indent = len(line) - len(line.lstrip())
            more = [c.strip() for c in _continuation(lines[i + 1:], indent)]
            body = handler.body[0]  # type: ignore[attr-defined]
            return {"value": " ".join([text, *more]), "forwarded_to": _forwarded_to(handler, name),
                    "file": path, "line": body.lineno + i}
    return None


def _continuation(lines: list[str], indent: int) -> list[str]:
    out = []
    for line in lines:
        if not line.strip() or len(line) - len(line.lstrip()) <= indent:
            break
        out.append(line)
    return out


def _forwarded_to(handler: ast.AST, name: str) -> str | None:
    """The callee the handler passes `name` to (`engine.pause_generation`), if any."""
    for node in own_nodes(handler):
        if isinstance(node, ast.Call):
            passed = list(node.args) + [k.value for k in node.keywords]
            if any(isinstance(a, ast.Name) and a.id == name for a in passed):
                return ast.unparse(node.func)
    return None


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
    """Each route's handler. Where several files decorate one path (/abort_requests 0.26-0.31: the
    tokens-only scale-out router's and the dev RL router's), a dev-only handler wins (vLLM attaches
    the dev routers first, and kvctl talks to dev-mode servers), then the first file in path order."""
    index = RouteIndex(tree)
    out: dict = {}
    for path in sorted(index.guards):
        for handler in functions(tree.parse(path)):
            for deco in handler.decorator_list:
                found = _route_of(deco)
                if found is None:
                    continue
                route, method, router = found
                dev_only = index.dev_only(path, handler, router)
                if route in out and (out[route]["spans"]["dev_only"] or not dev_only):
                    continue
                entry: dict = {"spans": {"method": method, "dev_only": dev_only, **loc(path, deco)},
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
    chat_salt = completion_field(tree, "cache_salt", "ChatCompletionRequest")
    if chat_salt is not None:
        out["chat_completions.cache_salt"] = {"spans": chat_salt}
    rejects = paused_rejection(tree)
    if rejects is not None:
        out["pause.rejects_new_requests"] = rejects
    zero = zero_cached_tokens_reported(tree)
    if zero is not None:
        out["completions.zero_cached_tokens_reported"] = {"spans": zero}
    return out


def paused_rejection(tree: SourceTree) -> dict | None:
    """EngineCore._reject_add_while_paused (0.33+): a new request that arrives while a user pause
    is in force is finished at once with a RequestError (code, retryable) instead of being queued.
    `modes`: the PauseMode values for which pause_generation sets the flag it checks, evaluated from
    the assignment (`self.reject_new_requests = mode != "keep"`) over PauseMode's Literal."""
    module = tree.parse(ENGINE_CORE) if ENGINE_CORE in tree.files else None
    reject = next((f for f in functions(module) if f.name == "_reject_add_while_paused"), None) if module else None
    if reject is None:
        return None
    error: dict = {}
    for node in own_nodes(reject):
        if isinstance(node, ast.Call) and callee_name(node) == "RequestError":
            for kw in node.keywords:
                if kw.arg == "code":
                    error["error_code"] = str_const(kw.value)
                elif kw.arg == "retryable" and isinstance(kw.value, ast.Constant):
                    error["retryable"] = kw.value.value
                elif kw.arg == "message":
                    error["message"] = str_const(kw.value)
    fact: dict = {"spans": {**error, **loc(ENGINE_CORE, reject)}}
    flag = _flag_checked(reject)
    modes = _pause_modes(tree)
    for func in functions(module):
        arg_names = [a.arg for a in func.args.args + func.args.kwonlyargs]
        if "mode" not in arg_names or flag is None:
            continue
        for node in own_nodes(func):
            if isinstance(node, ast.Assign) and any(ast.unparse(t) == f"self.{flag}" for t in node.targets):
                rejecting = [m for m in modes if _mode_test(node.value, m)]
                if modes and rejecting is not None:
                    fact["modes"] = {"values": {"value": sorted(rejecting), "set_by": func.name,
                                                "test": ast.unparse(node.value), **loc(ENGINE_CORE, node)}}
                break
    return fact


def _flag_checked(func: ast.AST) -> str | None:
    """The `self.X` attribute a rejecting function tests (`not self.reject_new_requests`)."""
    for node in own_nodes(func):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and isinstance(node.operand, ast.Attribute) \
                and ast.unparse(node.operand.value) == "self":
            return node.operand.attr
    return None


def _pause_modes(tree: SourceTree) -> list[str]:
    module = tree.parse(ENGINE_TYPES) if ENGINE_TYPES in tree.files else None
    for node in module.body if module else ():
        if isinstance(node, ast.Assign) and any(ast.unparse(t) == "PauseMode" for t in node.targets):
            return _literal_values(node.value) or []
    return []


def _mode_test(test: ast.expr, mode: str) -> bool:
    """Evaluate `mode != "keep"`, `mode == "x"`, `mode in ("a", "b")` (and `not in`) for one mode;
    anything else counts as rejecting (the safe reading for kvctl: it then avoids that mode)."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and ast.unparse(test.left) == "mode":
        op, right = test.ops[0], test.comparators[0]
        if isinstance(op, (ast.Eq, ast.NotEq)) and str_const(right) is not None:
            return (mode == str_const(right)) == isinstance(op, ast.Eq)
        if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            return (mode in {str_const(e) for e in right.elts}) == isinstance(op, ast.In)
    return True


def completion_field(tree: SourceTree, field: str, request: str = "CompletionRequest") -> dict | None:
    """Where the OpenAI CompletionRequest (POST /v1/completions; ChatCompletionRequest: POST
    /v1/chat/completions) declares `field`, if it does (cache_salt: a per-request salt of the
    prefix-cache block hashes)."""
    for path in sorted(tree.under("vllm/entrypoints/openai/")):
        module = tree.parse(path)
        for node in ast.walk(module) if module else ():
            if isinstance(node, ast.ClassDef) and node.name == request:
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                            and item.target.id == field:
                        return loc(path, item)
    return None


DETAILS_FLAG = "enable_prompt_tokens_details"
CACHED_COUNT = "num_cached_tokens"


def zero_cached_tokens_reported(tree: SourceTree) -> dict | None:
    """Where /v1/completions fills usage.prompt_tokens_details even when 0 tokens were cached: every
    `if self.enable_prompt_tokens_details and ...num_cached_tokens...` of the module defining
    OpenAIServingCompletion tests `... num_cached_tokens is not None` (0.24.0+). Before, the test
    was the count's truth (`and num_cached_tokens:`), so a 0 left the details null, as a server
    without --enable-prompt-tokens-details answers. The first such `if` (streaming or not) is
    the location; one truth test left anywhere in the module means the fact does not hold."""
    for path in sorted(tree.under("vllm/entrypoints/openai/")):
        module = tree.parse(path)
        if module is None or find_class(module, "OpenAIServingCompletion") is None:
            continue
        guards = [n for n in ast.walk(module) if isinstance(n, ast.If) and _details_guard(n.test) is not None]
        if guards and all(_details_guard(n.test) for n in guards):
            return loc(path, min(guards, key=lambda n: n.lineno))
        return None
    return None


def _details_guard(test: ast.expr) -> bool | None:
    """For `self.enable_prompt_tokens_details and <...>`: whether its num_cached_tokens operand is
    `X.num_cached_tokens is not None` (True) or a truth test (False); None for any other test."""
    if not (isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And)):
        return None
    if not any(ast.unparse(v) == f"self.{DETAILS_FLAG}" for v in test.values):
        return None
    counts = [v for v in test.values if CACHED_COUNT in ast.unparse(v)]
    if not counts:
        return None
    return all(_is_not_none(v) for v in counts)


def _is_not_none(node: ast.expr) -> bool:
    """`num_cached_tokens is not None` or `x.num_cached_tokens is not None`."""
    return (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.IsNot)
            and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None
            and _ends_in_count(node.left))


def _ends_in_count(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == CACHED_COUNT) or \
        (isinstance(node, ast.Attribute) and node.attr == CACHED_COUNT)
