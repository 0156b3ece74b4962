"""The options `vllm serve` accepts in one release: every option string its argparse parser knows.

Section "serve_flags" of a snapshot: option ("--max-model-len", "-tp", "--no-enforce-eager") ->
  values: {option (the long name of its add_argument call: the one to suggest), deprecated (vLLM
  warns and still takes it), file, line (the add_argument call, or the dataclass field it comes from)}

Read with ast, starting where `vllm serve` builds its parser (ServeSubcommand.subparser_init in
vllm/entrypoints/cli/serve.py) and following every call that is handed the parser: make_arg_parser
(vllm/entrypoints/openai/cli_args.py, launchers/ or common/ in later releases), FrontendArgs.add_cli_args
(a loop over the dataclass fields: --field-name each), AsyncEngineArgs / EngineArgs.add_cli_args
(vllm/engine/arg_utils.py: explicit add_argument calls with **get_kwargs(SomeConfig)["field"]). A field
whose type holds `bool` gets argparse.BooleanOptionalAction from get_kwargs, so `--no-x` too (unless
its kwargs' action is overridden). argparse adds -h/--help. Deprecated: `deprecated=True`, an action
class named Deprecated*, or help starting "[DEPRECATED]".
"""

from __future__ import annotations

import ast

from tools.capabilities.source import SourceTree, find_class, imported_names, loc, own_nodes, str_const

SERVE = "vllm/entrypoints/cli/serve.py"
ARG_UTILS = "vllm/engine/arg_utils.py"
_DECORATORS = ("dataclass", "config", "pydantic_dataclass")  # what makes a field type a nested config


