//! `file://` image URLs, read only under `--allowed-local-media-path`: the path is
//! canonicalized (its `..` and every symlink resolved) before it is compared with the allowed
//! directory, and its size is checked before it is read.

use std::io::Read;
use std::path::Path;

use pagoda_media::MediaLimits;

use super::error::MediaRefusal;

/// The bytes of the file `url` (`file:///abs/path`) names, if it lies under `root`.
pub fn read_file_url(
    url: &reqwest::Url,
    root: Option<&Path>,
    limits: &MediaLimits,
) -> Result<Vec<u8>, MediaRefusal> {
    let root = root.ok_or(MediaRefusal::LocalOff)?;
    if url.host_str().is_some_and(|h| !h.is_empty() && h != "localhost") {
        return Err(MediaRefusal::BadUrl("a file:// URL must name a local path (file:///path)".into()));
    }
    let path = url.to_file_path().map_err(|()| MediaRefusal::BadUrl("not a local file path".into()))?;
    // A missing file is reported as outside: whether a path exists outside the root is not the
    // client's to learn.
    let real = path.canonicalize().map_err(|_| MediaRefusal::LocalOutside)?;
    if !real.starts_with(root) {
        return Err(MediaRefusal::LocalOutside);
    }
    let file = std::fs::File::open(&real).map_err(|e| MediaRefusal::LocalRead(e.kind().to_string()))?;
    let meta = file.metadata().map_err(|e| MediaRefusal::LocalRead(e.kind().to_string()))?;
    if !meta.is_file() {
        return Err(MediaRefusal::LocalRead("not a regular file".into()));
    }
    limits.check_bytes(meta.len())?;
    // The file may grow after the check: read at most one byte past the limit.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limits.max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| MediaRefusal::LocalRead(e.kind().to_string()))?;
    limits.check_bytes(bytes.len() as u64)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagoda_media::MediaError;

    fn url(path: &Path) -> reqwest::Url {
        reqwest::Url::from_file_path(path).unwrap()
    }

    #[test]
    fn only_under_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let root = root.canonicalize().unwrap();
        std::fs::write(root.join("a.png"), b"\x89PNG").unwrap();
        std::fs::write(dir.path().join("secret.png"), b"secret").unwrap();
        std::fs::write(root.join("empty.png"), b"").unwrap();
        let limits = MediaLimits::default();
        let read = |p: &Path| read_file_url(&url(p), Some(&root), &limits);
        assert_eq!(read(&root.join("a.png")), Ok(b"\x89PNG".to_vec()));
        assert_eq!(read_file_url(&url(&root.join("a.png")), None, &limits), Err(MediaRefusal::LocalOff));
        assert_eq!(read(&dir.path().join("secret.png")), Err(MediaRefusal::LocalOutside));
        // `..` is resolved before the comparison (Url keeps it literally only if percent-encoded).
        let dotdot = reqwest::Url::parse(&format!("file://{}/%2E%2E/secret.png", root.display())).unwrap();
        assert!(read_file_url(&dotdot, Some(&root), &limits).is_err());
        std::os::unix::fs::symlink(dir.path().join("secret.png"), root.join("link.png")).unwrap();
        assert_eq!(read(&root.join("link.png")), Err(MediaRefusal::LocalOutside));
        assert_eq!(read(&root.join("missing.png")), Err(MediaRefusal::LocalOutside));
        assert_eq!(read(&root.join("empty.png")), Err(MediaRefusal::Media(MediaError::Empty)));
        assert!(matches!(read(&root), Err(MediaRefusal::LocalRead(_))));
        let small = MediaLimits { max_bytes: 2, ..limits };
        assert!(matches!(
            read_file_url(&url(&root.join("a.png")), Some(&root), &small),
            Err(MediaRefusal::Media(MediaError::TooManyBytes { .. }))
        ));
        let remote = reqwest::Url::parse("file://example.com/etc/passwd").unwrap();
        assert!(matches!(read_file_url(&remote, Some(&root), &limits), Err(MediaRefusal::BadUrl(_))));
    }
}
