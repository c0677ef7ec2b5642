//! Pixel tensors and prompt expansions against transformers' PIL processors and Pillow itself,
//! from tests/fixtures/media/ (scripts/tiny_media.py).

mod common;

use common::{f32_le_bytes, manifest, pil_rgb, read, sha256_hex};
use pagoda_media::decode::composite_channel;
use pagoda_media::gemma3::{self, Gemma3Config};
use pagoda_media::idefics3::{self, Idefics3Config};
use pagoda_media::{decode_rgb, Filter, MediaLimits, PixelValues, RgbImage};
use serde_json::Value;

/// Lossy formats decode with different (equally valid) IDCT / colour-conversion arithmetic in
/// zune-jpeg and image-webp than in libjpeg-turbo and libwebp, so their decoded pixels differ by
/// a few levels; everything after decoding is exact. The bound is the largest difference seen on
/// the fixtures, kept tight so a regression shows.
const LOSSY_DECODE_TOLERANCE: u8 = 3;

fn is_lossy(name: &str) -> bool {
    name.ends_with(".jpg") || name == "lossy.webp"
}

#[test]
fn alpha_composite_matches_pil_for_every_value_and_alpha() {
    let table = read("alpha_composite.bin");
    for a in 0..=255u8 {
        for v in 0..=255u8 {
            assert_eq!(composite_channel(v, a), table[a as usize * 256 + v as usize], "value {v} alpha {a}");
        }
    }
}

