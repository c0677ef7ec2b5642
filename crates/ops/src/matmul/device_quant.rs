//! GGUF blocks kept quantized on a CUDA device: a [`QuantizedWeight`]'s arrays uploaded as they
//! are (kernels/quant_matmul.cu reads them), multiplied by decode steps of up to
//! [`QUANT_MATMUL_MAX_ROWS`] rows without ever being dense, and dequantized into a scratch copy
//! for the larger steps, which cuBLAS then multiplies.
//!
//! The device keeps 5 to 9 bits per weight instead of 16. The scratch copy, and the kernel in
//! f16 and for Q8_0, hold the value the GGUF defines (the CPU's exact f32) rounded once to the
//! activations' dtype: the numbers a dequantized copy of the weight would hold. In bf16 the
//! kernel dequantizes the 4- to 6-bit formats two elements at a time with the scale and minimum
//! rounded to bf16, within about 1.5 bf16 units of that value (kernels/quant_matmul.cu).
//!
//! On the CPU the ops run their references (for tests): dequantize, round to the dtype, f32
//! sums in order.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};

use crate::check::{self, invalid};
pub use crate::cuda::quant::{QuantLaunch, QUANT_KERNEL_MAX_ROWS, QUANT_MATMUL_MAX_ROWS};
use crate::dtype::{with_float, Float};
use crate::{QuantFormat, QuantizedWeight, QUANT_BLOCK};

const OP: &str = "quant_matmul";

/// Where each array starts in the uploaded bytes (16-byte boundaries): codes, high planes,
/// scales, minimums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sections {
    codes: usize,
    high: usize,
    scales: usize,
    mins: usize,
    end: usize,
}

impl Sections {
    fn of(format: QuantFormat, rows: usize, cols: usize) -> Self {
        let blocks = rows * cols / QUANT_BLOCK;
        let align = |n: usize| n.next_multiple_of(16);
        let codes = 0;
        let high = align(codes + blocks * format.code_bytes());
        let scales = align(high + 4 * blocks * format.high_planes());
        let mins = align(scales + 4 * blocks * format.scales_per_block());
        let end = align(mins + if format.has_mins() { 4 * blocks } else { 0 });
        Self { codes, high, scales, mins, end }
    }
}

/// A `[rows, cols]` matrix of GGUF blocks on a device (or, for tests, the CPU).
#[derive(Debug, Clone)]
pub struct DeviceQuantWeight {
    shape: WeightShape,
    /// The arrays back to back as `u8`, each at its [`Sections`] offset.
    data: Tensor,
}

impl DeviceQuantWeight {
    /// Uploads `w`'s arrays to `device`.
    pub fn new(w: &QuantizedWeight, device: &Device) -> Result<Self> {
        let sections = Sections::of(w.format(), w.rows(), w.cols());
        // Each array after the last, zero-padded up to its section's start.
        let mut bytes = Vec::with_capacity(sections.end);
        bytes.extend_from_slice(w.codes());
        bytes.resize(sections.high, 0);
        bytes.extend(w.high().iter().flat_map(|v| v.to_le_bytes()));
        bytes.resize(sections.scales, 0);
        bytes.extend(w.scales().iter().flat_map(|v| v.to_le_bytes()));
        bytes.resize(sections.mins, 0);
        bytes.extend(w.mins().iter().flat_map(|v| v.to_le_bytes()));
        bytes.resize(sections.end, 0);
        let data = Tensor::from_vec(bytes, sections.end, device)?;
        Ok(Self { shape: WeightShape { format: w.format(), rows: w.rows(), cols: w.cols(), sections }, data })
    }

    pub fn format(&self) -> QuantFormat {
        self.shape.format
    }

    pub fn rows(&self) -> usize {
        self.shape.rows
    }

    pub fn cols(&self) -> usize {
        self.shape.cols
    }

    /// Bytes held on the device.
    pub fn size_in_bytes(&self) -> usize {
        self.shape.sections.end
    }

