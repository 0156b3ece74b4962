"""vLLM's native KV offloading settings where they are written: `--kv-offloading-size 64
--kv-offloading-backend native` in a launch line or container args, `kv_offloading_size:` /
`kv-offloading-size:` keys of a mapping at any depth (Ray Serve engine_kwargs, a vLLM --config
YAML), `LLM(kv_offloading_size=...)` keywords and dict keys in Python.

Each place gives one "kv_offloading" Artifact: data {"kv_offloading_size": ..., "kv_offloading_backend":
...} (only what is written), located per key, plus "kv_transfer_config" when the same command /
mapping / call also sets one (vLLM then edits that config: the check must see both). Its `where`
is the first key's path; its parent is the mapping the keys sit in ("" for flags).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from kvctl.validate.model import Artifact, Problem, SourceLines, join

SIZE, BACKEND = "kv_offloading_size", "kv_offloading_backend"
LINKED = "kv_transfer_config"
FLAG = re.compile(r"^--kv[-_]offloading[-_](?P<what>size|backend)(?:=(?P<value>.*))?$", re.S)
MARKERS = ("--kv-offloading-", "--kv_offloading_")  # a launch line that sets one
_KEYS = {f"kv{sep}offloading{sep}{what}": f"kv_offloading_{what}" for sep in "_-" for what in ("size", "backend")}
# The parallelism the sizes are divided by (num_kv_ranks): read with the settings, from the same line.
PARALLEL = ("tensor_parallel_size", "pipeline_parallel_size")
_PARALLEL_FLAG = re.compile(r"^(?:--(?P<long>tensor|pipeline)[-_]parallel[-_]size|-(?P<short>tp|pp))(?:=(?P<value>.*))?$")


def key_of(name: object) -> str | None:
    """kv_offloading_size for any of its spellings (kv-offloading-size in a vLLM --config YAML)."""
    return _KEYS.get(name) if isinstance(name, str) else None


def located(values: dict[str, tuple[Any, int]], file: str, root: str, origin: str,
            config: Artifact | None = None, env: Mapping[str, str] | None = None) -> Artifact:
    """The artifact of settings {key: (value, line)} found under `root`, linked to `config`
    (the kv_transfer_config the same command / mapping sets), its keys moved under root."""
    data: dict[str, Any] = {key: value for key, (value, _) in values.items()}
    lines = SourceLines(file, {join(root, key): line for key, (_, line) in values.items()})
    if config is not None:
        data[LINKED] = config.data
        moved = join(root, LINKED)
        for path, line in config.lines.items():
            if path == config.where or path.startswith(config.where + ".") or path.startswith(config.where + "["):
                lines[moved + path[len(config.where):]] = line
    first = min((key for key in values if key not in PARALLEL), key=lambda key: values[key][1])
    return Artifact("kv_offloading", data, join(root, first), lines, origin=origin,
                    env=dict(env if env is not None else config.env if config else {}))


def in_words(words: list[tuple[str, int]], file: str, problems: list[Problem],
             expand: Callable[[str], str] = lambda text: text) -> dict[str, tuple[Any, int]]:
    """{key: (value, line)} of the offloading flags among one command's (word, line) pairs (the
    last one wins, as argparse keeps it); a flag with no value is said (argparse refuses it)."""
    found: dict[str, tuple[Any, int]] = {}
    for index, (word, line) in enumerate(words):
        match = FLAG.match(word)
        if not match:
            continue
        value = match["value"]
        if value is None:
            following = words[index + 1] if index + 1 < len(words) else None
            if following is None or following[0].startswith("--"):
                problems.append(Problem(f"{file}:{line}", f"{word} has no value: vLLM's argument parser "
                                        "refuses the command", _FIX[match["what"]], "error"))
                continue
            value, line = following
        found[f"kv_offloading_{match['what']}"] = (expand(value), line)
    return {**_parallel(words, expand), **found} if found else found


def _parallel(words: list[tuple[str, int]], expand: Callable[[str], str]) -> dict[str, tuple[Any, int]]:
    """{tensor_parallel_size / pipeline_parallel_size: (value, line)} of a command's -tp / -pp flags."""
    found: dict[str, tuple[Any, int]] = {}
    for index, (word, line) in enumerate(words):
        match = _PARALLEL_FLAG.match(word)
        if match is None:
            continue
        which = "tensor" if (match["long"] or match["short"]).startswith("t") else "pipeline"
        value = match["value"] if match["value"] is not None else \
            words[index + 1][0] if index + 1 < len(words) else None
        if value is not None:
            found[f"{which}_parallel_size"] = (expand(value), line)
    return found


_FIX = {"size": "give it the GiB of CPU memory to offload to, e.g. --kv-offloading-size 64",
        "backend": "give it a backend, e.g. --kv-offloading-backend native"}


def in_mapping(mapping: Mapping[Any, Any], path: str, lines: Mapping[str, int]) -> dict[str, tuple[Any, int]]:
    """{key: (value, line)} of the offloading keys of one mapping at `path` (any spelling)."""
    found: dict[str, tuple[Any, int]] = {}
    for name, value in mapping.items():
        key = key_of(name)
        if key is not None:
            found[key] = (value, lines.get(join(path, name), lines.get(path, 1)))
    return found
