//! `GET /openapi.json`: the OpenAPI 3 description of the API, generated from the wire types and
//! the handlers' annotations (utoipa), so that client generators and schema-driven fuzzers see
//! exactly what the server parses.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::handlers;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Pagoda",
        description = "OpenAI-compatible LLM inference server (chat and text completions, SSE streaming, \
                       embeddings, vLLM's tokenize/detokenize extensions)."
    ),
    paths(
        handlers::chat::chat_completions,
        handlers::completions::completions,
        handlers::embeddings::embeddings,
        handlers::score::score,
        handlers::score::rerank,
        handlers::responses::create,
        handlers::responses::retrieve,
        handlers::responses::delete,
        handlers::responses::input_item_list,
        handlers::responses::cancel,
        handlers::messages::messages,
        handlers::messages::count_tokens,
        handlers::info::list_models,
        handlers::info::retrieve_model,
        handlers::info::health,
        handlers::info::version,
        handlers::info::metrics,
        handlers::stats::stats,
        handlers::tokenize::tokenize,
        handlers::tokenize::detokenize,
        handlers::lora::load,
        handlers::lora::unload,
        handlers::render::render_chat,
        handlers::render::render_completion,
        handlers::worker::server_info,
        handlers::worker::model_info,
        handlers::worker::get_load,
        handlers::worker::flush_cache,
        handlers::worker::health_generate,
        handlers::worker::ready,
        handlers::worker::kv_event_sources,
    ),
    modifiers(&BearerAuth),
    tags((name = "openai", description = "OpenAI-compatible endpoints"),
         (name = "anthropic", description = "Anthropic-compatible endpoints (errors in Anthropic's shape)"),
         (name = "vllm", description = "vLLM extensions"),
         (name = "router", description = "What sglang-router and vllm-router call on a worker (SGLang's names; \
                                          `/get_server_info` and `/get_model_info` are the older spellings)"),
         (name = "ops", description = "Health, version and metrics"))
)]
pub struct ApiDoc;

/// Declares the `Authorization: Bearer` scheme used with `--api-key`.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document as JSON.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_lists_every_route_and_the_request_schemas() {
        let json = serde_json::to_value(document()).unwrap();
        let paths = json["paths"].as_object().unwrap();
        for p in [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/messages",
            "/v1/responses",
            "/v1/responses/{response_id}",
            "/v1/responses/{response_id}/input_items",
            "/v1/responses/{response_id}/cancel",
            "/v1/messages/count_tokens",
            "/v1/models",
            "/health",
            "/version",
            "/metrics",
            "/tokenize",
            "/detokenize",
            "/v1/chat/completions/render",
            "/v1/completions/render",
            "/server_info",
            "/model_info",
            "/get_load",
            "/flush_cache",
            "/health_generate",
            "/ready",
        ] {
            assert!(paths.contains_key(p), "{p} missing from {:?}", paths.keys());
        }
        // Chat and completions list their errors through one `IntoResponses` type.
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let responses = &paths[path]["post"]["responses"];
            for code in ["200", "400", "401", "404", "413", "429", "503"] {
                assert!(responses[code]["description"].is_string(), "{path} {code}");
            }
            assert_eq!(responses["404"]["description"], "Unknown model");
            let body = &responses["400"]["content"]["application/json"]["schema"]["$ref"];
            assert_eq!(body, "#/components/schemas/ErrorResponse");
        }
        let schemas = json["components"]["schemas"].as_object().unwrap();
        for s in [
            "ChatCompletionRequest",
            "CompletionRequest",
            "ChatCompletionResponse",
            "ErrorResponse",
            "Prompt",
        ] {
            assert!(schemas.contains_key(s), "{s} missing");
        }
        // Chat flattens the fields it shares with completions: an `allOf` of inline objects.
        let chat = schemas["ChatCompletionRequest"]["allOf"].as_array().unwrap();
        let own = chat.iter().find(|part| part["required"].is_array()).unwrap();
        assert!(own["required"].as_array().unwrap().iter().any(|r| r == "messages"));
        for field in ["messages", "temperature", "guided_regex"] {
            assert!(chat.iter().any(|part| part["properties"][field].is_object()), "{field}");
        }
    }
}
