//! `--kv-events-config`: vLLM's `KVEventsConfig` as JSON, with vLLM's defaults.

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("publisher {0:?} is not one of \"zmq\", \"null\"")]
    Publisher(String),
    #[error("{field} {endpoint:?} is not a tcp:// endpoint (tcp://HOST:PORT, `*` for every address)")]
    Endpoint { field: &'static str, endpoint: String },
    #[error("{0} must be at least 1")]
    Zero(&'static str),
}

/// What vLLM's `--kv-events-config` holds.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsConfig {
    pub enable_kv_cache_events: bool,
    /// `zmq`, or `null` (publish nothing); unset: `zmq` when events are enabled.
    pub publisher: Option<String>,
    /// Where the PUB socket binds (a `*` or `::` host) or connects (any other host).
    pub endpoint: String,
    /// Where the ROUTER socket that replays missed batches binds; unset: no replay.
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// The PUB socket's high-water mark (vLLM's; our PUB drops for a subscriber that falls
    /// behind by its own queue, whatever this says).
    pub hwm: usize,
    /// Steps' events queued between the engine and the publisher; beyond it they are dropped
    /// (and counted), so a slow publisher never holds the engine.
    pub max_queue_size: usize,
    /// The first frame of every message.
    pub topic: String,
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
        }
    }
}

/// A tcp endpoint: bind on every address, bind on one, or connect to a subscriber that bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Bind(String),
    Connect(String),
}

impl Endpoint {
    /// vLLM's rule: a `*` or `::` host binds, any other connects.
    fn parse(field: &'static str, endpoint: &str, always_bind: bool) -> Result<Self, ConfigError> {
        let bad = || ConfigError::Endpoint { field, endpoint: endpoint.to_owned() };
        let rest = endpoint.strip_prefix("tcp://").ok_or_else(bad)?;
        let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        port.parse::<u16>().map_err(|_| bad())?;
        if host.is_empty() {
            return Err(bad());
        }
        Ok(match host {
            "*" => Endpoint::Bind(format!("tcp://0.0.0.0:{port}")),
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
        self.publish_endpoint()?;
        self.replay()?;
        if self.max_queue_size == 0 {
            return Err(ConfigError::Zero("max_queue_size"));
        }
        Ok(())
    }

    pub fn publish_endpoint(&self) -> Result<Endpoint, ConfigError> {
        Endpoint::parse("endpoint", &self.endpoint, false)
    }

    /// The replay socket's address (it always binds).
    pub fn replay(&self) -> Result<Option<String>, ConfigError> {
        match &self.replay_endpoint {
            None => Ok(None),
            Some(e) => match Endpoint::parse("replay_endpoint", e, true)? {
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
        assert!(c.enabled());
        assert_eq!((c.buffer_steps, c.max_queue_size, c.topic.as_str()), (10_000, 100_000, "kv@a@m"));
        assert_eq!(c.publish_endpoint().unwrap(), Endpoint::Bind("tcp://0.0.0.0:5557".into()));
        let c = KvEventsConfig::parse(
            r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://indexer:5557",
                "replay_endpoint": "tcp://*:5558", "buffer_steps": 5, "hwm": 10}"#,
        )
        .unwrap();
        assert_eq!(c.publish_endpoint().unwrap(), Endpoint::Connect("tcp://indexer:5557".into()));
        assert_eq!(c.replay().unwrap().as_deref(), Some("tcp://0.0.0.0:5558"));
        assert!(!KvEventsConfig::parse(r#"{"enable_kv_cache_events": true, "publisher": "null"}"#)
            .unwrap()
            .enabled());
        assert!(!KvEventsConfig::parse("{}").unwrap().enabled());
    }

    #[test]
    fn bad_fields_are_named() {
        for (json, needle) in [
            (r#"{"publisher": "kafka"}"#, "kafka"),
            (r#"{"endpoint": "ipc:///tmp/x"}"#, "endpoint"),
            (r#"{"replay_endpoint": "tcp://*:x"}"#, "replay_endpoint"),
            (r#"{"max_queue_size": 0}"#, "max_queue_size"),
            (r#"{"enable_kv_cache_event": true}"#, "enable_kv_cache_event"),
        ] {
            let err = KvEventsConfig::parse(json).unwrap_err().to_string();
            assert!(err.contains(needle), "{json}: {err}");
        }
    }
}
