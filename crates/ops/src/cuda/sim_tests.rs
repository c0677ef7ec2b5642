//! Every CUDA kernel, run by the CPU simulator through the launches the CUDA path makes,
//! against the CPU op on random inputs: several shapes, dtypes, strided views, block sizes,
//! GQA ratios and context lengths (including non-multiples of the block size), outputs
//! poisoned with NaN before each run. Catches indexing, masking and fragment-layout mistakes
//! without a GPU; the GPU check (scripts/gpu-check.sh) repeats the comparison on hardware.
//! Paged attention's cases are in `sim_attention_tests.rs`; the helpers here serve them all.

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::launch::{self, NormArgs, RotaryArgs, SiluArgs};
use super::sim;
use super::skinny::{self, SkinnyArgs, SkinnyLaunch};

pub(super) const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Host memory standing in for device memory: a tensor's elements in its storage dtype.
pub(super) enum HostBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    U32(Vec<u32>),
    /// FP8 codes.
    U8(Vec<u8>),
}

impl HostBuf {
    /// The elements of `t` (contiguous, row-major).
    pub(super) fn of(t: &Tensor) -> HostBuf {
        let flat = t.flatten_all().unwrap();
        match t.dtype() {
            DType::F32 => HostBuf::F32(flat.to_vec1().unwrap()),
            DType::F16 => HostBuf::F16(flat.to_vec1().unwrap()),
            DType::BF16 => HostBuf::BF16(flat.to_vec1().unwrap()),
            DType::U32 => HostBuf::U32(flat.to_vec1().unwrap()),
            DType::F8E4M3 => {
                HostBuf::U8(flat.to_vec1::<float8::F8E4M3>().unwrap().iter().map(|c| c.to_bits()).collect())
            }
            other => panic!("no host buffer for {other:?}"),
        }
    }

    /// `len` elements of NaN (or u32::MAX), so anything a kernel fails to write shows.
    pub(super) fn poisoned(dtype: DType, len: usize) -> HostBuf {
        match dtype {
            DType::F32 => HostBuf::F32(vec![f32::NAN; len]),
            DType::F16 => HostBuf::F16(vec![f16::NAN; len]),
            DType::BF16 => HostBuf::BF16(vec![bf16::NAN; len]),
            _ => HostBuf::U32(vec![u32::MAX; len]),
        }
    }

    pub(super) fn words(words: Vec<u32>) -> HostBuf {
        HostBuf::U32(words)
    }

    /// The "device" address of element `offset`.
    pub(super) fn addr(&mut self, offset: usize) -> u64 {
        match self {
            HostBuf::F32(v) => v[offset..].as_mut_ptr() as u64,
            HostBuf::F16(v) => v[offset..].as_mut_ptr() as u64,
            HostBuf::BF16(v) => v[offset..].as_mut_ptr() as u64,
            HostBuf::U32(v) => v[offset..].as_mut_ptr() as u64,
            HostBuf::U8(v) => v[offset..].as_mut_ptr() as u64,
        }
    }

    pub(super) fn to_f32(&self) -> Vec<f32> {
        match self {
            HostBuf::F32(v) => v.clone(),
            HostBuf::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostBuf::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostBuf::U32(v) => v.iter().map(|&x| x as f32).collect(),
            HostBuf::U8(v) => v.iter().map(|&c| crate::fp8_e4m3_value(c)).collect(),
        }
    }
}

pub(super) fn random(rng: &mut StdRng, shape: &[usize], dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
    Tensor::from_vec(values, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

pub(super) fn f32_values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

/// Largest absolute difference over the largest reference magnitude; NaN counts as infinite.
pub(super) fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| if g.is_finite() { (g - w).abs() } else { f32::INFINITY })
        .fold(0f32, f32::max);
    worst / scale
}

pub(super) fn tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        _ => 1e-2,
    }
}

