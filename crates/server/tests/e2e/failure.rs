//! An engine whose model fails: the request in flight gets an SSE error event, then the engine
//! is dead and everything answers 503 (`/health` included). The real router and tokenizer, with
//! an executor that fails every step.

use std::sync::Arc;

use anyhow::Result;
use pagoda_engine::{
    Engine, EngineConfig, ExecutorError, ModelExecutor, NoopObserver, ScheduledBatch, Shutdown, StepOutput,
};
use pagoda_server::app::{router, HttpOptions};
use pagoda_server::metrics::{Metrics, MetricsPrefix};
use pagoda_server::prompt::PromptBuilder;
use pagoda_server::state::{AppState, ModelInfo};
use pagoda_server::validate::Limits;
use pagoda_text::{ChatTemplate, Tokenizer};
use serde_json::{json, Value};

use crate::harness::{assert_error_shape, model_path, SseReader};

struct BrokenModel;

impl ModelExecutor for BrokenModel {
    fn execute(&mut self, _batch: &ScheduledBatch) -> Result<StepOutput, ExecutorError> {
        Err(ExecutorError::Fatal("the accelerator caught fire".into()))
    }

    fn block_size(&self) -> usize {
        16
    }

    fn num_blocks(&self) -> usize {
        64
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_engine_means_stream_error_then_503() -> Result<()> {
    let tokenizer = Arc::new(Tokenizer::from_gguf(model_path())?);
    let template =
        ChatTemplate::new(tokenizer.chat_template().unwrap(), tokenizer.bos_token(), tokenizer.eos_token())?;
    let shutdown = Shutdown::new();
    let (engine, thread) = Engine::spawn(
        EngineConfig::new(16, 64, 512),
        BrokenModel,
        tokenizer.clone(),
        Arc::new(NoopObserver),
        shutdown.clone(),
    )?;
    let vocab_size = tokenizer.vocab_size();
    let state = Arc::new(AppState {
        disaggregation: None,
        worker: pagoda_server::state::WorkerIdentity {
            instance_id: "broken-1".into(),
            get_load_format: Default::default(),
            kv_cache_dtype: "auto".into(),
            kv_events: None,
        },
        loras: Default::default(),
        embedding: None,
        traces: None,
        grammars: pagoda_server::grammars::Grammars::unavailable(),
        tool_format: pagoda_text::ToolCallFormat::Generic,
        reasoning: None,
        hosted_tools: Default::default(),
        mcp_servers: Vec::new(),
        mcp_timeout: std::time::Duration::from_secs(30),
        stats: Default::default(),
        media: pagoda_server::media::build::MediaState::new(Default::default(), None)
            .map_err(anyhow::Error::msg)?,
        responses: pagoda_server::responses::store::ResponseStore::new(8),
        eos_token_ids: tokenizer.eos_token_ids().to_vec(),
        prompts: PromptBuilder::new(tokenizer, Some(Arc::new(template)), vocab_size, 2048),
        engine,
        metrics: Arc::new(Metrics::new(MetricsPrefix::Pagoda, "broken", 512)?),
        model: ModelInfo {
            served_names: vec!["broken".into()],
            root: "-".into(),
            created: 0,
            architecture: "llama".into(),
            context_length: 64,
        },
        limits: Limits {
            vocab_size,
            max_model_len: 512,
            max_logprobs: 20,
            max_num_seqs: 64,
            priority_scheduling: false,
        },
    });
    let http = HttpOptions {
        api_key: None,
        allowed_origins: vec!["*".into()],
        max_request_body_bytes: 1 << 20,
        web_ui: true,
        ..Default::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let app = router(state, &http);
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stop_rx.await;
            })
            .await
    });
    let c = reqwest::Client::new();
    let url = format!("http://{addr}");
    assert_eq!(c.get(format!("{url}/health")).send().await?.status(), 200);
    assert_eq!(c.get(format!("{url}/ready")).send().await?.status(), 200);

    // The request in flight: role chunk, then the error event, then [DONE].
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": true});
    let resp = c.post(format!("{url}/v1/chat/completions")).json(&body).send().await?;
    assert_eq!(resp.status(), 200);
    let mut reader = SseReader::new(resp);
    let mut saw_error = false;
    while let Some(data) = reader.next_data().await? {
        if data == "[DONE]" {
            break;
        }
        let event: Value = serde_json::from_str(&data)?;
        if event.get("error").is_some() {
            let error = assert_error_shape(&event);
            assert_eq!(error["code"], "engine_unavailable", "{event}");
            saw_error = true;
        }
    }
    assert!(saw_error, "no error event in the stream");

    // The engine is dead now: 503 everywhere, in the OpenAI shape.
    // A router's checks see it too: not ready, no token, no flush.
    for path in ["/health", "/ready", "/health_generate", "/flush_cache"] {
        let resp = c.get(format!("{url}{path}")).send().await?;
        assert_eq!(resp.status(), 503, "{path}");
        assert_error_shape(&resp.json().await?);
    }
    for (path, body) in [
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "hi"}]})),
        ("/v1/completions", json!({"prompt": "hi", "stream": true})),
        ("/v1/responses", json!({"input": "hi", "stream": true})),
    ] {
        let resp = c.post(format!("{url}{path}")).json(&body).send().await?;
        assert_eq!(resp.status(), 503, "{path}");
        let json: Value = resp.json().await?;
        assert_eq!(assert_error_shape(&json)["code"], "engine_unavailable");
    }

    // Anthropic's clients see their own overloaded error, 529.
    let body = json!({"model": "broken", "max_tokens": 4, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let resp = c.post(format!("{url}/v1/messages")).json(&body).send().await?;
    assert_eq!(resp.status().as_u16(), 529);
    assert_eq!(resp.headers()["retry-after"], "1");
    let json: Value = resp.json().await?;
    assert_eq!(
        (json["type"].as_str(), json["error"]["type"].as_str()),
        (Some("error"), Some("overloaded_error")),
        "{json}"
    );

    let _ = stop_tx.send(());
    server.await??;
    shutdown.trigger();
    thread.join().map_err(|_| anyhow::anyhow!("engine thread panicked"))?;
    Ok(())
}
