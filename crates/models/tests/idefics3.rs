//! Idefics3 (SmolVLM) against Hugging Face transformers on the tiny random-weight checkpoint of
//! scripts/tiny_vlm.py (tests/fixtures/tiny/idefics3; the reference is transformers' float64
//! forward pass): the image features (vision encoder + connector), the logits at every position
//! of a text+image prompt through the paged decoder (whole prompt, and in prefill chunks that cut
//! through the images), the greedy continuation, and that the image path is live.

mod common;

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use common::{argmax, ids, repo_root, rows, BLOCK_SIZE};
use pagoda_models::idefics3::Idefics3;
use pagoda_models::multimodal::PlaceholderEmbeds;
use pagoda_models::{ForwardInput, KvCache, ModelError};
use pagoda_ops::AttentionMetadata;
use serde_json::Value;

/// The text models' tolerance (tests/tiny_architectures.rs), on logits and on features.
const TOLERANCE: f32 = 1e-4;

fn dir() -> PathBuf {
    repo_root().join("tests/fixtures/tiny/idefics3")
}

fn reference() -> Value {
    let path = dir().join("reference.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/tiny_vlm.py)", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn model() -> Idefics3 {
    Idefics3::load(&dir(), &Device::Cpu, DType::F32).expect("the tiny Idefics3 loads")
}

/// The pixel input `name` of the reference: raw f32 little-endian, shaped as listed.
fn pixels(reference: &Value, name: &str) -> Tensor {
    let image = reference["images"].as_array().unwrap().iter().find(|i| i["name"] == name).unwrap();
    let bytes = std::fs::read(dir().join(image["file"].as_str().unwrap())).unwrap();
    let values: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    let shape: Vec<usize> =
        image["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
    Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
}

/// Largest absolute difference of two equally shaped matrices (fails on a shape mismatch).
fn max_diff(what: &str, ours: &[Vec<f32>], reference: &[Vec<f32>]) -> f32 {
    assert_eq!(ours.len(), reference.len(), "{what}: rows");
    ours.iter()
        .zip(reference)
        .flat_map(|(a, b)| {
            assert_eq!(a.len(), b.len(), "{what}: row width");
            a.iter().zip(b).map(|(x, y)| (x - y).abs())
        })
        .fold(0f32, f32::max)
}

/// One sequence in its own KV cache (blocks 0.., so a position's slot is the position).
struct Seq {
    cache: KvCache,
    computed: usize,
}

impl Seq {
    fn new(model: &Idefics3) -> Self {
        let cache = KvCache::new(model.text_config(), 16, BLOCK_SIZE, DType::F32, &Device::Cpu).unwrap();
        Self { cache, computed: 0 }
    }

    /// Runs `tokens` as the next chunk, with `placeholders` (rows counted from the chunk's
    /// start), and returns the logits of every row of the chunk.
    fn step(
        &mut self,
        model: &Idefics3,
        tokens: &[u32],
        placeholders: Option<&PlaceholderEmbeds>,
    ) -> pagoda_models::Result<Vec<Vec<f32>>> {
        let dev = Device::Cpu;
        let (start, n) = (self.computed, tokens.len());
        let end = start + n;
        let table: Vec<u32> = (0..end.div_ceil(BLOCK_SIZE) as u32).collect();
        let positions: Vec<u32> = (start as u32..end as u32).collect();
        let groups = self.cache.layout().num_groups();
        let attention: Vec<AttentionMetadata> = (0..groups)
            .map(|_| {
                AttentionMetadata::new(
                    positions.clone(),
                    vec![0, n as u32],
                    vec![end as u32],
                    &[&table],
                    &dev,
                )
                .unwrap()
            })
            .collect();
        let input_ids = Tensor::new(tokens, &dev)?;
        let positions = Tensor::new(positions.as_slice(), &dev)?;
        let logits_rows = Tensor::arange(0u32, n as u32, &dev)?;
        let input = ForwardInput {
            input_ids: &input_ids,
            positions: &positions,
            attention: &attention,
            logits_rows: Some(&logits_rows),
            num_layers: None,
            hidden_rows: None,
            lora: None,
            placeholders,
        };
        let logits = model.forward(&input, &self.cache)?;
        self.computed = end;
        Ok(logits.to_vec2::<f32>()?)
    }
}

#[test]
fn image_features_match_transformers() {
    let (model, reference) = (model(), reference());
    assert_eq!(
        model.config().tokens_per_tile(),
        reference["image_tokens_per_tile"].as_u64().unwrap() as usize
    );
    for image in reference["images"].as_array().unwrap() {
        let name = image["name"].as_str().unwrap();
        let ours = model.image_features(&pixels(&reference, name)).unwrap().to_vec2::<f32>().unwrap();
        let diff = max_diff(&format!("image {name} features"), &ours, &rows(&image["features"]));
        eprintln!("image {name}: largest feature difference {diff:.1e}");
        assert!(diff <= TOLERANCE, "image {name}: features differ by {diff} (tolerance {TOLERANCE})");
    }
}

/// Every position's logits of the text+image prompt (whole prompt in one chunk, then in chunks
/// of 13 tokens that start and end inside the images), and the 16-token greedy continuation
/// decoded on the cache of the whole-prompt prefill.
#[test]
fn text_and_image_prompt_matches_transformers() {
    let (model, reference) = (model(), reference());
    let image_token = reference["image_token_id"].as_u64().unwrap() as u32;
    assert_eq!(model.config().image_token_id, image_token);
    for prompt in reference["prompts"].as_array().unwrap() {
        let name = prompt["name"].as_str().unwrap();
        let prompt_ids = ids(&prompt["ids"]);
        let expected = rows(&prompt["logits"]);
        let features = model.image_features(&pixels(&reference, prompt["image"].as_str().unwrap())).unwrap();

        let mut seq = Seq::new(&model);
        let all = PlaceholderEmbeds::for_placeholders(&prompt_ids, image_token, &features).unwrap();
        let got = seq.step(&model, &prompt_ids, Some(&all)).unwrap();
        let whole = max_diff(&format!("{name} whole prompt"), &got, &expected);
        assert!(whole <= TOLERANCE, "{name}: whole-prompt logits differ by {whole}");

        let mut tokens = prompt_ids.clone();
        let mut next = argmax(got.last().unwrap());
        let mut greedy = Vec::new();
        for _ in 0..prompt["greedy"].as_array().unwrap().len() {
            greedy.push(next);
            tokens.push(next);
            next = argmax(&seq.step(&model, &[next], None).unwrap()[0]);
        }
        assert_eq!(greedy, ids(&prompt["greedy"]), "{name}: greedy continuation");

        let mut chunked = Seq::new(&model);
        let mut worst = 0f32;
        for start in (0..prompt_ids.len()).step_by(13) {
            let end = (start + 13).min(prompt_ids.len());
            let part = PlaceholderEmbeds::for_chunk(&prompt_ids, start..end, image_token, &features).unwrap();
            let got = chunked.step(&model, &prompt_ids[start..end], part.as_ref()).unwrap();
            worst = worst.max(max_diff(&format!("{name} chunk {start}..{end}"), &got, &expected[start..end]));
        }
        assert!(worst <= TOLERANCE, "{name}: chunked-prefill logits differ by {worst}");
        eprintln!("{name}: largest logit difference {whole:.1e} (whole prompt), {worst:.1e} (chunks of 13)");
    }
}

/// The two images (same placeholder count) give the same logits before the first placeholder
/// and clearly different ones from it on, so the features reach the decoder.
#[test]
fn different_images_give_different_logits() {
    let (model, reference) = (model(), reference());
    let image_token = model.config().image_token_id;
    let prompt_ids = ids(&reference["prompts"][0]["ids"]);
    let first = prompt_ids.iter().position(|&t| t == image_token).unwrap();
    let logits = |image: &str| {
        let features = model.image_features(&pixels(&reference, image)).unwrap();
        let p = PlaceholderEmbeds::for_placeholders(&prompt_ids, image_token, &features).unwrap();
        Seq::new(&model).step(&model, &prompt_ids, Some(&p)).unwrap()
    };
    let (a, b) = (logits("a"), logits("b"));
    assert_eq!(a[..first], b[..first], "positions before the image");
    let after = max_diff("a against b", &a[first..], &b[first..]);
    assert!(after > 1.0, "the two images change the logits by only {after}");
    let without = Seq::new(&model).step(&model, &prompt_ids, None).unwrap();
    assert!(max_diff("a against no image", &a[first..], &without[first..]) > 1.0);
}

#[test]
fn bad_image_inputs_are_errors_naming_the_problem() {
    let (model, reference) = (model(), reference());
    let image_token = model.config().image_token_id;
    let small = Tensor::zeros((1, 3, 32, 32), DType::F32, &Device::Cpu).unwrap();
    let err = model.image_features(&small).unwrap_err();
    assert!(matches!(err, ModelError::ImageInput(_)) && err.to_string().contains("[1, 3, 32, 32]"), "{err}");
    let none = Tensor::zeros((0, 3, 64, 64), DType::F32, &Device::Cpu).unwrap();
    assert!(matches!(model.image_features(&none), Err(ModelError::ImageInput(_))));

    // One image's features for a prompt whose placeholders are those of three tiles less one.
    let features = model.image_features(&pixels(&reference, "a")).unwrap();
    let mut prompt_ids = ids(&reference["prompts"][0]["ids"]);
    let last = prompt_ids.iter().rposition(|&t| t == image_token).unwrap();
    prompt_ids[last] = 1;
    let err = PlaceholderEmbeds::for_placeholders(&prompt_ids, image_token, &features).unwrap_err();
    assert!(err.to_string().contains("47 image placeholder tokens but the images give 48"), "{err}");

    // Feature rows aimed at text tokens.
    let misplaced = PlaceholderEmbeds::new(vec![0], features.narrow(0, 0, 1).unwrap()).unwrap();
    let err = Seq::new(&model).step(&model, &prompt_ids, Some(&misplaced)).unwrap_err();
    assert!(err.to_string().contains("row 0, which is not an image placeholder"), "{err}");
}
