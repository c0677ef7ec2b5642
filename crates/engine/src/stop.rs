//! Per-sample output processing for each new token: incremental detokenizing and the stop
//! conditions (eos unless `ignore_eos`, stop token ids, stop strings across token boundaries,
//! `min_tokens`, length). Decides what text to release and whether the sample is finished.

use pagoda_text::{IncrementalDetokenizer, StopMatcher, TokenDecoder};

use crate::event::{FinishReason, StopReason};
use crate::request::StopConditions;

/// Text to release for one token and whether the sample ended with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TokenOutcome {
    pub text: String,
    pub finish: Option<FinishReason>,
}

#[derive(Debug, Clone)]
pub(crate) struct OutputProcessor {
    detok: IncrementalDetokenizer,
    /// Empty when the request has no stop strings.
    matcher: StopMatcher,
}

impl OutputProcessor {
    pub fn new(prompt: &[u32], skip_special_tokens: bool, stop: &StopConditions) -> Self {
        Self {
            detok: IncrementalDetokenizer::new(prompt, skip_special_tokens),
            matcher: StopMatcher::new(stop.stop_strings.clone()),
        }
    }

    /// Processes the sample's `output_len`-th token. `at_length_limit`: this token reaches
    /// `max_tokens` or the model's context length.
    pub fn push(
        &mut self,
        decoder: &dyn TokenDecoder,
        stop: &StopConditions,
        token: u32,
        output_len: usize,
        at_length_limit: bool,
    ) -> TokenOutcome {
        // The first `min_tokens` tokens can never stop the sample (eos / stop ids are also
        // banned from sampling until then, see `SampleRequest::banned_token_ids`).
        let may_stop = output_len > stop.min_tokens;
        if may_stop {
            let id_stop = if !stop.ignore_eos && stop.eos_token_ids.contains(&token) {
                Some(StopReason::Eos(token))
            } else if stop.stop_token_ids.contains(&token) {
                Some(StopReason::StopTokenId(token))
            } else {
                None
            };
            if let Some(reason) = id_stop {
                // The stop token's own text is not part of the output.
                return self.finish(decoder, stop, String::new(), FinishReason::Stop(reason));
            }
        }
        let delta = self.detok.push(decoder, token);
        let text = if may_stop && !self.matcher.is_empty() {
            let outcome = self.matcher.push(&delta);
            if let Some(i) = outcome.stopped {
                let which = stop.stop_strings.get(i).unwrap_or_default().to_owned();
                return TokenOutcome {
                    text: outcome.emit,
                    finish: Some(FinishReason::Stop(StopReason::StopString(which))),
                };
            }
            outcome.emit
        } else {
            delta
        };
        if at_length_limit {
            return self.finish(decoder, stop, text, FinishReason::Length);
        }
        TokenOutcome { text, finish: None }
    }

    /// Ends the sample for `reason`, releasing text still held back; a stop string found in
    /// that tail takes precedence (and is cut off).
    fn finish(
        &mut self,
        decoder: &dyn TokenDecoder,
        stop: &StopConditions,
        mut text: String,
        reason: FinishReason,
    ) -> TokenOutcome {
        let tail = self.detok.flush(decoder);
        if self.matcher.is_empty() {
            text.push_str(&tail);
            return TokenOutcome { text, finish: Some(reason) };
        }
        let outcome = self.matcher.push(&tail);
        text.push_str(&outcome.emit);
        if let Some(i) = outcome.stopped {
            let which = stop.stop_strings.get(i).unwrap_or_default().to_owned();
            return TokenOutcome { text, finish: Some(FinishReason::Stop(StopReason::StopString(which))) };
        }
        text.push_str(&self.matcher.flush());
        TokenOutcome { text, finish: Some(reason) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_text::StopStrings;

    /// Token `i` decodes to `TABLE[i]`; ids past the table decode to nothing.
    struct Table;
    const TABLE: [&str; 6] = ["a", "b", "<eos>", "ST", "OP", " "];

    impl TokenDecoder for Table {
        fn decode(&self, ids: &[u32], _skip: bool) -> String {
            ids.iter().filter_map(|&i| TABLE.get(i as usize)).copied().collect()
        }
    }

    fn run(
        stop: &StopConditions,
        tokens: &[u32],
        max_tokens: usize,
    ) -> (String, Option<FinishReason>, usize) {
        let mut p = OutputProcessor::new(&[0], true, stop);
        let mut text = String::new();
        for (i, &t) in tokens.iter().enumerate() {
            let o = p.push(&Table, stop, t, i + 1, i + 1 >= max_tokens);
            text.push_str(&o.text);
            if o.finish.is_some() {
                return (text, o.finish, i + 1);
            }
        }
        (text, None, tokens.len())
    }

    #[test]
    fn eos_stops_without_its_text_unless_ignored() {
        let stop = StopConditions { eos_token_ids: vec![2], ..Default::default() };
        assert_eq!(
            run(&stop, &[0, 1, 2, 0], 10),
            ("ab".into(), Some(FinishReason::Stop(StopReason::Eos(2))), 3)
        );
        let ignore = StopConditions { ignore_eos: true, ..stop };
        assert_eq!(run(&ignore, &[0, 2, 1], 10), ("a<eos>b".into(), None, 3));
    }

    #[test]
    fn stop_token_ids_and_min_tokens() {
        let stop = StopConditions { stop_token_ids: vec![1], min_tokens: 2, ..Default::default() };
        // The first `b` is within min_tokens and passes through; the second stops.
        assert_eq!(
            run(&stop, &[1, 0, 1, 0], 10),
            ("ba".into(), Some(FinishReason::Stop(StopReason::StopTokenId(1))), 3)
        );
    }

    #[test]
    fn stop_string_across_tokens_is_cut() {
        let stop =
            StopConditions { stop_strings: StopStrings::from(vec!["TOP".into()]), ..Default::default() };
        // "S" + "T" | "OP": "TOP" spans two tokens; text before it is released, the rest not.
        assert_eq!(
            run(&stop, &[0, 3, 4, 0], 10),
            ("aS".into(), Some(FinishReason::Stop(StopReason::StopString("TOP".into()))), 3)
        );
    }

    #[test]
    fn held_text_is_released_at_length_and_at_eos() {
        let stop = StopConditions {
            stop_strings: StopStrings::from(vec!["ab!".into()]),
            eos_token_ids: vec![2],
            ..Default::default()
        };
        // "ab" is held as a possible start of "ab!" until the sample ends.
        assert_eq!(run(&stop, &[0, 1], 2), ("ab".into(), Some(FinishReason::Length), 2));
        assert_eq!(run(&stop, &[0, 1, 2], 5), ("ab".into(), Some(FinishReason::Stop(StopReason::Eos(2))), 3));
    }

    #[test]
    fn stop_strings_inside_min_tokens_do_not_stop() {
        let stop = StopConditions {
            stop_strings: StopStrings::from(vec!["a".into()]),
            min_tokens: 1,
            ..Default::default()
        };
        assert_eq!(
            run(&stop, &[0, 1, 0], 10),
            ("ab".into(), Some(FinishReason::Stop(StopReason::StopString("a".into()))), 3)
        );
    }
}
