//! FP8 weights kept on a CUDA device: an [`Fp8Weight`]'s codes and row scales uploaded as they
//! are (kernels/fp8_matmul.cu reads them), multiplied by decode steps of up to
//! [`FP8_MATMUL_MAX_ROWS`] rows without ever being dense, and dequantized into a scratch copy for
//! the larger steps, which cuBLAS then multiplies. One byte per weight plus 4 per row.
//!
//! The kernel multiplies x by the codes' exact values and applies the row's scale to each sum;
//! the scratch copy holds `scale * value` rounded to the activations' dtype. On the CPU the ops
//! run their references (for tests): the same sums in f32, in order.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};

use super::device_quant::dense_storage;
use super::fp8_weight::Fp8Weight;
use crate::check::{self, invalid};
use crate::cuda::fp8::Fp8Pointers;
pub use crate::cuda::fp8::{FP8_KERNEL_K_STEP, FP8_KERNEL_MAX_ROWS};
use crate::dtype::{with_float, Float};
use crate::fp8_e4m3::fp8_e4m3_value;

const OP: &str = "fp8_matmul";

/// The most rows of x models give the kernel: one mma tile's columns (quant_matmul's rule).
pub const FP8_MATMUL_MAX_ROWS: usize = 8;

/// A `[rows, cols]` FP8 matrix on a device (or, for tests, the CPU).
#[derive(Debug, Clone)]
pub struct DeviceFp8Weight {
    shape: Fp8Shape,
    /// The codes, then the scales from `scales_at` on (a 16-byte boundary), as `u8`.
    data: Tensor,
}

#[derive(Debug, Clone, Copy)]
struct Fp8Shape {
    rows: usize,
    cols: usize,
    scales_at: usize,
}

impl Fp8Shape {
    /// A `[rows, cols]` weight's layout: the codes, then the scales at the next 16-byte
    /// boundary. The width must be a multiple of 16 (the dequantization's step).
    fn of(rows: usize, cols: usize) -> Result<Self> {
        if !cols.is_multiple_of(16) {
            return Err(invalid(OP, format!("an fp8 weight's width must be a multiple of 16, not {cols}")));
        }
        Ok(Self { rows, cols, scales_at: (rows * cols).next_multiple_of(16) })
    }

    /// `w`'s arrays as uploaded.
    fn bytes_of(&self, w: &Fp8Weight) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.end());
        bytes.extend_from_slice(w.codes());
        bytes.resize(self.scales_at, 0);
        bytes.extend(w.scales().iter().flat_map(|s| s.to_le_bytes()));
        bytes
    }

    fn end(&self) -> usize {
        self.scales_at + 4 * self.rows
    }

    /// The arrays' addresses for bytes that start at device address `base`.
    fn pointers_at(&self, base: u64) -> Fp8Pointers {
        Fp8Pointers { codes: base, scales: base + self.scales_at as u64, rows: self.rows, cols: self.cols }
    }

    /// The host matrix back from its bytes (the CPU references).
    fn host(&self, data: &CpuStorage, layout: &Layout) -> Result<Fp8Weight> {
        let bytes = data.as_slice::<u8>()?;
        let start = layout.start_offset();
        let bytes =
            bytes.get(start..start + self.end()).ok_or_else(|| invalid(OP, "weight bytes are short"))?;
        let codes = bytes[..self.rows * self.cols].to_vec();
        let scales = bytes[self.scales_at..self.end()]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Fp8Weight::from_arrays(self.rows, self.cols, codes, scales).map_err(|e| invalid(OP, e))
    }
}

impl DeviceFp8Weight {
    /// Uploads `w` to `device`. Its width must be a multiple of 16 (the dequantization's
    /// step); the kernel further needs a multiple of [`FP8_KERNEL_K_STEP`].
    pub fn new(w: &Fp8Weight, device: &Device) -> Result<Self> {
        let shape = Fp8Shape::of(w.rows(), w.cols())?;
        let data = Tensor::from_vec(shape.bytes_of(w), shape.end(), device)?;
        Ok(Self { shape, data })
    }

    /// A dense `[rows, cols]` weight (f32, f16 or bf16) quantized where it lives: on CUDA by a
    /// kernel (no copy through the host), on the CPU by [`Fp8Weight::quantize`]; the same codes
    /// and scales either way. A weight that is not finite gives meaningless codes on CUDA.
    pub fn quantize(dense: &Tensor) -> Result<Self> {
        let (rows, cols) = dense.dims2()?;
        let shape = Fp8Shape::of(rows, cols)?;
        let data = dense.contiguous()?.apply_op1_no_bwd(&Fp8QuantizeOp { weight: shape })?;
        Ok(Self { shape, data })
    }
    pub fn rows(&self) -> usize {
        self.shape.rows
    }

