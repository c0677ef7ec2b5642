//! Our check of a GGUF file's structure, run before candle's reader sees the file: candle trusts
//! `general.alignment` (it divides by it), multiplies tensor dimensions without overflow checks
//! and keeps the last of duplicated names, and our config code allocates by the model's
//! hyper-parameters. Every count, length, size and offset here is bounded by the file's own
//! length before anything is allocated by it, so a crafted file (the classes of llama.cpp's
//! CVE-2025-53630 and CVE-2026-27940, Ollama's CVE-2026-7482) ends in a [`GgufCheckError`]
//! instead of a panic, an abort or a model that loads and then fails every request. The messages
//! name no file: callers add the path where it may be shown.

use std::collections::{HashMap, HashSet};
use std::io::{self, Read, Seek, SeekFrom};

use candle_core::quantized::{gguf_file, GgmlDType};

/// Largest `general.alignment` accepted: above any page size a file would be aligned to.
pub const MAX_ALIGNMENT: u64 = 1 << 20;
/// Most array elements in all of the metadata together: candle and the tokenizer reader keep
/// every element as a 32-byte value, and real vocabularies (tokens, scores, types, merges) stay
/// far below.
pub const MAX_ARRAY_ELEMENTS: u64 = 1 << 24;
/// Longest metadata key or tensor name (llama.cpp's names are under 100 bytes).
pub const MAX_NAME_BYTES: u64 = 1 << 16;
/// Deepest nesting of arrays (real files nest at most once).
const MAX_ARRAY_DEPTH: usize = 4;
/// Most dimensions of a tensor (ggml's `GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Most elements in one tensor: 2^40 is far above any real tensor and keeps every byte size
/// below `u64::MAX` for every type.
const MAX_TENSOR_ELEMENTS: u64 = 1 << 40;

/// Largest layer count, context, widths and vocabulary accepted from a model's metadata.
pub const MAX_LAYERS: u64 = 4096;
pub const MAX_CONTEXT_LENGTH: u64 = 1 << 24;
pub const MAX_WIDTH: u64 = 1 << 20;
pub const MAX_HEADS: u64 = 1 << 12;
pub const MAX_VOCAB: u64 = 1 << 24;
pub const MAX_EXPERTS: u64 = 1 << 12;

/// Why a GGUF file is refused.
#[derive(Debug, thiserror::Error)]
pub enum GgufCheckError {
    #[error("cannot read the file: {0}")]
    Io(#[source] io::Error),
    #[error("not a GGUF file (it does not start with `GGUF`)")]
    BadMagic,
    #[error("GGUF version {0} is not supported (1, 2 and 3 are)")]
    Version(u32),
    #[error("truncated: {what} needs {needed} bytes at byte {at}, the file has {len}")]
    Truncated { what: String, needed: u64, at: u64, len: u64 },
    #[error("the header declares {count} {what}, more than the file's {len} bytes can hold")]
    CountTooLarge { what: &'static str, count: u64, len: u64 },
    #[error("{what} has length {length}, more than {limit}")]
    TooLong { what: String, length: u64, limit: u64 },
    #[error("metadata `{key}` has value type {value_type}, which GGUF does not define")]
    ValueType { key: String, value_type: u32 },
    #[error("metadata `{key}` nests arrays deeper than {MAX_ARRAY_DEPTH}")]
    TooDeep { key: String },
    #[error("metadata key `{0}` appears twice")]
    DuplicateKey(String),
    #[error("general.alignment must be a power of two from 1 to {MAX_ALIGNMENT}, got {0}")]
    Alignment(String),
    #[error("tensor `{name}`: {problem}")]
    Tensor { name: String, problem: String },
    #[error("tensor `{0}` appears twice")]
    DuplicateTensor(String),
    #[error("metadata `{key}`: {problem}")]
    Hyperparameter { key: String, problem: String },
}

type Result<T> = std::result::Result<T, GgufCheckError>;

/// What the check learned: the names of the file's tensors.
#[derive(Debug)]
pub struct CheckedGguf {
    pub tensor_names: HashSet<String>,
}

/// Reads the header, metadata and tensor index of the GGUF at the start of `reader` without
/// keeping any value, and checks them against the file's length; leaves `reader` at its start.
pub fn check_gguf<R: Read + Seek>(reader: &mut R) -> Result<CheckedGguf> {
    let len = reader.seek(SeekFrom::End(0)).map_err(GgufCheckError::Io)?;
    reader.seek(SeekFrom::Start(0)).map_err(GgufCheckError::Io)?;
    let mut r = Bounded { inner: reader, at: 0, len };
    let checked = r.check()?;
    reader.seek(SeekFrom::Start(0)).map_err(GgufCheckError::Io)?;
    Ok(checked)
}

/// A reader that knows how much of the file is left.
struct Bounded<'r, R> {
    inner: &'r mut R,
    at: u64,
    len: u64,
}

impl<R: Read + Seek> Bounded<'_, R> {
    fn need(&self, needed: u64, what: impl FnOnce() -> String) -> Result<()> {
        if needed > self.len - self.at {
            return Err(GgufCheckError::Truncated { what: what(), needed, at: self.at, len: self.len });
        }
        Ok(())
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        self.need(N as u64, || what.to_owned())?;
        let mut buf = [0; N];
        self.inner.read_exact(&mut buf).map_err(GgufCheckError::Io)?;
        self.at += N as u64;
        Ok(buf)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }

