"""Names of the files a rendered bundle holds, and where verl keeps kv_transfer_config.

Shared by render (which writes bundles) and validate (which reads them), so neither imports the other.
"""

from __future__ import annotations

# Bundle file for each output format (what `kvctl config render --out DIR` writes), plus the manifest.
BUNDLE_FILES = {
    "json": "kv_transfer_config.json",
    "verl": "verl.yaml",
    "vllm-args": "vllm-args.txt",
    "env": "kvctl.env",
    "mooncake": "mooncake.json",
}
MANIFEST = "bundle.json"
VERL_PATH = ("actor_rollout_ref", "rollout", "engine_kwargs", "vllm", "kv_transfer_config")
