//! A reader for the metadata section of GGUF files (llama.cpp's model format).
//!
//! The tokenizer of a GGUF model lives in its key/value metadata. This reader parses the header
//! and every key/value pair, then stops: tensor infos and tensor data are not touched, and the file
//! is read through a buffer, so loading a multi-gigabyte model's tokenizer reads only the first
//! few megabytes. GGUF versions 2 and 3 (little-endian) are supported.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

/// The four bytes every GGUF file starts with.
const MAGIC: [u8; 4] = *b"GGUF";

/// Nesting limit for arrays of arrays; real files nest at most once, and the limit keeps a
/// malicious file from recursing the reader into a stack overflow.
const MAX_ARRAY_DEPTH: usize = 8;

/// Why a GGUF file's metadata could not be read or lacks something.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("GGUF file {path}: not found")]
    NotFound { path: PathBuf },
    #[error("GGUF file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} is not a GGUF file: it starts with {found:?}, not \"GGUF\"")]
    BadMagic { path: PathBuf, found: [u8; 4] },
    #[error("GGUF file {path}: version {version} is not supported (only 2 and 3)")]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error("GGUF file {path}: truncated while reading {what}")]
    Truncated { path: PathBuf, what: String },
    #[error("GGUF file {path}: {what}")]
    Malformed { path: PathBuf, what: String },
    #[error("GGUF file {path}: metadata key {key:?} is missing")]
    MissingKey { path: PathBuf, key: String },
    #[error("GGUF file {path}: metadata key {key:?} holds {found}, expected {expected}")]
    WrongType { path: PathBuf, key: String, expected: &'static str, found: String },
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    /// The value as a signed integer, whatever its integer type; `None` for non-integers and
    /// for a `u64` too large for `i64`.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// A short description of the value's type for error messages.
    pub fn type_name(&self) -> String {
        match self {
            MetaValue::U8(_) => "u8".into(),
            MetaValue::I8(_) => "i8".into(),
            MetaValue::U16(_) => "u16".into(),
            MetaValue::I16(_) => "i16".into(),
            MetaValue::U32(_) => "u32".into(),
            MetaValue::I32(_) => "i32".into(),
            MetaValue::U64(_) => "u64".into(),
            MetaValue::I64(_) => "i64".into(),
            MetaValue::F32(_) => "f32".into(),
            MetaValue::F64(_) => "f64".into(),
            MetaValue::Bool(_) => "bool".into(),
            MetaValue::String(_) => "string".into(),
            MetaValue::Array(items) => match items.first() {
                Some(first) => format!("array of {}", first.type_name()),
                None => "empty array".into(),
            },
        }
    }
}

/// The header and key/value metadata of one GGUF file.
#[derive(Clone)]
pub struct GgufMetadata {
    path: PathBuf,
    version: u32,
    tensor_count: u64,
    values: HashMap<String, MetaValue>,
    /// Keys in file order, for listing.
    keys: Vec<String>,
}

impl fmt::Debug for GgufMetadata {
    // The vocabulary arrays are huge; the summary is what is useful in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufMetadata")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("tensor_count", &self.tensor_count)
            .field("keys", &self.keys.len())
            .finish()
    }
}

