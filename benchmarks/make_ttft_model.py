"""Benchmark helper, run with the vLLM environment's python: a small random Llama for the TTFT workload.

The tiny test model (hidden 64, 2 layers) computes a 190-token prompt in a few milliseconds, so on
it a reset costs the next request nothing measurable. This model (GPT-2-small sized, ~85 M
parameters, same tokenizer) makes the prefill long enough on a CPU to see what recomputing a
prompt after a hard reset costs. Built by tools/tiny_model.py with a bigger shape; no download.

Usage: $VLLM_PY benchmarks/make_ttft_model.py OUT_DIR   (idempotent; prints OUT_DIR last)
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
         "num_key_value_heads": 12, "head_dim": 64, "max_position_embeddings": 1024}
SEED = 0


def main() -> int:
    out = Path(sys.argv[1]).absolute()
    spec = importlib.util.spec_from_file_location("tiny_model", ROOT / "tools" / "tiny_model.py")
    assert spec is not None and spec.loader is not None
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    tiny.MODEL_SHAPE = dict(SHAPE)  # read by build_tokenizer/build_model/the marker at call time
    marker = tiny.read_marker(out) or {}
    if any(marker.get(k) != v for k, v in SHAPE.items()):  # a model of another shape: rebuild
        (out / tiny.MARKER).unlink(missing_ok=True)
    tiny.generate(out, SEED)
    print(json.dumps({k: tiny.read_marker(out)[k] for k in SHAPE}), file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
