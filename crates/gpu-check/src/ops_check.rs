//! Every CUDA op against its CPU op (the reference) on fresh random inputs: several shapes,
//! dtypes, strided views, block sizes, GQA ratios and context lengths (including
//! non-multiples of the block size). Before each CUDA run the device's memory pool is filled
//! with NaN and released, so an output element a kernel fails to write shows as an error.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use pagoda_gpu_check::compare::{rel_err, tolerance};
use pagoda_gpu_check::report::Report;
use pagoda_ops::{AttentionMetadata, AttentionParams, KvScales, RotaryStyle};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const SECTION: &str = "ops";
const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The same random values on the CPU and on the GPU.
struct Pair {
    cpu: Tensor,
    gpu: Tensor,
}

fn random(rng: &mut StdRng, shape: &[usize], dtype: DType, gpu: &Device) -> Result<Pair> {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
    let cpu = Tensor::from_vec(values, shape, &Device::Cpu)?.to_dtype(dtype)?;
    let gpu = cpu.to_device(gpu)?;
    Ok(Pair { cpu, gpu })
}

/// Fills 256 MiB of the device's pool with all-ones bytes (NaN in f32, f16 and bf16) and
/// frees it, so the next allocations start out poisoned.
fn poison(gpu: &Device) -> Result<()> {
    let junk = Tensor::full(u32::MAX, 64 << 20, gpu)?;
    gpu.synchronize()?;
    drop(junk);
    Ok(())
}

/// A tensor's values as f32 on the host.
pub(crate) fn values(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_device(&Device::Cpu)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
}

/// Worst error over several shapes of one op and dtype, reported as one row.
struct Worst {
    err: f32,
    shapes: usize,
}

impl Worst {
    fn new() -> Self {
        Self { err: 0.0, shapes: 0 }
    }

    fn add(&mut self, got: &Tensor, want: &Tensor) -> Result<()> {
        self.err = self.err.max(rel_err(&values(got)?, &values(want)?));
        self.shapes += 1;
        Ok(())
    }

    fn report(&self, report: &mut Report, op: &str, dtype: DType) {
        let check = format!("{op} {dtype:?} ({} shapes)", self.shapes);
        report.at_most(SECTION, &check, self.err as f64, tolerance(dtype) as f64);
    }
}

fn norms(rng: &mut StdRng, gpu: &Device, report: &mut Report) -> Result<()> {
    for dtype in DTYPES {
        let (mut plain, mut fused) = (Worst::new(), Worst::new());
        for (rows, hidden, pad, w_dtype) in
            [(1, 576, 0, dtype), (7, 4096, 64, dtype), (33, 8192, 0, DType::F32)]
        {
            let full = random(rng, &[rows, hidden + pad], dtype, gpu)?;
            let (x_cpu, x_gpu) = (full.cpu.narrow(1, 0, hidden)?, full.gpu.narrow(1, 0, hidden)?);
            let r = random(rng, &[rows, hidden], dtype, gpu)?;
            let w = random(rng, &[hidden], w_dtype, gpu)?;
            poison(gpu)?;
            let got = pagoda_ops::rms_norm(&x_gpu, &w.gpu, 1e-5)?;
            plain.add(&got, &pagoda_ops::rms_norm(&x_cpu, &w.cpu, 1e-5)?)?;
            poison(gpu)?;
            let (g_norm, g_sum) = pagoda_ops::add_rms_norm(&x_gpu, &r.gpu, &w.gpu, 1e-5)?;
            let (c_norm, c_sum) = pagoda_ops::add_rms_norm(&x_cpu, &r.cpu, &w.cpu, 1e-5)?;
            fused.add(&g_norm, &c_norm)?;
            fused.add(&g_sum, &c_sum)?;
        }
        plain.report(report, "rms_norm", dtype);
        fused.report(report, "add_rms_norm", dtype);
    }
    Ok(())
}

