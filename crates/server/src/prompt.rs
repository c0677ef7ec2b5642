//! From a request's prompt to token ids: chat messages are checked, rendered with the chat
//! template and tokenized; completion prompts are tokenized (or checked, when given as ids).
//! The CPU work runs on the blocking pool (`spawn_blocking`), never on the async runtime, at most
//! one tokenization per core at a time, and a text's tokenization stops as soon as it is certainly
//! longer than the context: memory spent on one prompt is bounded by `max_model_len`, not by the
//! size of the body that brought it.

use std::sync::Arc;

use pagoda_text::{BoundedEncodeError, ChatMessage, ChatTemplate, ChatTemplateError, Tokenizer};
use tokio::sync::Semaphore;

use crate::error::{ApiError, InvalidParam};
use crate::media::collect::PartsText;
use crate::media::ImageCollector;
use crate::openai::{self, MessageContent, PromptInput};

/// One prompt, ready for the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizedPrompt {
    /// The prompt text (rendered chat, or the completion prompt; decoded when given as ids).
    pub text: String,
    pub token_ids: Vec<u32>,
    /// The images whose features fill the prompt's placeholder tokens (chat with images only).
    pub images: crate::media::build::PromptImages,
}

/// Rewrites a rendered chat prompt before it is tokenized (a vision model's image placeholders
/// expanded to their tokens' text).
pub type Expand = Box<dyn FnOnce(String) -> Result<String, ApiError> + Send>;

/// Checks roles and content and flattens content parts into plain text, as the template
/// expects it; image parts are refused (a text-only model).
pub fn chat_messages(messages: &[openai::ChatMessage]) -> Result<Vec<ChatMessage>, InvalidParam> {
    chat_messages_with(messages, &mut ImageCollector::text_only())
}

/// [`chat_messages`], handing `image_url` parts to `images` (which leaves a placeholder in the
/// text, or refuses them).
pub fn chat_messages_with(
    messages: &[openai::ChatMessage],
    images: &mut ImageCollector,
) -> Result<Vec<ChatMessage>, InvalidParam> {
    if messages.is_empty() {
        return Err(InvalidParam::new("messages", "messages must contain at least one message"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                "tool" => "tool",
                other => {
                    return Err(InvalidParam::new(
                        format!("messages[{i}].role"),
                        format!(
                            "role must be one of system, developer, user, assistant, tool; got {other:?}"
                        ),
                    ))
                }
            };
            let tool_calls = match &m.tool_calls {
                Some(calls) if role == "assistant" => {
                    Some(crate::tools::messages::template_tool_calls(i, calls)?)
                }
                Some(calls) if !calls.is_null() && calls.as_array().is_none_or(|c| !c.is_empty()) => {
                    return Err(InvalidParam::new(
                        format!("messages[{i}].tool_calls"),
                        "only assistant messages have tool calls",
                    ))
                }
                _ => None,
            }
            .filter(|calls| !calls.is_empty());
            let content = match &m.content {
                None if role == "assistant" => String::new(),
                None => {
                    return Err(InvalidParam::new(
                        format!("messages[{i}].content"),
                        format!("a {role} message needs content"),
                    ))
                }
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => {
                    let mut text = PartsText::new("\n");
                    for (j, part) in parts.iter().enumerate() {
                        let param = || format!("messages[{i}].content[{j}]");
                        match part.r#type.as_str() {
                            "text" => text.push_text(part.text.as_ref().ok_or_else(|| {
                                InvalidParam::new(param(), "a text part needs a `text` string")
                            })?),
                            "image_url" if role == "user" => {
                                images.check(&param())?;
                                let image =
                                    crate::media::parts::chat_image_url(&param(), part.image_url.as_ref())?;
                                text.push_image(images.push(&param(), image)?);
                            }
                            "image_url" => {
                                return Err(InvalidParam::new(param(), "only user messages may hold images"))
                            }
                            other => {
                                return Err(InvalidParam::new(
                                    param(),
                                    format!(
                                        "content parts must be `text` or `image_url`, got type {other:?}"
                                    ),
                                ))
                            }
                        }
                    }
                    text.finish()
                }
            };
            let mut message = ChatMessage::new(role, content);
            message.tool_calls = tool_calls;
            message.tool_call_id = m.tool_call_id.clone().filter(|_| role == "tool");
            message.name = m.name.clone();
            Ok(message)
        })
        .collect()
}

/// How a conversation becomes a prompt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatOptions {
    /// End with the opening of the assistant's turn.
    pub add_generation_prompt: bool,
    /// End inside the last (assistant) message, so the model continues it.
    pub continue_final_message: bool,
    /// Add the tokenizer's special tokens on top of the template's.
    pub add_special_tokens: bool,
    /// Extra template variables (`chat_template_kwargs`).
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
}

