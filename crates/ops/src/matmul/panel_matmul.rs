//! `panel_matmul`: `y = x W^T` over a dense weight packed once, at load time, into column panels
//! ([`PanelWeight`]), for the many-token steps (prefill chunks, large decode batches).
//!
//! A general GEMM (candle's, through the `gemm` crate) repacks the right-hand matrix on every
//! call; for a model whose weights are read once per step that copy costs as much as the
//! multiplication. Here the weight is already in the order the microkernel reads: panel `p`
//! holds output columns `p * PANEL .. (p + 1) * PANEL`, one `PANEL`-wide row per input
//! element. The kernel keeps a tile of up to [`TILE_ROWS`] activation rows x `PANEL` outputs in
//! registers and walks the shared dimension once, so each weight value is loaded once per tile.
//!
//! Panels hold f32 values (exact) or bfloat16 pairs ([`PanelPrecision`]). On a CPU that
//! multiplies bfloat16 natively the second does twice the work per instruction and reads half
//! the bytes; on 2 cores of f32 FMAs the exact GEMM is compute-bound, so this is what large
//! batches gain most from. A block-quantized weight can instead keep its integer codes in int8
//! panels, multiplied with 8-bit ([`crate::matmul::int8_matmul`]) or 16-bit
//! ([`crate::matmul::int16_matmul`]) activations on AVX512-VNNI.
//!
//! Work is split over rayon by panels; each task runs every activation row against its panels
//! (a panel stays in L1/L2 while the activations stream past it). x86 kernels (AVX-512,
//! AVX512-BF16, AVX2 with FMA, chosen at run time) live in `panel_matmul_x86`; the portable
//! kernels here are the fallback and the tests' reference. The sums run in f32 in the order of
//! the shared dimension.

use std::sync::Arc;

use candle_core::{Result, Tensor};
use rayon::prelude::*;

use crate::matmul::cpu_matmul::{self, CpuWeight, OutPtr};
use crate::matmul::int8_matmul::Int8Weight;
use crate::matmul::quant_weight::QuantizedWeight;
use crate::par_rows::par_rows;
use crate::simd::{MulAdd, Separate};

/// Output columns per panel: two AVX-512 vectors (four AVX2 ones).
pub const PANEL: usize = 32;

/// Activation rows per register tile: 2 x 12 accumulators plus the two weight vectors fit in
/// AVX-512's 32 registers.
pub(crate) const TILE_ROWS: usize = 12;

/// What a [`PanelWeight`] stores and multiplies in. Sums are f32 either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PanelPrecision {
    /// The weight's f32 values times exact f32 activations.
    #[default]
    F32,
    /// Weights and activations rounded to bfloat16 (8 significant bits), products summed in
    /// f32: half the memory of `F32`, and twice the multiply rate on CPUs with AVX512-BF16,
    /// whose `vdpbf16ps` multiplies pairs of bfloat16 values into f32 sums.
    Bf16,
    /// A block-quantized weight's own integer codes (exact) times activations rounded to 8 bits
    /// per block of 32, as llama.cpp multiplies ([`crate::matmul::int8_matmul`]). A weight given as
    /// dense rows has no codes and is packed as [`PanelPrecision::auto_float`].
    Int8,
    /// The same int8 panels times activations rounded to 16 bits per block of 32
    /// ([`crate::matmul::int16_matmul`]): about 2^-15 of each block's largest value, finer than
    /// bfloat16's 8 significant bits, at twice `Int8`'s multiply-adds. A dense weight packs as
    /// [`PanelPrecision::auto_float`].
    Int16,
}

impl PanelPrecision {
    /// Whether this CPU multiplies bfloat16 pairs natively (else `Bf16` runs portable loops,
    /// slower than `F32`).
    pub fn cpu_has_native_bf16() -> bool {
        #[cfg(target_arch = "x86_64")]
        if crate::matmul::panel_matmul_x86::bf16_kernel().is_some() {
            return true;
        }
        false
    }

    /// Whether this CPU multiplies int8 with vector instructions (AVX512-VNNI, AVX-VNNI or
    /// AVX2); elsewhere `Int8` and `Int16` run portable loops, slower than the float panels.
    pub fn cpu_has_native_int8() -> bool {
        crate::matmul::int8_matmul::native_kernel().is_some()
    }

