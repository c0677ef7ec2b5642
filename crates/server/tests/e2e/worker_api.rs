//! The calls sglang-router and vllm-router make of a worker, against the real server: server
//! and model info under both spellings, `/get_load` in both routers' shapes (idle and with a
//! request in flight), the prefix-cache flush (refused while busy, then forgetting prompts),
//! `/health_generate`, `/ready`, the render endpoints (the very ids generation runs), and the
//! SGLang fields the routers add to every request.

use anyhow::Result;
use serde_json::{json, Value};

use crate::harness::{assert_error_shape, metric, metrics_text, post_json, TestServer};

/// A chat request as sglang-router forwards it: `max_tokens` renamed, SGLang's fields added.
fn routed_chat(content: &str) -> Value {
    json!({"messages": [{"role": "user", "content": content}], "model": "smol",
           "logprobs": false, "max_completion_tokens": 4, "stream": false, "no_stop_trim": false,
           "ignore_eos": false, "continue_final_message": false, "skip_special_tokens": true,
           "separate_reasoning": true, "stream_reasoning": true, "return_hidden_states": false,
           "include_reasoning": true, "temperature": 0})
}

async fn get(c: &reqwest::Client, server: &TestServer, path: &str) -> Result<(u16, Value)> {
    let resp = c.get(server.url(path)).send().await?;
    Ok((resp.status().as_u16(), resp.json().await?))
}

