#!/usr/bin/env python3
"""How far a correct prefix-cache hit's log-probabilities drift from a fresh computation, per dtype.

kvctl probe (kvctl/reset/probe.py) sends a prompt twice: as is (its first blocks may come from
the prefix cache or the Mooncake store) and with a fresh cache_salt (computed from scratch), and
compares the greedy tokens' log-probabilities. Both are right; they differ only by rounding,
because a hit splits the prompt's prefill in two (the cached prefix was computed by an earlier
request; the rest attends to its K/V), so every matmul and the attention run over other shapes
and reduce in another order. This script measures that rounding on a random Llama-like decoder
in plain PyTorch (RMSNorm, rotary, GQA attention, SwiGLU), the way vLLM serves the two requests:

  fresh:  prefill the whole prompt, then decode N greedy tokens one at a time;
  cached: prefill the prefix alone (an earlier request), then the rest of the prompt attending
          to the prefix's cached K/V (the hit), then decode N greedy tokens.

For each dtype it reports the absolute difference of the chosen tokens' log-probabilities (the
fresh answer's greedy token, at every step where both answers still agree; log_softmax in
float32 like vLLM's sampler), per position and per prompt (the probe compares the largest
difference of a prompt with its tolerance), and how many prompts' greedy tokens part.

Needs only PyTorch (no vLLM, no transformers, no network); runs on CPU or CUDA.

    python tools/gpu/bf16_prefix_logprobs.py                  # this machine: cuda if any, else cpu
    python tools/gpu/bf16_prefix_logprobs.py --device cuda --quick --json   # tools/gpu_check.sh

Exit 0 with the JSON report; 2 for bad usage (an unknown dtype, --device cuda without CUDA).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# kvctl probe's tolerance per dtype (kvctl/reset/tolerance.py; a unit test keeps the two equal): the
# report says whether each dtype's largest drift stays within it, and by what factor
KVCTL_TOLERANCE = {"fp32": 1e-3, "bf16": 0.25, "fp16": 0.25}
BLOCK = 16  # vLLM's default KV block size on GPU: a hit covers whole blocks


@dataclass
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    prompts: int
    max_prefix: int  # tokens; a multiple of BLOCK
    max_rest: int
    new_tokens: int


FULL = Shape(layers=6, hidden=1024, heads=16, kv_heads=4, intermediate=2816, vocab=32000, prompts=48,
             max_prefix=512, max_rest=64, new_tokens=4)
QUICK = Shape(layers=4, hidden=512, heads=8, kv_heads=2, intermediate=1408, vocab=8192, prompts=32,
              max_prefix=256, max_rest=32, new_tokens=4)
CPU = Shape(layers=4, hidden=256, heads=8, kv_heads=2, intermediate=704, vocab=4096, prompts=48,
            max_prefix=192, max_rest=32, new_tokens=4)


class Decoder(torch.nn.Module):
    """A random Llama-like decoder. Weights are scaled so activations and logits have the spread of
    a trained model (logits of a few units, a clear greedy choice) rather than a near-uniform
    softmax, whose tiny log-probability differences would understate the rounding."""

    def __init__(self, s: Shape, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.s, self.head_dim = s, s.hidden // s.heads

        def w(rows: int, cols: int, scale: float = 1.0) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.randn(rows, cols, generator=g) * scale / math.sqrt(cols))

        self.embed = torch.nn.Parameter(torch.randn(s.vocab, s.hidden, generator=g))
        kv = s.kv_heads * self.head_dim
        self.blocks = torch.nn.ModuleList()
        for _ in range(s.layers):
            block = torch.nn.Module()
            block.qkv = w(s.hidden + 2 * kv, s.hidden)
            block.o = w(s.hidden, s.hidden, 0.5)
            block.gate_up = w(2 * s.intermediate, s.hidden)
            block.down = w(s.hidden, s.intermediate, 0.5)
            block.norm1 = torch.nn.Parameter(1 + 0.1 * torch.randn(s.hidden, generator=g))
            block.norm2 = torch.nn.Parameter(1 + 0.1 * torch.randn(s.hidden, generator=g))
            self.blocks.append(block)
        self.norm = torch.nn.Parameter(torch.ones(s.hidden))
        self.lm_head = w(s.vocab, s.hidden, 4.0)  # logits with a standard deviation of ~4
        inv = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, ids: torch.Tensor, start: int, cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Logits of tokens `ids` (1-D) at positions start.., attending to `cache` (K/V of the
        positions before start, extended in place per layer). Like vLLM's FlashAttention path,
        the new K/V join the cache first and attention reads every key from it."""
        s, n, d = self.s, ids.shape[0], self.head_dim
        x = self.embed[ids]
        pos = torch.arange(start, start + n, device=ids.device, dtype=torch.float32)
        angles = pos[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        keys = start + n
        # queries see keys up to their own position (a causal mask offset by the cached prefix)
        mask = torch.arange(keys, device=ids.device)[None, :] <= (start + torch.arange(n, device=ids.device))[:, None]
        for i, b in enumerate(self.blocks):
            h = _rms(x, b.norm1)
            q, k, v = (h @ b.qkv.T).split([s.hidden, s.kv_heads * d, s.kv_heads * d], dim=-1)
            q = _rotate(q.view(n, s.heads, d), cos, sin)
            k = _rotate(k.view(n, s.kv_heads, d), cos, sin)
            v = v.view(n, s.kv_heads, d)
            if len(cache) <= i:
                cache.append((k, v))
            else:
                cache[i] = (torch.cat([cache[i][0], k]), torch.cat([cache[i][1], v]))
            ck, cv = cache[i]
            group = s.heads // s.kv_heads
            att = F.scaled_dot_product_attention(
                q.transpose(0, 1), ck.repeat_interleave(group, dim=1).transpose(0, 1),
                cv.repeat_interleave(group, dim=1).transpose(0, 1), attn_mask=mask)
            x = x + att.transpose(0, 1).reshape(n, s.hidden) @ b.o.T
            gate, up = (_rms(x, b.norm2) @ b.gate_up.T).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ b.down.T
        return _rms(x, self.norm) @ self.lm_head.T


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # the variance in float32, as vLLM's and HF's RMSNorm compute it
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


@torch.inference_mode()
def generate(model: Decoder, prompt: torch.Tensor, prefix: int, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and their float32 log-probability rows; `prefix` > 0: its K/V come from an
    earlier, separate prefill (a prefix-cache hit), the rest of the prompt attends to them."""
    cache: list[tuple[torch.Tensor, torch.Tensor]] = []
    if prefix:
        model(prompt[:prefix], 0, cache)  # the earlier request that filled the cache
    logits = model(prompt[prefix:], prefix, cache)[-1]
    tokens, rows, at = [], [], prompt.shape[0]
    for step in range(steps):
        row = logits.float().log_softmax(-1)  # vLLM's sampler computes logprobs in float32
        token = int(row.argmax())
        tokens.append(token)
        rows.append(row)
        if step + 1 < steps:
            logits = model(torch.tensor([token], device=prompt.device), at, cache)[-1]
            at += 1
    return tokens, rows


def measure(model: Decoder, s: Shape, seed: int, device: torch.device) -> dict:
    g = torch.Generator().manual_seed(seed + 1)  # the same prompts for every dtype
    per_position: list[float] = []
    per_prompt: list[float] = []
    margins: list[float] = []
    flips = unequal = 0
    for _ in range(s.prompts):
        prefix = BLOCK * int(torch.randint(1, s.max_prefix // BLOCK + 1, (1,), generator=g))
        rest = int(torch.randint(1, s.max_rest + 1, (1,), generator=g))  # vLLM recomputes >= 1 token
        prompt = torch.randint(0, s.vocab, (prefix + rest,), generator=g).to(device)
        fresh, fresh_rows = generate(model, prompt, 0, s.new_tokens)
        served, served_rows = generate(model, prompt, prefix, s.new_tokens)
        agree = next((i for i, (a, b) in enumerate(zip(fresh, served)) if a != b), len(fresh))
        diffs = [abs(float(fresh_rows[i][t]) - float(served_rows[i][t])) for i, t in enumerate(fresh[:agree])]
        margins += [float(r.topk(2).values.diff().abs()) for r in fresh_rows[:agree]]
        flips += agree < len(fresh)
        unequal += agree < len(fresh) or any(d > 0 for d in diffs)
        per_position += diffs
        if diffs:  # a prompt whose first token parts shares no log-probability to compare
            per_prompt.append(max(diffs))
    return {"positions": _stats(per_position), "per_prompt_max": _stats(per_prompt),
            "prompts": s.prompts, "prompts_with_greedy_flip": flips, "prompts_not_bitwise_equal": unequal,
            "median_top2_margin": round(statistics.median(margins), 4) if margins else None}


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "max": None, "p99": None, "median": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return {"n": len(values), "max": _round(ordered[-1]), "p99": _round(p99),
            "median": _round(statistics.median(ordered))}


def _round(x: float) -> float:
    return float(f"{x:.3g}")


def _device(wanted: str) -> torch.device:
    if wanted == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: this PyTorch sees no CUDA device (torch.cuda.is_available() is False); "
                         "run with --device cpu, or on a machine with a GPU and a CUDA build of PyTorch")
    return torch.device(wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--dtypes", default="fp32,bf16,fp16", help="comma-separated: fp32, bf16, fp16")
    parser.add_argument("--quick", action="store_true",
                        help="a smaller model on GPU (32 prompts), 16 prompts on CPU: well under a minute")
    parser.add_argument("--prompts", type=int, help="prompts per dtype (default 48)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print only the JSON report")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1: a shared machine)")
    args = parser.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or not dtypes:
        parser.error(f"--dtypes: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(DTYPES)}")
    if args.prompts is not None and args.prompts < 1:
        parser.error("--prompts must be >= 1")
    try:
        device = _device(args.device)
    except SystemExit as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(max(1, args.threads))
    # fp32 matmuls in full precision (no TF32): vLLM's VLLM_FLOAT32_MATMUL_PRECISION default "highest"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if device.type == "cuda":
        shape = QUICK if args.quick else FULL
    else:
        shape = Shape(**{**asdict(CPU), "prompts": 16}) if args.quick else CPU
    if args.prompts is not None:
        shape = Shape(**{**asdict(shape), "prompts": args.prompts})
    report = {"tool": "tools/gpu/bf16_prefix_logprobs.py", "torch": torch.__version__, "device": device.type,
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else
              f"cpu ({torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} thread(s))",
              "seed": args.seed, "block": BLOCK, "model": asdict(shape), "dtypes": {}}
    base = Decoder(shape, args.seed)  # one set of weights, cast per dtype
    for name in dtypes:
        started = time.perf_counter()
        model = copy.deepcopy(base).to(device=device, dtype=DTYPES[name])
        model.inv_freq = base.inv_freq.to(device)  # rotary angles stay float32
        result = measure(model, shape, args.seed, device)
        worst, tolerance = result["per_prompt_max"]["max"], KVCTL_TOLERANCE[name]
        result["kvctl_tolerance"] = tolerance
        result["within_kvctl_tolerance"] = worst is None or worst <= tolerance
        result["tolerance_over_max"] = round(tolerance / worst, 1) if worst else None
        result["seconds"] = round(time.perf_counter() - started, 2)
        report["dtypes"][name] = result
        del model
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 0


def _print(report: dict) -> None:
    print(f"{report['device_name']}, torch {report['torch']}, model {report['model']}")
    print(f"{'dtype':6} {'per-prompt max':>15} {'p99':>10} {'median':>10} {'flips':>7} {'kvctl tol':>10} {'s':>6}")
    for name, r in report["dtypes"].items():
        pp = r["per_prompt_max"]
        within = "ok" if r["within_kvctl_tolerance"] else "OVER"
        print(f"{name:6} {pp['max']!s:>15} {pp['p99']!s:>10} {pp['median']!s:>10} "
              f"{r['prompts_with_greedy_flip']:>3}/{r['prompts']:<3} {r['kvctl_tolerance']:>7g} {within:>2} "
              f"{r['seconds']:>6}")
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
