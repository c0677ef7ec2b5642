//! Every CUDA kernel, run by the CPU simulator through the launches the CUDA path makes,
//! against the CPU op on random inputs: several shapes, dtypes, strided views, block sizes,
//! GQA ratios and context lengths (including non-multiples of the block size), outputs
//! poisoned with NaN before each run. Catches indexing, masking and fragment-layout mistakes
//! without a GPU; the GPU check (scripts/gpu-check.sh) repeats the comparison on hardware.

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::launch::{self, AttentionArgs, AttentionKernel, NormArgs, RotaryArgs, SiluArgs};
use super::plan::{plan_attention, plan_replay, PlanParams, WorkItem, SIMT_MAX_ROWS, SIMT_SMALL_ROWS};
use super::sim;
use super::skinny::{self, SkinnyArgs, SkinnyLaunch};
use crate::AttentionMetadata;

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Host memory standing in for device memory: a tensor's elements in its storage dtype.
pub(super) enum HostBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    U32(Vec<u32>),
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
        }
    }

    pub(super) fn to_f32(&self) -> Vec<f32> {
        match self {
            HostBuf::F32(v) => v.clone(),
            HostBuf::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostBuf::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            HostBuf::U32(v) => v.iter().map(|&x| x as f32).collect(),
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

/// One attention configuration: `seqs` are (new tokens, context length after the step).
pub(super) struct Case {
    pub dtype: DType,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub seqs: Vec<(usize, usize)>,
    pub num_sms: usize,
    /// Plan every token as a decode of its own ([`PlanParams::batch_invariant`]).
    pub batch_invariant: bool,
    /// A sliding window of keys: the blocks before each sequence's window are given back, as a
    /// windowed layer's cache does (their table entries point at a block of NaNs).
    pub window: Option<usize>,
    /// Soft-capped scores.
    pub softcap: Option<f32>,
}

/// Runs `c` through the plan and the simulated kernels and through the CPU op; returns the
/// relative error and the plan's (simt, mma, split groups) counts.
pub(super) fn attention_case(c: &Case, rng: &mut StdRng) -> (f32, [usize; 3]) {
    attention_case_planned(c, rng, None)
}

/// [`attention_case`], planned for replay ([`plan_replay`]) with room for `replay_max_context`
/// keys when that is given (every sequence must then be a one-token decode).
pub(super) fn attention_case_planned(
    c: &Case,
    rng: &mut StdRng,
    replay_max_context: Option<usize>,
) -> (f32, [usize; 3]) {
    let blocks_per_seq: Vec<usize> = c.seqs.iter().map(|&(_, ctx)| ctx.div_ceil(c.block_size)).collect();
    let num_blocks = blocks_per_seq.iter().sum::<usize>() + 3;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(rng);
    let mut tables = Vec::new();
    let mut taken = 0;
    for &n in &blocks_per_seq {
        tables.push(ids[taken..taken + n].to_vec());
        taken += n;
    }
    let (mut cu, mut ctxs, mut slots) = (vec![0u32], Vec::new(), Vec::new());
    for (i, &(q_len, ctx)) in c.seqs.iter().enumerate() {
        for pos in ctx - q_len..ctx {
            slots.push(tables[i][pos / c.block_size] * c.block_size as u32 + (pos % c.block_size) as u32);
        }
        cu.push(cu.last().unwrap() + q_len as u32);
        ctxs.push(ctx as u32);
    }
    let num_tokens = *cu.last().unwrap() as usize;
    // The block past the others is all NaN: what a window gave back points there.
    let poison = num_blocks;
    if let Some(w) = c.window {
        for (table, &(q_len, ctx)) in tables.iter_mut().zip(&c.seqs) {
            let first_visible = (ctx - q_len + 1).saturating_sub(w);
            for entry in &mut table[..first_visible / c.block_size] {
                *entry = poison as u32;
            }
        }
    }
    let meta = AttentionMetadata::new(slots, cu.clone(), ctxs.clone(), &tables, &Device::Cpu).unwrap();
    let (d, extra_heads) = (c.head_dim, 1);
    let cache_shape = [num_blocks + 1, c.block_size, c.kv_heads, d];
    let block_len = c.block_size * c.kv_heads * d;
    let poisoned = |t: Tensor| {
        let mut values = f32_values(&t);
        values[poison * block_len..].fill(f32::NAN);
        Tensor::from_vec(values, &cache_shape, &Device::Cpu).unwrap().to_dtype(c.dtype).unwrap()
    };
    let k_cache = poisoned(random(rng, &cache_shape, c.dtype));
    let v_cache = poisoned(random(rng, &cache_shape, c.dtype));
    let q_full = random(rng, &[num_tokens, c.q_heads + extra_heads, d], c.dtype);
    let q = q_full.narrow(1, 0, c.q_heads).unwrap();
    let scale = 1.0 / (d as f32).sqrt();
    let attention = crate::AttentionParams {
        window: c.window,
        logit_softcap: c.softcap,
        ..crate::AttentionParams::scaled(scale)
    };
    let want = f32_values(&crate::paged_attention_with(&q, &k_cache, &v_cache, &meta, attention).unwrap());

    let params = PlanParams {
        num_q_heads: c.q_heads,
        num_kv_heads: c.kv_heads,
        tensor_cores: c.dtype != DType::F32 && launch::CUDA_MMA_HEAD_DIMS.contains(&c.head_dim),
        num_sms: c.num_sms,
        batch_invariant: c.batch_invariant,
    };
    let plan = match replay_max_context {
        Some(max_context) => plan_replay(ctxs.len(), max_context, &params),
        None => plan_attention(&cu, &ctxs, &params),
    };
    let mut context_lens = HostBuf::words(ctxs.clone());
    let words = |items: &[WorkItem]| HostBuf::words(items.iter().flat_map(|i| i.words()).collect());
    let (mut qb, mut kb, mut vb) = (HostBuf::of(&q_full), HostBuf::of(&k_cache), HostBuf::of(&v_cache));
    let mut bt = HostBuf::words(meta.host().block_tables.clone());
    bt.addr(0);
    let mut out = HostBuf::poisoned(c.dtype, num_tokens * c.q_heads * d);
    let mut part_o = HostBuf::poisoned(DType::F32, plan.partial_rows * d + 1);
    let mut part_lse = HostBuf::poisoned(DType::F32, plan.partial_rows + 1);
    let args = AttentionArgs {
        dtype: c.dtype,
        head_dim: d,
        q: qb.addr(0),
        q_row_stride: (c.q_heads + extra_heads) * d,
        k_cache: kb.addr(0),
        v_cache: vb.addr(0),
        block_tables: if meta.host().block_tables.is_empty() { 0 } else { bt.addr(0) },
        max_blocks_per_seq: meta.host().max_blocks_per_seq,
        block_size: c.block_size,
        num_kv_heads: c.kv_heads,
        group: c.q_heads / c.kv_heads,
        softmax_scale: scale,
        window: c.window.unwrap_or(0),
        logit_softcap: c.softcap.unwrap_or(0.0),
        out: out.addr(0),
        part_o: part_o.addr(0),
        part_lse: part_lse.addr(0),
        context_lens: context_lens.addr(0),
    };
    for (items, kernel) in [
        (&plan.simt_small, AttentionKernel::Simt { rows: SIMT_SMALL_ROWS }),
        (&plan.simt, AttentionKernel::Simt { rows: SIMT_MAX_ROWS }),
        (&plan.mma, AttentionKernel::Mma),
    ] {
        let mut list = words(items);
        run(launch::attention(&args, kernel, list.addr(0), items.len()).unwrap());
    }
    let mut groups = words(&plan.combine);
    run(launch::attention_combine(&args, groups.addr(0), plan.combine.len()).unwrap());
    let counts = [plan.simt_small.len() + plan.simt.len(), plan.mma.len(), plan.combine.len()];
    (rel_err(&out.to_f32(), &want), counts)
}

#[test]
fn attention_cuda_core_path_matches_cpu() {
    let mut rng = StdRng::seed_from_u64(5);
    // f32 runs everything on CUDA cores: decodes, prefill chunks with and without a cached
    // prefix, an empty sequence, contexts that are not multiples of the block size.
    for (q_heads, kv_heads, head_dim, block_size) in
        [(8, 2, 64, 16), (9, 3, 64, 7), (4, 4, 128, 32), (16, 1, 80, 16), (6, 2, 96, 8)]
    {
        let c = Case {
            dtype: DType::F32,
            q_heads,
            kv_heads,
            head_dim,
            block_size,
            seqs: vec![(1, 37), (5, 5), (0, 3), (1, 1), (11, 40)],
            num_sms: 1,
            batch_invariant: false,
            window: None,
            softcap: None,
        };
        let (err, counts) = attention_case(&c, &mut rng);
        assert!(err <= tolerance(DType::F32), "f32 {q_heads}/{kv_heads} d{head_dim} bs{block_size}: {err}");
        assert_eq!(counts[1], 0);
    }
    // Half precision decodes (4-row items) and two-token chunks (8-row items) stay on CUDA
    // cores.
    for dtype in [DType::F16, DType::BF16] {
        let c = Case {
            dtype,
            q_heads: 8,
            kv_heads: 2,
            head_dim: 128,
            block_size: 16,
            seqs: vec![(1, 100), (1, 17), (2, 50)],
            num_sms: 1,
            batch_invariant: false,
            window: None,
            softcap: None,
        };
        let (err, counts) = attention_case(&c, &mut rng);
        assert!(err <= tolerance(dtype), "{dtype:?} decode: {err}");
        assert_eq!(counts, [3, 0, 0]);
    }
}

#[test]
fn attention_split_kv_matches_cpu() {
    let mut rng = StdRng::seed_from_u64(6);
    for dtype in DTYPES {
        // One long decode and a short one on a "GPU" of 132 SMs: the long one is split.
        let c = Case {
            dtype,
            q_heads: 4,
            kv_heads: 1,
            head_dim: 64,
            block_size: 16,
            seqs: vec![(1, 1000), (1, 9)],
            num_sms: 132,
            batch_invariant: false,
            window: None,
            softcap: None,
        };
        let (err, counts) = attention_case(&c, &mut rng);
        assert!(err <= tolerance(dtype), "{dtype:?} split decode: {err}");
        assert_eq!(counts[2], 1, "one split group");
        // Alone, a 2500-key decode is cut into more splits than the combine kernel reads at
        // once, and not a multiple of that: both of its loops run.
        let splits = super::plan::num_splits(2500, 1, 132);
        assert!(splits > 8 && !splits.is_multiple_of(8), "{splits} splits");
        let c = Case { seqs: vec![(1, 2500)], ..c };
        let (err, counts) = attention_case(&c, &mut rng);
        assert!(err <= tolerance(dtype), "{dtype:?} {splits}-way split decode: {err}");
        assert_eq!(counts[2], 1, "one split group");
    }
    // A split f32 prefill chunk: rows of early tokens see no keys in late splits.
    let c = Case {
        dtype: DType::F32,
        q_heads: 2,
        kv_heads: 2,
        head_dim: 64,
        block_size: 16,
        seqs: vec![(3, 700)],
        num_sms: 132,
        batch_invariant: false,
        window: None,
        softcap: None,
    };
    let (err, counts) = attention_case(&c, &mut rng);
    assert!(err <= tolerance(DType::F32), "split prefill: {err}");
    assert!(counts[2] >= 1);
}

#[test]
fn attention_tensor_core_path_matches_cpu() {
    let mut rng = StdRng::seed_from_u64(7);
    let shapes = [(8, 2, 128, 16), (9, 3, 64, 16), (4, 4, 80, 8), (8, 1, 96, 32), (2, 2, 64, 5)];
    for (i, (q_heads, kv_heads, head_dim, block_size)) in shapes.into_iter().enumerate() {
        let dtype = if i % 2 == 0 { DType::BF16 } else { DType::F16 };
        // A fresh prefill longer than one key tile, a chunk on a cached prefix, and a decode
        // in the same batch.
        let c = Case {
            dtype,
            q_heads,
            kv_heads,
            head_dim,
            block_size,
            seqs: vec![(70, 70), (20, 90), (1, 33)],
            num_sms: 1,
            batch_invariant: false,
            window: None,
            softcap: None,
        };
        let (err, counts) = attention_case(&c, &mut rng);
        assert!(err <= tolerance(dtype), "{dtype:?} {q_heads}/{kv_heads} d{head_dim} bs{block_size}: {err}");
        assert!(counts[1] > 0, "tensor-core items");
    }
}

/// Batch-invariant plans on the simulated kernels: a verification-shaped chunk (9 tokens), a
/// prefill chunk, long split decodes (one at the cap of 16 pieces) and a short one, every token
/// on its own CUDA-core items, against the CPU op.
#[test]
fn attention_batch_invariant_plans_match_cpu() {
    let mut rng = StdRng::seed_from_u64(8);
    for dtype in DTYPES {
        for (q_heads, kv_heads) in [(9, 3), (8, 1)] {
            let c = Case {
                dtype,
                q_heads,
                kv_heads,
                head_dim: 64,
                block_size: 16,
                seqs: vec![(9, 300), (20, 20), (1, 700), (1, 2200), (1, 5)],
                num_sms: 132,
                batch_invariant: true,
                window: None,
                softcap: None,
            };
            let (err, counts) = attention_case(&c, &mut rng);
            assert!(err <= tolerance(dtype), "{dtype:?} {q_heads}/{kv_heads}: {err}");
            assert_eq!(counts[1], 0, "no tensor-core items");
            assert!(counts[2] >= 9, "the 700-key decode and the 300-key chunk's tokens are split");
        }
    }
}
