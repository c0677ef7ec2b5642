//! `rotary_tables`: the cos/sin tables [`crate::rotary_embedding`] reads, with optional linear,
//! dynamic-NTK, Llama-3 or YaRN frequency scaling. Built once at model load, computed in f64 and
//! stored as f32. Every device reads these tables (the CUDA rotary kernel computes no frequency
//! itself), so a scaling added here works on the CPU and CUDA alike.

use candle_core::{Device, Result, Tensor};
use rayon::prelude::*;

use crate::check::invalid;

const OP: &str = "rotary_tables";

/// How rotary frequencies are stretched for contexts longer than the model was trained on.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RopeScaling {
    #[default]
    None,
    /// Positions divided by `factor` (every frequency slowed equally).
    Linear { factor: f32 },
    /// Llama 3.1's rule: wavelengths longer than `original_max_position_embeddings /
    /// low_freq_factor` are slowed by `factor`, those shorter than `.. / high_freq_factor` kept,
    /// and the band between blended linearly in `original_max_position_embeddings / wavelength`.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
    /// NTK-aware scaling with a fixed base, as vLLM serves `"dynamic"`: the base raised as
    /// transformers' dynamic rule would for a sequence of `factor * original` tokens, for every
    /// position (a cache of rotated keys cannot follow a base that changes with the length).
    DynamicNtk { factor: f32, original_max_position_embeddings: usize },
    /// YaRN (Peng et al. 2023): frequencies that turn fewer than `beta_slow` times over the
    /// original context are interpolated (divided by `factor`), those turning more than
    /// `beta_fast` times kept, with a linear ramp over the dimensions between; cos and sin are
    /// then multiplied by `attention_factor` (see [`yarn_attention_factor`]). `truncate` rounds
    /// the ramp's ends outward to whole dimensions, as transformers does by default.
    Yarn {
        factor: f32,
        original_max_position_embeddings: usize,
        beta_fast: f32,
        beta_slow: f32,
        attention_factor: f32,
        truncate: bool,
    },
}

impl RopeScaling {
    /// What cos and sin are multiplied by: YaRN's attention factor, else 1.
    pub fn attention_factor(&self) -> f32 {
        match self {
            RopeScaling::Yarn { attention_factor, .. } => *attention_factor,
            _ => 1.0,
        }
    }
}

/// YaRN's default attention factor for a context stretched by `factor`: `0.1 * mscale * ln(factor)
/// + 1` (1 when `factor <= 1`), or with DeepSeek's `mscale_all_dim` the ratio of that at `mscale`
/// to that at `mscale_all_dim`.
pub fn yarn_attention_factor(factor: f32, mscale: Option<f32>, mscale_all_dim: Option<f32>) -> f32 {
    let get = |m: f64| if factor <= 1.0 { 1.0 } else { 0.1 * m * (factor as f64).ln() + 1.0 };
    let value = match (mscale, mscale_all_dim) {
        (Some(m), Some(all)) if m != 0.0 && all != 0.0 => get(m as f64) / get(all as f64),
        _ => get(1.0),
    };
    value as f32
}

