//! Writes host values into an existing u32 tensor's memory, in place: the inputs a CUDA graph
//! replays are read from fixed device addresses, so each step's values go into the same
//! buffers instead of new tensors.

use candle_core::{CpuStorage, DType, InplaceOp1, Layout, Result, Tensor};

use crate::check::invalid;

const OP: &str = "write_u32_in_place";

struct WriteU32<'a>(&'a [u32]);

impl WriteU32<'_> {
    /// The element range of `layout` the values go to: the tensor must be contiguous and
    /// exactly as long as the values.
    fn range(&self, layout: &Layout) -> Result<std::ops::Range<usize>> {
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| invalid(OP, "the tensor written must be contiguous"))?;
        if end - start != self.0.len() {
            return Err(invalid(OP, format!("{} values for a tensor of {}", self.0.len(), end - start)));
        }
        Ok(start..end)
    }
}

impl InplaceOp1 for WriteU32<'_> {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
        let range = self.range(layout)?;
        match storage {
            CpuStorage::U32(values) => {
                values[range].copy_from_slice(self.0);
                Ok(())
            }
            _ => Err(invalid(OP, "the tensor written must hold u32")),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &mut candle_core::CudaStorage, layout: &Layout) -> Result<()> {
        use candle_core::cuda_backend::WrapErr;
        let range = self.range(layout)?;
        let stream = storage.device.cuda_stream();
        let slice = storage.as_cuda_slice_mut::<u32>()?;
        stream.memcpy_htod(self.0, &mut slice.slice_mut(range)).w()
    }
}

/// Copies `values` into `tensor` (u32, contiguous, as many elements) in place, in stream order
/// on a device: work already queued reads the old values, work queued after the new ones.
pub fn write_u32_in_place(tensor: &Tensor, values: &[u32]) -> Result<()> {
    crate::check::dtype_is(tensor, DType::U32, OP)?;
    tensor.inplace_op1(&WriteU32(values))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn writes_in_place_and_refuses_other_lengths() {
        let t = Tensor::zeros((2, 3), DType::U32, &Device::Cpu).unwrap();
        let alias = t.clone();
        write_u32_in_place(&t, &[1, 2, 3, 4, 5, 6]).unwrap();
        assert_eq!(alias.to_vec2::<u32>().unwrap(), vec![vec![1, 2, 3], vec![4, 5, 6]]);
        let row = t.narrow(0, 1, 1).unwrap();
        write_u32_in_place(&row, &[7, 8, 9]).unwrap();
        assert_eq!(t.to_vec2::<u32>().unwrap()[1], vec![7, 8, 9]);
        assert!(write_u32_in_place(&t, &[1]).is_err());
        assert!(write_u32_in_place(&t.t().unwrap(), &[0; 6]).is_err());
        assert!(write_u32_in_place(&Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(), &[0; 3]).is_err());
    }
}