    /// Whether this precision multiplies a block-quantized weight's own codes (int8 panels).
    pub fn is_integer(self) -> bool {
        matches!(self, PanelPrecision::Int8 | PanelPrecision::Int16)
    }

    /// The float precision to use unless told otherwise: bfloat16 where the CPU multiplies it
    /// natively (elsewhere the portable bfloat16 loops are slower than the exact f32 kernels),
    /// else f32. Also what an integer request packs a dense (not block-quantized) weight as.
    pub fn auto_float() -> Self {
        if Self::cpu_has_native_bf16() {
            PanelPrecision::Bf16
        } else {
            PanelPrecision::F32
        }
    }
}

/// Panels' values: f32, or bfloat16 pairs `(k even, k odd)` in the low and high half of a u32.
#[derive(Debug, Clone)]
enum PanelData {
    F32(Vec<f32>),
    Bf16(Vec<u32>),
    Int8(Int8Weight),
    /// The int8 panels, multiplied with 16-bit activations.
    Int16(Int8Weight),
}

/// A dense `[rows (outputs), cols (inputs)]` matrix stored as `ceil(rows / PANEL)` panels, zero
/// padded past the last row. An f32 panel is `[cols, PANEL]`; a bfloat16 one is
/// `[ceil(cols / 2), PANEL]` pairs, so that one 512-bit load holds two inputs of 16 outputs.
#[derive(Debug, Clone)]
pub struct PanelWeight {
    rows: usize,
    cols: usize,
    data: PanelData,
}

impl PanelWeight {
    /// Packs a matrix given row by row: `fill_row(r, out)` writes row `r` (`cols` values).
    /// `Int8` and `Int16` pack as [`PanelPrecision::auto_float`].
    pub fn from_row_fn(
        rows: usize,
        cols: usize,
        precision: PanelPrecision,
        fill_row: impl Fn(usize, &mut [f32]) + Sync,
    ) -> Self {
        let panels = rows.div_ceil(PANEL);
        let data = match precision {
            // Never an integer precision again, so this recursion ends.
            PanelPrecision::Int8 | PanelPrecision::Int16 => {
                return Self::from_row_fn(rows, cols, PanelPrecision::auto_float(), fill_row)
            }
            PanelPrecision::F32 => PanelData::F32(pack(
                rows,
                cols,
                panels * cols * PANEL,
                |panel, j, row| {
                    for (k, &v) in row.iter().enumerate() {
                        panel[k * PANEL + j] = v;
                    }
                },
                &fill_row,
            )),
            PanelPrecision::Bf16 => {
                let pairs = cols.div_ceil(2);
                PanelData::Bf16(pack(
                    rows,
                    cols,
                    panels * pairs * PANEL,
                    |panel, j, row| {
                        // The activations' vector rounding (the same bits as `bf16_bits`), then
                        // one pair per panel row: the scalar conversion was a third of start-up
                        // for Gemma 3's 262k-row head.
                        let mut pairs = vec![0u32; pairs];
                        to_bf16_pairs(row, &mut pairs);
                        for (kp, &pair) in pairs.iter().enumerate() {
                            panel[kp * PANEL + j] = pair;
                        }
                    },
                    &fill_row,
                ))
            }
        };
        Self { rows, cols, data }
    }

    /// The dequantized form of a block-quantized weight (the same values as
    /// [`QuantizedWeight::dequantize`], rounded to bfloat16 for `Bf16`).
    /// `Int8` and `Int16` keep the blocks' integer codes and scales instead.
    pub fn from_quantized(w: &QuantizedWeight, precision: PanelPrecision) -> Self {
        let integer = match precision {
            PanelPrecision::Int8 => Some(PanelData::Int8(Int8Weight::from_quantized(w))),
            PanelPrecision::Int16 => Some(PanelData::Int16(Int8Weight::from_quantized(w))),
            PanelPrecision::F32 | PanelPrecision::Bf16 => None,
        };
        if let Some(data) = integer {
            return Self { rows: w.rows(), cols: w.cols(), data };
        }
        Self::from_row_fn(w.rows(), w.cols(), precision, |r, out| w.dequantize_row(r, out))
    }

