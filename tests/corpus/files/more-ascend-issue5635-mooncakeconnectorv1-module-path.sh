export HCCL_EXEC_TIMEOUT=204
export HCCL_CONNECT_TIMEOUT=120
LocalHost=IP0
export HCCL_IF_IP=$LocalHost
export GLOO_SOCKET_IFNAME="enp67s0f5"
export TP_SOCKET_IFNAME="enp67s0f5"
export HCCL_SOCKET_IFNAME="enp67s0f5"
export ASCEND_RT_VISIBLE_DEVICES=5
export PHYSICAL_DEVICES=5

vllm serve "/opt/mnt1/z30002838/HF/Qwen3-8B" \
  --host $LocalHost \
  --port 8100 \
  --tensor-parallel-size 1\
  --seed 1024 \
  --max-model-len 2000  \
  --max-num-batched-tokens 2000  \
  --trust-remote-code \
  --served-model-name qwen25vl \
  --enforce-eager \
  --data-parallel-size 1 \
  --data-parallel-address $LocalHost \
  --data-parallel-rpc-port 9100 \
  --gpu-memory-utilization 0.8  \
  --kv-transfer-config  \
  '{"kv_connector": "MooncakeConnectorV1",
  "kv_buffer_device": "npu",
  "kv_role": "kv_producer",
  "kv_parallel_size": 1,
  "kv_port": "20001",
  "engine_id": "0",
  "kv_rank": 0,
  "kv_connector_module_path": "vllm_ascend.distributed.mooncake_connector",
  "kv_connector_extra_config": {
            "use_ascend_direct": true,
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
