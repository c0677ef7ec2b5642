//! Hostile image inputs against the images server (`images::server`): each is a 400 in its
//! API's error shape naming the part at fault, never a 5xx or a hang, and the server serves an
//! image request afterwards. Then a few hundred fuzzed image parts (`fuzz::images`) on all three
//! APIs: each a 200 or a 400, never a 5xx.

use anyhow::Result;
use serde_json::{json, Value};

use crate::fuzz::images::{fuzz_body, FuzzApi};
use crate::fuzz::rng::Rng;
use crate::harness::post_json;
use crate::images::{client, data_url, fixture, media_dir, server, IMAGE_LIMIT};
use crate::images_corpus::{cut, gif, http_port, jpeg_claiming, png_header};

const CHAT_PART: &str = "messages[0].content[0].image_url";

fn chat_parts(parts: Vec<Value>) -> Value {
    json!({"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": parts}]})
}

fn chat_url(url: &str) -> Value {
    chat_parts(vec![
        json!({"type": "image_url", "image_url": {"url": url}}),
        json!({"type": "text", "text": "hi"}),
    ])
}

fn png_url(bytes: &[u8]) -> Value {
    chat_url(&data_url("image/png", bytes))
}

fn http(path: &str) -> String {
    format!("http://127.0.0.1:{}{path}", http_port())
}

