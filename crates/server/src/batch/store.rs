//! The Batch API's state on disk under `--batch-dir`: `files/ID.json` (a File object) beside
//! `files/ID.jsonl` (its content), and `batches/ID.json` (a Batch object) beside the output and
//! error lines a running batch appends (`batches/ID.output.jsonl`, `batches/ID.errors.jsonl`).
//! Every JSON file is written whole to a temporary name and renamed, so a crash leaves the old or
//! the new version, never half of one; a restarted server reads the batches back and resumes the
//! unfinished ones.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::wire::{BatchObject, FileObject};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.to_owned(), source }
}

/// An id the server made: a prefix, then hex digits. Anything else (a client's `../x`) names no
/// file, so ids can be joined to paths safely.
pub fn is_valid_id(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix)
        .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_hexdigit()))
}

pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

#[derive(Debug, Clone)]
pub struct Store {
    files: PathBuf,
    batches: PathBuf,
}

impl Store {
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let store = Self { files: dir.join("files"), batches: dir.join("batches") };
        std::fs::create_dir_all(&store.files).map_err(io(&store.files))?;
        std::fs::create_dir_all(&store.batches).map_err(io(&store.batches))?;
        Ok(store)
    }

    pub fn file_meta_path(&self, id: &str) -> PathBuf {
        self.files.join(format!("{id}.json"))
    }

    pub fn file_content_path(&self, id: &str) -> PathBuf {
        self.files.join(format!("{id}.jsonl"))
    }

    pub fn batch_path(&self, id: &str) -> PathBuf {
        self.batches.join(format!("{id}.json"))
    }

    /// The lines a running batch has answered (`kind`: `output` or `errors`).
    pub fn partial_path(&self, id: &str, kind: &str) -> PathBuf {
        self.batches.join(format!("{id}.{kind}.jsonl"))
    }

    /// Stores `content` as a new file and returns its object.
    pub fn create_file(
        &self,
        filename: &str,
        purpose: &str,
        content: &[u8],
    ) -> Result<FileObject, StoreError> {
        let file = FileObject {
            id: new_id("file-"),
            object: "file".into(),
            bytes: content.len() as u64,
            created_at: super::wire::now(),
            filename: filename.to_owned(),
            purpose: purpose.to_owned(),
            status: "processed".into(),
        };
        write_atomic(&self.file_content_path(&file.id), content)?;
        self.put(&self.file_meta_path(&file.id), &file)?;
        Ok(file)
    }

    /// Makes a batch's partial lines a file of its own (the move is a rename: no copy).
    pub fn adopt_file(&self, from: &Path, filename: &str, purpose: &str) -> Result<FileObject, StoreError> {
        let id = new_id("file-");
        let content = self.file_content_path(&id);
        match std::fs::rename(from, &content) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => write_atomic(&content, b"")?,
            Err(e) => return Err(io(from)(e)),
        }
        let bytes = std::fs::metadata(&content).map_err(io(&content))?.len();
        let file = FileObject {
            id,
            object: "file".into(),
            bytes,
            created_at: super::wire::now(),
            filename: filename.to_owned(),
            purpose: purpose.to_owned(),
            status: "processed".into(),
        };
        self.put(&self.file_meta_path(&file.id), &file)?;
        Ok(file)
    }

    /// `None` when there is no such file.
    pub fn file(&self, id: &str) -> Result<Option<FileObject>, StoreError> {
        if !is_valid_id(id, "file-") {
            return Ok(None);
        }
        self.get(&self.file_meta_path(id))
    }

    pub fn files(&self) -> Result<Vec<FileObject>, StoreError> {
        let mut files: Vec<FileObject> = self.all(&self.files)?;
        files.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| a.id.cmp(&b.id)));
        Ok(files)
    }

    /// Removes a file; `false` when there was none.
    pub fn delete_file(&self, id: &str) -> Result<bool, StoreError> {
        if self.file(id)?.is_none() {
            return Ok(false);
        }
        let meta = self.file_meta_path(id);
        std::fs::remove_file(&meta).map_err(io(&meta))?;
        let content = self.file_content_path(id);
        match std::fs::remove_file(&content) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&content)(e)),
            _ => Ok(true),
        }
    }

    pub fn put_batch(&self, batch: &BatchObject) -> Result<(), StoreError> {
        self.put(&self.batch_path(&batch.id), batch)
    }

    pub fn batches(&self) -> Result<Vec<BatchObject>, StoreError> {
        self.all(&self.batches)
    }

    fn put<T: Serialize>(&self, path: &Path, value: &T) -> Result<(), StoreError> {
        let json = serde_json::to_vec_pretty(value)
            .map_err(|source| StoreError::Json { path: path.to_owned(), source })?;
        write_atomic(path, &json)
    }

    fn get<T: DeserializeOwned>(&self, path: &Path) -> Result<Option<T>, StoreError> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| StoreError::Json { path: path.to_owned(), source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(path)(e)),
        }
    }

    /// Every `*.json` of `dir`; an unreadable one is skipped with a warning (one bad file must not
    /// hide the others).
    fn all<T: DeserializeOwned>(&self, dir: &Path) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            if path.extension().is_some_and(|e| e == "json") {
                match self.get(&path) {
                    Ok(Some(v)) => out.push(v),
                    Ok(None) => {}
                    Err(e) => tracing::warn!("batch store: skipping {e}"),
                }
            }
        }
        Ok(out)
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_name_no_server_file_are_refused() {
        assert!(is_valid_id("file-0123abcd", "file-"));
        assert!(!is_valid_id("file-", "file-"));
        assert!(!is_valid_id("file-../../etc", "file-"));
        assert!(!is_valid_id("batch_00", "file-"));
    }

    #[test]
    fn files_round_trip_and_delete() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let f = store.create_file("in.jsonl", "batch", b"{}\n").unwrap();
        assert_eq!(store.file(&f.id).unwrap().unwrap(), f);
        assert_eq!(std::fs::read(store.file_content_path(&f.id)).unwrap(), b"{}\n");
        assert_eq!(store.files().unwrap().len(), 1);
        assert!(store.delete_file(&f.id).unwrap());
        assert!(!store.delete_file(&f.id).unwrap());
        assert!(store.file(&f.id).unwrap().is_none());
    }
}