impl GgufMetadata {
    /// Reads the header and all metadata of the GGUF file at `path`.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| match source.kind() {
            io::ErrorKind::NotFound => GgufError::NotFound { path: path.clone() },
            _ => GgufError::Io { path: path.clone(), source },
        })?;
        let len = file.metadata().map_err(|source| GgufError::Io { path: path.clone(), source })?.len();
        let mut reader =
            Reader { inner: BufReader::with_capacity(1 << 16, file), path: &path, remaining: len };
        let (version, tensor_count, values, keys) = reader.read_all()?;
        Ok(Self { path, version, tensor_count, values, keys })
    }

    /// The file this was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Number of tensors the file declares (their infos are not read).
    pub fn tensor_count(&self) -> u64 {
        self.tensor_count
    }

    /// All keys, in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(String::as_str)
    }

    /// Whether `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }

    /// The raw value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.values.get(key)
    }

    /// `general.architecture`, e.g. `"llama"`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let value = self.require(key)?;
        value.as_str().ok_or_else(|| self.wrong_type(key, "string", value))
    }

    /// An integer value of any integer type that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.get_int(key, "unsigned 32-bit integer")
    }

    /// An integer value of any integer type that fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.get_int(key, "unsigned 64-bit integer")
    }

    /// An integer value of any integer type that fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.get_int(key, "signed 64-bit integer")
    }

    /// A float value (`f32` or `f64`; integers are accepted too).
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let value = self.require(key)?;
        match *value {
            MetaValue::F32(v) => Ok(v.into()),
            MetaValue::F64(v) => Ok(v),
            // Integers up to 2^53 convert exactly; larger ones are not plausible float settings.
            _ => value.as_i128().map(|v| v as f64).ok_or_else(|| self.wrong_type(key, "number", value)),
        }
    }

    /// A boolean value.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            MetaValue::Bool(v) => Ok(*v),
            other => Err(self.wrong_type(key, "bool", other)),
        }
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let value = self.require(key)?;
        let MetaValue::Array(items) = value else {
            return Err(self.wrong_type(key, "array of strings", value));
        };
        items
            .iter()
            .map(|item| item.as_str())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.wrong_type(key, "array of strings", value))
    }

    /// An array of integers (any integer element type whose values fit in `i32`).
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        let value = self.require(key)?;
        let MetaValue::Array(items) = value else {
            return Err(self.wrong_type(key, "array of integers", value));
        };
        items
            .iter()
            .map(|item| item.as_i128().and_then(|v| i32::try_from(v).ok()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.wrong_type(key, "array of 32-bit integers", value))
    }

    /// An array of numbers as `f64` (`f32` or `f64` elements; integers are accepted too), e.g.
    /// `tokenizer.ggml.scores`.
    pub fn get_f64_array(&self, key: &str) -> Result<Vec<f64>, GgufError> {
        let value = self.require(key)?;
        let MetaValue::Array(items) = value else {
            return Err(self.wrong_type(key, "array of numbers", value));
        };
        items
            .iter()
            .map(|item| match *item {
                MetaValue::F32(v) => Some(f64::from(v)),
                MetaValue::F64(v) => Some(v),
                _ => item.as_i128().map(|v| v as f64),
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.wrong_type(key, "array of numbers", value))
    }

    fn get_int<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T, GgufError> {
        let value = self.require(key)?;
        value.as_i128().and_then(|v| T::try_from(v).ok()).ok_or_else(|| self.wrong_type(key, expected, value))
    }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.values
            .get(key)
            .ok_or_else(|| GgufError::MissingKey { path: self.path.clone(), key: key.to_owned() })
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &MetaValue) -> GgufError {
        let found = match found.as_i128() {
            Some(v) => format!("{} {v}", found.type_name()),
            None => found.type_name(),
        };
        GgufError::WrongType { path: self.path.clone(), key: key.to_owned(), expected, found }
    }
}

type Parsed = (u32, u64, HashMap<String, MetaValue>, Vec<String>);

/// Little-endian reads that know how much of the file is left, so corrupt lengths are reported
/// as truncation instead of triggering huge allocations.
struct Reader<'a, R> {
    inner: R,
    path: &'a Path,
    remaining: u64,
}

