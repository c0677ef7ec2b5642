//! Small f32 vector kernels (dot, weighted row sums, scale, exp) written so LLVM vectorises them.
//!
//! Plain `iter().sum()` is a strict left-to-right reduction LLVM may not reorder, so `dot`
//! keeps independent partial sums in lanes. All are `#[inline(always)]` so that a caller
//! compiled with extra target features (see `paged_attention_cpu`) gets wider vectors, and
//! the multiply-adds are generic over [`MulAdd`] so that such a caller can use FMA.

use half::f16;

use crate::dtype::Float;

/// Accumulator lanes of `dot`: one AVX2 vector.
const LANES: usize = 8;

/// How `a * b + c` is computed.
pub(crate) trait MulAdd: Sized {
    fn mul_add(a: f32, b: f32, c: f32) -> f32;

    /// Columns `at..at + head_dim` of a key chunk's rows, transposed into `kt` (see
    /// [`crate::attention_scores`]).
    #[inline(always)]
    fn transpose_keys(rows: &[&[f32]], at: usize, head_dim: usize, kt: &mut [f32], stride: usize) {
        crate::attention_scores::transpose_portable(rows, at, head_dim, kt, stride);
    }

    /// Scores of a group of query rows sharing `keys` (see [`crate::attention_group`]).
    #[inline(always)]
    fn group_scores(q: &[f32], head_dim: usize, keys: &[&[f32]], scores: &mut [f32], stride: usize) {
        crate::attention_group::scores_portable::<Self>(q, head_dim, keys, scores, stride);
    }

    /// Whether the attention scores with keys in lanes ([`MulAdd::chunk_scores`] over transposed
    /// chunks) rather than with [`MulAdd::group_scores`]: one answer per build, so every query is
    /// scored one way.
    #[inline(always)]
    fn keys_in_lanes() -> bool {
        false
    }

    /// Whether this build has [`MulAdd::transpose_halves`] for heads of `head_dim`.
    #[inline(always)]
    fn transposes_halves(_head_dim: usize) -> bool {
        false
    }

    /// Columns `rows.at..rows.at + head_dim` of a chunk's rows in a 16-bit cache, widened and
    /// transposed into `kt` in one pass. Only called where [`MulAdd::transposes_halves`] holds.
    #[inline(always)]
    fn transpose_halves(
        _src: crate::dtype::Halves<'_>,
        _rows: &crate::attention_scores::HalfRows<'_>,
        _head_dim: usize,
        _kt: &mut [f32],
        _stride: usize,
    ) {
        unreachable!("no fused half transpose in the portable build")
    }

    /// Scores of query rows against keys `keys` of a transposed chunk (see
    /// [`crate::attention_scores`]).
    #[inline(always)]
    fn chunk_scores(
        q: &[f32],
        head_dim: usize,
        kt: &[f32],
        kt_stride: usize,
        keys: std::ops::Range<usize>,
        scores: &mut [f32],
        stride: usize,
    ) {
        crate::attention_scores::scores_portable::<Self>(q, head_dim, kt, kt_stride, keys, scores, stride);
    }

    /// `P V` of a group of rows sharing `values` (see [`crate::attention_group`]).
    #[inline(always)]
    fn group_accumulate(out: &mut [f32], head_dim: usize, p: &[f32], stride: usize, values: &[&[f32]]) {
        crate::attention_group::accumulate_portable::<Self>(out, head_dim, p, stride, values);
    }

    /// `src` widened exactly into `dst` (same length): an f16 KV cache's rows as the attention
    /// reads them.
    #[inline(always)]
    fn widen_f16(src: &[f16], dst: &mut [f32]) {
        <f16 as Float>::to_f32_slice(src, dst);
    }
}

/// Multiply then add: vectorises on every target.
pub(crate) struct Separate;

/// One fused instruction; only for code compiled with the `fma` target feature, since without
/// it `f32::mul_add` is a library call per element.
pub(crate) struct Fused;

impl MulAdd for Separate {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }

    /// With 256-bit vectors, keys in lanes cost the transposes and save no multiply-adds (the
    /// row-major loop already fills its vectors): 10-25% slower measured, so AVX2 keeps
    /// row-major scores.
    #[inline(always)]
    fn group_scores(q: &[f32], head_dim: usize, keys: &[&[f32]], scores: &mut [f32], stride: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            assert!(level() != Level::None);
            // SAFETY: the CPU has AVX2 and FMA (asserted; the check is cached).
            unsafe { crate::attention_group::scores_avx2(q, head_dim, keys, scores, stride) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        crate::attention_group::scores_portable::<Self>(q, head_dim, keys, scores, stride);
    }

    #[inline(always)]
    fn widen_f16(src: &[f16], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if f16c() {
            // SAFETY: the CPU has AVX and F16C (checked; the check is cached).
            return unsafe { widen_f16_f16c(src, dst) };
        }
        <f16 as Float>::to_f32_slice(src, dst);
    }
}

