//! Weights from a GGUF file (llama.cpp's format), read with candle's GGUF reader, or from a
//! split GGUF (`name-00001-of-00003.gguf` and its siblings, as `gguf-split` writes them: every
//! part a GGUF of its own, the first holding all metadata).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Tensor};
use pagoda_ops::{QuantFormat, QuantizedWeight};

use super::{check_shape, WeightSource};
use crate::error::{ModelError, Result};
use crate::kernel_plan::KernelPlan;
use crate::linear::{Linear, LinearWeight};
use crate::linear_fp8::WeightQuantization;

/// One file of the model.
struct Part {
    path: PathBuf,
    reader: BufReader<File>,
    content: gguf_file::Content,
}

pub struct GgufWeights {
    path: PathBuf,
    /// The first part holds the metadata; every tensor lives in exactly one part.
    parts: Vec<Part>,
    /// Which part holds each tensor.
    part_of: HashMap<String, usize>,
    device: Device,
    dtype: DType,
    /// Dequantize every projection to `dtype` instead of keeping quantized blocks.
    dequantize: bool,
    /// Which kernels multiply packed and dense weights on the CPU.
    kernel_plan: KernelPlan,
    /// How dense layer projections are stored (`--quantization`).
    quantization: Option<WeightQuantization>,
}

