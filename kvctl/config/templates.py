"""Config templates: YAML files declaring typed parameters and the configs they produce.

A template is data only (yaml.safe_load; no code runs). Values are filled from `${param}`
placeholders: a string that is exactly `${p}` takes p's typed value (and its key is left out
when p is unset); `${p}` inside a longer string is replaced by p's text. `$${` writes `${`.

Built-in templates ship in the package; a folder named by KVCTL_TEMPLATE_PATH (or
--template-path; several joined with os.pathsep) adds templates or overrides built-ins by name.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from kvctl import yamlio
from kvctl.errors import UsageError
from kvctl.facts.kv_transfer import connector_names
from kvctl.facts.sizes import parse_size

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
INT_TEXT = re.compile(r"^\s*[+-]?[0-9]{1,19}\s*$", re.ASCII)

TEMPLATE_PATH_ENV = "KVCTL_TEMPLATE_PATH"
PARAM_TYPES = ("str", "int", "float", "bool", "size", "choice", "path")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_PLACEHOLDER = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


@dataclass(frozen=True)
class Parameter:
    name: str
    type: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()

    def coerce(self, value: Any, where: str) -> Any:
        """The typed value for `value` (a --set string or a YAML default); UsageError if wrong."""
        if value is None:
            return None
        try:
            return _COERCERS[self.type](self, value)
        except (ValueError, TypeError) as exc:
            raise UsageError(
                f"{where}: {self.name} expects {self.describe_type()}, got {value!r}"
                + (f" ({exc})" if str(exc) and self.type == "size" else ""),
                f"e.g. --set {self.name}={self.example()}",
            ) from None

    def describe_type(self) -> str:
        if self.type == "choice":
            return "one of " + "|".join(self.choices)
        return {"size": "a size (bytes or e.g. 256MB)", "bool": "true|false"}.get(self.type, self.type)

    def example(self) -> str:
        examples = {"int": "8", "float": "0.5", "bool": "true", "size": "512MB", "path": "/etc/mooncake.json"}
        if self.type == "choice":
            return self.choices[0]
        return examples.get(self.type, "VALUE")


def _to_bool(_: Parameter, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(value)


def _to_int(_: Parameter, value: Any) -> int:
    if isinstance(value, bool) or not INT_TEXT.match(str(value)):
        raise ValueError(value)  # only ASCII digits: what the programs that read these values accept
    return int(str(value).strip())


def _to_float(_: Parameter, value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(value)
    return float(str(value).strip())


def _to_size(_: Parameter, value: Any) -> int | str:
    parse_size(value)  # raises ValueError with the accepted forms
    return value if isinstance(value, int) else str(value).strip()


def _to_choice(param: Parameter, value: Any) -> str:
    text = str(value).strip()
    if text not in param.choices:
        raise ValueError(value)
    return text


def _to_str(_: Parameter, value: Any) -> str:
    if isinstance(value, (dict, list)):
        raise TypeError(value)
    return str(value)


_COERCERS = {
    "str": _to_str, "path": _to_str, "int": _to_int, "float": _to_float,
    "bool": _to_bool, "size": _to_size, "choice": _to_choice,
}


@dataclass(frozen=True)
class Template:
    name: str
    description: str
    vllm: SpecifierSet  # releases the template is meant for (connector checks come on top)
    parameters: dict[str, Parameter]
    kv_transfer_config: dict[str, Any]
    mooncake: dict[str, Any] | None
    env: dict[str, str]
    origin: str  # "built-in" or the file it came from
    notes: tuple[str, ...] = field(default=())

    def connectors(self) -> list[str]:
        """Every connector named in the layout, MultiConnector children included."""
        return connector_names(self.kv_transfer_config)

    def resolve(self, overrides: dict[str, str]) -> dict[str, Any]:
        """Parameter values: defaults, then `--set` overrides, typed and checked."""
        values = {name: p.default for name, p in self.parameters.items()}
        for key, raw in overrides.items():
            if key not in self.parameters:
                raise UsageError(
                    f"template '{self.name}' has no parameter '{key}'",
                    _did_you_mean(key, self.parameters) + f"see: kvctl config show {self.name}",
                )
            values[key] = self.parameters[key].coerce(raw, f"--set {key}")
        return values


def _did_you_mean(word: str, options: Any) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f"did you mean '{close[0]}'? " if close else ""


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """`--set key=value` pairs into a dict (later wins); UsageError on a missing '='."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set '{pair}' is not key=value", "e.g. --set master=127.0.0.1:50051")
        out[key.strip()] = value
    return out


