//! A step's image features: for each scheduled sequence whose tokens include placeholders of
//! its images ([`ScheduledBatch::images`]), the whole image's encoder features (from the
//! [`EncoderCache`], or encoded now), of which the rows of this step's placeholders go to the
//! model as [`PlaceholderEmbeds`] at the step's flattened token rows. A prefill chunk that cuts
//! an image takes just its part; the next chunk finds the features cached.

use candle_core::{Device, Tensor};
use pagoda_engine::{ExecutorError, ScheduledBatch};

use crate::encoder_cache::EncoderCache;
use crate::model::Model;
use crate::multimodal::PlaceholderEmbeds;

/// The placeholder rows of `batch` (rows counted over the whole step, sequences in batch
/// order) and their features; `None` when the step covers no image placeholder. A sequence
/// whose images do not fit what the model makes of them (pixels of the wrong shape, a
/// different number of features than placeholders, a placeholder position not holding the
/// model's image token) is an [`ExecutorError::InvalidSequence`], failing its request alone.
pub(crate) fn step_placeholders(
    batch: &ScheduledBatch,
    model: &Model,
    cache: &mut EncoderCache,
    device: &Device,
) -> Result<Option<PlaceholderEmbeds>, ExecutorError> {
    if batch.images.is_empty() {
        return Ok(None);
    }
    let Some(image_token) = model.image_token_id() else {
        return Err(ExecutorError::InvalidBatch("images sent to a model without a vision encoder".into()));
    };
    let (mut rows, mut values) = (Vec::new(), Vec::new());
    let mut offset = 0usize;
    for seq in &batch.seqs {
        let first_row = offset;
        offset += seq.q_len();
        let Some(images) = batch.images_of(seq.seq_id) else { continue };
        let invalid = |message: String| ExecutorError::InvalidSequence { seq_id: seq.seq_id, message };
        let chunk = seq.start_pos..seq.context_len();
        for (index, image) in images.iter().enumerate() {
            let Some(wanted) = image.features_in(chunk.clone()) else { continue };
            let features = cache
                .get_or_encode(image.hash, || {
                    let pixels = &image.pixels;
                    let tensor = Tensor::from_slice(&pixels.data, pixels.shape.as_slice(), device)?;
                    model.image_features(&tensor.to_dtype(model.dtype())?)
                })
                .map_err(|e| invalid(format!("image {index}: {e}")))?;
            let made = features.dim(0).map_err(|e| invalid(e.to_string()))?;
            if made != image.num_features() {
                return Err(invalid(format!(
                    "image {index} makes {made} feature rows but has {} placeholder tokens",
                    image.num_features()
                )));
            }
            for &position in &image.placeholder_positions[wanted.clone()] {
                let in_chunk = position as usize - seq.start_pos;
                if seq.token_ids.get(in_chunk) != Some(&image_token) {
                    return Err(invalid(format!(
                        "image {index}: prompt position {position} is not an image placeholder token"
                    )));
                }
                rows.push((first_row + in_chunk) as u32);
            }
            let part = features.narrow(0, wanted.start, wanted.len()).map_err(|e| invalid(e.to_string()))?;
            values.push(part);
        }
    }
    if rows.is_empty() {
        return Ok(None);
    }
    let failed = |e: crate::ModelError| ExecutorError::Execution(e.to_string());
    let values = Tensor::cat(&values, 0).map_err(|e| failed(e.into()))?;
    PlaceholderEmbeds::new(rows, values).map(Some).map_err(failed)
}
