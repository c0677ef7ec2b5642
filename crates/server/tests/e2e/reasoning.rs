//! Reasoning output through the real server: `--reasoning-parser qwen3` with a Qwen3-style
//! template that opens `<think>` in the prompt (or closes it at once with
//! `chat_template_kwargs: {"enable_thinking": false}`). SmolLM2 never closes the reasoning, so
//! with thinking on everything it writes is reasoning; with thinking off a grammar applies from
//! the first token.

use std::sync::OnceLock;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::harness::{client, post_json, read_sse, TestServer};

pub(crate) const QWEN3_STYLE: &str = r#"{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking == false %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"#;

pub fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        TestServer::start_with_template(
            "reasoning",
            QWEN3_STYLE,
            &["--reasoning-parser", "qwen3", "--max-num-seqs", "8"],
        )
    })
}

fn body(extra: Value) -> Value {
    let mut b = json!({"model": "smol", "messages": [{"role": "user", "content": "Is the sky blue? Think first."}],
                       "max_tokens": 24, "temperature": 0});
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

#[tokio::test]
async fn reasoning_is_split_from_content_whole_and_streamed() -> Result<()> {
    let s = server();
    let (status, resp) = post_json(&client(), &s.url("/v1/chat/completions"), &body(json!({}))).await?;
    assert_eq!(status, 200, "{resp}");
    let message = &resp["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().context("reasoning_content")?.to_owned();
    assert!(!reasoning.is_empty(), "{resp}");
    assert_eq!(message["content"], "", "the reasoning never ended, so there is no content: {resp}");

    let resp =
        client().post(s.url("/v1/chat/completions")).json(&body(json!({"stream": true}))).send().await?;
    let (events, done) = read_sse(resp).await?;
    assert!(done);
    let mut streamed = String::new();
    for e in &events {
        let delta = &e["choices"][0]["delta"];
        streamed.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        assert!(delta["content"].as_str().unwrap_or("").is_empty(), "content leaked: {delta}");
    }
    assert_eq!(streamed, reasoning);
    Ok(())
}

#[tokio::test]
async fn thinking_off_reaches_the_template_and_the_grammar_applies_at_once() -> Result<()> {
    let s = server();
    let extra = json!({"chat_template_kwargs": {"enable_thinking": false}, "guided_choice": ["yes", "no"]});
    let (status, resp) = post_json(&client(), &s.url("/v1/chat/completions"), &body(extra)).await?;
    assert_eq!(status, 200, "{resp}");
    let message = &resp["choices"][0]["message"];
    assert!(message["reasoning_content"].is_null(), "{resp}");
    let content = message["content"].as_str().context("content")?;
    assert!(["yes", "no"].contains(&content), "{resp}");
    assert_eq!(resp["choices"][0]["finish_reason"], "stop");
    Ok(())
}

/// Anthropic's `thinking.budget_tokens` caps the reasoning: SmolLM2 never closes it on its own,
/// so after the budget the server forces `</think>` and the model goes on to an answer.
#[tokio::test]
async fn a_thinking_budget_closes_the_reasoning() -> Result<()> {
    let s = server();
    let body = json!({"model": "smol", "max_tokens": 60, "temperature": 0,
                      "thinking": {"type": "enabled", "budget_tokens": 8},
                      "messages": [{"role": "user", "content": "Is the sky blue? Think first."}]});
    let (status, m) = post_json(&client(), &s.url("/v1/messages"), &body).await?;
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["content"][0]["type"], "thinking", "{m}");
    let thinking = m["content"][0]["thinking"].as_str().context("thinking")?;
    assert!(!thinking.is_empty(), "{m}");
    let (_, ids) =
        post_json(&client(), &s.url("/tokenize"), &json!({"prompt": thinking, "add_special_tokens": false}))
            .await?;
    assert!(ids["count"].as_u64().context("count")? <= 8, "{thinking:?}: {ids}");
    // The answer came after the forced close.
    assert!(m["content"].as_array().unwrap().iter().any(|b| b["type"] == "text"), "{m}");
    // Without a budget the same request thinks past 8 tokens.
    let mut free = body.clone();
    free["thinking"] = json!({"type": "adaptive"});
    let (_, m) = post_json(&client(), &s.url("/v1/messages"), &free).await?;
    let (_, ids) = post_json(
        &client(),
        &s.url("/tokenize"),
        &json!({"prompt": m["content"][0]["thinking"], "add_special_tokens": false}),
    )
    .await?;
    assert!(ids["count"].as_u64().unwrap_or(0) > 8, "{m}");
    Ok(())
}
