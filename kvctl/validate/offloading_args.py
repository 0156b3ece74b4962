"""Checks of vLLM's native KV offloading settings (--kv-offloading-size / --kv-offloading-backend,
kv_offloading_size / kv_offloading_backend keys and keywords) against one vLLM release.

vLLM turns them into a kv_transfer_config itself (VllmConfig._post_init_kv_transfer_config): this
module builds the same config from the release's facts (kvctl/facts/offload_args.py), on top of the
kv_transfer_config the same command sets, and checks it as vLLM would run it (kv_config.py), the
problems worded for the flags and located at them.
"""

from __future__ import annotations

import ast
import copy
import operator
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from packaging.version import Version

from kvctl.facts.offload_args import (
    BACKEND,
    SIZE,
    Backend,
    OffloadArgs,
    backend_changes_after,
    offload_args,
    offload_args_since,
)
from kvctl.validate.kv_config import validate_kv_transfer_config
from kvctl.validate.model import Artifact, Collector, Problem, SourceLines, did_you_mean, join, placeholder
from kvctl.validate.readers.offload_args import LINKED, PARALLEL

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.LShift: operator.lshift}


def check_offloading_args(artifact: Artifact, v: Version) -> list[Problem]:
    """Every problem vLLM `v` has with the offloading settings of one command / mapping / call."""
    out = Collector(artifact.lines)
    root, data = _root(artifact.where), artifact.data
    given = {key: data[key] for key in (SIZE, BACKEND) if data.get(key) is not None}
    facts = offload_args(v)
    if facts is None:
        _absent(given, root, v, artifact, out)
        return out.problems
    if not _values_ok(given, facts, root, v, artifact, out) or any(placeholder(x) for x in given.values()):
        return out.problems  # refused at parse time, or filled in later: nothing to build from
    built = _build(given, facts, root, v, artifact, out)
    if built is not None:
        user = data.get(LINKED) if isinstance(data.get(LINKED), Mapping) else None
        _overwrites(user, built[0], built[1], facts, root, v, artifact, out)
        out.problems += _check_built(built[0], built[1], user, given, root, v, artifact)
    return out.problems


def _root(where: str) -> str:
    """The mapping the settings sit in: where minus its last key ("" for launch-line flags)."""
    return where.rpartition(".")[0]


def _label(artifact: Artifact, key: str) -> str:
    """How the input writes the setting: --kv-offloading-size on a command line, else the key."""
    keyed = _root(artifact.where) or artifact.origin.startswith(("Python", "top level"))
    return key if keyed else "--" + key.replace("_", "-")


def _absent(given: Mapping[str, Any], root: str, v: Version, artifact: Artifact, out: Collector) -> None:
    since = offload_args_since()
    first = offload_args(since) if since else None
    for key in given:
        source = first.fields[key].source if first and key in first.fields else "vllm/config/cache.py"
        out.error(join(root, key), f"vLLM {v} has no {_label(artifact, key)}: CacheConfig and EngineArgs get "
                  f"{key} in {since} ({source}); before that vLLM's argument parser refuses "
                  "the flag (unrecognized arguments) and EngineArgs(**kwargs) raises TypeError for the keyword",
                  f"upgrade vLLM to >= {since}, or write a kv_transfer_config with kv_connector "
                  "OffloadingConnector and its spec's keys (kvctl config validate checks them)")


