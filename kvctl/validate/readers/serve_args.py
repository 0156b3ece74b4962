"""The options of one vLLM launch line, for kvctl.validate.serve_flags: `vllm serve ...`, `python -m
vllm.entrypoints.openai.api_server ...`, or an argument list (container args, Helm extraArgs). Only
asked of a command kvctl already reads as vLLM's (it sets --kv-transfer-config / --kv-offloading-*):
a launcher of its own with vLLM-like flags is not judged by vLLM's parser.

Every word that starts with `--`, as written without `=value`, with its line, up to a bare `--`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

API_SERVER = "vllm.entrypoints.openai.api_server"
# vLLM's own images (vllm/vllm-openai:v0.32.0, a mirror's .../vllm-openai, vllm:tag): their
# entrypoint is vllm serve, so a container or compose service of one passes its args to vLLM.
_VLLM_IMAGE = re.compile(r"(^|/)vllm(-openai)?(:|@|$)|vllm/vllm-openai")


def runs_vllm(override: object, image: object) -> bool:
    """Does a container give its args to vLLM's parser? `override`: the command (k8s) or the
    entrypoint (compose, Dockerfile) it sets, None when the image's own runs."""
    if override is None:
        return bool(_VLLM_IMAGE.search(str(image or "")))
    return "vllm" in (" ".join(map(str, override)) if isinstance(override, list) else str(override))
# "Qwen/Qwen3-0.6B": a Hugging Face model id, not a program or a script (run.sh, bin/launch.py)
_MODEL_ID = re.compile(r"^[\w-]+/[\w.-]+$(?<!\.py)(?<!\.sh)")


def _start(words: Sequence[str]) -> int | None:
    """Index of the first word vLLM's parser reads, or None when this is no vLLM command."""
    for index, word in enumerate(words):
        if word == "serve" and index and words[index - 1].rsplit("/", 1)[-1] == "vllm":
            return index + 1
        if word == API_SERVER and index and words[index - 1] == "-m":
            return index + 1
    # an argument list (container args:, Helm extraArgs): options first, or the model positional
    return 0 if words and (words[0].startswith("-") or _MODEL_ID.match(words[0])) else None


def launch_options(words: Sequence[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """(option as written, line) of one command's (word, line) pairs; () when it is no vLLM command."""
    start = _start([w for w, _ in words])
    if start is None:
        return ()
    found: list[tuple[str, int]] = []
    for word, line in words[start:]:
        if word == "--":  # argparse: positionals only from here
            break
        if word.startswith("--"):
            found.append((word.partition("=")[0], line))
    return tuple(found)