/// A streamed request that stays in flight until the returned response is dropped.
async fn in_flight(c: &reqwest::Client, server: &TestServer) -> Result<reqwest::Response> {
    let body = json!({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": true, "stream": true});
    let mut resp = c.post(server.url("/v1/completions")).json(&body).send().await?;
    assert_eq!(resp.status(), 200);
    resp.chunk().await?;
    Ok(resp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_load_health_and_render_answer_as_routers_read_them() -> Result<()> {
    let server = TestServer::start(&["--max-num-seqs", "8"]);
    let c = reqwest::Client::new();

    let (status, info) = get(&c, &server, "/server_info").await?;
    assert_eq!(status, 200, "{info}");
    assert_eq!(get(&c, &server, "/get_server_info").await?.1["model_id"], info["model_id"]);
    assert_eq!(info["model_id"], "smol");
    assert_eq!(info["served_model_name"], info["model_id"]);
    assert_eq!(info["max_running_requests"], 8);
    let (block_size, blocks) =
        (info["kv_block_size"].as_u64().unwrap(), info["num_gpu_blocks"].as_u64().unwrap());
    assert!(block_size > 0 && blocks > 0, "{info}");
    assert_eq!(info["max_total_tokens"].as_u64(), Some(block_size * blocks));
    assert_eq!(info["vllm_config"]["cache_config"]["block_size"].as_u64(), Some(block_size));
    // sglang-router discards the whole answer on a negative or non-integer count.
    for (key, value) in info.as_object().unwrap() {
        assert!(!value.is_number() || value.is_u64(), "{key}: {value}");
    }
    let (status, model) = get(&c, &server, "/model_info").await?;
    assert_eq!(status, 200);
    assert_eq!(get(&c, &server, "/get_model_info").await?.1, model);
    assert_eq!((model["model_type"].as_str(), model["is_generation"].as_bool()), (Some("llama"), Some(true)));
    assert_eq!(model["has_chat_template"], true, "{model}");
    assert_eq!(model["architectures"], json!(["LlamaForCausalLM"]));

    // SGLang's load shape: one rank, idle, then one request in flight.
    let (status, load) = get(&c, &server, "/get_load").await?;
    assert_eq!(status, 200);
    assert_eq!(load, json!([{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]));
    let stream = in_flight(&c, &server).await?;
    let load = get(&c, &server, "/get_load").await?.1;
    assert_eq!(load[0]["num_reqs"], 1, "{load}");
    assert!(load[0]["num_tokens"].as_u64().unwrap() >= block_size, "{load}");
    drop(stream);

    assert_eq!(get(&c, &server, "/health_generate").await?, (200, json!({"status": "ok"})));
    assert_eq!(get(&c, &server, "/ready").await?, (200, json!({"status": "ready"})));

    // Render gives the ids generation runs: the same as /tokenize, and as many as the usage.
    let chat = routed_chat("What is the capital of France?");
    let (status, rendered) = post_json(&c, &server.url("/v1/chat/completions/render"), &chat).await?;
    assert_eq!(status, 200, "{rendered}");
    let ids = rendered["token_ids"].as_array().unwrap().clone();
    assert!(rendered["features"].is_null() && rendered["request_id"].is_string(), "{rendered}");
    assert_eq!(rendered["sampling_params"]["max_tokens"], 4);
    let tokenize = json!({"messages": chat["messages"]});
    let (_, tokens) = post_json(&c, &server.url("/tokenize"), &tokenize).await?;
    assert_eq!(tokens["tokens"].as_array().unwrap(), &ids);
    let (status, answer) = post_json(&c, &server.url("/v1/chat/completions"), &chat).await?;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["prompt_tokens"].as_u64(), Some(ids.len() as u64));

    let completion = json!({"model": "smol", "prompt": ["Hello there", "Bonjour"],
                            "max_tokens": 8, "echo": false, "no_stop_trim": false, "ignore_eos": false,
                            "skip_special_tokens": true, "return_hidden_states": false});
    let (status, rendered) = post_json(&c, &server.url("/v1/completions/render"), &completion).await?;
    assert_eq!(status, 200, "{rendered}");
    assert_eq!(rendered.as_array().map(Vec::len), Some(2));
    for (item, prompt) in rendered.as_array().unwrap().iter().zip(["Hello there", "Bonjour"]) {
        let (_, tokens) = post_json(&c, &server.url("/tokenize"), &json!({"prompt": prompt})).await?;
        assert_eq!(item["token_ids"], tokens["tokens"]);
    }
    let (status, _) = post_json(&c, &server.url("/v1/completions"), &completion).await?;
    assert_eq!(status, 200);

    // Render refuses what generation would refuse, naming the field.
    for (path, body, param) in [
        (
            "/v1/chat/completions/render",
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": 9}),
            "temperature",
        ),
        ("/v1/completions/render", json!({"prompt": "x", "top_p": 0}), "top_p"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "return_hidden_states": true}),
            "return_hidden_states",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "separate_reasoning": false}),
            "separate_reasoning",
        ),
        ("/v1/completions", json!({"prompt": "x", "no_stop_trim": true}), "no_stop_trim"),
    ] {
        let (status, body) = post_json(&c, &server.url(path), &body).await?;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(assert_error_shape(&body)["param"], param, "{path}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_router_load_shape_and_a_flush_that_waits_for_idle() -> Result<()> {
    let server = TestServer::start(&["--get-load-format", "vllm-router", "--metrics-prefix", "vllm"]);
    let c = reqwest::Client::new();
    assert_eq!(get(&c, &server, "/get_load").await?, (200, json!({"load": 0})));

    // Busy: the flush is refused (409) and the load counts the stream.
    let stream = in_flight(&c, &server).await?;
    assert_eq!(get(&c, &server, "/get_load").await?.1, json!({"load": 1}));
    let resp = c.post(server.url("/flush_cache")).send().await?;
    assert_eq!(resp.status(), 409);
    assert_eq!(assert_error_shape(&resp.json().await?)["code"], "conflict");
    drop(stream);

    // A long prompt, twice: the second hits the cache. Flushed, a third misses it.
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(20);
    let body = json!({"prompt": prompt, "max_tokens": 1});
    let hits = |text: &str| metric(text, "vllm:prefix_cache_hits_total", "").unwrap_or(0.0);
    let mut seen = Vec::new();
    for round in 0..3 {
        if round == 2 {
            // Idle once the stream's abort has landed.
            let mut flushed = None;
            for _ in 0..100 {
                let resp = c.post(server.url("/flush_cache")).send().await?;
                if resp.status() == 200 {
                    flushed = Some(resp.json::<Value>().await?);
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            let flushed = flushed.expect("the flush succeeds once idle");
            assert!(flushed["flushed_blocks"].as_u64().unwrap() >= 10, "{flushed}");
        }
        let (status, _) = post_json(&c, &server.url("/v1/completions"), &body).await?;
        assert_eq!(status, 200);
        seen.push(hits(&metrics_text(&c, &server).await?));
    }
    // seen[0]: first run (no hit); seen[1]: a hit; seen[2]: after the flush, no new hit.
    assert!(seen[1] > seen[0] && seen[2] == seen[1], "{seen:?}");
    // vLLM's spelling of the same flush.
    assert_eq!(c.post(server.url("/reset_prefix_cache")).send().await?.status(), 200);
    // The Gateway API Inference Extension's metrics under vLLM's names.
    let text = metrics_text(&c, &server).await?;
    for name in ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"] {
        assert!(metric(&text, name, "").is_some(), "{name} missing");
    }
    assert!(text.contains("vllm:cache_config_info{"), "cache_config_info missing");
    Ok(())
}
