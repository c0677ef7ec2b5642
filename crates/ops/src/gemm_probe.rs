//! Times the two panel kernels that can multiply a block-quantized weight in a large step, bfloat16
//! panels (`vdpbf16ps`) and the weight's codes times 16-bit activations (two `vpdpbusd` per four
//! codes, [`crate::int16_matmul`]), so that a caller can choose by measurement, not by CPU name.
//!
//! Why: both do 32 multiply-adds per instruction issued, so which one wins depends on how fast a
//! CPU issues each. On an AMD Zen 4 VM they tie at 32 rows and bfloat16 wins at 128 (fewer
//! instructions per block: benches/reports/2026-11-25-int16-small-steps-amd.md); on the Intel
//! Xeon VM `vdpbf16ps` reached 155 GFLOP/s against 495 Gop/s for `vpdpbusd`, so the int16 kernel
//! should win there, by about 1.3x (a prediction:
//! benches/reports/2026-11-26-large-step-kernel-timing-amd.md). The timing runs on one thread, on
//! the caller's own weight, each kernel several times in alternation, keeping each one's fastest
//! run: a busy neighbour slows both alike.

use std::time::Instant;

use crate::cpu_matmul::CpuWeight;
use crate::panel_matmul::{PanelPrecision, PanelWeight};
use crate::quant_weight::QuantizedWeight;

/// How long each kernel took for one large step of one weight, at its fastest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LargeStepTiming {
    /// Activation rows of the timed step.
    pub rows: usize,
    /// Seconds on bfloat16 panels.
    pub bf16_seconds: f64,
    /// Seconds on int8 panels with 16-bit activations.
    pub int16_seconds: f64,
}

impl LargeStepTiming {
    /// How many times faster the int16 kernel ran (below 1: slower).
    pub fn int16_speedup(&self) -> f64 {
        self.bf16_seconds / self.int16_seconds
    }
}

/// Times `weight` as bfloat16 and as int16 panels on `rows` rows of activations, `rounds`
/// times each in alternation on one thread (after one untimed run each). `None` unless this
/// CPU runs both natively (AVX512-BF16 and AVX512-VNNI), or when `rows` or `rounds` is zero.
pub fn time_large_steps(weight: &QuantizedWeight, rows: usize, rounds: usize) -> Option<LargeStepTiming> {
    if !(PanelPrecision::cpu_has_native_bf16() && PanelPrecision::cpu_has_native_int8())
        || rows == 0
        || rounds == 0
    {
        return None;
    }
    let bf16 = PanelWeight::from_quantized(weight, PanelPrecision::Bf16);
    let int16 = PanelWeight::from_quantized(weight, PanelPrecision::Int16);
    let x = activations(rows, weight.cols());
    let x_rows: Vec<&[f32]> = x.chunks(weight.cols()).collect();
    // One thread: the answer is a per-core rate, and the other core may be busy.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().ok()?;
    let time = |w: &PanelWeight| {
        let started = Instant::now();
        std::hint::black_box(w.matmul(&x_rows));
        started.elapsed().as_secs_f64()
    };
    pool.install(|| {
        time(&bf16);
        time(&int16);
        let (mut bf16_seconds, mut int16_seconds) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..rounds {
            bf16_seconds = bf16_seconds.min(time(&bf16));
            int16_seconds = int16_seconds.min(time(&int16));
        }
        Some(LargeStepTiming { rows, bf16_seconds, int16_seconds })
    })
}

/// Activations of the size of a model's hidden states, from a fixed linear congruential
/// sequence (the kernels' speed does not depend on the values).
fn activations(rows: usize, cols: usize) -> Vec<f32> {
    let mut state = 0x9e37_79b9_u32;
    (0..rows * cols)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use crate::quant_matmul::tests::random_weight;
    use crate::quant_weight::QuantFormat;

    #[test]
    fn times_both_kernels_where_the_cpu_runs_both() {
        let weight = random_weight(&mut StdRng::seed_from_u64(7), QuantFormat::Q4_0, 256, 128);
        let native = PanelPrecision::cpu_has_native_bf16() && PanelPrecision::cpu_has_native_int8();
        let timing = time_large_steps(&weight, 8, 2);
        assert_eq!(timing.is_some(), native);
        if let Some(t) = timing {
            assert_eq!(t.rows, 8);
            assert!(t.bf16_seconds > 0.0 && t.bf16_seconds.is_finite(), "{t:?}");
            assert!(t.int16_seconds > 0.0 && t.int16_seconds.is_finite(), "{t:?}");
            assert_eq!(t.int16_speedup(), t.bf16_seconds / t.int16_seconds);
        }
        assert_eq!(time_large_steps(&weight, 0, 2), None);
        assert_eq!(time_large_steps(&weight, 8, 0), None);
    }

    #[test]
    fn activations_are_fixed_and_centred() {
        let a = activations(4, 64);
        assert_eq!(a, activations(4, 64));
        assert!(a.iter().all(|v| (-0.5..0.5).contains(v)));
        assert!(a.iter().any(|&v| v < -0.25) && a.iter().any(|&v| v > 0.25));
    }
}
