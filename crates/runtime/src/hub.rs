//! `--model ORG/NAME` (a safetensors repository) or `--model ORG/NAME/FILE.gguf`: finds the files
//! in the Hugging Face cache (`--download-dir`, else `HF_HOME`), downloading what is missing
//! with a progress bar unless `HF_HUB_OFFLINE` is set, and returns the local path to load.

use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo};

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{id}: no such local path, and `{file}` is not in the Hugging Face cache at {cache} (HF_HUB_OFFLINE is set)")]
    NotCached { id: String, file: String, cache: PathBuf },
    #[error(
        "{id}: no such local path, and downloading `{file}` from the Hugging Face hub failed: {message}"
    )]
    Download { id: String, file: String, message: String },
    #[error("{id}: {file}: {message}")]
    BadIndex { id: String, file: String, message: String },
}

/// Whether `model` names a hub repository (`org/name` or `org/name/file.gguf`) rather than a
/// local path. Local paths win: callers check existence first.
pub fn is_hub_id(model: &str) -> bool {
    let parts: Vec<&str> = model.split('/').collect();
    let valid = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    match parts.as_slice() {
        [org, name] => valid(org) && valid(name),
        [org, name, file] => valid(org) && valid(name) && valid(file) && file.ends_with(".gguf"),
        _ => false,
    }
}

/// `HF_HUB_OFFLINE` set to anything but empty or `0`: use the cache only.
pub fn offline_from_env() -> bool {
    std::env::var_os("HF_HUB_OFFLINE").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Fetches one file: from the cache, or (online) from the hub.
struct Fetcher {
    id: String,
    cache: Cache,
    offline: bool,
}

impl Fetcher {
    fn get(&self, file: &str) -> Result<PathBuf, HubError> {
        if let Some(path) = self.cache.repo(Repo::model(self.id.clone())).get(file) {
            return Ok(path);
        }
        if self.offline {
            return Err(HubError::NotCached {
                id: self.id.clone(),
                file: file.to_string(),
                cache: self.cache.path().clone(),
            });
        }
        let download =
            |message: String| HubError::Download { id: self.id.clone(), file: file.to_string(), message };
        let api = ApiBuilder::from_cache(self.cache.clone())
            .with_progress(true)
            .build()
            .map_err(|e| download(e.to_string()))?;
        api.model(self.id.clone()).get(file).map_err(|e| download(e.to_string()))
    }

    fn get_optional(&self, file: &str) -> Option<PathBuf> {
        self.get(file).ok()
    }
}

/// Local path of `model` (a hub id): the GGUF file, or the snapshot directory holding
/// config.json, the tokenizer files and every safetensors shard.
pub fn resolve(model: &str, download_dir: Option<&Path>, offline: bool) -> Result<PathBuf, HubError> {
    let cache = match download_dir {
        Some(dir) => Cache::new(dir.to_path_buf()),
        None => Cache::from_env(),
    };
    let (id, gguf) = match model.rsplit_once('/') {
        Some((repo, file)) if file.ends_with(".gguf") => (repo.to_string(), Some(file)),
        _ => (model.to_string(), None),
    };
    let fetcher = Fetcher { id: id.clone(), cache, offline };
    if let Some(file) = gguf {
        return fetcher.get(file);
    }
    let config = fetcher.get("config.json")?;
    // The processor's files say how a vision model's images are preprocessed.
    let text = ["tokenizer.json", "tokenizer_config.json", "generation_config.json"];
    for optional in text.into_iter().chain(["preprocessor_config.json", "processor_config.json"]) {
        fetcher.get_optional(optional);
    }
    match fetcher.get_optional("model.safetensors.index.json") {
        Some(index) => {
            let bad = |message: String| HubError::BadIndex {
                id: id.clone(),
                file: "model.safetensors.index.json".into(),
                message,
            };
            let text = std::fs::read_to_string(&index).map_err(|e| bad(e.to_string()))?;
            let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
            let map = json["weight_map"].as_object().ok_or_else(|| bad("no weight_map".into()))?;
            let mut shards: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
            shards.sort_unstable();
            shards.dedup();
            for shard in shards {
                fetcher.get(shard)?;
            }
        }
        None => {
            fetcher.get("model.safetensors")?;
        }
    }
    Ok(config.parent().map(Path::to_path_buf).unwrap_or(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_hub_ids_from_paths() {
        assert!(is_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(is_hub_id("org/repo/model.Q4_K_M.gguf"));
        assert!(!is_hub_id("models/a/b/c.gguf"));
        assert!(!is_hub_id("org/repo/weights.bin"));
        assert!(!is_hub_id("/abs/path"));
        assert!(!is_hub_id("../x"));
        assert!(!is_hub_id("single"));
    }

    /// Lays out a cache the way the hub client does: refs/main -> snapshots/<commit>/files.
    fn cached_repo(root: &Path, id: &str, files: &[(&str, &str)]) {
        let repo = root.join(format!("models--{}", id.replace('/', "--")));
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "0123abcd").unwrap();
        let snapshot = repo.join("snapshots/0123abcd");
        std::fs::create_dir_all(&snapshot).unwrap();
        for (name, text) in files {
            std::fs::write(snapshot.join(name), text).unwrap();
        }
    }

    #[test]
    fn resolves_cached_repositories_offline() {
        let dir = tempfile::tempdir().unwrap();
        let index = r#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#;
        cached_repo(
            dir.path(),
            "org/sharded",
            &[
                ("config.json", "{}"),
                ("model.safetensors.index.json", index),
                ("model-00001-of-00002.safetensors", ""),
                ("model-00002-of-00002.safetensors", ""),
            ],
        );
        let path = resolve("org/sharded", Some(dir.path()), true).unwrap();
        assert!(path.join("config.json").exists() && path.ends_with("snapshots/0123abcd"));

        cached_repo(dir.path(), "org/gguf", &[("m.gguf", "")]);
        assert!(resolve("org/gguf/m.gguf", Some(dir.path()), true).unwrap().ends_with("m.gguf"));

        // A missing shard is an error naming it, not a half-loaded model.
        cached_repo(
            dir.path(),
            "org/partial",
            &[("config.json", "{}"), ("model.safetensors.index.json", index)],
        );
        let e = resolve("org/partial", Some(dir.path()), true).unwrap_err().to_string();
        assert!(e.contains("model-00001-of-00002.safetensors") && e.contains("HF_HUB_OFFLINE"), "{e}");
        let e = resolve("org/absent", Some(dir.path()), true).unwrap_err().to_string();
        assert!(e.contains("org/absent") && e.contains("config.json"), "{e}");
    }
}
