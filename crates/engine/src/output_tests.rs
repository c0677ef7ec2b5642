use super::*;
use crate::event::Usage;
use crate::executor::{TokenLogprob, TopLogprobs};
use pagoda_text::StopStrings;

/// Token `i` decodes to `TABLE[i]`; ids past the table decode to nothing.
struct Table;
const TABLE: [&str; 6] = ["a", "b", "<eos>", "ST", "OP", " "];

impl TokenDecoder for Table {
    fn decode(&self, ids: &[u32], _skip: bool) -> String {
        ids.iter().filter_map(|&i| TABLE.get(i as usize)).copied().collect()
    }
}

fn output(stop: &StopConditions) -> RequestOutput {
    RequestOutput::for_prompt(&[0], true, stop.clone(), Arc::new(Table))
}

fn raw(index: usize, tokens: &[u32], finished: Option<FinishReason>) -> TokenEvent {
    TokenEvent {
        index,
        token_ids: tokens.to_vec(),
        text: String::new(),
        logprobs: None,
        pooled: None,
        prompt_logprobs: None,
        finished,
        usage: None,
        timestamps: None,
    }
}

fn usage(completion_tokens: usize) -> Option<Usage> {
    Some(Usage { prompt_tokens: 1, completion_tokens, cached_prompt_tokens: 0 })
}

/// Plays a one-sample engine: each token is an event, the token-level stops are the
/// scheduler's (eos, stop ids after `min_tokens`, `max_tokens`), and a sample the output stage
/// cuts ends `lag` tokens later, as the engine's answer to the [`SampleStop`]. Returns the text,
/// the finish reason, the tokens delivered and the usage's completion tokens.
fn run(
    stop: &StopConditions,
    tokens: &[u32],
    max_tokens: usize,
    lag: usize,
) -> (String, FinishReason, usize, usize) {
    let mut out = output(stop);
    let mut asked: Option<(usize, FinishReason)> = None;
    let mut events = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        let n = i + 1;
        let id_stop = n > stop.min_tokens
            && ((!stop.ignore_eos && stop.eos_token_ids.contains(&t)) || stop.stop_token_ids.contains(&t));
        let mut finish = if id_stop {
            let reason =
                if stop.eos_token_ids.contains(&t) { StopReason::Eos(t) } else { StopReason::StopTokenId(t) };
            Some(FinishReason::Stop(reason))
        } else if n >= max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        };
        let mut last = finish.is_some() || n == tokens.len();
        if let Some((at, reason)) = &asked {
            if n > *at + lag {
                // The engine ends the sample as asked, with no token.
                let mut end = raw(0, &[], Some(reason.clone()));
                end.usage = usage(n - 1);
                out.push(end);
                events.extend(std::iter::from_fn(|| out.pop()));
                break;
            }
        }
        let mut event = raw(0, &[t], finish.take());
        if last {
            event.finished.get_or_insert(FinishReason::Length);
            event.usage = usage(n);
        }
        if let Some(s) = out.push(event) {
            asked = Some((n, s.reason));
            last = false;
        }
        events.extend(std::iter::from_fn(|| out.pop()));
        if last {
            break;
        }
    }
    let text: String = events.iter().map(|e| e.text.as_str()).collect();
    let delivered = events.iter().map(|e| e.token_ids.len()).sum();
    let end = events.last().expect("a last event");
    (text, end.finished.clone().expect("finished"), delivered, end.usage.expect("usage").completion_tokens)
}

fn stop_strings(strings: &[&str]) -> StopStrings {
    StopStrings::from(strings.iter().map(|s| s.to_string()).collect::<Vec<_>>())
}

#[test]
fn eos_stops_without_its_text_unless_ignored() {
    let stop = StopConditions { eos_token_ids: vec![2], ..Default::default() };
    assert_eq!(run(&stop, &[0, 1, 2, 0], 10, 0), ("ab".into(), FinishReason::Stop(StopReason::Eos(2)), 3, 3));
    let ignore = StopConditions { ignore_eos: true, ..stop };
    assert_eq!(run(&ignore, &[0, 2, 1], 10, 0), ("a<eos>b".into(), FinishReason::Length, 3, 3));
}

#[test]
fn a_stop_string_across_tokens_is_cut_and_later_tokens_are_not_counted() {
    let stop = StopConditions { stop_strings: stop_strings(&["TOP"]), ..Default::default() };
    let reason = FinishReason::Stop(StopReason::StopString("TOP".into()));
    // "S" + "T" | "OP": "TOP" spans two tokens; text before it is released, the rest not. The
    // engine ends the sample one or two tokens later; those tokens are neither sent nor counted.
    for lag in [0, 1, 2] {
        assert_eq!(
            run(&stop, &[0, 3, 4, 0, 1, 0, 1], 10, lag),
            ("aS".into(), reason.clone(), 3, 3),
            "lag {lag}"
        );
    }
}

#[test]
fn held_text_is_released_at_length_and_at_eos() {
    let stop =
        StopConditions { stop_strings: stop_strings(&["ab!"]), eos_token_ids: vec![2], ..Default::default() };
    // "ab" is held as a possible start of "ab!" until the sample ends.
    assert_eq!(run(&stop, &[0, 1], 2, 0), ("ab".into(), FinishReason::Length, 2, 2));
    assert_eq!(run(&stop, &[0, 1, 2], 5, 0), ("ab".into(), FinishReason::Stop(StopReason::Eos(2)), 3, 3));
}