    /// Whether [`DeviceQuantWeight::forward`] multiplies `x` on the quantized kernel: on CUDA,
    /// f16 or bf16 on the weight's device, 1 to [`QUANT_MATMUL_MAX_ROWS`] rows of `cols`
    /// elements, contiguous and starting on 16-byte boundaries.
    pub fn kernel_takes(&self, x: &Tensor) -> bool {
        if !x.device().is_cuda() || !x.device().same_device(self.data.device()) {
            return false;
        }
        let Ok((m, k)) = x.dims2() else { return false };
        matches!(x.dtype(), DType::BF16 | DType::F16)
            && (1..=QUANT_MATMUL_MAX_ROWS).contains(&m)
            && k == self.cols()
            && check::rows(x.layout(), 1, OP)
                .is_ok_and(|r| r.start.is_multiple_of(8) && (r.rows == 1 || r.row_stride.is_multiple_of(8)))
    }

    /// `x [M, cols] . w^T` as `[M, rows]` in x's dtype: the quantized kernel for the inputs
    /// [`DeviceQuantWeight::kernel_takes`], else cuBLAS (or candle's CPU matmul) on a copy
    /// dequantized to x's dtype for this call.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.kernel_takes(x) {
            return self.matmul(x);
        }
        x.matmul(&self.dequantize(x.dtype())?.t()?)
    }

    /// `x [M, cols] . w^T` on the quantized kernel (CUDA: f16/bf16, up to
    /// [`QUANT_KERNEL_MAX_ROWS`] rows, of which models send [`QUANT_MATMUL_MAX_ROWS`]; the CPU:
    /// the reference, any float dtype and M).
    pub fn matmul(&self, x: &Tensor) -> Result<Tensor> {
        self.matmul_with(x, None)
    }

    /// As [`DeviceQuantWeight::matmul`] with the kernel's spread chosen by the caller (`None`
    /// for the weight's rule): for timing the rule, not for models.
    pub fn matmul_with(&self, x: &Tensor, launch: Option<QuantLaunch>) -> Result<Tensor> {
        let (_, k) = x.dims2()?;
        if k != self.cols() {
            return Err(invalid(OP, format!("x has {k} columns, the weight {}", self.cols())));
        }
        check::same_device(x, &self.data, OP)?;
        x.apply_op2_no_bwd(&self.data, &QuantMatmulOp { weight: self.shape, launch })
    }

    /// The weight as a dense `[rows, cols]` tensor of `dtype` (f32, f16 or bf16).
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor> {
        self.data.apply_op1_no_bwd(&DequantizeOp { weight: self.shape, dtype })
    }

    /// The uploaded bytes and the arrays' addresses when they start at `base` (the simulator
    /// tests' host buffers).
    #[cfg_attr(not(all(test, feature = "kernel-sim")), allow(dead_code))]
    pub(crate) fn bytes_and_pointers(&self, base: u64) -> (&Tensor, crate::cuda::quant::QuantPointers) {
        (&self.data, self.shape.pointers_at(base))
    }
}

/// The matrix the uploaded bytes hold, and where its arrays are: what the ops need to read them.
#[derive(Debug, Clone, Copy)]
struct WeightShape {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    sections: Sections,
}

impl WeightShape {
    /// The host matrix back from its bytes (the CPU references).
    fn host(&self, data: &CpuStorage, layout: &Layout) -> Result<QuantizedWeight> {
        let bytes = data.as_slice::<u8>()?;
        let start = layout.start_offset();
        let s = self.sections;
        let bytes = bytes.get(start..start + s.end).ok_or_else(|| invalid(OP, "weight bytes are short"))?;
        let words =
            |from: usize, to: usize| bytes[from..to].chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
        let blocks = self.rows * self.cols / QUANT_BLOCK;
        let f = self.format;
        QuantizedWeight::from_arrays(
            f,
            self.rows,
            self.cols,
            bytes[s.codes..s.codes + blocks * f.code_bytes()].to_vec(),
            words(s.high, s.high + 4 * blocks * f.high_planes()).map(u32::from_le_bytes).collect(),
            words(s.scales, s.scales + 4 * blocks * f.scales_per_block()).map(f32::from_le_bytes).collect(),
            words(s.mins, s.mins + if f.has_mins() { 4 * blocks } else { 0 })
                .map(f32::from_le_bytes)
                .collect(),
        )
    }
}

