//! `POST /v1/chat/completions` wire types: the request, the `chat.completion` response and the
//! `chat.completion.chunk` stream events.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::common::{OpenAiFields, Usage};
use super::extensions::VllmExtensions;
use super::sampling::{CommonParams, FinishReason, StopReason};

/// A chat completion request. Unknown top-level fields are refused (see [`super::fields`]).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    /// The served model name; may be omitted when the server serves one model.
    #[serde(default, deserialize_with = "super::common::optional_string")]
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    /// Deprecated alias of `max_completion_tokens`. Absent: whatever the context allows.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    /// Return the log probability of each output token.
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// 0 to 20 alternatives per token; needs `logprobs: true`.
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    /// Functions the model may call: `[{"type": "function", "function": {"name", "description",
    /// "parameters"}}]`.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<serde_json::Value>,
    /// `none`, `auto` (the default with tools), `required`, or `{"type": "function", "function":
    /// {"name": ...}}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<serde_json::Value>,
    /// Allow more than one call in one answer. Default true.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// End the rendered prompt with the opening of the assistant's turn. Default true.
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Continue the last (assistant) message instead of starting a new one; excludes
    /// `add_generation_prompt: true`. Default false.
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    /// Extra variables for the chat template.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// SGLang extension that routers add at its default, `true` (with a reasoning parser, the
    /// reasoning is apart from the content); only that is served.
    #[serde(default)]
    pub separate_reasoning: Option<bool>,
    /// SGLang extension that routers add at its default, `true` (reasoning streams as it is
    /// generated); only that is served.
    #[serde(default)]
    pub stream_reasoning: Option<bool>,
    /// vLLM extension, default `true` (the reasoning is returned); only that is served.
    #[serde(default)]
    pub include_reasoning: Option<bool>,
    // The fields completions requests carry too (plain comments: a doc comment would wrap the
    // inlined schema in a `oneOf` to hang its description on).
    #[serde(flatten)]
    #[schema(inline)]
    pub openai: OpenAiFields,
    #[serde(flatten)]
    #[schema(inline)]
    pub extensions: VllmExtensions,
}

impl ChatCompletionRequest {
    /// The router-added SGLang fields, for [`super::router_fields::check`]: the shared ones and
    /// the reasoning ones only chat has.
    pub fn router_fields(&self) -> Vec<super::router_fields::RouterField> {
        let mut fields = self.extensions.router_fields();
        fields.extend([
            ("separate_reasoning", self.separate_reasoning, true),
            ("stream_reasoning", self.stream_reasoning, true),
            ("include_reasoning", self.include_reasoning, true),
        ]);
        fields
    }

    pub fn common(&self) -> CommonParams {
        CommonParams {
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            max_tokens_param: if self.max_completion_tokens.is_some() {
                "max_completion_tokens"
            } else {
                "max_tokens"
            },
            logprobs_param: "top_logprobs",
            logprobs: if self.logprobs.unwrap_or(false) {
                Some(self.top_logprobs.unwrap_or(0))
            } else {
                None
            },
            best_of: None,
            ..self.openai.common(&self.extensions)
        }
    }
}

/// One message of the conversation: a JSON object (serde would also fill it from an array, by
/// position; see the `Deserialize` impl below).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(remote = "Self")]
pub struct ChatMessage {
    /// `system`, `developer` (same as `system`), `user`, `assistant` or `tool`.
    pub role: String,
    /// A string or an array of `{"type": "text", "text": ...}` parts; may be null for an
    /// assistant message.
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default)]
    pub name: Option<String>,
    /// Tool calls of an assistant message: `[{"id", "type": "function", "function": {"name",
    /// "arguments"}}]`, the arguments a JSON object as a string.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<serde_json::Value>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

impl Serialize for ChatMessage {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ChatMessage::serialize(self, serializer)
    }
}

