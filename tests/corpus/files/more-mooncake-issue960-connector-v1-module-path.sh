# mooncake.json
{
  "prefill_url": "127.0.0.1:13003",
  "decode_url": "127.0.0.1:13103",
  "metadata_server": "127.0.0.1:2379",
  "protocol": "tcp",
  "device_name": ""
}

# P实例
CUDA_VISIBLE_DEVICES=4 \
MOONCAKE_CONFIG_PATH=/mnt/data/zwt/mooncake.json \
python3 -m vllm.entrypoints.openai.api_server \
--tensor-parallel-size 1 \
--model /mnt/data/zwt/models/Qwen/Qwen3-0___6B \
--served-model-name Qwen3-0.6B \
--gpu-memory-utilization 0.8 \
--max-model-len 10240 \
--port 8010 \
--kv-transfer-config '{"kv_connector":"MooncakeConnector","kv_role":"kv_producer", "kv_connector_module_path":"mooncake.mooncake_connector_v1"}'

# D实例
CUDA_VISIBLE_DEVICES=5 \
MOONCAKE_CONFIG_PATH=/mnt/data/zwt/mooncake.json \
python3 -m vllm.entrypoints.openai.api_server \
--tensor-parallel-size 1 \
--model /mnt/data/zwt/models/Qwen/Qwen3-0___6B \
--served-model-name Qwen3-0.6B \
--gpu-memory-utilization 0.8 \
--max-model-len 10240 \
--port 8020 \
--kv-transfer-config '{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer", "kv_connector_module_path":"mooncake.mooncake_connector_v1"}'
