//! The fuzz suite's huge-`n` family (issue 63): one case in [`EVERY`] asks for as many samples
//! as the server runs at once (its `--max-num-seqs`, [`MAX_NUM_SEQS`]), or that many beams,
//! with a token or two each, among the suite's other requests: a fork or a beam that cost more
//! than its blocks would hold up everything beside it, and the suite's cases would time out.
//! Past the cap (and past the API's, 128) `n` is refused by name, before anything runs.

use serde_json::{json, Map, Value};

use super::gen::{maybe_model, prompt_text, stream_flag, text, Case, Endpoint, Expect, Rng};

/// The fuzz server's `--max-num-seqs` (set where fuzz.rs starts it).
pub const MAX_NUM_SEQS: i64 = 16;
/// One case in this many is of the family.
pub const EVERY: usize = 40;

/// Case `index` under `seed` when it belongs to the family.
pub fn generate(seed: u64, index: usize) -> Option<Case> {
    if index % EVERY != EVERY - 1 {
        return None;
    }
    let mut rng = Rng::for_case(seed ^ 0x4E4E, index);
    let mut m = Map::new();
    maybe_model(&mut rng, &mut m);
    m.insert("max_tokens".into(), json!(rng.range(1, 2)));
    let chat = rng.chance(35);
    let mut prompts = 1;
    if chat {
        m.insert("messages".into(), json!([{"role": "user", "content": text(&mut rng)}]));
    } else if rng.chance(25) {
        prompts = 2;
        m.insert("prompt".into(), json!([prompt_text(&mut rng), prompt_text(&mut rng)]));
    } else {
        m.insert("prompt".into(), prompt_text(&mut rng));
    }
    let (what, expect, stream, choices) = match rng.below(10) {
        // As many beams as the server runs, `n` of them returned.
        0..=1 if !chat => {
            let n = rng.range(1, 4);
            m.insert("use_beam_search".into(), json!(true));
            m.insert("best_of".into(), json!(MAX_NUM_SEQS));
            m.insert("n".into(), json!(n));
            ("huge n: beams at the cap", Expect::Ok, Some(false), Some(n as usize * prompts))
        }
        // Past the server's cap or the API's: refused, streaming or not.
        2..=3 => {
            let n = *rng.pick(&[MAX_NUM_SEQS + 1, 64, 128, 129, 1 << 20]);
            m.insert("n".into(), json!(n));
            stream_flag(&mut rng, &mut m);
            ("huge n: past the cap", Expect::Status(400), None, None)
        }
        // Samples at the cap, or just under it.
        _ => {
            let n = if rng.chance(70) { MAX_NUM_SEQS } else { rng.range(MAX_NUM_SEQS / 2, MAX_NUM_SEQS) };
            m.insert("n".into(), json!(n));
            if rng.chance(50) {
                m.insert("temperature".into(), json!(*rng.pick(&[0.0, 0.7, 1.0, 2.0])));
            }
            if rng.chance(20) {
                m.insert("ignore_eos".into(), json!(true));
            }
            let stream = stream_flag(&mut rng, &mut m);
            ("huge n: samples at the cap", Expect::Ok, Some(stream), Some(n as usize * prompts))
        }
    };
    let endpoint = if chat { Endpoint::Chat } else { Endpoint::Completions };
    let body = serde_json::to_vec(&Value::Object(m)).expect("a JSON value serializes");
    Some(Case {
        what: vec![what.to_owned()],
        stream,
        choices,
        ..Case::post(seed, index, endpoint, body, expect)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_family_asks_for_the_cap_and_past_it() {
        let cases: Vec<Case> = (0..4000).filter_map(|i| generate(7, i)).collect();
        assert_eq!(cases.len(), 100);
        let count = |what: &str| cases.iter().filter(|c| c.what == [what]).count();
        assert!(count("huge n: samples at the cap") > 40, "{}", count("huge n: samples at the cap"));
        assert!(count("huge n: beams at the cap") > 5);
        assert!(count("huge n: past the cap") > 10);
        for c in &cases {
            let body: Value = serde_json::from_slice(&c.body).unwrap();
            let n = body["n"].as_i64().unwrap();
            let max_tokens = body["max_tokens"].as_i64().unwrap();
            assert!((1..=2).contains(&max_tokens), "{body}");
            match c.expect {
                Expect::Ok => {
                    assert!(n <= MAX_NUM_SEQS && body["best_of"].as_i64().unwrap_or(n) <= MAX_NUM_SEQS)
                }
                _ => assert!(n > MAX_NUM_SEQS, "{body}"),
            }
        }
        assert_eq!(generate(7, 39).unwrap().body, generate(7, 39).unwrap().body);
    }
}