# -- substitution -------------------------------------------------------------------------
_UNSET = object()


def substitute(node: Any, values: dict[str, Any], where: str = "") -> Any:
    """Fill `${param}` placeholders in a template tree (see module docstring)."""
    if isinstance(node, dict):
        out = {}
        for key, child in node.items():
            filled = substitute(child, values, f"{where}.{key}" if where else str(key))
            if filled is not _UNSET:
                out[key] = filled
        # A mapping emptied by unset parameters is left out, not written as {}.
        return _UNSET if node and not out else out
    if isinstance(node, list):
        items = [substitute(c, values, f"{where}[{i}]") for i, c in enumerate(node)]
        return [i for i in items if i is not _UNSET]
    if isinstance(node, str):
        whole = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", node)
        if whole:
            value = _lookup(whole.group(1), values, where)
            return _UNSET if value is None else value
        return _PLACEHOLDER.sub(lambda m: _interpolate(m, values, where), node)
    return node


def _lookup(name: str, values: dict[str, Any], where: str) -> Any:
    if name not in values:
        raise UsageError(f"template placeholder ${{{name}}} at {where} names no parameter")
    return values[name]


def _interpolate(match: re.Match[str], values: dict[str, Any], where: str) -> str:
    if match.group(0) == "$${":
        return "${"
    value = _lookup(match.group(1), values, where)
    if value is None:
        raise UsageError(
            f"parameter '{match.group(1)}' is unset but {where} needs it",
            f"pass --set {match.group(1)}=...",
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# -- loading ------------------------------------------------------------------------------
def builtin_dir() -> Path:
    """Built-in templates: inside the wheel (kvctl/templates), or the repo's templates/."""
    packaged = Path(str(resources.files("kvctl"))) / "templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "templates"


def search_dirs(template_path: str | None = None) -> list[Path]:
    """User folders first (they override built-ins), then the built-ins."""
    spec = template_path if template_path is not None else os.environ.get(TEMPLATE_PATH_ENV, "")
    dirs = [Path(p).expanduser() for p in spec.split(os.pathsep) if p.strip()]
    for d in dirs:
        if not d.is_dir():
            source = "--template-path" if template_path is not None else TEMPLATE_PATH_ENV
            raise UsageError(f"{source}: '{d}' is not a folder", "point it at a folder of *.yaml templates")
    return dirs + [builtin_dir()]


def discover(template_path: str | None = None) -> dict[str, Path]:
    """Template name -> file; the first folder that defines a name wins."""
    found: dict[str, Path] = {}
    for folder in search_dirs(template_path):
        for path in sorted(folder.glob("*.y*ml")):
            found.setdefault(path.stem, path)
    return found


def load(name: str, template_path: str | None = None) -> Template:
    files = discover(template_path)
    if name not in files:
        raise UsageError(
            f"unknown template '{name}'",
            _did_you_mean(name, files) + "list them with: kvctl config list",
        )
    return load_file(files[name], builtin=files[name].parent == builtin_dir())


def load_all(template_path: str | None = None) -> list[Template]:
    found = discover(template_path)
    return [load_file(found[n], builtin=found[n].parent == builtin_dir()) for n in sorted(found)]


def load_file(path: Path, builtin: bool = False) -> Template:
    try:
        raw = yamlio.safe_load(path.read_text("utf-8"))
    except yaml.YAMLError as exc:
        raise UsageError(f"template {path}: not valid YAML: {exc}", "fix the YAML syntax") from None
    except OSError as exc:
        raise UsageError(f"template {path}: cannot read: {exc.strerror}") from None
    return parse_template(raw, origin="built-in" if builtin else str(path), expected_name=path.stem)


def parse_template(raw: Any, origin: str, expected_name: str | None = None) -> Template:
    """Check a template's structure and build it; UsageError naming the field otherwise."""
    where = f"template {origin}"
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: the top level must be a mapping")
    _require_keys(raw, where, {"name", "description", "kv_transfer_config"},
                  {"vllm", "parameters", "mooncake", "env", "notes"})
    name = raw["name"]
    if not isinstance(name, str) or not _NAME.match(name):
        raise UsageError(f"{where}: name must be lowercase letters, digits, '-', '_' or '.'")
    if expected_name and name != expected_name:
        raise UsageError(f"{where}: name '{name}' differs from its file name '{expected_name}'",
                         f"rename the file to {name}.yaml or set name: {expected_name}")
    try:
        spec = SpecifierSet(str(raw.get("vllm") or ""))
    except InvalidSpecifier:
        raise UsageError(f"{where}: vllm: '{raw.get('vllm')}' is not a version range",
                         "write it like '>=0.21.0'") from None
    params = {k: _parse_param(k, v, where) for k, v in (raw.get("parameters") or {}).items()}
    for key in ("kv_transfer_config",) + (("mooncake",) if raw.get("mooncake") is not None else ()):
        if not isinstance(raw[key], dict):
            raise UsageError(f"{where}: {key} must be a mapping")
    env = raw.get("env") or {}
    if not isinstance(env, dict):
        raise UsageError(f"{where}: env must be a mapping of NAME: value")
    for key in env:
        # rendered into a file that users `source`: anything but a plain name could run commands
        if not isinstance(key, str) or not ENV_NAME.match(key):
            raise UsageError(f"{where}: env name {str(key)!r} is not an environment variable name",
                             "use letters, digits and '_', not starting with a digit")
    template = Template(
        name=name,
        description=str(raw["description"]).strip(),
        vllm=spec,
        parameters=params,
        kv_transfer_config=raw["kv_transfer_config"],
        mooncake=raw.get("mooncake"),
        env={str(k): str(v) for k, v in env.items()},
        origin=origin,
        notes=tuple(str(n) for n in raw.get("notes") or ()),
    )
    # Every placeholder must name a parameter: render the defaults once with dummies.
    dummy = {k: "x" for k in params}
    fill({"k": template.kv_transfer_config, "m": template.mooncake, "e": template.env}, dummy, where)
    return template


def fill(node: Any, values: dict[str, Any], where: str = "") -> Any:
    """substitute() for a whole tree: a tree emptied by unset parameters becomes {}."""
    result = substitute(node, values, where)
    return {} if result is _UNSET else result


def _require_keys(raw: dict[str, Any], where: str, required: set[str], optional: set[str]) -> None:
    missing = sorted(required - raw.keys())
    if missing:
        raise UsageError(f"{where}: missing {', '.join(missing)}")
    unknown = sorted(raw.keys() - required - optional)
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)}",
                         "allowed: " + ", ".join(sorted(required | optional)))


def _parse_param(name: str, raw: Any, where: str) -> Parameter:
    where = f"{where}: parameter '{name}'"
    if not isinstance(raw, dict):
        raise UsageError(f"{where} must be a mapping with type, default and help")
    _require_keys(raw, where, {"type", "help"}, {"default", "choices"})
    ptype = raw["type"]
    if ptype not in PARAM_TYPES:
        raise UsageError(f"{where}: type '{ptype}' is not one of {', '.join(PARAM_TYPES)}")
    choices = tuple(str(c) for c in raw.get("choices") or ())
    if ptype == "choice" and not choices:
        raise UsageError(f"{where}: a choice parameter needs choices")
    param = Parameter(name, ptype, None, str(raw["help"]).strip(), choices)
    default = param.coerce(raw.get("default"), f"{where} default")
    return Parameter(name, ptype, default, param.help, choices)