impl<'de> Deserialize<'de> for ChatMessage {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ChatMessage;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a message object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ChatMessage, A::Error> {
                ChatMessage::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// Message content: a string or an array of parts.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One content part: `text`, or `image_url` (user messages, on a vision model).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, ToSchema)]
pub struct ContentPart {
    /// `text` or `image_url`.
    pub r#type: String,
    #[serde(default)]
    pub text: Option<String>,
    /// `{"url": "data:image/png;base64,...", "detail": "auto"}` (or the URL as a string): a
    /// `data:` URL, or `http(s)://` / `file://` where the server's flags allow them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub image_url: Option<serde_json::Value>,
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MessageContent;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of content parts")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<MessageContent, E> {
                Ok(MessageContent::Text(v.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MessageContent, A::Error> {
                let mut parts = Vec::new();
                while let Some(p) = seq.next_element::<ContentPart>()? {
                    parts.push(p);
                }
                Ok(MessageContent::Parts(parts))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// `chat.completion`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionResponse {
    pub id: String,
    /// Always `chat.completion`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    /// With `prompt_logprobs`: vLLM's list for the rendered prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub prompt_logprobs: Option<super::PromptLogprobs>,
    /// Disaggregated serving: on a prefill instance's answer, where a decode instance fetches
    /// the prompt's KV (a router copies it into the decode request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub kv_transfer_params: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatChoice {
    pub index: usize,
    pub message: ResponseMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<FinishReason>,
    /// The stop string or stop token id that ended the choice, if any.
    pub stop_reason: Option<StopReason>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ResponseMessage {
    /// Always `assistant`.
    pub role: String,
    /// `null` when the model only called tools.
    pub content: Option<String>,
    /// The model's reasoning, with a reasoning parser (`--reasoning-parser`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// A call the model made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolCall {
    /// `call_...`, unique.
    pub id: String,
    /// Always `function`.
    pub r#type: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments: a JSON object, as a string.
    pub arguments: String,
}

/// A piece of a streamed tool call: the first for a call has its `id`, `type` and `name`; later
/// ones add `arguments` text, which concatenates to the whole JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#type: Option<String>,
    pub function: FunctionCallDelta,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FunctionCallDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// `chat.completion.chunk`: one SSE event of a streamed chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    /// Only on the last chunk, and only with `stream_options.include_usage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatChunkChoice {
    pub index: usize,
    pub delta: ChatDelta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<FinishReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
}

/// The new part of the assistant message. The first chunk of a choice carries the role.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// Chat logprobs: one entry per output token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<ChatTopLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_accepts_string_parts_or_null() {
        let m: ChatMessage = serde_json::from_str(r#"{"role":"user","content":"hi"}"#).unwrap();
        assert_eq!(m.content, Some(MessageContent::Text("hi".into())));
        let m: ChatMessage =
            serde_json::from_str(r#"{"role":"user","content":[{"type":"text","text":"a"}]}"#).unwrap();
        assert!(matches!(m.content, Some(MessageContent::Parts(ref p)) if p.len() == 1));
        let m: ChatMessage = serde_json::from_str(r#"{"role":"assistant","content":null}"#).unwrap();
        assert_eq!(m.content, None);
        let err = serde_json::from_str::<ChatMessage>(r#"{"role":"user","content":5}"#).unwrap_err();
        assert!(err.to_string().contains("a string or an array of content parts"), "{err}");
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let r: ChatCompletionRequest = serde_json::from_str(
            r#"{"messages":[],"max_tokens":5,"max_completion_tokens":7,"logprobs":true,"top_logprobs":3}"#,
        )
        .unwrap();
        let c = r.common();
        assert_eq!(c.max_tokens, Some(7));
        assert_eq!(c.max_tokens_param, "max_completion_tokens");
        assert_eq!(c.logprobs, Some(3));
    }

    #[test]
    fn unknown_fields_parse_and_are_refused_by_the_extractor() {
        let r: ChatCompletionRequest = serde_json::from_str(
            r#"{"messages":[{"role":"user","content":"x"}],"parallel_tool_calls":true}"#,
        )
        .unwrap();
        assert_eq!(r.messages.len(), 1);
    }

    #[test]
    fn chunk_omits_absent_usage_and_role() {
        let chunk = ChatCompletionChunk {
            id: "c".into(),
            object: "chat.completion.chunk".into(),
            created: 0,
            model: "m".into(),
            choices: vec![ChatChunkChoice {
                index: 0,
                delta: ChatDelta { content: Some("x".into()), ..Default::default() },
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            }],
            usage: None,
        };
        let v = serde_json::to_value(&chunk).unwrap();
        assert!(v.get("usage").is_none());
        assert!(v["choices"][0]["delta"].get("role").is_none());
        assert!(v["choices"][0]["finish_reason"].is_null());
    }
}
