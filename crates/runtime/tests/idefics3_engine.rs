//! The tiny Idefics3 (tests/fixtures/tiny/idefics3, scripts/tiny_vlm.py) loaded as `pagoda
//! serve` loads it and run through the engine with `Request.images`: greedy tokens equal
//! transformers' (reference.json) with the prompt whole and in prefill chunks that cut the
//! images, the same image again hits the encoder cache and the prefix cache, two images with
//! equal tokens give different tokens, text-only prompts run, and a text model refuses images.

use std::path::PathBuf;
use std::sync::Arc;

use pagoda_engine::{
    split_placeholders, FinishReason, ImageHash, ImageInput, NoopObserver, PixelTensor, Request,
    RequestError, SamplingParams, Shutdown, StopConditions, Usage,
};
use pagoda_runtime::{EngineArgs, LoadedRuntime, Runtime, VisionProcessor};
use serde_json::Value;

const IMAGE_TOKEN: u32 = 512;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/idefics3")
}

fn reference() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("reference.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// The model loaded as the server loads it, prefilling at most `budget` tokens a step.
fn load(model: PathBuf, budget: usize) -> LoadedRuntime {
    load_in(model, budget, 64)
}

/// [`load`] with a cache of `blocks` blocks of 16 tokens.
fn load_in(model: PathBuf, budget: usize, blocks: usize) -> LoadedRuntime {
    let args = EngineArgs {
        model: Some(model.display().to_string()),
        max_num_batched_tokens: Some(budget),
        max_num_seqs: Some(8),
        num_gpu_blocks_override: Some(blocks),
        ..EngineArgs::default()
    };
    LoadedRuntime::load(&args.settings().unwrap().runtime_options().unwrap()).unwrap()
}

fn start(budget: usize) -> Runtime {
    load(dir(), budget).start(Arc::new(NoopObserver), Shutdown::new()).unwrap()
}

/// The reference's pixel input `name` as the engine takes it, filling `positions`.
fn image(reference: &Value, name: &str, positions: Arc<[u32]>) -> ImageInput {
    let entry = reference["images"].as_array().unwrap().iter().find(|i| i["name"] == name).unwrap();
    let bytes = std::fs::read(dir().join(entry["file"].as_str().unwrap())).unwrap();
    let data = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let shape = entry["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
    let pixels = PixelTensor { shape, data };
    ImageInput {
        hash: ImageHash::of_pixels(&pixels),
        pixels: Arc::new(pixels),
        placeholder_positions: positions,
    }
}

/// The reference prompt (both prompts have the same ids) with image `name`, greedy, for the
/// reference's number of tokens.
fn request(runtime: &Runtime, reference: &Value, name: &str) -> Request {
    request_for(runtime, reference, ids(&reference["prompts"][0]["ids"]), name)
}

/// `prompt` (one image's placeholders) with image `name`, greedy.
fn request_for(runtime: &Runtime, reference: &Value, prompt: Vec<u32>, name: &str) -> Request {
    let positions = split_placeholders(&prompt, IMAGE_TOKEN, &[48]).unwrap().remove(0);
    let max_tokens = reference["greedy_tokens"].as_u64().unwrap() as usize;
    let mut r = Request::new(runtime.engine.next_request_id(), prompt, Arc::new(SamplingParams::default()))
        .with_max_tokens(max_tokens)
        .with_stop(StopConditions { ignore_eos: true, ..StopConditions::default() });
    r.images = vec![image(reference, name, positions)];
    r
}

/// Runs `r` to the end: its tokens and usage.
fn run(runtime: &Runtime, r: Request) -> (Vec<u32>, Usage) {
    let mut stream = runtime.engine.submit(r).unwrap();
    let (mut tokens, mut usage) = (Vec::new(), None);
    while let Some(event) = stream.blocking_recv() {
        assert!(!matches!(event.finished, Some(FinishReason::Error(_))), "failed: {:?}", event.finished);
        tokens.extend(event.token_ids);
        usage = event.usage.or(usage);
    }
    (tokens, usage.unwrap())
}

fn greedy(reference: &Value, name: &str) -> Vec<u32> {
    let p = reference["prompts"].as_array().unwrap().iter().find(|p| p["image"] == name).unwrap();
    ids(&p["greedy"])
}

#[test]
fn the_vision_spec_comes_from_the_model_directory() {
    let loaded = load(dir(), 256);
    let spec = loaded.vision().expect("the tiny Idefics3 takes images");
    assert_eq!((spec.image_token.as_str(), spec.image_token_id, spec.image_seq_len), ("<image>", 512, 16));
    let VisionProcessor::Idefics3(p) = &spec.processor;
    assert_eq!((p.tile_size, p.longest_edge, p.do_image_splitting), (64, 128, true));
    assert!(loaded.engine_config.images);
}

/// The prompt whole (budget 256), then in chunks of 13 and 29 tokens that start and end
/// inside the image's tiles.
#[test]
fn greedy_tokens_with_an_image_match_transformers_whole_and_in_chunks() {
    let reference = reference();
    for budget in [256, 13, 29] {
        let runtime = start(budget);
        for name in ["a", "b"] {
            let (tokens, usage) = run(&runtime, request(&runtime, &reference, name));
            assert_eq!(tokens, greedy(&reference, name), "image {name}, budget {budget}");
            assert_eq!(usage.cached_prompt_tokens, 0, "image {name}, budget {budget}: no block is shared");
        }
        // Each image is encoded once, whatever the chunks; later chunks over it hit the cache.
        let cache = runtime.encoder_cache.snapshot();
        assert_eq!((cache.misses, cache.entries), (2, 2), "budget {budget}");
        assert_eq!(cache.hits > 0, budget < 70, "budget {budget}: {} hits", cache.hits);
    }
}

#[test]
fn the_same_image_again_hits_the_encoder_cache_and_the_prefix_cache() {
    let reference = reference();
    let runtime = start(256);
    let (first, _) = run(&runtime, request(&runtime, &reference, "a"));
    let before = runtime.encoder_cache.snapshot();
    assert_eq!((before.hits, before.misses, before.entries), (0, 1, 1));
    // 70 prompt tokens: the four full blocks of 16 come from the prefix cache, which holds all
    // of the image's placeholders (8..62): the encoder is not even asked.
    let (again, usage) = run(&runtime, request(&runtime, &reference, "a"));
    assert_eq!(again, first);
    assert_eq!(usage.cached_prompt_tokens, 64);
    assert_eq!(runtime.encoder_cache.snapshot(), before);
    // The image one position later: no block matches, the features come from the encoder cache.
    let shifted: Vec<u32> = [510].into_iter().chain(ids(&reference["prompts"][0]["ids"])).collect();
    let (_, usage) = run(&runtime, request_for(&runtime, &reference, shifted, "a"));
    assert_eq!(usage.cached_prompt_tokens, 0);
    let after = runtime.encoder_cache.snapshot();
    assert_eq!((after.hits, after.misses), (1, 1));
    // The other image, in the same tokens: no block before the image's first placeholder
    // (position 8, in block 0) is shared, and the encoder runs.
    let (other, usage) = run(&runtime, request(&runtime, &reference, "b"));
    assert_eq!(other, greedy(&reference, "b"));
    assert_ne!(other, first);
    assert_eq!(usage.cached_prompt_tokens, 0);
    assert_eq!(runtime.encoder_cache.snapshot().misses, 2);
}

/// Three requests of two samples each in a cache that cannot hold them all: sequences are
/// preempted and recomputed (their images encoded again or taken from the encoder cache, their
/// blocks from the prefix cache), and every sample still gives the reference's tokens.
#[test]
fn preemption_and_samples_keep_the_reference_tokens() {
    let reference = reference();
    let runtime = load_in(dir(), 32, 16).start(Arc::new(NoopObserver), Shutdown::new()).unwrap();
    let names = ["a", "b", "a"];
    let requests = names.iter().map(|name| request(&runtime, &reference, name).with_n(2)).collect();
    let streams = runtime.engine.submit_all(requests).unwrap();
    for (mut stream, name) in streams.into_iter().zip(names) {
        let mut samples = [Vec::new(), Vec::new()];
        while let Some(event) = stream.blocking_recv() {
            assert!(!matches!(event.finished, Some(FinishReason::Error(_))), "{:?}", event.finished);
            samples[event.index].extend(event.token_ids);
        }
        assert_eq!(samples, [greedy(&reference, name), greedy(&reference, name)], "image {name}");
    }
    assert!(runtime.engine.stats().num_preemptions > 0, "nothing was preempted");
}

#[test]
fn text_prompts_run_and_a_text_model_refuses_images() {
    let reference = reference();
    let runtime = start(256);
    let text = Request::new(
        runtime.engine.next_request_id(),
        vec![510, 119, 421],
        Arc::new(SamplingParams::default()),
    )
    .with_max_tokens(5)
    .with_stop(StopConditions { ignore_eos: true, ..StopConditions::default() });
    assert_eq!(run(&runtime, text).0.len(), 5);

    let llama = dir().join("../llama");
    let text_model = load(llama, 256);
    assert!(text_model.vision().is_none() && !text_model.engine_config.images);
    let runtime = text_model.start(Arc::new(NoopObserver), Shutdown::new()).unwrap();
    let err = runtime.engine.submit(request(&runtime, &reference, "a")).unwrap_err();
    let expected = RequestError::Image(pagoda_engine::ImageRequestError::NoVisionEncoder).to_string();
    assert!(err.to_string().contains(&expected), "{err}");
}