fn rotary(rng: &mut StdRng, gpu: &Device, report: &mut Report) -> Result<()> {
    let max_positions = 4096;
    for dtype in DTYPES {
        let mut worst = Worst::new();
        for head_dim in [64, 128] {
            let inv = pagoda_ops::rotary_inv_freq(500_000.0, head_dim, Default::default())?;
            let (cos, sin) = pagoda_ops::rotary_tables_from_inv_freq(&inv, max_positions, &Device::Cpu)?;
            let (cos_g, sin_g) = (cos.to_device(gpu)?, sin.to_device(gpu)?);
            for style in [RotaryStyle::Interleaved, RotaryStyle::Halves] {
                for tokens in [1, 37] {
                    let full = random(rng, &[tokens, 40, head_dim], dtype, gpu)?;
                    let k = random(rng, &[tokens, 8, head_dim], dtype, gpu)?;
                    let pos: Vec<u32> =
                        (0..tokens).map(|_| rng.random_range(0..max_positions as u32)).collect();
                    let p_cpu = Tensor::new(pos.as_slice(), &Device::Cpu)?;
                    let p_gpu = p_cpu.to_device(gpu)?;
                    let (q_cpu, q_gpu) = (full.cpu.narrow(1, 0, 32)?, full.gpu.narrow(1, 0, 32)?);
                    poison(gpu)?;
                    let (gq, gk) =
                        pagoda_ops::rotary_embedding(&q_gpu, &k.gpu, &p_gpu, &cos_g, &sin_g, style)?;
                    let (cq, ck) = pagoda_ops::rotary_embedding(&q_cpu, &k.cpu, &p_cpu, &cos, &sin, style)?;
                    worst.add(&gq, &cq)?;
                    worst.add(&gk, &ck)?;
                }
            }
        }
        worst.report(report, "rotary_embedding", dtype);
    }
    Ok(())
}

fn silu(rng: &mut StdRng, gpu: &Device, report: &mut Report) -> Result<()> {
    for dtype in DTYPES {
        let mut worst = Worst::new();
        for (rows, width) in [(1, 1536), (19, 14336), (64, 8192)] {
            let fused = random(rng, &[rows, 2 * width], dtype, gpu)?;
            let halves = |t: &Tensor| -> Result<(Tensor, Tensor)> {
                Ok((t.narrow(1, 0, width)?, t.narrow(1, width, width)?))
            };
            let ((gc, uc), (gg, ug)) = (halves(&fused.cpu)?, halves(&fused.gpu)?);
            poison(gpu)?;
            worst.add(&pagoda_ops::silu_and_mul(&gg, &ug)?, &pagoda_ops::silu_and_mul(&gc, &uc)?)?;
        }
        worst.report(report, "silu_and_mul", dtype);
    }
    Ok(())
}