    fn skip(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<()> {
        self.need(n, what)?;
        self.inner.seek(SeekFrom::Current(n as i64)).map_err(GgufCheckError::Io)?;
        self.at += n;
        Ok(())
    }

    /// A length prefix: 4 bytes in version 1, 8 after.
    fn length(&mut self, v1: bool, what: &str) -> Result<u64> {
        if v1 {
            self.u32(what).map(u64::from)
        } else {
            self.u64(what)
        }
    }

    /// A name (key or tensor name) of at most [`MAX_NAME_BYTES`], read.
    fn name(&mut self, v1: bool, what: &str) -> Result<String> {
        let n = self.length(v1, what)?;
        if n > MAX_NAME_BYTES {
            return Err(GgufCheckError::TooLong { what: what.to_owned(), length: n, limit: MAX_NAME_BYTES });
        }
        self.need(n, || what.to_owned())?;
        let mut buf = vec![0; n as usize];
        self.inner.read_exact(&mut buf).map_err(GgufCheckError::Io)?;
        self.at += n;
        Ok(String::from_utf8_lossy(&buf).trim_end_matches('\0').to_owned())
    }

    fn check(&mut self) -> Result<CheckedGguf> {
        if self.len < 4 || self.bytes::<4>("the magic")? != *b"GGUF" {
            return Err(GgufCheckError::BadMagic);
        }
        let version = self.u32("the version")?;
        if !(1..=3).contains(&version) {
            return Err(GgufCheckError::Version(version));
        }
        let v1 = version == 1;
        let prefix = if v1 { 4 } else { 8 };
        let tensor_count = self.length(v1, "the tensor count")?;
        let kv_count = self.length(v1, "the metadata count")?;
        // The smallest encodings: a pair is a key length, a type and one byte; a tensor is a
        // name length, a dimension count, a type and an offset.
        let room = self.len - self.at;
        let min_tensor = prefix + 4 + 4 + 8;
        if tensor_count > room / min_tensor {
            return Err(GgufCheckError::CountTooLarge {
                what: "tensors",
                count: tensor_count,
                len: self.len,
            });
        }
        if kv_count > room / (prefix + 5) {
            return Err(GgufCheckError::CountTooLarge {
                what: "metadata entries",
                count: kv_count,
                len: self.len,
            });
        }
        let mut keys = HashSet::new();
        let mut elements = 0u64;
        let mut alignment = gguf_file::DEFAULT_ALIGNMENT;
        for _ in 0..kv_count {
            let key = self.name(v1, "a metadata key")?;
            let value_type = self.u32("a value type")?;
            if key == "general.alignment" {
                alignment = self.alignment(value_type)?;
            } else {
                self.value(&key, value_type, v1, 0, &mut elements)?;
            }
            if !keys.insert(key.clone()) {
                return Err(GgufCheckError::DuplicateKey(key));
            }
        }
        let mut tensors: Vec<(String, u64, u64)> = Vec::with_capacity(tensor_count as usize);
        let mut tensor_names = HashSet::with_capacity(tensor_count as usize);
        for _ in 0..tensor_count {
            let name = self.name(v1, "a tensor name")?;
            let bad = |problem: String| GgufCheckError::Tensor { name: name.clone(), problem };
            let dims = self.u32("a dimension count")?;
            if dims > MAX_DIMS {
                return Err(bad(format!("{dims} dimensions, more than {MAX_DIMS}")));
            }
            let mut elems = 1u64;
            for _ in 0..dims {
                let dim = self.length(v1, "a dimension")?;
                elems = elems
                    .checked_mul(dim)
                    .filter(|&e| e <= MAX_TENSOR_ELEMENTS)
                    .ok_or_else(|| bad(format!("more than {MAX_TENSOR_ELEMENTS} elements")))?;
            }
            let dtype = self.u32("a tensor type")?;
            let dtype = ggml_dtype(dtype).ok_or_else(|| bad(format!("unknown type {dtype}")))?;
            let block = dtype.block_size() as u64;
            if !elems.is_multiple_of(block) {
                return Err(bad(format!("{elems} elements are not whole blocks of {block} ({dtype:?})")));
            }
            let bytes = elems / block * dtype.type_size() as u64;
            let offset = self.u64("a tensor offset")?;
            if !tensor_names.insert(name.clone()) {
                return Err(GgufCheckError::DuplicateTensor(name));
            }
            tensors.push((name, offset, bytes));
        }
        let data_start = self.at.div_ceil(alignment) * alignment;
        for (name, offset, bytes) in tensors {
            let end = data_start.checked_add(offset).and_then(|start| start.checked_add(bytes));
            if end.is_none_or(|end| end > self.len) {
                return Err(GgufCheckError::Tensor {
                    name,
                    problem: format!(
                        "truncated: its {bytes} bytes at data offset {offset} end past the file's {} bytes",
                        self.len
                    ),
                });
            }
            if !offset.is_multiple_of(alignment) {
                return Err(GgufCheckError::Tensor {
                    name,
                    problem: format!("offset {offset} is not a multiple of the alignment {alignment}"),
                });
            }
        }
        Ok(CheckedGguf { tensor_names })
    }

    /// `general.alignment`, of a type candle reads the same way, a power of two in range.
    fn alignment(&mut self, value_type: u32) -> Result<u64> {
        let value: i128 = match value_type {
            0 => self.bytes::<1>("general.alignment")?[0].into(),
            1 => (self.bytes::<1>("general.alignment")?[0] as i8).into(),
            2 => u16::from_le_bytes(self.bytes("general.alignment")?).into(),
            3 => i16::from_le_bytes(self.bytes("general.alignment")?).into(),
            4 => self.u32("general.alignment")?.into(),
            5 => i32::from_le_bytes(self.bytes("general.alignment")?).into(),
            other => return Err(GgufCheckError::Alignment(format!("a value of type {other}"))),
        };
        match u64::try_from(value) {
            Ok(a) if a.is_power_of_two() && a <= MAX_ALIGNMENT => Ok(a),
            _ => Err(GgufCheckError::Alignment(value.to_string())),
        }
    }

    /// Skips one value of `value_type`, checking its lengths.
    fn value(
        &mut self,
        key: &str,
        value_type: u32,
        v1: bool,
        depth: usize,
        elements: &mut u64,
    ) -> Result<()> {
        let what = || format!("metadata `{key}`");
        match value_type {
            0 | 1 | 7 => self.skip(1, what),
            2 | 3 => self.skip(2, what),
            4..=6 => self.skip(4, what),
            10..=12 => self.skip(8, what),
            8 => {
                let n = self.length(v1, &what())?;
                self.skip(n, what)
            }
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufCheckError::TooDeep { key: key.to_owned() });
                }
                let item_type = self.u32(&what())?;
                let n = self.length(v1, &what())?;
                *elements = elements.saturating_add(n);
                if *elements > MAX_ARRAY_ELEMENTS {
                    return Err(GgufCheckError::TooLong {
                        what: format!("the metadata's arrays (at `{key}`)"),
                        length: *elements,
                        limit: MAX_ARRAY_ELEMENTS,
                    });
                }
                let min_size = match item_type {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    10..=12 => 8,
                    8 => {
                        if v1 {
                            4
                        } else {
                            8
                        }
                    }
                    9 => 4 + if v1 { 4 } else { 8 },
                    other => {
                        return Err(GgufCheckError::ValueType { key: key.to_owned(), value_type: other })
                    }
                };
                self.need(n.saturating_mul(min_size), what)?;
                if !matches!(item_type, 8 | 9) {
                    return self.skip(n * min_size, what);
                }
                for _ in 0..n {
                    self.value(key, item_type, v1, depth + 1, elements)?;
                }
                Ok(())
            }
            other => Err(GgufCheckError::ValueType { key: key.to_owned(), value_type: other }),
        }
    }
}

