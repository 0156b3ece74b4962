 --kv-transfer-config \
    '{
    "kv_connector":"CPUOffloadingConnector",
        "kv_connector_module_path": "vllm_ascend.distributed.kv_transfer.cpu_offloading_connector",
        "kv_role":"kv_both", "kv_connector_extra_config": {"swap_in_threshold": 0, "cpu_swap_space_gb": 800}
    }'
