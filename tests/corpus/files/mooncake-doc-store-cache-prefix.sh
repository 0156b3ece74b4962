MOONCAKE_CONFIG_PATH=/path/to/mooncake_config.json \
vllm serve /models/Qwen3-8B \
  --kv-transfer-config '{
    "kv_connector": "MooncakeStoreConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {
      "cache_prefix": "production-2026-07"
    }
  }'