    /// From a row-major `[rows, cols]` slice.
    pub fn from_rows(rows: usize, cols: usize, values: &[f32], precision: PanelPrecision) -> Self {
        assert_eq!(values.len(), rows * cols, "{rows}x{cols} matrix");
        Self::from_row_fn(rows, cols, precision, |r, out| {
            out.copy_from_slice(&values[r * cols..(r + 1) * cols])
        })
    }

    /// Outputs of the matmul.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The shared (input) dimension.
    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn precision(&self) -> PanelPrecision {
        match self.data {
            PanelData::F32(_) => PanelPrecision::F32,
            PanelData::Bf16(_) => PanelPrecision::Bf16,
            PanelData::Int8(_) => PanelPrecision::Int8,
            PanelData::Int16(_) => PanelPrecision::Int16,
        }
    }

    #[cfg(test)]
    pub(crate) fn num_panels(&self) -> usize {
        self.rows.div_ceil(PANEL)
    }

    /// Panel `p` of an f32 weight: `cols` rows of `PANEL` values.
    pub(crate) fn panel(&self, p: usize) -> &[f32] {
        match &self.data {
            PanelData::F32(d) => &d[p * self.cols * PANEL..(p + 1) * self.cols * PANEL],
            PanelData::Bf16(_) | PanelData::Int8(_) | PanelData::Int16(_) => {
                panic!("panel() of a non-f32 weight")
            }
        }
    }

    /// Panel `p` of a bfloat16 weight: `ceil(cols / 2)` rows of `PANEL` pairs.
    pub(crate) fn bf16_panel(&self, p: usize) -> &[u32] {
        let len = self.cols.div_ceil(2) * PANEL;
        match &self.data {
            PanelData::Bf16(d) => &d[p * len..(p + 1) * len],
            PanelData::F32(_) | PanelData::Int8(_) | PanelData::Int16(_) => {
                panic!("bf16_panel() of a non-bfloat16 weight")
            }
        }
    }

    /// Bytes of packed values.
    pub fn size_in_bytes(&self) -> usize {
        match &self.data {
            PanelData::F32(d) => std::mem::size_of_val(d.as_slice()),
            PanelData::Bf16(d) => std::mem::size_of_val(d.as_slice()),
            PanelData::Int8(w) | PanelData::Int16(w) => w.size_in_bytes(),
        }
    }
}

/// Fills `len` packed values panel by panel in parallel: `put(panel, j, row)` stores row `j`
/// of the panel, given as f32 by `fill_row`.
fn pack<E: Copy + Default + Send>(
    rows: usize,
    cols: usize,
    len: usize,
    put: impl Fn(&mut [E], usize, &[f32]) + Sync,
    fill_row: &(impl Fn(usize, &mut [f32]) + Sync),
) -> Vec<E> {
    let mut data = vec![E::default(); len];
    let panels = rows.div_ceil(PANEL);
    if panels > 0 && cols > 0 {
        data.par_chunks_mut(len / panels).enumerate().for_each(|(p, panel)| {
            let mut row = vec![0f32; cols];
            for j in 0..PANEL.min(rows - p * PANEL) {
                fill_row(p * PANEL + j, &mut row);
                put(panel, j, &row);
            }
        });
    }
    data
}

