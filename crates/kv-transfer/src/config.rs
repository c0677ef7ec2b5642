//! `--kv-transfer-config`: vLLM's `KVTransferConfig` JSON, the fields that mean something to
//! Pagoda's TCP transport. Anything else is refused by name, so a vLLM setting is never
//! silently ignored.

use std::net::IpAddr;
use std::time::Duration;

use serde::Deserialize;

/// The one connector Pagoda has; vLLM's names (NIXL, LMCache, ...) are refused with this name
/// in the message.
pub const TCP_CONNECTOR: &str = "PagodaTcpConnector";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("kv_connector {0:?} is not available; Pagoda transfers KV with \"{TCP_CONNECTOR}\" (its own TCP transport)")]
    Connector(String),
    #[error("kv_load_failure_policy {0:?} is not one of \"recompute\", \"fail\"")]
    FailurePolicy(String),
    #[error("{0} must be above 0 and at most a day")]
    NotPositive(&'static str),
    #[error("kv_ip {0:?} listens on every address, so decode instances need to be told one: set kv_connector_extra_config.advertise_host")]
    NoAdvertiseHost(String),
    #[error("allowed_producers entry {0:?} is not \"host:port\" (or \"*\" for any producer)")]
    Producer(String),
}

/// Any producer, for `allowed_producers`: the decode instance's API must then be reachable by
/// the router only, since a request names the host its pages come from.
pub const ANY_PRODUCER: &str = "*";

/// What this instance does in a disaggregated pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvRole {
    /// Prefill instance: holds prompts' KV for decode instances to read.
    KvProducer,
    /// Decode instance: reads prompts' KV from prefill instances.
    KvConsumer,
    /// Either, per request.
    KvBoth,
}

impl KvRole {
    pub fn produces(self) -> bool {
        matches!(self, KvRole::KvProducer | KvRole::KvBoth)
    }

    pub fn consumes(self) -> bool {
        matches!(self, KvRole::KvConsumer | KvRole::KvBoth)
    }

    pub fn name(self) -> &'static str {
        match self {
            KvRole::KvProducer => "kv_producer",
            KvRole::KvConsumer => "kv_consumer",
            KvRole::KvBoth => "kv_both",
        }
    }
}

/// What to do when a decode instance cannot get a prompt's KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Compute the prompt locally (the default): the request is served, later.
    Recompute,
    /// Fail the request (503), for deployments that would rather retry elsewhere.
    Fail,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    kv_connector: Option<String>,
    kv_role: KvRole,
    engine_id: Option<String>,
    kv_ip: Option<String>,
    kv_port: Option<u16>,
    kv_load_failure_policy: Option<String>,
    #[serde(default)]
    kv_connector_extra_config: Extra,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Extra {
    advertise_host: Option<String>,
    transfer_timeout_s: Option<f64>,
    hold_timeout_s: Option<f64>,
    idle_timeout_s: Option<f64>,
    allowed_producers: Option<Vec<String>>,
}

/// A parsed `--kv-transfer-config`.
#[derive(Debug, Clone, PartialEq)]
pub struct KvTransferConfig {
    pub role: KvRole,
    /// Names this instance in the parameters a prefill returns (`remote_engine_id`); unset:
    /// the server's instance id.
    pub engine_id: Option<String>,
    /// Where a producer's transfer listener binds. vLLM's default address and port.
    pub listen_host: String,
    pub listen_port: u16,
    /// The host a producer tells decode instances to fetch from (`remote_host`); unset: the
    /// listen host, or 127.0.0.1 when that is a wildcard.
    pub advertise_host: Option<String>,
    /// How long a decode instance waits for a prompt's KV before computing it itself.
    pub transfer_timeout: Duration,
    /// How long a prefill instance holds a prompt's blocks for a decode instance that has not
    /// read them.
    pub hold_timeout: Duration,
    /// How long a connection to a producer's listener may stay silent before it sends its
    /// fetch; one that does not is closed, so silent connections never hold an answer slot.
    pub idle_timeout: Duration,
    pub failure_policy: FailurePolicy,
    /// The only `host:port` transfer listeners a decode instance fetches from ([`ANY_PRODUCER`]:
    /// any the request names); `None`: loopback listeners only (a producer on the same host).
    /// Fetched pages enter the shared prefix cache, so every other request trusts them.
    pub allowed_producers: Option<Vec<String>>,
}

