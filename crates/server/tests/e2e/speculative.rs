//! `pagoda serve --speculative-config`: n-gram proposals and a separate draft model must not
//! change what clients get (greedy and seeded chats, logprobs, a stop string, `n = 2`, a JSON
//! schema, streamed or not), and the spec_decode metrics must count what was proposed and
//! accepted. A draft model that cannot draft for the target is a start-up error.

use anyhow::Result;
use serde_json::{json, Value};

use crate::gemma3::gemma3_path;
use crate::harness::{
    client, metric, metrics_text, model_path, post_json, read_sse, startup_error, TestServer,
};

const SPEC: &str = r#"{"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 64}"#;

const PASSAGE: &str = "The harbour town grew up around a stone pier built in 1742. Fishing boats \
    unloaded herring there every morning, and by noon the catch was salted and packed into barrels.";

fn bodies() -> Vec<Value> {
    let repeat = format!("Repeat the following text word for word:\n\n{PASSAGE}");
    let msgs = |text: &str| json!([{"role": "user", "content": text}]);
    vec![
        json!({"model": "smol", "messages": msgs(&repeat), "max_tokens": 60, "temperature": 0}),
        json!({"model": "smol", "messages": msgs(&repeat), "max_tokens": 40, "temperature": 0,
               "logprobs": true, "top_logprobs": 2}),
        json!({"model": "smol", "messages": msgs(&repeat), "max_tokens": 60, "temperature": 0,
               "stop": ["herring"]}),
        json!({"model": "smol", "messages": msgs(&repeat), "max_tokens": 50, "temperature": 0.8,
               "seed": 11, "n": 2}),
        json!({"model": "smol", "messages": msgs("Write a haiku about the sea."), "max_tokens": 30,
               "temperature": 0}),
        // Under a grammar: proposals are cut to what it accepts and verified under its masks.
        json!({"model": "smol", "messages": msgs(&format!("Answer in JSON with a field text. {repeat}")),
               "max_tokens": 60, "temperature": 0,
               "response_format": {"type": "json_schema", "json_schema": {"name": "copy", "schema": {
                   "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}}),
    ]
}

/// Each body's answer: the choices' messages and finish reasons, the usage and the logprobs.
async fn answers(server: &TestServer) -> Result<Vec<Value>> {
    let c = client();
    let mut out = Vec::new();
    for body in bodies() {
        let (status, resp) = post_json(&c, &server.url("/v1/chat/completions"), &body).await?;
        assert_eq!(status, 200, "{resp}");
        let choices: Vec<Value> = resp["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| json!([c["message"]["content"], c["finish_reason"], c["logprobs"]]))
            .collect();
        out.push(json!([choices, resp["usage"]["completion_tokens"]]));
    }
    // One streamed too: its deltas concatenate to the same text.
    let mut body = bodies().remove(0);
    body["stream"] = json!(true);
    let resp = c.post(server.url("/v1/chat/completions")).json(&body).send().await?;
    let (events, done) = read_sse(resp).await?;
    assert!(done);
    let text: String = events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
    out.push(json!(text));
    Ok(out)
}

/// Equal, except that logprobs may differ in their last bits: a step that verifies proposals
/// computes several positions at once, and the small-step kernels sum in another order.
fn assert_same(got: &Value, want: &Value, path: &str) {
    match (got, want) {
        (Value::Number(g), Value::Number(w)) if !(g.is_u64() && w.is_u64()) => {
            let (g, w) = (g.as_f64().unwrap(), w.as_f64().unwrap());
            assert!((g - w).abs() <= 1e-3 + 1e-3 * w.abs(), "{path}: {g} vs {w}");
        }
        (Value::Array(g), Value::Array(w)) => {
            assert_eq!(g.len(), w.len(), "{path}: lengths");
            for (i, (g, w)) in g.iter().zip(w).enumerate() {
                assert_same(g, w, &format!("{path}[{i}]"));
            }
        }
        (Value::Object(g), Value::Object(w)) => {
            assert_eq!(g.keys().collect::<Vec<_>>(), w.keys().collect::<Vec<_>>(), "{path}: keys");
            for (k, g) in g {
                assert_same(g, &w[k], &format!("{path}.{k}"));
            }
        }
        _ => assert_eq!(got, want, "{path}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ngram_proposals_leave_answers_unchanged_and_are_counted() -> Result<()> {
    let (spec, text, [drafts, proposed, accepted]) = same_answers_with(SPEC).await?;
    // The repeat prompts copy the passage: proposals are made and mostly accepted.
    let first =
        metric(&text, "pagoda:spec_decode_num_accepted_tokens_per_pos_total", "position=\"0\"").unwrap();
    assert!(drafts >= 10.0 && proposed >= drafts && accepted >= 10.0, "{text}");
    assert!(accepted <= proposed && first <= drafts && first >= accepted / 4.0, "{text}");

    // A request's own cap: none proposed at 0, at most 2 per step at 2, the answer unchanged;
    // above 16 it is refused, naming the field.
    let c = client();
    let counters = |text: &str| {
        ["drafts", "draft_tokens"]
            .map(|k| metric(text, &format!("pagoda:spec_decode_num_{k}_total"), "").unwrap())
    };
    let uncapped = &answers(&spec).await?[0][0][0][0];
    let mut before = counters(&metrics_text(&c, &spec).await?);
    for cap in [0, 2] {
        let mut body = bodies().remove(0);
        body["num_speculative_tokens"] = json!(cap);
        let (status, resp) = post_json(&c, &spec.url("/v1/chat/completions"), &body).await?;
        assert_eq!(status, 200, "{resp}");
        assert_eq!(&resp["choices"][0]["message"]["content"], uncapped, "cap {cap}");
        let after = counters(&metrics_text(&c, &spec).await?);
        let (new_drafts, new_tokens) = (after[0] - before[0], after[1] - before[1]);
        if cap == 0 {
            assert_eq!((new_drafts, new_tokens), (0.0, 0.0), "a request capped at 0 proposed");
        } else {
            assert!(
                new_drafts >= 3.0 && new_tokens <= 2.0 * new_drafts,
                "{new_drafts} drafts, {new_tokens} tokens"
            );
        }
        before = after;
    }
    let mut body = bodies().remove(0);
    body["num_speculative_tokens"] = json!(17);
    let (status, resp) = post_json(&c, &spec.url("/v1/chat/completions"), &body).await?;
    assert_eq!((status, resp["error"]["param"].as_str()), (400, Some("num_speculative_tokens")), "{resp}");

    // A request's own method: suffix decoding beside the server's n-gram, the same answer and
    // proposals made; a draft this server does not have, or no method at all, is refused.
    let mut body = bodies().remove(0);
    body["speculative_method"] = json!("suffix");
    let (status, resp) = post_json(&c, &spec.url("/v1/chat/completions"), &body).await?;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(&resp["choices"][0]["message"]["content"], uncapped);
    let after = counters(&metrics_text(&c, &spec).await?);
    assert!(after[0] - before[0] >= 3.0, "suffix decoding proposed nothing: {after:?} after {before:?}");
    for (method, says) in [("draft_model", "has none"), ("beam", "unknown variant")] {
        body["speculative_method"] = json!(method);
        let (status, resp) = post_json(&c, &spec.url("/v1/chat/completions"), &body).await?;
        assert_eq!((status, resp["error"]["param"].as_str()), (400, Some("speculative_method")), "{resp}");
        assert!(resp["error"]["message"].as_str().unwrap().contains(says), "{resp}");
    }
    spec.signal_stop();
    spec.join()
}

/// A server with `--speculative-config spec_config` whose answers equal a plain server's; with
/// its metrics text and its drafts, proposed and accepted token counters.
async fn same_answers_with(spec_config: &str) -> Result<(TestServer, String, [f64; 3])> {
    let plain = TestServer::start(&[]);
    let want = answers(&plain).await?;
    // A method of its own needs a server that speculates.
    let mut body = bodies().remove(0);
    body["speculative_method"] = json!("ngram");
    let (status, resp) = post_json(&client(), &plain.url("/v1/chat/completions"), &body).await?;
    assert_eq!((status, resp["error"]["param"].as_str()), (400, Some("speculative_method")), "{resp}");
    plain.signal_stop();
    plain.join()?;

    let spec = TestServer::start(&["--speculative-config", spec_config]);
    let got = answers(&spec).await?;
    assert_same(&json!(got), &json!(want), "answers");
    let text = metrics_text(&client(), &spec).await?;
    let counters = ["drafts", "draft_tokens", "accepted_tokens"]
        .map(|c| metric(&text, &format!("pagoda:spec_decode_num_{c}_total"), "").unwrap());
    Ok((spec, text, counters))
}

/// The default model drafting for itself (the only same-tokenizer draft at hand): answers
/// unchanged, and greedy proposals accepted nearly always, which they are only while the
/// draft's own KV cache keeps in step with the target's over prefills, prefix-cache hits and
/// verified steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_model_leaves_answers_unchanged_and_is_counted() -> Result<()> {
    let config = json!({"method": "draft_model", "model": model_path(), "num_speculative_tokens": 3,
                        "disable_by_batch_size": 64})
    .to_string();
    let (spec, text, [drafts, proposed, accepted]) = same_answers_with(&config).await?;
    assert!(drafts >= 50.0 && proposed >= drafts, "{text}");
    // Sampled requests (n = 2 at temperature 0.8) reject some of the greedy draft's proposals.
    assert!(accepted >= 0.8 * proposed && accepted <= proposed, "{accepted} of {proposed} accepted\n{text}");

    // Under a JSON schema the draft drafts too, under the grammar's masks (its answer was
    // among those compared above), and its proposals hold as well.
    let body = bodies().into_iter().find(|b| b.get("response_format").is_some()).unwrap();
    let (status, resp) = post_json(&client(), &spec.url("/v1/chat/completions"), &body).await?;
    assert_eq!(status, 200, "{resp}");
    let after = metrics_text(&client(), &spec).await?;
    let [drafts_after, proposed_after, accepted_after] = ["drafts", "draft_tokens", "accepted_tokens"]
        .map(|c| metric(&after, &format!("pagoda:spec_decode_num_{c}_total"), "").unwrap());
    let (schema_drafts, schema_proposed) = (drafts_after - drafts, proposed_after - proposed);
    assert!(schema_drafts >= 5.0, "{schema_drafts} drafts under the schema\n{after}");
    assert!(accepted_after - accepted >= 0.8 * schema_proposed, "{after}");

    // A request may take prompt lookup instead of the draft: the same answer, proposals made.
    let url = spec.url("/v1/chat/completions");
    let mut body = bodies().remove(0);
    let (_, drafted) = post_json(&client(), &url, &body).await?;
    let drafts = |text: String| metric(&text, "pagoda:spec_decode_num_drafts_total", "").unwrap();
    let before = drafts(metrics_text(&client(), &spec).await?);
    body["speculative_method"] = json!("ngram");
    let (status, resp) = post_json(&client(), &url, &body).await?;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["choices"][0]["message"]["content"], drafted["choices"][0]["message"]["content"]);
    let after = drafts(metrics_text(&client(), &spec).await?);
    assert!(after - before >= 3.0, "prompt lookup proposed nothing: {after} after {before}");
    spec.signal_stop();
    spec.join()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draft_model_of_another_vocabulary_is_a_startup_error() -> Result<()> {
    let draft =
        json!({"method": "draft_model", "model": gemma3_path(), "num_speculative_tokens": 3}).to_string();
    // Not a hub id either (those are fetched), so nothing is looked up online.
    let missing =
        json!({"method": "draft_model", "model": "/no/such/draft.gguf", "num_speculative_tokens": 3})
            .to_string();
    for (config, expected) in [
        (&draft, "vocabulary of 262144 ids is not the target's 49152"),
        (&missing, "draft model /no/such/draft.gguf: no such file"),
    ] {
        let err = startup_error(&["--speculative-config", config]).await?;
        assert!(err.contains(expected), "{err}");
    }
    Ok(())
}