/// `x` rounded to the nearest bfloat16, ties to even (NaN stays NaN).
#[inline]
pub(crate) fn bf16_bits(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// The f32 value of a bfloat16.
#[inline(always)]
fn bf16_value(bits: u32) -> f32 {
    f32::from_bits(bits << 16)
}

/// Computes one tile: `out_rows[i][c] = x_rows[i] . W[panel column c]` for `c < width`, where
/// `panel` is one panel of a weight with `x_rows[i].len()` columns. Implementations may assume
/// `x_rows.len()` is in `1..=TILE_ROWS`, `width` in `1..=PANEL`, every x row holds
/// `panel.len() / PANEL` values and every out row `width`.
pub(crate) type TileKernel = fn(x_rows: &[&[f32]], panel: &[f32], out_rows: &mut [&mut [f32]], width: usize);

/// The same for a bfloat16 weight: x rows hold `panel.len() / PANEL` bfloat16 pairs.
pub(crate) type Bf16TileKernel =
    fn(x_rows: &[&[u32]], panel: &[u32], out_rows: &mut [&mut [f32]], width: usize);

/// `x @ w^T`: `x` is f32 `[tokens, cols]` on the CPU (rows contiguous, any row stride); returns
/// f32 `[tokens, w.rows()]`.
pub fn panel_matmul(x: &Tensor, w: &Arc<PanelWeight>) -> Result<Tensor> {
    cpu_matmul::apply(x, w)
}

impl CpuWeight for PanelWeight {
    const OP: &'static str = "panel_matmul";

    fn rows(&self) -> usize {
        PanelWeight::rows(self)
    }

    fn cols(&self) -> usize {
        PanelWeight::cols(self)
    }

    fn matmul(&self, x_rows: &[&[f32]]) -> Vec<f32> {
        match &self.data {
            PanelData::F32(_) => matmul(self, x_rows, kernel()),
            PanelData::Bf16(_) => matmul_bf16(self, x_rows, bf16_kernel()),
            PanelData::Int8(w) => w.matmul(x_rows),
            PanelData::Int16(w) => w.matmul_int16(x_rows),
        }
    }
}

/// `[x_rows.len(), w.rows()]` row-major, for an f32 weight.
pub(crate) fn matmul(w: &PanelWeight, x_rows: &[&[f32]], kernel: TileKernel) -> Vec<f32> {
    run_tiles(w, x_rows, |p| w.panel(p), kernel)
}

/// `[x_rows.len(), w.rows()]` row-major, for a bfloat16 weight: the activations are rounded to
/// bfloat16 pairs once, then multiplied tile by tile.
pub(crate) fn matmul_bf16(w: &PanelWeight, x_rows: &[&[f32]], kernel: Bf16TileKernel) -> Vec<f32> {
    let pairs = w.cols().div_ceil(2);
    let x = par_rows(x_rows.len(), pairs, 1, 0u32, |i, dst| to_bf16_pairs(x_rows[i], dst));
    let rows: Vec<&[u32]> = x.chunks(pairs.max(1)).collect();
    run_tiles(w, &rows, |p| w.bf16_panel(p), kernel)
}

/// Rounds `src` to bfloat16 pairs (a zero pads an odd length).
fn to_bf16_pairs(src: &[f32], dst: &mut [u32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::matmul::panel_matmul_x86::to_bf16_pairs(src, dst) {
        return;
    }
    to_bf16_pairs_portable(src, dst);
}

pub(crate) fn to_bf16_pairs_portable(src: &[f32], dst: &mut [u32]) {
    for (d, two) in dst.iter_mut().zip(src.chunks(2)) {
        let high = two.get(1).map_or(0, |&v| bf16_bits(v));
        *d = u32::from(bf16_bits(two[0])) | u32::from(high) << 16;
    }
}

/// A tile kernel over activations of `X` and panel values of `W`.
type GenericTileKernel<X, W> = fn(&[&[X]], &[W], &mut [&mut [f32]], usize);

/// Runs `kernel` over every (panel, tile of rows).
fn run_tiles<'w, X: Sync, W: Sync + 'w>(
    w: &'w PanelWeight,
    x_rows: &[&[X]],
    panel: impl Fn(usize) -> &'w [W] + Sync,
    kernel: GenericTileKernel<X, W>,
) -> Vec<f32> {
    if w.cols() == 0 {
        return vec![0f32; x_rows.len() * w.rows()];
    }
    for_each_tile(x_rows.len(), w.rows(), TILE_ROWS, |pi, rows, out_rows, width| {
        kernel(&x_rows[rows], panel(pi), out_rows, width)
    })
}

/// The `[m, n]` row-major output of a panel matmul, computed by `tile(panel, rows, out_rows,
/// width)` for every panel of `PANEL` output columns and every run of at most `tile_rows` rows,
/// where `out_rows` are those rows' `width` columns of the panel. Work is split over rayon by
/// panels, a few tasks per thread.
pub(crate) fn for_each_tile(
    m: usize,
    n: usize,
    tile_rows: usize,
    tile: impl Fn(usize, std::ops::Range<usize>, &mut [&mut [f32]], usize) + Sync,
) -> Vec<f32> {
    // Each tile zeroes its own part just before writing it (see `par_rows`), so no thread
    // waits for a memset of the whole output.
    let mut out: Vec<f32> = Vec::with_capacity(m * n);
    if m == 0 || n == 0 {
        return out;
    }
    let panels = n.div_ceil(PANEL);
    let threads = rayon::current_num_threads().max(1);
    // A few tasks per thread balance uneven progress.
    let per_task = panels.div_ceil(threads * 4).max(1);
    let ptr = OutPtr(out.as_mut_ptr());
    (0..panels.div_ceil(per_task)).into_par_iter().for_each(|t| {
        let p = ptr;
        for pi in t * per_task..((t + 1) * per_task).min(panels) {
            let col0 = pi * PANEL;
            let width = PANEL.min(n - col0);
            for r0 in (0..m).step_by(tile_rows) {
                let r1 = (r0 + tile_rows).min(m);
                // SAFETY: row `r` columns `col0..col0 + width` lie inside `out`'s allocation and
                // belong to this task's panel only; no other reference to them exists while the
                // tile runs, and they are initialised (zeroed) before a slice is made of them.
                let mut out_rows: Vec<&mut [f32]> = (r0..r1)
                    .map(|r| unsafe {
                        let row = p.0.add(r * n + col0);
                        row.write_bytes(0, width);
                        std::slice::from_raw_parts_mut(row, width)
                    })
                    .collect();
                tile(pi, r0..r1, &mut out_rows, width);
            }
        }
    });
    // SAFETY: the panels cover columns 0..n and the tiles rows 0..m, so every element was
    // written above.
    unsafe { out.set_len(m * n) };
    out
}

/// The fastest kernel this CPU runs.
pub(crate) fn kernel() -> TileKernel {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = crate::matmul::panel_matmul_x86::kernel() {
        return k;
    }
    portable_kernel
}

/// The fastest bfloat16 kernel this CPU runs.
pub(crate) fn bf16_kernel() -> Bf16TileKernel {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = crate::matmul::panel_matmul_x86::bf16_kernel() {
        return k;
    }
    portable_bf16_kernel
}

/// Plain Rust: a `TILE_ROWS x PANEL` accumulator walked over the shared dimension.
pub(crate) fn portable_kernel(x_rows: &[&[f32]], panel: &[f32], out_rows: &mut [&mut [f32]], width: usize) {
    tile_rows::<Separate, TILE_ROWS>(x_rows, panel, out_rows, width);
}

/// The tile loop for up to `ROWS` activation rows at a time, written so LLVM vectorises it for
/// whatever target features its caller enables.
#[inline(always)]
pub(crate) fn tile_rows<M: MulAdd, const ROWS: usize>(
    x_rows: &[&[f32]],
    panel: &[f32],
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    for (xs, outs) in x_rows.chunks(ROWS).zip(out_rows.chunks_mut(ROWS)) {
        let mut acc = [[0f32; PANEL]; ROWS];
        for (k, wk) in panel.chunks_exact(PANEL).enumerate() {
            for (acc_row, x) in acc.iter_mut().zip(xs) {
                let xv = x[k];
                for (a, &wv) in acc_row.iter_mut().zip(wk) {
                    *a = M::mul_add(xv, wv, *a);
                }
            }
        }
        for (out, acc_row) in outs.iter_mut().zip(&acc) {
            out[..width].copy_from_slice(&acc_row[..width]);
        }
    }
}

/// Plain Rust bfloat16 tile: each pair adds its odd product, then its even one, as `vdpbf16ps`
/// does. Products of two bfloat16 values are exact in f32.
pub(crate) fn portable_bf16_kernel(
    x_rows: &[&[u32]],
    panel: &[u32],
    out_rows: &mut [&mut [f32]],
    width: usize,
) {
    for (xs, outs) in x_rows.chunks(TILE_ROWS).zip(out_rows.chunks_mut(TILE_ROWS)) {
        let mut acc = [[0f32; PANEL]; TILE_ROWS];
        for (kp, wk) in panel.chunks_exact(PANEL).enumerate() {
            for (acc_row, x) in acc.iter_mut().zip(xs) {
                let (x_even, x_odd) = (bf16_value(x[kp] & 0xFFFF), bf16_value(x[kp] >> 16));
                for (a, &wv) in acc_row.iter_mut().zip(wk) {
                    *a += x_odd * bf16_value(wv >> 16);
                    *a += x_even * bf16_value(wv & 0xFFFF);
                }
            }
        }
        for (out, acc_row) in outs.iter_mut().zip(&acc) {
            out[..width].copy_from_slice(&acc_row[..width]);
        }
    }
}

#[cfg(test)]
#[path = "panel_matmul_tests.rs"]
mod tests;
