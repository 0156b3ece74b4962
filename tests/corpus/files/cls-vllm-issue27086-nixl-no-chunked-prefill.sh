# Restated from vLLM issue 27086 (decode side of a P/D pair on vLLM 0.10.1): the options array of
# its startup script, then the launch.
VLLM_CFG=(
  --trust-remote-code
  --data-parallel-size 1
  --tensor-parallel-size 8
  --no-enable-prefix-caching
  --no-enable-chunked-prefill
  --kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'
)
vllm serve base_model "${VLLM_CFG[@]}"