struct QuantMatmulOp {
    weight: WeightShape,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    launch: Option<QuantLaunch>,
}

fn reference<T: Float>(x: &CpuStorage, x_l: &Layout, w: &QuantizedWeight) -> Result<CpuStorage> {
    let xr = check::rows(x_l, 1, OP)?;
    let xs = x.as_slice::<T>()?;
    if xr.end() > xs.len() {
        return Err(invalid(OP, "x's view does not match its storage"));
    }
    let mut row = vec![0f32; w.cols()];
    let mut out = vec![0f32; xr.rows * w.rows()];
    for n in 0..w.rows() {
        w.dequantize_row(n, &mut row);
        row.iter_mut().for_each(|v| *v = T::from_f32(*v).to_f32());
        for m in 0..xr.rows {
            out[m * w.rows() + n] = xs[xr.range(m)].iter().zip(&row).map(|(a, b)| a.to_f32() * b).sum();
        }
    }
    Ok(T::to_cpu_storage_owned(out.into_iter().map(T::from_f32).collect()))
}

impl CustomOp2 for QuantMatmulOp {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_l: &Layout,
        w: &CpuStorage,
        w_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let host = self.weight.host(w, w_l)?;
        let out = with_float!(x.dtype(), OP, T => reference::<T>(x, x_l, &host))?;
        Ok((out, Shape::from((x_l.dims()[0], self.weight.rows))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        x_l: &Layout,
        w: &candle_core::CudaStorage,
        w_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::quant_ops::quant_matmul(
            self.launch,
            &|base| self.weight.pointers_at(base),
            x,
            x_l,
            w,
            w_l,
        )
    }
}

struct DequantizeOp {
    weight: WeightShape,
    dtype: DType,
}

impl CustomOp1 for DequantizeOp {
    fn name(&self) -> &'static str {
        "quant_dequantize"
    }

    fn cpu_fwd(&self, w: &CpuStorage, w_l: &Layout) -> Result<(CpuStorage, Shape)> {
        let values = self.weight.host(w, w_l)?.dequantize();
        dense_storage(values, self.weight.rows, self.weight.cols, self.dtype, "quant_dequantize")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        w: &candle_core::CudaStorage,
        w_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::quant_ops::quant_dequantize(&|base| self.weight.pointers_at(base), self.dtype, w, w_l)
    }
}

/// Row-major f32 `values` of a `[rows, cols]` matrix as host storage of `dtype`, each rounded
/// once: what the CPU references of the dequantizations return.
pub(crate) fn dense_storage(
    values: Vec<f32>,
    rows: usize,
    cols: usize,
    dtype: DType,
    op: &'static str,
) -> Result<(CpuStorage, Shape)> {
    let shape = Shape::from((rows, cols));
    let t = Tensor::from_vec(values, shape.clone(), &Device::Cpu)?.to_dtype(dtype)?;
    let (storage, _) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(s) => Ok((s.clone(), shape)),
        _ => Err(invalid(op, "expected host storage")),
    }
}

impl WeightShape {
    /// The arrays' addresses for a weight whose bytes start at device address `base` (0 for the
    /// arrays the format has none of).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn pointers_at(&self, base: u64) -> crate::cuda::quant::QuantPointers {
        let s = self.sections;
        let f = self.format;
        let at = |offset: usize, present: bool| if present { base + offset as u64 } else { 0 };
        crate::cuda::quant::QuantPointers {
            format: f,
            codes: base + s.codes as u64,
            high: at(s.high, f.high_planes() > 0),
            scales: base + s.scales as u64,
            mins: at(s.mins, f.has_mins()),
            rows: self.rows,
            blocks_per_row: self.cols / QUANT_BLOCK,
        }
    }
}

#[cfg(test)]
#[path = "device_quant_tests.rs"]
mod tests;