    pub fn cols(&self) -> usize {
        self.shape.cols
    }

    /// Bytes held on the device.
    pub fn size_in_bytes(&self) -> usize {
        self.shape.end()
    }

    /// Whether [`DeviceFp8Weight::forward`] multiplies `x` on the FP8 kernel: on CUDA, f16 or
    /// bf16 on the weight's device, 1 to [`FP8_MATMUL_MAX_ROWS`] rows of `cols` elements (a
    /// multiple of [`FP8_KERNEL_K_STEP`]), contiguous and starting on 16-byte boundaries.
    pub fn kernel_takes(&self, x: &Tensor) -> bool {
        if !x.device().is_cuda() || !x.device().same_device(self.data.device()) {
            return false;
        }
        let Ok((m, k)) = x.dims2() else { return false };
        matches!(x.dtype(), DType::BF16 | DType::F16)
            && (1..=FP8_MATMUL_MAX_ROWS).contains(&m)
            && k == self.cols()
            && k.is_multiple_of(FP8_KERNEL_K_STEP)
            && check::rows(x.layout(), 1, OP)
                .is_ok_and(|r| r.start.is_multiple_of(8) && (r.rows == 1 || r.row_stride.is_multiple_of(8)))
    }

    /// `x [M, cols] . w^T` as `[M, rows]` in x's dtype: the FP8 kernel for the inputs
    /// [`DeviceFp8Weight::kernel_takes`], else cuBLAS (or candle's CPU matmul) on a copy
    /// dequantized to x's dtype for this call.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.kernel_takes(x) {
            return self.matmul(x);
        }
        x.matmul(&self.dequantize(x.dtype())?.t()?)
    }

    /// `x [M, cols] . w^T` on the FP8 kernel (CUDA: f16/bf16, up to [`FP8_KERNEL_MAX_ROWS`]
    /// rows, of which models send [`FP8_MATMUL_MAX_ROWS`]; the CPU: the reference, any float
    /// dtype and M).
    pub fn matmul(&self, x: &Tensor) -> Result<Tensor> {
        let (_, k) = x.dims2()?;
        if k != self.cols() {
            return Err(invalid(OP, format!("x has {k} columns, the weight {}", self.cols())));
        }
        check::same_device(x, &self.data, OP)?;
        x.apply_op2_no_bwd(&self.data, &Fp8MatmulOp { weight: self.shape })
    }

    /// The weight as a dense `[rows, cols]` tensor of `dtype` (f32, f16 or bf16).
    pub fn dequantize(&self, dtype: DType) -> Result<Tensor> {
        self.data.apply_op1_no_bwd(&Fp8DequantizeOp { weight: self.shape, dtype })
    }

    /// The uploaded bytes and the arrays' addresses when they start at `base` (the simulator
    /// tests' host buffers).
    #[cfg_attr(not(all(test, feature = "kernel-sim")), allow(dead_code))]
    pub(crate) fn bytes_and_pointers(&self, base: u64) -> (&Tensor, Fp8Pointers) {
        (&self.data, self.shape.pointers_at(base))
    }
}

struct Fp8MatmulOp {
    weight: Fp8Shape,
}

/// `scale[n] * sum_k x[m][k] * value(code[n][k])`, the sums in f32 in order.
fn reference<T: Float>(x: &CpuStorage, x_l: &Layout, w: &Fp8Weight) -> Result<CpuStorage> {
    let xr = check::rows(x_l, 1, OP)?;
    let xs = x.as_slice::<T>()?;
    if xr.end() > xs.len() {
        return Err(invalid(OP, "x's view does not match its storage"));
    }
    let mut out = vec![0f32; xr.rows * w.rows()];
    for n in 0..w.rows() {
        let codes = &w.codes()[n * w.cols()..(n + 1) * w.cols()];
        let values: Vec<f32> = codes.iter().map(|&c| fp8_e4m3_value(c)).collect();
        for m in 0..xr.rows {
            let sum: f32 = xs[xr.range(m)].iter().zip(&values).map(|(a, b)| a.to_f32() * b).sum();
            out[m * w.rows() + n] = sum * w.scales()[n];
        }
    }
    Ok(T::to_cpu_storage_owned(out.into_iter().map(T::from_f32).collect()))
}

impl CustomOp2 for Fp8MatmulOp {
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
        crate::cuda::fp8_ops::fp8_matmul(&|base| self.weight.pointers_at(base), x, x_l, w, w_l)
    }
}

struct Fp8QuantizeOp {
    weight: Fp8Shape,
}

