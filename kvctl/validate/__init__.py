"""Check the configs people have against a vLLM release, and report every problem found, each with
where it is (file:line), what is wrong and how to fix it.

    readers/      one reader per input format -> located Artifacts (model.py)
    kv_config.py  checks of a kv_transfer_config        mooncake_file.py  of a mooncake.json
    env.py        of the servers' environment           lmcache.py        of an LMCache config
    bundle.py     of a rendered bundle as a whole       verl.py           what verl does on top

Version facts come only from kvctl.facts.capabilities. Core library: no printing, no CLI imports, and
never imports vllm, torch or mooncake (validate must run on a control node without them).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from kvctl.errors import UsageError
from kvctl.facts.kv_transfer import connector_names
from kvctl.facts.versions import parse_version
from kvctl.validate.env import validate_env
from kvctl.validate.kv_config import validate_kv_transfer_config, version_notes
from kvctl.validate.lmcache import validate_lmcache_config
from kvctl.validate.model import ERROR, WARNING, Artifact, Problem, SourceLines, ValidationReport, locate
from kvctl.validate.mooncake_file import validate_mooncake_config
from kvctl.validate.offloading_args import check_offloading_args
from kvctl.validate.python_api import check_python_api
from kvctl.validate.readers import not_found, read
from kvctl.validate.serve_flags import check_serve_args
from kvctl.validate.unknown import unread_values
from kvctl.validate.verl import check_verl, check_verl_kv_transfer_config, with_verl_fixes
from kvctl.validate.readers.documents import node_lines, parse_document
from kvctl.validate.readers.env_file import read_env_file

__all__ = [
    "ERROR", "WARNING", "Problem", "SourceLines", "ValidationReport", "load_kv_transfer_config",
    "node_lines", "parse_document", "read_env_file", "validate_env", "validate_kv_transfer_config",
    "validate_mooncake_config", "validate_path",
]


def validate_path(path: Path, version: Version | str, *, allow_dropped: bool = False) -> ValidationReport:
    """Validate every config in a file (any format kvctl reads) or a rendered bundle folder.

    Settings vLLM silently drops (Problem.dropped) are errors unless `allow_dropped`.

    UsageError (exit 2) when the input cannot be read or holds nothing kvctl can validate.
    """
    v, path = parse_version(version), Path(path)
    found = read(path)
    if not found.artifacts and not found.problems:
        raise not_found(path)
    report = ValidationReport(str(path), found.format, str(v), list(found.problems))
    report.problems += version_notes(v, str(path))
    names = tuple(n for a in found.artifacts if a.kind == "kv_transfer_config"
                  for n in connector_names(a.data))
    for artifact in found.artifacts:
        report.found.append(_describe(artifact))
        report.unread += [u for u in unread_values(artifact) if u not in report.unread]
        report.problems += _check(artifact, v, artifact.readers or names)
        report.problems += check_python_api(artifact, v)
        report.problems += _comments(artifact, v, artifact.readers or names)
    if found.format == "bundle":
        from kvctl.validate.bundle import check_bundle

        env = next(((a.data, a.lines) for a in found.artifacts if a.kind == "env"), None)
        report.problems += check_bundle(path, found.artifacts[0].data, env, names, found.copies)
    if allow_dropped:
        report.allow_dropped()
    return report


def _check(artifact: Artifact, v: Version, names: tuple[str, ...]) -> list[Problem]:
    if artifact.options:  # the launch line's other options, then the config itself
        return check_serve_args(artifact, v) + _check(replace(artifact, options=()), v, names)
    if artifact.kind == "kv_transfer_config" and artifact.framework == "verl":
        return with_verl_fixes(artifact, _check(replace(artifact, framework=""), v, names)) + \
            check_verl_kv_transfer_config(artifact)
    if artifact.kind == "kv_transfer_config":
        return validate_kv_transfer_config(artifact.data, v, artifact.where, artifact.lines,
                                           env=artifact.env, partial=artifact.partial or bool(artifact.unread))
    if artifact.kind == "verl":
        return check_verl(artifact, names, v)
    if artifact.kind == "mooncake":
        return validate_mooncake_config(artifact.data, v, artifact.where, artifact.lines,
                                        readers=names)
    if artifact.kind == "env":
        return validate_env(artifact.data, artifact.where, names, artifact.lines)
    if artifact.kind == "kv_offloading":
        return check_offloading_args(artifact, v)
    return validate_lmcache_config(artifact.data, v, artifact.where, artifact.lines)


def _comments(artifact: Artifact, v: Version, names: tuple[str, ...]) -> list[Problem]:
    """A JSON file with comments, read without them: refused wherever vLLM json.loads it (a
    kv_transfer_config always; a mooncake.json when a connector of `v` reads it)."""
    if not artifact.json_comments:
        return []
    if artifact.kind == "mooncake":
        from kvctl.validate.mooncake_file import reader_of

        who = reader_of(v, names, artifact.data)
        if who.kind == "none":
            return []  # nobody parses it: said already (dropped)
        reader = "LMCache's Mooncake backend" if who.kind == "lmcache" else f"vLLM {v}'s {who.connector}"
    else:
        reader = f"vLLM {v}"
    where = f"{artifact.lines.file}:{artifact.json_comments}"
    return [Problem(where, f"comments are not JSON: {reader} reads this file with json.load, which raises "
                    "JSONDecodeError at start (kvctl read the rest without them)",
                    "remove the comments (# ..., // ...)", ERROR)]


def _describe(artifact: Artifact) -> str:
    where = locate(artifact.where, artifact.lines)
    return f"{artifact.kind} at {where}" + (f" ({artifact.origin})" if artifact.origin else "")


_KIND_NAMES = {"mooncake": "a mooncake.json", "verl": "a verl rollout section"}


def load_kv_transfer_config(path: Path) -> dict[str, Any]:
    """The one kv_transfer_config in a file (any format kvctl reads) or a bundle folder.

    UsageError when there is none (a mooncake.json has none either), or several.
    """
    path = Path(path)
    found = read(path)
    configs = [a for a in found.artifacts if a.kind == "kv_transfer_config"]
    if not configs and found.artifacts:
        kinds = sorted({_KIND_NAMES.get(a.kind, f"an {a.kind} config") for a in found.artifacts})
        raise UsageError(f"{path}: no kv_transfer_config in it: it holds {' and '.join(kinds)}",
                         "give the kv_transfer_config (or a launch line, verl config, manifest or "
                         "bundle holding one)")
    if not configs:
        raise not_found(path)
    if len({repr(a.data) for a in configs}) > 1:
        raise UsageError(f"{path}: holds {len(configs)} different kv_transfer_configs: "
                         + "; ".join(_describe(a) for a in configs),
                         "give a file with one, or check them all with kvctl config validate")
    return configs[0].data