/// `lora_add` with three adapters of ranks 4, 16 and 64 over rows of no adapter between them,
/// at SmolLM2's and Llama-3-8B's projection widths; then a row's bits alone and in the batch.
fn lora(rng: &mut StdRng, gpu: &Device, report: &mut Report) -> Result<()> {
    for dtype in DTYPES {
        let mut worst = Worst::new();
        let mut same = true;
        for (input, width) in [(576, 192), (4096, 14336), (14336, 4096)] {
            let rows = 12;
            let x = random(rng, &[rows, input], dtype, gpu)?;
            let base = random(rng, &[rows, width], dtype, gpu)?;
            let mut cpu_segments = Vec::new();
            let mut gpu_segments = Vec::new();
            for (start, n, rank) in [(1, 3, 4), (4, 1, 16), (7, 4, 64)] {
                let a = random(rng, &[rank, input], dtype, gpu)?;
                let b = random(rng, &[rank, width], dtype, gpu)?;
                cpu_segments.push(pagoda_ops::LoraSegment { start, rows: n, a: a.cpu, b: b.cpu });
                gpu_segments.push(pagoda_ops::LoraSegment { start, rows: n, a: a.gpu, b: b.gpu });
            }
            poison(gpu)?;
            let got = pagoda_ops::lora_add(&base.gpu, &x.gpu, &gpu_segments)?;
            worst.add(&got, &pagoda_ops::lora_add(&base.cpu, &x.cpu, &cpu_segments)?)?;
            let last = &gpu_segments[2];
            let alone = pagoda_ops::LoraSegment { start: 0, rows: 1, a: last.a.clone(), b: last.b.clone() };
            let one = pagoda_ops::lora_add(&base.gpu.narrow(0, 9, 1)?, &x.gpu.narrow(0, 9, 1)?, &[alone])?;
            let bits =
                |t: &Tensor| -> Result<Vec<u32>> { Ok(values(t)?.iter().map(|v| v.to_bits()).collect()) };
            same &= bits(&one)? == bits(&got.narrow(0, 9, 1)?)?;
        }
        // Sums of up to 14336 products, then 64, in another order than the CPU's.
        let check = format!("lora_add {dtype:?} ({} shapes)", worst.shapes);
        report.at_most(SECTION, &check, worst.err as f64, 4.0 * tolerance(dtype) as f64);
        let check = format!("lora_add {dtype:?}: a row's bits alone and among 12 rows of 3 adapters");
        report.expect(SECTION, &check, same, if same { "identical" } else { "differ" });
    }
    Ok(())
}

fn kv_write(rng: &mut StdRng, gpu: &Device, report: &mut Report) -> Result<()> {
    for dtype in DTYPES {
        let mut worst = Worst::new();
        for (kv_heads, head_dim, block_size, tokens) in
            [(8, 128, 16, 300usize), (3, 64, 7, 5), (1, 80, 32, 64)]
        {
            let num_blocks = tokens.div_ceil(block_size) + 8;
            let mut slots: Vec<u32> = (0..(num_blocks * block_size) as u32).collect();
            slots.shuffle(rng);
            slots.truncate(tokens);
            let s_cpu = Tensor::new(slots.as_slice(), &Device::Cpu)?;
            let s_gpu = s_cpu.to_device(gpu)?;
            let shape = [num_blocks, block_size, kv_heads, head_dim];
            let (kc, vc) = (random(rng, &shape, dtype, gpu)?, random(rng, &shape, dtype, gpu)?);
            let k_full = random(rng, &[tokens, 3 * kv_heads, head_dim], dtype, gpu)?;
            let v = random(rng, &[tokens, kv_heads, head_dim], dtype, gpu)?;
            let (k_cpu, k_gpu) =
                (k_full.cpu.narrow(1, kv_heads, kv_heads)?, k_full.gpu.narrow(1, kv_heads, kv_heads)?);
            pagoda_ops::reshape_and_cache(&k_gpu, &v.gpu, &kc.gpu, &vc.gpu, &s_gpu)?;
            pagoda_ops::reshape_and_cache(&k_cpu, &v.cpu, &kc.cpu, &vc.cpu, &s_cpu)?;
            worst.add(&kc.gpu, &kc.cpu)?;
            worst.add(&vc.gpu, &vc.cpu)?;
        }
        // A copy must be exact.
        report.at_most(
            SECTION,
            &format!("reshape_and_cache {dtype:?} ({} caches)", worst.shapes),
            worst.err as f64,
            0.0,
        );
    }
    Ok(())
}

/// One attention configuration: `seqs` are (new tokens, context after the step).
struct AttentionCase {
    name: &'static str,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    seqs: Vec<(usize, usize)>,
    /// Gemma's attention: a sliding window and soft-capped scores.
    window: Option<usize>,
    softcap: Option<f32>,
}