impl<R: Read> Reader<'_, R> {
    fn read_all(&mut self) -> Result<Parsed, GgufError> {
        let magic: [u8; 4] = self.bytes("the magic number")?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic { path: self.path.to_path_buf(), found: magic });
        }
        let version = u32::from_le_bytes(self.bytes("the version")?);
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion { path: self.path.to_path_buf(), version });
        }
        let tensor_count = u64::from_le_bytes(self.bytes("the tensor count")?);
        let kv_count = u64::from_le_bytes(self.bytes("the metadata count")?);
        // Each pair takes at least a 8-byte key length, 4-byte type and 1-byte value.
        self.check_room(kv_count, 13, "the metadata key/value pairs")?;

        let mut values = HashMap::new();
        let mut keys = Vec::new();
        for index in 0..kv_count {
            let key = self.string(&format!("the key of metadata entry {index}"))?;
            let ty = u32::from_le_bytes(self.bytes(&format!("the type of {key:?}"))?);
            let value = self.value(ty, &key, 0)?;
            if values.insert(key.clone(), value).is_some() {
                return Err(self.malformed(format!("metadata key {key:?} appears twice")));
            }
            keys.push(key);
        }
        Ok((version, tensor_count, values, keys))
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<MetaValue, GgufError> {
        let what = || format!("the value of {key:?}");
        Ok(match ty {
            0 => MetaValue::U8(u8::from_le_bytes(self.bytes(&what())?)),
            1 => MetaValue::I8(i8::from_le_bytes(self.bytes(&what())?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.bytes(&what())?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.bytes(&what())?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.bytes(&what())?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.bytes(&what())?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.bytes(&what())?)),
            7 => match u8::from_le_bytes(self.bytes(&what())?) {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                other => {
                    return Err(self.malformed(format!("{key:?} holds bool byte {other}")));
                }
            },
            8 => MetaValue::String(self.string(&what())?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.malformed(format!("{key:?} nests arrays too deeply")));
                }
                let elem_ty = u32::from_le_bytes(self.bytes(&what())?);
                let len = u64::from_le_bytes(self.bytes(&what())?);
                self.check_room(len, min_encoded_size(elem_ty), &what())?;
                // check_room bounded len by the file size, so this fits in memory terms.
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(self.value(elem_ty, key, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.bytes(&what())?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.bytes(&what())?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.bytes(&what())?)),
            other => {
                return Err(self.malformed(format!("{key:?} has unknown value type {other}")));
            }
        })
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = u64::from_le_bytes(self.bytes(what)?);
        self.check_room(len, 1, what)?;
        let mut buf = vec![0; len as usize];
        self.fill(&mut buf, what)?;
        String::from_utf8(buf).map_err(|_| self.malformed(format!("{what} is not valid UTF-8")))
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut buf = [0; N];
        self.fill(&mut buf, what)?;
        Ok(buf)
    }

    fn fill(&mut self, buf: &mut [u8], what: &str) -> Result<(), GgufError> {
        self.inner.read_exact(buf).map_err(|source| {
            if source.kind() == io::ErrorKind::UnexpectedEof {
                self.truncated(what)
            } else {
                GgufError::Io { path: self.path.to_path_buf(), source }
            }
        })?;
        self.remaining = self.remaining.saturating_sub(buf.len() as u64);
        Ok(())
    }

    /// Fails early when `count` items of at least `min_size` bytes cannot fit in what is left.
    fn check_room(&self, count: u64, min_size: u64, what: &str) -> Result<(), GgufError> {
        match count.checked_mul(min_size) {
            Some(needed) if needed <= self.remaining => Ok(()),
            _ => Err(self.truncated(what)),
        }
    }

    fn truncated(&self, what: &str) -> GgufError {
        GgufError::Truncated { path: self.path.to_path_buf(), what: what.to_owned() }
    }

    fn malformed(&self, what: String) -> GgufError {
        GgufError::Malformed { path: self.path.to_path_buf(), what }
    }
}

/// The fewest bytes one value of type `ty` can take in the file.
fn min_encoded_size(ty: u32) -> u64 {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        // An array header: element type plus length.
        9 => 12,
        // Unknown types fail when the first element is read.
        _ => 1,
    }
}

#[cfg(test)]
#[path = "gguf_meta_tests.rs"]
mod tests;
