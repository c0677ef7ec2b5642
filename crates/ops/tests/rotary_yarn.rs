//! YaRN and dynamic-NTK rotary frequencies against transformers' definitions
//! (`_compute_yarn_parameters`, vLLM's fixed-base dynamic NTK) written out here in f64, plus the
//! hand-worked ramp ends for SmolLM2-135M's rope (theta 1e5, head_dim 64, 8192 trained positions).

use candle_core::Device;
use pagoda_ops::{rotary_inv_freq, rotary_tables, yarn_attention_factor, RopeScaling};
use std::f64::consts::PI;

fn yarn(factor: f32, original: usize, truncate: bool) -> RopeScaling {
    RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: yarn_attention_factor(factor, None, None),
        truncate,
    }
}

/// transformers' YaRN inverse frequencies, step by step as its code states them.
fn reference_yarn(theta: f64, dim: usize, factor: f64, original: f64, truncate: bool) -> Vec<f64> {
    let correction_dim = |rot: f64| (dim as f64 * (original / (rot * 2.0 * PI)).ln()) / (2.0 * theta.ln());
    let (mut low, mut high) = (correction_dim(32.0), correction_dim(1.0));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    let low = low.max(0.0);
    let mut high = high.min(dim as f64 - 1.0);
    if low == high {
        high += 0.001;
    }
    (0..dim / 2)
        .map(|i| {
            let pos_freq = theta.powf((2 * i) as f64 / dim as f64);
            let extrapolation = 1.0 / pos_freq;
            let interpolation = 1.0 / (factor * pos_freq);
            let keep = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            interpolation * (1.0 - keep) + extrapolation * keep
        })
        .collect()
}

fn assert_rel(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * y.abs(), "[{i}] {x} vs {y}");
    }
}

#[test]
fn yarn_matches_transformers_formula() {
    for (theta, dim, factor, original, truncate) in [
        (100_000.0, 64, 4.0, 8192, true),
        (10_000.0, 128, 8.0, 4096, true),
        (1_000_000.0, 128, 4.0, 32768, false),
        (10_000.0, 16, 2.0, 64, true),
    ] {
        let ours = rotary_inv_freq(theta as f32, dim, yarn(factor as f32, original, truncate)).unwrap();
        assert_rel(&ours, &reference_yarn(theta, dim, factor, original as f64, truncate), 1e-12);
    }
}

#[test]
fn yarn_ramp_for_smollm2() {
    // low = floor(64 ln(8192 / (32 * 2pi)) / (2 ln 1e5)) = floor(10.30) = 10,
    // high = ceil(64 ln(8192 / (1 * 2pi)) / (2 ln 1e5)) = ceil(19.94) = 20.
    let plain = rotary_inv_freq(1e5, 64, RopeScaling::None).unwrap();
    let inv = rotary_inv_freq(1e5, 64, yarn(4.0, 8192, true)).unwrap();
    for i in 0..=10 {
        assert_eq!(inv[i], plain[i], "[{i}] fast dimensions keep their frequency");
    }
    for i in 20..32 {
        assert!((inv[i] - plain[i] / 4.0).abs() <= 1e-15 * plain[i], "[{i}] slow dimensions interpolate");
    }
    let mid = 0.5 * plain[15] / 4.0 + 0.5 * plain[15];
    assert!((inv[15] - mid).abs() <= 1e-15 * mid, "{} vs {mid}", inv[15]);
}

