"""Configs inside JSON / YAML documents: a kv_transfer_config file, a mooncake.json, a verl config,
a vLLM `--config` YAML (dashed keys), an LMCache config, Kubernetes manifests (container
`command`/`args`, ConfigMaps holding a mooncake.json or a launch script), docker-compose files.

Every document is walked once: a `kv_transfer_config` key (any spelling) is a config, a list of
strings holding `--kv-transfer-config` is an argv, a string holding one is a launch script, a string
that is a JSON object with a Mooncake master address is a mooncake.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvctl.facts.bundle_layout import VERL_PATH
from kvctl.validate.model import ERROR, Artifact, Problem, SourceLines, describe, join
from kvctl.validate.readers.documents import loads, node_lines, parse_documents, text_lines
from kvctl.validate.readers.shell import Command, Token, configs_in_command, read_launch_text

_KTC_KEYS = ("kv_transfer_config", "kv-transfer-config")
_MOONCAKE_MARKERS = ("master_server_address", "metadata_server")
_LAUNCH_MARKERS = ("--kv-transfer-config", "--kv_transfer_config", "kv_transfer_config=",
                   "kv_transfer_config.")
# Keys only an LMCache config has (LMCache's LMCacheEngineConfig).
_LMCACHE_MARKERS = ("chunk_size", "local_cpu", "max_local_cpu_size", "remote_url", "remote_serde")


@dataclass
class Found:
    format: str  # what the input is, for the report
    artifacts: list[Artifact] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # met while reading (e.g. bad JSON string)
    # A bundle's other copies of its kv_transfer_config (verl.yaml, vllm-args.txt): file -> the
    # config read from it, or None when it cannot be read.
    copies: dict[str, Any] = field(default_factory=dict)


def read_document(data: Any, node: yaml.Node | None, file: str) -> Found:
    """The configs in one parsed document."""
    if isinstance(data, dict) and ("kv_connector" in data or "kv_role" in data or _only_fields(data)):
        return Found("kv_transfer_config", [Artifact(
            "kv_transfer_config", data, "kv_transfer_config",
            node_lines(node, "kv_transfer_config", file))])
    if isinstance(data, dict) and any(k in data for k in _MOONCAKE_MARKERS) and \
            not any(k in data for k in _LMCACHE_MARKERS):
        return Found("mooncake", [Artifact("mooncake", data, "mooncake",
                                           node_lines(node, "mooncake", file))])
    if isinstance(data, dict) and any(k in data for k in _LMCACHE_MARKERS):
        return Found("lmcache", [Artifact("lmcache", data, "lmcache", node_lines(node, "lmcache", file))])
    found = Found(_format_of(data))
    _visit("", data, node, node_lines(node, "", file), found)
    return found


def read_document_text(text: str, file: str, first_line: int) -> tuple[list[Artifact], list[Problem]]:
    """The configs in a JSON / YAML text embedded at `first_line` of `file` (a heredoc body)."""
    found = Found("")
    for data, node in parse_documents(Path(file), text):
        if not isinstance(data, (dict, list)):
            continue
        part = read_document(data, node, file)
        found.artifacts += [_moved(a, first_line - 1) for a in part.artifacts]
        found.problems += part.problems
    return found.artifacts, found.problems


def _moved(artifact: Artifact, offset: int) -> Artifact:
    lines = SourceLines(artifact.lines.file, {k: v + offset for k, v in artifact.lines.items()})
    return Artifact(artifact.kind, artifact.data, artifact.where, lines,
                    origin=f"heredoc at line {offset + 1}", readers=artifact.readers, env=artifact.env)


def _only_fields(data: dict[str, Any]) -> bool:
    """A fragment of a kv_transfer_config: every key a KVTransferConfig field of some release."""
    from kvctl.facts.capabilities import table

    return bool(data) and all(str(key) in table().fields for key in data)


def _format_of(data: Any) -> str:
    if isinstance(data, dict) and "apiVersion" in data and "kind" in data:
        return "k8s"
    nested: Any = data
    for key in VERL_PATH:
        nested = nested.get(key) if isinstance(nested, dict) else None
    if nested is not None:
        return "verl"
    if isinstance(data, dict) and any(k in data for k in _KTC_KEYS):
        return "vllm-config"
    return "yaml"


def _visit(path: str, value: Any, node: yaml.Node | None, lines: SourceLines, found: Found) -> None:
    """Look at one value; go into its children unless it was read as a whole."""
    key = path.rpartition(".")[2]
    if key in _KTC_KEYS:
        if value is not None:
            _config_block(path, value, node, lines, found)
    elif isinstance(value, dict):
        children = _mapping_children(node)
        for child_key, child in value.items():
            _visit(join(path, child_key), child, children.get(str(child_key)), lines, found)
    elif isinstance(value, list):
        if any(isinstance(v, str) and v.startswith(_LAUNCH_MARKERS[:2]) for v in value):
            _argv(path, value, node, lines, found)  # a container's args: already split words
            return
        items = node.value if isinstance(node, yaml.SequenceNode) else []
        for index, item in enumerate(value):
            _visit(f"{path}[{index}]", item, items[index] if index < len(items) else None, lines, found)
    elif isinstance(value, str):
        if any(marker in value for marker in _LAUNCH_MARKERS):  # a script: `sh -c`, a ConfigMap
            artifacts, problems = read_launch_text(value, lines.file, _content_line(node, lines, path),
                                                   read_document_text)
            _add(found, artifacts, path)
            found.problems += problems
        elif any(marker in value for marker in _MOONCAKE_MARKERS):
            _embedded_mooncake(path, value, node, lines, found)


def _mapping_children(node: yaml.Node | None) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(k.value): v for k, v in node.value}


def _content_line(node: yaml.Node | None, lines: SourceLines, path: str) -> int:
    """File line of the first line of a string's text (a `|` block starts on the next line)."""
    if isinstance(node, yaml.ScalarNode):
        return node.start_mark.line + (2 if node.style in ("|", ">") else 1)
    return lines.get(path, 1)