impl ChatOptions {
    /// The options of a chat completion request, checked against each other and `messages`.
    pub fn of(
        messages: &[ChatMessage],
        add_generation_prompt: Option<bool>,
        continue_final_message: Option<bool>,
        add_special_tokens: Option<bool>,
        template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Result<Self, InvalidParam> {
        let continue_final_message = continue_final_message.unwrap_or(false);
        if continue_final_message {
            if add_generation_prompt == Some(true) {
                return Err(InvalidParam::new(
                    "continue_final_message",
                    "continue_final_message and add_generation_prompt cannot both be true",
                ));
            }
            if messages.last().is_none_or(|m| m.role != "assistant" || m.content.is_empty()) {
                return Err(InvalidParam::new(
                    "continue_final_message",
                    "continue_final_message needs a last message from the assistant with some content",
                ));
            }
        }
        Ok(Self {
            add_generation_prompt: add_generation_prompt.unwrap_or(!continue_final_message),
            continue_final_message,
            add_special_tokens: add_special_tokens.unwrap_or(false),
            template_kwargs: template_kwargs.unwrap_or_default(),
        })
    }
}

/// The tokenizer and chat template, shared by all requests.
#[derive(Clone)]
pub struct PromptBuilder {
    tokenizer: Arc<Tokenizer>,
    template: Option<Arc<ChatTemplate>>,
    /// Number of token ids the model has embeddings for.
    vocab_size: usize,
    /// No prompt can be longer than this many tokens.
    max_model_len: usize,
    /// Tokenizations running at once.
    permits: Arc<Semaphore>,
}

impl std::fmt::Debug for PromptBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptBuilder").field("vocab_size", &self.vocab_size).finish_non_exhaustive()
    }
}

/// Token ids of `text`, or a 400 naming `param` and the text's length when it is longer than
/// `max_model_len` tokens.
fn encode(
    tokenizer: &Tokenizer,
    text: &str,
    add_special_tokens: bool,
    max_model_len: usize,
    param: &'static str,
) -> Result<Vec<u32>, ApiError> {
    tokenizer.encode_bounded(text, add_special_tokens, max_model_len).map_err(|e| match e {
        BoundedEncodeError::TooManyTokens { at_least, total_bytes, .. } => ApiError::PromptTextTooLong {
            bytes: total_bytes,
            at_least_tokens: at_least,
            max_model_len,
            param,
        },
        BoundedEncodeError::Tokenizer(e) => ApiError::invalid(param, e.to_string()),
    })
}

