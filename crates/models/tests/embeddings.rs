//! Embeddings through the engine (prefill-only pooling sequences) against float64 numpy
//! references: all-MiniLM-L6-v2 against scripts/golden_embeddings.py (token ids equal,
//! embeddings at cosine >= 0.99999, each input alone and all of them batched together), and
//! SmolLM2 with last and mean pooling against scripts/golden.py's pooling cases.

mod common;

use std::sync::Arc;

use candle_core::Device;
use pagoda_engine::{Engine, EngineConfig, EngineHandle, NoopObserver, Request, Shutdown};
use pagoda_models::{load_model, KvCache, LoadOptions, ModelRunner, Pooling, PoolingKind};
use pagoda_text::Tokenizer;

use common::repo_root;

const BLOCK_SIZE: usize = 16;

fn model_dir() -> std::path::PathBuf {
    let dir = repo_root().join("models/all-MiniLM-L6-v2");
    assert!(dir.join("model.safetensors").exists(), "{} is missing: run `make model-minilm`", dir.display());
    dir
}

fn fixture() -> serde_json::Value {
    let path = repo_root().join("tests/fixtures/embeddings-minilm.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn engine(max_num_batched_tokens: usize) -> EngineHandle {
    let loaded = load_model(&model_dir(), &LoadOptions::default()).unwrap();
    let pooling = *loaded.model.pooling().expect("an encoder");
    assert_eq!(pooling.max_input_tokens, Some(256));
    let num_blocks = 512;
    let cache = KvCache::accounting_only(loaded.model.config(), num_blocks, BLOCK_SIZE);
    let runner = ModelRunner::new(loaded.model, cache, Device::Cpu).unwrap();
    let mut config = EngineConfig::new(BLOCK_SIZE, num_blocks, 256);
    config.max_num_batched_tokens = max_num_batched_tokens;
    config.max_num_seqs = 64;
    let tokenizer = Arc::new(Tokenizer::from_dir(model_dir()).unwrap());
    Engine::spawn(config, runner, tokenizer, Arc::new(NoopObserver), Shutdown::new()).unwrap().0
}

fn embed_all(handle: &EngineHandle, inputs: &[Vec<u32>], first_id: u64) -> Vec<Vec<f32>> {
    let requests =
        inputs.iter().enumerate().map(|(i, ids)| Request::pooling(first_id + i as u64, ids.clone()));
    let mut streams = handle.submit_all(requests.collect()).unwrap();
    streams
        .iter_mut()
        .map(|stream| {
            let event = stream.blocking_recv().expect("one event");
            assert!(event.is_last());
            assert_eq!(event.usage.unwrap().completion_tokens, 0);
            event.pooled.expect("an embedding")
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * y).sum();
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(&mut a.iter().map(|&x| f64::from(x))) * norm(&mut b.iter().copied()))
}

#[test]
fn minilm_embeddings_match_the_reference_alone_and_batched() {
    let fixture = fixture();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 50);
    let tokenizer = Tokenizer::from_dir(model_dir()).unwrap();
    let mut inputs = Vec::new();
    let mut references = Vec::new();
    let mut cut = 0;
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let (ids, truncated) = tokenizer.encode_truncated(text, 256).unwrap();
        let expected: Vec<u32> = serde_json::from_value(case["token_ids"].clone()).unwrap();
        assert_eq!(ids, expected, "token ids of {text:?}");
        cut += usize::from(truncated);
        inputs.push(ids);
        references.push(serde_json::from_value::<Vec<f64>>(case["embedding"].clone()).unwrap());
    }
    assert!(cut >= 3, "the long texts are cut at 256 tokens");

    let handle = engine(2048);
    let batched = embed_all(&handle, &inputs, 0);
    let mut alone = Vec::new();
    for (i, ids) in inputs.iter().enumerate() {
        alone.extend(embed_all(&handle, std::slice::from_ref(ids), 1000 + i as u64));
    }
    let mut worst = (1.0f64, "");
    for (i, case) in cases.iter().enumerate() {
        let text = case["text"].as_str().unwrap();
        for got in [&batched[i], &alone[i]] {
            assert_eq!(got.len(), 384);
            let c = cosine(got, &references[i]);
            if c < worst.0 {
                worst = (c, text);
            }
            let norm: f32 = got.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "normalized: {norm}");
        }
    }
    eprintln!("lowest cosine {:.7} ({:?})", worst.0, worst.1);
    assert!(worst.0 >= 0.99999, "lowest cosine {} for {:?}", worst.0, worst.1);
    handle.shutdown().trigger();
}