fn attention_cases() -> Vec<AttentionCase> {
    let case = |name, q_heads, kv_heads, head_dim, block_size, seqs| AttentionCase {
        name,
        q_heads,
        kv_heads,
        head_dim,
        block_size,
        seqs,
        window: None,
        softcap: None,
    };
    let gemma = |name, q_heads, kv_heads, seqs, window, softcap| AttentionCase {
        window: Some(window),
        softcap,
        ..case(name, q_heads, kv_heads, 256, 16, seqs)
    };
    vec![
        gemma("Gemma 3 local 4/1 d256 window 512", 4, 1, vec![(1, 2000), (64, 64), (1, 300)], 512, None),
        gemma("Gemma 2 8/4 d256 window 4096 cap 50", 8, 4, vec![(1, 6000), (300, 1500)], 4096, Some(50.0)),
        AttentionCase {
            window: Some(100),
            softcap: Some(30.0),
            ..case("window 100 cap 30 32/8 d128", 32, 8, 128, 16, vec![(200, 200), (1, 5000), (90, 400)])
        },
        case(
            "decode GQA 32/8 d128",
            32,
            8,
            128,
            16,
            vec![(1, 1), (1, 15), (1, 16), (1, 17), (1, 1000), (1, 4095)],
        ),
        case("mixed batch 9/3 d64", 9, 3, 64, 16, vec![(1, 700), (37, 37), (5, 300), (64, 193), (0, 5)]),
        case("mixed batch MHA 32/32 d80 bs32", 32, 32, 80, 32, vec![(1, 33), (100, 100), (1, 257)]),
        case("mixed batch MQA 16/1 d96 bs8", 16, 1, 96, 8, vec![(3, 51), (1, 9), (70, 70)]),
        case("split-KV single decode 32/8 d128 16k", 32, 8, 128, 16, vec![(1, 16384)]),
        case("prefill chunk on a cached prefix 32/8 d128", 32, 8, 128, 16, vec![(1000, 1500), (1, 77)]),
    ]
}

/// K and V caches of every slot filled, the same values on both devices: as stored, or, with
/// `fp8` scales, written as FP8 codes by each device's `reshape_and_cache_scaled` (then also
/// whether the two devices' codes are the same bits).
fn caches(
    rng: &mut StdRng,
    gpu: &Device,
    shape: [usize; 4],
    dtype: DType,
    fp8: Option<KvScales>,
) -> Result<(Pair, Pair, Option<bool>)> {
    let Some(scales) = fp8 else {
        return Ok((random(rng, &shape, dtype, gpu)?, random(rng, &shape, dtype, gpu)?, None));
    };
    let slots = shape[0] * shape[1];
    let rows = [slots, shape[2], shape[3]];
    let (k_src, v_src) = (random(rng, &rows, dtype, gpu)?, random(rng, &rows, dtype, gpu)?);
    let mut written = Vec::new();
    for (device, k, v) in [(&Device::Cpu, &k_src.cpu, &v_src.cpu), (gpu, &k_src.gpu, &v_src.gpu)] {
        let (kc, vc) =
            (Tensor::zeros(&shape, DType::F8E4M3, device)?, Tensor::zeros(&shape, DType::F8E4M3, device)?);
        let slot_ids = Tensor::arange(0u32, slots as u32, device)?;
        pagoda_ops::reshape_and_cache_scaled(k, v, &kc, &vc, &slot_ids, scales)?;
        written.push((kc, vc));
    }
    let (gpu_caches, cpu_caches) = (written.pop().expect("two"), written.pop().expect("two"));
    let bits = |t: &Tensor| -> Result<Vec<u8>> {
        Ok(t.to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<float8::F8E4M3>()?
            .iter()
            .map(|c| c.to_bits())
            .collect())
    };
    let same = bits(&gpu_caches.0)? == bits(&cpu_caches.0)? && bits(&gpu_caches.1)? == bits(&cpu_caches.1)?;
    let k = Pair { cpu: cpu_caches.0, gpu: gpu_caches.0 };
    let v = Pair { cpu: cpu_caches.1, gpu: gpu_caches.1 };
    Ok((k, v, Some(same)))
}

