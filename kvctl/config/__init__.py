"""`kvctl config`: templates (typed parameters, safe YAML) and rendering them into a
kv_transfer_config, mooncake.json, env and `vllm serve` flags fitted to a vLLM version.
"""
