//! `--kv-events-config`: vLLM's `KVEventsConfig` as JSON, with vLLM's defaults, and one field
//! of ours (`publish_token_ids`). A `*` host binds the server's `--host` address, not every
//! address as in vLLM: the events carry the prompts' token ids, and the sockets take anyone.

use std::net::{IpAddr, ToSocketAddrs};

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("publisher {0:?} is not one of \"zmq\", \"null\"")]
    Publisher(String),
    #[error("{field} {endpoint:?} is not a tcp:// endpoint (tcp://HOST:PORT, `*` for the server's --host)")]
    Endpoint { field: &'static str, endpoint: String },
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("{field}: the server's --host {host:?} is not an address to bind")]
    Host { field: &'static str, host: String },
}

/// What vLLM's `--kv-events-config` holds.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsConfig {
    pub enable_kv_cache_events: bool,
    /// `zmq`, or `null` (publish nothing); unset: `zmq` when events are enabled.
    pub publisher: Option<String>,
    /// Where the PUB socket binds (a `*` host: the server's `--host`; `::`: every address) or
    /// connects (any other host).
    pub endpoint: String,
    /// Where the ROUTER socket that replays missed batches binds (`*`: the server's `--host`);
    /// unset: no replay.
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// The PUB socket's high-water mark: messages queued for one subscriber before it misses
    /// some.
    pub hwm: usize,
    /// Steps' events queued between the engine and the publisher; beyond it they are dropped
    /// (and counted), so a slow publisher never holds the engine.
    pub max_queue_size: usize,
    /// The first frame of every message.
    pub topic: String,
    /// Ours, not vLLM's: `false` publishes each `BlockStored` with an empty `token_ids` (the
    /// block hashes still chain), so a subscriber cannot read the prompts.
    pub publish_token_ids: bool,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            enable_kv_cache_events: false,
            publisher: None,
            endpoint: "tcp://*:5557".to_owned(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
            publish_token_ids: true,
        }
    }
}

/// A tcp endpoint: bind on an address, or connect to a subscriber that bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Bind(String),
    Connect(String),
}

/// `host` as a libzmq tcp bind address takes it: an IP (IPv6 in brackets), names resolved
/// here (libzmq does not look names up to bind).
fn bind_address(host: &str) -> Option<String> {
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let ip = match bare.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => (bare, 0).to_socket_addrs().ok()?.next()?.ip(),
    };
    Some(match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    })
}

impl Endpoint {
    /// vLLM's rule, but for `*`: a `*` host binds on `bind_host` (the server's `--host`), a
    /// `::` host on every address, any other host connects (or binds, with `always_bind`).
    fn parse(
        field: &'static str,
        endpoint: &str,
        always_bind: bool,
        bind_host: &str,
    ) -> Result<Self, ConfigError> {
        let bad = || ConfigError::Endpoint { field, endpoint: endpoint.to_owned() };
        let rest = endpoint.strip_prefix("tcp://").ok_or_else(bad)?;
        let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        port.parse::<u16>().map_err(|_| bad())?;
        if host.is_empty() {
            return Err(bad());
        }
        Ok(match host {
            "*" => {
                let host = bind_address(bind_host)
                    .ok_or_else(|| ConfigError::Host { field, host: bind_host.to_owned() })?;
                Endpoint::Bind(format!("tcp://{host}:{port}"))
            }
            "::" | "[::]" => Endpoint::Bind(format!("tcp://[::]:{port}")),
            _ if always_bind => Endpoint::Bind(endpoint.to_owned()),
            _ => Endpoint::Connect(endpoint.to_owned()),
        })
    }
}

impl KvEventsConfig {
    pub fn parse(json: &str) -> Result<Self, ConfigError> {
        let config: Self = serde_json::from_str(json)?;
        config.check()?;
        Ok(config)
    }

    /// Whether events are published at all.
    pub fn enabled(&self) -> bool {
        self.enable_kv_cache_events && self.publisher.as_deref().unwrap_or("zmq") == "zmq"
    }