/// Whether the CPU converts halves in hardware (F16C: every AVX2 CPU we know of, but checked).
#[cfg(target_arch = "x86_64")]
fn f16c() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx") && is_x86_feature_detected!("f16c"))
}

/// 256-bit `vcvtph2ps`, exact as [`widen_f16_avx512`]: the attention's f16 cache rows on AVX2
/// CPUs, where the portable widening's integer steps cost several instructions per 8 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
pub(crate) unsafe fn widen_f16_f16c(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = src.len().min(dst.len());
    let whole = n / 8 * 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: `i + 8 <= n` for both slices; unaligned loads and stores.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    <f16 as Float>::to_f32_slice(&src[whole..n], &mut dst[whole..n]);
}

/// [`Fused`] in code compiled with AVX-512F as well: the attention's group loops use 512-bit
/// vectors where that pays.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Wide;

#[cfg(target_arch = "x86_64")]
impl MulAdd for Wide {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }

    #[inline(always)]
    fn transpose_keys(rows: &[&[f32]], at: usize, head_dim: usize, kt: &mut [f32], stride: usize) {
        assert!(level() == Level::Avx512);
        // SAFETY: the CPU has AVX-512F (asserted; the check is cached).
        unsafe { crate::attention_scores::transpose_avx512(rows, at, head_dim, kt, stride) }
    }

    #[inline(always)]
    fn group_scores(q: &[f32], head_dim: usize, keys: &[&[f32]], scores: &mut [f32], stride: usize) {
        Fused::group_scores(q, head_dim, keys, scores, stride);
    }

    /// 16 keys a multiply-add where the row-major loop does 8 (and then sums across lanes):
    /// prefills 1.35-1.6x faster, decodes as fast, for heads of 64 and 256.
    #[inline(always)]
    fn keys_in_lanes() -> bool {
        true
    }

    #[inline(always)]
    fn transposes_halves(head_dim: usize) -> bool {
        head_dim.is_multiple_of(16)
    }

    #[inline(always)]
    fn transpose_halves(
        src: crate::dtype::Halves<'_>,
        rows: &crate::attention_scores::HalfRows<'_>,
        head_dim: usize,
        kt: &mut [f32],
        stride: usize,
    ) {
        assert!(level() == Level::Avx512 && Self::transposes_halves(head_dim));
        // SAFETY: the CPU has AVX-512F and head_dim is whole vectors (asserted).
        unsafe { crate::attention_scores::transpose_halves_avx512(src, rows, head_dim, kt, stride) }
    }

    #[inline(always)]
    fn chunk_scores(
        q: &[f32],
        head_dim: usize,
        kt: &[f32],
        kt_stride: usize,
        keys: std::ops::Range<usize>,
        scores: &mut [f32],
        stride: usize,
    ) {
        assert!(level() == Level::Avx512);
        // SAFETY: the CPU has AVX-512F and FMA (asserted; the check is cached).
        unsafe { crate::attention_scores::scores_avx512(q, head_dim, kt, kt_stride, keys, scores, stride) }
    }

    #[inline(always)]
    fn group_accumulate(out: &mut [f32], head_dim: usize, p: &[f32], stride: usize, values: &[&[f32]]) {
        assert!(level() == Level::Avx512);
        // SAFETY: the CPU has AVX-512F and FMA (asserted; the check is cached).
        unsafe { crate::attention_group::accumulate_avx512(out, head_dim, p, stride, values) }
    }

    /// One `vcvtph2ps` per 16 values, where the portable widening takes about ten integer and
    /// float instructions: in decode steps over an f16 cache that widening was most of the
    /// attention's time.
    #[inline(always)]
    fn widen_f16(src: &[f16], dst: &mut [f32]) {
        assert!(level() == Level::Avx512);
        // SAFETY: the CPU has AVX-512F (asserted; the check is cached).
        unsafe { widen_f16_avx512(src, dst) }
    }
}

/// `vcvtph2ps` is exact for every finite and infinite f16, as the portable widening is; a NaN
/// stays a NaN (signalling ones come back quiet).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn widen_f16_avx512(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm512_cvtph_ps, _mm512_storeu_ps};
    let n = src.len().min(dst.len());
    let whole = n / 16 * 16;
    for i in (0..whole).step_by(16) {
        // SAFETY: `i + 16 <= n` for both slices; unaligned loads and stores.
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(i).cast::<__m256i>());
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
        }
    }
    <f16 as Float>::to_f32_slice(&src[whole..n], &mut dst[whole..n]);
}