#[test]
fn an_encoder_refuses_to_generate_and_bad_ids_fail_only_their_request() {
    let handle = engine(512);
    let generate = Request::new(1, vec![101, 7592, 102], Arc::new(Default::default())).with_max_tokens(4);
    let mut stream = handle.submit(generate).unwrap();
    let event = stream.blocking_recv().unwrap();
    let reason = format!("{:?}", event.finished);
    assert!(reason.contains("embedding model"), "{reason}");
    let mut streams = handle
        .submit_all(vec![Request::pooling(2, vec![101, 40000, 102]), Request::pooling(3, vec![101, 102])])
        .unwrap();
    let bad = streams[0].blocking_recv().unwrap();
    assert!(format!("{:?}", bad.finished).contains("outside the vocabulary"), "{:?}", bad.finished);
    assert_eq!(streams[1].blocking_recv().unwrap().pooled.map(|v| v.len()), Some(384));
    handle.shutdown().trigger();
}

/// SmolLM2 (a decoder) embedding with `--pooling last` and `mean`, mixed into a batch with a
/// generating request: the final-normed hidden states pooled and normalized, against the numpy
/// reference's `pooling_cases` (tests/fixtures/golden.json, scripts/golden.py).
#[test]
fn a_decoder_pools_its_final_hidden_states_like_the_reference() {
    let golden = common::fixture();
    let cases = golden["pooling_cases"].as_array().unwrap();
    for (kind, key) in [(PoolingKind::Last, "last"), (PoolingKind::Mean, "mean")] {
        let mut loaded = load_model(&common::model_path(), &LoadOptions::default()).unwrap();
        loaded.model.set_pooling(Pooling {
            kind,
            normalize: true,
            max_input_tokens: None,
            matryoshka: false,
            cross_encoder: false,
        });
        let cache =
            KvCache::new(loaded.model.config(), 256, BLOCK_SIZE, candle_core::DType::F32, &Device::Cpu)
                .unwrap();
        let runner = ModelRunner::new(loaded.model, cache, Device::Cpu).unwrap();
        let config = EngineConfig::new(BLOCK_SIZE, 256, 2048);
        let tokenizer = Arc::new(Tokenizer::from_gguf(common::model_path()).unwrap());
        let handle =
            Engine::spawn(config, runner, tokenizer, Arc::new(NoopObserver), Shutdown::new()).unwrap().0;
        let prompts: Vec<Vec<u32>> = cases.iter().map(|c| common::ids(&c["prompt_ids"])).collect();
        let generating =
            Request::new(99, prompts[0].clone(), Arc::new(Default::default())).with_max_tokens(4);
        let mut requests = vec![generating];
        requests.extend(prompts.iter().enumerate().map(|(i, p)| Request::pooling(i as u64, p.clone())));
        let mut streams = handle.submit_all(requests).unwrap();
        let mut generated = 0;
        while let Some(event) = streams[0].blocking_recv() {
            generated += event.token_ids.len();
        }
        assert_eq!(generated, 4, "the generating request runs beside the pooling ones");
        for (case, stream) in cases.iter().zip(&mut streams[1..]) {
            let got = stream.blocking_recv().unwrap().pooled.expect("an embedding");
            let reference: Vec<f64> = serde_json::from_value(case[key].clone()).unwrap();
            let c = cosine(&got, &reference);
            assert!(c >= 0.9999, "{key} pooling of {}: cosine {c}", case["name"]);
        }
        handle.shutdown().trigger();
    }
}
