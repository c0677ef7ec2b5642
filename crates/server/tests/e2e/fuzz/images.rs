//! Fuzzed image parts: the committed test images truncated, bit-flipped or with their headers
//! scrambled, under random declared types, sent as data URLs, or URLs of every scheme (the
//! images server's allowed HTTP host included). The main fuzz suite puts them into chat
//! messages for the text-only model (a 400 naming the part); `images_hostile.rs` sends whole
//! requests of them to the vision model (each a 200 or a 400).

use serde_json::{json, Value};

use super::rng::Rng;

const FIXTURES: [(&str, &str); 5] = [
    ("landscape.png", "image/png"),
    ("photo.jpg", "image/jpeg"),
    ("lossy.webp", "image/webp"),
    ("anim.gif", "image/gif"),
    ("palette.png", "image/png"),
];
const MIMES: [&str; 8] =
    ["image/png", "image/jpeg", "image/webp", "image/gif", "image/svg+xml", "image/bmp", "text/plain", ""];

fn fixture(name: &str) -> Vec<u8> {
    let path = crate::sdk::repo_root().join("tests/fixtures/media").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Image bytes, mutated or not, and the MIME type to declare for them.
fn image_bytes(rng: &mut Rng) -> (Vec<u8>, &'static str) {
    let (name, mime) = *rng.pick(&FIXTURES);
    let mut bytes = fixture(name);
    match rng.below(6) {
        0 => {}
        1 => bytes.truncate(rng.below(bytes.len() as u64) as usize),
        2 => {
            for _ in 0..rng.range(1, 8) {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] ^= 1 << rng.below(8);
            }
        }
        3 => {
            let end = bytes.len().min(64);
            for b in bytes[8.min(end)..end].iter_mut() {
                if rng.chance(20) {
                    *b = rng.below(256) as u8;
                }
            }
        }
        4 => bytes = (0..rng.range(0, 200)).map(|_| rng.below(256) as u8).collect(),
        _ => bytes.truncate(rng.below(40) as usize),
    }
    let mime = if rng.chance(80) { mime } else { *rng.pick(&MIMES) };
    (bytes, mime)
}

fn b64(bytes: &[u8]) -> String {
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, bytes)
}

/// An image URL: mostly a data URL of [`image_bytes`], else a URL of some other kind.
pub fn image_url(rng: &mut Rng) -> String {
    match rng.below(10) {
        0 => format!(
            "http://127.0.0.1:{}/{}",
            crate::images_corpus::http_port(),
            rng.pick(&["ok.png", "loop", "svg", "x"])
        ),
        1 => rng
            .pick(&["http://example.com/a.png", "file:///etc/passwd", "ftp://h/a", "", "data:", "a.png"])
            .to_string(),
        _ => {
            let (bytes, mime) = image_bytes(rng);
            format!("data:{mime};base64,{}", b64(&bytes))
        }
    }
}

/// A chat `image_url` part, sometimes of a wrong shape.
pub fn chat_part(rng: &mut Rng) -> Value {
    let url = image_url(rng);
    match rng.below(8) {
        0 => json!({"type": "image_url", "image_url": url}),
        1 => {
            json!({"type": "image_url", "image_url": {"url": url, "detail": rng.pick(&["low", "high", "auto", "max"])}})
        }
        2 => json!({"type": "image_url"}),
        _ => json!({"type": "image_url", "image_url": {"url": url}}),
    }
}

#[derive(Debug, Clone, Copy)]
pub enum FuzzApi {
    Chat,
    Messages,
    Responses,
}

/// A whole request with 1 to 3 fuzzed images and some text, for `api`: its route and body.
pub fn fuzz_body(rng: &mut Rng, api: FuzzApi) -> (&'static str, Value) {
    let n = rng.range(1, 3);
    match api {
        FuzzApi::Chat => {
            let mut parts: Vec<Value> = (0..n).map(|_| chat_part(rng)).collect();
            parts.push(json!({"type": "text", "text": "what is it"}));
            let stream = rng.chance(30);
            let body = json!({"model": "smol", "max_tokens": 2, "stream": stream,
                              "messages": [{"role": "user", "content": parts}]});
            ("/v1/chat/completions", body)
        }
        FuzzApi::Messages => {
            let blocks: Vec<Value> = (0..n)
                .map(|_| {
                    let (bytes, mime) = image_bytes(rng);
                    match rng.below(6) {
                        0 => json!({"type": "image", "source": {"type": "url", "url": image_url(rng)}}),
                        1 => json!({"type": "image", "source": {"type": "base64", "media_type": mime}}),
                        _ => json!({"type": "image", "source": {"type": "base64", "media_type": mime, "data": b64(&bytes)}}),
                    }
                })
                .collect();
            let body =
                json!({"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": blocks}]});
            ("/v1/messages", body)
        }
        FuzzApi::Responses => {
            let parts: Vec<Value> = (0..n)
                .map(|_| match rng.below(6) {
                    0 => json!({"type": "input_image", "file_id": "file-x"}),
                    _ => json!({"type": "input_image", "image_url": image_url(rng)}),
                })
                .collect();
            let body = json!({"model": "smol", "max_output_tokens": 2, "store": false,
                              "input": [{"role": "user", "content": parts}]});
            ("/v1/responses", body)
        }
    }
}
