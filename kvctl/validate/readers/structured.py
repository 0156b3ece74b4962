"""Configs inside JSON / YAML documents: a kv_transfer_config file, a mooncake.json, a verl config,
a vLLM `--config` YAML (dashed keys), an LMCache config, Kubernetes manifests (container
`command`/`args`, ConfigMaps holding a mooncake.json or a launch script), docker-compose files.

Every document is walked once: a `kv_transfer_config` key (any spelling) is a config, a list of
strings holding `--kv-transfer-config` is an argv, a string holding one is a launch script, a string
that is a JSON object with a Mooncake master address is a mooncake.json.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from kvctl.facts.bundle_layout import VERL_PATH
from kvctl.validate.model import ERROR, Artifact, Problem, SourceLines, describe, join
from kvctl.validate.readers.documents import loads, node_lines, parse_documents, text_lines
from kvctl.validate.readers.merge import merge_held
from kvctl.validate.readers.offload_args import FLAG as OFFLOAD_FLAG, MARKERS as OFFLOAD_MARKERS, in_mapping, located
from kvctl.validate.readers.carrier import is_carrier_flag
from kvctl.validate.readers.serve_args import runs_vllm
from kvctl.validate.readers.shell import (
    Command,
    Token,
    config_in_text,
    configs_in_command,
    is_config_flag,
    read_launch_text,
)
from kvctl.validate.readers.verl import verl_in_document

_KTC_KEYS = ("kv_transfer_config", "kv-transfer-config")
_MOONCAKE_MARKERS = ("master_server_address", "metadata_server")
_LAUNCH_MARKERS = ("--kv-transfer-config", "--kv_transfer_config", "kv_transfer_config=",
                   "kv_transfer_config.") + OFFLOAD_MARKERS
_CONTAINER_LISTS = {"containers": "container", "initContainers": "init container"}
_K8S_VARIABLE = re.compile(r"\$\((\w+)\)")  # Kubernetes expands $(NAME) in command/args from env
# Keys only an LMCache config has (LMCache's LMCacheEngineConfig).
_LMCACHE_MARKERS = ("chunk_size", "local_cpu", "max_local_cpu_size", "remote_url", "remote_serde")


@dataclass(frozen=True)
class _Container:
    """The container a value belongs to: how origins name it, and its env."""

    label: str = ""  # "container 'prefill'", "init container 'setup'", "unnamed container 2"
    path: str = ""  # its dotted path, so an origin names the item inside it ("args[3]")
    env: dict[str, str] = field(default_factory=dict)
    env_lines: dict[str, int] = field(default_factory=dict)  # where each env value's text starts
    env_paths: dict[str, str] = field(default_factory=dict)  # dotted path of an env value -> NAME
    # Its args go to vLLM's parser: its command runs vllm, or it has none and its image is vLLM's
    # (whose entrypoint is vllm serve). Unknown for args outside a container (KServe's predictor).
    runs_vllm: bool = False

    def item(self, path: str) -> str:
        """'args[3] in container 'x'' for a path inside the container, else the path itself."""
        if self.label and path.startswith(self.path + "."):
            return f"{path[len(self.path) + 1:]} of {self.label}"
        if path.startswith("["):  # a Helm-rendered argv: the document is the list
            return f"item {path} of the top-level list"
        return path or "the top-level list"

    def expand(self, text: str) -> str:
        return _K8S_VARIABLE.sub(lambda m: self.env.get(m[1], m[0]), text)

    def line_of(self, word: str) -> int | None:
        """The line of the env value a whole `$(NAME)` word takes (its keys are located there)."""
        match = _K8S_VARIABLE.fullmatch(word)
        return self.env_lines.get(match[1]) if match else None


@dataclass
class Found:
    format: str  # what the input is, for the report
    artifacts: list[Artifact] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # met while reading (e.g. bad JSON string)
    held: list[Artifact] = field(default_factory=list)  # configs in env values (merge_held)
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
    lines = node_lines(node, "", file)
    _visit("", data, node, lines, found)
    found.artifacts, found.held = merge_held(found.artifacts, found.held), []
    verl = verl_in_document(data, lines)
    if verl is not None:  # after the configs: readers of one config take the first artifact
        found.artifacts.append(verl)
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
    return replace(artifact, lines=lines, origin=f"heredoc at line {offset + 1}")


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


def _visit(path: str, value: Any, node: yaml.Node | None, lines: SourceLines, found: Found,
           container: _Container = _Container()) -> None:
    """Look at one value; go into its children unless it was read as a whole."""
    key = path.rpartition(".")[2]
    if key in _KTC_KEYS:
        if value is not None:
            _config_block(path, value, node, lines, found)
    elif isinstance(value, dict):
        children = _mapping_children(node)
        for child_key, child in value.items():
            inner = _compose_service(str(child_key), child, join(path, child_key), lines) \
                if path == "services" and isinstance(child, dict) else container
            _visit(join(path, child_key), child, children.get(str(child_key)), lines, found, inner)
        _offloading(path, value, lines, found, container)
    elif isinstance(value, list):
        if any(isinstance(v, str) and (v.startswith(_LAUNCH_MARKERS[:2]) or OFFLOAD_FLAG.match(v)
                                       or is_carrier_flag(v)) for v in value):
            _argv(path, value, node, lines, found, container)  # a container's args: already split words
            return
        items = node.value if isinstance(node, yaml.SequenceNode) else []
        kind = _CONTAINER_LISTS.get(key.partition("[")[0])
        for index, item in enumerate(value):
            child_path = f"{path}[{index}]"
            item_node = items[index] if index < len(items) else None
            inner = _container(kind, item, item_node, child_path, lines) if kind and isinstance(item, dict) \
                else container
            _visit(child_path, item, item_node, lines, found, inner)
    elif isinstance(value, str):
        if any(marker in value for marker in _LAUNCH_MARKERS):  # a script: `sh -c`, a ConfigMap
            artifacts, problems = read_launch_text(container.expand(value), lines.file,
                                                   _content_line(node, lines, path), read_document_text,
                                                   env=container.env)
            _add(found, artifacts, container.item(path))
            found.problems += problems
        elif any(marker in value for marker in _MOONCAKE_MARKERS):
            _embedded_mooncake(path, value, node, lines, found)
        elif "kv_connector" in value or "kv_role" in value:
            _embedded_config(path, value, node, lines, found, container)


def _container(kind: str, item: dict[str, Any], node: yaml.Node | None, path: str,
               lines: SourceLines) -> _Container:
    name = item.get("name")
    index = int(path.rpartition("[")[2].rstrip("]"))
    label = f"{kind} '{name}'" if isinstance(name, str) and name else f"unnamed {kind} {index + 1}"
    env, env_lines, env_paths = {}, {}, {}
    entries = item.get("env") if isinstance(item.get("env"), list) else []
    env_node = _mapping_children(node).get("env")
    entry_nodes = env_node.value if isinstance(env_node, yaml.SequenceNode) else []
    for i, entry in enumerate(entries):  # [{name: X, value: "..."}]; valueFrom is not known here
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get("value"), str):
            env[entry["name"]] = entry["value"]
            value_node = _mapping_children(entry_nodes[i]).get("value") if i < len(entry_nodes) else None
            env_lines[entry["name"]] = _content_line(value_node, lines, f"{path}.env[{i}].value")
            env_paths[f"{path}.env[{i}].value"] = entry["name"]
    return _Container(label, path, env, env_lines, env_paths, runs_vllm(item.get("command"), item.get("image")))


def _compose_service(name: str, service: dict[str, Any], path: str, lines: SourceLines) -> _Container:
    """A docker-compose service: its `environment` (a mapping or NAME=value items) is the server's
    env; `command` replaces the image's CMD, so with vLLM's image (and no `entrypoint`) it is
    vllm serve's arguments."""
    env: dict[str, str] = {}
    env_lines: dict[str, int] = {}
    environment = service.get("environment")
    items = environment.items() if isinstance(environment, dict) else \
        (str(e).partition("=")[::2] for e in environment) if isinstance(environment, list) else ()
    for index, (key, value) in enumerate(items):
        env[str(key)] = "" if value is None else str(value)
        where = f"{path}.environment.{key}" if isinstance(environment, dict) else f"{path}.environment[{index}]"
        env_lines[str(key)] = lines.get(where, lines.get(path, 1))
    return _Container(f"service '{name}'", path, env, env_lines, {},
                      runs_vllm(service.get("entrypoint"), service.get("image")))


