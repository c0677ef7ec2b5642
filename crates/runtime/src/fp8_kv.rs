//! `--kv-cache-dtype fp8`: the conversation the cache's per-tensor scales are calibrated on at
//! start-up (`pagoda_models::kv_calibration`), and the step that runs it.
//!
//! The conversation mixes what a server's traffic holds (prose, a question and its answer,
//! code, numbers, JSON, other scripts) and is rendered through the model's chat template when
//! it has one: the template's special tokens, and the first position, carry some models' largest
//! K and V, and every chat request holds them.

use candle_core::DType;
use pagoda_models::{calibrate_kv_scales, ModelRunner};
use pagoda_ops::KvScales;
use pagoda_text::{ChatMessage, ChatTemplate, Tokenizer};

use crate::load::RuntimeError;

const SYSTEM: &str = "You are a helpful assistant. Answer clearly and briefly.";

const QUESTION: &str = "\
The harbour was quiet before dawn. Fishing boats rocked against the pier while gulls waited on \
the posts, and an old man coiled rope with the patience of someone who had done it ten thousand \
times. Why does the sky look blue at noon but red at sunset?";

const ANSWER: &str = "\
Sunlight is scattered by air molecules, and short wavelengths scatter far more than \
long ones. At noon the light crosses little air, so the scattered blue fills the sky. At sunset \
it crosses much more, the blue is scattered away first, and the reds and oranges remain.

```python
def merge_intervals(intervals):
    intervals.sort(key=lambda pair: pair[0])
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
```

Solve for x: 3x + 7 = 25, so 3x = 18 and x = 6. The sum 1 + 2 + ... + 100 = 5050, and \
2^10 = 1024 while 17 * 23 = 391.

{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lisbon\", \"unit\": \"celsius\"}}

Le marché ouvre à huit heures; die Straßenbahn fährt alle zehn Minuten; 今日は天気がいいですね; \
Привет, как дела? ¿Dónde está la estación?";

/// The calibration conversation's tokens: rendered by `template`, or as plain text after the
/// tokenizer's special tokens.
fn calibration_tokens(
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
) -> Result<Vec<u32>, RuntimeError> {
    let messages = [
        ChatMessage::new("system", SYSTEM),
        ChatMessage::new("user", QUESTION),
        ChatMessage::new("assistant", ANSWER),
    ];
    // A template may refuse a system turn (Gemma's, some Mistral ones): then none.
    let rendered =
        template.and_then(|t| t.render(&messages, false).or_else(|_| t.render(&messages[1..], false)).ok());
    Ok(match rendered {
        Some(text) => tokenizer.encode(&text, false)?,
        None => tokenizer.encode(&format!("{SYSTEM}\n\n{QUESTION}\n\n{ANSWER}"), true)?,
    })
}

/// Each cache slot's scales for an FP8 cache, calibrated on the conversation above; `runner`
/// is left with a one-page cache of `cache_dtype`.
pub(crate) fn calibrated_scales(
    runner: &mut ModelRunner,
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
    block_size: usize,
    cache_dtype: DType,
) -> Result<Vec<KvScales>, RuntimeError> {
    let mut tokens = calibration_tokens(tokenizer, template)?;
    tokens.truncate(runner.model().config().max_position_embeddings);
    let scales = calibrate_kv_scales(runner, &tokens, block_size, cache_dtype)?;
    let range = |f: fn(&KvScales) -> f32| {
        scales.iter().map(f).fold((f32::INFINITY, 0f32), |(lo, hi), s| (lo.min(s), hi.max(s)))
    };
    tracing::info!(
        tokens = tokens.len(),
        k_scales = ?range(|s| s.k),
        v_scales = ?range(|s| s.v),
        "FP8 KV cache: per-tensor scales calibrated"
    );
    Ok(scales)
}
