//! Byte-level mutations of a valid body (truncated, duplicated keys, trailing garbage, comments,
//! random bytes, invalid UTF-8, another encoding) and HTTP-level ones around it (API key, in
//! `Authorization` or Anthropic's `x-api-key`, method, path, content type, headers, an oversized
//! body, the GET routes).

use serde_json::Value;

use super::gen::{Case, Endpoint, Expect, Rng, API_KEY, BODY_LIMIT, MODEL};

fn invalid(case: &mut Case, what: String, body: Vec<u8>) {
    case.what.push(what);
    case.body = body;
    case.expect = Expect::Status(400);
}

/// Mutates the (valid) body's bytes.
pub fn mutate_bytes(rng: &mut Rng, case: &mut Case) {
    let body = std::mem::take(&mut case.body);
    match rng.below(12) {
        0 | 1 => {
            let at = rng.below(body.len() as u64) as usize;
            invalid(case, format!("truncate at byte {at}"), body[..at].to_vec());
        }
        2 => {
            // The first field again, after the opening brace: serde rejects duplicate fields.
            let value: Value = serde_json::from_slice(&body).expect("the base body is JSON");
            match value.as_object().and_then(|m| m.iter().next()) {
                Some((key, v)) => {
                    let dup = format!("{{{}:{},", Value::from(key.as_str()), v);
                    invalid(case, format!("duplicate key {key:?}"), [dup.as_bytes(), &body[1..]].concat());
                }
                None => invalid(case, "trailing garbage".into(), [&body[..], b"x"].concat()),
            }
        }
        3 => {
            let options: &[&[u8]] = &[b"x", b"}", b",", b"{}", b"\0", b"]", b"null", b"{\"a\":1}"];
            let junk = *rng.pick(options);
            invalid(case, format!("append {:?}", String::from_utf8_lossy(junk)), [&body[..], junk].concat());
        }
        4 => {
            // Whitespace around JSON is still JSON: the expectation stays.
            case.what.push("pad with whitespace".into());
            case.body = [&b" \n\t\r"[..], &body, b"\r\n "].concat();
        }
        5 => {
            case.what.push("UTF-8 byte order mark first".into());
            case.body = [&b"\xef\xbb\xbf"[..], &body].concat();
            case.expect = Expect::Any;
        }
        6 => {
            let options: &[&[u8]] = &[b"/* c */", b"// c\n", b"# c\n"];
            let comment = *rng.pick(options);
            invalid(case, "a comment after the brace".into(), [&b"{"[..], comment, &body[1..]].concat());
        }
        7 => {
            let len = rng.below(256);
            let junk: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
            invalid(case, format!("{len} random bytes"), junk);
        }
        8 => {
            let at = rng.below(body.len() as u64) as usize;
            let mut body = body;
            body[at] = rng.below(256) as u8;
            case.what.push(format!("byte {at} replaced"));
            case.body = body;
            case.expect = Expect::Any;
        }
        9 => {
            // Invalid UTF-8 at the start of a string the server parses (an ignored field's
            // strings may be skipped unchecked).
            let options: &[&[u8]] = &[b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xc0\xaf", b"\xe2\x82"];
            let bad = *rng.pick(options);
            let value_start =
                ["model", "prompt", "content", "text", "input", "system"].iter().find_map(|key| {
                    let pattern = format!("\"{key}\":\"");
                    body.windows(pattern.len())
                        .position(|w| w == pattern.as_bytes())
                        .map(|at| at + pattern.len())
                });
            match value_start {
                Some(at) => {
                    let what = format!("invalid UTF-8 {bad:?} in a string");
                    invalid(case, what, [&body[..at], bad, &body[at..]].concat());
                }
                None => invalid(case, "empty body".into(), Vec::new()),
            }
        }
        10 => {
            let utf16: Vec<u8> =
                String::from_utf8_lossy(&body).encode_utf16().flat_map(|u| u.to_le_bytes()).collect();
            invalid(case, "the body in UTF-16".into(), utf16);
        }
        _ => {
            let quoted = body.iter().map(|&b| if b == b'"' { b'\'' } else { b }).collect();
            invalid(case, "single quotes".into(), quoted);
        }
    }
}

/// Mutates the HTTP request around a valid body.
pub fn mutate_http(rng: &mut Rng, case: &mut Case) {
    match rng.below(8) {
        0 | 1 => {
            case.headers.retain(|(name, _)| *name != "x-api-key");
            if rng.chance(25) {
                // Anthropic's header, which is judged alone when it is there.
                let bearer = Some(format!("Bearer {API_KEY}"));
                let (key, auth, expect) = rng
                    .pick(&[
                        (API_KEY.to_owned(), None, case.expect),
                        (API_KEY.to_owned(), Some("Bearer wrong".to_owned()), case.expect),
                        ("wrong".to_owned(), bearer.clone(), Expect::Status(401)),
                        (String::new(), bearer, Expect::Status(401)),
                        (format!("Bearer {API_KEY}"), None, Expect::Status(401)),
                    ])
                    .clone();
                case.what.push(format!("x-api-key {key:?}, authorization {auth:?}"));
                case.headers.push(("x-api-key", key));
                case.auth = auth;
                case.expect = expect;
                return;
            }
            let (auth, expect) = rng
                .pick(&[
                    (None, Expect::Status(401)),
                    (Some("Bearer wrong".to_owned()), Expect::Status(401)),
                    (Some(format!("Basic {API_KEY}")), Expect::Status(401)),
                    (Some("Bearer".to_owned()), Expect::Status(401)),
                    (Some(format!("Token {API_KEY}")), Expect::Status(401)),
                    (Some(format!("Bearer {API_KEY}x")), Expect::Status(401)),
                    (Some(API_KEY.to_owned()), Expect::Status(401)),
                    (Some(format!("bearer {API_KEY}")), Expect::Any),
                    (Some(format!("Bearer  {API_KEY}")), Expect::Any),
                ])
                .clone();
            case.what.push(format!("authorization {auth:?}"));
            case.auth = auth;
            case.expect = expect;
        }
        2 => {
            let (method, expect) = *rng.pick(&[
                ("GET", Expect::Status(405)),
                ("PUT", Expect::Status(405)),
                ("DELETE", Expect::Status(405)),
                ("PATCH", Expect::Status(405)),
                ("HEAD", Expect::Any),
                ("OPTIONS", Expect::Any),
                ("FOO", Expect::Any),
                ("PROPFIND", Expect::Any),
            ]);
            case.what.push(format!("method {method}"));
            case.method = method;
            case.endpoint = Endpoint::Other;
            case.expect = expect;
        }
        3 => {
            let long = format!("/v1/{}", "x".repeat(2000));
            let path = rng
                .pick(&[
                    "/v1/chat/completion",
                    "/v1/chat/completions/",
                    "/v1/Chat/Completions",
                    "/v2/completions",
                    "/v1//completions",
                    "//v1/completions",
                    "/tokenize/x",
                    "/v1/completions%00",
                    "/%ff%fe",
                    "/v1/chat/completions/../../health",
                    "/v1/models/smol",
                    "/v1/message",
                    "/v1/messages/",
                    "/v1/Messages",
                    "/v1/messages/count_tokens/",
                    "/v1/messages/batches",
                    "/v1/response",
                    "/v1/responses/",
                    "/v1/responses//input_items",
                    "/v1/responses/x/input_items/y",
                    "/v1/models/%ff",
                    "/",
                    long.as_str(),
                ])
                .to_string();
            case.what.push(format!("path {path:.60}"));
            case.path = path;
            case.endpoint = Endpoint::Other;
            case.expect = Expect::Any;
        }
        4 => {
            let path = *rng.pick(&[
                "/health",
                "/version",
                "/v1/models",
                "/v1/models/smol",
                "/metrics",
                "/openapi.json",
                "/health?x=%ff",
            ]);
            case.what.push(format!("GET {path}"));
            case.method = "GET";
            case.path = path.to_owned();
            case.endpoint = Endpoint::Info;
            case.content_type = None;
            case.body = Vec::new();
            case.expect = Expect::Status(200);
        }
        5 => {
            let ct = rng.pick(&[
                None,
                Some("text/plain"),
                Some("application/x-www-form-urlencoded"),
                Some("multipart/form-data; boundary=x"),
                Some("application/json; charset=utf-16"),
                Some(""),
                Some("*/*"),
                Some("application/xml"),
            ]);
            case.what.push(format!("content-type {ct:?}"));
            case.content_type = ct.map(str::to_owned);
            case.expect = Expect::Any;
        }
        6 => {
            let size = BODY_LIMIT + 1 + rng.below(28 * 1024) as usize;
            let (key, value) = match case.endpoint {
                Endpoint::Chat | Endpoint::Messages | Endpoint::CountTokens => {
                    ("messages", r#"[{"role":"user","content":""#)
                }
                Endpoint::Responses => ("input", "\""),
                _ => ("prompt", "\""),
            };
            let head = format!(r#"{{"model":"{MODEL}","max_tokens":1,"{key}":{value}"#);
            let tail = if key == "messages" { "\"}]}" } else { "\"}" };
            let filler = "a".repeat(size.saturating_sub(head.len() + tail.len()));
            case.what.push(format!("a {size}-byte body"));
            case.body = format!("{head}{filler}{tail}").into_bytes();
            case.expect = Expect::Status(413);
        }
        _ => {
            let (name, value) = rng
                .pick(&[
                    ("x-request-id", "r".repeat(300)),
                    ("x-request-id", "has space".to_owned()),
                    ("x-request-id", String::new()),
                    ("accept", "text/event-stream".to_owned()),
                    ("accept", "application/xml".to_owned()),
                    ("accept-encoding", "gzip, br".to_owned()),
                    ("origin", "http://evil.example".to_owned()),
                    ("x-forwarded-for", "::1".to_owned()),
                    ("anthropic-version", "2023-06-01".to_owned()),
                    ("anthropic-version", "1999-01-01".to_owned()),
                    ("anthropic-beta", "tools-2024-04-04,x".to_owned()),
                ])
                .clone();
            case.what.push(format!("header {name}: {value:.40}"));
            case.headers.retain(|(n, _)| *n != name);
            case.headers.push((name, value));
            if rng.chance(30) {
                case.path.push_str("?stream=true&model=x&%ff");
                case.what.push("query string".into());
            }
        }
    }
}
