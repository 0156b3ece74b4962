#!/usr/bin/env bash
# Restated from a public launch script (kvctl corpus entry cls-store-defaults-heredoc.sh): one vLLM
# instance on a Mooncake store, every setting a ${VAR:-default}, mooncake.json written by a heredoc.
set -euo pipefail
export PYTHONHASHSEED="${PYTHONHASHSEED:-0}"
export VLLM_USE_FLASHINFER_SAMPLER="${VLLM_USE_FLASHINFER_SAMPLER:-0}"
export VLLM_MOONCAKE_BOOTSTRAP_PORT="${BOOTSTRAP_PORT:-8998}"
VLLM_BIN="${VLLM_BIN:-.venv/bin/vllm}"
MODEL="${MODEL:-Qwen/Qwen2.5-1.5B-Instruct}"
PORT="${PORT:-8000}"
KV_ROLE="${KV_ROLE:-kv_both}"
MOONCAKE_PROTOCOL="${MOONCAKE_PROTOCOL:-tcp}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1:50051}"
METADATA_SERVER="${METADATA_SERVER:-P2PHANDSHAKE}"
SEGMENT_SIZE="${SEGMENT_SIZE:-1073741824}"
BUFFER_SIZE="${BUFFER_SIZE:-1073741824}"
export MOONCAKE_CONFIG_PATH="${MOONCAKE_CONFIG_PATH:-/tmp/mooncake_config.json}"
cat > "$MOONCAKE_CONFIG_PATH" <<JSON
{
  "metadata_server": "${METADATA_SERVER}",
  "master_server_address": "${MASTER_ADDR}",
  "protocol": "${MOONCAKE_PROTOCOL}",
  "device_name": "",
  "mode": "embedded",
  "global_segment_size": ${SEGMENT_SIZE},
  "local_buffer_size": ${BUFFER_SIZE},
  "enable_offload": false
}
JSON
KV_TRANSFER_CONFIG="{\"kv_connector\":\"MooncakeStoreConnector\",\"kv_role\":\"${KV_ROLE}\",\"kv_connector_extra_config\":{\"load_async\":true}}"
exec "$VLLM_BIN" serve "$MODEL" \
  --port "$PORT" \
  --enable-prefix-caching \
  --prefix-caching-hash-algo sha256 \
  --kv-transfer-config "$KV_TRANSFER_CONFIG"
