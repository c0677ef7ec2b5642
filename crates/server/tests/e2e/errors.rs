//! Every error case with its status and the OpenAI error shape.

use anyhow::Result;
use serde_json::{json, Value};

use crate::harness::{assert_error_shape, client, post_json, shared, API_KEY};

async fn expect_error(path: &str, body: &Value, status: u16, param: Option<&str>) -> Result<Value> {
    let (got, json) = post_json(&client(), &shared().url(path), body).await?;
    assert_eq!(got, status, "{body} -> {json}");
    let error = assert_error_shape(&json);
    if let Some(param) = param {
        assert_eq!(error["param"], param, "{json}");
    }
    Ok(json)
}

fn msgs() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

#[tokio::test]
async fn malformed_json_is_400() -> Result<()> {
    for raw in ["{", "not json", "{\"messages\": [}", ""] {
        let resp = client()
            .post(shared().url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await?;
        assert_eq!(resp.status(), 400, "{raw:?}");
        let json: Value = resp.json().await?;
        assert_eq!(assert_error_shape(&json)["code"], "invalid_json");
    }
    Ok(())
}

#[tokio::test]
async fn wrong_types_are_400_naming_the_parameter() -> Result<()> {
    let chat = "/v1/chat/completions";
    expect_error(chat, &json!({"messages": msgs(), "temperature": "hot"}), 400, Some("temperature")).await?;
    expect_error(chat, &json!({"messages": msgs(), "max_tokens": -5}), 400, Some("max_tokens")).await?;
    expect_error(chat, &json!({"messages": msgs(), "n": "two"}), 400, Some("n")).await?;
    expect_error(chat, &json!({"messages": msgs(), "stop": 3}), 400, Some("stop")).await?;
    expect_error(chat, &json!({"messages": "hi"}), 400, Some("messages")).await?;
    expect_error(
        chat,
        &json!({"messages": [{"role": "user", "content": 5}]}),
        400,
        Some("messages[0].content"),
    )
    .await?;
    expect_error(chat, &json!({"model": "smol"}), 400, None).await?;
    expect_error("/v1/completions", &json!({"prompt": {"a": 1}}), 400, Some("prompt")).await?;
    expect_error("/v1/completions", &json!({"prompt": [1, -2]}), 400, Some("prompt")).await?;
    Ok(())
}

#[tokio::test]
async fn out_of_range_values_are_400_naming_the_parameter() -> Result<()> {
    let chat = "/v1/chat/completions";
    let cases = [
        (json!({"temperature": 2.5}), "temperature"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"top_k": -3}), "top_k"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"n": 0}), "n"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (json!({"frequency_penalty": -3}), "frequency_penalty"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"logit_bias": {"999999": 1}}), "logit_bias"),
        (json!({"logit_bias": {"5": 500}}), "logit_bias"),
        (json!({"logprobs": true, "top_logprobs": 50}), "top_logprobs"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"stop_token_ids": [99999999]}), "stop_token_ids"),
        (json!({"min_tokens": 9, "max_tokens": 3}), "min_tokens"),
    ];
    for (extra, param) in cases {
        let mut body = json!({"messages": msgs()});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        expect_error(chat, &body, 400, Some(param)).await?;
    }
    expect_error(chat, &json!({"messages": []}), 400, Some("messages")).await?;
    expect_error(
        chat,
        &json!({"messages": [{"role": "wizard", "content": "x"}]}),
        400,
        Some("messages[0].role"),
    )
    .await?;
    let image = json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]);
    expect_error(chat, &json!({"messages": image}), 400, Some("messages[0].content[0]")).await?;
    let comp = "/v1/completions";
    expect_error(comp, &json!({"prompt": "x", "logprobs": 21}), 400, Some("logprobs")).await?;
    expect_error(comp, &json!({"prompt": "x", "best_of": 2}), 400, Some("best_of")).await?;
    expect_error(comp, &json!({"prompt": ""}), 400, Some("prompt")).await?;
    expect_error(comp, &json!({"prompt": []}), 400, Some("prompt")).await?;
    expect_error(comp, &json!({"prompt": [49152]}), 400, Some("prompt")).await?;
    Ok(())
}

#[tokio::test]
async fn context_length_exceeded_says_both_numbers() -> Result<()> {
    let json = expect_error(
        "/v1/completions",
        &json!({"prompt": "Hello there", "max_tokens": 1024}),
        400,
        Some("max_tokens"),
    )
    .await?;
    let error = &json["error"];
    assert_eq!(error["code"], "context_length_exceeded");
    let message = error["message"].as_str().unwrap();
    // Both numbers: the context length and prompt + max_tokens.
    assert!(message.contains("maximum context length is 1024 tokens"), "{message}");
    assert!(message.contains("in the prompt, 1024 in the completion"), "{message}");
    // A prompt longer than the context, without max_tokens.
    let long = "word ".repeat(1100);
    let json = expect_error("/v1/completions", &json!({"prompt": long}), 400, None).await?;
    assert_eq!(json["error"]["code"], "context_length_exceeded");
    Ok(())
}

#[tokio::test]
async fn unknown_model_is_404() -> Result<()> {
    let json = expect_error(
        "/v1/chat/completions",
        &json!({"model": "gpt-4", "messages": msgs()}),
        404,
        Some("model"),
    )
    .await?;
    assert_eq!(json["error"]["code"], "model_not_found");
    expect_error("/v1/completions", &json!({"model": "gpt-4", "prompt": "x"}), 404, Some("model")).await?;
    Ok(())
}

#[tokio::test]
async fn missing_or_wrong_api_key_is_401() -> Result<()> {
    let s = shared();
    let bare = reqwest::Client::new();
    let body = json!({"messages": msgs(), "max_tokens": 1});
    for auth in [None, Some("Bearer wrong"), Some(API_KEY), Some("Basic e2e-secret")] {
        let mut req = bare.post(s.url("/v1/chat/completions")).json(&body);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = req.send().await?;
        assert_eq!(resp.status(), 401, "{auth:?}");
        let json: Value = resp.json().await?;
        assert_eq!(assert_error_shape(&json)["code"], "invalid_api_key");
    }
    assert_eq!(bare.get(s.url("/v1/models")).send().await?.status(), 401);
    assert_eq!(bare.post(s.url("/tokenize")).json(&json!({"prompt": "x"})).send().await?.status(), 401);
    let ok =
        bare.get(s.url("/v1/models")).header("authorization", format!("Bearer {API_KEY}")).send().await?;
    assert_eq!(ok.status(), 200);
    Ok(())
}

#[tokio::test]
async fn body_over_the_limit_is_413() -> Result<()> {
    let big = "x".repeat(70 * 1024);
    let json = expect_error("/v1/completions", &json!({"prompt": big}), 413, None).await?;
    assert_eq!(json["error"]["code"], "request_too_large");
    Ok(())
}

#[tokio::test]
async fn unknown_routes_and_methods() -> Result<()> {
    let c = client();
    let resp = c.get(shared().url("/v2/nothing")).send().await?;
    assert_eq!(resp.status(), 404);
    assert_error_shape(&resp.json().await?);
    let resp = c.get(shared().url("/v1/chat/completions")).send().await?;
    assert_eq!(resp.status(), 405);
    assert_error_shape(&resp.json().await?);
    Ok(())
}
