"""Readers: one per input format, each turning a file (or a bundle folder) into located Artifacts.

`read(path)` picks the reader: a folder is a kvctl bundle; a Dockerfile / Containerfile is read for
the command its image runs; `.py` is Python (read with ast);
`.sh`/`.txt`/... and text that is not a YAML mapping are launch lines; `.toml` is prime-rl's config;
JSON / YAML documents are searched for configs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvctl.errors import UsageError
from kvctl.validate.model import Artifact, Problem, SourceLines
from kvctl.validate.readers.dockerfile import is_dockerfile, read_dockerfile
from kvctl.validate.readers.documents import parse_documents, read_text, strip_json_comments
from kvctl.validate.readers.helm_values import read_helm_values
from kvctl.validate.readers.shell import read_launch_text
from kvctl.validate.readers.structured import Found, read_document, read_document_text
from kvctl.validate.readers.templates import go_template_placeholders, is_templated, read_template

_LAUNCH_SUFFIXES = (".sh", ".bash", ".zsh", ".txt", ".cmd", ".args")
_TEMPLATE_SUFFIXES = (".j2", ".jinja", ".jinja2", ".tmpl", ".tpl")  # run.sh.j2 is a script


def _suffix(path: Path) -> str:
    """The format's suffix, under a template's (`launch.sh.j2` -> `.sh`)."""
    suffixes = [s.lower() for s in path.suffixes]
    while len(suffixes) > 1 and suffixes[-1] in _TEMPLATE_SUFFIXES:
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def read(path: Path) -> Found:
    """Every config in `path`. UsageError when it cannot be read."""
    path = Path(path)
    if path.is_dir():
        from kvctl.validate.readers.bundle import read_bundle

        return read_bundle(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or folder", "check the path")
    text = read_text(path)
    if is_dockerfile(path.name, text):
        return Found("dockerfile", *read_dockerfile(text, str(path)))
    suffix = _suffix(path)
    if suffix == ".env" or path.name == ".env":  # docker --env-file, systemd EnvironmentFile
        return _env_file(path, text)
    if suffix != path.suffix.lower() and is_templated(text):  # launch.sh.j2: every branch read
        return _template(text, path, suffix)
    return _read_text(text, path, suffix)


def _read_text(text: str, path: Path, suffix: str) -> Found:
    """The configs in `text`, read as a file whose format `suffix` names."""
    if suffix == ".py":
        from kvctl.validate.readers.python_source import read_python

        return Found("python", read_python(text, str(path)))
    if suffix == ".toml":  # prime-rl's inference / RL config: read as prime-rl translates it
        from kvctl.validate.readers.prime_rl import read_prime_rl

        return read_prime_rl(text, str(path))
    if suffix in _LAUNCH_SUFFIXES:
        return _launch(text, path)
    try:
        documents = parse_documents(path, text)
    except UsageError:
        uncommented, comment_line = strip_json_comments(text) if suffix == ".json" else (text, 0)
        if comment_line:  # annotated JSON: read without the comments, which are then judged
            found = _read_text(uncommented, path, suffix)
            found.artifacts = [replace(a, json_comments=comment_line) for a in found.artifacts]
            return found
        if "{{" in text and suffix in (".yaml", ".yml", ".json", ""):  # a Helm chart's template
            templated = go_template_placeholders(text)
            if templated != text:
                return _read_text(templated, path, suffix)
        if _looks_like_launch(text):  # a script YAML cannot parse (e.g. `: ` inside an argument)
            return _launch(text, path)
        raise
    if all(data is None or isinstance(data, str) for data, _ in documents):
        if _looks_like_launch(text):
            return _launch(text, path)
        kind = "empty" if all(data is None for data, _ in documents) else "plain text"
        raise UsageError(f"{path}: the file is {kind}, not a config or a launch line", _WHAT)
    found = Found("")
    formats = []
    for data, node in documents:
        part = read_helm_values(data, node, str(path)) or read_document(data, node, str(path))
        formats.append(part.format)
        found.artifacts += part.artifacts
        found.problems += part.problems
    found.format = "k8s" if "k8s" in formats else formats[0]
    return found


def _template(text: str, path: Path, suffix: str) -> Found:
    def one(rendered: str) -> tuple[list[Artifact], list[Problem], str]:
        part = _read_text(rendered, path, suffix)
        return part.artifacts, part.problems, part.format

    return Found(*read_template(text, one))


def _env_file(path: Path, text: str) -> Found:
    """KEY=value lines: the servers' environment, and any config a value holds (a kv_transfer_config
    JSON meant for --kv-transfer-config "$VAR"), each with that environment."""
    from kvctl.validate.readers.env_file import read_env_file
    from kvctl.validate.readers.shell import config_in_text

    env, lines = read_env_file(path, text=text)
    held = [config_in_text(value, str(path), lines[f"env.{key}"]) for key, value in env.items()]
    artifacts = [replace(a, env=env, lines=SourceLines(str(path), {**lines, **a.lines}),
                         origin=f"variable {key} (line {lines[f'env.{key}']})")
                 for key, a in zip(env, held) if a is not None]
    artifacts.append(Artifact("env", env, "env", lines, origin=path.name))
    return Found("env-file", artifacts)


def _launch(text: str, path: Path) -> Found:
    artifacts, problems = read_launch_text(text, str(path), documents=read_document_text)
    return Found("launch-line", artifacts, problems)


def _looks_like_launch(text: str) -> bool:
    return "kv-transfer-config" in text or "kv_transfer_config" in text or "--kv-offloading-" in text


_WHAT = ("give a kv_transfer_config (JSON/YAML), a mooncake.json, a verl config or Hydra override "
         "line, a vllm serve launch line or script, a vLLM --config YAML, a Kubernetes manifest, an "
         "LMCache config, Python building a KVTransferConfig, a prime-rl TOML, a Dockerfile, or a folder written by "
         "kvctl config render --out DIR")


def not_found(path: Path) -> UsageError:
    return UsageError(f"{path}: no kv_transfer_config, mooncake.json or LMCache config found in it; "
                      "looked for a kv_connector/kv_role mapping, a kv_transfer_config key (any "
                      "depth, dashed or not), --kv-transfer-config in launch lines and container "
                      "args, --kv-offloading-size / kv_offloading_size, Hydra overrides, and JSON "
                      "objects with master_server_address", _WHAT)