def _embedded_config(path: str, value: str, node: yaml.Node | None, lines: SourceLines, found: Found,
                     container: _Container) -> None:
    """A string that is a kv_transfer_config: an env entry's value (KV_TRANSFER_CONFIG='{...}'),
    a Helm value, a compose `environment:` item (NAME={...})."""
    name, sep, text = value.partition("=")
    if not (sep and re.fullmatch(r"[A-Za-z_]\w*", name)):
        name, text = "", value
    offset = len(value) - len(text)
    start = _content_line(node, lines, path) + value[:offset].count("\n")
    artifact = config_in_text(text.strip(), lines.file, start + text[:len(text) - len(text.lstrip())].count("\n"))
    if artifact is not None and artifact.kind == "kv_transfer_config":
        env_name = container.env_paths.get(path)
        what = f"env {env_name} of {container.label}" if env_name else \
            f"{name} in {container.item(path)}" if name else container.item(path)
        found.held.append(replace(artifact, origin=f"{what} (line {lines.get(path, start)})",
                                  env=container.env))


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
                                    origin=f"line {lines.get(path, 1)}",
                                    framework="verl" if path == ".".join(VERL_PATH) else ""))


def _argv(path: str, items: list[Any], node: yaml.Node | None, lines: SourceLines,
          found: Found, container: _Container) -> None:
    """A container's args / command list: each item is one word, already split."""
    item_nodes = node.value if isinstance(node, yaml.SequenceNode) else []
    tokens = [Token(container.expand(str(item)), container.line_of(str(item)) or
                    (item_nodes[i].start_mark.line + 1 if i < len(item_nodes) else lines.get(path, 1)))
              for i, item in enumerate(items) if isinstance(item, (str, int))]
    artifacts = configs_in_command(Command(tokens, dict(container.env)), lines.file, found.problems)
    names_vllm = any(t.text.rsplit("/", 1)[-1] == "vllm" or t.text.startswith("vllm.") for t in tokens)
    if not (names_vllm or container.runs_vllm):  # another program's args (KServe, a wrapper): not
        artifacts = [replace(a, options=()) for a in artifacts]  # judged by vLLM's parser
    env_lines = {f"env.{name}": line for name, line in container.env_lines.items()}  # env problems' lines
    artifacts = [replace(a, lines=SourceLines(a.lines.file, {**env_lines, **a.lines})) for a in artifacts]
    for artifact in artifacts:
        offload = artifact.kind == "kv_offloading"
        flag = next((i for i, item in enumerate(items) if isinstance(item, str)
                     and (OFFLOAD_FLAG.match(item) if offload else item.partition("=")[0] == artifact.carrier
                          if artifact.carrier else is_config_flag(item))), 0)
        named = OFFLOAD_FLAG.match(str(items[flag])) if offload else None
        label = f"--kv-offloading-{named['what']}" if named else artifact.carrier or "--kv-transfer-config"
        found.artifacts.append(replace(artifact, origin=f"{label} at "
                                                        f"{container.item(f'{path}[{flag}]')} "
                                                        f"(line {artifact.lines.get(artifact.where)})"))


def _offloading(path: str, value: dict[Any, Any], lines: SourceLines, found: Found, container: _Container) -> None:
    """kv_offloading_size / kv_offloading_backend keys of this mapping (engine_kwargs, a vLLM
    --config YAML), linked to the kv_transfer_config the same mapping holds."""
    settings = in_mapping(value, path, lines)
    if not settings:
        return
    siblings = {join(path, key) for key in _KTC_KEYS}
    config = next((a for a in found.artifacts if a.kind == "kv_transfer_config" and a.where in siblings), None)
    first = min(line for _, line in settings.values())
    found.artifacts.append(located(settings, lines.file, path, f"{container.item(path) or 'top level'} "
                                   f"(line {first})", config, container.env))


def _add(found: Found, artifacts: list[Artifact], where: str) -> None:
    for artifact in artifacts:
        found.artifacts.append(replace(artifact, origin=f"{artifact.origin} in {where}"))


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