/// The case's attention on the GPU against the CPU; over an FP8 cache (`fp8` scales) also
/// whether both devices wrote the same codes.
fn attention_case(
    rng: &mut StdRng,
    gpu: &Device,
    c: &AttentionCase,
    dtype: DType,
    fp8: Option<KvScales>,
) -> Result<(f32, Option<bool>)> {
    let blocks: Vec<usize> = c.seqs.iter().map(|&(_, ctx)| ctx.div_ceil(c.block_size)).collect();
    let num_blocks = blocks.iter().sum::<usize>() + 4;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(rng);
    let mut tables = Vec::new();
    let mut next = 0;
    for &n in &blocks {
        tables.push(ids[next..next + n].to_vec());
        next += n;
    }
    let (mut cu, mut ctxs, mut slots) = (vec![0u32], Vec::new(), Vec::new());
    for (i, &(q_len, ctx)) in c.seqs.iter().enumerate() {
        for pos in ctx - q_len..ctx {
            slots.push(tables[i][pos / c.block_size] * c.block_size as u32 + (pos % c.block_size) as u32);
        }
        cu.push(cu.last().unwrap() + q_len as u32);
        ctxs.push(ctx as u32);
    }
    let tokens = *cu.last().unwrap() as usize;
    let meta_cpu = AttentionMetadata::new(slots.clone(), cu.clone(), ctxs.clone(), &tables, &Device::Cpu)?;
    let meta_gpu = AttentionMetadata::new(slots, cu, ctxs, &tables, gpu)?;
    let shape = [num_blocks, c.block_size, c.kv_heads, c.head_dim];
    let (k, v, same_codes) = caches(rng, gpu, shape, dtype, fp8)?;
    // q as a view of a fused QKV-like row, as the model passes it.
    let full = random(rng, &[tokens, c.q_heads + 2 * c.kv_heads, c.head_dim], dtype, gpu)?;
    let (q_cpu, q_gpu) = (full.cpu.narrow(1, 0, c.q_heads)?, full.gpu.narrow(1, 0, c.q_heads)?);
    let scale = 1.0 / (c.head_dim as f32).sqrt();
    poison(gpu)?;
    let params = AttentionParams {
        window: c.window,
        logit_softcap: c.softcap,
        kv_scales: fp8.unwrap_or(KvScales::UNIT),
        ..AttentionParams::scaled(scale)
    };
    let got = pagoda_ops::paged_attention_with(&q_gpu, &k.gpu, &v.gpu, &meta_gpu, params)?;
    let want = pagoda_ops::paged_attention_with(&q_cpu, &k.cpu, &v.cpu, &meta_cpu, params)?;
    Ok((rel_err(&values(&got)?, &values(&want)?), same_codes))
}

fn attention(rng: &mut StdRng, gpu: &Device, report: &mut Report) -> Result<()> {
    for c in attention_cases() {
        // Head dim 256 has kernels in half precision only.
        for dtype in DTYPES.into_iter().filter(|&d| c.head_dim <= 128 || d != DType::F32) {
            let check = format!("paged_attention {dtype:?} {}", c.name);
            match attention_case(rng, gpu, &c, dtype, None) {
                Ok((err, _)) => report.at_most(SECTION, &check, err as f64, tolerance(dtype) as f64),
                Err(e) => report.error(SECTION, &check, format!("{e:#}")),
            }
        }
        // Over an FP8 cache (`--kv-cache-dtype fp8`): the codes each device writes, then
        // attention over them, with scales that are not powers of two.
        let scales = KvScales { k: 0.011, v: 0.0037 };
        for dtype in [DType::BF16, DType::F16] {
            let check = format!("paged_attention {dtype:?} over an FP8 cache, {}", c.name);
            match attention_case(rng, gpu, &c, dtype, Some(scales)) {
                Ok((err, same)) => {
                    report.expect(SECTION, &format!("{check}: codes"), same == Some(true), "the CPU's bits");
                    report.at_most(SECTION, &check, err as f64, tolerance(dtype) as f64)
                }
                Err(e) => report.error(SECTION, &check, format!("{e:#}")),
            }
        }
    }
    Ok(())
}