def _config_block(path: str, value: Any, node: yaml.Node | None, lines: SourceLines,
                  found: Found) -> None:
    """A kv_transfer_config key: a mapping, or a JSON string (verl JSON-dumps dict kwargs)."""
    where = path
    if isinstance(value, str):
        try:
            parsed = loads(value)
        except json.JSONDecodeError as exc:
            found.problems.append(Problem(f"{lines.file}:{lines.get(path, 1)} {path}",
                                          f"a string that is not JSON: {exc.msg}",
                                          "write the block as a YAML mapping or a JSON object string",
                                          ERROR))
            return
        config_lines = text_lines(value, where, lines.file, _content_line(node, lines, path))
        value = parsed
    else:
        config_lines = SourceLines(lines.file, {k: v for k, v in lines.items()
                                                if k == path or k.startswith(path + ".")})
    if not isinstance(value, dict):
        found.problems.append(Problem(f"{lines.file}:{lines.get(path, 1)} {path}",
                                      f"kv_transfer_config is {describe(value)}, not a mapping",
                                      "write it as {kv_connector: ..., kv_role: ...}", ERROR))
        return
    found.artifacts.append(Artifact("kv_transfer_config", value, where, config_lines,
                                    origin=f"line {lines.get(path, 1)}"))


def _argv(path: str, items: list[Any], node: yaml.Node | None, lines: SourceLines,
          found: Found) -> None:
    """A container's args / command list: each item is one word, already split."""
    item_nodes = node.value if isinstance(node, yaml.SequenceNode) else []
    tokens = [Token(str(item), item_nodes[i].start_mark.line + 1 if i < len(item_nodes) else
                    lines.get(path, 1)) for i, item in enumerate(items) if isinstance(item, (str, int))]
    artifacts = configs_in_command(Command(tokens), lines.file, found.problems)
    _add(found, artifacts, path)


def _add(found: Found, artifacts: list[Artifact], path: str) -> None:
    for artifact in artifacts:
        found.artifacts.append(Artifact(artifact.kind, artifact.data, artifact.where, artifact.lines,
                                        origin=f"{artifact.origin} in {path}", env=artifact.env))


def _embedded_mooncake(path: str, value: str, node: yaml.Node | None, lines: SourceLines,
                       found: Found) -> None:
    """A ConfigMap entry (or any string) holding a mooncake.json."""
    try:
        parsed = loads(value)
    except json.JSONDecodeError:
        return  # a string that merely mentions the keys
    if isinstance(parsed, dict) and any(k in parsed for k in _MOONCAKE_MARKERS):
        mc_lines = text_lines(value, path, lines.file, _content_line(node, lines, path))
        found.artifacts.append(Artifact("mooncake", parsed, path, mc_lines,
                                        origin=f"line {lines.get(path, 1)}"))