impl GgufWeights {
    /// Opens the file (and, for a split GGUF, its sibling parts), reads the metadata and tensor
    /// index, and checks that every tensor's bytes are present (a truncated download fails here,
    /// naming the file).
    pub fn open(path: &Path, device: &Device, dtype: DType, dequantize: bool) -> Result<Self> {
        let first = open_part(path)?;
        let mut parts = vec![first];
        for sibling in split_siblings(path, &parts[0].content)? {
            parts.push(open_part(&sibling)?);
        }
        let mut part_of = HashMap::new();
        for (index, part) in parts.iter().enumerate() {
            for name in part.content.tensor_infos.keys() {
                if part_of.insert(name.clone(), index).is_some() {
                    return Err(ModelError::Gguf {
                        path: part.path.clone(),
                        message: format!("tensor `{name}` appears in more than one part"),
                    });
                }
            }
        }
        let expected = parts[0].content.metadata.get("split.tensors.count").and_then(|v| v.to_i32().ok());
        if let Some(expected) = expected.filter(|&n| n as usize != part_of.len()) {
            return Err(ModelError::Gguf {
                path: path.to_path_buf(),
                message: format!("the split parts hold {} tensors, expected {expected}", part_of.len()),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            parts,
            part_of,
            device: device.clone(),
            dtype,
            dequantize,
            kernel_plan: KernelPlan::default(),
            quantization: None,
        })
    }

    /// Elements in all tensors (what dequantizing would cost, per byte of dtype).
    pub fn num_elements(&self) -> u64 {
        let infos = self.parts.iter().flat_map(|p| p.content.tensor_infos.values());
        infos.map(|i| i.shape.elem_count() as u64).sum()
    }

    pub fn set_dequantize(&mut self, dequantize: bool) {
        self.dequantize = dequantize;
    }

    pub fn set_kernel_plan(&mut self, plan: KernelPlan) {
        self.kernel_plan = plan;
    }

    pub fn set_quantization(&mut self, quantization: Option<WeightQuantization>) {
        self.quantization = quantization;
    }

    /// The blocks of the first layer's MLP up projection (else its gate, else its query), as
    /// packed for the CPU: one of the model's own weights to time kernels on. `None` when none
    /// of them is packed.
    pub fn sample_projection(&mut self) -> Option<QuantizedWeight> {
        for name in ["blk.0.ffn_up.weight", "blk.0.ffn_gate.weight", "blk.0.attn_q.weight"] {
            let Some(&[rows, cols]) = self.info(name).map(|i| i.shape.dims()) else { continue };
            if let Ok(Some(blocks)) = self.blocks(name, rows, cols) {
                return Some(blocks);
            }
        }
        None
    }

    /// The names of the tensors in all parts.
    pub fn tensor_names(&self) -> impl Iterator<Item = &String> {
        self.part_of.keys()
    }

    pub fn metadata(&self) -> &HashMap<String, gguf_file::Value> {
        &self.parts[0].content.metadata
    }

    /// How many files the model is split over.
    pub fn num_parts(&self) -> usize {
        self.parts.len()
    }

    fn info(&self, name: &str) -> Option<&gguf_file::TensorInfo> {
        self.parts[*self.part_of.get(name)?].content.tensor_infos.get(name)
    }

    /// The block format `name` is kept in when our kernels read it: on the CPU when this source
    /// dequantizes to f32 ([`pagoda_ops::quant_matmul`]'s only case), on CUDA when it does not
    /// dequantize ([`pagoda_ops::DeviceQuantWeight`]).
    fn packed_format(&self, name: &str) -> Option<QuantFormat> {
        let ours = match &self.device {
            Device::Cpu => self.dequantize && self.dtype == DType::F32,
            Device::Cuda(_) => !self.dequantize,
            _ => false,
        };
        if !ours {
            return None;
        }
        match self.info(name)?.ggml_dtype {
            GgmlDType::Q4_0 => Some(QuantFormat::Q4_0),
            GgmlDType::Q4_1 => Some(QuantFormat::Q4_1),
            GgmlDType::Q5_0 => Some(QuantFormat::Q5_0),
            GgmlDType::Q8_0 => Some(QuantFormat::Q8_0),
            GgmlDType::Q4K => Some(QuantFormat::Q4K),
            GgmlDType::Q5K => Some(QuantFormat::Q5K),
            GgmlDType::Q6K => Some(QuantFormat::Q6K),
            _ => None,
        }
    }

    /// `rows` rows of `cols` elements of `format` from the GGUF bytes of tensor `name`.
    fn parse_blocks(
        &self,
        name: &str,
        format: QuantFormat,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<QuantizedWeight> {
        QuantizedWeight::from_gguf(format, rows, cols, bytes).map_err(|e| ModelError::Gguf {
            path: self.path.clone(),
            message: format!("tensor `{name}`: {e}"),
        })
    }

    fn qtensor(&mut self, name: &str) -> Result<QTensor> {
        let Some(&index) = self.part_of.get(name) else {
            return Err(ModelError::MissingTensor { path: self.path.clone(), tensor: name.to_string() });
        };
        let part = &mut self.parts[index];
        part.content.tensor(&mut part.reader, name, &self.device).map_err(|e| ModelError::Gguf {
            path: part.path.clone(),
            message: format!("tensor `{name}`: {e}"),
        })
    }
}

/// Reads one file's metadata and tensor index and checks that its tensors' bytes are all there.
fn open_part(path: &Path) -> Result<Part> {
    let gguf_err = |message: String| ModelError::Gguf { path: path.to_path_buf(), message };
    let file = File::open(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
    let mut reader = BufReader::new(file);
    // Ours first: candle's reader trusts the alignment and the tensor dimensions.
    crate::gguf_check::check_gguf(&mut reader).map_err(|e| gguf_err(e.to_string()))?;
    let content = gguf_file::Content::read(&mut reader).map_err(|e| gguf_err(e.to_string()))?;
    let file_len = reader
        .seek(SeekFrom::End(0))
        .map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
    for (name, info) in &content.tensor_infos {
        let bytes = info.shape.elem_count() / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
        let end = content.tensor_data_offset + info.offset + bytes as u64;
        if end > file_len {
            return Err(gguf_err(format!(
                "truncated: tensor `{name}` ends at byte {end} but the file has {file_len} bytes"
            )));
        }
    }
    Ok(Part { path: path.to_path_buf(), reader, content })
}

/// The other parts of a split GGUF whose first part is `path` (none for a whole file). Parts are
/// named `<prefix>-<i>-of-<n>.gguf` with five-digit numbers, as llama.cpp names them.
fn split_siblings(path: &Path, first: &gguf_file::Content) -> Result<Vec<PathBuf>> {
    let err = |message: String| ModelError::Gguf { path: path.to_path_buf(), message };
    let number = |key: &str| -> Option<u64> {
        let v = first.metadata.get(key)?;
        v.to_u16()
            .map(u64::from)
            .or_else(|_| v.to_u32().map(u64::from))
            .or_else(|_| v.to_i32().map(|n| n.max(0) as u64))
            .or_else(|_| v.to_u64())
            .ok()
    };
    let count = number("split.count").unwrap_or(1);
    if count <= 1 {
        return Ok(Vec::new());
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let suffix = format!("-00001-of-{count:05}.gguf");
    if number("split.no").unwrap_or(0) != 0 || !name.ends_with(&suffix) {
        return Err(err(format!(
            "part of a model split in {count} files: pass the first part, named `<name>{suffix}`"
        )));
    }
    let prefix = &name[..name.len() - suffix.len()];
    let siblings: Vec<PathBuf> =
        (2..=count).map(|i| path.with_file_name(format!("{prefix}-{i:05}-of-{count:05}.gguf"))).collect();
    if let Some(missing) = siblings.iter().find(|p| !p.exists()) {
        return Err(err(format!("split part {} is missing", missing.display())));
    }
    Ok(siblings)
}

/// Quantized types candle can multiply on every backend; anything else is dequantized.
fn matmul_supported(dtype: GgmlDType) -> bool {
    !matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
}

impl WeightSource for GgufWeights {
    fn path(&self) -> &Path {
        &self.path
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn contains(&self, name: &str) -> bool {
        self.part_of.contains_key(name)
    }

    fn kernel_plan(&self) -> KernelPlan {
        self.kernel_plan
    }

    fn quantization(&self) -> Option<WeightQuantization> {
        self.quantization
    }

    fn keeps_quantized(&self, name: &str) -> bool {
        !self.dequantize && self.info(name).is_some_and(|i| matmul_supported(i.ggml_dtype))
    }

    fn dense(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let q = self.qtensor(name)?;
        check_shape(&self.path, name, shape, q.shape().dims())?;
        Ok(q.dequantize(&self.device)?.to_dtype(self.dtype)?)
    }

    fn blocks(&mut self, name: &str, rows: usize, cols: usize) -> Result<Option<QuantizedWeight>> {
        let Some(format) = self.packed_format(name) else { return Ok(None) };
        let q = self.qtensor(name)?;
        check_shape(&self.path, name, &[rows, cols], q.shape().dims())?;
        Ok(Some(self.parse_blocks(name, format, rows, cols, &q.data()?)?))
    }

    fn experts(&mut self, name: &str, num_experts: usize, rows: usize, cols: usize) -> Result<Vec<Linear>> {
        let q = self.qtensor(name)?;
        check_shape(&self.path, name, &[num_experts, rows, cols], q.shape().dims())?;
        if let Some(format) = self.packed_format(name) {
            // Each expert's blocks are a contiguous run of the stacked tensor's bytes.
            let data = q.data()?;
            let per_expert = data.len() / num_experts;
            return data
                .chunks_exact(per_expert)
                .map(|bytes| {
                    let blocks = self.parse_blocks(name, format, rows, cols, bytes)?;
                    Linear::blocks_on(blocks, self.kernel_plan, &self.device)
                })
                .collect();
        }
        // Otherwise every expert is dequantized (candle's quantized matmul has no per-expert view).
        let dense = q.dequantize(&self.device)?.to_dtype(self.dtype)?;
        (0..num_experts).map(|e| Linear::dense(dense.get(e)?.contiguous()?, None, self.kernel_plan)).collect()
    }

    fn linear(&mut self, name: &str, out_dim: usize, in_dim: usize, bias: Option<&str>) -> Result<Linear> {
        let q = self.qtensor(name)?;
        check_shape(&self.path, name, &[out_dim, in_dim], q.shape().dims())?;
        let bias = match bias {
            Some(b) if self.contains(b) => Some(self.dense(b, &[out_dim])?),
            _ => None,
        };
        if !self.keeps_quantized(name) {
            return Linear::dense(q.dequantize(&self.device)?.to_dtype(self.dtype)?, bias, self.kernel_plan);
        }
        // Kept quantized and in a format ours read: only on CUDA (the CPU keeps ours when it
        // dequantizes, returned above).
        if let Some(format) = self.packed_format(name) {
            let blocks = self.parse_blocks(name, format, out_dim, in_dim, &q.data()?)?;
            let weight = Linear::blocks_on(blocks, self.kernel_plan, &self.device)?;
            return Ok(weight.with_bias(bias));
        }
        Ok(Linear::new(LinearWeight::Quantized(QMatMul::from_arc(Arc::new(q))?), bias))
    }
}
