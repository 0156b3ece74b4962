"""How vLLM's own parser reads the arguments kvctl serve passes through after `--`.

vLLM 0.32's FlexibleArgumentParser (vllm/utils/argparse_utils.py:276-465) over Python's argparse:
- an exact `--config FILE` argument is replaced by the keys of that YAML file, put *before* the whole
  command line (so the command line wins, wherever --config stands; :479-567); a key `k: v` becomes
  `--k v`, `k: true` `--k`, `k: false` `--no-k` (:569-636). `--config=FILE` is not loaded (it is only
  stored: checked with vLLM 0.32's parser), and a second `--config` is an error (:514);
- in `--name` and `--name=value`, underscores before the first `.` become dashes, and `--name.field v`
  sets one field of the JSON option `--name` (:338-465);
- argparse then takes the last of repeated options, an unambiguous prefix of a long option
  (FlexibleArgumentParser keeps allow_abbrev), `-x=v` and `-x v` for short options, a prefix of a
  short option (`-t` for `-tp`), and a value glued to a one-letter option (`-n2`).
Each consumer (kvctl.serve.vllm_launch.owned_flags_in, kvctl.serve.parallel) resolves the option
names it cares about from what `read_args` returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvctl.errors import UsageError

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse reads these as values, not options


@dataclass(frozen=True)
class Arg:
    given: str  # the option as the user wrote it (no value), for messages
    option: str  # as argparse sees it: '--tensor-parallel-size' (dashes, no dotted field) or '-tp'
    value: str | None  # written with '=' (or glued to a one-letter option), else None
    following: str | None  # the next argument when argparse could take it as this option's value
    dotted: bool = False  # --name.field: one field of the JSON option --name


def read_args(extra_args: list[str], every_config_form: bool = False) -> list[Arg]:
    """The options vLLM reads from `extra_args`, in the order argparse sees them: a `--config` file's
    keys first, then the command line. every_config_form: also read the files of `--config=FILE` and
    of abbreviations such as `--conf FILE`, which vLLM 0.32 does not load (a check that must not miss
    a file another release might load)."""
    config: list[Arg] = []
    cli: list[Arg] = []
    exact = [i for i, a in enumerate(extra_args) if a == "--config"]
    if len(exact) > 1:
        raise UsageError("-- --config is given more than once: vLLM reads one config file",
                         "merge the files into one YAML file")
    for i, text in enumerate(extra_args):
        arg = _arg(text, extra_args[i + 1] if i + 1 < len(extra_args) else None)
        if arg is None:
            continue
        if i in exact or (every_config_form and _is_config_option(arg)):
            path = arg.value if arg.value is not None else arg.following
            config += config_file_args(path)
            if i in exact:
                continue
        cli.append(arg)
    return config + cli


def _arg(text: str, following: str | None) -> Arg | None:
    """One command-line argument as argparse sees it, or None for a value, a positional or `--`."""
    if not text.startswith("-") or text in ("-", "--") or _NEGATIVE_NUMBER.match(text):
        return None
    value_next = following if following is not None and _can_be_value(following) else None
    flag, eq, value = text.partition("=")
    if text.startswith("--"):
        name, dot, _ = flag[2:].partition(".")
        return Arg(flag, "--" + name.replace("_", "-"), value if eq else None, value_next, bool(dot))
    return Arg(flag, flag, value if eq else None, value_next)


def _can_be_value(text: str) -> bool:
    return not text.startswith("-") or text == "-" or bool(_NEGATIVE_NUMBER.match(text))


def _is_config_option(arg: Arg) -> bool:
    name = arg.option[2:]
    return arg.option.startswith("--") and len(name) >= 4 and "config".startswith(name)


def config_file_args(path: str | None) -> list[Arg]:
    """The options a vLLM --config YAML file stands for (vllm/utils/argparse_utils.py:569-636)."""
    if not path:
        raise UsageError("-- --config has no file after it", "give the YAML file: -- --config FILE.yaml")
    if path.rsplit(".", 1)[-1] not in ("yaml", "yml"):
        raise UsageError(f"-- --config {path}: vLLM reads only .yaml or .yml config files",
                         "rename the file to end in .yaml")
    out = []
    for key, value in _config_file(path).items():
        given = f"{key!r} in --config {path}"
        name = "--" + str(key).split(".", 1)[0].replace("_", "-")
        if value is True or value is False:
            out.append(Arg(given, name if value else "--no-" + name[2:], None, None))
        else:
            out.append(Arg(given, name, _config_value(value), None, "." in str(key)))
    return out


def _config_value(value: Any) -> str:
    import json

    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, list):  # `--key item ...`: the first item is what a one-value option reads
        return str(value[0]) if value else ""
    return str(value)


def _config_file(path: str) -> dict[Any, Any]:
    from kvctl import yamlio

    try:
        data = yamlio.safe_load(Path(path).expanduser().read_text("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"-- --config {path}: cannot read it ({exc})",
                         "kvctl reads the file for what it sets (the flags kvctl serve owns, the parallel "
                         "sizes): give a readable YAML file") from None
    except Exception as exc:  # noqa: BLE001 - any YAML error: vLLM would refuse the file too
        raise UsageError(f"-- --config {path}: not valid YAML ({exc})") from None
    return data if isinstance(data, dict) else {}


def option_value(arg: Arg) -> str | None:
    """The value argparse gives an option that takes one: after '=', else the next argument."""
    return arg.value if arg.value is not None else arg.following