#[test]
fn stop_strings_inside_min_tokens_do_not_stop() {
    let stop = StopConditions { stop_strings: stop_strings(&["a"]), min_tokens: 1, ..Default::default() };
    let reason = FinishReason::Stop(StopReason::StopString("a".into()));
    assert_eq!(run(&stop, &[0, 1, 0, 1], 10, 0), ("ab".into(), reason, 3, 3));
}

#[test]
fn a_merged_event_is_cut_with_its_logprobs_and_ends_there_when_the_engine_ended_it() {
    let stop = StopConditions { stop_strings: stop_strings(&["TOP"]), ..Default::default() };
    let lp = |t: u32| TopLogprobs { sampled: TokenLogprob { token_id: t, logprob: -1.0 }, top: Vec::new() };
    // A slow reader's five tokens in one event, the engine's end (length) included.
    let mut event = raw(0, &[0, 3, 4, 0, 1], Some(FinishReason::Length));
    event.logprobs = Some([0, 3, 4, 0, 1].map(lp).to_vec());
    event.usage = usage(5);
    let mut out = output(&stop);
    assert_eq!(out.push(event), None, "the engine already ended the sample");
    let got = out.pop().unwrap();
    assert_eq!((got.text.as_str(), got.token_ids.as_slice()), ("aS", &[0, 3, 4][..]));
    assert_eq!(got.logprobs.unwrap().len(), 3);
    assert_eq!(got.finished, Some(FinishReason::Stop(StopReason::StopString("TOP".into()))));
    assert_eq!(got.usage.unwrap().completion_tokens, 3);
    assert!(out.pop().is_none());
}

#[test]
fn other_samples_go_on_and_the_held_one_waits_for_its_end() {
    let stop = StopConditions { stop_strings: stop_strings(&["b"]), ..Default::default() };
    let mut out = output(&stop);
    assert_eq!(out.push(raw(1, &[0], None)), None);
    let asked = out.push(raw(0, &[1], None)).expect("sample 0 is cut");
    assert_eq!(
        asked,
        SampleStop { index: 0, reason: FinishReason::Stop(StopReason::StopString("b".into())) }
    );
    assert_eq!(out.pop().unwrap().text, "a");
    assert!(out.pop().is_none(), "sample 0's end is held");
    // Sample 0 made one more token before the engine ended it; sample 1 goes on.
    assert_eq!(out.push(raw(0, &[0], None)), None);
    assert_eq!(out.push(raw(1, &[0], None)), None);
    assert_eq!(out.pop().unwrap().text, "a");
    assert_eq!(out.push(raw(0, &[], Some(asked.reason.clone()))), None);
    let end0 = out.pop().unwrap();
    assert_eq!(
        (end0.index, end0.token_ids.as_slice(), end0.finished.clone()),
        (0, &[1][..], Some(asked.reason))
    );
    // The request's usage comes with sample 1's end, less sample 0's dropped token.
    let mut last = raw(1, &[0], Some(FinishReason::Length));
    last.usage = usage(5);
    assert_eq!(out.push(last), None);
    assert_eq!(out.pop().unwrap().usage.unwrap().completion_tokens, 4);
}

#[test]
fn held_events_go_out_when_the_engine_is_gone() {
    let stop = StopConditions { stop_strings: stop_strings(&["b"]), ..Default::default() };
    let mut out = output(&stop);
    assert!(out.push(raw(0, &[0, 1], None)).is_some());
    assert!(out.pop().is_none(), "held until the engine ends the sample");
    out.release_held();
    let held = out.pop().unwrap();
    assert_eq!((held.text.as_str(), held.token_ids.as_slice()), ("a", &[0, 1][..]));
    assert_eq!(held.finished, Some(FinishReason::Stop(StopReason::StopString("b".into()))));
}

#[test]
fn usage_is_corrected_whichever_event_carries_it() {
    let stop = StopConditions { stop_strings: stop_strings(&["b"]), ..Default::default() };
    let mut out = output(&stop);
    // Sample 0 is cut; the engine makes two more of its tokens before ending it.
    let asked = out.push(raw(0, &[1], None)).expect("sample 0 is cut");
    assert_eq!(out.push(raw(0, &[0, 0], None)), None);
    assert_eq!(out.push(raw(0, &[], Some(asked.reason))), None);
    // Sample 1's last event is the request's: the engine ended it by length at a token that
    // also completes the stop string, and its usage counts sample 0's two dropped tokens.
    let mut last = raw(1, &[0, 1], Some(FinishReason::Length));
    last.usage = usage(7);
    assert_eq!(out.push(last), None);
    let events: Vec<TokenEvent> = std::iter::from_fn(|| out.pop()).collect();
    let end = events.last().unwrap();
    assert_eq!((end.index, end.text.as_str()), (1, "a"));
    assert_eq!(end.finished, Some(FinishReason::Stop(StopReason::StopString("b".into()))));
    assert_eq!(end.usage.unwrap().completion_tokens, 5);
}
