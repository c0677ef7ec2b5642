//! Each chat API's image part read into an [`ImageRef`]; a part of the wrong shape is refused
//! naming the field at fault.
//!
//! - OpenAI chat: `{"type": "image_url", "image_url": {"url": ..., "detail": ...}}`, or
//!   `"image_url": "<url>"` (vLLM accepts the bare string too).
//! - Anthropic Messages: `{"type": "image", "source": {"type": "base64", "media_type", "data"}}`
//!   or `{"type": "url", "url"}`.
//! - Responses: `{"type": "input_image", "image_url": "<url>", "detail": ...}`; `file_id` is
//!   refused (this server stores no uploaded images).
//!
//! `detail` (`auto`, `low`, `high`) is accepted and has no effect: the model's processor decides
//! the resolution.

use serde_json::Value;

use super::ImageRef;
use crate::error::InvalidParam;

fn refuse(param: impl Into<String>, message: impl Into<String>) -> InvalidParam {
    InvalidParam::new(param, message)
}

fn check_detail(param: &str, detail: Option<&Value>) -> Result<(), InvalidParam> {
    match detail {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(d)) if matches!(d.as_str(), "auto" | "low" | "high") => Ok(()),
        Some(_) => Err(refuse(format!("{param}.detail"), "`detail` must be `auto`, `low` or `high`")),
    }
}

/// A chat `image_url` part's `image_url` field; `part` names the part (`messages[1].content[0]`).
pub fn chat_image_url(part: &str, image_url: Option<&Value>) -> Result<ImageRef, InvalidParam> {
    let param = format!("{part}.image_url");
    let url = match image_url {
        Some(Value::String(url)) => url,
        Some(Value::Object(obj)) => {
            check_detail(&param, obj.get("detail"))?;
            obj.get("url")
                .and_then(Value::as_str)
                .ok_or_else(|| refuse(format!("{param}.url"), "an `image_url` needs a `url` string"))?
        }
        _ => {
            return Err(refuse(
                &param,
                "an `image_url` part needs `image_url`: {\"url\": \"data:image/png;base64,...\"}",
            ))
        }
    };
    Ok(ImageRef { param, url: url.to_owned() })
}

/// An Anthropic `image` block (`block` names it: `messages[0].content[1]`).
pub fn anthropic_image(block_param: &str, block: &Value) -> Result<ImageRef, InvalidParam> {
    let param = format!("{block_param}.source");
    let source = block
        .get("source")
        .and_then(Value::as_object)
        .ok_or_else(|| refuse(&param, "an `image` block needs a `source` object (`base64` or `url`)"))?;
    let field = |name: &str| source.get(name).and_then(Value::as_str);
    match field("type") {
        Some("base64") => {
            let media_type = field("media_type").ok_or_else(|| {
                refuse(format!("{param}.media_type"), "a base64 source needs a `media_type` string")
            })?;
            let data = field("data")
                .ok_or_else(|| refuse(format!("{param}.data"), "a base64 source needs a `data` string"))?;
            if media_type.contains([',', ';']) {
                return Err(refuse(
                    format!("{param}.media_type"),
                    format!("{media_type:?} is not a media type"),
                ));
            }
            Ok(ImageRef { param, url: format!("data:{media_type};base64,{data}") })
        }
        Some("url") => {
            let url = field("url")
                .ok_or_else(|| refuse(format!("{param}.url"), "a url source needs a `url` string"))?;
            Ok(ImageRef { param: format!("{param}.url"), url: url.to_owned() })
        }
        Some(other) => Err(refuse(
            format!("{param}.type"),
            format!("`{other}` image sources are not supported (use `base64` or `url`)"),
        )),
        None => Err(refuse(format!("{param}.type"), "a source needs a `type` (`base64` or `url`)")),
    }
}

/// A Responses `input_image` part (`part` names it: `input[0].content[1]`).
pub fn responses_input_image(part: &str, value: &Value) -> Result<ImageRef, InvalidParam> {
    check_detail(part, value.get("detail"))?;
    match (value.get("image_url"), value.get("file_id")) {
        (Some(Value::String(url)), _) => {
            Ok(ImageRef { param: format!("{part}.image_url"), url: url.clone() })
        }
        (Some(v), _) if !v.is_null() => {
            Err(refuse(format!("{part}.image_url"), "`image_url` must be a string URL"))
        }
        (_, Some(id)) if !id.is_null() => Err(refuse(
            format!("{part}.file_id"),
            "`file_id` images are not supported by this server; give `image_url` (a data: URL)",
        )),
        _ => Err(refuse(part, "an `input_image` part needs `image_url` (a data: URL)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(r: Result<ImageRef, InvalidParam>) -> String {
        r.unwrap_err().param.unwrap()
    }

    #[test]
    fn chat_forms() {
        let p = "messages[1].content[0]";
        let r = chat_image_url(p, Some(&json!({"url": "data:x", "detail": "low"}))).unwrap();
        assert_eq!(r, ImageRef { param: format!("{p}.image_url"), url: "data:x".into() });
        assert_eq!(chat_image_url(p, Some(&json!("data:y"))).unwrap().url, "data:y");
        assert_eq!(param(chat_image_url(p, None)), format!("{p}.image_url"));
        assert_eq!(param(chat_image_url(p, Some(&json!(5)))), format!("{p}.image_url"));
        assert_eq!(param(chat_image_url(p, Some(&json!({"detail": "low"})))), format!("{p}.image_url.url"));
        assert_eq!(
            param(chat_image_url(p, Some(&json!({"url": "data:x", "detail": "max"})))),
            format!("{p}.image_url.detail")
        );
    }

    #[test]
    fn anthropic_forms() {
        let b = "messages[0].content[1]";
        let r = anthropic_image(
            b,
            &json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}}),
        )
        .unwrap();
        assert_eq!(r, ImageRef { param: format!("{b}.source"), url: "data:image/png;base64,AAA".into() });
        let r = anthropic_image(b, &json!({"source": {"type": "url", "url": "http://h/a.png"}})).unwrap();
        assert_eq!(r.param, format!("{b}.source.url"));
        assert_eq!(param(anthropic_image(b, &json!({}))), format!("{b}.source"));
        assert_eq!(
            param(anthropic_image(b, &json!({"source": {"type": "file", "file_id": "f"}}))),
            format!("{b}.source.type")
        );
        assert_eq!(
            param(anthropic_image(b, &json!({"source": {"type": "base64", "data": "A"}}))),
            format!("{b}.source.media_type")
        );
        assert_eq!(
            param(anthropic_image(
                b,
                &json!({"source": {"type": "base64", "media_type": "image/png;x", "data": "A"}})
            )),
            format!("{b}.source.media_type")
        );
        assert_eq!(
            param(anthropic_image(b, &json!({"source": {"type": "base64", "media_type": "image/png"}}))),
            format!("{b}.source.data")
        );
    }

    #[test]
    fn responses_forms() {
        let p = "input[0].content[1]";
        assert_eq!(
            responses_input_image(p, &json!({"image_url": "data:z", "detail": "auto"})).unwrap().url,
            "data:z"
        );
        assert_eq!(param(responses_input_image(p, &json!({"file_id": "file-1"}))), format!("{p}.file_id"));
        assert_eq!(
            param(responses_input_image(p, &json!({"image_url": {"url": "x"}}))),
            format!("{p}.image_url")
        );
        assert_eq!(param(responses_input_image(p, &json!({}))), p);
        assert_eq!(
            param(responses_input_image(p, &json!({"image_url": "d", "detail": 1}))),
            format!("{p}.detail")
        );
    }
}
