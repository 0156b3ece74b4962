vllm serve /mnt/data4/models/Qwen/Qwen3-8B --enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3 --served-model-name my-model claude-haiku-4-5-20251001 claude-sonnet-4-6 claude-opus-4-6 gpt-5 --kv-transfer-config '{
  "kv_connector":"MultiConnector",
  "kv_role":"kv_both",
  "kv_connector_extra_config": {
    "connectors": [
      {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
          "cpu_bytes_to_use": 64424509440
        }
      },
      {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
          "spec_name": "FileOffloadingSpec",
          "storage_dir": "/mnt/files-storage/",
          "num_blocks": 64
        }
      }
    ]
  }
}'
