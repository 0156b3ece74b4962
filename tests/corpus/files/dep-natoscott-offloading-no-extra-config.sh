   vllm serve Qwen/Qwen3-0.6B --tensor-parallel-size 2 \
     --kv-transfer-config '{"kv_connector":"OffloadingConnector","kv_role":"kv_both"}' \
     --gpu-memory-utilization=0.2