impl KvTransferConfig {
    pub fn parse(json: &str) -> Result<Self, ConfigError> {
        let raw: Raw = serde_json::from_str(json)?;
        if let Some(name) = raw.kv_connector.filter(|c| c != TCP_CONNECTOR) {
            return Err(ConfigError::Connector(name));
        }
        let failure_policy = match raw.kv_load_failure_policy.as_deref() {
            None | Some("recompute") => FailurePolicy::Recompute,
            Some("fail") => FailurePolicy::Fail,
            Some(other) => return Err(ConfigError::FailurePolicy(other.to_owned())),
        };
        let seconds = |value: Option<f64>, default: f64, name| match value.unwrap_or(default) {
            s if s > 0.0 && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
            _ => Err(ConfigError::NotPositive(name)),
        };
        let extra = raw.kv_connector_extra_config;
        let listen_host = raw.kv_ip.unwrap_or_else(|| "127.0.0.1".to_owned());
        if is_wildcard(&listen_host) && extra.advertise_host.is_none() && raw.kv_role.produces() {
            return Err(ConfigError::NoAdvertiseHost(listen_host));
        }
        if let Some(bad) = extra.allowed_producers.iter().flatten().find(|p| !is_producer_entry(p)) {
            return Err(ConfigError::Producer(bad.clone()));
        }
        Ok(Self {
            role: raw.kv_role,
            engine_id: raw.engine_id,
            listen_host,
            listen_port: raw.kv_port.unwrap_or(14579),
            advertise_host: extra.advertise_host,
            transfer_timeout: seconds(extra.transfer_timeout_s, 30.0, "transfer_timeout_s")?,
            hold_timeout: seconds(extra.hold_timeout_s, 120.0, "hold_timeout_s")?,
            idle_timeout: seconds(extra.idle_timeout_s, 3.0, "idle_timeout_s")?,
            failure_policy,
            allowed_producers: extra.allowed_producers,
        })
    }

    /// The host decode instances are told to fetch from.
    pub fn advertised_host(&self) -> String {
        self.advertise_host.clone().unwrap_or_else(|| self.listen_host.clone())
    }

    /// Whether this instance fetches from the listener at `host:port` (`addr`, as
    /// [`crate::TransferSource::addr`] writes it): one of `allowed_producers`, or with none
    /// configured, a loopback address.
    pub fn allows_producer(&self, host: &str, addr: &str) -> bool {
        match &self.allowed_producers {
            Some(list) => list.iter().any(|p| p == ANY_PRODUCER || p == addr),
            None => is_loopback(host),
        }
    }
}

/// A loopback IP literal or `localhost`; a name that merely resolves to one is not (it could
/// resolve elsewhere later).
fn is_loopback(host: &str) -> bool {
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    bare.eq_ignore_ascii_case("localhost") || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `*`, or `host:port` with a port number.
fn is_producer_entry(entry: &str) -> bool {
    entry == ANY_PRODUCER
        || entry
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0))
}

