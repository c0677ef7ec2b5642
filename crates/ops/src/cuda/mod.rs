//! The CUDA side of the ops: each op's `cuda_fwd` launches a kernel from `kernels/*.cu`
//! (compiled to PTX by build.rs, embedded, loaded through candle's CUDA device) on candle's
//! stream. The kernel contracts, launch shapes and cache layout are in kernels/README.md.
//!
//! `plan` (attention work planning) and `launch` (kernel launches as plain data) are pure
//! Rust and always compiled, so their tests run without a GPU and the kernel simulator tests
//! (`sim_tests`, feature `kernel-sim`) drive the kernels through exactly the launches the
//! CUDA path makes. The rest needs the `cuda` feature.

#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

pub(crate) mod fp8;
pub(crate) mod launch;
pub(crate) mod lora;
pub(crate) mod plan;
pub(crate) mod quant;
pub(crate) mod skinny;

#[cfg(feature = "cuda")]
pub(crate) mod activation;
#[cfg(feature = "cuda")]
pub(crate) mod attention;
#[cfg(feature = "cuda")]
pub(crate) mod device;
#[cfg(feature = "cuda")]
pub(crate) mod fp8_ops;
#[cfg(feature = "cuda")]
pub(crate) mod kv_cache;
#[cfg(feature = "cuda")]
pub(crate) mod matmul;
#[cfg(feature = "cuda")]
pub(crate) mod norm;
#[cfg(feature = "cuda")]
mod ptx;
#[cfg(feature = "cuda")]
pub(crate) mod quant_ops;
#[cfg(feature = "cuda")]
pub(crate) mod rotary;
#[cfg(feature = "cuda")]
pub(crate) mod sampling;

#[cfg(all(test, feature = "kernel-sim"))]
mod sim;
#[cfg(all(test, feature = "kernel-sim"))]
mod sim_attention_tests;
#[cfg(all(test, feature = "kernel-sim"))]
mod sim_fp8_tests;
#[cfg(all(test, feature = "kernel-sim"))]
mod sim_lora_tests;
#[cfg(all(test, feature = "kernel-sim"))]
mod sim_quant_tests;
#[cfg(all(test, feature = "kernel-sim"))]
mod sim_replay_tests;
#[cfg(all(test, feature = "kernel-sim"))]
mod sim_sampling_tests;
#[cfg(all(test, feature = "kernel-sim"))]
mod sim_tests;
#[cfg(all(test, feature = "kernel-sim"))]
mod sim_window_tests;
