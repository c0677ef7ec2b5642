//! The kernel plan: which matmul kernel a CPU step of each size runs. It is resolved once, by
//! [`KernelRequest::resolve`], from the user's `--cpu-gemm-dtype` and `--batch-invariant`, the
//! CPU's features and, for `auto`, a timing on the model's own weight. The linear layers read the
//! plan and decide nothing themselves.
//!
//! Words used here and in docs/architecture.md's glossary:
//! - a **decode-sized step** has at most [`DECODE_SIZED_MAX_TOKENS`] tokens (decodes of a few
//!   streams, a speculative step's positions); a **prefill-sized step** has more (prefill chunks,
//!   decodes of many streams);
//! - **blocks**: a GGUF weight's quantized blocks multiplied directly with exact f32 activations
//!   (`pagoda_ops::quant_matmul`), the fastest exact kernel for few rows;
//! - **panels**: the weight packed once more, in column panels, for a GEMM
//!   (`pagoda_ops::panel_matmul`): f32 or bfloat16 values, or the blocks' int8 codes times
//!   activations rounded to 8 (`int8`) or 16 (`int16`) bits per block of 32;
//! - **batch-invariant**: one kernel at every step size, each summing in an order that does not
//!   depend on the number of rows, so a row's output does not depend on the rows beside it.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use candle_core::DType;
use pagoda_ops::{PanelPrecision, PanelTiming, QuantizedWeight};

/// The most tokens a decode-sized step has. On a 2-core AVX-512 machine, SmolLM2's 30 layers
/// took 5.7 / 12.2 / 24.9 / 37.4 ms on the blocks at 1 / 8 / 16 / 24 tokens against 12.3 / 14.0
/// / 30.3 / 29.1 ms on f32 panels (`cargo bench -p pagoda-bench --bench matmul`).
pub const DECODE_SIZED_MAX_TOKENS: usize = 16;

/// Activation rows of the timed step: between a 32-stream decode step and a prefill chunk.
pub const PROBE_ROWS: usize = 64;

/// Timed runs of each kernel; the fastest counts.
pub const PROBE_ROUNDS: usize = 5;

/// How much faster than the default kernel another must run to replace it. Near a tie the
/// default stays, so that restarts on one machine do not flip between kernels (outputs' last
/// bits differ between them).
pub const CHALLENGER_MARGIN: f64 = 1.15;

/// The kernel a CPU matmul of a block-quantized weight runs for one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuKernel {
    /// The GGUF blocks times exact f32 activations.
    Blocks,
    /// The weight packed in panels of this precision.
    Panels(PanelPrecision),
}

impl std::fmt::Display for CpuKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CpuKernel::Blocks => "exact f32 blocks",
            CpuKernel::Panels(PanelPrecision::F32) => "f32 panels",
            CpuKernel::Panels(PanelPrecision::Bf16) => "bfloat16 panels",
            CpuKernel::Panels(PanelPrecision::Int8) => "int8 panels (8-bit activations)",
            CpuKernel::Panels(PanelPrecision::Int16) => "int16 panels (16-bit activations)",
        })
    }
}

/// Which kernel each CPU step runs. The default is exact: blocks for decode-sized steps and f32
/// panels for prefill-sized ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelPlan {
    /// Steps of at most [`DECODE_SIZED_MAX_TOKENS`] tokens.
    pub decode_sized: CpuKernel,
    /// Larger steps.
    pub prefill_sized: CpuKernel,
    /// One kernel at every step size (`decode_sized == prefill_sized`) whose sums run in an order
    /// that does not depend on the number of rows. Dense CPU weights are then packed in panels
    /// (candle's GEMM blocks by shape); on CUDA dense weights take the row-invariant kernel.
    pub batch_invariant: bool,
}

impl Default for KernelPlan {
    fn default() -> Self {
        Self::panels(PanelPrecision::F32)
    }
}

impl KernelPlan {
    /// Prefill-sized steps on panels of `precision`; decode-sized ones on the blocks for a float
    /// precision, on the same panels for an integer one (which beat the blocks from one token on).
    pub fn panels(precision: PanelPrecision) -> Self {
        let decode_sized =
            if precision.is_integer() { CpuKernel::Panels(precision) } else { CpuKernel::Blocks };
        Self { decode_sized, prefill_sized: CpuKernel::Panels(precision), batch_invariant: false }
    }

    /// This plan with decode-sized steps on int16 panels.
    pub fn with_int16_decode(self) -> Self {
        Self { decode_sized: CpuKernel::Panels(PanelPrecision::Int16), ..self }
    }

    /// Batch-invariant on `precision`: panels at every step size, or for f32 the exact blocks
    /// (whose batch-invariant loop sums each output in one order).
    pub fn batch_invariant(precision: PanelPrecision) -> Self {
        let kernel =
            if precision == PanelPrecision::F32 { CpuKernel::Blocks } else { CpuKernel::Panels(precision) };
        Self { decode_sized: kernel, prefill_sized: kernel, batch_invariant: true }
    }

