//! What a request asks of prefill/decode disaggregation, read from its wire fields, and what a
//! prefill answers with.
//!
//! Two request flows drive it:
//! - vLLM's (vllm-router's PD mode): the prefill instance gets `kv_transfer_params:
//!   {"do_remote_decode": true}` and answers with parameters naming where its KV is held;
//!   the router copies those into the decode request, which then carries
//!   `do_remote_prefill: true` with `remote_host`, `remote_port` and `remote_request_id`.
//! - SGLang's (sglang-router's PD mode): both instances get the same request at once, with
//!   `bootstrap_host`, `bootstrap_port` (the prefill's transfer port) and `bootstrap_room`;
//!   the prefill holds its KV under the room and the decode fetches the room, waiting while
//!   the prefill runs.

use serde_json::{Map, Value};

use crate::config::{KvRole, KvTransferConfig};

/// SGLang's default bootstrap port, for a `bootstrap_port` of null.
pub const SGLANG_DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// Where a decode instance fetches a prompt's KV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferSource {
    pub host: String,
    pub port: u16,
    pub key: String,
}

impl TransferSource {
    pub fn addr(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// What one request asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Directive {
    /// Hold the prompt's KV under `key` once the prefill is done; with `params`, answer with
    /// vLLM's `kv_transfer_params` (SGLang's flow needs no answer).
    Hold { key: String, params: bool, prefill_only: bool },
    /// Fetch the prompt's KV from `source` before computing it.
    Fetch(TransferSource),
}

/// A request field this instance cannot honour; the server answers 400 naming `field`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct DirectiveError {
    pub field: String,
    pub message: String,
}

fn refuse(field: &str, message: impl Into<String>) -> DirectiveError {
    DirectiveError { field: field.to_owned(), message: message.into() }
}

/// SGLang's bootstrap fields of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bootstrap {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub room: Option<u64>,
}

impl Bootstrap {
    pub fn is_empty(&self) -> bool {
        self.host.is_none() && self.port.is_none() && self.room.is_none()
    }
}

/// The keys of `kv_transfer_params` this transport reads; vLLM's NIXL keys it has no use for
/// (`remote_block_ids`, `tp_size`) are accepted since a router may pass them along.
const KNOWN_PARAMS: [&str; 8] = [
    "do_remote_decode",
    "do_remote_prefill",
    "remote_engine_id",
    "remote_host",
    "remote_port",
    "remote_request_id",
    "remote_block_ids",
    "tp_size",
];

/// Reads a request's directive. `request_key` makes a vLLM hold's key unique on this
/// instance. `config` is `None` on a server without `--kv-transfer-config`, which refuses
/// every such field.
pub fn directive(
    config: Option<&KvTransferConfig>,
    params: Option<&Map<String, Value>>,
    bootstrap: &Bootstrap,
    request_key: &str,
) -> Result<Option<Directive>, DirectiveError> {
    let params = params.filter(|p| !p.is_empty());
    if params.is_none() && bootstrap.is_empty() {
        return Ok(None);
    }
    let Some(config) = config else {
        let field = if params.is_some() { "kv_transfer_params" } else { "bootstrap_room" };
        return Err(refuse(
            field,
            "this server runs without --kv-transfer-config (prefill/decode disaggregation)",
        ));
    };
    if let Some(params) = params {
        if !bootstrap.is_empty() {
            return Err(refuse(
                "bootstrap_room",
                "give either kv_transfer_params or bootstrap fields, not both",
            ));
        }
        return vllm_directive(config, params, request_key);
    }
    sglang_directive(config, bootstrap)
}

fn vllm_directive(
    config: &KvTransferConfig,
    params: &Map<String, Value>,
    request_key: &str,
) -> Result<Option<Directive>, DirectiveError> {
    if let Some(key) = params.keys().find(|k| !KNOWN_PARAMS.contains(&k.as_str())) {
        return Err(refuse(&format!("kv_transfer_params.{key}"), "is not a parameter of this KV transport"));
    }
    let flag = |name: &str| match params.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(refuse(&format!("kv_transfer_params.{name}"), "must be a boolean")),
    };
    let (decode, prefill) = (flag("do_remote_decode")?, flag("do_remote_prefill")?);
    match (decode, prefill) {
        (true, true) => {
            Err(refuse("kv_transfer_params", "do_remote_decode and do_remote_prefill are both true"))
        }
        (false, false) => Ok(None),
        (true, false) => {
            if !config.role.produces() {
                return Err(role_refusal("kv_transfer_params.do_remote_decode", config.role, "prefill"));
            }
            Ok(Some(Directive::Hold { key: format!("req-{request_key}"), params: true, prefill_only: false }))
        }
        (false, true) => {
            if !config.role.consumes() {
                return Err(role_refusal("kv_transfer_params.do_remote_prefill", config.role, "decode"));
            }
            let text = |name: &str| match params.get(name) {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                _ => Err(refuse(
                    &format!("kv_transfer_params.{name}"),
                    "must be a non-empty string with do_remote_prefill",
                )),
            };
            let port = match params.get("remote_port").and_then(Value::as_u64) {
                Some(p) if (1..=65535).contains(&p) => p as u16,
                _ => {
                    return Err(refuse(
                        "kv_transfer_params.remote_port",
                        "must be a port number with do_remote_prefill",
                    ))
                }
            };
            let source = TransferSource { host: text("remote_host")?, port, key: text("remote_request_id")? };
            allowed(config, source, "kv_transfer_params.remote_host").map(|s| Some(Directive::Fetch(s)))
        }
    }
}

