//! `rotary_tables`: the cos/sin tables [`crate::rotary_embedding`] reads, with optional linear or
//! Llama-3 frequency scaling. Built once at model load, computed in f64 and stored as f32.

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
/// `[p, i]` is the cos/sin of `p * inv_freq[i]` (see [`rotary_inv_freq`]).
pub fn rotary_tables(
    theta: f32,
    head_dim: usize,
    max_positions: usize,
    scaling: RopeScaling,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let inv_freq = rotary_inv_freq(theta, head_dim, scaling)?;
    rotary_tables_from_inv_freq(&inv_freq, max_positions, device)
}

/// Builds `(cos, sin)` tables, each f32 `[max_positions, inv_freq.len()]`, from explicit inverse
/// frequencies: for models whose frequencies need adjusting beyond [`RopeScaling`] (e.g. the
/// per-frequency divisors a GGUF stores in `rope_freqs.weight`).
pub fn rotary_tables_from_inv_freq(
    inv_freq: &[f64],
    max_positions: usize,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
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
            c[i] = cs as f32;
            s[i] = sn as f32;
        }
    });
    Ok((
        Tensor::from_vec(cos, (max_positions, half), device)?,
        Tensor::from_vec(sin, (max_positions, half), device)?,
    ))
}
