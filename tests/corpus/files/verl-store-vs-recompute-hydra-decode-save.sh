STORE_ARGS=()
if [ "$ARM" = "store" ]; then
  STORE_ARGS=(
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_transfer_config={kv_connector: DecodeKVSavingConnector, kv_connector_module_path: py_inference_scheduler.datalayer.connectors.mooncake.decode_save, kv_role: kv_both, kv_connector_extra_config: {save_decode_kv: true}}"
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.prefix_caching_hash_algo=sha256_cbor"
  )
fi