/// (what, route, body, the param the 400 names)
fn cases() -> Vec<(&'static str, &'static str, Value, String)> {
    let chat = "/v1/chat/completions";
    let png = fixture("landscape.png");
    let jpg = fixture("photo.jpg");
    let webp = fixture("lossy.webp");
    let anim = fixture("anim.gif");
    let outside = media_dir().join("secret.png").display().to_string();
    let allowed = media_dir().join("allowed").display().to_string();
    let p = |s: &str| s.to_owned();
    let mut corrupt = png.clone();
    let mid = corrupt.len() / 2;
    corrupt[mid..mid + 64].iter_mut().for_each(|b| *b ^= 0x5A);
    let mut v: Vec<(&'static str, &'static str, Value, String)> = vec![
        ("truncated PNG", chat, png_url(&cut(&png, 0.5)), p(CHAT_PART)),
        ("PNG cut after its header", chat, png_url(&cut(&png, 0.05)), p(CHAT_PART)),
        ("PNG signature only", chat, png_url(&png[..8]), p(CHAT_PART)),
        ("corrupt PNG data", chat, png_url(&corrupt), p(CHAT_PART)),
        ("truncated JPEG", chat, chat_url(&data_url("image/jpeg", &cut(&jpg, 0.6))), p(CHAT_PART)),
        ("truncated WebP", chat, chat_url(&data_url("image/webp", &cut(&webp, 0.5))), p(CHAT_PART)),
        ("truncated GIF", chat, chat_url(&data_url("image/gif", &cut(&anim, 0.3))), p(CHAT_PART)),
        ("zero-size PNG", chat, png_url(&png_header(0, 0, &[])), p(CHAT_PART)),
        ("zero-width PNG", chat, png_url(&png_header(0, 40, &[])), p(CHAT_PART)),
        ("50k x 50k PNG header", chat, png_url(&png_header(50_000, 50_000, &[])), p(CHAT_PART)),
        (
            "50k x 50k JPEG header",
            chat,
            chat_url(&data_url("image/jpeg", &jpeg_claiming(50_000, 50_000))),
            p(CHAT_PART),
        ),
        ("GIF canvas bomb", chat, chat_url(&data_url("image/gif", &gif(16_000, 16_000, 1))), p(CHAT_PART)),
        (
            "animated GIF bomb",
            chat,
            chat_url(&data_url("image/gif", &gif(65_535, 65_535, 2000))),
            p(CHAT_PART),
        ),
        ("empty data URL", chat, chat_url("data:image/png;base64,"), p(CHAT_PART)),
        ("PNG declared as JPEG", chat, chat_url(&data_url("image/jpeg", &png)), p(CHAT_PART)),
        ("JPEG declared as GIF", chat, chat_url(&data_url("image/gif", &jpg)), p(CHAT_PART)),
        (
            "SVG",
            chat,
            chat_url(&data_url("image/svg+xml", b"<svg xmlns='http://www.w3.org/2000/svg'/>")),
            p(CHAT_PART),
        ),
        ("SVG bytes as PNG", chat, png_url(b"<svg xmlns='http://www.w3.org/2000/svg'/>"), p(CHAT_PART)),
        ("BMP", chat, chat_url(&data_url("image/bmp", b"BM\x3a\0\0\0\0\0\0\0\x36\0\0\0")), p(CHAT_PART)),
        ("text as an image", chat, chat_url(&data_url("text/plain", b"hello")), p(CHAT_PART)),
        ("random bytes", chat, png_url(&[7u8; 300]), p(CHAT_PART)),
        ("data URL without base64", chat, chat_url("data:image/png,hello"), p(CHAT_PART)),
        ("bad base64", chat, chat_url("data:image/png;base64,!!!!"), p(CHAT_PART)),
        ("data URL without a comma", chat, chat_url("data:image/png;base64"), p(CHAT_PART)),
        ("host not allowed", chat, chat_url("http://example.com/cat.png"), p(CHAT_PART)),
        ("https host not allowed", chat, chat_url("https://example.com/cat.png"), p(CHAT_PART)),
        (
            "localhost is not 127.0.0.1",
            chat,
            chat_url(&format!("http://localhost:{}/ok.png", http_port())),
            p(CHAT_PART),
        ),
        ("redirect to a host not allowed", chat, chat_url(&http("/to-localhost")), p(CHAT_PART)),
        ("redirect to another address", chat, chat_url(&http("/to-elsewhere")), p(CHAT_PART)),
        ("redirect to file://", chat, chat_url(&http("/to-file")), p(CHAT_PART)),
        ("redirect loop", chat, chat_url(&http("/loop")), p(CHAT_PART)),
        ("fetched SVG", chat, chat_url(&http("/svg")), p(CHAT_PART)),
        ("fetched HTML", chat, chat_url(&http("/html")), p(CHAT_PART)),
        ("fetched truncated PNG", chat, chat_url(&http("/truncated.png")), p(CHAT_PART)),
        ("fetched 50k x 50k header", chat, chat_url(&http("/huge-header.png")), p(CHAT_PART)),
        ("fetched body declared too large", chat, chat_url(&http("/declared-huge")), p(CHAT_PART)),
        ("fetch that stalls", chat, chat_url(&http("/stall")), p(CHAT_PART)),
        ("fetched empty body", chat, chat_url(&http("/empty")), p(CHAT_PART)),
        ("fetched 404", chat, chat_url(&http("/missing.png")), p(CHAT_PART)),
        ("file:// outside the allowed dir", chat, chat_url(&format!("file://{outside}")), p(CHAT_PART)),
        (
            "file:// escaping with ..",
            chat,
            chat_url(&format!("file://{allowed}/%2E%2E/secret.png")),
            p(CHAT_PART),
        ),
        ("file:// symlink out", chat, chat_url(&format!("file://{allowed}/link.png")), p(CHAT_PART)),
        ("file:///etc/passwd", chat, chat_url("file:///etc/passwd"), p(CHAT_PART)),
        ("file:// of a directory", chat, chat_url(&format!("file://{allowed}")), p(CHAT_PART)),
        ("file:// of a remote host", chat, chat_url("file://example.com/x.png"), p(CHAT_PART)),
        ("ftp://", chat, chat_url("ftp://127.0.0.1/x.png"), p(CHAT_PART)),
        ("javascript:", chat, chat_url("javascript:alert(1)"), p(CHAT_PART)),
        ("a bare path", chat, chat_url("/etc/passwd"), p(CHAT_PART)),
        (
            "image_url without url",
            chat,
            chat_parts(vec![json!({"type": "image_url", "image_url": {}})]),
            format!("{CHAT_PART}.url"),
        ),
        (
            "image_url a number",
            chat,
            chat_parts(vec![json!({"type": "image_url", "image_url": 5})]),
            p(CHAT_PART),
        ),
        (
            "unknown detail",
            chat,
            chat_parts(vec![
                json!({"type": "image_url", "image_url": {"url": data_url("image/png", &png), "detail": "ultra"}}),
            ]),
            format!("{CHAT_PART}.detail"),
        ),
        (
            "image in an assistant message",
            chat,
            json!({"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": data_url("image/png", &png)}}]}]}),
            p("messages[1].content[0]"),
        ),
        (
            "typed <image> with no image",
            chat,
            chat_parts(vec![json!({"type": "text", "text": "look: <image>"})]),
            p("messages"),
        ),
        (
            "typed <image> beside an image",
            chat,
            chat_parts(vec![
                json!({"type": "image_url", "image_url": {"url": data_url("image/png", &png)}}),
                json!({"type": "text", "text": "and <image>"}),
            ]),
            p("messages"),
        ),
    ];
    let too_many: Vec<Value> = (0..=IMAGE_LIMIT)
        .map(|_| json!({"type": "image_url", "image_url": {"url": data_url("image/png", &png)}}))
        .collect();
    v.push((
        "too many images",
        chat,
        chat_parts(too_many),
        format!("messages[0].content[{IMAGE_LIMIT}].image_url"),
    ));
    // Anthropic: the message leads with the param.
    let anth = |source: Value| json!({"model": "smol", "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}]});
    let count = |source: Value| json!({"model": "smol", "messages": [{"role": "user", "content": [{"type": "image", "source": source}]}]});
    let src = "messages[0].content[0].source";
    let b64 = |b: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::STANDARD, b);
    v.extend([
        ("anthropic truncated PNG", "/v1/messages", anth(json!({"type": "base64", "media_type": "image/png", "data": b64(&cut(&png, 0.5))})), p(src)),
        ("anthropic SVG", "/v1/messages", anth(json!({"type": "base64", "media_type": "image/svg+xml", "data": b64(b"<svg/>")})), p(src)),
        ("anthropic wrong media_type", "/v1/messages", anth(json!({"type": "base64", "media_type": "image/gif", "data": b64(&png)})), p(src)),
        ("anthropic no media_type", "/v1/messages", anth(json!({"type": "base64", "data": b64(&png)})), format!("{src}.media_type")),
        ("anthropic file source", "/v1/messages", anth(json!({"type": "file", "file_id": "file_1"})), format!("{src}.type")),
        ("anthropic url not allowed", "/v1/messages", anth(json!({"type": "url", "url": "http://example.com/a.png"})), format!("{src}.url")),
        ("anthropic count_tokens bomb", "/v1/messages/count_tokens", count(json!({"type": "base64", "media_type": "image/png", "data": b64(&png_header(50_000, 50_000, &[]))})), p(src)),
    ]);
    let resp = |part: Value| json!({"model": "smol", "max_output_tokens": 2, "input": [{"role": "user", "content": [part]}]});
    v.extend([
        (
            "responses file_id",
            "/v1/responses",
            resp(json!({"type": "input_image", "file_id": "file-1"})),
            p("input[0].content[0].file_id"),
        ),
        (
            "responses image_url object",
            "/v1/responses",
            resp(json!({"type": "input_image", "image_url": {"url": "x"}})),
            p("input[0].content[0].image_url"),
        ),
        (
            "responses truncated JPEG",
            "/v1/responses",
            resp(json!({"type": "input_image", "image_url": data_url("image/jpeg", &cut(&jpg, 0.5))})),
            p("input[0].content[0].image_url"),
        ),
        (
            "responses host not allowed",
            "/v1/responses",
            resp(json!({"type": "input_image", "image_url": "https://example.com/a.png"})),
            p("input[0].content[0].image_url"),
        ),
    ]);
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_images_are_400s_naming_the_part() -> Result<()> {
    let c = client();
    let s = server();
    let all = cases();
    assert!(all.len() >= 40, "{} cases", all.len());
    let mut failures = Vec::new();
    for (what, route, body, param) in &all {
        let started = std::time::Instant::now();
        let (status, out) = post_json(&c, &s.url(route), body).await?;
        let named = if route.starts_with("/v1/messages") {
            out["type"] == "error"
                && out["error"]["type"] == "invalid_request_error"
                && out["error"]["message"].as_str().is_some_and(|m| m.starts_with(param.as_str()))
        } else {
            out["error"]["param"] == param.as_str() && out["error"]["type"] == "invalid_request_error"
        };
        if status != 400 || !named || started.elapsed().as_secs() > 10 {
            failures.push(format!(
                "{what}: {status} in {:?}, wanted 400 naming {param}: {out}",
                started.elapsed()
            ));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases:\n{}", failures.len(), all.len(), failures.join("\n"));
    // Healthy after: /health, and an image from the allowed host (a redirect within it).
    assert_eq!(c.get(s.url("/health")).send().await?.status(), 200);
    let (status, out) = post_json(&c, &s.url("/v1/chat/completions"), &chat_url(&http("/to-ok"))).await?;
    assert_eq!(status, 200, "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn fuzzed_image_parts_never_fail_the_server() -> Result<()> {
    let c = client();
    let s = server();
    let seed = 0x1A6E_5EED;
    let mut bad = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    for i in 0..240 {
        let mut rng = Rng::for_case(seed, i);
        let api = *rng.pick(&[FuzzApi::Chat, FuzzApi::Messages, FuzzApi::Responses]);
        let (route, body) = fuzz_body(&mut rng, api);
        let (status, out) = post_json(&c, &s.url(route), &body).await?;
        match status {
            200 => accepted += 1,
            400 => refused += 1,
            _ => bad.push(format!("case {i} {route}: {status} {out}")),
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    // Both outcomes occur: the mutations leave some images whole and break others.
    assert!(accepted >= 10 && refused >= 10, "{accepted} accepted, {refused} refused");
    assert_eq!(c.get(s.url("/health")).send().await?.status(), 200);
    Ok(())
}
