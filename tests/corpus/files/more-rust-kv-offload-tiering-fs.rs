//! Builds vLLM's `--kv-transfer-config` for the filesystem-backed KV offload tier
//! (`OffloadingConnector` + `TieringOffloadingSpec`), confirmed working end-to-end against
//! this project's installed vLLM 0.30.0 (real cross-process KV reuse after SIGKILL,
//! verified via `/metrics`). Two gaps that vLLM itself doesn't cover, found the same way:
//! its own directory hash omits model/tokenizer revision and engine version (never trust
//! it as a compatibility fingerprint — see `crate::checkpoint`), and it doesn't unlink its
//! `/dev/shm/vllm_offload_<engine_id>.mmap` on a killed worker (`cleanup_shm` below closes
//! that leak using a pinned, not vLLM-randomized, `engine_id`).
use std::path::{Path, PathBuf};

/// Small enough to be a reasonable default on a 16 GB workstation RAM budget; real budgets
/// belong in a future per-model profile, not hardcoded further than this.
pub const DEFAULT_CPU_BYTES: u64 = 256 * 1024 * 1024;

pub fn engine_id_for_session(session_id: &str) -> String {
    format!("ralph-{session_id}")
}

pub(super) fn kv_transfer_config_json(root_dir: &Path, cpu_bytes: u64, engine_id: &str) -> String {
    serde_json::json!({
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "engine_id": engine_id,
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": cpu_bytes,
            "secondary_tiers": [{
                "type": "fs",
                "root_dir": root_dir.to_string_lossy(),
            }],
        },
    })
    .to_string()
}