def _values_ok(given: Mapping[str, Any], facts: OffloadArgs, root: str, v: Version, artifact: Artifact,
               out: Collector) -> bool:
    """A backend outside vLLM's Literal, a size that is not a number: refused before anything runs."""
    ok = True
    backend, field = given.get(BACKEND), facts.fields.get(BACKEND)
    if backend is not None and not placeholder(backend) and field and field.choices \
            and backend not in field.choices:
        out.error(join(root, BACKEND), f"{_label(artifact, BACKEND)} {backend!r} is not a backend vLLM {v} "
                  f"knows ({', '.join(field.choices)}; KVOffloadingBackend, {field.source}): it refuses it "
                  "at start", did_you_mean(backend, field.choices) + f"write one of: {', '.join(field.choices)}")
        ok = False
    size = given.get(SIZE)
    if size is not None and not placeholder(size) and _number(size) is None:
        out.error(join(root, SIZE), f"{_label(artifact, SIZE)} {size!r} is not a number: vLLM {v} reads it "
                  f"as a float of GiB ({facts.fields[SIZE].annotation}) and refuses it at start",
                  f"write the GiB of CPU memory to offload to, e.g. {_label(artifact, SIZE)} 64")
        ok = False
    return ok


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _build(given: Mapping[str, Any], facts: OffloadArgs, root: str, v: Version, artifact: Artifact,
           out: Collector) -> tuple[dict[str, Any], Backend] | None:
    """The kv_transfer_config vLLM builds (the user's, edited), with the backend's facts; None
    where it builds nothing (after saying why)."""
    effective = {BACKEND: facts.default_backend(), **given}
    if facts.gate and effective.get(facts.gate) is None:
        gate = _label(artifact, facts.gate)
        for key in given:  # stated, and vLLM returns before reading it
            out.drop(join(root, key), f"vLLM {v} ignores {_label(artifact, key)} without {gate}: "
                     f"_post_init_kv_transfer_config returns when {facts.gate} is None ({facts.gate_source}), "
                     "so nothing is offloaded", f"add {gate} {'native' if facts.gate == BACKEND else '64 (GiB)'}")
        return None
    if facts.requires and effective.get(facts.requires) is None:
        out.error(join(root, next(iter(given))), f"vLLM {v} raises ValueError at start: "
                  f"'{facts.requires_message}' ({facts.source})", f"add {_label(artifact, facts.requires)} 64 (GiB)")
        return None
    backend = facts.backends.get(str(effective[BACKEND]))
    if backend is None or backend.connector is None:
        return None  # a backend kvctl's facts have no branch for: nothing known to check
    user = artifact.data.get(LINKED)
    built: dict[str, Any] = copy.deepcopy(dict(user)) if isinstance(user, Mapping) else {}
    connector = backend.connector
    if backend.env_connector and _env_on(artifact.env.get(backend.env_connector[0])):
        connector = backend.env_connector[1]
    built["kv_connector"] = connector
    ranks = _ranks(facts, artifact.data)
    written = {key: _evaluate(expr, _number(effective.get(SIZE)), ranks) for key, expr in backend.extra.items()}
    if backend.extra_mode == "update":
        extra = built.get("kv_connector_extra_config")
        built["kv_connector_extra_config"] = {**(extra if isinstance(extra, Mapping) else {}), **written}
    elif backend.extra_mode == "replace":
        built["kv_connector_extra_config"] = written
    else:
        out.drop(join(root, SIZE), f"vLLM {v} does not pass {_label(artifact, SIZE)}'s value to {connector} "
                 f"({backend.source}): the size only turns offloading on; the capacity is set where "
                 f"{connector} reads it (for LMCache: the LMCache server's own config)",
                 f"set the capacity in {connector}'s configuration")
    if facts.kv_role:
        built["kv_role"] = facts.kv_role
    return built, backend


def _env_on(value: str | None) -> bool:
    """vLLM reads its switch as bool(int(os.getenv(NAME, "0"))) (vllm/envs.py)."""
    try:
        return bool(int(value)) if value is not None else False
    except ValueError:
        return False


def _ranks(facts: OffloadArgs, data: Mapping[str, Any]) -> float | None:
    """num_kv_ranks as the release computes it (facts.ranks: tensor x pipeline parallel size) from
    the -tp / -pp the same command gives (vLLM's default 1 each); None when kvctl cannot read one."""
    if facts.ranks is None:
        return 1
    sizes = {name: data.get(name, 1) for name in PARALLEL}
    if any(_number(size) is None for size in sizes.values()):
        return None

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Attribute) and node.attr in sizes:
            return _number(sizes[node.attr])
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(ast.unparse(node))

    try:
        return value(ast.parse(facts.ranks, mode="eval").body)
    except (ValueError, TypeError, SyntaxError):
        return None


