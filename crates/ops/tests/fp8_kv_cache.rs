//! An FP8 (e4m3) KV cache with per-tensor scales: `reshape_and_cache_scaled` stores the code
//! nearest each scaled value (found here by searching all codes), and `paged_attention_with`
//! over the codes gives what it gives over a float cache holding `scale * value(code)`.

mod common;

use candle_core::{DType, Device, Result, Tensor};
use common::{assert_close, err_text, random_tensor, rng, values};
use pagoda_ops::{
    fp8_e4m3_value, paged_attention_with, reshape_and_cache, reshape_and_cache_scaled, AttentionMetadata,
    AttentionParams, HostAttentionMetadata, KvScales, PADDING_SLOT,
};
use rand::seq::SliceRandom;

const FP8: DType = DType::F8E4M3;

/// The codes of an FP8 tensor.
fn codes(t: &Tensor) -> Vec<u8> {
    t.flatten_all().unwrap().to_vec1::<float8::F8E4M3>().unwrap().iter().map(|c| c.to_bits()).collect()
}

/// The code whose value is nearest `x` among zero and the normal finite codes (saturating at
/// ±448), by search: what the encoder must produce, up to ties.
fn nearest_code_distance(x: f32) -> f32 {
    let x = x.clamp(-448.0, 448.0);
    (0..=255u8)
        .map(fp8_e4m3_value)
        .filter(|v| v.is_finite() && (*v == 0.0 || v.abs() >= 1.0 / 64.0))
        .map(|v| (v - x).abs())
        .fold(f32::INFINITY, f32::min)
}

#[test]
fn rows_are_stored_as_the_nearest_codes_of_their_scaled_values() {
    let (nb, bs, kvh, hd) = (5, 4, 2, 16);
    let row = kvh * hd;
    let scales = KvScales { k: 0.03, v: 0.007 };
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let mut rng = rng(3);
        let mut slots: Vec<u32> = (0..(nb * bs) as u32).collect();
        slots.shuffle(&mut rng);
        slots.truncate(7);
        slots[4] = PADDING_SLOT;
        // Magnitudes from far below a code's smallest normal to past 448 once scaled.
        let spread = |t: Tensor| -> Tensor {
            let n = t.elem_count();
            let gain: Vec<f32> = (0..n).map(|i| 10f32.powi((i % 9) as i32 - 5)).collect();
            (t.to_dtype(DType::F32).unwrap() * Tensor::from_vec(gain, t.shape(), &Device::Cpu).unwrap())
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
        };
        let k = spread(random_tensor(&mut rng, &[slots.len(), kvh, hd], DType::F32).unwrap());
        let v = spread(random_tensor(&mut rng, &[slots.len(), kvh, hd], DType::F32).unwrap());
        let kc = Tensor::zeros((nb, bs, kvh, hd), FP8, &Device::Cpu).unwrap();
        let vc = Tensor::zeros((nb, bs, kvh, hd), FP8, &Device::Cpu).unwrap();
        let sm = Tensor::new(slots.as_slice(), &Device::Cpu).unwrap();
        reshape_and_cache_scaled(&k, &v, &kc, &vc, &sm, scales).unwrap();
        for (cache, src, scale) in [(&kc, &k, scales.k), (&vc, &v, scales.v)] {
            let (got, src) = (codes(cache), values(src));
            let inv = 1.0 / scale;
            let mut written = vec![false; nb * bs];
            for (t, &s) in slots.iter().enumerate().filter(|(_, &s)| s != PADDING_SLOT) {
                written[s as usize] = true;
                for e in 0..row {
                    let x = src[t * row + e] * inv;
                    let code = got[s as usize * row + e];
                    let err = (fp8_e4m3_value(code) - x.clamp(-448.0, 448.0)).abs();
                    assert_eq!(err, nearest_code_distance(x), "{dtype:?} {x} -> {code:#04x}");
                    assert!(code & 0x78 != 0 || code & 0x07 == 0, "subnormal code {code:#04x}");
                }
            }
            for (s, _) in written.iter().enumerate().filter(|(_, &w)| !w) {
                assert!(got[s * row..(s + 1) * row].iter().all(|&c| c == 0), "slot {s} was written");
            }
        }
    }
}