/// The tensor type of ggml's id `id`, among those candle reads (its own table is private).
fn ggml_dtype(id: u32) -> Option<GgmlDType> {
    Some(match id {
        0 => GgmlDType::F32,
        1 => GgmlDType::F16,
        2 => GgmlDType::Q4_0,
        3 => GgmlDType::Q4_1,
        6 => GgmlDType::Q5_0,
        7 => GgmlDType::Q5_1,
        8 => GgmlDType::Q8_0,
        9 => GgmlDType::Q8_1,
        10 => GgmlDType::Q2K,
        11 => GgmlDType::Q3K,
        12 => GgmlDType::Q4K,
        13 => GgmlDType::Q5K,
        14 => GgmlDType::Q6K,
        15 => GgmlDType::Q8K,
        30 => GgmlDType::BF16,
        _ => return None,
    })
}

/// Checks the model hyper-parameters of `{arch}.*` in `metadata` that size allocations or enter
/// every step: counts and widths in range, floats finite and positive, and layer count within
/// the tensors present (`tensor_names`, every layer has `blk.N.` tensors).
pub fn check_hyperparameters<'n>(
    metadata: &HashMap<String, gguf_file::Value>,
    arch: &str,
    tensor_names: impl IntoIterator<Item = &'n String>,
) -> Result<()> {
    let bad = |key: &str, problem: String| GgufCheckError::Hyperparameter { key: key.to_owned(), problem };
    let int = |key: &str, min: u64, max: u64| -> Result<Option<u64>> {
        let full = format!("{arch}.{key}");
        let Some(v) = metadata.get(&full) else { return Ok(None) };
        let n = match v {
            gguf_file::Value::U8(n) => Some(u64::from(*n)),
            gguf_file::Value::U16(n) => Some(u64::from(*n)),
            gguf_file::Value::U32(n) => Some(u64::from(*n)),
            gguf_file::Value::U64(n) => Some(*n),
            gguf_file::Value::I8(n) => u64::try_from(*n).ok(),
            gguf_file::Value::I16(n) => u64::try_from(*n).ok(),
            gguf_file::Value::I32(n) => u64::try_from(*n).ok(),
            gguf_file::Value::I64(n) => u64::try_from(*n).ok(),
            // Per-layer arrays and other types are refused by the config reader.
            _ => return Ok(None),
        };
        match n {
            Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
            _ => Err(bad(&full, format!("{v:?} is outside {min}..={max}"))),
        }
    };
    let layers = int("block_count", 1, MAX_LAYERS)?;
    int("context_length", 1, MAX_CONTEXT_LENGTH)?;
    int("embedding_length", 1, MAX_WIDTH)?;
    int("feed_forward_length", 1, MAX_WIDTH)?;
    int("expert_feed_forward_length", 1, MAX_WIDTH)?;
    int("attention.head_count", 1, MAX_HEADS)?;
    int("attention.head_count_kv", 1, MAX_HEADS)?;
    int("attention.key_length", 1, MAX_WIDTH)?;
    int("attention.value_length", 1, MAX_WIDTH)?;
    int("attention.sliding_window", 0, MAX_CONTEXT_LENGTH)?;
    int("attention.sliding_window_pattern", 0, MAX_LAYERS)?;
    int("vocab_size", 1, MAX_VOCAB)?;
    int("expert_count", 0, MAX_EXPERTS)?;
    int("expert_used_count", 0, MAX_EXPERTS)?;
    int("rope.scaling.original_context_length", 1, MAX_CONTEXT_LENGTH)?;
    if let Some(tokens) = metadata.get("tokenizer.ggml.tokens").and_then(|v| v.to_vec().ok()) {
        if tokens.len() as u64 > MAX_VOCAB {
            return Err(bad(
                "tokenizer.ggml.tokens",
                format!("{} tokens, more than {MAX_VOCAB}", tokens.len()),
            ));
        }
    }
    // (key, whether zero is allowed): epsilons and bases must be positive; caps may be 0 (off).
    let floats = [
        ("attention.layer_norm_rms_epsilon", false),
        ("attention.layer_norm_epsilon", false),
        ("rope.freq_base", false),
        ("rope.freq_base_swa", false),
        ("rope.scaling.factor", false),
        ("rope.scaling.attn_factor", false),
        ("attn_logit_softcapping", true),
        ("final_logit_softcapping", true),
    ];
    for (key, zero_ok) in floats {
        let full = format!("{arch}.{key}");
        let value = match metadata.get(&full) {
            Some(gguf_file::Value::F32(v)) => f64::from(*v),
            Some(gguf_file::Value::F64(v)) => *v,
            _ => continue,
        };
        if !value.is_finite() || value < 0.0 || (value == 0.0 && !zero_ok) {
            let wanted = if zero_ok { "finite and not negative" } else { "finite and positive" };
            return Err(bad(&full, format!("{value} is not {wanted}")));
        }
    }
    if let Some(layers) = layers {
        let last = format!("blk.{}.", layers - 1);
        if !tensor_names.into_iter().any(|n| n.starts_with(&last)) {
            return Err(bad(
                &format!("{arch}.block_count"),
                format!("{layers} layers, but the file has no tensors of layer {}", layers - 1),
            ));
        }
    }
    Ok(())
}
