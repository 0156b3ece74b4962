"""Checks of KV offloading configs (OffloadingConnector and its specs, SimpleCPUOffloadConnector)
against one vLLM release, from the keys each reads there (kvctl/data/vllm_facts.json, sections
offload_specs / offload_connectors, read out of vllm/v1/kv_offload and the connectors' sources).

OffloadingConnector hands its whole kv_connector_extra_config to the spec spec_name selects
(vllm/v1/kv_offload/factory.py): a key neither reads is started with and silently ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from packaging.version import Version

from kvctl.facts.capabilities import table
from kvctl.facts.offload_key import OffloadKey
from kvctl.validate.model import Collector, did_you_mean, join, placeholder

OFFLOADING, SIMPLE = "OffloadingConnector", "SimpleCPUOffloadConnector"
SPECS, CONNECTORS = "offload_specs", "offload_connectors"
# What to write for a required key (vLLM's own examples: tiering/spec.py's docstring says 10 GB).
EXAMPLES = {"cpu_bytes_to_use": "10737418240 (10 GiB)", "num_cpu_blocks": "10000"}


def check_offloading(cfg: Mapping[str, Any], v: Version, where: str, out: Collector) -> None:
    """Problems vLLM `v` has with the offloading settings of this (child) config."""
    name, extra = cfg.get("kv_connector"), cfg.get("kv_connector_extra_config")
    if name not in (OFFLOADING, SIMPLE) or table().registered(v, name) is None:
        return  # not an offloading config, or a release without it (the connector check says so)
    if extra is not None and not isinstance(extra, Mapping):
        return  # reported by the extra-config check (or a value kvctl cannot evaluate)
    extra, path = extra or {}, join(where, "kv_connector_extra_config")
    if name == SIMPLE:
        _check_keys(extra, table().offload_keys(v, CONNECTORS, SIMPLE), v, path, out, SIMPLE, [(CONNECTORS, SIMPLE)])
        return
    spec = _spec(extra, v, path, out)
    if spec is None:
        return
    keys = {**table().offload_keys(v, CONNECTORS, OFFLOADING), **table().offload_keys(v, SPECS, spec)}
    _check_keys(extra, keys, v, path, out, f"{OFFLOADING} ({spec})", [(SPECS, spec), (CONNECTORS, OFFLOADING)])
    tiers = table().offload_fact(v, SPECS, spec, "tiers")
    if tiers is not None and "secondary_tiers" in extra:
        _check_tiers(extra["secondary_tiers"], tiers, v, join(path, "secondary_tiers"), out)


def _spec(extra: Mapping[str, Any], v: Version, path: str, out: Collector) -> str | None:
    """The registered spec this config selects; None (after saying why, if it is wrong) when
    there is none to check against: an unknown name, or an out-of-tree spec kvctl cannot see."""
    lookup = table().offload_fact(v, CONNECTORS, OFFLOADING, "spec_lookup")
    if lookup is None:
        return None
    key, module_key = str(lookup["key"]), str(lookup["module_key"])
    spec, spec_path = extra.get(key, lookup["default"]), join(path, key)
    specs = table().offload_specs(v)
    if not isinstance(spec, str):
        out.error(spec_path, f"{key} must be a spec name string, got {spec!r}: vLLM {v} raises "
                  f"{_quote(_format(lookup['message'], spec_name=spec))} at start", f"e.g. {key}: {lookup['default']}")
        return None
    if spec in specs or placeholder(spec) or extra.get(module_key) is not None:
        return spec if spec in specs else None  # an out-of-tree spec reads keys kvctl cannot know
    since = table().offload_releases(SPECS, spec)
    later = min((s for s, _ in since if Version(s) > v), key=Version, default=None)
    raises = (f"vLLM {v} registers no offloading spec {spec!r}: {OFFLOADING} raises "
              f"{_quote(_format(lookup['message'], spec_name=spec))} at start (vLLM {v} registers "
              f"{', '.join(specs)}; {_at(lookup)})")
    if later:
        fix = f"upgrade vLLM to >= {later} (the first release with {spec}), or use {key}: {lookup['default']}"
    else:
        fix = did_you_mean(spec, specs) + f"use one of {', '.join(specs)}, or set {module_key} to the " \
              "module that defines an out-of-tree spec of that name"
    out.error(spec_path, raises + (f" ({spec}: {_releases(since)})" if since else ""), fix)
    return None


def _check_keys(extra: Mapping[str, Any], keys: dict[str, OffloadKey], v: Version, path: str,
                out: Collector, owner: str, history: list[tuple[str, str]]) -> None:
    missing = [k for k in keys.values() if k.required and _missing(extra, k)]
    for key in missing:
        state = f"is {extra[key.name]!r}, which counts as not set" if key.name in extra else "is not set"
        out.error(join(path, key.name), f"{key.name} {state}: vLLM {v}'s {owner} raises "
                  f"{_quote(key.message)} at start ({key.source})",
                  f"add {key.name}: {EXAMPLES.get(key.name, _example(key))} to kv_connector_extra_config")
    for name, value in extra.items():
        key = keys.get(str(name))
        if key is None:
            _unread(str(name), keys, missing, v, join(path, name), out, owner, history)
        elif value is not None and not placeholder(value):
            _check_value(key, value, v, join(path, name), out, owner)


def _missing(extra: Mapping[str, Any], key: OffloadKey) -> bool:
    value = extra.get(key.name)
    if placeholder(value):
        return False
    return key.name not in extra if key.when == "absent" else value is None if key.when == "none" else not value


def _unread(name: str, keys: dict[str, OffloadKey], missing: list[OffloadKey], v: Version, path: str,
            out: Collector, owner: str, history: list[tuple[str, str]]) -> None:
    """A key this release's connector and spec never read: vLLM starts and ignores it."""
    releases = sorted({span for where in history for span in table().offload_releases(*where, key=name)},
                      key=lambda span: Version(span[0]))
    said = f"vLLM {v} ignores '{name}': {owner} does not read it in this release"
    said += f" (it reads {name} {_releases(releases)})" if releases else ""
    instead = [k.name for k in missing]
    if instead and releases:  # the usual case: another release's key instead of the one this one requires
        fix = f"write {instead[0]}: {EXAMPLES.get(instead[0], 'a value')} instead (vLLM {v} reads {instead[0]})"
    elif releases and all(Version(s) > v for s, _ in releases):
        fix = f"remove {name}, or upgrade vLLM to >= {releases[0][0]}"
    else:
        fix = did_you_mean(name, keys) + f"remove {name} (vLLM {v} reads: {', '.join(sorted(keys))})"
    out.drop(path, said, fix)


