//! Weights from a GGUF file (llama.cpp's format), read with candle's GGUF reader.

use std::fs::File;
use std::io::{BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{gguf_file, GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Tensor};
use pagoda_ops::{PanelPrecision, QuantFormat, QuantizedWeight};

use super::{check_shape, WeightSource};
use crate::error::{ModelError, Result};
use crate::linear::{Linear, LinearWeight};

pub struct GgufWeights {
    path: PathBuf,
    reader: BufReader<File>,
    content: gguf_file::Content,
    device: Device,
    dtype: DType,
    /// Dequantize every projection to `dtype` instead of keeping quantized blocks.
    dequantize: bool,
    /// What packed weights' dense copies are stored in.
    panel_precision: PanelPrecision,
}

impl GgufWeights {
    /// Opens the file, reads its metadata and tensor index, and checks that every tensor's bytes
    /// are present (a truncated download fails here, naming the file).
    pub fn open(path: &Path, device: &Device, dtype: DType, dequantize: bool) -> Result<Self> {
        let gguf_err = |message: String| ModelError::Gguf { path: path.to_path_buf(), message };
        let file = File::open(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        let mut reader = BufReader::new(file);
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
        Ok(Self {
            path: path.to_path_buf(),
            reader,
            content,
            device: device.clone(),
            dtype,
            dequantize,
            panel_precision: PanelPrecision::F32,
        })
    }

    /// Elements in all tensors (what dequantizing would cost, per byte of dtype).
    pub fn num_elements(&self) -> u64 {
        self.content.tensor_infos.values().map(|i| i.shape.elem_count() as u64).sum()
    }

    pub fn set_dequantize(&mut self, dequantize: bool) {
        self.dequantize = dequantize;
    }

    pub fn set_panel_precision(&mut self, precision: PanelPrecision) {
        self.panel_precision = precision;
    }

    pub fn metadata(&self) -> &std::collections::HashMap<String, gguf_file::Value> {
        &self.content.metadata
    }

    /// The block format of `name` for [`pagoda_ops::quant_matmul`], when this source dequantizes
    /// to f32 on the CPU (the op's only case) and the tensor is in a format the op reads.
    fn packed_format(&self, name: &str) -> Option<QuantFormat> {
        if !self.dequantize || !self.device.is_cpu() || self.dtype != DType::F32 {
            return None;
        }
        match self.content.tensor_infos.get(name)?.ggml_dtype {
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

    fn qtensor(&mut self, name: &str) -> Result<QTensor> {
        if !self.content.tensor_infos.contains_key(name) {
            return Err(ModelError::MissingTensor { path: self.path.clone(), tensor: name.to_string() });
        }
        self.content.tensor(&mut self.reader, name, &self.device).map_err(|e| ModelError::Gguf {
            path: self.path.clone(),
            message: format!("tensor `{name}`: {e}"),
        })
    }
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
        self.content.tensor_infos.contains_key(name)
    }

    fn panel_precision(&self) -> PanelPrecision {
        self.panel_precision
    }

    fn keeps_quantized(&self, name: &str) -> bool {
        !self.dequantize
            && self.content.tensor_infos.get(name).is_some_and(|i| matmul_supported(i.ggml_dtype))
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
        let blocks = QuantizedWeight::from_gguf(format, rows, cols, &q.data()?).map_err(|e| {
            ModelError::Gguf { path: self.path.clone(), message: format!("tensor `{name}`: {e}") }
        })?;
        Ok(Some(blocks))
    }

    fn linear(&mut self, name: &str, out_dim: usize, in_dim: usize, bias: Option<&str>) -> Result<Linear> {
        let q = self.qtensor(name)?;
        check_shape(&self.path, name, &[out_dim, in_dim], q.shape().dims())?;
        let weight = if !self.keeps_quantized(name) {
            LinearWeight::Dense(q.dequantize(&self.device)?.to_dtype(self.dtype)?)
        } else {
            LinearWeight::Quantized(QMatMul::from_arc(Arc::new(q))?)
        };
        let bias = match bias {
            Some(b) if self.contains(b) => Some(self.dense(b, &[out_dim])?),
            _ => None,
        };
        Ok(Linear::new(weight, bias))
    }
}
