INFER_BACKEND=vllm-llmd-pd \
actor_rollout_ref.rollout.disaggregation.prefill_replicas=<N> \
actor_rollout_ref.rollout.disaggregation.decode_replicas=<N> \
+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_transfer_config.kv_connector=NixlConnector \
+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_transfer_config.kv_role=kv_both \
+actor_rollout_ref.model.external_lib=llm_d_rl_verl_integration.register_pd
