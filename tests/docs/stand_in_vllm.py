"""STAND-IN for the `vllm` command, on PATH while the docs' commands run (tests/docs).

`vllm serve MODEL --kv-transfer-config JSON ...` checks what a real vLLM would read before it
starts: the model folder exists, the --kv-transfer-config value is a JSON object naming a
connector (a shell that passed it quoted, or split, fails here as vLLM's parser would fail), and
the MOONCAKE_CONFIG_PATH the environment names is a readable JSON file. Then it prints what it got
and exits 0 instead of serving (the servers the docs talk to are tests/doubles' VllmDouble).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def fail(message: str) -> int:
    print(f"stand-in vllm: {message}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    if argv[:1] != ["serve"] or len(argv) < 2:
        return fail(f"only `vllm serve MODEL ...` is stood in for, got {argv}")
    model, rest = argv[1], argv[2:]
    if not Path(model).exists():
        return fail(f"{model} is not a local folder")
    flags = [a.split("=", 1)[0] for a in rest if a.startswith("--")]
    if "--kv-transfer-config" in flags:
        at = next(i for i, a in enumerate(rest) if a.split("=", 1)[0] == "--kv-transfer-config")
        raw = rest[at].split("=", 1)[1] if "=" in rest[at] else (rest[at + 1] if at + 1 < len(rest) else "")
        try:
            config = json.loads(raw)
        except json.JSONDecodeError as exc:
            return fail(f"--kv-transfer-config: not JSON ({exc}): {raw!r}")
        if not isinstance(config, dict) or "kv_connector" not in config:
            return fail(f"--kv-transfer-config names no kv_connector: {raw!r}")
        print(f"stand-in vllm: kv_connector {config['kv_connector']}")
    path = os.environ.get("MOONCAKE_CONFIG_PATH")
    if path is not None:
        try:
            json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            return fail(f"MOONCAKE_CONFIG_PATH={path}: {exc}")
        print(f"stand-in vllm: MOONCAKE_CONFIG_PATH {path}")
    print(f"stand-in vllm: would serve {model}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