#[test]
fn decoding_matches_pil_convert_to_rgb() {
    let m = manifest();
    for (name, _) in m["images"].as_object().unwrap() {
        let ours = decode_rgb(&read(name), &MediaLimits::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let pil = pil_rgb(name);
        assert_eq!((ours.width, ours.height), (pil.width, pil.height), "{name}");
        let max_diff = ours.data.iter().zip(&pil.data).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
        if is_lossy(name) {
            assert!(max_diff <= LOSSY_DECODE_TOLERANCE, "{name}: max difference {max_diff}");
        } else {
            assert_eq!(max_diff, 0, "{name} differs from PIL");
        }
    }
}

fn filter(name: &str) -> Filter {
    match name {
        "bilinear" => Filter::Bilinear,
        "bicubic" => Filter::Bicubic,
        "lanczos" => Filter::Lanczos,
        other => panic!("filter {other}"),
    }
}

#[test]
fn resampling_is_bit_exact_with_pillow() {
    let m = manifest();
    let cases = m["resample"].as_array().unwrap();
    assert!(cases.len() >= 20);
    for case in cases {
        let src = pil_rgb(case["image"].as_str().unwrap());
        let (w, h) = (case["width"].as_u64().unwrap() as u32, case["height"].as_u64().unwrap() as u32);
        let ours = src.resized(w, h, filter(case["filter"].as_str().unwrap()));
        let expected = read(case["file"].as_str().unwrap());
        let diffs = ours.data.iter().zip(&expected).filter(|(a, b)| a != b).count();
        assert_eq!(diffs, 0, "{}: {diffs} bytes differ", case["file"]);
        assert_eq!(ours.data.len(), expected.len());
    }
}

fn run_processor(config: &str, kwargs: &Value, image: &RgbImage) -> PixelValues {
    let edge = |key: &str| kwargs[key]["longest_edge"].as_u64().unwrap() as u32;
    match config {
        "idefics3_split" | "idefics3_nosplit" => {
            let cfg = Idefics3Config {
                longest_edge: edge("size"),
                tile_size: edge("max_image_size"),
                do_image_splitting: kwargs["do_image_splitting"].as_bool().unwrap(),
                ..Idefics3Config::default()
            };
            idefics3::preprocess(image, &cfg).pixel_values
        }
        "gemma3_small" | "gemma3_896" => {
            let size = &kwargs["size"];
            let cfg = Gemma3Config {
                height: size["height"].as_u64().unwrap() as u32,
                width: size["width"].as_u64().unwrap() as u32,
                ..Gemma3Config::default()
            };
            gemma3::preprocess(image, &cfg)
        }
        other => panic!("config {other}"),
    }
}

fn shape(entry: &Value) -> Vec<usize> {
    entry["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect()
}

/// From PIL's decoded RGB: the processors themselves, byte for byte (SHA-256 of the float32
/// bytes for every case, raw bytes and sampled values where the fixture has them).
#[test]
fn processors_are_byte_exact_from_the_same_pixels() {
    let m = manifest();
    let cases = m["processors"].as_array().unwrap();
    assert!(cases.len() >= 40);
    for case in cases {
        let (config, name) = (case["config"].as_str().unwrap(), case["image"].as_str().unwrap());
        let ours = run_processor(config, &case["kwargs"], &pil_rgb(name));
        assert_eq!(ours.shape, shape(case), "{config} {name}");
        let bytes = f32_le_bytes(&ours.data);
        if let Some(file) = case["file"].as_str() {
            let expected = read(file);
            let first = bytes.chunks(4).zip(expected.chunks(4)).position(|(a, b)| a != b);
            assert_eq!(first, None, "{config} {name}: first differing value at {first:?}");
        }
        for sample in case["samples"].as_array().into_iter().flatten() {
            let (i, v) = (sample[0].as_u64().unwrap() as usize, sample[1].as_f64().unwrap());
            assert_eq!(f64::from(ours.data[i]), v, "{config} {name} value {i}");
        }
        assert_eq!(sha256_hex(&bytes), case["sha256"].as_str().unwrap(), "{config} {name}");
    }
}

/// From the image files through our decoder: exact for the lossless formats; for JPEG and lossy
/// WebP the decoded pixels differ a little (see `LOSSY_DECODE_TOLERANCE`), and so do the
/// tensors: each value within the decode tolerance scaled by 1/255/0.5.
#[test]
fn processors_from_files_end_to_end() {
    let m = manifest();
    let tolerance = f32::from(LOSSY_DECODE_TOLERANCE) / 255.0 / 0.5 + 1e-6;
    let mut lossy_checked = 0;
    for case in m["processors"].as_array().unwrap() {
        let (config, name) = (case["config"].as_str().unwrap(), case["image"].as_str().unwrap());
        let decoded = decode_rgb(&read(name), &MediaLimits::default()).unwrap();
        let ours = run_processor(config, &case["kwargs"], &decoded);
        if !is_lossy(name) {
            assert_eq!(
                sha256_hex(&f32_le_bytes(&ours.data)),
                case["sha256"].as_str().unwrap(),
                "{config} {name}"
            );
        } else if let Some(file) = case["file"].as_str() {
            let expected: Vec<f32> =
                read(file).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            let worst = ours.data.iter().zip(&expected).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst <= tolerance, "{config} {name}: worst difference {worst}");
            lossy_checked += 1;
        }
    }
    assert!(lossy_checked >= 6);
}

#[test]
fn prompt_expansions_match_the_processors() {
    let m = manifest();
    let cases = m["prompts"].as_array().unwrap();
    let mut idefics = 0;
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let expected = case["expanded"].as_str().unwrap();
        let ours = match case["processor"].as_str().unwrap() {
            "idefics3" => {
                idefics += 1;
                let config = &m["processors"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p["config"] == case["config"])
                    .unwrap()["kwargs"];
                let image = pil_rgb(case["image"].as_str().unwrap());
                let processed = run_idefics3(config, &image);
                let n = prompt.matches(idefics3::IMAGE_TOKEN).count();
                let seq = case["image_seq_len"].as_u64().unwrap() as usize;
                idefics3::expand_prompt(prompt, &vec![processed; n], seq).unwrap()
            }
            "gemma3" => {
                let n = prompt.matches(gemma3::BOI_TOKEN).count();
                gemma3::expand_prompt(prompt, n, case["mm_tokens_per_image"].as_u64().unwrap() as usize)
                    .unwrap()
            }
            other => panic!("processor {other}"),
        };
        assert_eq!(ours, expected, "{case}");
    }
    assert!(idefics >= 6);
}

fn run_idefics3(kwargs: &Value, image: &RgbImage) -> idefics3::Idefics3Image {
    let edge = |key: &str| kwargs[key]["longest_edge"].as_u64().unwrap() as u32;
    let cfg = Idefics3Config {
        longest_edge: edge("size"),
        tile_size: edge("max_image_size"),
        do_image_splitting: kwargs["do_image_splitting"].as_bool().unwrap(),
        ..Idefics3Config::default()
    };
    idefics3::preprocess(image, &cfg)
}

#[test]
fn placeholder_count_mismatch_is_an_error() {
    let err = gemma3::expand_prompt("<start_of_image> and <start_of_image>", 1, 4).unwrap_err();
    assert_eq!(
        err,
        pagoda_media::MediaError::PlaceholderCount { token: gemma3::BOI_TOKEN, placeholders: 2, images: 1 }
    );
}
