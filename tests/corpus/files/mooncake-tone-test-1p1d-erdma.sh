    local port
    local kv_role

    if [ "$ISREMOTE" == "0" ]; then 
        host=$LOCAL_IP
        vllm_server_log_path=/test_run/run/logs/$test_case_name/$model_name_clean/vllm_server_local.log
        port=8020
        kv_role="kv_consumer"
    else
        host=$REMOTE_IP
        vllm_server_log_path=/test_run/run/logs/$test_case_name/$model_name_clean/vllm_server_remote.log
        port=8010
        kv_role="kv_producer"
    fi

    local kv_config_json="{\\\"kv_connector\\\":\\\"MooncakeConnector\\\",\\\"kv_role\\\":\\\"$kv_role\\\"}"

    local extra_args="--tensor-parallel-size 2 --max-model-len 32768 --gpu-memory-utilization 0.85 --no-enable-prefix-caching --kv-transfer-config '$kv_config_json'"
    
    local env_vars="CUDA_VISIBLE_DEVICES=6,7"
    
    if ! launch_vllm_server "$model_name" "$host" "$port" "$vllm_server_log_path" "$kv_role" "$extra_args" "$env_vars"; then
        return 1
    fi

    return 0
