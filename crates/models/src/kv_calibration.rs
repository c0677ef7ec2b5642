//! The per-tensor scales of an FP8 KV cache, calibrated once at start-up: the model prefills a
//! fixed text into a scratch cache of its own dtype, and each slot's K and V scales map the
//! largest magnitude written there to between a 32nd and a 16th of e4m3's 448.
//!
//! Why calibrate rather than take unit scales: e4m3's normal codes span 2^15 (2^-6 to 448),
//! and the codes Pagoda writes are never subnormal, so a magnitude below 2^-6 times the scale
//! is stored as 0 or 2^-6 times it, and one past 448 times the scale saturates. A unit scale
//! puts that window at 0.016..448 for every model; calibration puts it where each layer's K and
//! V are. The headroom (16x or more above what the text produced) is there because traffic can
//! hold larger values than the text did, and saturating is far worse than rounding a value
//! below a 1,800th of the largest to zero.
//!
//! Scales are powers of two: dividing by one and multiplying back are exact, and the text's
//! largest magnitude may move a little between devices without moving the scales.

use std::sync::Arc;

use candle_core::DType;
use pagoda_engine::{BlockTableUpdate, SampleRequest, ScheduledBatch, ScheduledSeq};
use pagoda_ops::{KvScales, FP8_E4M3_MAX};

use crate::{KvCache, ModelError, ModelRunner, Result};

/// Calibrated scales put the largest magnitude seen at or below this share of 448.
const HEADROOM: f32 = 16.0;

/// The smallest power of two `s` with `amax / s <= 448 / HEADROOM` (1 for zero).
pub fn power_of_two_scale(amax: f32) -> f32 {
    if !(amax.is_finite() && amax > 0.0) {
        return 1.0;
    }
    let exact = amax * HEADROOM / FP8_E4M3_MAX;
    let pow = exact.log2().ceil();
    // The log may land a hair low for an exact power; step once if so.
    let s = 2f32.powi(pow as i32);
    if amax / s > FP8_E4M3_MAX / HEADROOM {
        s * 2.0
    } else {
        s
    }
}

/// Runs `tokens` as one prefill on `runner` over a scratch cache (of the model's dtype, with
/// `block_size` pages) and returns each slot's scales for an FP8 cache. `runner` is left with
/// a one-page cache of `cache_dtype` for the caller to replace.
pub fn calibrate_kv_scales(
    runner: &mut ModelRunner,
    tokens: &[u32],
    block_size: usize,
    cache_dtype: DType,
) -> Result<Vec<KvScales>> {
    if tokens.is_empty() {
        return Err(ModelError::InvalidOption("no tokens to calibrate the KV cache's scales on".into()));
    }
    let config = runner.model().config().clone();
    let device = runner.device().clone();
    let scratch_dtype = runner.model().dtype();
    let pages = tokens.len().div_ceil(block_size);
    let groups = crate::KvLayout::for_config(&config).num_groups().max(1);
    // Each KV group gets pages of its own, so slot `s`'s tensors hold exactly what its layers
    // wrote.
    let tables: Vec<Vec<u32>> =
        (0..groups).map(|g| ((g * pages) as u32..((g + 1) * pages) as u32).collect()).collect();
    runner.replace_cache(KvCache::new(&config, groups * pages, block_size, scratch_dtype, &device)?);
    let batch = ScheduledBatch {
        seqs: vec![ScheduledSeq {
            sample: Some(SampleRequest { params: Arc::default(), ..SampleRequest::greedy() }),
            ..ScheduledSeq::chunk(0, tokens.to_vec(), 0, BlockTableUpdate::replace(tables))
        }],
        ..ScheduledBatch::default()
    };
    runner.logits(&batch)?;
    let cache = runner.cache();
    let largest = |t: &candle_core::Tensor| -> Result<f32> {
        Ok(t.abs()?.flatten_all()?.max(0)?.to_dtype(DType::F32)?.to_scalar::<f32>()?)
    };
    let scales = (0..cache.num_slots())
        .map(|slot| {
            let (k, v) = cache.slot(slot);
            Ok(KvScales { k: power_of_two_scale(largest(k)?), v: power_of_two_scale(largest(v)?) })
        })
        .collect::<Result<Vec<_>>>()?;
    drop(runner.replace_cache(KvCache::new(&config, 1, block_size, cache_dtype, &device)?));
    Ok(scales)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_are_the_smallest_powers_of_two_with_the_headroom() {
        for (amax, want) in [(28.0, 1.0), (28.5, 2.0), (1.0, 1.0 / 16.0), (0.9, 1.0 / 16.0), (3000.0, 128.0)]
        {
            let s = power_of_two_scale(amax);
            assert_eq!(s, want, "{amax}");
            assert!(amax / s <= 28.0 && amax / s > 14.0, "{amax}: {s}");
        }
        assert_eq!(power_of_two_scale(0.0), 1.0);
        assert_eq!(power_of_two_scale(f32::NAN), 1.0);
    }
}
