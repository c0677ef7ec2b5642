//! Which top-level fields each request body may carry. A field the server does not know is a
//! 400 naming it: a client that asked for something (a schema, tools, a typo'd `max_token`) and
//! got a plain answer could not tell that it was dropped. The known fields are read from the
//! wire type's own schema, so the list cannot drift from what is parsed. A few fields are
//! accepted and ignored, because they never change the output ([`KnownFields::IGNORED`]).
//!
//! A type with `#[serde(flatten)]` parts (chat and completions flatten
//! [`super::VllmExtensions`]) lists them here too, so that a value those parts cannot parse is
//! still named by its field ([`KnownFields::flattened_error`]).

use std::collections::HashSet;
use std::fmt;
use std::sync::LazyLock;

use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use utoipa::openapi::schema::Schema;
use utoipa::openapi::RefOr;
use utoipa::PartialSchema;

use super::{
    ChatCompletionRequest, CompletionRequest, DetokenizeRequest, EmbeddingRequest, OpenAiFields,
    TokenizeRequest, VllmExtensions,
};
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

    /// Where `bytes` (a JSON object) fails to parse as the type's flattened parts, each parsed
    /// on its own: serde's flatten buffers their values and reports a bad one without its path,
    /// so the extractor takes this error instead when it comes first in the body.
    fn flattened_error(_bytes: &[u8]) -> Option<PathError> {
        None
    }

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

/// A parse error with the path to the value at fault.
pub type PathError = serde_path_to_error::Error<serde_json::Error>;

/// Where in the body (line, column) a parse stopped.
pub fn error_position(err: &PathError) -> (usize, usize) {
    (err.inner().line(), err.inner().column())
}

/// Why `bytes` does not parse as `T` alone (its other fields ignored), if it does not.
fn parse_alone<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<PathError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize::<_, T>(&mut de).err()
}

/// The property names of `T`'s schema.
fn schema_properties<T: PartialSchema>() -> HashSet<String> {
    properties_of(T::schema())
}

/// The property names of an object schema, or of every part of an `allOf`: what utoipa makes
/// of a struct with `#[serde(flatten)] #[schema(inline)]` parts.
fn properties_of(schema: RefOr<Schema>) -> HashSet<String> {
    match schema {
        RefOr::T(Schema::Object(object)) => object.properties.into_keys().collect(),
        RefOr::T(Schema::AllOf(all)) => all.items.into_iter().flat_map(properties_of).collect(),
        // Every request type is a plain object (or flattens inline ones); an empty set would
        // refuse everything, which a test would catch at once.
        _ => HashSet::new(),
    }
}

macro_rules! known_fields {
    ($type:ty, $ignored:expr $(, flattened: $($flat:ty),+)?) => {
        impl KnownFields for $type {
            fn fields() -> &'static HashSet<String> {
                static FIELDS: LazyLock<HashSet<String>> = LazyLock::new(schema_properties::<$type>);
                &FIELDS
            }
            const IGNORED: &'static [&'static str] = $ignored;
            $(
            fn flattened_error(bytes: &[u8]) -> Option<PathError> {
                [$(parse_alone::<$flat>(bytes)),+].into_iter().flatten().min_by_key(error_position)
            }
            )?
        }
    };
}

known_fields!(ChatCompletionRequest, IGNORED_BOOKKEEPING, flattened: OpenAiFields, VllmExtensions);
known_fields!(CompletionRequest, IGNORED_BOOKKEEPING, flattened: OpenAiFields, VllmExtensions);
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
        // The flattened shared fields are known to both, the reasoning ones to chat only.
        let mut shared = schema_properties::<VllmExtensions>();
        shared.extend(schema_properties::<OpenAiFields>());
        for f in ["top_k", "guided_regex", "priority", "no_stop_trim", "bootstrap_room", "temperature"] {
            assert!(shared.contains(f), "{f}");
        }
        assert!(shared.is_subset(chat) && shared.is_subset(CompletionRequest::fields()));
        assert!(
            chat.contains("separate_reasoning")
                && !CompletionRequest::fields().contains("separate_reasoning")
        );
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
