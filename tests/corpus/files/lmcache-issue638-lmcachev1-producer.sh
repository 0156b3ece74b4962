 UCX_TLS=cuda_ipc,cuda_copy，tcp \
    LMCACHE_CONFIG_FILE=/home/ubuntu/lmcache-prefiller-config.yaml \
    LMCACHE_USE_EXPERIMENTAL=True \
    CUDA_VISIBLE_DEVICES=0 \
    vllm serve /nfs/checkpoints/modelscope/Qwen3-32B \
    --port 8100 \
    --disable-log-requests \
    --enable-chunked-prefill \
    --gpu-memory-utilization 0.95 \
    --enforce-eager \
    --kv-transfer-config \
    '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_producer","kv_connector_extra_config": {"discard_partial_chunks": false, "lmcache_rpc_port": "producer1"}}'
