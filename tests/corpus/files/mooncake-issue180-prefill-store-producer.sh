MOONCAKE_CONFIG_PATH=/model/mooncake.json nohup python3 -m vllm.entrypoints.openai.api_server \
    --model /model/QwQ32 --served-model-name Qwen/QwQ-32B --port 8000 \
    --max-model-len 32768 --gpu-memory-utilization 0.9 -tp 2 \
    --kv-transfer-config '{"kv_connector":"MooncakeStoreConnector","kv_role":"kv_producer"}' > output-prefill.log 2>&1 &