/// Sequences `(context, new tokens)` at shuffled blocks of 8: their K/V written through
/// `reshape_and_cache_scaled` into FP8 caches, and the caches dequantized into f32 ones.
struct Fp8Batch {
    q: Tensor,
    fp8: (Tensor, Tensor),
    dequantized: (Tensor, Tensor),
    meta: AttentionMetadata,
}

fn fp8_batch(
    seqs: &[(usize, usize)],
    kvh: usize,
    group: usize,
    hd: usize,
    scales: KvScales,
) -> Result<Fp8Batch> {
    let bs = 8;
    let mut rng = rng(11);
    let needed: Vec<usize> = seqs.iter().map(|(c, _)| c.div_ceil(bs)).collect();
    let num_blocks = needed.iter().sum::<usize>() + 2;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(&mut rng);
    let width = needed.iter().max().copied().unwrap_or(0);
    let (mut tables, mut slots, mut cu, mut ctx) =
        (vec![0u32; seqs.len() * width], vec![], vec![0u32], vec![]);
    let mut next = 0;
    for (i, &(context, q_len)) in seqs.iter().enumerate() {
        tables[i * width..i * width + needed[i]].copy_from_slice(&ids[next..next + needed[i]]);
        next += needed[i];
        // Every position is written here, the cached prefix as well as the new tokens.
        slots.extend((0..context).map(|p| tables[i * width + p / bs] * bs as u32 + (p % bs) as u32));
        cu.push(cu[i] + q_len as u32);
        ctx.push(context as u32);
    }
    let dev = &Device::Cpu;
    let rows = slots.len();
    // K around 10 and V around 0.1, as the scales expect; neither a multiple of a code.
    let k = (random_tensor(&mut rng, &[rows, kvh, hd], DType::F32)? * 10.0)?;
    let v = (random_tensor(&mut rng, &[rows, kvh, hd], DType::F32)? * 0.1)?;
    let shape = (num_blocks, bs, kvh, hd);
    let (kc, vc) = (Tensor::zeros(shape, FP8, dev)?, Tensor::zeros(shape, FP8, dev)?);
    let sm = Tensor::new(slots.as_slice(), dev)?;
    reshape_and_cache_scaled(&k, &v, &kc, &vc, &sm, scales)?;
    let dequantized =
        ((kc.to_dtype(DType::F32)? * scales.k as f64)?, (vc.to_dtype(DType::F32)? * scales.v as f64)?);
    // The step's queries are each sequence's last q_len positions.
    let new_slots: Vec<u32> = {
        let mut out = Vec::new();
        let mut at = 0;
        for &(context, q_len) in seqs {
            out.extend_from_slice(&slots[at + context - q_len..at + context]);
            at += context;
        }
        out
    };
    let host = HostAttentionMetadata {
        slot_mapping: new_slots,
        cu_seqlens_q: cu,
        context_lens: ctx,
        block_tables: tables,
        max_blocks_per_seq: width,
    };
    let meta = AttentionMetadata::from_host(host, dev)?;
    let tokens = seqs.iter().map(|(_, q)| q).sum::<usize>();
    let q = (random_tensor(&mut rng, &[tokens, kvh * group, hd], DType::F32)? * 0.5)?;
    Ok(Fp8Batch { q, fp8: (kc, vc), dequantized, meta })
}

