# Restated from vLLM issue 24467 (prefill side, image vllm/vllm-openai:v0.10.1.1): the command as
# the issue gives it.
VLLM_DISAGG_PREFILL_ROLE=prefill CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 VLLM_NIXL_SIDE_CHANNEL_HOST=10.10.38.12 \
VLLM_NIXL_SIDE_CHANNEL_PORT=5575 UCX_TLS=rc,sm,self,cuda_copy,cuda_ipc,gdr_copy UCX_NET_DEVICES=mlx5_0:1 \
VLLM_USE_V1=1 vllm serve /data/Llama-3.1-8B-Instruct --tensor_parallel_size 8 --max-model-len 8192 \
  --enforce-eager --trust-remote-code --disable-log-requests --gpu-memory-utilization 0.85 \
  --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_rank":0,"kv_parallel_size":8,"kv_buffer_device":"cuda"}' \
  --host 0.0.0.0 --port 8000