/// `sum(a[i] * b[i])` over the shorter length.
#[inline(always)]
pub(crate) fn dot<M: MulAdd>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        // Fixed-size arrays let LLVM drop the bounds checks and use one full-width vector.
        let (x, y): (&[f32; LANES], &[f32; LANES]) = match (x.try_into(), y.try_into()) {
            (Ok(x), Ok(y)) => (x, y),
            _ => unreachable!("chunks_exact yields LANES-long chunks"),
        };
        for i in 0..LANES {
            acc[i] = M::mul_add(x[i], y[i], acc[i]);
        }
    }
    // A plain sequential sum of the lanes: fancier reduction trees lead LLVM's SLP vectoriser
    // to split the accumulator into 2-lane pieces, which is several times slower.
    acc.iter().sum::<f32>() + tail
}

/// Rows [`dot_rows_portable`] scores together: one accumulator chain each, so the multiply-adds of
/// different rows overlap instead of waiting on one chain's latency.
const DOT_ROWS: usize = 8;

/// `out[j] = dot(q, rows[j])` for every row (each at least `q.len()` long), [`DOT_ROWS`] rows
/// at a time (the portable attention scores; x86 uses `attention_group::scores_avx2`).
#[inline(always)]
pub(crate) fn dot_rows_portable<M: MulAdd>(q: &[f32], rows: &[&[f32]], out: &mut [f32]) {
    let n = q.len();
    let full = n / LANES * LANES;
    let mut r = 0;
    while r + DOT_ROWS <= rows.len().min(out.len()) {
        let ks: [&[f32]; DOT_ROWS] = std::array::from_fn(|j| &rows[r + j][..n]);
        let mut acc = [[0f32; LANES]; DOT_ROWS];
        for d in (0..full).step_by(LANES) {
            let qv: &[f32; LANES] = q[d..d + LANES].try_into().expect("LANES-long chunk");
            for (acc, k) in acc.iter_mut().zip(&ks) {
                let kv: &[f32; LANES] = k[d..d + LANES].try_into().expect("LANES-long chunk");
                for i in 0..LANES {
                    acc[i] = M::mul_add(qv[i], kv[i], acc[i]);
                }
            }
        }
        for (j, (acc, k)) in acc.iter().zip(&ks).enumerate() {
            let tail: f32 = q[full..].iter().zip(&k[full..]).map(|(x, y)| x * y).sum();
            out[r + j] = acc.iter().sum::<f32>() + tail;
        }
        r += DOT_ROWS;
    }
    for (o, row) in out[r..].iter_mut().zip(&rows[r..]) {
        *o = dot::<M>(q, row);
    }
}

/// Width of the output segment [`add_weighted_rows`] keeps in registers.
const SEGMENT: usize = 64;

/// `out += sum_j weights[j] * rows[j]`, each row holding at least `out.len()` elements (only
/// those are read).
///
/// Each `SEGMENT`-wide slice of `out` is accumulated in registers over all rows and written
/// once, instead of loading and storing `out` for every row.
#[inline(always)]
pub(crate) fn add_weighted_rows<M: MulAdd>(out: &mut [f32], weights: &[f32], rows: &[&[f32]]) {
    let width = out.len();
    if width == 0 {
        return;
    }
    let mut d0 = 0;
    while d0 + SEGMENT <= width {
        let mut acc = [0f32; SEGMENT];
        for (&w, row) in weights.iter().zip(rows) {
            let v = &row[d0..d0 + SEGMENT];
            for i in 0..SEGMENT {
                acc[i] = M::mul_add(w, v[i], acc[i]);
            }
        }
        for (o, a) in out[d0..d0 + SEGMENT].iter_mut().zip(acc) {
            *o += a;
        }
        d0 += SEGMENT;
    }
    if d0 < width {
        for (&w, row) in weights.iter().zip(rows) {
            for (o, v) in out[d0..].iter_mut().zip(&row[d0..width]) {
                *o = M::mul_add(w, *v, *o);
            }
        }
    }
}

/// The largest element (`-inf` for none), in lanes that vectorise.
#[inline(always)]
pub(crate) fn max_lanes(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        let c: &[f32; LANES] = c.try_into().expect("LANES-long chunk");
        for i in 0..LANES {
            // A compare rather than `f32::max`, which LLVM will not vectorise.
            acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
        }
    }
    acc.iter().copied().fold(tail, f32::max)
}