class _Walker:
    """Follows the parser through the functions it is handed to, collecting add_argument calls."""

    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self.found: dict[str, dict] = {}
        self.seen: set[tuple[str, int, str]] = set()
        utils = tree.parse(ARG_UTILS)
        # 0.32's get_kwargs: a `bool | str | None` field takes an optional value, no --no-x form
        self.bool_str_is_value = bool(utils) and "{bool, str, type(None)}" in ast.unparse(utils)

    # -- resolution ---------------------------------------------------------------------
    def _class(self, path: str, name: str) -> tuple[str, ast.ClassDef] | None:
        module = self.tree.parse(path)
        if module is None:
            return None
        cls = find_class(module, name)
        if cls is not None:
            return path, cls
        origin = imported_names(path, module).get(name)
        target = self.tree.module_file(origin[0]) if origin else None
        if target and target != path:
            return self._class(target, origin[1])
        return None

    def _function(self, path: str, name: str) -> tuple[str, ast.FunctionDef] | None:
        module = self.tree.parse(path)
        if module is None:
            return None
        for node in module.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return path, node
        origin = imported_names(path, module).get(name)
        target = self.tree.module_file(origin[0]) if origin else None
        return self._function(target, origin[1]) if target and target != path else None

    def _bases(self, path: str, cls: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
        """The class and its bases found in the tree, the class first (method resolution order)."""
        chain = [(path, cls)]
        for base in cls.bases:
            found = self._class(path, ast.unparse(base)) if isinstance(base, ast.Name) else None
            if found is not None:
                chain += self._bases(*found)
        return chain

    def _method(self, path: str, cls: ast.ClassDef, name: str) -> tuple[str, ast.FunctionDef, ast.ClassDef] | None:
        for where, klass in self._bases(path, cls):
            for node in klass.body:
                if isinstance(node, ast.FunctionDef) and node.name == name:
                    return where, node, klass
        return None

    def fields(self, path: str, cls: ast.ClassDef) -> list[tuple[str, ast.AnnAssign, str]]:
        """(name, statement, file) of a dataclass's fields, bases first as dataclasses order them."""
        out: dict[str, tuple[str, ast.AnnAssign, str]] = {}
        for where, klass in reversed(self._bases(path, cls)):
            for stmt in klass.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                        and "ClassVar" not in ast.unparse(stmt.annotation):
                    out[stmt.target.id] = (stmt.target.id, stmt, where)
        return list(out.values())

    def is_bool_field(self, path: str, stmt: ast.AnnAssign) -> bool:
        """get_kwargs gives this field BooleanOptionalAction (--x and --no-x)."""
        members = _union(stmt.annotation)
        names = {ast.unparse(m) for m in members}
        if "bool" not in names:
            return False
        if self.bool_str_is_value and names - {"None"} == {"bool", "str"}:
            return False
        return not any(self._is_config(path, name) for name in names - {"bool", "None"})

    def _is_config(self, path: str, name: str) -> bool:
        found = self._class(path, name) if name.isidentifier() else None
        return found is not None and any(ast.unparse(d).split("(")[0].split(".")[-1] in _DECORATORS
                                         for d in found[1].decorator_list)

    # -- walking ------------------------------------------------------------------------
    def walk(self, path: str, func: ast.FunctionDef, owner: tuple[str, ast.ClassDef] | None) -> None:
        key = (path, func.lineno, owner[1].name if owner else "")
        if key in self.seen:
            return
        self.seen.add(key)
        parents = {child: node for node in ast.walk(func) for child in ast.iter_child_nodes(node)}
        kwargs = _kwargs_vars(func)
        overrides = _action_overrides(func)
        for node in sorted((n for n in own_nodes(func) if isinstance(n, ast.Call)), key=lambda n: n.lineno):
            if isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                self._add_argument(path, node, parents, kwargs, overrides, owner)
            elif any(_parser_like(arg) for arg in [*node.args, *(k.value for k in node.keywords)]):
                self._follow(path, node, owner)

    def _follow(self, path: str, call: ast.Call, owner: tuple[str, ast.ClassDef] | None) -> None:
        """Walk the function a call hands the parser to, when its code is in the tree."""
        target = call.func
        if isinstance(target, ast.Name):
            found = self._function(path, target.id)
            if found is not None:
                self.walk(*found, None)
            return
        if not isinstance(target, ast.Attribute):
            return
        base = target.value
        klass: tuple[str, ast.ClassDef] | None = None
        if isinstance(base, ast.Name) and base.id in ("cls", "self"):
            klass = owner
        elif isinstance(base, ast.Name):
            klass = self._class(path, base.id)
        if klass is None:
            return
        method = self._method(*klass, target.attr)
        if method is not None:
            self.walk(method[0], method[1], klass)

    def _add_argument(self, path: str, call: ast.Call, parents: dict, kwargs: dict[str, ast.expr],
                      overrides: dict[tuple[str, str], bool], owner: tuple[str, ast.ClassDef] | None) -> None:
        deprecated = _deprecated(call)
        boolean = any(k.arg == "action" and ast.unparse(k.value).endswith("BooleanOptionalAction")
                      for k in call.keywords)
        splat = next((k.value for k in call.keywords if k.arg is None), None)
        field = _field_of(splat)
        if field is not None and not boolean:
            boolean = self._splat_is_bool(path, kwargs.get(field[0]), field[1], owner) \
                and overrides.get(field, True)
        constants = [str_const(arg) for arg in call.args if str_const(arg) is not None]
        if constants:  # one call: its aliases share the long name ("-tp" -> --tensor-parallel-size)
            self._record(constants, call, path, deprecated, boolean)
        for arg in call.args:
            if isinstance(arg, ast.Name):
                self._record(_loop_values(arg.id, call, parents), call, path, deprecated, boolean)
            elif isinstance(arg, ast.JoinedStr):
                self._dataclass_loop(path, call, parents, kwargs, overrides, owner, deprecated)

    def _splat_is_bool(self, path: str, source: ast.expr | None, name: str,
                       owner: tuple[str, ast.ClassDef] | None) -> bool:
        klass = self._kwargs_class(path, source, owner)
        if klass is None:
            return False
        field = next((f for f in self.fields(*klass) if f[0] == name), None)
        return field is not None and self.is_bool_field(field[2], field[1])

    def _kwargs_class(self, path: str, source: ast.expr | None,
                      owner: tuple[str, ast.ClassDef] | None) -> tuple[str, ast.ClassDef] | None:
        """The class of `X = get_kwargs(Cls)` (`cls`: the class the method runs for)."""
        if not (isinstance(source, ast.Call) and source.args and isinstance(source.args[0], ast.Name)):
            return None
        name = source.args[0].id
        return owner if name == "cls" else self._class(path, name)

    def _dataclass_loop(self, path: str, call: ast.Call, parents: dict, kwargs: dict[str, ast.expr],
                        overrides: dict[tuple[str, str], bool], owner: tuple[str, ast.ClassDef] | None,
                        deprecated: bool) -> None:
        """`for key, value in X.items(): add_argument(f"--{key.replace('_', '-')}", **value)`."""
        loop = _enclosing_for(call, parents)
        if loop is None or not isinstance(loop.iter, ast.Call) or not isinstance(loop.iter.func, ast.Attribute):
            return
        source = loop.iter.func.value
        if not isinstance(source, ast.Name):
            return
        klass = self._kwargs_class(path, kwargs.get(source.id), owner)
        if klass is None:
            return
        methods = [n for _, c in self._bases(*klass) for n in c.body if isinstance(n, ast.FunctionDef)]
        for method in methods:
            overrides = {**_action_overrides(method), **overrides}
        for name, stmt, where in self.fields(*klass):
            boolean = self.is_bool_field(where, stmt) and overrides.get((None, name), True)
            self._record(["--" + name.replace("_", "-")], stmt, where, deprecated, boolean)

    def _record(self, flags: list[str], node: ast.AST, path: str, deprecated: bool, boolean: bool) -> None:
        flags = [f for f in flags if f.startswith("-")]
        longs = [f for f in flags if f.startswith("--")]
        main = longs[-1] if longs else (flags[0] if flags else None)
        if main is None:
            return
        fact = {"option": main, "deprecated": deprecated, **loc(path, node)}
        for flag in flags:
            self.found.setdefault(flag, fact)
        if boolean:  # BooleanOptionalAction adds --no-x for every --x
            for flag in longs:
                self.found.setdefault("--no-" + flag[2:], {**fact, "option": "--no-" + main[2:]})


def _union(annotation: ast.expr) -> list[ast.expr]:
    """The members of `A | B`, Optional[A], Union[A, B], Annotated[A, ...] (a string annotation parsed)."""
    if str_const(annotation) is not None:
        try:
            annotation = ast.parse(str_const(annotation), mode="eval").body
        except SyntaxError:
            return [annotation]
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return _union(annotation.left) + _union(annotation.right)
    if isinstance(annotation, ast.Subscript):
        head = ast.unparse(annotation.value).split(".")[-1]
        inner = annotation.slice
        items = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        if head == "Optional":
            return _union(items[0]) + [ast.Constant(None)]
        if head == "Union":
            return [m for item in items for m in _union(item)]
        # pydantic's SkipValidation[X] is Annotated[X, SkipValidation()]: vLLM's get_type_hints
        # unwraps both (engine/arg_utils.py:134-148 in 0.10.2), so a SkipValidation[bool] field
        # gets BooleanOptionalAction and its --no-x (--no-enable-chunked-prefill, 0.9.1-0.11.0)
        if head in ("Annotated", "SkipValidation"):
            return _union(items[0])
    return [annotation]


def _parser_like(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id.endswith("parser")


def _kwargs_vars(func: ast.FunctionDef) -> dict[str, ast.expr]:
    """name -> value of `name = get_kwargs(...)` assignments (and `= cls._customize...(name)` keeps it)."""
    out: dict[str, ast.expr] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                and isinstance(node.value, ast.Call) and ast.unparse(node.value.func).endswith("get_kwargs"):
            out[node.targets[0].id] = node.value
    return out


def _action_overrides(func: ast.FunctionDef) -> dict[tuple[str | None, str], bool]:
    """(kwargs var, field) -> still BooleanOptionalAction, for `X["f"]["action"] = ...` / `del X["f"]["action"]`.
    Keyed also with var None (a class's customize hook renames the dict)."""
    out: dict[tuple[str | None, str], bool] = {}
    for node in ast.walk(func):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else []
        for target in targets:
            if isinstance(target, ast.Subscript) and str_const(target.slice) == "action" \
                    and isinstance(target.value, ast.Subscript) and isinstance(target.value.value, ast.Name) \
                    and str_const(target.value.slice):
                still = isinstance(node, ast.Assign) and ast.unparse(node.value).endswith("BooleanOptionalAction")
                field = str_const(target.value.slice)
                out[(target.value.value.id, field)] = out[(None, field)] = still
    return out


def _field_of(splat: ast.expr | None) -> tuple[str, str] | None:
    """(var, field) of `**var["field"]` (also `**{**var["field"], "default": None}`)."""
    if isinstance(splat, ast.Dict):
        return next((_field_of(v) for k, v in zip(splat.keys, splat.values) if k is None), None)
    if isinstance(splat, ast.Subscript) and isinstance(splat.value, ast.Name) and str_const(splat.slice):
        return splat.value.id, str_const(splat.slice)
    return None


def _enclosing_for(node: ast.AST, parents: dict) -> ast.For | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.For):
            return node
    return None


def _loop_values(name: str, call: ast.Call, parents: dict) -> list[str]:
    """The constants a loop variable takes: `for arg, type in [("--a", str), ...]: add_argument(arg)`."""
    loop = _enclosing_for(call, parents)
    if loop is None or not isinstance(loop.iter, (ast.List, ast.Tuple)):
        return []
    target = loop.target
    index = None
    if isinstance(target, ast.Name) and target.id == name:
        index = -1
    elif isinstance(target, ast.Tuple):
        index = next((i for i, t in enumerate(target.elts) if isinstance(t, ast.Name) and t.id == name), None)
    if index is None:
        return []
    values = [item if index == -1 else (item.elts[index] if isinstance(item, ast.Tuple) else None)
              for item in loop.iter.elts]
    return [str_const(v) for v in values if str_const(v) is not None]


def _deprecated(call: ast.Call) -> bool:
    for keyword in call.keywords:
        text = ast.unparse(keyword.value)
        if keyword.arg == "deprecated" and text == "True":
            return True
        if keyword.arg == "action" and text.split(".")[-1].startswith("Deprecated"):
            return True
        if keyword.arg == "help" and _help_text(keyword.value).lstrip("(").upper().startswith("[DEPRECATED]"):
            return True
    return False


def _help_text(node: ast.expr) -> str:
    if isinstance(node, ast.JoinedStr):
        return "".join(str_const(v) or "" for v in node.values)
    return str_const(node) or ""


def _serve_root(tree: SourceTree) -> tuple[ast.ClassDef, ast.FunctionDef] | None:
    module = tree.parse(SERVE)
    for node in ast.walk(module) if module else ():
        if isinstance(node, ast.ClassDef):
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "subparser_init"), None)
            if init is not None and "make_arg_parser" in ast.unparse(init):
                return node, init
    return None


def extract(tree: SourceTree) -> dict:
    """The "serve_flags" section of one release's snapshot (empty where there is no serve command)."""
    root = _serve_root(tree)
    if root is None:
        return {}
    cls, init = root
    walker = _Walker(tree)
    walker.walk(SERVE, init, (SERVE, cls))
    # argparse's own -h/--help (add_help=True: the subparser vllm serve creates)
    walker._record(["-h", "--help"], init, SERVE, False, False)
    return {flag: {"values": fact} for flag, fact in sorted(walker.found.items())}