def _evaluate(expr: str, size: float | None, ranks: float | None = 1) -> Any:
    """The value vLLM writes for an expression of its source ("kv_offloading_size / num_kv_ranks"):
    constants and arithmetic on the size and the ranks (_ranks). Anything else stays a placeholder."""
    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name) and node.id in ("kv_offloading_size", "num_kv_ranks"):
            if node.id == "num_kv_ranks" and ranks is None:
                raise ValueError(node.id)
            return size if node.id == "kv_offloading_size" else ranks
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(ast.unparse(node))

    try:
        return value(ast.parse(expr, mode="eval").body)
    except (ValueError, TypeError, SyntaxError, ZeroDivisionError):
        return f"${{{expr}}}"


def _overwrites(user: Mapping[str, Any] | None, built: Mapping[str, Any], backend: Backend, facts: OffloadArgs,
                root: str, v: Version, artifact: Artifact, out: Collector) -> None:
    """Values of the user's own kv_transfer_config that the settings silently replace."""
    if user is None:
        return
    ktc, why = join(root, LINKED), f"because {_label(artifact, SIZE)} is set ({backend.source})"
    fix = (f"remove {_label(artifact, SIZE)} / {_label(artifact, BACKEND)} to run your kv_transfer_config, "
           "or remove the kv_transfer_config and let the settings build it")
    for key in ("kv_connector", "kv_role"):
        if key in user and user[key] != built.get(key):
            out.drop(join(ktc, key), f"vLLM {v} replaces {key} {user[key]!r} with {built.get(key)!r} {why}", fix)
    extra = user.get("kv_connector_extra_config")
    if not isinstance(extra, Mapping):
        return
    for key, old in extra.items():
        if backend.extra_mode == "replace" or (key in backend.extra and old != built["kv_connector_extra_config"][key]):
            how = "drops the whole kv_connector_extra_config for its own" if backend.extra_mode == "replace" \
                else f"overwrites {key} with {built['kv_connector_extra_config'][key]!r}"
            out.drop(join(join(ktc, "kv_connector_extra_config"), key),
                     f"vLLM {v} {how} {why}: {key} {old!r} is not used", fix)


def _check_built(built: dict[str, Any], backend: Backend, user: Mapping[str, Any] | None, given: Mapping[str, Any],
                 root: str, v: Version, artifact: Artifact) -> list[Problem]:
    """The built config checked as a kv_transfer_config: what vLLM wrote is located at the
    settings; problems the user's own config has anyway (checked on its own) are not repeated."""
    ktc = join(root, LINKED)
    at = min(artifact.lines.get(join(root, key), 1) for key in given)  # the settings' first line
    lines = SourceLines(artifact.lines.file, artifact.lines)
    extra_path = join(ktc, "kv_connector_extra_config")
    if backend.extra_mode == "replace":  # the user's extra keys are gone: nothing of theirs to point at
        for path in [p for p in lines if p == extra_path or p.startswith(extra_path + ".")]:
            del lines[path]
    lines.setdefault(ktc, at)
    lines.setdefault(extra_path, at)
    for path in [join(ktc, "kv_connector"), join(ktc, "kv_role")] + [join(extra_path, k) for k in backend.extra]:
        lines[path] = at  # vLLM wrote these
    env = artifact.env
    own = {p.message for p in validate_kv_transfer_config(user, v, ktc, lines, env=env)} if user else set()
    summary = ", ".join(f"{k} {val!r}" for k, val in built.get("kv_connector_extra_config", {}).items()
                        if k in backend.extra)
    labels = " and ".join(_label(artifact, k) for k in given)
    prefix = (f"vLLM {v} turns {labels} into kv_connector "
              f"{built['kv_connector']}" + (f" with {summary}" if summary else "") + f" ({backend.source}); ")
    vllm_wrote = {join(extra_path, key) for key in backend.extra}
    later = backend_changes_after(v, backend.name)
    out = []
    for problem in validate_kv_transfer_config(built, v, ktc, lines, env=env):
        path = problem.where.rpartition(" ")[2]
        if problem.message in own or (problem.dropped and path in vllm_wrote):
            continue  # said by the user's own config's check / a key vLLM writes and no spec reads
        fix = problem.fix
        if path in vllm_wrote:  # the user cannot set what vLLM overwrites
            fix = (f"vLLM {v} writes {path.rpartition('.')[2]} itself from {labels}: remove them and write "
                   f"the kv_transfer_config yourself ({fix})" + (f", or upgrade vLLM to >= {later}" if later else ""))
        out.append(replace(problem, message=prefix + problem.message, fix=fix))
    return out
