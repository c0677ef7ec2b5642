//! A BERT cross-encoder (`BertForSequenceClassification`, one label) through the engine against
//! transformers: the tiny random checkpoint and float64 scores of
//! scripts/tiny_cross_encoder.py (tests/fixtures/tiny/bert_cross_encoder/). The pairs are
//! tokenized as transformers tokenizes them (truncated longest first), and each pair's score,
//! alone and in one batch with the others, is the reference's sigmoid of its logit.

mod common;

use std::sync::Arc;

use candle_core::Device;
use pagoda_engine::{Engine, EngineConfig, EngineHandle, NoopObserver, Request, Shutdown};
use pagoda_models::{load_model, KvCache, LoadOptions, ModelRunner, PoolingKind};
use pagoda_text::Tokenizer;

use common::repo_root;

const BLOCK_SIZE: usize = 16;

fn model_dir() -> std::path::PathBuf {
    repo_root().join("tests/fixtures/tiny/bert_cross_encoder")
}

fn reference() -> serde_json::Value {
    let path = model_dir().join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn engine() -> EngineHandle {
    let loaded = load_model(&model_dir(), &LoadOptions::default()).unwrap();
    let pooling = *loaded.model.pooling().expect("an encoder");
    assert!(pooling.cross_encoder && pooling.kind == PoolingKind::Cls && !pooling.normalize);
    let num_blocks = 256;
    let cache = KvCache::accounting_only(loaded.model.config(), num_blocks, BLOCK_SIZE);
    let runner = ModelRunner::new(loaded.model, cache, Device::Cpu).unwrap();
    let config = EngineConfig::new(BLOCK_SIZE, num_blocks, 64);
    let tokenizer = Arc::new(Tokenizer::from_dir(model_dir()).unwrap());
    Engine::spawn(config, runner, tokenizer, Arc::new(NoopObserver), Shutdown::new()).unwrap().0
}

fn scores(handle: &EngineHandle, pairs: &[(Vec<u32>, usize)], first_id: u64) -> Vec<f32> {
    let requests = pairs
        .iter()
        .enumerate()
        .map(|(i, (ids, start))| Request::pooling_pair(first_id + i as u64, ids.clone(), *start));
    let mut streams = handle.submit_all(requests.collect()).unwrap();
    streams
        .iter_mut()
        .map(|stream| {
            let pooled = stream.blocking_recv().expect("one event").pooled.expect("a score");
            assert_eq!(pooled.len(), 1);
            pooled[0]
        })
        .collect()
}

#[test]
fn cross_encoder_scores_match_transformers_alone_and_batched() {
    let reference = reference();
    let cases = reference["pairs"].as_array().unwrap();
    let max_len = reference["max_length"].as_u64().unwrap() as usize;
    let tokenizer = Tokenizer::from_dir(model_dir()).unwrap();
    let mut pairs = Vec::new();
    for case in cases {
        let (query, document) = (case["query"].as_str().unwrap(), case["document"].as_str().unwrap());
        let (ids, start) = tokenizer.encode_pair_truncated(query, document, max_len).unwrap();
        let expected: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
        assert_eq!(ids, expected, "token ids of {query:?} / {document:?}");
        let types: Vec<u32> = serde_json::from_value(case["token_type_ids"].clone()).unwrap();
        let start = start.expect("a pair has a second segment");
        assert_eq!(types.iter().position(|&t| t == 1), Some(start), "{query:?} / {document:?}");
        assert!(types[start..].iter().all(|&t| t == 1));
        pairs.push((ids, start));
    }
    assert!(pairs.iter().filter(|(ids, _)| ids.len() == max_len).count() >= 3, "long pairs are cut");

    let handle = engine();
    let batched = scores(&handle, &pairs, 0);
    let mut alone = Vec::new();
    for (i, pair) in pairs.iter().enumerate() {
        alone.extend(scores(&handle, std::slice::from_ref(pair), 100 + i as u64));
    }
    let mut worst = 0f64;
    for (i, case) in cases.iter().enumerate() {
        let want = case["score"].as_f64().unwrap();
        for got in [batched[i], alone[i]] {
            worst = worst.max((f64::from(got) - want).abs());
        }
    }
    eprintln!("largest score deviation {worst:.2e}");
    assert!(worst < 2e-6, "largest score deviation {worst}");
    // The scores differ from pair to pair: the head is not a constant.
    let spread =
        batched.iter().fold(f32::MIN, |a, &b| a.max(b)) - batched.iter().fold(f32::MAX, |a, &b| a.min(b));
    assert!(spread > 0.2, "{batched:?}");
    handle.shutdown().trigger();
}

#[test]
fn without_its_segment_a_pair_scores_differently() {
    // Token types reach the model: the same ids scored as one segment give another score.
    let reference = reference();
    let case = &reference["pairs"][1];
    let ids: Vec<u32> = serde_json::from_value(case["input_ids"].clone()).unwrap();
    let start = ids.iter().position(|&t| t == 3).unwrap() + 1;
    let handle = engine();
    let typed = scores(&handle, &[(ids.clone(), start)], 0)[0];
    let mut streams = handle.submit_all(vec![Request::pooling(1, ids)]).unwrap();
    let untyped = streams[0].blocking_recv().unwrap().pooled.unwrap()[0];
    assert!((f64::from(typed) - case["score"].as_f64().unwrap()).abs() < 2e-6);
    assert!((typed - untyped).abs() > 1e-3, "{typed} vs {untyped}");
    handle.shutdown().trigger();
}