fn is_wildcard(host: &str) -> bool {
    matches!(host, "0.0.0.0" | "::" | "[::]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_vllm() {
        let c = KvTransferConfig::parse(r#"{"kv_role": "kv_producer"}"#).unwrap();
        assert_eq!((c.role, c.listen_host.as_str(), c.listen_port), (KvRole::KvProducer, "127.0.0.1", 14579));
        assert_eq!(c.failure_policy, FailurePolicy::Recompute);
        assert_eq!(c.transfer_timeout, Duration::from_secs(30));
        assert_eq!(c.idle_timeout, Duration::from_secs(3));
        assert!(c.role.produces() && !c.role.consumes());
    }

    #[test]
    fn producers_are_loopback_unless_listed() {
        let c = KvTransferConfig::parse(r#"{"kv_role": "kv_consumer"}"#).unwrap();
        for host in ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost", "LOCALHOST"] {
            assert!(c.allows_producer(host, "x"), "{host}");
        }
        for host in ["0.0.0.0", "10.0.0.7", "::", "example.com", "localhost.evil.com", "::ffff:10.0.0.1"] {
            assert!(!c.allows_producer(host, "x"), "{host}");
        }
        let listed = KvTransferConfig::parse(
            r#"{"kv_role": "kv_consumer", "kv_connector_extra_config": {"allowed_producers": ["10.0.0.7:7000"]}}"#,
        )
        .unwrap();
        assert!(listed.allows_producer("10.0.0.7", "10.0.0.7:7000"));
        assert!(!listed.allows_producer("10.0.0.7", "10.0.0.7:7001"));
        // A list replaces the loopback default.
        assert!(!listed.allows_producer("127.0.0.1", "127.0.0.1:7000"));
        let any = KvTransferConfig::parse(
            r#"{"kv_role": "kv_consumer", "kv_connector_extra_config": {"allowed_producers": ["*"]}}"#,
        )
        .unwrap();
        assert!(any.allows_producer("10.9.9.9", "10.9.9.9:1"));
    }

    #[test]
    fn every_field_is_read() {
        let c = KvTransferConfig::parse(
            r#"{"kv_connector": "PagodaTcpConnector", "kv_role": "kv_both", "engine_id": "p0",
                "kv_ip": "0.0.0.0", "kv_port": 7000, "kv_load_failure_policy": "fail",
                "kv_connector_extra_config": {"transfer_timeout_s": 2.5, "hold_timeout_s": 9, "idle_timeout_s": 0.5,
                  "advertise_host": "10.0.0.7", "allowed_producers": ["10.0.0.7:7000"]}}"#,
        )
        .unwrap();
        assert_eq!(c.engine_id.as_deref(), Some("p0"));
        assert_eq!((c.listen_port, c.advertised_host().as_str()), (7000, "10.0.0.7"));
        assert_eq!(c.allowed_producers, Some(vec!["10.0.0.7:7000".to_owned()]));
        assert_eq!(
            (c.transfer_timeout, c.hold_timeout),
            (Duration::from_millis(2500), Duration::from_secs(9))
        );
        assert_eq!(c.idle_timeout, Duration::from_millis(500));
        assert_eq!(c.failure_policy, FailurePolicy::Fail);
    }

    #[test]
    fn what_it_cannot_honour_is_refused_by_name() {
        let err = |json: &str| KvTransferConfig::parse(json).unwrap_err().to_string();
        assert!(
            err(r#"{"kv_role": "kv_producer", "kv_connector": "NixlConnector"}"#).contains("NixlConnector")
        );
        assert!(err(r#"{"kv_role": "kv_producer", "kv_buffer_size": 1e9}"#).contains("kv_buffer_size"));
        assert!(err(r#"{"kv_role": "prefill"}"#).contains("prefill"));
        assert!(err(r#"{}"#).contains("kv_role"));
        assert!(err(r#"{"kv_role": "kv_both", "kv_load_failure_policy": "retry"}"#).contains("retry"));
        let extra = r#"{"kv_role": "kv_both", "kv_connector_extra_config": {"transfer_timeout_s": 0}}"#;
        assert!(err(extra).contains("transfer_timeout_s"));
        let extra = r#"{"kv_role": "kv_both", "kv_connector_extra_config": {"backends": ["UCX"]}}"#;
        assert!(err(extra).contains("backends"));
        let forever = r#"{"kv_role": "kv_both", "kv_connector_extra_config": {"hold_timeout_s": 1e300}}"#;
        assert!(err(forever).contains("hold_timeout_s"));
        assert!(err(r#"{"kv_role": "kv_producer", "kv_ip": "0.0.0.0"}"#).contains("advertise_host"));
        let idle = r#"{"kv_role": "kv_producer", "kv_connector_extra_config": {"idle_timeout_s": -1}}"#;
        assert!(err(idle).contains("idle_timeout_s"));
        for entry in ["10.0.0.7", "10.0.0.7:0", ":7000", "10.0.0.7:http"] {
            let list = format!(
                r#"{{"kv_role": "kv_consumer", "kv_connector_extra_config": {{"allowed_producers": ["{entry}"]}}}}"#
            );
            assert!(err(&list).contains(entry), "{entry}");
        }
    }
}
