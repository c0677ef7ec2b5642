//! [`RuntimePlan`]: what a model will run on, said once at start-up in one `kernel plan: ...`
//! line: the device, the compute and KV-cache dtypes, the matmul kernels of each step size (the
//! CPU's [`KernelPlan`], resolved here and nowhere else) and the step's token budget. The line
//! holds no timings, so the same flags on the same machine give the same text in `pagoda serve`,
//! `pagoda generate` and `pagoda-bench-offline`.

use candle_core::DType;
use pagoda_models::{resolve_kernel_plan, KernelPlan, LoadOptions, ModelError, ResolvedPlan};

use crate::options::RuntimeOptions;

/// What a model runs on and how its steps are cut.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimePlan {
    /// `cpu` or `cuda:N`.
    pub device: String,
    pub dtype: DType,
    pub kv_cache_dtype: DType,
    /// The CPU's matmul kernels (on CUDA only `batch_invariant` applies).
    pub kernels: KernelPlan,
    /// Most tokens in one step (`--max-num-batched-tokens`).
    pub step_budget: usize,
}

/// The dtype's name as PyTorch spells it (`float16`, ...).
pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F8E4M3 => "fp8_e4m3",
        _ => "other",
    }
}

impl std::fmt::Display for RuntimePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kernel plan: {}, {} compute, {} KV cache; ",
            self.device,
            dtype_name(self.dtype),
            dtype_name(self.kv_cache_dtype)
        )?;
        match (self.device == "cpu", self.kernels.batch_invariant) {
            (true, _) => write!(f, "{} ({} instructions)", self.kernels, pagoda_ops::cpu_isa())?,
            (false, true) => f.write_str("batch-invariant, the row-invariant matmul at every step size")?,
            (false, false) => f.write_str("dense matmuls on the skinny kernel up to 8 rows, cuBLAS above")?,
        }
        write!(f, "; step budget {} tokens", self.step_budget)
    }
}

/// How `options` open the model file (device, dtype, dequantization, format): what the plan's
/// resolution reads it with, and the base of what the model is loaded with.
pub(crate) fn model_load_options(options: &RuntimeOptions) -> LoadOptions {
    LoadOptions {
        device: options.device.clone(),
        dtype: options.dtype,
        dequantize: options.settings.dequantize,
        format: options.settings.load_format,
        ..LoadOptions::default()
    }
}

/// The plan `options` resolve to, with what the resolution measured (see
/// [`pagoda_models::resolve_kernel_plan`]).
pub fn resolve_plan(options: &RuntimeOptions) -> Result<(RuntimePlan, ResolvedPlan), ModelError> {
    let resolved =
        resolve_kernel_plan(&options.model, &model_load_options(options), options.settings.kernels)?;
    let plan = RuntimePlan {
        device: options.settings.device.to_string(),
        dtype: options.dtype,
        kv_cache_dtype: options.kv_cache_dtype,
        kernels: resolved.plan,
        step_budget: options.settings.max_num_batched_tokens,
    };
    Ok((plan, resolved))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_ops::PanelPrecision;

    #[test]
    fn the_line_names_device_dtypes_kernels_and_budget() {
        let plan = RuntimePlan {
            device: "cpu".into(),
            dtype: DType::F32,
            kv_cache_dtype: DType::F16,
            kernels: KernelPlan::panels(PanelPrecision::Bf16).with_int16_decode(),
            step_budget: 512,
        };
        assert_eq!(
            plan.to_string(),
            format!(
                "kernel plan: cpu, float32 compute, float16 KV cache; decode-sized steps (up to 16 tokens) on \
             int16 panels (16-bit activations), prefill-sized steps on bfloat16 panels ({} instructions); step budget \
             512 tokens",
                pagoda_ops::cpu_isa()
            )
        );
        let cuda =
            RuntimePlan { device: "cuda:0".into(), dtype: DType::BF16, kv_cache_dtype: DType::BF16, ..plan };
        assert!(
            cuda.to_string().contains("cuda:0, bfloat16 compute, bfloat16 KV cache; dense matmuls"),
            "{cuda}"
        );
    }
}
