"""Option and argument coercion for kvctl's plain types, without pydantic.

Why: Typer >= 0.26 coerces every parameter value that is not None (and is not a bool flag's bool)
through a pydantic TypeAdapter. ``_TyperParameter.process_value`` calls ``get_runtime_param()``,
which calls ``typer.core.build_runtime_param``, which imports pydantic and builds an adapter
(typer/_adapters.py); it does so even for an option left unset, since None is only handled after
the build. Importing pydantic and building one adapter costs 70-110 ms, on commands that otherwise
start in 110-130 ms: measured with Typer 0.29.2, ``kvctl compat check --vllm-version 0.23.0`` takes
0.18 s with Typer's own coercion and 0.11 s with this one, ``kvctl reset --dry-run --url ...
--retries 0`` 0.23 s and 0.17 s. Close to 40 % of kvctl's start-up, to turn "8" into 8.

What: ``install()`` wraps the ``build_runtime_param`` that ``typer.core`` calls.

* ``str``, ``int``, ``float``, ``bool``, ``pathlib.Path`` (with no path checks asked for), Enum
  and Literal choices (through Typer's own ``coerce_cli_choice``, which its adapter calls inside
  pydantic), and ``list``/``tuple`` of those: ``FastRuntimeParam`` coerces them itself, to the
  same values as Typer's adapters, with click's classic messages for bad numbers
  (``Invalid value for '--concurrency': 'abc' is not a valid integer.``, exit code 2).
* Everything else (``min``/``max``/``clamp``, a custom ``parser``, datetime, files, path
  checks, any other type) falls back to Typer's own coercion, pydantic and all:
  Typer's original ``build_runtime_param`` is called for it, only once a value needs it (an unset
  option does not). So does a value of a shape the fast path does not know (bytes for an int, a
  str for a bool, ...).

With a Typer older than 0.26 (which does not use pydantic for this), or one whose internals moved,
``install()`` does nothing and Typer works as it always has.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args, get_origin

__all__ = ["install"]

_MARK = "_kvctl_fast_coercion"
_DEFER = object()  # "not a value shape the fast path knows": use Typer's own coercion
# pydantic's lax int-from-str: optional sign, ASCII digits with single underscores between them,
# an optional all-zero fraction ("12.0"); surrounding whitespace stripped
_INT_RE = re.compile(r"[+-]?[0-9](?:_?[0-9])*(?:\.0+)?")
_PATH_DEFAULTS = {"exists": False, "file_okay": True, "dir_okay": True, "writable": False, "readable": True,
                  "resolve_path": False, "allow_dash": False, "path_type": None}
_LEAVES = (str, int, float, bool, Path)


def install() -> bool:
    """Route kvctl's plain parameter types around pydantic. Idempotent; True when active.

    A no-op (False) with a Typer older than 0.26, or one without the internals this relies on.
    """
    try:
        from typer import _coercion, core
        from typer._click import _compat
        from typer._click.exceptions import BadParameter
        from typer._click.utils import _escape_control_characters
        from typer._param_types import choice_coercion_annotation, coerce_cli_choice, coerce_cli_path

        original = core.build_runtime_param
        base = _coercion.RuntimeParam
        core._TyperParameter.get_runtime_param  # noqa: B018 (the caller this relies on)
        argv_encoding = _compat._get_argv_encoding
    except (ImportError, AttributeError):
        return False
    if getattr(original, _MARK, False):
        return True

    deferred, fast = _param_classes(base, BadParameter, _escape_control_characters, coerce_cli_path, argv_encoding,
                                    choice_coercion_annotation, coerce_cli_choice)

    def build_runtime_param(descriptor: Any) -> Any:
        cls = (fast if _fast_annotation(descriptor.annotation, descriptor.parameter_info, choice_coercion_annotation)
               else deferred)
        return cls(annotation=descriptor.annotation, parameter_info=descriptor.parameter_info,
                   typer_build=lambda: original(descriptor))

    setattr(build_runtime_param, _MARK, True)
    build_runtime_param.__wrapped__ = original  # type: ignore[attr-defined]
    core.build_runtime_param = build_runtime_param
    return True


def _fast_annotation(annotation: Any, info: Any, choices_of: Any) -> bool:
    """Whether kvctl coerces this parameter itself (else Typer's own path, with pydantic)."""
    if getattr(info, "parser", None) is not None:
        return False
    origin = get_origin(annotation)
    if origin is list or origin is tuple:
        args = get_args(annotation)
        if not args or (origin is list and len(args) != 1) or Ellipsis in args:
            return False
        return all(_fast_leaf(a, info, choices_of) for a in args)
    return _fast_leaf(annotation, info, choices_of)


def _fast_leaf(annotation: Any, info: Any, choices_of: Any) -> bool:
    if choices_of(annotation, info) is not None:  # Enum, Literal: Typer's own choice matching, as its adapter
        return True
    if annotation not in _LEAVES:  # exact types: no subclasses (IntEnum, str Enums, PosixPath ...)
        return False
    if annotation is int or annotation is float:
        return getattr(info, "min", None) is None and getattr(info, "max", None) is None \
            and not getattr(info, "clamp", False)
    if annotation is Path:
        return all(hasattr(info, k) and getattr(info, k) == v for k, v in _PATH_DEFAULTS.items())
    return True


def _param_classes(base: type, bad_parameter: type[Exception], escape: Any, coerce_cli_path: Any,
                   argv_encoding: Any, choices_of: Any, coerce_cli_choice: Any) -> tuple[type, type]:
    """DeferredRuntimeParam and FastRuntimeParam: subclasses of this Typer's RuntimeParam (Typer >= 0.26)."""
    import sys
    from dataclasses import dataclass, field

    def decode(value: bytes) -> str:
        # typer._adapters._parse_cli_str
        enc = argv_encoding()
        try:
            return value.decode(enc)
        except UnicodeError:
            fs_enc = sys.getfilesystemencoding()
            if fs_enc != enc:
                try:
                    return value.decode(fs_enc)
                except UnicodeError:
                    pass
            return value.decode("utf-8", "replace")

    def fail(message: str, param: Any, ctx: Any) -> Exception:
        return bad_parameter(escape(message), ctx=ctx, param=param)

    def to_str(value: Any, info: Any, param: Any, ctx: Any) -> Any:
        return decode(value) if isinstance(value, bytes) else str(value)

    def to_int(value: Any, info: Any, param: Any, ctx: Any) -> Any:
        if type(value) is int:
            return value
        if type(value) is not str:  # bool, float, bytes, ...: Typer's own rules
            return _DEFER
        text = value.strip()
        if _INT_RE.fullmatch(text):
            try:
                return int(text.partition(".")[0])
            except ValueError:  # more digits than int() takes (sys.set_int_max_str_digits)
                pass
        raise fail(f"{value!r} is not a valid integer.", param, ctx)

    def to_float(value: Any, info: Any, param: Any, ctx: Any) -> Any:
        if type(value) is float:
            return value
        if type(value) is int:
            try:
                return float(value)
            except OverflowError:
                return _DEFER
        if type(value) is not str:
            return _DEFER
        text = value.strip()
        # as pydantic reads it: float() also takes other scripts' digits, pydantic does not; and it
        # takes underscores only without surrounding whitespace, single, not at either end, but
        # then anywhere ("1_e3")
        if not text.isascii() or ("_" in text and (value != text or "__" in text or text[0] == "_"
                                                   or text[-1] == "_")):
            raise fail(f"{value!r} is not a valid float.", param, ctx)
        try:
            return float(text.replace("_", ""))
        except ValueError:
            raise fail(f"{value!r} is not a valid float.", param, ctx) from None

    def to_bool(value: Any, info: Any, param: Any, ctx: Any) -> Any:
        # a flag's value is a bool already; a str ("yes", "0", from an env var) follows Typer's rules
        return value if type(value) is bool else _DEFER

    def to_path(value: Any, info: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, Path):
            path = value
        elif type(value) is str:
            path = Path(value)
        else:
            return _DEFER
        # Typer's own checks (with default settings: a stat, and "is not readable" for an
        # existing path this user cannot read); no pydantic once the value is a Path
        return coerce_cli_path(path, info, path_type=Path, param=param, ctx=ctx)

    def to_choice(annotation: Any, info: Any) -> Any:
        choices, case_sensitive = choices_of(annotation, info)

        def convert(value: Any, info: Any, param: Any, ctx: Any) -> Any:
            try:  # what Typer's choice adapter calls inside pydantic
                return coerce_cli_choice(value, choices=choices, case_sensitive=case_sensitive, ctx=ctx)
            except ValueError as exc:
                raise fail(str(exc), param, ctx) from None
        return convert

    leaves = {str: to_str, int: to_int, float: to_float, bool: to_bool, Path: to_path}

    def leaf(annotation: Any, info: Any) -> Any:
        return leaves.get(annotation) or to_choice(annotation, info)

    @dataclass(frozen=True)
    class DeferredRuntimeParam(base):  # type: ignore[misc, valid-type]
        """Typer's own runtime param for this parameter, built on the first value that needs it.

        Typer builds it up front, even for an option left unset (None is handled before it is
        used): an unset ``Optional[SomeEnum]`` would import pydantic for nothing.
        """

        typer_build: Any = field(default=None, compare=False, repr=False)
        _built: list[Any] = field(default_factory=list, compare=False, repr=False)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            return self.typer_runtime_param()._coerce_value(value, param=param, ctx=ctx)

        def typer_runtime_param(self) -> Any:
            if not self._built:
                self._built.append(self.typer_build())
            return self._built[0]

    @dataclass(frozen=True)
    class FastRuntimeParam(DeferredRuntimeParam):
        """Coercion of str/int/float/bool/Path and Enum/Literal choices (and lists/tuples of them)
        without pydantic."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            result = self._fast(value, param, ctx)
            if result is _DEFER:
                return self.typer_runtime_param()._coerce_value(value, param=param, ctx=ctx)
            return result

        def _fast(self, value: Any, param: Any, ctx: Any) -> Any:
            annotation, info = self.annotation, self.parameter_info
            origin = get_origin(annotation)
            if origin is list:  # a repeatable option: click gives a tuple, Typer a list
                if not isinstance(value, (list, tuple)):
                    return _DEFER
                convert = leaf(get_args(annotation)[0], info)
                out = [convert(item, info, param, ctx) for item in value]
                return _DEFER if any(item is _DEFER for item in out) else out
            if origin is tuple:
                types = get_args(annotation)
                if not isinstance(value, (list, tuple)) or len(value) != len(types):
                    return _DEFER
                out = [leaf(t, info)(item, info, param, ctx) for t, item in zip(types, value)]
                return _DEFER if any(item is _DEFER for item in out) else tuple(out)
            return leaf(annotation, info)(value, info, param, ctx)

    return DeferredRuntimeParam, FastRuntimeParam
