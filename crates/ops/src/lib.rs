//! `pagoda-ops`: the custom tensor ops of the model's forward pass (paged attention, KV-cache
//! write, rotary embedding, RMSNorm, SiLU- and GELU-and-mul, the LoRA delta of a step mixing
//! adapters, a matmul over GGUF-quantized weights with
//! f32 activations, and a GEMM over weights packed once into panels: f32, bfloat16, or the
//! blocks' int8 codes with 8- or 16-bit activations), as candle custom ops.
//!
//! Each op is a candle `CustomOp*` / `InplaceOp*` with a multi-threaded CPU implementation in
//! Rust (the reference, used by tests and the CPU backend). Math is always f32; tensors may be
//! stored as f32, f16 or bf16, and KV caches also as FP8 (e4m3) codes with per-tensor
//! [`KvScales`] (`fp8_e4m3`: the codec FP8 weights share). With the `cuda` feature each op also has a `cuda_fwd` that
//! launches our kernels from `kernels/*.cu` (see `cuda`), behind the same public functions. The
//! KV-cache layout, metadata contract and launch shapes are documented in `kernels/README.md`.
//!
//! `skinny_matmul` is the CUDA matmul of decode steps (up to 8 rows in models): tensor cores,
//! each weight streamed once, the same bits for a row whatever the batch. `DeviceQuantWeight`
//! keeps GGUF blocks quantized on CUDA: decode steps multiply the blocks directly, larger steps
//! a copy dequantized for the call. `DeviceFp8Weight` does the same for FP8 (e4m3) weights with
//! a scale per row ([`Fp8Weight`], quantized from dense rows).
//!
//! `gelu_erf` (the exact GELU over a vectorised `erf`), `add_layer_norm` and `encoder_attention`
//! are the CPU steps of a BERT encoder besides its matmuls, on plain f32 buffers rather than
//! candle tensors (`encoder_cpu`): fused passes, each one rayon region.
//!
//! `time_panel_kernels` times panel kernels on one weight, so that the kernel plan
//! (`pagoda_models::kernel_plan`) chooses the fastest by measurement (`gemm_probe`).
//!
//! `device_memory` and the pool's peak (`reset_peak_memory`, `peak_memory`) size the KV cache from
//! free GPU memory. `sample_on_device` is the GPU sampler (one token per row of logits that stay on the device);
//! on the CPU the engine's sampler does that work.
//!
//! Errors are `candle_core::Error` values: bad shapes, dtypes, devices, out-of-range slots or
//! positions, and inconsistent metadata are reported, never panicked on.

mod attention_group;
mod attention_merge;
mod attention_plan;
mod attention_scores;
mod check;
mod cuda;
mod device_memory;
mod device_sampler;
mod dtype;
mod encoder_cpu;
mod fp8_e4m3;
mod gated_activation;
mod gelu;
mod kv_cache;
mod lora;
mod lora_cpu;
mod lora_kernels;
mod matmul;
mod metadata;
mod paged_attention;
mod paged_attention_cpu;
mod par_rows;
mod rms_norm;
mod rotary;
mod rotary_tables;
mod simd;
mod write_in_place;

pub use device_memory::{device_memory, peak_memory, reset_peak_memory, DeviceMemory};
pub use device_sampler::{sample_on_device, DeviceSampleInput, DeviceSampleOutput, DEVICE_SAMPLE_ROW_BYTES};
pub use encoder_cpu::{add_layer_norm, encoder_attention, EncoderAttentionShape};
pub use fp8_e4m3::{fp8_e4m3_value, FP8_E4M3_MAX};
pub use gated_activation::{gelu_tanh_and_mul, silu_and_mul};
pub use gelu::{add_bias_gelu_erf, erf, gelu_erf};
pub use kv_cache::{reshape_and_cache, reshape_and_cache_scaled, KvScales, PADDING_SLOT};
pub use lora::{lora_add, lora_add_parts, LoraPart, LoraSegment};
pub use matmul::device_fp8::{DeviceFp8Weight, FP8_KERNEL_K_STEP, FP8_KERNEL_MAX_ROWS, FP8_MATMUL_MAX_ROWS};
pub use matmul::device_quant::{
    DeviceQuantWeight, QuantLaunch, QUANT_KERNEL_MAX_ROWS, QUANT_MATMUL_MAX_ROWS,
};
pub use matmul::fp8_weight::Fp8Weight;
pub use matmul::gemm_probe::{time_panel_kernels, PanelTiming};
pub use matmul::panel_matmul::{panel_matmul, PanelPrecision, PanelWeight, PANEL};
pub use matmul::quant_matmul::{quant_matmul, quant_matmul_batch_invariant};
pub use matmul::quant_weight::{QuantFormat, QuantizedWeight, QUANT_BLOCK};
pub use matmul::skinny_matmul::{
    row_invariant_matmul, skinny_matmul, skinny_matmul_fits, skinny_matmul_preferred, skinny_matmul_with,
    SkinnyLaunch, SKINNY_MAX_ROWS, SKINNY_MODEL_ROWS,
};
pub use metadata::{AttentionMetadata, HostAttentionMetadata, NULL_BLOCK};
pub use paged_attention::{
    cuda_attention_covers, paged_attention, paged_attention_with, AttentionParams, CUDA_ATTENTION_HEAD_DIMS,
};
pub use rms_norm::{add_rms_norm, rms_norm};
pub use rotary::{rotary_embedding, RotaryStyle};
pub use rotary_tables::{
    rotary_inv_freq, rotary_tables, rotary_tables_from_inv_freq, rotary_tables_scaled, yarn_attention_factor,
    RopeScaling,
};
pub use simd::{cpu_isa, ISA_ENV};
pub use write_in_place::write_u32_in_place;
