"""Generate a tiny random Llama model that a real vLLM (CPU) can serve, with no download.

Standalone on purpose: it imports nothing from kvctl, so it runs with the Python of the vLLM
environment (tools/make_vllm_env.sh), which has torch, transformers and tokenizers:

    $VLLM_PY tools/tiny_model.py OUT_DIR [--seed N]

What it writes into OUT_DIR (a Hugging Face model folder, safetensors):
- a byte-level BPE tokenizer trained on a few built-in sentences (vocab ~400, specials
  `<s> </s> <unk> <pad>`), saved as a PreTrainedTokenizerFast. Training is deterministic: every
  seed gets the same tokenizer, so prompts tokenize the same on every replica and every model;
- a LlamaForCausalLM (hidden 64, intermediate 128, 2 layers, 2 heads, 2 KV heads, head_dim 32,
  float32, max_position_embeddings 1024) with random weights drawn from --seed. head_dim 32
  because vLLM's CPU attention backend takes head sizes 32, 64, 80, 96, 112, 128, ... only;
- `kvctl_tiny_model.json`, the marker of a complete model (seed, generator version, files).

Atomic and idempotent: the model is built in a temporary folder beside OUT_DIR and renamed into
place; if OUT_DIR already holds a complete model made with the same seed and generator version,
nothing is done. Prints OUT_DIR on its last line.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

GENERATOR_VERSION = 1
MARKER = "kvctl_tiny_model.json"
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]
VOCAB_SIZE = 400
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
MODEL_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 1024,
}

# Built-in training text for the tokenizer: plain English, some digits and punctuation, so any
# ASCII prompt tokenizes into a few hundred tokens (byte-level BPE never needs <unk>).
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A key value cache stores the attention keys and values of every token already seen.",
    "When the policy weights change, every cached block computed with the old weights is stale.",
    "Reset the local prefix cache and the external store together, then verify with a probe.",
    "Mooncake keeps blocks in a distributed store that several vLLM replicas share.",
    "The master tracks every key; a forced remove_all clears them, leases or not.",
    "Reinforcement learning trainers update the model after each step of rollouts.",
    "Tokens are grouped into blocks of one hundred and twenty eight for prefix caching.",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 42 128 256 1024 appear in logs and configs.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "In the beginning there was a small model, random and harmless, made only for tests.",
    "Hello world! This is a tiny language model with a tiny vocabulary.",
    "Every replica must hash prompts the same way to share blocks through the store.",
    "Health checks, metrics, counters and deltas tell whether the reset really happened.",
    "The server answers on loopback only; no traffic leaves this machine.",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="model folder to create")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    return parser.parse_args(argv)


def read_marker(out_dir: Path) -> dict | None:
    try:
        marker = json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def is_complete(out_dir: Path, seed: int) -> bool:
    marker = read_marker(out_dir)
    return (marker is not None and marker.get("seed") == seed
            and marker.get("generator_version") == GENERATOR_VERSION
            and all((out_dir / name).is_file() for name in REQUIRED_FILES))


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=1, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>",
                                   model_max_length=MODEL_SHAPE["max_position_embeddings"])


def build_model(tokenizer, seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer), **MODEL_SHAPE,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
        rms_norm_eps=1e-5, rope_theta=10000.0, dtype="float32")
    torch.manual_seed(seed)
    with torch.no_grad():
        model = LlamaForCausalLM(config).to(torch.float32)
    model.eval()
    return model


def save(model, tokenizer, folder: Path) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kwargs = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True  # transformers < 5; 5.x always writes safetensors
    model.save_pretrained(folder, **kwargs)
    tokenizer.save_pretrained(folder)
    # Older transformers (4.x) know no "TokenizersBackend"; every version loads this class name.
    config_path = folder / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(tok_config, indent=2) + "\n")
    for path in folder.iterdir():
        os.chmod(path, 0o644)


def generate(out_dir: Path, seed: int) -> bool:
    """Make the model in out_dir. Returns False when a complete one was already there."""
    out_dir = out_dir.absolute()
    if is_complete(out_dir, seed):
        return False
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tokenizer = build_tokenizer()
        model = build_model(tokenizer, seed)
        save(model, tokenizer, tmp)
        missing = [name for name in REQUIRED_FILES if not (tmp / name).is_file()]
        if missing:
            raise RuntimeError(f"save_pretrained wrote no {', '.join(missing)}")
        marker = {"generator": "tools/tiny_model.py", "generator_version": GENERATOR_VERSION,
                  "seed": seed, "vocab_size": len(tokenizer), **MODEL_SHAPE,
                  "dtype": "float32", "files": sorted(p.name for p in tmp.iterdir())}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        # Swap into place: an old (incomplete, other-seed) folder is moved aside first, since a
        # rename cannot replace a non-empty directory.
        trash = None
        if out_dir.exists() or out_dir.is_symlink():
            trash = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.rename(out_dir, trash / "old")
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if is_complete(out_dir, seed):  # a concurrent run won the race with the same model
                return False
            raise
        finally:
            if trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"tiny model (seed {seed}, vocab {len(tokenizer)}) written to {out_dir} in "
          f"{time.monotonic() - started:.1f}s", file=sys.stderr)
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not generate(args.out_dir, args.seed):
        print(f"tiny model (seed {args.seed}) already complete in {args.out_dir}", file=sys.stderr)
    print(args.out_dir.absolute())
    return 0


if __name__ == "__main__":
    sys.exit(main())