pub(super) fn run(l: Option<launch::KernelLaunch>) {
    if let Some(l) = l {
        sim::run(&l).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn rms_norm_and_add_rms_norm_match_cpu() {
    let mut rng = StdRng::seed_from_u64(1);
    for dtype in DTYPES {
        for w_dtype in DTYPES {
            // 9000 is past NORM_REGS elements per thread at 1024 threads: the two-pass path.
            for (rows, hidden, pad) in [(1, 64, 0), (5, 576, 8), (3, 2048, 0), (2, 9000, 0)] {
                let full = random(&mut rng, &[rows, hidden + pad], dtype);
                let x = full.narrow(1, 0, hidden).unwrap();
                let residual = random(&mut rng, &[rows, hidden], dtype);
                let w = random(&mut rng, &[hidden], w_dtype);
                let mut xb = HostBuf::of(&full);
                let mut rb = HostBuf::of(&residual);
                let mut wb = HostBuf::of(&w);

                let want = f32_values(&crate::rms_norm(&x, &w, 1e-5).unwrap());
                let mut out = HostBuf::poisoned(dtype, rows * hidden);
                let args = NormArgs {
                    x_dtype: dtype,
                    w_dtype,
                    x: xb.addr(0),
                    x_row_stride: hidden + pad,
                    weight: wb.addr(0),
                    out: out.addr(0),
                    rows,
                    hidden,
                    eps: 1e-5,
                };
                run(launch::rms_norm(&args).unwrap());
                let err = rel_err(&out.to_f32(), &want);
                assert!(err <= tolerance(dtype), "rms_norm {dtype:?}/{w_dtype:?} {rows}x{hidden}: {err}");

                let (normed, summed) = crate::add_rms_norm(&x, &residual, &w, 1e-5).unwrap();
                let mut want = f32_values(&normed);
                want.extend(f32_values(&summed));
                let mut out = HostBuf::poisoned(dtype, 2 * rows * hidden);
                let args = NormArgs { out: out.addr(0), ..args };
                run(launch::add_rms_norm(&args, rb.addr(0), hidden).unwrap());
                let err = rel_err(&out.to_f32(), &want);
                assert!(err <= tolerance(dtype), "add_rms_norm {dtype:?}/{w_dtype:?} {rows}x{hidden}: {err}");
            }
        }
    }
}

#[test]
fn rotary_matches_cpu_in_both_styles() {
    let mut rng = StdRng::seed_from_u64(2);
    let max_positions = 64;
    let inv_freq = crate::rotary_inv_freq(10_000.0, 64, Default::default()).unwrap();
    for head_dim in [64, 128] {
        let inv: Vec<f64> = inv_freq.iter().copied().cycle().take(head_dim / 2).collect();
        let (cos, sin) = crate::rotary_tables_from_inv_freq(&inv, max_positions, &Device::Cpu).unwrap();
        for dtype in DTYPES {
            for style in [crate::RotaryStyle::Interleaved, crate::RotaryStyle::Halves] {
                let (tokens, heads, extra) = (7, 6, 2);
                let full = random(&mut rng, &[tokens, heads + extra, head_dim], dtype);
                let q = full.narrow(1, 0, heads).unwrap();
                let k = random(&mut rng, &[tokens, 2, head_dim], dtype);
                let pos: Vec<u32> = (0..tokens).map(|_| rng.random_range(0..max_positions as u32)).collect();
                let positions = Tensor::new(pos.as_slice(), &Device::Cpu).unwrap();
                let (want, _) = crate::rotary_embedding(&q, &k, &positions, &cos, &sin, style).unwrap();

                let (mut xb, mut pb, mut cb, mut sb) =
                    (HostBuf::of(&full), HostBuf::of(&positions), HostBuf::of(&cos), HostBuf::of(&sin));
                let mut out = HostBuf::poisoned(dtype, tokens * heads * head_dim);
                let args = RotaryArgs {
                    dtype,
                    x: xb.addr(0),
                    x_row_stride: (heads + extra) * head_dim,
                    positions: pb.addr(0),
                    cos: cb.addr(0),
                    sin: sb.addr(0),
                    max_positions,
                    out: out.addr(0),
                    num_tokens: tokens,
                    num_heads: heads,
                    head_dim,
                    interleaved: style == crate::RotaryStyle::Interleaved,
                };
                run(launch::rotary(&args).unwrap());
                let err = rel_err(&out.to_f32(), &f32_values(&want));
                assert!(err <= tolerance(dtype), "rotary {dtype:?} {style:?} d{head_dim}: {err}");

                // A position past the tables is never read; its rows come out NaN.
                let mut bad = HostBuf::U32(vec![max_positions as u32; tokens]);
                let mut out = HostBuf::poisoned(dtype, tokens * heads * head_dim);
                let args = RotaryArgs { positions: bad.addr(0), out: out.addr(0), ..args };
                run(launch::rotary(&args).unwrap());
                assert!(out.to_f32().iter().all(|v| v.is_nan()));
            }
        }
    }
}

#[test]
fn silu_and_mul_matches_cpu_on_fused_halves() {
    let mut rng = StdRng::seed_from_u64(3);
    for dtype in DTYPES {
        for (rows, width) in [(1, 1), (3, 1536), (17, 100)] {
            let fused = random(&mut rng, &[rows, 2 * width], dtype);
            let gate = fused.narrow(1, 0, width).unwrap();
            let up = fused.narrow(1, width, width).unwrap();
            let want = f32_values(&crate::silu_and_mul(&gate, &up).unwrap());
            let mut fb = HostBuf::of(&fused);
            let mut out = HostBuf::poisoned(dtype, rows * width);
            let args = SiluArgs {
                dtype,
                gate: fb.addr(0),
                gate_row_stride: 2 * width,
                up: fb.addr(width),
                up_row_stride: 2 * width,
                out: out.addr(0),
                rows,
                width,
            };
            run(launch::silu_and_mul(&args).unwrap());
            let err = rel_err(&out.to_f32(), &want);
            assert!(err <= tolerance(dtype), "silu_and_mul {dtype:?} {rows}x{width}: {err}");
        }
    }
}

/// The skinny matmul of `x` (rows `stride` apart, the first `k` of each used) and `w` on the
/// simulator, as f32.
fn skinny_on_sim(x: &Tensor, k: usize, w: &Tensor, launch: Option<SkinnyLaunch>) -> Vec<f32> {
    let (m, stride) = x.dims2().unwrap();
    let n = w.dim(0).unwrap();
    let (mut xb, mut wb) = (HostBuf::of(x), HostBuf::of(w));
    let mut out = HostBuf::poisoned(x.dtype(), m * n);
    let args = SkinnyArgs {
        dtype: x.dtype(),
        x: xb.addr(0),
        x_row_stride: stride,
        w: wb.addr(0),
        w_row_stride: k,
        out: out.addr(0),
        out_row_stride: n,
        m,
        n,
        k,
        launch,
    };
    run(skinny::skinny_matmul(&args).unwrap());
    out.to_f32()
}

#[test]
fn skinny_matmul_matches_cpu_and_ignores_the_other_rows() {
    let mut rng = StdRng::seed_from_u64(9);
    for dtype in [DType::F16, DType::BF16] {
        // N not a multiple of 16, K of one chunk up to more chunks than the warps have stages;
        // x rows strided (a narrow of a wider tensor).
        let shapes = [
            (1, 16, 32, 0),
            (3, 40, 96, 8),
            (8, 33, 576, 0),
            (9, 70, 320, 16),
            (16, 24, 1088, 0),
            (5, 48, 1024, 8),
            // Past 16 rows: grid rows of two tiles, the last one partial.
            (21, 40, 320, 8),
            (35, 17, 96, 0),
        ];
        for (m, n, k, pad) in shapes {
            let wide = random(&mut rng, &[m, k + pad], dtype);
            let x = wide.narrow(1, 0, k).unwrap();
            let w = random(&mut rng, &[n, k], dtype);
            let want = f32_values(&crate::skinny_matmul(&x, &w).unwrap());
            let spreads = [(1, 8, 1), (4, 4, 2), (2, 2, 4), (2, 4, 4)]
                .into_iter()
                .filter(|&(_, _, group)| k.is_multiple_of(32 * group))
                .map(|(warps, stages, group)| Some(SkinnyLaunch { warps, stages, group }));
            for launch in std::iter::once(None).chain(spreads) {
                let got = skinny_on_sim(&wide, k, &w, launch);
                let err = rel_err(&got, &want);
                assert!(err <= tolerance(dtype), "skinny {dtype:?} {m}x{n}x{k} {launch:?}: {err}");
            }
            // The first and last rows alone give the same bits as among the others.
            let all = skinny_on_sim(&wide, k, &w, None);
            for row in [0, m - 1] {
                let alone = skinny_on_sim(&wide.narrow(0, row, 1).unwrap(), k, &w, None);
                assert_eq!(
                    alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    all[row * n..(row + 1) * n].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{dtype:?} {m}x{n}x{k}: row {row}"
                );
            }
        }
    }
}

#[test]
fn reshape_and_cache_writes_the_same_slots_as_cpu() {
    let mut rng = StdRng::seed_from_u64(4);
    for dtype in DTYPES {
        for (kv_heads, head_dim, block_size, pad) in [(2, 64, 16, 0), (3, 80, 5, 1), (1, 6, 4, 0)] {
            let num_blocks = 6;
            let num_slots = num_blocks * block_size;
            let tokens = 9;
            let mut slots: Vec<u32> = (0..num_slots as u32).collect();
            slots.shuffle(&mut rng);
            slots.truncate(tokens);
            let full = random(&mut rng, &[tokens, kv_heads + pad, head_dim], dtype);
            let k = full.narrow(1, 0, kv_heads).unwrap();
            let v = random(&mut rng, &[tokens, kv_heads, head_dim], dtype);
            let k_cache = random(&mut rng, &[num_blocks, block_size, kv_heads, head_dim], dtype);
            let v_cache = random(&mut rng, &[num_blocks, block_size, kv_heads, head_dim], dtype);
            let mut kb = HostBuf::of(&k_cache);
            let mut kfull = HostBuf::of(&full);
            let slot_t = Tensor::new(slots.as_slice(), &Device::Cpu).unwrap();
            let mut sb = HostBuf::of(&slot_t);
            crate::reshape_and_cache(&k, &v, &k_cache, &v_cache, &slot_t).unwrap();
            let esize = dtype.size_in_bytes();
            let row = kv_heads * head_dim;
            let l = launch::reshape_and_cache(
                kfull.addr(0),
                (kv_heads + pad) * head_dim * esize,
                kb.addr(0),
                sb.addr(0),
                tokens,
                row * esize,
                num_slots,
            )
            .unwrap();
            run(l);
            assert_eq!(kb.to_f32(), f32_values(&k_cache), "{dtype:?} d{head_dim}");

            // A slot past the cache is skipped, the others are still written.
            let before = kb.to_f32();
            let mut bad = HostBuf::U32(vec![num_slots as u32; tokens]);
            run(launch::reshape_and_cache(
                kfull.addr(0),
                row * esize,
                kb.addr(0),
                bad.addr(0),
                tokens,
                row * esize,
                num_slots,
            )
            .unwrap());
            assert_eq!(kb.to_f32(), before);
        }
    }
}

#[test]
fn reshape_into_an_fp8_cache_writes_the_cpu_codes() {
    let mut rng = StdRng::seed_from_u64(13);
    let scales = crate::KvScales { k: 0.007, v: 2.0 };
    for dtype in DTYPES {
        let (kv_heads, head_dim, block_size, pad, num_blocks, tokens) = (2, 48, 8, 1, 5, 11);
        let num_slots = num_blocks * block_size;
        let mut slots: Vec<u32> = (0..num_slots as u32).collect();
        slots.shuffle(&mut rng);
        slots.truncate(tokens);
        slots[3] = crate::PADDING_SLOT;
        // Magnitudes from below the smallest normal code to past 448 once scaled.
        let spread = |t: Tensor| (t * 3.5).unwrap().exp().unwrap().to_dtype(dtype).unwrap();
        let full = spread(random(&mut rng, &[tokens, kv_heads + pad, head_dim], DType::F32));
        let k = full.narrow(1, 0, kv_heads).unwrap();
        let v = spread(random(&mut rng, &[tokens, kv_heads, head_dim], DType::F32));
        let shape = [num_blocks, block_size, kv_heads, head_dim];
        let k_cache = Tensor::zeros(&shape, DType::F8E4M3, &Device::Cpu).unwrap();
        let v_cache = Tensor::zeros(&shape, DType::F8E4M3, &Device::Cpu).unwrap();
        let slot_t = Tensor::new(slots.as_slice(), &Device::Cpu).unwrap();
        crate::reshape_and_cache_scaled(&k, &v, &k_cache, &v_cache, &slot_t, scales).unwrap();
        let (mut kb, mut vb) =
            (HostBuf::of(&k_cache.zeros_like().unwrap()), HostBuf::of(&v_cache.zeros_like().unwrap()));
        let (mut kfull, mut vsrc, mut sb) = (HostBuf::of(&full), HostBuf::of(&v), HostBuf::of(&slot_t));
        let row = kv_heads * head_dim;
        for (cache, src, stride, scale) in [
            (&mut kb, &mut kfull, (kv_heads + pad) * head_dim, scales.k),
            (&mut vb, &mut vsrc, row, scales.v),
        ] {
            let l = launch::reshape_and_cache_fp8(
                src.addr(0),
                dtype,
                stride,
                cache.addr(0),
                sb.addr(0),
                tokens,
                row,
                num_slots,
                1.0 / scale,
            );
            run(l.unwrap());
        }
        let bits = |t: &Tensor| {
            t.flatten_all()
                .unwrap()
                .to_vec1::<float8::F8E4M3>()
                .unwrap()
                .iter()
                .map(|c| c.to_bits())
                .collect::<Vec<u8>>()
        };
        for (got, want, what) in [(&kb, bits(&k_cache), "k"), (&vb, bits(&v_cache), "v")] {
            let HostBuf::U8(got) = got else { unreachable!() };
            assert_eq!(got, &want, "{dtype:?} {what}");
            assert!(
                want.iter().any(|&c| c & 0x7F == 0x7E) && want.iter().any(|&c| c != 0),
                "{dtype:?} {what}: saturated codes"
            );
        }
    }
}