#[test]
fn attention_over_codes_equals_attention_over_their_scaled_values() {
    let seqs = [(150, 1), (40, 17), (9, 9), (300, 1), (1, 1)];
    let scales = KvScales { k: 0.04, v: 0.0009 };
    for (kvh, group, hd) in [(2, 4, 64), (1, 3, 128), (4, 1, 32)] {
        let b = fp8_batch(&seqs, kvh, group, hd, scales).unwrap();
        let base = AttentionParams::scaled(1.0 / (hd as f32).sqrt());
        let variants = [
            base,
            AttentionParams { window: Some(20), ..base },
            AttentionParams { logit_softcap: Some(3.0), ..base },
        ];
        for params in variants {
            let (kd, vd) = &b.dequantized;
            let want = paged_attention_with(&b.q, kd, vd, &b.meta, params).unwrap();
            let (kc, vc) = &b.fp8;
            let fp8_params = AttentionParams { kv_scales: scales, ..params };
            for q_dtype in [DType::F32, DType::BF16] {
                let q = b.q.to_dtype(q_dtype).unwrap();
                let got = paged_attention_with(&q, kc, vc, &b.meta, fp8_params).unwrap();
                assert_eq!(got.dtype(), q_dtype);
                let want = match q_dtype {
                    DType::F32 => want.clone(),
                    _ => paged_attention_with(&q, kd, vd, &b.meta, params).unwrap(),
                };
                let what = format!("kvh {kvh} group {group} hd {hd} {params:?} q {q_dtype:?}");
                // The same sums, the scales applied at other points: f32 rounding apart.
                let tol = if q_dtype == DType::F32 { 2e-6 } else { 8e-3 };
                assert_close(
                    &got.to_dtype(DType::F32).unwrap(),
                    &want.to_dtype(DType::F32).unwrap(),
                    tol * 0.1,
                    tol,
                    &what,
                );
            }
        }
        // Not the values of the codes themselves: without its scales the output is far off.
        let (kc, vc) = &b.fp8;
        let unscaled = paged_attention_with(&b.q, kc, vc, &b.meta, base).unwrap();
        let (kd, vd) = &b.dequantized;
        let want = paged_attention_with(&b.q, kd, vd, &b.meta, base).unwrap();
        let gap = values(&(unscaled - &want).unwrap()).iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(gap > 0.1, "the scales made no difference ({gap})");
    }
}

#[test]
fn scales_must_be_positive_finite_and_unit_for_a_float_cache() {
    let dev = &Device::Cpu;
    let shape = (2, 4, 1, 16);
    let kv = Tensor::zeros((1, 1, 16), DType::F32, dev).unwrap();
    let sm = Tensor::new(&[3u32], dev).unwrap();
    let (f32_k, f32_v) =
        (Tensor::zeros(shape, DType::F32, dev).unwrap(), Tensor::zeros(shape, DType::F32, dev).unwrap());
    let scaled = KvScales { k: 0.5, v: 1.0 };
    let msg = err_text(reshape_and_cache_scaled(&kv, &kv, &f32_k, &f32_v, &sm, scaled));
    assert!(msg.contains("need an f8e4m3 cache"), "{msg}");
    let (fp8_k, fp8_v) = (Tensor::zeros(shape, FP8, dev).unwrap(), Tensor::zeros(shape, FP8, dev).unwrap());
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let msg =
            err_text(reshape_and_cache_scaled(&kv, &kv, &fp8_k, &fp8_v, &sm, KvScales { k: 1.0, v: bad }));
        assert!(msg.contains("positive and finite"), "{msg}");
    }
    // The unit-scale write into an FP8 cache is the scaled one with scales of 1.
    reshape_and_cache(&(&kv + 3.3).unwrap(), &kv, &fp8_k, &fp8_v, &sm).unwrap();
    assert_eq!(codes(&fp8_k)[3 * 16], 0x45, "3.3 rounds to 3.25");
    // Caches of two dtypes, and attention with scales over a float cache, are refused.
    let msg = err_text(reshape_and_cache_scaled(&kv, &kv, &fp8_k, &f32_v, &sm, scaled));
    assert!(msg.contains("dtype"), "{msg}");
    let host = HostAttentionMetadata {
        slot_mapping: vec![3],
        cu_seqlens_q: vec![0, 1],
        context_lens: vec![4],
        block_tables: vec![0],
        max_blocks_per_seq: 1,
    };
    let meta = AttentionMetadata::from_host(host, dev).unwrap();
    let params = AttentionParams { kv_scales: scaled, ..AttentionParams::scaled(0.25) };
    let msg = err_text(paged_attention_with(&kv, &f32_k, &f32_v, &meta, params));
    assert!(msg.contains("need an f8e4m3 cache"), "{msg}");
    let out = paged_attention_with(&kv, &fp8_k, &fp8_v, &meta, params).unwrap();
    assert_eq!(out.dims(), &[1, 1, 16]);
}