impl PromptBuilder {
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        template: Option<Arc<ChatTemplate>>,
        vocab_size: usize,
        max_model_len: usize,
    ) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self { tokenizer, template, vocab_size, max_model_len, permits: Arc::new(Semaphore::new(cores)) }
    }

    /// Runs `f` on the blocking pool once a tokenization permit is free.
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        // The semaphore is never closed.
        let _permit = self.permits.acquire().await.map_err(|e| ApiError::Internal(e.to_string()))?;
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| ApiError::Internal(format!("tokenizer task failed: {e}")))
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Whether chat requests can be rendered (the model's template, or `--chat-template`).
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Renders the conversation and tokenizes it (the template writes any BOS itself).
    pub async fn chat(
        &self,
        messages: Vec<ChatMessage>,
        options: ChatOptions,
    ) -> Result<TokenizedPrompt, ApiError> {
        self.chat_expanded(messages, options, None, None).await
    }

    /// The number of tokens of the rendered conversation, however many (a count, as Anthropic's
    /// `count_tokens` gives, may exceed the context; the body limit bounds the work).
    pub async fn count_chat(
        &self,
        messages: Vec<ChatMessage>,
        options: ChatOptions,
    ) -> Result<usize, ApiError> {
        Ok(self.chat_expanded(messages, options, Some(usize::MAX), None).await?.token_ids.len())
    }

    /// [`Self::chat`], refusing a prompt of more than `limit` tokens (`None`: the context
    /// length), its rendered text rewritten by `expand` before it is tokenized.
    pub(crate) async fn chat_expanded(
        &self,
        messages: Vec<ChatMessage>,
        options: ChatOptions,
        limit: Option<usize>,
        expand: Option<Expand>,
    ) -> Result<TokenizedPrompt, ApiError> {
        let template = self.template.clone().ok_or_else(|| {
            ApiError::invalid(
                "messages",
                "this model has no chat template; use /v1/completions or start the server with --chat-template",
            )
        })?;
        let tokenizer = self.tokenizer.clone();
        let max_model_len = limit.unwrap_or(self.max_model_len);
        self.blocking(move || {
            let rendered = template.render_with(&messages, options.add_generation_prompt, &options.template_kwargs);
            let mut text = rendered.map_err(|e| match e {
                ChatTemplateError::Raised(m) => ApiError::invalid("messages", m),
                other => ApiError::invalid("messages", other.to_string()),
            })?;
            if options.continue_final_message {
                // Cut what the template closes the last message with (end-of-turn tokens), so
                // that generation continues the message itself.
                let last = messages.last().map(|m| m.content.as_str()).unwrap_or_default();
                let end = text.rfind(last).map(|at| at + last.len()).ok_or_else(|| {
                    ApiError::invalid(
                        "continue_final_message",
                        "the chat template does not render the last message verbatim, so it cannot be continued",
                    )
                })?;
                text.truncate(end);
            }
            if let Some(expand) = expand {
                text = expand(text)?;
            }
            let token_ids = encode(&tokenizer, &text, options.add_special_tokens, max_model_len, "messages")?;
            Ok(TokenizedPrompt { text, token_ids, images: Default::default() })
        })
        .await?
    }

    /// Tokenizes (or checks and decodes) each completion prompt.
    pub async fn completion(
        &self,
        inputs: Vec<PromptInput>,
        add_special_tokens: bool,
    ) -> Result<Vec<TokenizedPrompt>, ApiError> {
        if inputs.is_empty() {
            return Err(ApiError::invalid("prompt", "prompt must not be empty"));
        }
        let tokenizer = self.tokenizer.clone();
        let vocab_size = self.vocab_size;
        let max_model_len = self.max_model_len;
        self.blocking(move || {
            inputs
                .into_iter()
                .map(|input| {
                    let prompt = match input {
                        PromptInput::Text(text) => {
                            let token_ids =
                                encode(&tokenizer, &text, add_special_tokens, max_model_len, "prompt")?;
                            TokenizedPrompt { text, token_ids, images: Default::default() }
                        }
                        PromptInput::Tokens(token_ids) => {
                            if let Some(bad) = token_ids.iter().find(|&&t| t as usize >= vocab_size) {
                                return Err(ApiError::invalid(
                                    "prompt",
                                    format!("token id {bad} is outside the vocabulary (size {vocab_size})"),
                                ));
                            }
                            let text = tokenizer.decode(&token_ids, false).unwrap_or_default();
                            TokenizedPrompt { text, token_ids, images: Default::default() }
                        }
                    };
                    if prompt.token_ids.is_empty() {
                        return Err(ApiError::invalid(
                            "prompt",
                            "the prompt must contain at least one token",
                        ));
                    }
                    Ok(prompt)
                })
                .collect()
        })
        .await?
    }

    /// Token ids of `text`.
    pub async fn encode(&self, text: String, add_special_tokens: bool) -> Result<Vec<u32>, ApiError> {
        let tokenizer = self.tokenizer.clone();
        let max_model_len = self.max_model_len;
        self.blocking(move || encode(&tokenizer, &text, add_special_tokens, max_model_len, "prompt")).await?
    }

    /// Text of `ids` (special tokens kept).
    pub async fn decode(&self, ids: Vec<u32>) -> Result<String, ApiError> {
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(ApiError::invalid(
                "tokens",
                format!("token id {bad} is outside the vocabulary (size {})", self.vocab_size),
            ));
        }
        let tokenizer = self.tokenizer.clone();
        self.blocking(move || {
            tokenizer.decode(&ids, false).map_err(|e| ApiError::invalid("tokens", e.to_string()))
        })
        .await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::ContentPart;

    fn msg(role: &str, content: Option<MessageContent>) -> openai::ChatMessage {
        openai::ChatMessage { role: role.into(), content, name: None, tool_calls: None, tool_call_id: None }
    }

    #[test]
    fn roles_and_parts() {
        let out = chat_messages(&[
            msg("developer", Some(MessageContent::Text("be brief".into()))),
            msg(
                "user",
                Some(MessageContent::Parts(vec![
                    ContentPart { r#type: "text".into(), text: Some("a".into()), image_url: None },
                    ContentPart { r#type: "text".into(), text: Some("b".into()), image_url: None },
                ])),
            ),
            msg("assistant", None),
        ])
        .unwrap();
        assert_eq!(
            out,
            vec![
                ChatMessage::new("system", "be brief"),
                ChatMessage::new("user", "a\nb"),
                ChatMessage::new("assistant", "")
            ]
        );
    }

    #[test]
    fn bad_messages_name_the_field() {
        let p = |m: Vec<openai::ChatMessage>| chat_messages(&m).unwrap_err().param.unwrap();
        assert_eq!(p(vec![]), "messages");
        assert_eq!(p(vec![msg("wizard", Some(MessageContent::Text("x".into())))]), "messages[0].role");
        assert_eq!(p(vec![msg("user", None)]), "messages[0].content");
        let image = ContentPart { r#type: "image_url".into(), text: None, image_url: None };
        assert_eq!(p(vec![msg("user", Some(MessageContent::Parts(vec![image])))]), "messages[0].content[0]");
        let no_text = ContentPart { r#type: "text".into(), text: None, image_url: None };
        assert_eq!(
            p(vec![msg("user", Some(MessageContent::Parts(vec![no_text])))]),
            "messages[0].content[0]"
        );
    }
}
