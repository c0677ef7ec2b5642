//! The token embedding lookup, over a dense table or straight from GGUF blocks, and the loading
//! of the embedding table with the lm head (tied to it or not) that every architecture shares.
//!
//! A tied table in block form (SmolLM2's Q8_0 `token_embd`) is also the lm head, which keeps
//! the blocks plus a panel-packed copy for its matmuls. Looking tokens up in the blocks
//! (dequantizing just the rows a step needs, the same values) saves a third, row-major copy.

use std::sync::Arc;

use candle_core::{Device, Tensor};
use pagoda_ops::QuantizedWeight;
use rayon::prelude::*;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::linear::Linear;
use crate::weights::{load_linear, WeightSource};

/// The embedding table (`token_embd`) and the lm head (`output`, or the embedding table itself
/// when tied or when the file has no head), sharing one copy of a tied table.
pub(crate) fn load_embedding_and_head(
    source: &mut dyn WeightSource,
    c: &ModelConfig,
) -> Result<(Embedding, Linear)> {
    let h = c.hidden_size;
    let tied = c.tie_word_embeddings || !source.contains("output.weight");
    // A tied table in a format the block matmul reads serves as lm head (blocks for small
    // steps, panels for large ones) and as embedding (rows dequantized from the blocks).
    let tied_head = if tied && !source.keeps_quantized("token_embd.weight") {
        let plan = source.kernel_plan();
        let device = source.device().clone();
        source
            .blocks("token_embd.weight", c.vocab_size, h)?
            .map(|b| Linear::blocks_on(b, plan, &device))
            .transpose()?
    } else {
        None
    };
    let embedding = match tied_head.as_ref().and_then(Linear::blocks) {
        Some(blocks) => Embedding::Blocks(Arc::clone(blocks)),
        None => Embedding::Dense(source.dense("token_embd.weight", &[c.vocab_size, h])?),
    };
    let head = match tied_head {
        Some(head) => head,
        None if !tied => load_linear(source, "output.weight", c.vocab_size, h, None)?,
        // Tied, quantized: the lm head multiplies the quantized table directly.
        None if source.keeps_quantized("token_embd.weight") => {
            source.linear("token_embd.weight", c.vocab_size, h, None)?
        }
        // Tied, dense: share the embedding tensor rather than load a second copy.
        None => match &embedding {
            Embedding::Dense(table) => Linear::dense(table.clone(), None, source.kernel_plan())?,
            Embedding::Blocks(blocks) => Linear::packed((**blocks).clone(), source.kernel_plan()),
        },
    };
    Ok((embedding, head))
}

#[derive(Debug, Clone)]
pub enum Embedding {
    /// `[vocab, hidden]` on the model's device.
    Dense(Tensor),
    /// `vocab` rows of blocks, on the CPU.
    Blocks(Arc<QuantizedWeight>),
}

impl Embedding {
    /// `ids`: u32 `[tokens]` -> `[tokens, hidden]`. An id past the table is an error.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            Embedding::Dense(table) => Ok(table.index_select(ids, 0)?),
            Embedding::Blocks(w) => {
                let ids = ids.to_vec1::<u32>()?;
                if let Some(&bad) = ids.iter().find(|&&id| id as usize >= w.rows()) {
                    return Err(ModelError::InvalidOption(format!(
                        "token id {bad} is outside the vocabulary of {}",
                        w.rows()
                    )));
                }
                let cols = w.cols();
                let mut out = vec![0f32; ids.len() * cols];
                if cols > 0 {
                    out.par_chunks_mut(cols)
                        .zip(&ids)
                        .for_each(|(row, &id)| w.dequantize_row(id as usize, row));
                }
                Ok(Tensor::from_vec(out, (ids.len(), cols), &Device::Cpu)?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;
    use pagoda_ops::QuantFormat;

    use super::*;

    #[test]
    fn block_lookup_equals_dense_lookup_and_rejects_bad_ids() {
        let (rows, cols) = (10, 64);
        let mut bytes = Vec::new();
        for b in 0..rows * cols / 32 {
            bytes.extend(f16::from_f32(0.01 * (1 + b % 7) as f32).to_le_bytes());
            bytes.extend((0..32).map(|j| (b * 31 + j * 7) as u8));
        }
        let w = QuantizedWeight::from_gguf(QuantFormat::Q8_0, rows, cols, &bytes).unwrap();
        let table = Tensor::from_vec(w.dequantize(), (rows, cols), &Device::Cpu).unwrap();
        let ids = Tensor::new(&[3u32, 0, 9, 3], &Device::Cpu).unwrap();
        let from_blocks = Embedding::Blocks(Arc::new(w)).forward(&ids).unwrap();
        let from_table = Embedding::Dense(table).forward(&ids).unwrap();
        assert_eq!(from_blocks.to_vec2::<f32>().unwrap(), from_table.to_vec2::<f32>().unwrap());

        let blocks = Embedding::Blocks(Arc::new(
            QuantizedWeight::from_gguf(QuantFormat::Q8_0, rows, cols, &bytes).unwrap(),
        ));
        let bad = Tensor::new(&[10u32], &Device::Cpu).unwrap();
        assert!(blocks.forward(&bad).unwrap_err().to_string().contains("outside the vocabulary"));
    }
}
