//! rotary_embedding against candle-nn's rope_i / rope on the equivalent [b, h, t, d] layout,
//! and rotary_tables against the Hugging Face formulas written out here.

mod common;

use candle_core::{DType, Device, Result, Tensor};
use common::{assert_close, random_tensor, rng};
use pagoda_ops::{
    rotary_embedding, rotary_inv_freq, rotary_tables, rotary_tables_from_inv_freq, RopeScaling, RotaryStyle,
};
use rand::Rng;

/// candle-nn's rope on `x` `[T, H, D]` with per-token positions: gather the table rows, move
/// to `[1, H, T, D]`, rotate, move back.
fn candle_rope(
    x: &Tensor,
    positions: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    style: RotaryStyle,
) -> Result<Tensor> {
    let dtype = x.dtype();
    let x4 = x.to_dtype(DType::F32)?.transpose(0, 1)?.unsqueeze(0)?.contiguous()?;
    let (c, s) = (cos.index_select(positions, 0)?, sin.index_select(positions, 0)?);
    let y = match style {
        RotaryStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x4, &c, &s)?,
        RotaryStyle::Halves => candle_nn::rotary_emb::rope(&x4, &c, &s)?,
    };
    y.squeeze(0)?.transpose(0, 1)?.to_dtype(dtype)
}

#[test]
fn matches_candle_nn_rope_for_both_styles() {
    let (t, heads, kv_heads, hd, max_pos) = (37, 6, 2, 64, 4096);
    let (cos, sin) = rotary_tables(10_000.0, hd, max_pos, RopeScaling::None, &Device::Cpu).unwrap();
    for (seed, dtype) in [(1, DType::F32), (2, DType::BF16), (3, DType::F16)] {
        let mut rng = rng(seed);
        let positions: Vec<u32> = (0..t).map(|_| rng.random_range(0..max_pos as u32)).collect();
        let positions = Tensor::new(positions.as_slice(), &Device::Cpu).unwrap();
        let q = random_tensor(&mut rng, &[t, heads, hd], dtype).unwrap();
        let k = random_tensor(&mut rng, &[t, kv_heads, hd], dtype).unwrap();
        for style in [RotaryStyle::Interleaved, RotaryStyle::Halves] {
            let (qr, kr) = rotary_embedding(&q, &k, &positions, &cos, &sin, style).unwrap();
            assert_eq!((qr.dtype(), kr.dtype()), (dtype, dtype));
            let (atol, rtol) = if dtype == DType::F32 { (1e-6, 1e-6) } else { (1e-2, 1e-2) };
            let what = format!("{style:?} {dtype:?}");
            assert_close(&qr, &candle_rope(&q, &positions, &cos, &sin, style).unwrap(), atol, rtol, &what);
            assert_close(&kr, &candle_rope(&k, &positions, &cos, &sin, style).unwrap(), atol, rtol, &what);
        }
    }
}

#[test]
fn styles_pair_different_elements() {
    // Position 1 with a single frequency of 90 degrees: Interleaved rotates (x0, x1), Halves (x0, x2).
    let cpu = &Device::Cpu;
    let cos = Tensor::new(&[[1f32, 1.0], [0.0, 1.0]], cpu).unwrap();
    let sin = Tensor::new(&[[0f32, 0.0], [1.0, 0.0]], cpu).unwrap();
    let x = Tensor::new(&[[[1f32, 2.0, 3.0, 4.0]]], cpu).unwrap();
    let pos = Tensor::new(&[1u32], cpu).unwrap();
    let (i, _) = rotary_embedding(&x, &x, &pos, &cos, &sin, RotaryStyle::Interleaved).unwrap();
    let (h, _) = rotary_embedding(&x, &x, &pos, &cos, &sin, RotaryStyle::Halves).unwrap();
    assert_eq!(i.flatten_all().unwrap().to_vec1::<f32>().unwrap(), vec![-2.0, 1.0, 3.0, 4.0]);
    assert_eq!(h.flatten_all().unwrap().to_vec1::<f32>().unwrap(), vec![-3.0, 2.0, 1.0, 4.0]);
}

