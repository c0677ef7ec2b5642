//! The matmuls, together: over GGUF blocks with exact f32 activations (`quant_matmul`, the
//! blocks' layout in `quant_weight`), over weights packed once into panels of f32, bfloat16 or the
//! blocks' int8 codes (`panel_matmul`, with `int8_matmul` and `int16_matmul` for 8- and 16-bit
//! activations), their x86 kernels (`*_x86`), the timing the kernel plan chooses by
//! (`gemm_probe`), the dense CPU weight interface (`cpu_matmul`), CUDA's decode-step matmul
//! (`skinny_matmul`), GGUF blocks kept quantized on CUDA (`device_quant`) and FP8 weights with a
//! scale per row (`fp8_weight`, on CUDA `device_fp8`). Which of them a
//! model runs is `pagoda_models::kernel_plan`'s decision.

pub(crate) mod cpu_matmul;
pub(crate) mod device_fp8;
pub(crate) mod device_quant;
pub(crate) mod fp8_weight;
pub(crate) mod gemm_probe;
pub(crate) mod int16_matmul;
#[cfg(target_arch = "x86_64")]
pub(crate) mod int16_matmul_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod int16_matmul_x86;
pub(crate) mod int8_matmul;
#[cfg(target_arch = "x86_64")]
pub(crate) mod int8_matmul_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod int8_matmul_x86;
#[cfg(target_arch = "x86_64")]
pub(crate) mod nibble_avx2;
pub(crate) mod panel_matmul;
#[cfg(target_arch = "x86_64")]
pub(crate) mod panel_matmul_x86;
#[cfg(target_arch = "x86_64")]
pub(crate) mod panel_prefetch;
pub(crate) mod quant_matmul;
#[cfg(target_arch = "x86_64")]
pub(crate) mod quant_matmul_x86;
pub(crate) mod quant_random;
pub(crate) mod quant_weight;
pub(crate) mod skinny_matmul;