def _check_value(key: OffloadKey, value: Any, v: Version, path: str, out: Collector, owner: str) -> None:
    if key.cast in ("int", "float") and not _converts(key.cast, value):
        out.error(path, f"{key.name} {value!r}: vLLM {v}'s {owner} converts it with {key.cast}(), which "
                  f"raises on it, so the server does not start ({key.source})", f"write {key.name} as {_example(key)}")
    elif key.cast == "bool" and isinstance(value, str):
        _bool_string(key, value, v, path, out, owner)
    elif key.choices and str(value) not in key.choices:
        message = re.sub(r"\{[A-Z_]+\}", str(key.choices), _format(key.message or "", **{key.name: repr(value)}))
        out.error(path, f"{key.name} {value!r}: vLLM {v}'s {owner} raises {_quote(message)} at start "
                  f"({key.source})", did_you_mean(value, key.choices) + f"use one of {', '.join(key.choices)}")
    elif key.cast is None and key.annotation in ("int", "float") and not isinstance(value, (int, float)):
        out.warn(path, f"{key.name} {value!r} is {type(value).__name__}: vLLM {v} uses it as it is, "
                 f"unconverted, where it expects {key.annotation} ({key.source})",
                 f"write {key.name} as {_example(key)}")


def _bool_string(key: OffloadKey, value: str, v: Version, path: str, out: Collector, owner: str) -> None:
    """bool() of a string: True for every non-empty one. A string that says off is misread (an
    error: the setting does not happen); one that says on is read as written."""
    said = says_bool(value)
    if said is True:
        return
    misread = f"{key.name} {value!r} is a string: vLLM {v}'s {owner} takes bool() of it ({key.source}), " \
              f"and bool({value!r}) is True"
    if said is False:
        out.drop(path, f"{misread}: {key.name} is on, though the file says off", f"write {key.name}: false (no quotes)")
    else:
        out.warn(path, f"{misread} (every non-empty string is)", f"write {key.name}: true or false (no quotes)")


