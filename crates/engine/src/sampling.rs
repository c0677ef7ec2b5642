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
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Whether the sampler needs the token history (prompt and output) of the sequence.
    pub fn needs_history(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}
