    vllm serve /model/Qwen2.5-VL-7B-Instruct  \
      --host 0.0.0.0 \
      --port 13700 \
      --no-enable-prefix-caching \
      --tensor-parallel-size 1 \
      --seed 1024 \
      --served-model-name qwen25vl \
      --max-model-len 40000  \
      --max-num-batched-tokens 40000  \
      --trust-remote-code \
      --gpu-memory-utilization 0.9  \
      --kv-transfer-config \
      '{"kv_connector": "MooncakeConnectorV1",
      "kv_role": "kv_producer",
      "kv_port": "30000",
      "kv_connector_extra_config": {
                "prefill": {
                        "dp_size": 1,
                        "tp_size": 1
                 },
                 "decode": {
                        "dp_size": 1,
                        "tp_size": 1
                 }
          }
      }'
