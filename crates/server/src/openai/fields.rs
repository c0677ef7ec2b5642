//! Which top-level fields each request body may carry. A field the server does not know is a
//! 400 naming it: a client that asked for something (a schema, tools, a typo'd `max_token`) and
//! got a plain answer could not tell that it was dropped. The known fields are read from the
//! wire type's own schema, so the list cannot drift from what is parsed. A few fields are
//! accepted and ignored, because they never change the output ([`KnownFields::IGNORED`]).

use std::collections::HashSet;
use std::fmt;
use std::sync::LazyLock;

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use utoipa::openapi::schema::Schema;
use utoipa::openapi::RefOr;
use utoipa::PartialSchema;

use super::{ChatCompletionRequest, CompletionRequest, DetokenizeRequest, EmbeddingRequest, TokenizeRequest};
use crate::error::InvalidParam;

/// Bookkeeping fields of OpenAI's API that have no effect on what is generated: accepted and
/// ignored (vLLM also ignores them).
pub const IGNORED_BOOKKEEPING: &[&str] =
    &["user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key", "request_id"];

/// A request body type with a fixed set of top-level fields.
pub trait KnownFields {
    /// Fields the type parses (each is honoured, or refused by the handler when set to
    /// something the server cannot do).
    fn fields() -> &'static HashSet<String>;

    /// Fields accepted and ignored.
    const IGNORED: &'static [&'static str] = &[];

    /// The first field of `keys` that is neither known nor ignored, as a 400.
    fn check_keys(keys: &[String]) -> Result<(), InvalidParam> {
        let fields = Self::fields();
        match keys.iter().find(|k| !fields.contains(k.as_str()) && !Self::IGNORED.contains(&k.as_str())) {
            None => Ok(()),
            Some(key) => Err(InvalidParam::new(
                key.clone(),
                format!("Unknown or unsupported parameter `{key}`; this server does not accept it."),
            )),
        }
    }
}

/// The property names of `T`'s schema.
fn schema_properties<T: PartialSchema>() -> HashSet<String> {
    match T::schema() {
        RefOr::T(Schema::Object(object)) => object.properties.keys().cloned().collect(),
        // Every request type is a plain object; an empty set would refuse everything, which a
        // test would catch at once.
        _ => HashSet::new(),
    }
}

macro_rules! known_fields {
    ($type:ty, $ignored:expr) => {
        impl KnownFields for $type {
            fn fields() -> &'static HashSet<String> {
                static FIELDS: LazyLock<HashSet<String>> = LazyLock::new(schema_properties::<$type>);
                &FIELDS
            }
            const IGNORED: &'static [&'static str] = $ignored;
        }
    };
}

known_fields!(ChatCompletionRequest, IGNORED_BOOKKEEPING);
known_fields!(CompletionRequest, IGNORED_BOOKKEEPING);
known_fields!(TokenizeRequest, &[]);
known_fields!(EmbeddingRequest, &["user"]);
known_fields!(super::ScoreRequest, &["user"]);
known_fields!(super::RerankRequest, &["user"]);
known_fields!(DetokenizeRequest, &[]);
known_fields!(super::LoadLoraAdapterRequest, &[]);
known_fields!(super::UnloadLoraAdapterRequest, &[]);
known_fields!(crate::anthropic::wire::MessagesRequest, &[]);
known_fields!(crate::anthropic::wire::CountTokensRequest, &[]);
// `client_metadata` is Codex's own bookkeeping (session and turn ids).
known_fields!(
    crate::responses::wire::ResponsesRequest,
    &["service_tier", "safety_identifier", "prompt_cache_key", "client_metadata"]
);

/// The top-level keys of a JSON object, read without building its values; empty for anything
/// that is not an object.
pub fn top_level_keys(bytes: &[u8]) -> Vec<String> {
    struct Keys(Vec<String>);

    impl<'de> Deserialize<'de> for Keys {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Keys;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                    let mut keys = Vec::new();
                    while let Some(key) = map.next_key::<String>()? {
                        map.next_value::<IgnoredAny>()?;
                        keys.push(key);
                    }
                    Ok(Keys(keys))
                }
            }
            deserializer.deserialize_map(V)
        }
    }

    serde_json::from_slice::<Keys>(bytes).map(|k| k.0).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_come_from_the_schemas() {
        let chat = ChatCompletionRequest::fields();
        for f in
            ["messages", "max_tokens", "stream_options", "tools", "response_format", "chat_template_kwargs"]
        {
            assert!(chat.contains(f), "{f}");
        }
        assert!(CompletionRequest::fields().contains("prompt"));
        assert!(TokenizeRequest::fields().contains("add_generation_prompt"));
        assert!(DetokenizeRequest::fields().contains("tokens"));
    }

    #[test]
    fn unknown_keys_are_named_and_bookkeeping_is_ignored() {
        let keys = top_level_keys(br#"{"messages": [{"a": {"deep": 1}}], "user": "u", "max_token": 5}"#);
        assert_eq!(keys, ["messages", "user", "max_token"]);
        let err = ChatCompletionRequest::check_keys(&keys).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("max_token"));
        assert!(ChatCompletionRequest::check_keys(&keys[..2]).is_ok());
        let err = DetokenizeRequest::check_keys(&["tokens".into(), "user".into()]).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("user"));
        assert!(top_level_keys(b"[1, 2]").is_empty());
    }
}
