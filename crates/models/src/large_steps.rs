//! `--cpu-gemm-dtype auto`'s kernel for CPU steps of more than 16 tokens, chosen by timing this
//! model's own weight: bfloat16 panels, or the int16 kernel the small steps already run, which then
//! serves every step.
//!
//! Why: the two do the same multiply-adds per instruction issued, so the faster one depends on the
//! CPU. On an AMD Zen 4 VM bfloat16 panels win (int16 ran one weight at 0.78-0.81x of their
//! speed, and 32 streams at 0.83-1.01x); on the Intel Xeon VM, whose `vdpbf16ps` issues at about a
//! third of `vpdpbusd`'s multiply-add rate, bfloat16 GEMMs bound 32 streams, and int16 should be
//! about 1.3x as fast (predicted, not measured there). Both:
//! benches/reports/2026-11-26-large-step-kernel-timing-amd.md. int16 is also the finer of the two
//! (logit drift 0.0088 against 0.094 on the golden prompts), and one kernel at every step size
//! gives a row the same bits whatever is batched with it.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use pagoda_ops::{LargeStepTiming, PanelPrecision, QuantizedWeight};

/// Activation rows of the timed step: between a 32-stream decode step and a prefill chunk.
pub const PROBE_ROWS: usize = 64;

/// Timed runs of each kernel; the fastest counts.
pub const PROBE_ROUNDS: usize = 5;

/// How much faster int16 must run to be chosen. Near a tie bfloat16 stays, so that restarts on
/// one machine do not flip between the two (outputs' last bits differ between them).
pub const INT16_MARGIN: f64 = 1.15;

/// What the timing chose for large steps, and the timing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LargeStepChoice {
    pub timing: LargeStepTiming,
    /// [`PanelPrecision::Int16`] or [`PanelPrecision::Bf16`].
    pub precision: PanelPrecision,
}

impl LargeStepChoice {
    /// The choice a timing makes.
    pub fn from_timing(timing: LargeStepTiming) -> Self {
        let precision =
            if timing.int16_speedup() >= INT16_MARGIN { PanelPrecision::Int16 } else { PanelPrecision::Bf16 };
        Self { timing, precision }
    }

    /// Times `weight` (one of the model's projections) on both kernels; `None` where the CPU
    /// lacks either (then `auto` keeps what it had).
    pub fn measure(weight: &QuantizedWeight) -> Option<Self> {
        pagoda_ops::time_large_steps(weight, PROBE_ROWS, PROBE_ROUNDS).map(Self::from_timing)
    }

    /// [`measure`](Self::measure), once per model file and process: a second load of `model`
    /// takes the first one's choice. Two servers or engines in one process (a draft of the
    /// model itself, tests that compare a plain server with another) then run the same kernels,
    /// where a timing taken while the other core is busy could choose differently.
    pub fn measure_once(model: &Path, weight: impl FnOnce() -> Option<QuantizedWeight>) -> Option<Self> {
        static CHOSEN: Mutex<Vec<(PathBuf, Option<LargeStepChoice>)>> = Mutex::new(Vec::new());
        // Held while timing: two loads at once would also disturb each other's timing.
        let mut chosen = CHOSEN.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, choice)) = chosen.iter().find(|(path, _)| path == model) {
            return *choice;
        }
        let choice = weight().as_ref().and_then(Self::measure);
        chosen.push((model.to_path_buf(), choice));
        choice
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(bf16_seconds: f64, int16_seconds: f64) -> LargeStepTiming {
        LargeStepTiming { rows: PROBE_ROWS, bf16_seconds, int16_seconds }
    }

    #[test]
    fn int16_is_chosen_only_when_clearly_faster() {
        let precision = |bf16, int16| LargeStepChoice::from_timing(timing(bf16, int16)).precision;
        assert_eq!(precision(1.4e-3, 1.0e-3), PanelPrecision::Int16);
        assert_eq!(precision(1.16e-3, 1.0e-3), PanelPrecision::Int16);
        assert_eq!(precision(1.1e-3, 1.0e-3), PanelPrecision::Bf16);
        assert_eq!(precision(1.0e-3, 1.0e-3), PanelPrecision::Bf16);
        assert_eq!(precision(0.8e-3, 1.0e-3), PanelPrecision::Bf16);
    }
}