    /// The kernel of a step of `tokens` tokens.
    pub fn kernel_for(&self, tokens: usize) -> CpuKernel {
        if tokens <= DECODE_SIZED_MAX_TOKENS {
            self.decode_sized
        } else {
            self.prefill_sized
        }
    }

    /// What a dense f32 weight is packed in when the plan is batch-invariant.
    pub fn dense_precision(&self) -> PanelPrecision {
        match self.prefill_sized {
            CpuKernel::Panels(p) => p,
            CpuKernel::Blocks => PanelPrecision::F32,
        }
    }
}

impl std::fmt::Display for KernelPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.batch_invariant {
            write!(f, "batch-invariant, {} at every step size", self.prefill_sized)
        } else {
            write!(
                f,
                "decode-sized steps (up to {DECODE_SIZED_MAX_TOKENS} tokens) on {}, prefill-sized steps on {}",
                self.decode_sized, self.prefill_sized
            )
        }
    }
}

/// `--cpu-gemm-dtype`: what the user asked the CPU's matmuls to run. The `value(help)`s are the
/// flag's documentation of each value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum CpuGemmDtype {
    /// Chosen from the CPU's features and a timing (see [`KernelRequest::resolve`]).
    #[default]
    #[cfg_attr(
        feature = "clap",
        value(help = "Chosen by the CPU's features and a start-up timing on the model's own weight")
    )]
    Auto,
    #[cfg_attr(feature = "clap", value(alias = "f32", alias = "float"))]
    #[serde(alias = "f32", alias = "float")]
    Float32,
    #[cfg_attr(feature = "clap", value(alias = "bf16"))]
    #[serde(alias = "bf16")]
    Bfloat16,
    /// GGUF weights' integer codes times activations rounded to 8 bits per block of 32
    /// (llama.cpp's precision), at every step size, on CPUs with AVX512-VNNI; elsewhere `auto`.
    Int8,
    /// GGUF weights' integer codes times activations rounded to 16 bits per block of 32 (finer
    /// than bfloat16), at every step size, on CPUs with AVX512-VNNI; elsewhere `auto`.
    Int16,
}

/// The instructions the CPU's kernels need, as this CPU has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuFeatures {
    /// AVX512-BF16: bfloat16 panels run natively (elsewhere their portable loops are slower
    /// than f32's).
    pub bf16: bool,
    /// Vector kernels for the int8 and int16 panels: AVX512-VNNI, AVX-VNNI or AVX2 (elsewhere
    /// they run portable loops, slower than the float panels).
    pub int8: bool,
}

impl CpuFeatures {
    pub fn detect() -> Self {
        Self { bf16: PanelPrecision::cpu_has_native_bf16(), int8: PanelPrecision::cpu_has_native_int8() }
    }
}

/// The user's flags that choose the kernels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelRequest {
    pub cpu_gemm_dtype: CpuGemmDtype,
    pub batch_invariant: bool,
}

/// A resolved plan, with what was measured and what was overridden on the way.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedPlan {
    pub plan: KernelPlan,
    /// The timing `auto` chose prefill-sized steps' kernel by, when it timed.
    pub timing: Option<PanelTiming>,
    /// Why a named dtype was not honoured, for a warning.
    pub fallback: Option<String>,
}

