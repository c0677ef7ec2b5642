//! The model's and engine's flags, shared by `pagoda serve` (and its TOML file), `pagoda
//! generate` and `pagoda-bench-offline`: [`EngineArgs`] as given, and [`EngineSettings`] with
//! every default filled in and every combination checked. The defaults are stated here and
//! nowhere else, so the three commands run the same kernels and step budget for the same flags.
//!
//! Every field of [`EngineArgs`] is an `Option` (`None`: not given), so a flag is declared once
//! for clap and a config file alike, and layers need no per-field code: `pagoda serve` reads its
//! file into an `EngineArgs` and applies the command line over it with clap's
//! [`clap::FromArgMatches::update_from_arg_matches`], which sets only the flags given. Defaults
//! are filled in once, by [`EngineArgs::settings`], from the constants below.

use std::path::PathBuf;

use pagoda_models::{CpuGemmDtype, KernelRequest, LoadFormat, PoolingKind, WeightQuantization};
use serde::Deserialize;

use crate::flags::{ByteSize, DeviceArg, DtypeArg, KvCacheDtypeArg};
use crate::kv_offload::KvOffloadTier;
use crate::lora_args::{LoraArgs, LoraSettings};
use crate::speculative_config::{self, SpeculativeSetting};

/// What is served when no `--model` is given.
pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Most sequences in one step when none is given.
pub const DEFAULT_MAX_NUM_SEQS: usize = 256;

/// Requests allowed to wait for admission when none is given.
pub const DEFAULT_MAX_WAITING_REQUESTS: usize = 1024;

/// Tokens per KV-cache block when none is given.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// KV-cache size on the CPU when none is given (a GPU sizes it from free memory).
pub const DEFAULT_CPU_KV_CACHE_BYTES: u64 = 1 << 30;

/// The fraction of GPU memory used when none is given.
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// The step token budget when none is given. On the CPU a step's time grows with its tokens,
/// so a 2048-token prefill chunk stalls every running decode for seconds. Measured at 32
/// streams, 512 tokens lost no throughput, halved TTFT p50 and the longest stall, and cost
/// decodes some TPOT (benches/reports/2026-11-25-step-token-budget-cpu.md).
pub fn default_max_num_batched_tokens(device: DeviceArg) -> usize {
    match device {
        DeviceArg::Cpu => 512,
        DeviceArg::Cuda(_) => 2048,
    }
}

#[derive(Debug, thiserror::Error)]
#[error("invalid value for {flag}: {message}")]
pub struct ArgsError {
    pub flag: &'static str,
    pub message: String,
}

fn invalid(flag: &'static str, message: impl Into<String>) -> ArgsError {
    ArgsError { flag, message: message.into() }
}