#[test]
fn rejects_bad_arguments() {
    let cpu = &Device::Cpu;
    let (cos, sin) = rotary_tables(10_000.0, 8, 16, RopeScaling::None, cpu).unwrap();
    let mut rng = rng(4);
    let q = random_tensor(&mut rng, &[2, 2, 8], DType::F32).unwrap();
    let k = random_tensor(&mut rng, &[2, 1, 8], DType::F32).unwrap();
    let pos = Tensor::new(&[0u32, 15], cpu).unwrap();
    assert!(rotary_embedding(&q, &k, &pos, &cos, &sin, RotaryStyle::Halves).is_ok());
    // Position 16 is past a 16-row table.
    let far = Tensor::new(&[0u32, 16], cpu).unwrap();
    let e = rotary_embedding(&q, &k, &far, &cos, &sin, RotaryStyle::Halves).unwrap_err();
    assert!(matches!(e, candle_core::Error::InvalidIndex { index: 16, size: 16, .. }), "{e}");
    // Positions not u32, wrong count.
    let pos_i64 = Tensor::new(&[0i64, 1], cpu).unwrap();
    assert!(rotary_embedding(&q, &k, &pos_i64, &cos, &sin, RotaryStyle::Halves).is_err());
    let pos1 = Tensor::new(&[0u32], cpu).unwrap();
    assert!(rotary_embedding(&q, &k, &pos1, &cos, &sin, RotaryStyle::Halves).is_err());
    // k with a different token count or head dim.
    let k3 = random_tensor(&mut rng, &[3, 1, 8], DType::F32).unwrap();
    assert!(rotary_embedding(&q, &k3, &pos, &cos, &sin, RotaryStyle::Halves).is_err());
    // Odd head dim, and a table of the wrong width.
    let q_odd = random_tensor(&mut rng, &[2, 2, 7], DType::F32).unwrap();
    let k_odd = random_tensor(&mut rng, &[2, 1, 7], DType::F32).unwrap();
    assert!(rotary_embedding(&q_odd, &k_odd, &pos, &cos, &sin, RotaryStyle::Halves).is_err());
    let narrow_cos = cos.narrow(1, 0, 2).unwrap().contiguous().unwrap();
    assert!(rotary_embedding(&q, &k, &pos, &narrow_cos, &sin, RotaryStyle::Halves).is_err());
    // f16 tables are rejected (they must be f32).
    let cos16 = cos.to_dtype(DType::F16).unwrap();
    assert!(rotary_embedding(&q, &k, &pos, &cos16, &sin, RotaryStyle::Halves).is_err());
}

/// Hugging Face's `_compute_llama3_parameters`, written in its vectorised "where" form.
fn hf_llama3_inv_freq(theta: f64, dim: usize, factor: f64, low: f64, high: f64, old: f64) -> Vec<f64> {
    let inv: Vec<f64> = (0..dim).step_by(2).map(|i| 1.0 / theta.powf(i as f64 / dim as f64)).collect();
    let (low_wl, high_wl) = (old / low, old / high);
    inv.iter()
        .map(|&f| {
            let wl = 2.0 * std::f64::consts::PI / f;
            let llama = if wl > low_wl { f / factor } else { f };
            let smooth = (old / wl - low) / (high - low);
            let smoothed = (1.0 - smooth) * llama / factor + smooth * llama;
            let is_medium = wl >= high_wl && wl <= low_wl;
            if is_medium {
                smoothed
            } else {
                llama
            }
        })
        .collect()
}