/// Inverse frequencies `theta^(-2i / head_dim)`, `i < head_dim / 2`, after `scaling`.
pub fn rotary_inv_freq(theta: f32, head_dim: usize, scaling: RopeScaling) -> Result<Vec<f64>> {
    if head_dim == 0 || head_dim % 2 == 1 {
        return Err(invalid(OP, format!("head_dim {head_dim} must be even and positive")));
    }
    if !(theta.is_finite() && theta > 0.0) {
        return Err(invalid(OP, format!("theta {theta} must be positive")));
    }
    let theta = theta as f64;
    let base = (0..head_dim / 2).map(|i| theta.powf(-2.0 * i as f64 / head_dim as f64));
    match scaling {
        RopeScaling::None => Ok(base.collect()),
        RopeScaling::Linear { factor } => {
            let factor = positive(factor, "factor")?;
            Ok(base.map(|f| f / factor).collect())
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let factor = positive(factor, "factor")?;
            let low = positive(low_freq_factor, "low_freq_factor")?;
            let high = positive(high_freq_factor, "high_freq_factor")?;
            if high <= low {
                return Err(invalid(OP, "high_freq_factor must exceed low_freq_factor"));
            }
            if original_max_position_embeddings == 0 {
                return Err(invalid(OP, "original_max_position_embeddings must be positive"));
            }
            let old = original_max_position_embeddings as f64;
            let (low_wavelen, high_wavelen) = (old / low, old / high);
            Ok(base
                .map(|f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_wavelen {
                        f
                    } else if wavelen > low_wavelen {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect())
        }
        RopeScaling::DynamicNtk { factor, original_max_position_embeddings } => {
            let factor = positive(factor, "factor")?;
            if original_max_position_embeddings == 0 {
                return Err(invalid(OP, "original_max_position_embeddings must be positive"));
            }
            if head_dim <= 2 {
                return Err(invalid(OP, "dynamic scaling needs head_dim above 2"));
            }
            // transformers' rule at a length of factor * original tokens.
            let dim = head_dim as f64;
            let base = theta * (factor * factor - (factor - 1.0)).powf(dim / (dim - 2.0));
            Ok((0..head_dim / 2).map(|i| base.powf(-2.0 * i as f64 / dim)).collect())
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            attention_factor,
            truncate,
        } => {
            let factor = positive(factor, "factor")?;
            let fast = positive(beta_fast, "beta_fast")?;
            let slow = positive(beta_slow, "beta_slow")?;
            positive(attention_factor, "attention_factor")?;
            if original_max_position_embeddings == 0 {
                return Err(invalid(OP, "original_max_position_embeddings must be positive"));
            }
            let (dim, old) = (head_dim as f64, original_max_position_embeddings as f64);
            // The dimension index whose frequency turns `rotations` times over the original context.
            let dim_for = |rotations: f64| {
                dim * (old / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
            };
            let (mut low, mut high) = (dim_for(fast), dim_for(slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
            if low == high {
                high += 0.001;
            }
            Ok(base
                .enumerate()
                .map(|(i, f)| {
                    // 0 keeps the frequency (extrapolation), 1 divides it by factor (interpolation).
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    f / factor * ramp + f * (1.0 - ramp)
                })
                .collect())
        }
    }
}

fn positive(v: f32, name: &str) -> Result<f64> {
    if v.is_finite() && v > 0.0 {
        Ok(v as f64)
    } else {
        Err(invalid(OP, format!("{name} {v} must be positive")))
    }
}

/// Builds `(cos, sin)`, each f32 `[max_positions, head_dim / 2]` on `device`, where entry
/// `[p, i]` is the cos/sin of `p * inv_freq[i]` (see [`rotary_inv_freq`]) times the scaling's
/// [`RopeScaling::attention_factor`].
pub fn rotary_tables(
    theta: f32,
    head_dim: usize,
    max_positions: usize,
    scaling: RopeScaling,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let inv_freq = rotary_inv_freq(theta, head_dim, scaling)?;
    rotary_tables_scaled(&inv_freq, max_positions, scaling.attention_factor() as f64, device)
}

/// Builds `(cos, sin)` tables, each f32 `[max_positions, inv_freq.len()]`, from explicit inverse
/// frequencies: for models whose frequencies need adjusting beyond [`RopeScaling`] (e.g. the
/// per-frequency divisors a GGUF stores in `rope_freqs.weight`).
pub fn rotary_tables_from_inv_freq(
    inv_freq: &[f64],
    max_positions: usize,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    rotary_tables_scaled(inv_freq, max_positions, 1.0, device)
}

/// [`rotary_tables_from_inv_freq`] with every entry multiplied by `scale` (in f64, before the
/// rounding to f32): YaRN's attention factor.
pub fn rotary_tables_scaled(
    inv_freq: &[f64],
    max_positions: usize,
    scale: f64,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    if !(scale.is_finite() && scale > 0.0) {
        return Err(invalid(OP, format!("scale {scale} must be positive")));
    }
    if inv_freq.is_empty() {
        return Err(invalid(OP, "no frequencies"));
    }
    if let Some(bad) = inv_freq.iter().find(|f| !f.is_finite()) {
        return Err(invalid(OP, format!("inverse frequency {bad} is not finite")));
    }
    let half = inv_freq.len();
    let mut cos = vec![0f32; max_positions * half];
    let mut sin = vec![0f32; max_positions * half];
    cos.par_chunks_mut(half).zip(sin.par_chunks_mut(half)).enumerate().for_each(|(p, (c, s))| {
        for (i, f) in inv_freq.iter().enumerate() {
            let (sn, cs) = (p as f64 * f).sin_cos();
            c[i] = (cs * scale) as f32;
            s[i] = (sn * scale) as f32;
        }
    });
    Ok((
        Tensor::from_vec(cos, (max_positions, half), device)?,
        Tensor::from_vec(sin, (max_positions, half), device)?,
    ))
}