    fn check(&self) -> Result<(), ConfigError> {
        match self.publisher.as_deref() {
            None | Some("zmq" | "null") => {}
            Some(other) => return Err(ConfigError::Publisher(other.to_owned())),
        }
        // The host is only known when the server starts; any address checks the form here.
        self.publish_endpoint("127.0.0.1")?;
        self.replay("127.0.0.1")?;
        if self.max_queue_size == 0 {
            return Err(ConfigError::Zero("max_queue_size"));
        }
        Ok(())
    }

    /// The PUB socket's address; `bind_host` (the server's `--host`) stands for `*`.
    pub fn publish_endpoint(&self, bind_host: &str) -> Result<Endpoint, ConfigError> {
        Endpoint::parse("endpoint", &self.endpoint, false, bind_host)
    }

    /// The replay socket's address (it always binds); `bind_host` stands for `*`.
    pub fn replay(&self, bind_host: &str) -> Result<Option<String>, ConfigError> {
        match &self.replay_endpoint {
            None => Ok(None),
            Some(e) => match Endpoint::parse("replay_endpoint", e, true, bind_host)? {
                Endpoint::Bind(addr) | Endpoint::Connect(addr) => Ok(Some(addr)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllms_json_and_defaults() {
        let c = KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "topic": "kv@a@m"}"#).unwrap();
        assert!(c.enabled() && c.publish_token_ids);
        assert_eq!((c.buffer_steps, c.max_queue_size, c.topic.as_str()), (10_000, 100_000, "kv@a@m"));
        let c = KvEventsConfig::parse(
            r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://indexer:5557",
                "replay_endpoint": "tcp://*:5558", "buffer_steps": 5, "hwm": 10,
                "publish_token_ids": false}"#,
        )
        .unwrap();
        assert!(!c.publish_token_ids);
        assert_eq!(c.publish_endpoint("127.0.0.1").unwrap(), Endpoint::Connect("tcp://indexer:5557".into()));
        assert_eq!(c.replay("10.1.2.3").unwrap().as_deref(), Some("tcp://10.1.2.3:5558"));
        assert!(!KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "publisher": "null"}"#)
            .unwrap()
            .enabled());
        assert!(!KvEventsConfig::parse("{}").unwrap().enabled());
    }

    #[test]
    fn a_star_binds_the_servers_host_and_a_named_host_is_kept() {
        let default = KvEventsConfig::default();
        for (host, want) in [
            ("127.0.0.1", "tcp://127.0.0.1:5557"),
            ("0.0.0.0", "tcp://0.0.0.0:5557"),
            ("::1", "tcp://[::1]:5557"),
            ("[::]", "tcp://[::]:5557"),
        ] {
            assert_eq!(default.publish_endpoint(host).unwrap(), Endpoint::Bind(want.into()), "{host}");
        }
        let named = KvEventsConfig {
            endpoint: "tcp://[::]:6000".into(),
            replay_endpoint: Some("tcp://0.0.0.0:6001".into()),
            ..Default::default()
        };
        assert_eq!(named.publish_endpoint("127.0.0.1").unwrap(), Endpoint::Bind("tcp://[::]:6000".into()));
        assert_eq!(named.replay("127.0.0.1").unwrap().as_deref(), Some("tcp://0.0.0.0:6001"));
        // A name is resolved here: libzmq binds addresses only.
        let localhost = default.publish_endpoint("localhost").unwrap();
        assert!(
            [Endpoint::Bind("tcp://127.0.0.1:5557".into()), Endpoint::Bind("tcp://[::1]:5557".into())]
                .contains(&localhost),
            "{localhost:?}"
        );
    }

    #[test]
    fn bad_fields_are_named() {
        for (json, needle) in [
            (r#"{"publisher": "kafka"}"#, "kafka"),
            (r#"{"endpoint": "ipc:///tmp/x"}"#, "endpoint"),
            (r#"{"replay_endpoint": "tcp://*:x"}"#, "replay_endpoint"),
            (r#"{"max_queue_size": 0}"#, "max_queue_size"),
            (r#"{"enable_kv_cache_event": true}"#, "enable_kv_cache_event"),
            (r#"{"publish_token_ids": "no"}"#, "expected a boolean"),
        ] {
            let err = KvEventsConfig::parse(json).unwrap_err().to_string();
            assert!(err.contains(needle), "{json}: {err}");
        }
    }
}