/// The decode-step matmul against the CPU reference (strided x, N not a multiple of 16, one and
/// two tiles of rows, several grid rows), and the property the engine relies on: a row's result does not depend on
/// the rows beside it.
fn skinny(rng: &mut StdRng, gpu: &Device, report: &mut Report) -> Result<()> {
    for dtype in [DType::F16, DType::BF16] {
        let mut worst = Worst::new();
        let shapes = [
            (1, 4096, 4096, 0),
            (9, 6144, 4096, 64),
            (16, 70, 320, 0),
            (2, 49152, 576, 0),
            (37, 960, 576, 0),
        ];
        for (m, n, k, pad) in shapes {
            let wide = random(rng, &[m, k + pad], dtype, gpu)?;
            let (x_cpu, x_gpu) = (wide.cpu.narrow(1, 0, k)?, wide.gpu.narrow(1, 0, k)?);
            let w = random(rng, &[n, k], dtype, gpu)?;
            if !pagoda_ops::skinny_matmul_fits(&x_gpu, &w.gpu) {
                report.error(
                    SECTION,
                    &format!("skinny_matmul {dtype:?} {m}x{n}x{k}"),
                    "not taken on this device",
                );
                continue;
            }
            poison(gpu)?;
            let got = pagoda_ops::skinny_matmul(&x_gpu, &w.gpu)?;
            worst.add(&got, &pagoda_ops::skinny_matmul(&x_cpu, &w.cpu)?)?;
        }
        worst.report(report, "skinny_matmul", dtype);

        // Row r alone, and among 1, 8, 16 and 40 rows, for rows of both tiles and of later grid
        // rows.
        let x = random(rng, &[40, 4096], dtype, gpu)?;
        let w = random(rng, &[4096, 4096], dtype, gpu)?;
        let bits = |t: &Tensor| -> Result<Vec<u32>> { Ok(values(t)?.iter().map(|v| v.to_bits()).collect()) };
        let all = pagoda_ops::skinny_matmul(&x.gpu, &w.gpu)?;
        let mut same = true;
        for (row, rows) in [(0, 1), (0, 8), (5, 9), (12, 16), (33, 40), (20, 21)] {
            let part = pagoda_ops::skinny_matmul(&x.gpu.narrow(0, 0, rows)?, &w.gpu)?;
            let alone = pagoda_ops::skinny_matmul(&x.gpu.narrow(0, row, 1)?, &w.gpu)?;
            same &= bits(&part.narrow(0, row, 1)?)? == bits(&all.narrow(0, row, 1)?)?;
            same &= bits(&alone)? == bits(&all.narrow(0, row, 1)?)?;
        }
        let check = format!(
            "skinny_matmul {dtype:?}: a row's bits whatever the rows beside it (M = 1, 8, 9, 16, 21, 40)"
        );
        report.expect(SECTION, &check, same, if same { "identical" } else { "differ" });
    }
    Ok(())
}

pub fn run(gpu: &Device, report: &mut Report) -> Result<()> {
    let mut rng =
        StdRng::seed_from_u64(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs());
    for (name, check) in [
        ("norms", norms as fn(&mut StdRng, &Device, &mut Report) -> Result<()>),
        ("rotary", rotary),
        ("silu_and_mul", silu),
        ("lora_add", lora),
        ("skinny_matmul", skinny),
        ("reshape_and_cache", kv_write),
        ("paged_attention", attention),
        ("sampler", crate::sampler_check::run),
    ] {
        if let Err(e) = check(&mut rng, gpu, report) {
            report.error(SECTION, name, format!("{e:#}"));
        }
    }
    Ok(())
}