/// The sum of the elements, in `LANES` partial sums (a fixed order, not left to right).
#[inline(always)]
pub(crate) fn sum_lanes(xs: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        let c: &[f32; LANES] = c.try_into().expect("LANES-long chunk");
        for i in 0..LANES {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `y[i] *= alpha`.
#[inline(always)]
pub(crate) fn scale(y: &mut [f32], alpha: f32) {
    for y in y.iter_mut() {
        *y *= alpha;
    }
}

/// Below this, `exp` would leave the normal range; inputs are clamped here (the result,
/// ~1.2e-38, is as good as 0 next to the softmax's max term of 1).
const EXP_MIN: f32 = -87.0;

/// `x[i] = e^x[i]` for `x[i] <= 0` (softmax scores minus their max), relative error < 2e-7.
///
/// `f32::exp` is a libm call per element; this is range reduction `x = n ln2 + r` plus a
/// degree-6 polynomial for `e^r`, all in plain arithmetic so it vectorises. NaN stays NaN.
#[inline(always)]
pub(crate) fn exp_nonpositive(xs: &mut [f32]) {
    // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    for x in xs.iter_mut() {
        // Written as a compare so NaN passes through unclamped.
        let v = if *x < EXP_MIN { EXP_MIN } else { *x };
        let shifted = v * std::f32::consts::LOG2_E + ROUND;
        let n = shifted - ROUND;
        let n_int = (shifted.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
        let r = v - n * LN2_HI - n * LN2_LO;
        let p = 1.0
            + r * (1.0
                + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
        // 2^n built from its exponent bits; n is in [-126, 0] here, so it is a normal number.
        let two_n = f32::from_bits((n_int.wrapping_add(127) as u32) << 23);
        *x = p * two_n;
    }
}

/// Asks the CPU to start loading `data` into cache (a hint; no effect on results).
#[inline(always)]
pub(crate) fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T0 }, T>(data);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// [`prefetch`] into the level-2 cache only: for data wanted a while from now, whose lines in
/// level 1 would evict what is being worked on (attention's next chunk of K/V rows is 48 KB on
/// an f16 cache, more than level 1 holds).
#[inline(always)]
pub(crate) fn prefetch_l2<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T1 }, T>(data);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines<const HINT: i32, T>(data: &[T]) {
    let bytes = std::mem::size_of_val(data);
    let start = data.as_ptr().cast::<i8>();
    for line in (0..bytes).step_by(64) {
        // SAFETY: the address lies inside `data`; prefetching never faults or writes.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(start.add(line)) };
    }
}

/// The widest x86 vector level the kernels use on this CPU (checked once), at most what
/// [`ISA_ENV`] allows.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Level {
    /// AVX-512F with FMA.
    Avx512,
    /// AVX2 with FMA.
    Avx2,
    None,
}

/// The environment variable that caps the instructions the CPU kernels use: `avx512` (the
/// default: everything the CPU has), `avx-vnni` (AVX2 and AVX-VNNI), `avx2` (AVX2 and FMA) or
/// `portable` (plain Rust). It makes one machine run the kernels another would (the AVX2 ones on
/// an AVX-512 box, as most cloud AMD EPYCs have them), for tests and benchmarks.
pub const ISA_ENV: &str = "PAGODA_CPU_ISA";

/// The cap [`ISA_ENV`] sets, ordered from the least to the most allowed.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum IsaCap {
    Portable,
    Avx2,
    AvxVnni,
    Avx512,
}

#[cfg(target_arch = "x86_64")]
fn isa_cap() -> IsaCap {
    static CAP: std::sync::OnceLock<IsaCap> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| match std::env::var(ISA_ENV).as_deref() {
        Err(_) | Ok("" | "avx512") => IsaCap::Avx512,
        Ok("avx-vnni") => IsaCap::AvxVnni,
        Ok("avx2") => IsaCap::Avx2,
        Ok("portable") => IsaCap::Portable,
        Ok(other) => {
            eprintln!("warning: {ISA_ENV}={other:?} is not avx512, avx-vnni, avx2 or portable; ignored");
            IsaCap::Avx512
        }
    })
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn level() -> Level {
    static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        let cap = isa_cap();
        if cap >= IsaCap::Avx512 && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
            Level::Avx512
        } else if cap >= IsaCap::Avx2 && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            Level::Avx2
        } else {
            Level::None
        }
    })
}

/// Whether the 256-bit kernels may use AVX-VNNI (`vpdpbusd`, `vpdpwssd` on ymm registers).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx_vnni() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        isa_cap() >= IsaCap::AvxVnni && level() != Level::None && is_x86_feature_detected!("avxvnni")
    })
}

/// The instructions the CPU kernels use, for the logs: `avx512`, `avx-vnni`, `avx2` or
/// `portable`.
pub fn cpu_isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        match level() {
            Level::Avx512 => "avx512",
            Level::Avx2 if avx_vnni() => "avx-vnni",
            Level::Avx2 => "avx2",
            Level::None => "portable",
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    "portable"
}

#[cfg(test)]
#[path = "simd_tests.rs"]
mod tests;