def says_bool(text: str) -> bool | None:
    """What a string means as a yes/no to a reader (None: neither); bool() reads only '' as False."""
    word = text.strip().lower()
    return True if word in ("true", "1", "yes", "on", "y", "t") else \
        False if word in ("false", "0", "no", "off", "n", "f", "", "none", "null") else None


def _check_tiers(tiers: Any, fact: dict[str, Any], v: Version, path: str, out: Collector) -> None:
    """TieringOffloadingSpec's secondary_tiers: a list of {"type": <a registered tier>, ...}."""
    names, where = list(fact["value"]), _at(fact)
    example = f'secondary_tiers: [{{"type": "{names[0]}"}}]'
    if placeholder(tiers):
        return  # computed when the code runs: said (unread), not judged
    if not isinstance(tiers, list):
        out.error(path, f"secondary_tiers must be a list of tier configurations, got {type(tiers).__name__}: "
                  f"vLLM {v} raises ValueError at start", example)
        return
    for index, tier in enumerate(tiers):
        tier_path = f"{path}[{index}]"
        kind = tier.get("type") if isinstance(tier, Mapping) else None
        if placeholder(tier) or placeholder(kind):
            continue
        if not isinstance(tier, Mapping) or not kind:
            out.error(join(tier_path, "type"), f"secondary tier {index} has no type: vLLM {v} raises "
                      f"{_quote(fact.get('missing_message'))} at start ({where})", f"e.g. {example}")
        elif kind not in names and not (fact.get("module_path") and tier.get("module_path")):
            message = _format(fact.get("unknown_message") or "", tier_type=repr(kind), **{"list(cls._registry)": names})
            custom = ", or set module_path to the module of an out-of-tree tier" if fact.get("module_path") else ""
            out.error(join(tier_path, "type"), f"secondary tier type {kind!r}: vLLM {v} raises {_quote(message)} "
                      f"at start ({where})", did_you_mean(kind, names) + f"use one of {', '.join(names)}{custom}")


def _converts(cast: str, value: Any) -> bool:
    try:
        (int if cast == "int" else float)(value)
    except (TypeError, ValueError):
        return False
    return True


def _example(key: OffloadKey) -> str:
    kind = key.cast or key.annotation or ""
    return {"int": "an integer, e.g. 10000", "float": "a number, e.g. 0.5", "bool": "true or false"}.get(
        kind, f"a value (vLLM's default: {key.default})" if key.default else "a value")


def _releases(spans: list[tuple[str, str | None]]) -> str:
    return ", ".join(f"from {s}" if u is None else f"from {s} to before {u}" for s, u in spans)


def _at(row: dict[str, Any]) -> str:
    return f"{row['file']}:{row['line']} in {row['since']}"


def _quote(message: str | None) -> str:
    """vLLM's words, in quotes that do not clash with its own."""
    text = message or "an error"
    return f'"{text}"' if "'" in text else f"'{text}'"


def _format(message: str, **values: Any) -> str:
    """vLLM's f-string message with this config's values in its {placeholders}."""
    for name, value in values.items():
        message = message.replace("{" + name + "}", str(value))
    return message