#[test]
fn llama3_tables_match_the_reference_formula() {
    let (theta, hd) = (500_000.0f32, 128);
    let scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    let expected_inv = hf_llama3_inv_freq(theta as f64, hd, 8.0, 1.0, 4.0, 8192.0);
    let inv = rotary_inv_freq(theta, hd, scaling).unwrap();
    let plain = rotary_inv_freq(theta, hd, RopeScaling::None).unwrap();
    // All three regimes occur: kept, blended, divided by the factor.
    let kept = inv.iter().zip(&plain).filter(|(a, b)| a == b).count();
    let divided = inv.iter().zip(&plain).filter(|(a, b)| (*a - *b / 8.0).abs() < 1e-15).count();
    assert!(kept > 0 && divided > 0 && kept + divided < inv.len(), "{kept} {divided}");

    let max_pos = 100_001;
    let (cos, sin) = rotary_tables(theta, hd, max_pos, scaling, &Device::Cpu).unwrap();
    assert_eq!(cos.dims(), &[max_pos, hd / 2]);
    for p in [0usize, 1, 17, 8191, 65_536, 100_000] {
        let c = cos.get(p).unwrap().to_vec1::<f32>().unwrap();
        let s = sin.get(p).unwrap().to_vec1::<f32>().unwrap();
        for (i, f) in expected_inv.iter().enumerate() {
            assert!((inv[i] - f).abs() <= 1e-12 * f, "inv_freq {i}");
            let angle = p as f64 * f;
            assert!((c[i] as f64 - angle.cos()).abs() < 1e-6, "cos p {p} i {i}");
            assert!((s[i] as f64 - angle.sin()).abs() < 1e-6, "sin p {p} i {i}");
        }
    }
}

#[test]
fn linear_scaling_divides_positions() {
    let cpu = &Device::Cpu;
    let (c1, s1) = rotary_tables(10_000.0, 64, 100, RopeScaling::None, cpu).unwrap();
    let (c2, s2) = rotary_tables(10_000.0, 64, 200, RopeScaling::Linear { factor: 2.0 }, cpu).unwrap();
    for p in [0usize, 3, 50, 99] {
        let a = c1.get(p).unwrap();
        let b = c2.get(2 * p).unwrap();
        assert_close(&b, &a, 1e-6, 0.0, "cos");
        assert_close(&s2.get(2 * p).unwrap(), &s1.get(p).unwrap(), 1e-6, 0.0, "sin");
    }
}

#[test]
fn tables_from_explicit_frequencies() {
    let cpu = &Device::Cpu;
    // Dividing the frequencies by per-frequency factors, as GGUF rope_freqs do.
    let factors = [1.0, 2.0, 4.0, 8.0];
    let inv: Vec<f64> = rotary_inv_freq(10_000.0, 8, RopeScaling::None)
        .unwrap()
        .iter()
        .zip(factors)
        .map(|(f, k)| f / k)
        .collect();
    let (cos, sin) = rotary_tables_from_inv_freq(&inv, 10, cpu).unwrap();
    let (c, s) = (cos.to_vec2::<f32>().unwrap(), sin.to_vec2::<f32>().unwrap());
    for p in 0..10 {
        for i in 0..4 {
            let angle = p as f64 * 10_000f64.powf(-2.0 * i as f64 / 8.0) / factors[i];
            assert!(
                (c[p][i] as f64 - angle.cos()).abs() < 1e-6 && (s[p][i] as f64 - angle.sin()).abs() < 1e-6
            );
        }
    }
    assert!(rotary_tables_from_inv_freq(&[], 10, cpu).is_err());
    assert!(rotary_tables_from_inv_freq(&[f64::NAN], 10, cpu).is_err());
}

#[test]
fn table_parameters_are_validated() {
    let cpu = &Device::Cpu;
    assert!(rotary_tables(10_000.0, 7, 4, RopeScaling::None, cpu).is_err());
    assert!(rotary_tables(0.0, 8, 4, RopeScaling::None, cpu).is_err());
    assert!(rotary_tables(10_000.0, 8, 4, RopeScaling::Linear { factor: 0.0 }, cpu).is_err());
    let bad = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 4.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    assert!(rotary_tables(10_000.0, 8, 4, bad, cpu).is_err());
    let bad = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 0,
    };
    assert!(rotary_tables(10_000.0, 8, 4, bad, cpu).is_err());
}
