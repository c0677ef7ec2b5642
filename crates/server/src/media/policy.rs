//! [`MediaPolicy`]: which image URLs the server reads and the limits on what it decodes, from
//! the flags `--allowed-media-domains`, `--allowed-local-media-path`, `--limit-mm-per-prompt`
//! and `--media-fetch-timeout` (vLLM's names, and for the first three vLLM's meaning).

use std::path::{Path, PathBuf};
use std::time::Duration;

use pagoda_media::MediaLimits;

/// The media flags, resolved and checked (part of the server's configuration).
#[derive(Debug, Clone, PartialEq)]
pub struct MediaSettings {
    /// Hosts `http(s)` image URLs may name (lowercase, exact match); empty: none.
    pub allowed_domains: Vec<String>,
    /// The directory `file://` image URLs must lie under, canonicalized; `None`: none may.
    pub local_root: Option<PathBuf>,
    /// Most images in one request.
    pub max_images: usize,
    /// How long one image fetch may take, redirects included.
    pub fetch_timeout: Duration,
}

impl Default for MediaSettings {
    fn default() -> Self {
        Self {
            allowed_domains: Vec::new(),
            local_root: None,
            max_images: crate::config::defaults::MAX_IMAGES_PER_PROMPT,
            fetch_timeout: Duration::from_secs_f64(crate::config::defaults::MEDIA_FETCH_TIMEOUT_SECONDS),
        }
    }
}

/// `--allowed-media-domains`: host names (a JSON list, as vLLM's flag, or separate values).
/// A value with a scheme, a path or a port is refused: the flag names hosts.
pub fn parse_domains(values: Vec<String>) -> Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for value in values {
        let items: Vec<String> = if value.trim_start().starts_with('[') {
            serde_json::from_str(&value).map_err(|e| format!("expected a JSON list of host names: {e}"))?
        } else {
            vec![value]
        };
        for host in items {
            let host = host.trim().to_ascii_lowercase();
            let bracketed = host.starts_with('[') && host.ends_with(']');
            if host.is_empty() || host.contains(['/', '@', ' ']) || (host.contains(':') && !bracketed) {
                return Err(format!(
                    "{host:?} is not a host name (give e.g. `upload.wikimedia.org`, no scheme or port)"
                ));
            }
            hosts.push(host);
        }
    }
    Ok(hosts)
}

/// `--limit-mm-per-prompt`: vLLM's JSON (`{"image": 4}`; other modalities must be 0, as this
/// server takes no other), its older `image=4`, or a plain number of images.
pub fn parse_limit_mm(value: &str) -> Result<usize, String> {
    let value = value.trim();
    if let Ok(n) = value.parse::<usize>() {
        return Ok(n);
    }
    let pairs: Vec<(String, serde_json::Value)> = if value.starts_with('{') {
        let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(value)
            .map_err(|e| format!("expected a number or JSON such as {{\"image\": 4}}: {e}"))?;
        map.into_iter().collect()
    } else {
        value
            .split(',')
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => Ok((k.trim().to_owned(), serde_json::Value::String(v.trim().to_owned()))),
                None => Err(format!("expected a number or JSON such as {{\"image\": 4}}, got {value:?}")),
            })
            .collect::<Result<_, _>>()?
    };
    let count = |v: &serde_json::Value| match v {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.parse::<u64>().ok(),
        _ => None,
    };
    let mut images = None;
    for (key, v) in &pairs {
        let n = count(v).ok_or_else(|| format!("`{key}` must be a non-negative integer"))?;
        match key.as_str() {
            "image" => images = Some(usize::try_from(n).unwrap_or(usize::MAX)),
            "video" | "audio" if n == 0 => {}
            other => return Err(format!("`{other}` inputs are not served (only `image`)")),
        }
    }
    images.ok_or_else(|| "no `image` limit given".to_owned())
}

/// `--limit-mm-per-prompt` as given: on the command line a number or vLLM's JSON; in a config
/// file a number, that JSON as a string, or a table (`limit-mm-per-prompt = { image = 4 }`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimitArg(pub usize);

