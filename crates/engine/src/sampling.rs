//! Per-request sampling parameters, as the engine and the samplers see them (no wire types).

use std::collections::HashMap;

/// How the next token is drawn from the logits. Defaults mean "plain greedy".
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 (or >= vocab) disables top-k.
    pub top_k: usize,
    /// 1.0 disables top-p.
    pub top_p: f32,
    /// 0.0 disables min-p.
    pub min_p: f32,
    /// 1.0 disables; > 1 discourages tokens already seen in prompt or output.
    pub repetition_penalty: f32,
    /// Subtracted once from tokens that occur in the output.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the output.
    pub frequency_penalty: f32,
    /// Added to the logit of each listed token id.
    pub logit_bias: HashMap<u32, f32>,
    /// Seed for reproducible sampling; `None` draws one per request.
    pub seed: Option<u64>,
    /// Number of logprobs to return besides the sampled token's; `None` means no logprobs.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: HashMap::new(),
            seed: None,
            logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Temperatures this small are greedy: dividing logits by them overflows f32 (a subnormal
    /// temperature turned every logit into infinity), and the draw is argmax in all but name.
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_BELOW
    }

    /// Rejects values no sampler can honour (NaN, negative temperature, empty nucleus, ...).
    pub fn validate(&self) -> Result<(), SamplingParamsError> {
        let bad = |name: &'static str, value: f32| Err(SamplingParamsError { name, value });
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("temperature", self.temperature);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p);
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return bad("repetition_penalty", self.repetition_penalty);
        }
        if !self.presence_penalty.is_finite() {
            return bad("presence_penalty", self.presence_penalty);
        }
        if !self.frequency_penalty.is_finite() {
            return bad("frequency_penalty", self.frequency_penalty);
        }
        if let Some(value) = self.logit_bias.values().copied().find(|v| v.is_nan()) {
            return bad("logit_bias", value);
        }
        Ok(())
    }

    /// Whether the sampler needs the token history (prompt and output) of the sequence.
    pub fn needs_history(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}

/// A sampling parameter outside the range the sampler accepts.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid sampling parameter {name} = {value}")]
pub struct SamplingParamsError {
    pub name: &'static str,
    pub value: f32,
}

/// Temperatures below this sample greedily (vLLM draws the same line).
pub const GREEDY_BELOW: f32 = 1e-5;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_rejects_out_of_range_values() {
        assert_eq!(SamplingParams::default().validate(), Ok(()));
        let cases = [
            SamplingParams { temperature: -0.1, ..Default::default() },
            SamplingParams { temperature: f32::NAN, ..Default::default() },
            SamplingParams { top_p: 0.0, ..Default::default() },
            SamplingParams { top_p: 1.5, ..Default::default() },
            SamplingParams { min_p: -1.0, ..Default::default() },
            SamplingParams { repetition_penalty: 0.0, ..Default::default() },
            SamplingParams { frequency_penalty: f32::INFINITY, ..Default::default() },
            SamplingParams { logit_bias: HashMap::from([(3, f32::NAN)]), ..Default::default() },
        ];
        for case in cases {
            assert!(case.validate().is_err(), "{case:?}");
        }
    }
}
