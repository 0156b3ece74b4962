"""A folder written by `kvctl config render --out DIR`."""

from __future__ import annotations

from pathlib import Path

from kvctl.errors import UsageError
from kvctl.facts.bundle_layout import BUNDLE_FILES, MANIFEST
from kvctl.facts.kv_transfer import connector_names
from kvctl.validate.model import Artifact, describe
from kvctl.validate.readers.documents import node_lines, parse_document, read_text
from kvctl.validate.readers.env_file import read_env_file
from kvctl.validate.readers.shell import read_launch_text
from kvctl.validate.readers.structured import Found, read_document


def read_bundle(folder: Path) -> Found:
    ktc_file = config_file(folder)
    cfg, node = _mapping(ktc_file)
    names = tuple(connector_names(cfg))
    found = Found("bundle", [Artifact("kv_transfer_config", cfg, "kv_transfer_config",
                                      node_lines(node, "kv_transfer_config", str(ktc_file)),
                                      origin=ktc_file.name)])
    mooncake_file = folder / BUNDLE_FILES["mooncake"]
    if mooncake_file.is_file():
        data, mc_node = _mapping(mooncake_file)
        found.artifacts.append(Artifact("mooncake", data, "mooncake",
                                        node_lines(mc_node, "mooncake", str(mooncake_file)),
                                        origin=mooncake_file.name, readers=names))
    env_file = folder / BUNDLE_FILES["env"]
    if env_file.is_file():
        env, lines = read_env_file(env_file)
        found.artifacts.append(Artifact("env", env, "env", lines, origin=env_file.name,
                                        readers=names))
    for name in (BUNDLE_FILES["verl"], BUNDLE_FILES["vllm-args"]):
        if (folder / name).is_file():
            found.copies[name] = _copy(folder / name)
    return found


def config_file(folder: Path) -> Path:
    ktc_file = folder / BUNDLE_FILES["json"]
    if not ktc_file.is_file():
        raise UsageError(f"{folder}: not a kvctl bundle (no {BUNDLE_FILES['json']}); looked for "
                         + ", ".join([*BUNDLE_FILES.values(), MANIFEST]),
                         f"write one with: kvctl config render NAME --out {folder}")
    return ktc_file


def _mapping(path: Path) -> tuple[dict, object]:
    data, node = parse_document(path)
    if not isinstance(data, dict):
        raise UsageError(f"{path}: the top level is {describe(data)}, not a mapping",
                         f"re-render the bundle: kvctl config render NAME --out {path.parent}")
    return data, node


def _copy(file: Path) -> object:
    """The kv_transfer_config another bundle file carries, or None when it cannot be read."""
    try:
        if file.suffix == ".txt":
            artifacts, problems = read_launch_text(read_text(file), str(file))
        else:
            data, node = parse_document(file)
            part = read_document(data, node, str(file))
            artifacts, problems = part.artifacts, part.problems
    except UsageError:
        return None
    configs = [a.data for a in artifacts if a.kind == "kv_transfer_config"]
    return configs[0] if len(configs) == 1 and not problems else None
