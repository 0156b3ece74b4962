#!/bin/bash
# Restated from a published UCM deployment guide (kvctl corpus entry cls-ucm-split-kv-options.sh):
# the connector's settings given as separate options, not as --kv-transfer-config.
export CUDA_VISIBLE_DEVICES=0,1,2,3
MODEL_PATH="/models/llama-7b"
UCM_CONFIG="./ucm_config.yaml"
python -m vllm.entrypoints.openai.api_server \
    --model $MODEL_PATH \
    --kv-connector "UCMConnector" \
    --kv-connector-module-path "ucm.integration.vllm.ucm_connector" \
    --kv-role "kv_both" \
    --kv-connector-extra-config "{\"UCM_CONFIG_FILE\": \"$UCM_CONFIG\"}" \
    --tensor-parallel-size 4 \
    --max-model-len 8192 \
    --gpu-memory-utilization 0.8 \
    --port 8000
