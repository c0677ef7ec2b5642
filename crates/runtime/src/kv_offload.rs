//! `--kv-offload`: the prefix cache's offload tiers as given (`host:SIZE`, `disk:PATH:SIZE`),
//! checked, and turned into the engine's [`KvOffloadConfig`] with the model's identity, which a
//! disk tier's blocks must match to be loaded.

use std::path::PathBuf;

use pagoda_engine::kv_tier::KvOffloadConfig;
use serde::Deserialize;

use crate::flags::ByteSize;

/// One `--kv-offload` tier as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvOffloadTier {
    /// `host:SIZE`: host memory, at most SIZE bytes of pages.
    Host(u64),
    /// `disk:PATH:SIZE`: block files under the directory PATH, at most SIZE bytes of pages.
    Disk(PathBuf, u64),
}

impl std::str::FromStr for KvOffloadTier {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let size = |text: &str| match text.parse::<ByteSize>()? {
            ByteSize(0) => Err(format!("the size in {s:?} must be more than 0")),
            ByteSize(n) => Ok(n),
        };
        match s.split_once(':') {
            Some(("host", rest)) => Ok(Self::Host(size(rest)?)),
            // The size is after the last colon, so a path may hold colons.
            Some(("disk", rest)) => match rest.rsplit_once(':') {
                Some((path, bytes)) if !path.is_empty() => Ok(Self::Disk(PathBuf::from(path), size(bytes)?)),
                _ => Err(format!("expected disk:PATH:SIZE, got {s:?}")),
            },
            _ => Err(format!("expected host:SIZE or disk:PATH:SIZE, got {s:?}")),
        }
    }
}

impl<'de> Deserialize<'de> for KvOffloadTier {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// The tiers of one `--kv-offload`, at most one of each kind.
pub fn check(tiers: &[KvOffloadTier]) -> Result<(), String> {
    let hosts = tiers.iter().filter(|t| matches!(t, KvOffloadTier::Host(_))).count();
    if hosts > 1 || tiers.len() - hosts > 1 {
        return Err("give at most one host tier and one disk tier".into());
    }
    Ok(())
}

/// The engine's offload configuration for `tiers`, `None` without any. `identity` names what the
/// KV was computed with (the model, a hash of its configuration, dtypes): a disk tier reopened
/// by a server whose identity differs loads none of its blocks.
pub fn engine_config(tiers: &[KvOffloadTier], identity: String) -> Option<KvOffloadConfig> {
    if tiers.is_empty() {
        return None;
    }
    let mut config = KvOffloadConfig { host_bytes: None, disk: None, model_identity: identity };
    for tier in tiers {
        match tier {
            KvOffloadTier::Host(bytes) => config.host_bytes = Some(*bytes),
            KvOffloadTier::Disk(path, bytes) => config.disk = Some((path.clone(), *bytes)),
        }
    }
    Some(config)
}

/// What a disk tier's blocks must have been computed with: the model's path or name, a hash of
/// its configuration, and the dtypes and quantization that change its KV values.
pub fn model_identity(model: &str, config: &impl std::fmt::Debug, dtypes: &str) -> String {
    let config_hash = pagoda_engine::kv_tier::text_hash(&format!("{config:?}"));
    format!("model {model}; config {config_hash:016x}; {dtypes}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_parse_and_bad_ones_say_why() {
        assert_eq!("host:2GiB".parse(), Ok(KvOffloadTier::Host(2 << 30)));
        assert_eq!(
            "disk:/var/cache/c:d:512MiB".parse(),
            Ok(KvOffloadTier::Disk("/var/cache/c:d".into(), 512 << 20))
        );
        for bad in ["host", "host:0", "gpu:1GiB", "disk:1GiB", "disk::1GiB", "host:lots"] {
            assert!(bad.parse::<KvOffloadTier>().is_err(), "{bad}");
        }
        let two_hosts = [KvOffloadTier::Host(1), KvOffloadTier::Host(2)];
        assert!(check(&two_hosts).is_err());
        let both = [KvOffloadTier::Host(1), KvOffloadTier::Disk("d".into(), 2)];
        assert!(check(&both).is_ok());
        let config = engine_config(&both, "m".into()).unwrap();
        assert_eq!((config.host_bytes, config.disk), (Some(1), Some(("d".into(), 2))));
        assert!(engine_config(&[], "m".into()).is_none());
    }
}