fn sglang_directive(
    config: &KvTransferConfig,
    bootstrap: &Bootstrap,
) -> Result<Option<Directive>, DirectiveError> {
    let Some(room) = bootstrap.room else {
        return Err(refuse("bootstrap_room", "is required with bootstrap_host and bootstrap_port"));
    };
    let key = format!("room-{room}");
    match config.role {
        KvRole::KvProducer => Ok(Some(Directive::Hold { key, params: false, prefill_only: true })),
        KvRole::KvConsumer => {
            let host = bootstrap
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .ok_or_else(|| refuse("bootstrap_host", "is required with bootstrap_room"))?;
            let port = bootstrap.port.unwrap_or(SGLANG_DEFAULT_BOOTSTRAP_PORT);
            allowed(config, TransferSource { host, port, key }, "bootstrap_host").map(|s| Some(Directive::Fetch(s)))
        }
        KvRole::KvBoth => Err(refuse(
            "bootstrap_room",
            "SGLang's bootstrap flow needs an instance that is either the prefill (kv_producer) or the decode (kv_consumer), not kv_both",
        )),
    }
}

/// `source` when the config lets this instance fetch from it. A producer it does not trust is
/// a 400 before any connection: its pages would enter the prefix cache every request shares,
/// and trying it would tell the client whether the host answers.
fn allowed(
    config: &KvTransferConfig,
    source: TransferSource,
    field: &str,
) -> Result<TransferSource, DirectiveError> {
    let addr = source.addr();
    if config.allows_producer(&source.host, &addr) {
        return Ok(source);
    }
    let why = match config.allowed_producers {
        Some(_) => format!("{addr} is not one of this instance's allowed_producers"),
        None => format!(
            "{addr} is not a loopback address, and this instance fetches KV from other hosts only when \
             kv_connector_extra_config.allowed_producers lists them"
        ),
    };
    Err(refuse(field, why))
}

fn role_refusal(field: &str, role: KvRole, wanted: &str) -> DirectiveError {
    refuse(
        field,
        format!("this instance's kv_role is {}, so it does not serve as a {wanted} instance", role.name()),
    )
}

