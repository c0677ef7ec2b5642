//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter` (vLLM's) wire types.

use serde::Deserialize;
use utoipa::ToSchema;

/// An adapter to load while serving.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct LoadLoraAdapterRequest {
    /// The name requests will give in `model`.
    pub lora_name: String,
    /// A PEFT directory (adapter_config.json, adapter_model.safetensors) or a GGUF LoRA file
    /// on the server.
    pub lora_path: String,
}

/// An adapter to unload.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct UnloadLoraAdapterRequest {
    pub lora_name: String,
    /// vLLM's id of the adapter: when given, it must be the id this server gave the adapter
    /// (its place in load order, from 1); a different one is a 400.
    #[serde(default)]
    pub lora_int_id: Option<u64>,
}
