//! How adapter files are opened and read: regular files only (a FIFO, a device or a directory
//! named `adapter_config.json` is refused before it is opened, and opening never blocks), inside
//! the directories the caller confines loads to once every symlink is resolved, and never more
//! bytes than the file's own header announces or a bound that the model's shape sets. The
//! errors ([`AdapterError`]) name no path: a server shows them to whoever asked for the load.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Largest `adapter_config.json` read (PEFT writes about a kilobyte).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Largest safetensors header (the safetensors crate's own limit).
const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// Why an adapter cannot be loaded. The messages name files by their role, never by path.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    #[error("{file} does not exist")]
    Missing { file: &'static str },
    #[error("{file} is not a regular file")]
    NotRegular { file: &'static str },
    #[error("{file} resolves outside the directories adapters may be loaded from")]
    Outside { file: &'static str },
    #[error("{file} has {len} bytes, more than the {limit} an adapter of this model can need")]
    TooLarge { file: &'static str, len: u64, limit: u64 },
    #[error("cannot read {file}: {kind}")]
    Io { file: &'static str, kind: io::ErrorKind },
    #[error("{file}: {message}")]
    Invalid { file: &'static str, message: String },
    #[error("the adapter does not fit the model: {0}")]
    Mismatch(String),
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
}

impl AdapterError {
    pub(crate) fn invalid(file: &'static str, message: impl Into<String>) -> Self {
        AdapterError::Invalid { file, message: message.into() }
    }
}

/// Where loads may read from: anywhere (`roots` empty) or below one of `roots`.
#[derive(Debug, Clone, Default)]
pub struct Confinement {
    roots: Vec<PathBuf>,
}

impl Confinement {
    /// Below one of `roots` (anywhere when empty); roots that do not resolve allow nothing.
    pub fn new(roots: &[PathBuf]) -> Self {
        Self { roots: roots.iter().filter_map(|r| std::fs::canonicalize(r).ok()).collect() }
    }

    fn anywhere(&self) -> bool {
        self.roots.is_empty()
    }

    /// `path` with every symlink resolved, when that is inside the roots.
    pub fn resolve(&self, path: &Path, file: &'static str) -> Result<PathBuf, AdapterError> {
        let resolved = std::fs::canonicalize(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => AdapterError::Missing { file },
            kind => AdapterError::Io { file, kind },
        })?;
        if self.anywhere() || self.roots.iter().any(|root| resolved.starts_with(root)) {
            Ok(resolved)
        } else {
            Err(AdapterError::Outside { file })
        }
    }
}

/// `path` opened for reading when it is a regular file inside `confine` of at most `limit`
/// bytes; with its length.
pub(crate) fn open_regular(
    path: &Path,
    file: &'static str,
    confine: &Confinement,
    limit: u64,
) -> Result<(File, u64), AdapterError> {
    let resolved = confine.resolve(path, file)?;
    let io = |e: io::Error| AdapterError::Io { file, kind: e.kind() };
    // Checked before opening: opening a FIFO for reading waits for a writer.
    if !std::fs::metadata(&resolved).map_err(io)?.is_file() {
        return Err(AdapterError::NotRegular { file });
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    // Should the path become a FIFO after the check, the open still returns at once.
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        use std::os::unix::fs::OpenOptionsExt;
        const O_NONBLOCK: i32 = 0o4000;
        options.custom_flags(O_NONBLOCK);
    }
    let handle = options.open(&resolved).map_err(io)?;
    let meta = handle.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(AdapterError::NotRegular { file });
    }
    if meta.len() > limit {
        return Err(AdapterError::TooLarge { file, len: meta.len(), limit });
    }
    Ok((handle, meta.len()))
}

/// All of an opened file of `len` bytes, and no more (a file that grows is cut at `len`).
fn read_all(mut handle: File, len: u64, file: &'static str) -> Result<Vec<u8>, AdapterError> {
    let mut bytes = Vec::with_capacity(len as usize);
    (&mut handle).take(len).read_to_end(&mut bytes).map_err(|e| AdapterError::Io { file, kind: e.kind() })?;
    if bytes.len() as u64 != len {
        return Err(AdapterError::invalid(file, "the file changed while it was read"));
    }
    Ok(bytes)
}

/// The JSON of a PEFT `adapter_config.json`.
pub(crate) fn read_config(path: &Path, confine: &Confinement) -> Result<Value, AdapterError> {
    const FILE: &str = "adapter_config.json";
    let (handle, len) = open_regular(path, FILE, confine, MAX_CONFIG_BYTES)?;
    let bytes = read_all(handle, len, FILE)?;
    serde_json::from_slice(&bytes).map_err(|e| AdapterError::invalid(FILE, e.to_string()))
}

/// The bytes of a safetensors file of at most `limit` bytes, after its header has been checked
/// against the file's length: every tensor's bytes inside the data, of its dtype and shape.
pub(crate) fn read_safetensors(
    path: &Path,
    confine: &Confinement,
    limit: u64,
) -> Result<Vec<u8>, AdapterError> {
    const FILE: &str = "adapter_model.safetensors";
    let (mut handle, len) = open_regular(path, FILE, confine, limit)?;
    let bad = |message: String| AdapterError::invalid(FILE, message);
    let io = |e: io::Error| AdapterError::Io { file: FILE, kind: e.kind() };
    if len < 8 {
        return Err(bad(format!("{len} bytes are too few for a safetensors header")));
    }
    let mut size = [0; 8];
    handle.read_exact(&mut size).map_err(io)?;
    let header_len = u64::from_le_bytes(size);
    if header_len > MAX_SAFETENSORS_HEADER || header_len > len - 8 {
        return Err(bad(format!("the header claims {header_len} bytes, the file has {len}")));
    }
    let mut header = vec![0; header_len as usize];
    handle.read_exact(&mut header).map_err(io)?;
    let header: serde_json::Map<String, Value> =
        serde_json::from_slice(&header).map_err(|e| bad(format!("header: {e}")))?;
    let data_len = len - 8 - header_len;
    for (name, info) in header.iter().filter(|(name, _)| *name != "__metadata__") {
        let wrong = |problem: &str| bad(format!("tensor `{name}`: {problem}"));
        let dtype_bytes = match info["dtype"].as_str() {
            Some("F64" | "I64" | "U64") => 8,
            Some("F32" | "I32" | "U32") => 4,
            Some("F16" | "BF16" | "I16" | "U16") => 2,
            Some("U8" | "I8" | "BOOL" | "F8_E4M3" | "F8_E5M2") => 1,
            _ => return Err(wrong("unsupported or missing dtype")),
        };
        let shape = info["shape"].as_array().ok_or_else(|| wrong("no shape"))?;
        let elems = shape.iter().try_fold(1u64, |n, d| d.as_u64().and_then(|d| n.checked_mul(d)));
        let bytes = elems.and_then(|n| n.checked_mul(dtype_bytes)).ok_or_else(|| wrong("shape overflows"))?;
        let offsets: Option<Vec<u64>> =
            info["data_offsets"].as_array().and_then(|o| o.iter().map(Value::as_u64).collect());
        let Some(&[begin, end]) = offsets.as_deref() else {
            return Err(wrong("data_offsets must be two byte offsets"));
        };
        if begin > end || end > data_len {
            return Err(wrong(&format!("bytes {begin}..{end} are outside the file's {data_len} data bytes")));
        }
        if end - begin != bytes {
            return Err(wrong(&format!("{} bytes for {bytes} bytes of shape {shape:?}", end - begin)));
        }
    }
    handle.seek(SeekFrom::Start(0)).map_err(io)?;
    read_all(handle, len, FILE)
}

/// A GGUF adapter opened, checked by [`crate::gguf_check`] and ready for candle's reader.
pub(crate) fn open_gguf(
    path: &Path,
    confine: &Confinement,
    limit: u64,
) -> Result<std::io::BufReader<File>, AdapterError> {
    const FILE: &str = "the GGUF adapter";
    let (handle, _) = open_regular(path, FILE, confine, limit)?;
    let mut reader = std::io::BufReader::new(handle);
    crate::gguf_check::check_gguf(&mut reader).map_err(|e| AdapterError::invalid(FILE, e.to_string()))?;
    Ok(reader)
}