/// The `kv_transfer_params` a prefill answers with: where the decode instance fetches the KV.
pub fn hold_params(config: &KvTransferConfig, engine_id: &str, key: &str) -> Value {
    serde_json::json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_engine_id": engine_id,
        "remote_host": config.advertised_host(),
        "remote_port": config.listen_port,
        "remote_request_id": key,
        "tp_size": 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(role: &str) -> KvTransferConfig {
        KvTransferConfig::parse(&format!(r#"{{"kv_role": "{role}", "kv_port": 7100}}"#)).unwrap()
    }

    fn params(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn the_vllm_flow_round_trips_through_the_answer() {
        let producer = config("kv_producer");
        let ask = params(r#"{"do_remote_decode": true, "do_remote_prefill": false, "remote_host": null}"#);
        let held = directive(Some(&producer), Some(&ask), &Bootstrap::default(), "7").unwrap();
        assert_eq!(held, Some(Directive::Hold { key: "req-7".into(), params: true, prefill_only: false }));
        let answer = hold_params(&producer, "p0", "req-7");
        let answer = answer.as_object().unwrap();
        let fetched =
            directive(Some(&config("kv_consumer")), Some(answer), &Bootstrap::default(), "9").unwrap();
        let source = TransferSource { host: "127.0.0.1".into(), port: 7100, key: "req-7".into() };
        assert_eq!(fetched, Some(Directive::Fetch(source)));
    }

    #[test]
    fn the_sglang_flow_keys_both_sides_by_room() {
        let b = Bootstrap { host: Some("127.0.0.2".into()), port: Some(8998), room: Some(42) };
        let held = directive(Some(&config("kv_producer")), None, &b, "1").unwrap();
        assert_eq!(held, Some(Directive::Hold { key: "room-42".into(), params: false, prefill_only: true }));
        let fetched = directive(Some(&config("kv_consumer")), None, &b, "2").unwrap();
        let source = TransferSource { host: "127.0.0.2".into(), port: 8998, key: "room-42".into() };
        assert_eq!(fetched, Some(Directive::Fetch(source)));
        let null_port = Bootstrap { port: None, ..b };
        let Some(Directive::Fetch(s)) =
            directive(Some(&config("kv_consumer")), None, &null_port, "3").unwrap()
        else {
            panic!()
        };
        assert_eq!(s.port, SGLANG_DEFAULT_BOOTSTRAP_PORT);
    }

    #[test]
    fn nothing_asked_is_no_directive() {
        assert_eq!(directive(None, None, &Bootstrap::default(), "1"), Ok(None));
        assert_eq!(directive(None, Some(&Map::new()), &Bootstrap::default(), "1"), Ok(None));
        let off = params(r#"{"do_remote_decode": false}"#);
        assert_eq!(directive(Some(&config("kv_both")), Some(&off), &Bootstrap::default(), "1"), Ok(None));
    }

    #[test]
    fn what_cannot_be_honoured_names_its_field() {
        let field = |c: Option<&KvTransferConfig>, p: &str, b: &Bootstrap| {
            directive(c, Some(&params(p)), b, "1").unwrap_err().field
        };
        let none = Bootstrap::default();
        assert_eq!(field(None, r#"{"do_remote_decode": true}"#, &none), "kv_transfer_params");
        let consumer = config("kv_consumer");
        assert_eq!(
            field(Some(&consumer), r#"{"do_remote_decode": true}"#, &none),
            "kv_transfer_params.do_remote_decode"
        );
        assert_eq!(
            field(
                Some(&consumer),
                r#"{"do_remote_prefill": true, "remote_host": "h", "remote_request_id": "k"}"#,
                &none
            ),
            "kv_transfer_params.remote_port"
        );
        assert_eq!(
            field(Some(&consumer), r#"{"do_remote_prefill": 1}"#, &none),
            "kv_transfer_params.do_remote_prefill"
        );
        assert_eq!(
            field(Some(&consumer), r#"{"do_remote_prefill": true, "chunk": 3}"#, &none),
            "kv_transfer_params.chunk"
        );
        let room = Bootstrap { room: Some(1), host: Some("h".into()), port: Some(1) };
        assert_eq!(directive(None, None, &room, "1").unwrap_err().field, "bootstrap_room");
        assert_eq!(
            directive(Some(&config("kv_both")), None, &room, "1").unwrap_err().field,
            "bootstrap_room"
        );
        let no_room = Bootstrap { room: None, ..room.clone() };
        assert_eq!(directive(Some(&consumer), None, &no_room, "1").unwrap_err().field, "bootstrap_room");
        let no_host = Bootstrap { host: None, ..room };
        assert_eq!(directive(Some(&consumer), None, &no_host, "1").unwrap_err().field, "bootstrap_host");
        let fenced = KvTransferConfig::parse(
            r#"{"kv_role": "kv_consumer", "kv_connector_extra_config": {"allowed_producers": ["10.0.0.2:8998"]}}"#,
        )
        .unwrap();
        let ok = Bootstrap { host: Some("10.0.0.2".into()), port: Some(8998), room: Some(1) };
        assert!(directive(Some(&fenced), None, &ok, "1").is_ok());
        let elsewhere = Bootstrap { host: Some("10.0.0.66".into()), ..ok };
        assert_eq!(directive(Some(&fenced), None, &elsewhere, "1").unwrap_err().field, "bootstrap_host");
        let vllm = params(
            r#"{"do_remote_prefill": true, "remote_host": "10.0.0.66", "remote_port": 8998, "remote_request_id": "k"}"#,
        );
        assert_eq!(
            directive(Some(&fenced), Some(&vllm), &Bootstrap::default(), "1").unwrap_err().field,
            "kv_transfer_params.remote_host"
        );
        // Without a list, only producers on this host.
        let refused = directive(Some(&consumer), Some(&vllm), &Bootstrap::default(), "1").unwrap_err();
        assert_eq!(refused.field, "kv_transfer_params.remote_host");
        assert!(refused.message.contains("allowed_producers"), "{refused}");
        let elsewhere = Bootstrap { host: Some("10.0.0.66".into()), port: Some(8998), room: Some(1) };
        assert_eq!(directive(Some(&consumer), None, &elsewhere, "1").unwrap_err().field, "bootstrap_host");
    }
}