#[test]
fn yarn_attention_factor_scales_tables() {
    let af = yarn_attention_factor(4.0, None, None) as f64;
    assert!((af - 1.138_629_436_111_989).abs() < 1e-6, "{af}");
    assert_eq!(yarn_attention_factor(1.0, None, None), 1.0);
    assert_eq!(yarn_attention_factor(0.5, None, None), 1.0);
    // DeepSeek's form: the ratio of the two mscales.
    let ratio = (0.1 * 0.707 * 40f64.ln() + 1.0) / (0.1 * 0.707 * 40f64.ln() + 1.0);
    assert!((yarn_attention_factor(40.0, Some(0.707), Some(0.707)) as f64 - ratio).abs() < 1e-6);
    let deep = (0.1 * 1.0 * 40f64.ln() + 1.0) / (0.1 * 0.5 * 40f64.ln() + 1.0);
    assert!((yarn_attention_factor(40.0, Some(1.0), Some(0.5)) as f64 - deep).abs() < 1e-6);

    let scaling = yarn(4.0, 8192, true);
    let inv = reference_yarn(1e5, 64, 4.0, 8192.0, true);
    let (cos, sin) = rotary_tables(1e5, 64, 9000, scaling, &Device::Cpu).unwrap();
    let (cos, sin) = (cos.to_vec2::<f32>().unwrap(), sin.to_vec2::<f32>().unwrap());
    let scale = scaling.attention_factor() as f64;
    for p in [0usize, 1, 4097, 8191, 8999] {
        for (i, f) in inv.iter().enumerate() {
            let (s, c) = (p as f64 * f).sin_cos();
            assert!((cos[p][i] as f64 - c * scale).abs() < 1e-6, "cos[{p}][{i}]");
            assert!((sin[p][i] as f64 - s * scale).abs() < 1e-6, "sin[{p}][{i}]");
        }
    }
}

#[test]
fn dynamic_ntk_fixes_the_base_at_the_longest_context() {
    let inv = rotary_inv_freq(
        10_000.0,
        8,
        RopeScaling::DynamicNtk { factor: 2.0, original_max_position_embeddings: 4096 },
    )
    .unwrap();
    // transformers' dynamic base at seq_len = 2 * 4096: theta * (2 * 8192 / 4096 - 1)^(8 / 6).
    let base = 10_000f64 * 3f64.powf(8.0 / 6.0);
    let expected: Vec<f64> = (0..4).map(|i| 1.0 / base.powf((2 * i) as f64 / 8.0)).collect();
    assert_rel(&inv, &expected, 1e-12);
    // Factor 1 is no scaling.
    let one = RopeScaling::DynamicNtk { factor: 1.0, original_max_position_embeddings: 4096 };
    assert_eq!(rotary_inv_freq(1e4, 8, one).unwrap(), rotary_inv_freq(1e4, 8, RopeScaling::None).unwrap());
}

#[test]
fn linear_factor_one_is_bit_identical_to_none() {
    let cpu = &Device::Cpu;
    let (c0, s0) = rotary_tables(1e5, 64, 300, RopeScaling::None, cpu).unwrap();
    let (c1, s1) = rotary_tables(1e5, 64, 300, RopeScaling::Linear { factor: 1.0 }, cpu).unwrap();
    assert_eq!(c0.to_vec2::<f32>().unwrap(), c1.to_vec2::<f32>().unwrap());
    assert_eq!(s0.to_vec2::<f32>().unwrap(), s1.to_vec2::<f32>().unwrap());
}

#[test]
fn bad_yarn_fields_are_errors() {
    let with = |f: &dyn Fn(&mut RopeScaling)| {
        let mut s = yarn(4.0, 8192, true);
        f(&mut s);
        rotary_inv_freq(1e4, 64, s).unwrap_err().to_string()
    };
    let set = |s: &mut RopeScaling, name: &str, v: f32| {
        if let RopeScaling::Yarn { factor, beta_fast, attention_factor, .. } = s {
            match name {
                "factor" => *factor = v,
                "beta_fast" => *beta_fast = v,
                _ => *attention_factor = v,
            }
        }
    };
    assert!(with(&|s| set(s, "factor", 0.0)).contains("factor"));
    assert!(with(&|s| set(s, "beta_fast", f32::NAN)).contains("beta_fast"));
    assert!(with(&|s| set(s, "attention_factor", -1.0)).contains("attention_factor"));
    let zero = RopeScaling::Yarn {
        factor: 4.0,
        original_max_position_embeddings: 0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        attention_factor: 1.0,
        truncate: true,
    };
    assert!(rotary_inv_freq(1e4, 64, zero)
        .unwrap_err()
        .to_string()
        .contains("original_max_position_embeddings"));
}
