//! Input embeddings that take the place of placeholder tokens: a vision-language model's prompt
//! holds one placeholder token (`<image>`) per image feature row, and the decoder sees the
//! vision encoder's features at those rows instead of the placeholder's own embedding.
//!
//! [`PlaceholderEmbeds`] addresses rows of one forward pass (the flattened token rows of a
//! step), so a prefill chunk that covers only part of an image carries just the feature rows of
//! the placeholders inside it.

use candle_core::Tensor;

use crate::error::{ModelError, Result};

/// Feature rows to put at given token rows of a step.
#[derive(Debug, Clone)]
pub struct PlaceholderEmbeds {
    /// Token rows of the step, ascending.
    rows: Vec<u32>,
    /// `[rows.len(), hidden]`.
    values: Tensor,
}

impl PlaceholderEmbeds {
    /// `values` `[rows.len(), hidden]` replace the embeddings of the step's token `rows`
    /// (ascending, distinct).
    pub fn new(rows: Vec<u32>, values: Tensor) -> Result<Self> {
        let (n, _) = values.dims2()?;
        if n != rows.len() {
            return Err(ModelError::ImageInput(format!(
                "{n} feature rows for {} placeholder rows",
                rows.len()
            )));
        }
        if rows.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ModelError::ImageInput("placeholder rows are not ascending and distinct".into()));
        }
        Ok(Self { rows, values })
    }

    /// Every `placeholder` token of `input_ids`, in order, takes the next row of `features`
    /// `[n, hidden]` (all images of the prompt, concatenated in prompt order); the counts must
    /// agree.
    pub fn for_placeholders(input_ids: &[u32], placeholder: u32, features: &Tensor) -> Result<Self> {
        let all = Self::for_chunk(input_ids, 0..input_ids.len(), placeholder, features)?;
        Ok(all.unwrap_or(Self { rows: Vec::new(), values: features.clone() }))
    }

    /// The part of [`Self::for_placeholders`] that a prefill chunk `chunk` of `prompt_ids`
    /// needs, its rows counted from the chunk's first token; `None` when the chunk holds no
    /// placeholder. The chunk's placeholders are consecutive in prompt order, so their
    /// features are one contiguous range of `features`.
    pub fn for_chunk(
        prompt_ids: &[u32],
        chunk: std::ops::Range<usize>,
        placeholder: u32,
        features: &Tensor,
    ) -> Result<Option<Self>> {
        let (n, _) = features.dims2()?;
        let total = prompt_ids.iter().filter(|&&t| t == placeholder).count();
        if n != total {
            return Err(ModelError::ImageInput(format!(
                "the prompt holds {total} image placeholder tokens but the images give {n} feature rows"
            )));
        }
        let Some(ids) = prompt_ids.get(chunk.clone()) else {
            return Err(ModelError::ImageInput(format!(
                "chunk {chunk:?} outside a prompt of {}",
                prompt_ids.len()
            )));
        };
        let before = prompt_ids[..chunk.start].iter().filter(|&&t| t == placeholder).count();
        let rows: Vec<u32> =
            ids.iter().enumerate().filter(|&(_, &t)| t == placeholder).map(|(i, _)| i as u32).collect();
        if rows.is_empty() {
            return Ok(None);
        }
        let values = features.narrow(0, before, rows.len())?;
        Self::new(rows, values).map(Some)
    }

    pub fn rows(&self) -> &[u32] {
        &self.rows
    }

    pub fn values(&self) -> &Tensor {
        &self.values
    }

    /// `embeds` `[tokens, hidden]` with the placeholder rows replaced (copied, not added: the
    /// result is exactly the features there).
    pub fn merge(&self, embeds: &Tensor) -> Result<Tensor> {
        let (tokens, hidden) = embeds.dims2()?;
        let (_, width) = self.values.dims2()?;
        if width != hidden {
            return Err(ModelError::ImageInput(format!(
                "features of width {width} for embeddings of {hidden}"
            )));
        }
        if let Some(&bad) = self.rows.iter().find(|&&r| r as usize >= tokens) {
            return Err(ModelError::ImageInput(format!(
                "placeholder row {bad} outside a step of {tokens} tokens"
            )));
        }
        // Row i of [embeds; values] is token i, row tokens + j is feature j: gather each
        // token's source row.
        let mut index: Vec<u32> = (0..tokens as u32).collect();
        for (j, &r) in self.rows.iter().enumerate() {
            index[r as usize] = (tokens + j) as u32;
        }
        let index = Tensor::from_vec(index, tokens, embeds.device())?;
        let values = self.values.to_dtype(embeds.dtype())?.to_device(embeds.device())?;
        Ok(Tensor::cat(&[embeds, &values], 0)?.index_select(&index, 0)?)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn placeholders_take_feature_rows_in_order_and_counts_must_agree() {
        let dev = Device::Cpu;
        let embeds = Tensor::arange(0f32, 10.0, &dev).unwrap().reshape((5, 2)).unwrap();
        let features = Tensor::new(&[[-1f32, -2.0], [-3.0, -4.0]], &dev).unwrap();
        let p = PlaceholderEmbeds::for_placeholders(&[7, 9, 3, 9, 1], 9, &features).unwrap();
        assert_eq!(p.rows(), &[1, 3]);
        let merged = p.merge(&embeds).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(merged, vec![vec![0., 1.], vec![-1., -2.], vec![4., 5.], vec![-3., -4.], vec![8., 9.]]);

        // A chunk covering the second placeholder only takes the second feature row.
        let chunk = PlaceholderEmbeds::for_chunk(&[7, 9, 3, 9, 1], 2..5, 9, &features).unwrap().unwrap();
        assert_eq!(chunk.rows(), &[1]);
        assert_eq!(chunk.values().to_vec2::<f32>().unwrap(), vec![vec![-3f32, -4.0]]);
        assert!(PlaceholderEmbeds::for_chunk(&[7, 9, 3, 9, 1], 4..5, 9, &features).unwrap().is_none());
        assert!(PlaceholderEmbeds::for_chunk(&[7, 9, 3, 9, 1], 4..6, 9, &features).is_err());

        let err = PlaceholderEmbeds::for_placeholders(&[9, 1], 9, &features).unwrap_err();
        assert!(err.to_string().contains("1 image placeholder tokens but the images give 2"), "{err}");
        let outside = PlaceholderEmbeds::new(vec![1, 7], features.clone()).unwrap();
        assert!(outside.merge(&embeds).unwrap_err().to_string().contains("row 7 outside"));
        assert!(PlaceholderEmbeds::new(vec![3, 1], features.clone()).is_err());
        let narrow = Tensor::zeros((2, 3), candle_core::DType::F32, &dev).unwrap();
        assert!(PlaceholderEmbeds::new(vec![0, 1], narrow).unwrap().merge(&embeds).is_err());
    }
}
