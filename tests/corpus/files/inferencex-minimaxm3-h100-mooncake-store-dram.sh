OFFLOAD_ARGS=()
MODEL_CPU_OFFLOAD_GB=26
MODEL_CHECKPOINT_PAGE_CACHE_GIB=414
MOONCAKE_LOCAL_BUFFER_GIB=4
if [ "$KV_OFFLOADING" = "none" ]; then
    require_agentic_kv_offload_none
elif [ "$KV_OFFLOADING" = "dram" ]; then
    require_agentic_kv_offload_backend mooncake
    TOTAL_CPU_DRAM_GIB=$((TOTAL_CPU_DRAM_GB * 1000000000 / 1073741824))
    PER_RANK_GIB=$(((TOTAL_CPU_DRAM_GIB - MODEL_CHECKPOINT_PAGE_CACHE_GIB) / TP - MODEL_CPU_OFFLOAD_GB - MOONCAKE_LOCAL_BUFFER_GIB))
    if (( PER_RANK_GIB <= 0 )); then
        echo "Error: CPU DRAM budget is too small for checkpoint cache, model, and KV offload" >&2
        exit 1
    fi
    MOONCAKE_VERSION=0.3.11.post1
    agentic_pip_install --quiet --no-cache-dir --no-deps \
        --force-reinstall "mooncake-transfer-engine-cuda13==$MOONCAKE_VERSION"
    python3 -c "from mooncake.store import MooncakeDistributedStore" >/dev/null
    MOONCAKE_MASTER_PORT=$((PORT + 12000))
    MOONCAKE_CONFIG_PATH="$RESULT_DIR/mooncake_config.json"
    cat > "$MOONCAKE_CONFIG_PATH" <<EOF
{
  "mode": "embedded",
  "metadata_server": "P2PHANDSHAKE",
  "master_server_address": "127.0.0.1:$MOONCAKE_MASTER_PORT",
  "global_segment_size": "${PER_RANK_GIB}GB",
  "local_buffer_size": "${MOONCAKE_LOCAL_BUFFER_GIB}GB",
  "protocol": "rdma",
  "device_name": "",
  "enable_offload": false
}
EOF
    export MOONCAKE_CONFIG_PATH PYTHONHASHSEED=0 MC_SLICE_SIZE=1048576 MC_WORKERS_PER_CTX=4
    export MC_ENABLE_DEST_DEVICE_AFFINITY=1
    mooncake_master --port "$MOONCAKE_MASTER_PORT" \
        --eviction_high_watermark_ratio=0.80 \
        --eviction_ratio=0.10 > "$MOONCAKE_MASTER_LOG" 2>&1 &
    MOONCAKE_MASTER_PID=$!
    sleep 2
    kill -0 "$MOONCAKE_MASTER_PID"
    OFFLOAD_ARGS=(
        --kv-transfer-config
        '{"kv_connector":"MooncakeStoreConnector","kv_role":"kv_both","kv_connector_extra_config":{"load_async":true}}'
    )
elif [ "$KV_OFFLOADING" = "nvme" ]; then
    require_agentic_kv_offload_backend vllm-simple
    : "${NVME_OFFLOAD_DIR:?NVME_OFFLOAD_DIR must be mounted by the H100 launcher}"
    NVME_OFFLOAD_TOTAL_BYTES=8000000000000
    NVME_OFFLOAD_PER_RANK_BYTES=$((NVME_OFFLOAD_TOTAL_BYTES / TP))
    # vLLM appends .rank_<CUDA device index> to give each TP rank its own file.
    OFFLOAD_ARGS=(
        --kv-transfer-config
        "{\"kv_connector\":\"SimpleCPUOffloadConnector\",\"kv_role\":\"kv_both\",\"kv_connector_extra_config\":{\"kv_offload_backend\":\"disk\",\"disk_path\":\"$NVME_OFFLOAD_DIR/cache.bin\",\"disk_capacity_bytes\":$NVME_OFFLOAD_PER_RANK_BYTES,\"disk_buffer_slots\":4,\"lazy_offload\":false}}"
    )
elif [ "$KV_OFFLOADING" = "dram+nvme" ]; then
    require_agentic_kv_offload_backend vllm-native
    : "${NVME_OFFLOAD_DIR:?NVME_OFFLOAD_DIR must be mounted by the H100 launcher}"
    TOTAL_CPU_DRAM_GIB=$((TOTAL_CPU_DRAM_GB * 1000000000 / 1073741824))
    PER_RANK_GIB=$(((TOTAL_CPU_DRAM_GIB - MODEL_CHECKPOINT_PAGE_CACHE_GIB) / TP - MODEL_CPU_OFFLOAD_GB - MOONCAKE_LOCAL_BUFFER_GIB))
    if (( PER_RANK_GIB <= 0 )); then
        echo "Error: CPU DRAM budget is too small for checkpoint cache, model, and DRAM+NVMe KV offload" >&2
        exit 1
    fi
    CPU_OFFLOAD_TOTAL_BYTES=$((PER_RANK_GIB * TP * 1073741824))
    OFFLOAD_ARGS=(
        --kv-transfer-config
        "{\"kv_connector\":\"OffloadingConnector\",\"kv_role\":\"kv_both\",\"kv_connector_extra_config\":{\"spec_name\":\"TieringOffloadingSpec\",\"cpu_bytes_to_use\":$CPU_OFFLOAD_TOTAL_BYTES,\"eviction_policy\":\"lru\",\"secondary_tiers\":[{\"type\":\"fs\",\"root_dir\":\"$NVME_OFFLOAD_DIR\",\"n_read_threads\":32,\"n_write_threads\":16,\"locality\":\"LOCAL\"}]}}"
    )
else
    echo "Error: unsupported KV_OFFLOADING='$KV_OFFLOADING'" >&2
    exit 1
fi
