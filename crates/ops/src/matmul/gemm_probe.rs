//! Times the panel kernels that can multiply a block-quantized weight in a prefill-sized step
//! (f32 panels, bfloat16 panels with `vdpbf16ps`, or the weight's codes times 16-bit activations
//! with `vpdpbusd`, [`crate::matmul::int16_matmul`]), so that a caller chooses by measurement, not by CPU
//! name.
//!
//! Why: which kernel wins depends on how fast a CPU issues each instruction, not on which ones
//! it has. bfloat16 and int16 both do 32 multiply-adds per instruction, and a CPU may issue one
//! at a third of the other's rate; f32 panels do half as many per instruction but need no
//! conversion. The timing runs on one thread, on the caller's own weight, each kernel several
//! times in alternation, keeping each one's fastest run: a busy neighbour slows all alike.

use std::time::Instant;

use crate::matmul::cpu_matmul::CpuWeight;
use crate::matmul::panel_matmul::{PanelPrecision, PanelWeight};
use crate::matmul::quant_weight::QuantizedWeight;

/// How long each timed kernel took for one prefill-sized step of one weight, at its fastest.
#[derive(Debug, Clone, PartialEq)]
pub struct PanelTiming {
    /// Activation rows of the timed step.
    pub rows: usize,
    /// Seconds per kernel, in the order they were asked for.
    pub seconds: Vec<(PanelPrecision, f64)>,
}

impl PanelTiming {
    /// The seconds `precision` took, when it was timed.
    pub fn seconds_of(&self, precision: PanelPrecision) -> Option<f64> {
        self.seconds.iter().find(|(p, _)| *p == precision).map(|&(_, s)| s)
    }
}

/// Times `weight` packed in each of `precisions` on `rows` rows of activations, `rounds` times
/// each in alternation on one thread (after one untimed run each). `None` when fewer than two
/// kernels are asked for, or when `rows` or `rounds` is zero. The caller names only kernels
/// this CPU runs natively: the portable loops are slower and not worth timing.
pub fn time_panel_kernels(
    weight: &QuantizedWeight,
    precisions: &[PanelPrecision],
    rows: usize,
    rounds: usize,
) -> Option<PanelTiming> {
    if precisions.len() < 2 || rows == 0 || rounds == 0 {
        return None;
    }
    let panels: Vec<PanelWeight> =
        precisions.iter().map(|&p| PanelWeight::from_quantized(weight, p)).collect();
    let x = activations(rows, weight.cols());
    let x_rows: Vec<&[f32]> = x.chunks(weight.cols()).collect();
    // One thread: the answer is a per-core rate, and the other cores may be busy.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().ok()?;
    let time = |w: &PanelWeight| {
        let started = Instant::now();
        std::hint::black_box(w.matmul(&x_rows));
        started.elapsed().as_secs_f64()
    };
    pool.install(|| {
        for w in &panels {
            time(w);
        }
        let mut best = vec![f64::INFINITY; panels.len()];
        for _ in 0..rounds {
            for (b, w) in best.iter_mut().zip(&panels) {
                *b = b.min(time(w));
            }
        }
        Some(PanelTiming { rows, seconds: precisions.iter().copied().zip(best).collect() })
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

    use crate::matmul::quant_matmul::tests::random_weight;
    use crate::matmul::quant_weight::QuantFormat;

    #[test]
    fn times_every_kernel_asked_for() {
        let weight = random_weight(&mut StdRng::seed_from_u64(7), QuantFormat::Q4_0, 256, 128);
        let asked = [PanelPrecision::F32, PanelPrecision::Bf16, PanelPrecision::Int16];
        let t = time_panel_kernels(&weight, &asked, 8, 2).unwrap();
        assert_eq!(t.rows, 8);
        assert_eq!(t.seconds.iter().map(|s| s.0).collect::<Vec<_>>(), asked);
        for p in asked {
            let s = t.seconds_of(p).unwrap();
            assert!(s > 0.0 && s.is_finite(), "{t:?}");
        }
        assert_eq!(t.seconds_of(PanelPrecision::Int8), None);
        assert_eq!(time_panel_kernels(&weight, &asked[..1], 8, 2), None);
        assert_eq!(time_panel_kernels(&weight, &asked, 0, 2), None);
        assert_eq!(time_panel_kernels(&weight, &asked, 8, 0), None);
    }

    #[test]
    fn activations_are_fixed_and_centred() {
        let a = activations(4, 64);
        assert_eq!(a, activations(4, 64));
        assert!(a.iter().all(|v| (-0.5..0.5).contains(v)));
        assert!(a.iter().any(|&v| v < -0.25) && a.iter().any(|&v| v > 0.25));
    }
}