impl KernelRequest {
    /// The plan for this request on a CPU with `cpu`. `time` is called at most once, with the
    /// prefill-sized kernels `auto` chooses among (the default first), and returns their timing
    /// on one of the model's weights, or `None` where the model has no such weight.
    ///
    /// "Integer kernels" are the int8 panels' vector kernels (AVX512-VNNI, AVX-VNNI or AVX2).
    /// - Batch-invariant `auto` is int16 panels where the CPU has integer kernels (as fast as
    ///   the default at 1 and 32 streams), else the exact blocks (bfloat16 panels would halve
    ///   one stream's speed).
    /// - Otherwise `auto` runs decode-sized steps on int16 panels where the CPU has integer
    ///   kernels (faster than the blocks from one token on: 1.6-2.3x on a 1536 x 576 Q4_1
    ///   weight with AVX2 or AVX-512, and one kernel for all of a speculative step's positions),
    ///   else on the blocks. Prefill-sized steps take bfloat16 panels where the CPU has
    ///   AVX512-BF16, else f32 panels, unless f32 or int16 panels (where the CPU has integer
    ///   kernels) time [`CHALLENGER_MARGIN`] times faster on the model's weight.
    /// - A named float dtype keeps the blocks for decode-sized steps; `int8` and `int16` run at
    ///   every step size, and without integer kernels fall back to `auto`.
    pub fn resolve(
        self,
        cpu: CpuFeatures,
        time: impl FnOnce(&[PanelPrecision]) -> Option<PanelTiming>,
    ) -> ResolvedPlan {
        let mut fallback = None;
        let mut dtype = self.cpu_gemm_dtype;
        if matches!(dtype, CpuGemmDtype::Int8 | CpuGemmDtype::Int16) && !cpu.int8 {
            let name = if dtype == CpuGemmDtype::Int8 { "int8" } else { "int16" };
            fallback = Some(format!(
                "--cpu-gemm-dtype {name} needs AVX2 or AVX512-VNNI, which this CPU (or {}) lacks; using auto",
                pagoda_ops::ISA_ENV
            ));
            dtype = CpuGemmDtype::Auto;
        }
        let named = |precision| match self.batch_invariant {
            true => KernelPlan::batch_invariant(precision),
            false => KernelPlan::panels(precision),
        };
        let (plan, timing) = match dtype {
            CpuGemmDtype::Float32 => (named(PanelPrecision::F32), None),
            CpuGemmDtype::Bfloat16 => (named(PanelPrecision::Bf16), None),
            CpuGemmDtype::Int8 => (named(PanelPrecision::Int8), None),
            CpuGemmDtype::Int16 => (named(PanelPrecision::Int16), None),
            CpuGemmDtype::Auto if self.batch_invariant => {
                let precision = if cpu.int8 { PanelPrecision::Int16 } else { PanelPrecision::F32 };
                (KernelPlan::batch_invariant(precision), None)
            }
            CpuGemmDtype::Auto => {
                let default = if cpu.bf16 { PanelPrecision::Bf16 } else { PanelPrecision::F32 };
                let mut candidates = vec![default];
                if default != PanelPrecision::F32 {
                    candidates.push(PanelPrecision::F32);
                }
                if cpu.int8 {
                    candidates.push(PanelPrecision::Int16);
                }
                let timing = if candidates.len() > 1 { time(&candidates) } else { None };
                let prefill = timing.as_ref().map_or(default, |t| fastest(t, default));
                let plan = KernelPlan::panels(prefill);
                (if cpu.int8 { plan.with_int16_decode() } else { plan }, timing)
            }
        };
        ResolvedPlan { plan, timing, fallback }
    }
}

/// The kernel `timing` says is fastest, where it beats `default` by [`CHALLENGER_MARGIN`].
fn fastest(timing: &PanelTiming, default: PanelPrecision) -> PanelPrecision {
    let Some(base) = timing.seconds_of(default) else { return default };
    let best = timing.seconds.iter().filter(|(p, _)| *p != default).min_by(|a, b| a.1.total_cmp(&b.1));
    match best {
        Some(&(p, seconds)) if seconds * CHALLENGER_MARGIN <= base => p,
        _ => default,
    }
}

/// Times `candidates` on the weight `weight` gives, once per model file and process: a second
/// load of `model` takes the first one's timing. Two engines in one process (a draft of the
/// model itself, tests that compare a plain server with another) then run the same kernels,
/// where a timing taken while the other core is busy could choose differently.
pub fn time_once(
    model: &Path,
    candidates: &[PanelPrecision],
    weight: impl FnOnce() -> Option<QuantizedWeight>,
) -> Option<PanelTiming> {
    type Timings = Vec<(PathBuf, Vec<PanelPrecision>, Option<PanelTiming>)>;
    static TIMED: Mutex<Timings> = Mutex::new(Vec::new());
    // Held while timing: two loads at once would also disturb each other's timing.
    let mut timed = TIMED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, _, timing)) = timed.iter().find(|(p, c, _)| p == model && c == candidates) {
        return timing.clone();
    }
    let timing =
        weight().and_then(|w| pagoda_ops::time_panel_kernels(&w, candidates, PROBE_ROWS, PROBE_ROUNDS));
    timed.push((model.to_path_buf(), candidates.to_vec(), timing.clone()));
    timing
}

/// Why `--batch-invariant` cannot run with this device, compute dtype and `--dequantize`, or
/// `None` when it can. The one statement of these rules: the configuration checks them before
/// loading, the loader again for library callers.
pub fn batch_invariant_refusal(cuda: bool, dtype: DType, dequantize: Option<bool>) -> Option<&'static str> {
    if dequantize == Some(false) {
        Some("needs dequantized weights (candle's quantized matmul is not covered)")
    } else if cuda && !matches!(dtype, DType::BF16 | DType::F16) {
        Some("computes in bfloat16 or float16 on CUDA (--dtype bfloat16)")
    } else if !cuda && dtype != DType::F32 {
        Some("computes in float32 on the CPU (--dtype float32)")
    } else {
        None
    }
}

#[cfg(test)]
#[path = "kernel_plan_tests.rs"]
mod tests;