impl std::str::FromStr for ImageLimitArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_limit_mm(s).map(ImageLimitArg)
    }
}

impl<'de> serde::Deserialize<'de> for ImageLimitArg {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Count(u64),
            Text(String),
            Table(serde_json::Map<String, serde_json::Value>),
        }
        let text = match Raw::deserialize(deserializer)? {
            Raw::Count(n) => n.to_string(),
            Raw::Text(s) => s,
            Raw::Table(t) => serde_json::Value::Object(t).to_string(),
        };
        parse_limit_mm(&text).map(ImageLimitArg).map_err(serde::de::Error::custom)
    }
}

/// `--allowed-local-media-path`: the directory, canonicalized so that a path under it can be
/// checked after its own `..` and symlinks are resolved.
pub fn canonical_root(dir: &Path) -> Result<PathBuf, String> {
    let root = dir.canonicalize().map_err(|e| format!("{}: {e}", dir.display()))?;
    if !root.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    Ok(root)
}

/// What the image loaders need: the settings and the decoder's limits.
#[derive(Debug, Clone)]
pub struct MediaPolicy {
    pub settings: MediaSettings,
    pub limits: MediaLimits,
}

impl MediaPolicy {
    pub fn new(settings: MediaSettings) -> Self {
        let limits = MediaLimits { max_images_per_request: settings.max_images, ..MediaLimits::default() };
        Self { settings, limits }
    }

    /// Whether `host` may be fetched from.
    pub fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.settings.allowed_domains.contains(&host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_mm_forms() {
        assert_eq!(parse_limit_mm("3"), Ok(3));
        assert_eq!(parse_limit_mm(r#"{"image": 4}"#), Ok(4));
        assert_eq!(parse_limit_mm(r#"{"image": 2, "video": 0}"#), Ok(2));
        assert_eq!(parse_limit_mm("image=5"), Ok(5));
        assert!(parse_limit_mm(r#"{"video": 1}"#).unwrap_err().contains("video"));
        assert!(parse_limit_mm(r#"{"image": -1}"#).is_err());
        assert!(parse_limit_mm(r#"{"image": "x"}"#).is_err());
        assert!(parse_limit_mm("{}").unwrap_err().contains("image"));
        assert!(parse_limit_mm("lots").is_err());
    }

    #[test]
    fn limit_arg_in_a_file() {
        #[derive(serde::Deserialize)]
        struct F {
            l: ImageLimitArg,
        }
        let l = |t: &str| toml::from_str::<F>(t).map(|f| f.l.0);
        assert_eq!(l("l = 3").unwrap(), 3);
        assert_eq!(l(r#"l = '{"image": 4}'"#).unwrap(), 4);
        assert_eq!(l("l = { image = 5 }").unwrap(), 5);
        assert!(l("l = { video = 5 }").is_err());
        assert_eq!("7".parse::<ImageLimitArg>(), Ok(ImageLimitArg(7)));
    }

    #[test]
    fn domains_are_hosts() {
        assert_eq!(
            parse_domains(vec!["Example.COM".into(), r#"["a.b", "127.0.0.1"]"#.into()]),
            Ok(vec!["example.com".to_owned(), "a.b".into(), "127.0.0.1".into()])
        );
        assert!(parse_domains(vec!["https://example.com".into()]).is_err());
        assert!(parse_domains(vec!["example.com:80".into()]).is_err());
        assert!(parse_domains(vec!["".into()]).is_err());
        let policy = MediaPolicy::new(MediaSettings {
            allowed_domains: vec!["example.com".into()],
            ..MediaSettings::default()
        });
        assert!(policy.host_allowed("EXAMPLE.com."));
        assert!(!policy.host_allowed("evil.example.com"));
    }

    #[test]
    fn local_root_must_be_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(canonical_root(dir.path()), Ok(dir.path().canonicalize().unwrap()));
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(canonical_root(&file).is_err());
        assert!(canonical_root(&dir.path().join("missing")).is_err());
    }
}