fn host_values<T: Float>(w: &CpuStorage, w_l: &Layout) -> Result<Vec<f32>> {
    let rows = check::rows(w_l, 1, "fp8_quantize")?;
    let all = w.as_slice::<T>()?;
    let values = all.get(rows.start..rows.end()).ok_or_else(|| invalid("fp8_quantize", "short storage"))?;
    Ok(values.iter().map(|v| v.to_f32()).collect())
}

impl CustomOp1 for Fp8QuantizeOp {
    fn name(&self) -> &'static str {
        "fp8_quantize"
    }

    fn cpu_fwd(&self, w: &CpuStorage, w_l: &Layout) -> Result<(CpuStorage, Shape)> {
        let values = with_float!(w.dtype(), "fp8_quantize", T => host_values::<T>(w, w_l))?;
        let host = Fp8Weight::quantize(self.weight.rows, self.weight.cols, &values)
            .map_err(|e| invalid("fp8_quantize", e))?;
        Ok((CpuStorage::U8(self.weight.bytes_of(&host)), Shape::from(self.weight.end())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        w: &candle_core::CudaStorage,
        w_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::fp8_ops::fp8_quantize(&|base| self.weight.pointers_at(base), self.weight.end(), w, w_l)
    }
}

struct Fp8DequantizeOp {
    weight: Fp8Shape,
    dtype: DType,
}

impl CustomOp1 for Fp8DequantizeOp {
    fn name(&self) -> &'static str {
        "fp8_dequantize"
    }

    fn cpu_fwd(&self, w: &CpuStorage, w_l: &Layout) -> Result<(CpuStorage, Shape)> {
        let values = self.weight.host(w, w_l)?.dequantize();
        dense_storage(values, self.weight.rows, self.weight.cols, self.dtype, "fp8_dequantize")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        w: &candle_core::CudaStorage,
        w_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::fp8_ops::fp8_dequantize(&|base| self.weight.pointers_at(base), self.dtype, w, w_l)
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn random(rng: &mut StdRng, rows: usize, cols: usize) -> Fp8Weight {
        let values: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-0.5f32..0.5)).collect();
        Fp8Weight::quantize(rows, cols, &values).unwrap()
    }

    #[test]
    fn uploaded_bytes_dequantize_to_the_host_values() {
        let mut rng = StdRng::seed_from_u64(11);
        let host = random(&mut rng, 9, 80);
        let w = DeviceFp8Weight::new(&host, &Device::Cpu).unwrap();
        assert_eq!((w.rows(), w.cols(), w.size_in_bytes()), (9, 80, 720 + 36));
        let dense: Vec<f32> = w.dequantize(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(dense, host.dequantize());
        let bf: Vec<f32> = w
            .dequantize(DType::BF16)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let rounded: Vec<f32> = host.dequantize().iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        assert_eq!(bf, rounded);
        assert!(DeviceFp8Weight::new(&random(&mut rng, 2, 24), &Device::Cpu).is_err());
        // Quantized from dense values where they live: the bytes of the host's quantization.
        let values = host.dequantize();
        let dense = Tensor::from_vec(values.clone(), (9, 80), &Device::Cpu).unwrap();
        let bytes = |w: &DeviceFp8Weight| w.data.to_vec1::<u8>().unwrap();
        let want = DeviceFp8Weight::new(&Fp8Weight::quantize(9, 80, &values).unwrap(), &Device::Cpu).unwrap();
        assert_eq!(bytes(&DeviceFp8Weight::quantize(&dense).unwrap()), bytes(&want));
    }

    #[test]
    fn matmul_and_forward_multiply_the_dequantized_weight() {
        let mut rng = StdRng::seed_from_u64(12);
        let (rows, cols) = (12, 128);
        let host = random(&mut rng, rows, cols);
        let w = DeviceFp8Weight::new(&host, &Device::Cpu).unwrap();
        let dense = Tensor::from_vec(host.dequantize(), (rows, cols), &Device::Cpu).unwrap();
        for m in [1, 8, 13] {
            let values: Vec<f32> = (0..m * cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let x = Tensor::from_vec(values, (m, cols), &Device::Cpu).unwrap();
            let want: Vec<f32> =
                x.matmul(&dense.t().unwrap()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            for got in [w.matmul(&x).unwrap(), w.forward(&x).unwrap()] {
                assert_eq!(got.dims(), &[m, rows]);
                let got: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
                let scale = want.iter().fold(1e-6f32, |a, v| a.max(v.abs()));
                let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0f32, f32::max);
                assert!(worst / scale < 1e-5, "m = {m}: {worst}");
            }
        }
        let x = Tensor::zeros((1, cols), DType::BF16, &Device::Cpu).unwrap();
        assert!(!w.kernel_takes(&x));
        assert!(w.matmul(&Tensor::zeros((1, cols + 16), DType::F32, &Device::Cpu).unwrap()).is_err());
    }
}