/// The model's and engine's flags. Every field is optional so that a config file can supply it.
#[derive(Debug, Clone, Default, clap::Args, Deserialize)]
#[command(next_help_heading = "Model and engine")]
#[serde(rename_all = "kebab-case")]
pub struct EngineArgs {
    /// The model: a GGUF file, a Hugging Face model directory (config.json + safetensors),
    /// or, with --load-format dummy, a config.json shape file. [default: models/SmolLM2-135M-Instruct.Q4_1.gguf]
    #[arg(long, value_name = "PATH")]
    pub model: Option<String>,
    /// Hugging Face cache for `--model ORG/NAME` or `ORG/NAME/FILE.gguf`. [default: $HF_HOME]
    #[arg(long, value_name = "DIR")]
    pub download_dir: Option<PathBuf>,
    /// Tokenizer: a GGUF file, or a Hugging Face directory with tokenizer.json. [default: the model]
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<String>,
    /// How to read the weights.
    #[arg(long, value_enum)]
    pub load_format: Option<LoadFormat>,
    /// Longest prompt plus completion, in tokens. [default: the model's context length, capped by
    /// what the KV cache holds]
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Rope scaling in place of the model's own, as JSON in transformers' `rope_scaling` shape
    /// (vLLM's `--hf-overrides '{"rope_scaling": ...}'`): `{"rope_type": "yarn", "factor": 4.0,
    /// "original_max_position_embeddings": 8192}` (also `beta_fast` [32], `beta_slow` [1],
    /// `attention_factor` [0.1 ln(factor) + 1], `mscale`, `mscale_all_dim`, `truncate` [true]),
    /// `"linear"`, `"dynamic"` (NTK with the base fixed for the longest context, as vLLM),
    /// `"llama3"` (`low_freq_factor` [1], `high_freq_factor` [4]) or `"default"` (none).
    /// The model then covers `factor * original_max_position_embeddings` positions (the original
    /// defaults to the model's trained context), and --max-model-len may go that far. A draft
    /// model (--speculative-config) gets the same scaling. [default: the model's]
    #[arg(long, value_name = "JSON")]
    pub rope_scaling: Option<String>,
    /// Most sequences in one engine step. [default: 256]
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Token budget of one engine step (prefill chunks plus decodes). [default: 512 on the CPU,
    /// 2048 on CUDA]
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Sequences allowed to wait for admission (a request with n = 4 counts 4, a call with
    /// several prompts counts them all); beyond that a request gets 429, and a call that could
    /// never fit gets 400. [default: 1024]
    #[arg(long)]
    pub max_waiting_requests: Option<usize>,
    /// Tokens per KV-cache block. [default: 16]
    #[arg(long)]
    pub block_size: Option<usize>,
    /// KV-cache size, e.g. 2GiB or 536870912. [default: 1GiB on the CPU; on a GPU, sized by
    /// --gpu-memory-utilization]
    #[arg(long, value_name = "BYTES")]
    pub kv_cache_memory: Option<ByteSize>,
    /// Fraction of GPU memory Pagoda may use, in (0, 1]: the KV cache gets what is left of it
    /// after the weights, everything else in use and the peak of a profiling step at
    /// --max-num-batched-tokens. Unless --kv-cache-memory is given. [default: 0.9]
    #[arg(long)]
    pub gpu_memory_utilization: Option<f64>,
    /// Use exactly this many KV blocks, ignoring the memory settings.
    #[arg(long)]
    pub num_gpu_blocks_override: Option<usize>,
    /// Reuse KV blocks of identical prompt prefixes (on by default).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub enable_prefix_caching: Option<bool>,
    /// Turn prefix caching off.
    #[arg(long, conflicts_with = "enable_prefix_caching")]
    #[serde(skip)]
    pub no_enable_prefix_caching: bool,
    /// Offload tiers behind the prefix cache: `host:SIZE` (host memory) and/or
    /// `disk:PATH:SIZE` (one file per block under the directory PATH, reopened after a restart
    /// by a server with the same model and cache layout), e.g. `--kv-offload host:2GiB
    /// disk:/var/cache/pagoda:20GiB`. A block entering the prefix cache is copied to each tier;
    /// a prompt whose prefix the cache has lost is loaded back from the first tier holding it
    /// instead of recomputed. Each tier drops its least recently used blocks past SIZE.
    /// [default: none]
    #[arg(long, num_args = 1.., value_name = "TIER")]
    pub kv_offload: Option<Vec<KvOffloadTier>>,
    /// Compute dtype.
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeArg>,
    /// KV-cache storage dtype; auto: float16 when computing in float32 (as llama.cpp), else
    /// the compute dtype. fp8: e4m3 codes with a K and a V scale per cache slot, calibrated at
    /// start-up on a built-in text (half of a 16-bit cache's memory; not with a draft model).
    /// [default: auto]
    #[arg(long, value_enum)]
    pub kv_cache_dtype: Option<KvCacheDtypeArg>,
    /// CPU, GGUF models: what the matmuls multiply weights and activations in, summing in float32.
    /// auto: decode-sized steps (up to 16 tokens) on the weights' codes times activations
    /// rounded to 16 bits per block of 32 on CPUs with AVX2 or AVX512-VNNI, else on the exact
    /// blocks;
    /// prefill-sized steps on bfloat16 (AVX512-BF16) or else float32 panels, unless another
    /// kernel the CPU runs natively (float32, int16) beats that by 1.15x in a start-up timing on
    /// the model's own weight. float32 and bfloat16 keep the exact blocks for decode-sized steps;
    /// int8 and int16 run at every step size (int8: llama.cpp's 8-bit activations). The chosen
    /// plan is logged as `kernel plan: ...`. [default: auto]
    #[arg(long, value_enum)]
    pub cpu_gemm_dtype: Option<CpuGemmDtype>,
    /// Every step runs the same kernels whatever its size, so a request's tokens and logprobs
    /// are bit-identical however it is batched: alone or beside others, cached or not, chunked,
    /// preempted or speculated (docs/numerics.md). CPU (float32): with auto, the int16 kernel on
    /// CPUs with AVX2 or AVX512-VNNI, else the exact f32 block kernel, or the --cpu-gemm-dtype named.
    /// CUDA (bfloat16/float16): our skinny matmul at every step, attention per token.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub batch_invariant: Option<bool>,
    /// CUDA: run every step eagerly, without the CUDA graphs that otherwise replay decode steps
    /// of up to --max-num-seqs sequences (at most 128; each batch size captured the first time
    /// a step needs it). Always eager on the CPU and with --batch-invariant.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub enforce_eager: Option<bool>,
    /// Speculative decoding, as JSON in vLLM's shape: `{"method": "ngram",
    /// "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2,
    /// "disable_by_batch_size": 4}`, or `"method": "suffix"` (proposals also from recent
    /// requests' outputs; `suffix_decoding_max_tree_depth`, `_max_cached_requests`,
    /// `_max_spec_factor`, `_min_token_prob`), or `"method": "draft_model", "model": "self",
    /// "num_draft_layers": N` (the model's first N layers draft), or `"method": "draft_model",
    /// "model": PATH` (a smaller model with the same vocabulary drafts, with its own KV cache
    /// sharing the target's blocks). Outputs keep the target model's distribution;
    /// greedy and seeded ones stay the same tokens. `disable_by_batch_size` defaults to 4 on the
    /// CPU and 32 on CUDA. [default: off]
    #[arg(long, value_name = "JSON")]
    pub speculative_config: Option<String>,
    /// Dequantize GGUF weights to --dtype instead of running quantized matmuls.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub dequantize: Option<bool>,
    /// fp8: quantize every layer's projections (experts too; not the embeddings, the lm head
    /// or an MoE router) to FP8 e4m3 with a scale per output channel as the model loads, from
    /// a bf16, f16 or f32 checkpoint (a GGUF's blocks are dequantized first). CUDA
    /// keeps one byte per weight and multiplies decode steps on FP8 codes; the CPU keeps the
    /// FP8-rounded values dense (the GPU's numbers, no memory saved). [default: none]
    #[arg(long, value_enum)]
    pub quantization: Option<WeightQuantization>,
    /// Serve /v1/embeddings from a generating model too: its final-normed hidden states pooled
    /// (last token, mean, or first token) and L2-normalized. For an embedding model, replaces
    /// the pooling its files declare. [default: off for generating models]
    #[arg(long, value_name = "POOLING")]
    pub pooling: Option<PoolingKind>,
    /// cpu, cuda or cuda:N. [default: cpu]
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<DeviceArg>,
    #[command(flatten)]
    #[serde(flatten)]
    pub lora: LoraArgs,
}

impl EngineArgs {
    /// The settings these flags ask for, defaults filled in and checked. A config file's values
    /// are layered under the command line's before this (see the module's docs).
    pub fn settings(self) -> Result<EngineSettings, ArgsError> {
        let no_prefix_caching = self.no_enable_prefix_caching;
        let a = self;
        let model_is_default = a.model.is_none();
        let device = a.device.unwrap_or_default();
        let settings = EngineSettings {
            model: a.model.unwrap_or_else(|| DEFAULT_MODEL.to_owned()),
            model_is_default,
            download_dir: a.download_dir,
            tokenizer: a.tokenizer,
            load_format: a.load_format.unwrap_or_default(),
            dequantize: a.dequantize,
            quantization: a.quantization,
            pooling: a.pooling,
            device,
            dtype: a.dtype.unwrap_or_default(),
            kv_cache_dtype: a.kv_cache_dtype.unwrap_or_default(),
            kernels: KernelRequest {
                cpu_gemm_dtype: a.cpu_gemm_dtype.unwrap_or_default(),
                batch_invariant: a.batch_invariant.unwrap_or(false),
            },
            enforce_eager: a.enforce_eager.unwrap_or(false),
            block_size: a.block_size.unwrap_or(DEFAULT_BLOCK_SIZE),
            kv_cache_memory: a.kv_cache_memory.map(|b| b.0),
            gpu_memory_utilization: a.gpu_memory_utilization.unwrap_or(DEFAULT_GPU_MEMORY_UTILIZATION),
            num_gpu_blocks_override: a.num_gpu_blocks_override,
            max_model_len: a.max_model_len,
            rope_scaling: a
                .rope_scaling
                .map(|json| pagoda_models::RopeScalingOverride::parse(&json))
                .transpose()
                .map_err(|e| invalid("--rope-scaling", e.to_string()))?,
            max_num_seqs: a.max_num_seqs.unwrap_or(DEFAULT_MAX_NUM_SEQS),
            max_num_batched_tokens: a
                .max_num_batched_tokens
                .unwrap_or_else(|| default_max_num_batched_tokens(device)),
            max_waiting_requests: a.max_waiting_requests.unwrap_or(DEFAULT_MAX_WAITING_REQUESTS),
            enable_prefix_caching: !no_prefix_caching && a.enable_prefix_caching.unwrap_or(true),
            kv_offload: a.kv_offload.unwrap_or_default(),
            speculative: a
                .speculative_config
                .map(|json| speculative_config::parse(&json, device))
                .transpose()
                .map_err(|message| invalid("--speculative-config", message))?,
            lora: a.lora.settings()?,
        };
        settings.check()?;
        Ok(settings)
    }
}

/// The model and engine settings, resolved and checked, before anything is loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSettings {
    pub model: String,
    /// Whether `model` is the built-in default (for the "run `make model`" hint).
    pub model_is_default: bool,
    pub download_dir: Option<PathBuf>,
    pub tokenizer: Option<String>,
    pub load_format: LoadFormat,
    pub dequantize: Option<bool>,
    /// `--quantization`: how layer projections are stored.
    pub quantization: Option<WeightQuantization>,
    /// `--pooling`: how embeddings pool, when asked for.
    pub pooling: Option<PoolingKind>,
    pub device: DeviceArg,
    pub dtype: DtypeArg,
    pub kv_cache_dtype: KvCacheDtypeArg,
    /// `--cpu-gemm-dtype` and `--batch-invariant`, which the kernel plan resolves.
    pub kernels: KernelRequest,
    /// No CUDA graphs (`--enforce-eager`).
    pub enforce_eager: bool,
    pub block_size: usize,
    pub kv_cache_memory: Option<u64>,
    pub gpu_memory_utilization: f64,
    pub num_gpu_blocks_override: Option<usize>,
    pub max_model_len: Option<usize>,
    /// `--rope-scaling`: replaces the model's rope scaling and sets its positions.
    pub rope_scaling: Option<pagoda_models::RopeScalingOverride>,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_waiting_requests: usize,
    pub enable_prefix_caching: bool,
    /// `--kv-offload`: the prefix cache's offload tiers.
    pub kv_offload: Vec<KvOffloadTier>,
    pub speculative: Option<SpeculativeSetting>,
    /// LoRA adapters, when served (`--enable-lora`).
    pub lora: Option<LoraSettings>,
}

impl EngineSettings {
    fn check(&self) -> Result<(), ArgsError> {
        if self.max_model_len == Some(0) {
            return Err(invalid("--max-model-len", "must be at least 1"));
        }
        if self.max_num_seqs == 0 {
            return Err(invalid("--max-num-seqs", "must be at least 1"));
        }
        if self.max_num_batched_tokens == 0 {
            return Err(invalid("--max-num-batched-tokens", "must be at least 1"));
        }
        if !(1..=1024).contains(&self.block_size) {
            return Err(invalid("--block-size", format!("must be in [1, 1024], got {}", self.block_size)));
        }
        if !(self.gpu_memory_utilization > 0.0 && self.gpu_memory_utilization <= 1.0) {
            return Err(invalid(
                "--gpu-memory-utilization",
                format!("must be in (0, 1], got {}", self.gpu_memory_utilization),
            ));
        }
        if self.kv_cache_memory == Some(0) || self.num_gpu_blocks_override == Some(0) {
            return Err(invalid("--kv-cache-memory", "the KV cache needs at least one block"));
        }
        crate::kv_offload::check(&self.kv_offload).map_err(|m| invalid("--kv-offload", m))?;
        if !self.kv_offload.is_empty() && !self.enable_prefix_caching {
            return Err(invalid("--kv-offload", "offloads the prefix cache: leave prefix caching on"));
        }
        if self.kernels.batch_invariant {
            let cuda = matches!(self.device, DeviceArg::Cuda(_));
            let dtype = self.dtype.compute(self.device);
            if let Some(why) =
                pagoda_models::kernel_plan::batch_invariant_refusal(cuda, dtype, self.dequantize)
            {
                return Err(invalid("--batch-invariant", why));
            }
            if self.quantization.is_some() {
                return Err(invalid("--quantization", "has no batch-invariant kernels (--batch-invariant)"));
            }
        }
        Ok(())
    }
}
