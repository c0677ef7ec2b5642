//! Crafted GGUF files, generated here from the tiny llama (tests/fixtures/tiny/llama/model.gguf)
//! and its GGUF LoRA adapter (tests/fixtures/tiny/lora/a.gguf) by a GGUF writer of the test's
//! own: lying header counts, string and array lengths of 2^33 to 2^62, alignment 0 and not a
//! power of two, tensor offsets and sizes past the end or overflowing, dimension products that
//! overflow, absurd hyper-parameters (block_count 2^33, context_length 2^62, NaN, infinite and
//! negative epsilons and rope bases) and files cut at many offsets (the classes of llama.cpp's
//! CVE-2025-53630 and CVE-2026-27940 and Ollama's CVE-2026-7482). Each either loads and answers
//! as the original does, or fails with a clean error: never a panic, an abort or a model that
//! loads and then fails.

mod common;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::{DType, Device};
use common::*;
use pagoda_models::lora::LoraAdapter;
use pagoda_models::{load_model, LoadOptions};

/// One tensor as the writer lays it out.
#[derive(Clone)]
struct RawTensor {
    name: String,
    /// ggml order (innermost first), as the file stores them.
    dims: Vec<u64>,
    dtype: u32,
    data: Vec<u8>,
    /// Written instead of the laid-out offset.
    offset: Option<u64>,
}

/// A GGUF file in parts, written by [`Gguf::bytes`]; the overrides write what the parts do not
/// say.
#[derive(Clone)]
struct Gguf {
    /// Key and encoded value (type id, then the value).
    kvs: Vec<(String, Vec<u8>)>,
    tensors: Vec<RawTensor>,
    /// Layout alignment of the tensor data (what `general.alignment` says in a sound file).
    align: u64,
    tensor_count: Option<u64>,
    kv_count: Option<u64>,
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn encode_body(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend(x.to_le_bytes()),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        }
        Value::Array(items) => {
            out.extend(items.first().map_or(4, type_id).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|i| encode_body(i, out));
        }
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
    }
}

fn encode(v: &Value) -> Vec<u8> {
    let mut out = type_id(v).to_le_bytes().to_vec();
    encode_body(v, &mut out);
    out
}

/// A value of type `type_id` whose bytes are `body` as given (lengths that lie).
fn raw(type_id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = type_id.to_le_bytes().to_vec();
    out.extend(body);
    out
}

impl Gguf {
    /// The file at `path`, read back with candle's reader (the fixtures are sound).
    fn read(path: &Path) -> Gguf {
        let mut file = File::open(path).unwrap();
        let content = gguf_file::Content::read(&mut file).unwrap();
        let mut keys: Vec<&String> = content.metadata.keys().collect();
        keys.sort();
        let kvs = keys.into_iter().map(|k| (k.clone(), encode(&content.metadata[k]))).collect();
        let mut infos: Vec<(&String, &gguf_file::TensorInfo)> = content.tensor_infos.iter().collect();
        infos.sort_by_key(|(_, info)| info.offset);
        let tensors = infos
            .into_iter()
            .map(|(name, info)| {
                let elems = info.shape.elem_count();
                let len = elems / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
                let mut data = vec![0; len];
                file.seek(SeekFrom::Start(content.tensor_data_offset + info.offset)).unwrap();
                file.read_exact(&mut data).unwrap();
                let dtype = dtype_id(info.ggml_dtype);
                let dims = info.shape.dims().iter().rev().map(|&d| d as u64).collect();
                RawTensor { name: name.clone(), dims, dtype, data, offset: None }
            })
            .collect();
        Gguf { kvs, tensors, align: 32, tensor_count: None, kv_count: None }
    }

    fn set(mut self, key: &str, encoded: Vec<u8>) -> Self {
        match self.kvs.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = encoded,
            None => self.kvs.push((key.to_owned(), encoded)),
        }
        self
    }

    fn set_value(self, key: &str, value: Value) -> Self {
        self.set(key, encode(&value))
    }

    fn tensor(mut self, name: &str, change: impl FnOnce(&mut RawTensor)) -> Self {
        change(self.tensors.iter_mut().find(|t| t.name == name).expect("tensor in the fixture"));
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(self.tensor_count.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        out.extend(self.kv_count.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for (key, value) in &self.kvs {
            out.extend((key.len() as u64).to_le_bytes());
            out.extend(key.as_bytes());
            out.extend(value);
        }
        let pad = |n: u64| n.div_ceil(self.align) * self.align;
        let mut offset = 0;
        for t in &self.tensors {
            out.extend((t.name.len() as u64).to_le_bytes());
            out.extend(t.name.as_bytes());
            out.extend((t.dims.len() as u32).to_le_bytes());
            t.dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(t.dtype.to_le_bytes());
            out.extend(t.offset.unwrap_or(offset).to_le_bytes());
            offset = pad(offset + t.data.len() as u64);
        }
        out.resize(pad(out.len() as u64) as usize, 0);
        for t in &self.tensors {
            out.extend(&t.data);
            out.resize(pad(out.len() as u64) as usize, 0);
        }
        out
    }
}

fn dtype_id(dtype: candle_core::quantized::GgmlDType) -> u32 {
    use candle_core::quantized::GgmlDType::*;
    match dtype {
        F32 => 0,
        F16 => 1,
        Q4_0 => 2,
        Q4_1 => 3,
        Q5_0 => 6,
        Q5_1 => 7,
        Q8_0 => 8,
        Q8_1 => 9,
        Q2K => 10,
        Q3K => 11,
        Q4K => 12,
        Q5K => 13,
        Q6K => 14,
        Q8K => 15,
        BF16 => 30,
    }
}

fn tiny(path: &str) -> PathBuf {
    repo_root().join("tests/fixtures/tiny").join(path)
}

/// A string length prefix of `len` followed by a few bytes: a value that claims more than the
/// file holds.
fn lying_string(len: u64) -> Vec<u8> {
    let mut body = len.to_le_bytes().to_vec();
    body.extend(b"abc");
    raw(8, &body)
}

/// An array of `len` elements of `item_type` with a few bytes after it.
fn lying_array(item_type: u32, len: u64) -> Vec<u8> {
    let mut body = item_type.to_le_bytes().to_vec();
    body.extend(len.to_le_bytes());
    body.extend([0; 16]);
    raw(9, &body)
}

/// The crafted variants of `base` that every GGUF reader must survive: (name, bytes, words one
/// of which the error must contain: empty when the file must load, `[""]` for any error).
/// `big` and `small` name two of its tensors.
fn structural_cases(base: &Gguf, big: &str, small: &str) -> Vec<(String, Vec<u8>, &'static [&'static str])> {
    let mut cases: Vec<(String, Vec<u8>, &'static [&'static str])> = Vec::new();
    let mut add =
        |name: String, g: Gguf, words: &'static [&'static str]| cases.push((name, g.bytes(), words));
    for huge in [1u64 << 33, 1 << 40, 1 << 62, u64::MAX] {
        add(format!("tensor count {huge}"), Gguf { tensor_count: Some(huge), ..base.clone() }, &["tensors"]);
        add(format!("kv count {huge}"), Gguf { kv_count: Some(huge), ..base.clone() }, &["metadata entries"]);
        add(
            format!("string length {huge}"),
            base.clone().set("general.name", lying_string(huge)),
            &["truncated"],
        );
        for item in [0u32, 8, 9] {
            add(
                format!("array of type {item}, length {huge}"),
                base.clone().set("general.tags", lying_array(item, huge)),
                &["arrays", "truncated"],
            );
        }
        add(
            format!("tensor dims {huge} x {huge}"),
            base.clone().tensor(big, |t| t.dims = vec![huge, huge]),
            &["elements"],
        );
        add(
            format!("tensor offset {huge}"),
            base.clone().tensor(small, |t| t.offset = Some(huge)),
            &["truncated", "multiple of the alignment"],
        );
    }
    add(
        "kv count one too many".into(),
        Gguf { kv_count: Some(base.kvs.len() as u64 + 1), ..base.clone() },
        &[""],
    );
    add(
        "tensor count one too many".into(),
        Gguf { tensor_count: Some(base.tensors.len() as u64 + 1), ..base.clone() },
        &[""],
    );
    add("unknown value type".into(), base.clone().set("general.name", raw(77, b"xxxx")), &["value type"]);
    add(
        "array of unknown type".into(),
        base.clone().set("general.tags", lying_array(99, 1)),
        &["value type"],
    );
    let mut nested = raw(9, &[]);
    for _ in 0..40 {
        nested.extend(9u32.to_le_bytes());
        nested.extend(1u64.to_le_bytes());
    }
    add("arrays nested 40 deep".into(), base.clone().set("general.tags", nested), &["deeper"]);
    for (name, value) in [
        ("alignment 0", Value::U32(0)),
        ("alignment 3", Value::U32(3)),
        ("alignment 48", Value::U32(48)),
        ("alignment 2^31", Value::U32(1 << 31)),
        ("alignment -32", Value::I32(-32)),
        ("alignment as u64", Value::U64(32)),
        ("alignment as a string", Value::String("32".into())),
    ] {
        add(name.into(), base.clone().set_value("general.alignment", value), &["general.alignment"]);
    }
    let aligned_64 = base.clone().set_value("general.alignment", Value::U32(64));
    add("alignment 64, laid out at 64".into(), Gguf { align: 64, ..aligned_64 }, &[]);
    add(
        "duplicated key".into(),
        {
            let mut g = base.clone();
            g.kvs.push(g.kvs[0].clone());
            g
        },
        &["twice"],
    );
    add(
        "duplicated tensor".into(),
        {
            let mut g = base.clone();
            let first = g.tensors[0].clone();
            g.tensors.push(first);
            g
        },
        &["twice"],
    );
    add(
        "5 dimensions".into(),
        base.clone().tensor(small, |t| t.dims = vec![1, 1, 1, 1, 64]),
        &["dimensions"],
    );
    add("unknown tensor type".into(), base.clone().tensor(small, |t| t.dtype = 99), &["unknown type"]);
    let partial_block = |t: &mut RawTensor| {
        t.dims = vec![33];
        t.dtype = 2;
    };
    add("not whole blocks".into(), base.clone().tensor(small, partial_block), &["blocks"]);
    add(
        "tensor larger than its data".into(),
        base.clone().tensor(big, |t| t.dims[0] *= 1000),
        &["truncated"],
    );
    let unaligned = |t: &mut RawTensor| t.offset = Some(t.data.len() as u64 + 1);
    add("unaligned offset".into(), base.clone().tensor(small, unaligned), &["alignment", "truncated"]);
    add("name length 2^40".into(), base.clone().set("x", lying_string(1 << 40)), &["truncated"]);
    cases
}

/// Model hyper-parameters no real model has: (name, key, value); the error names the key.
fn hyperparameter_cases() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        ("block_count 2^33", "llama.block_count", Value::U64(1 << 33)),
        ("block_count 2^40", "llama.block_count", Value::U64(1 << 40)),
        ("block_count 0", "llama.block_count", Value::U32(0)),
        ("block_count beyond the tensors", "llama.block_count", Value::U32(4)),
        ("context_length 2^62", "llama.context_length", Value::U64(1 << 62)),
        ("context_length 0", "llama.context_length", Value::U32(0)),
        ("embedding_length 2^40", "llama.embedding_length", Value::U64(1 << 40)),
        ("feed_forward_length 2^40", "llama.feed_forward_length", Value::U64(1 << 40)),
        ("head_count 2^33", "llama.attention.head_count", Value::U64(1 << 33)),
        ("head_count_kv 0", "llama.attention.head_count_kv", Value::U32(0)),
        ("key_length 2^40", "llama.attention.key_length", Value::U64(1 << 40)),
        ("vocab_size 2^40", "llama.vocab_size", Value::U64(1 << 40)),
        ("rms_norm_eps NaN", "llama.attention.layer_norm_rms_epsilon", Value::F32(f32::NAN)),
        ("rms_norm_eps inf", "llama.attention.layer_norm_rms_epsilon", Value::F32(f32::INFINITY)),
        ("rms_norm_eps negative", "llama.attention.layer_norm_rms_epsilon", Value::F32(-1e-5)),
        ("rms_norm_eps 0", "llama.attention.layer_norm_rms_epsilon", Value::F32(0.0)),
        ("rope freq_base NaN", "llama.rope.freq_base", Value::F32(f32::NAN)),
        ("rope freq_base -1", "llama.rope.freq_base", Value::F32(-1.0)),
        ("rope freq_base inf", "llama.rope.freq_base", Value::F32(f32::INFINITY)),
        ("rope scaling factor NaN", "llama.rope.scaling.factor", Value::F32(f32::NAN)),
    ]
}

/// Loads `bytes` as a model; `Ok(None)` when it loads, `Ok(Some(error))` when it is refused,
/// `Err` when the loader panicked.
fn try_load(dir: &Path, name: &str, bytes: &[u8]) -> Result<Option<String>, String> {
    let path = dir.join(format!("{}.gguf", name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")));
    std::fs::write(&path, bytes).unwrap();
    let loaded = std::panic::catch_unwind(|| load_model(&path, &LoadOptions::default()).map(|_| ()));
    match loaded {
        Ok(Ok(())) => Ok(None),
        Ok(Err(e)) => Ok(Some(e.to_string())),
        Err(_) => Err(format!("{name}: the loader panicked")),
    }
}

/// The greedy continuation of a fixed prompt by the model at `path`.
fn answer(path: &Path) -> Vec<u32> {
    let mut runner = runner_for(path, 16);
    greedy(&mut runner, &[1, 20, 300, 4, 55], 6).1
}

#[test]
fn crafted_model_ggufs_fail_cleanly_or_load_and_answer() {
    let base = Gguf::read(&tiny("llama/model.gguf"));
    let dir = tempfile::tempdir().unwrap();
    let sound = dir.path().join("rewritten.gguf");
    std::fs::write(&sound, base.bytes()).unwrap();
    let expected = answer(&tiny("llama/model.gguf"));
    assert_eq!(answer(&sound), expected, "the writer reproduces the fixture");

    let mut failures = Vec::new();
    let mut outcomes = (0, 0);
    let mut check = |name: String, bytes: Vec<u8>, words: &[&str]| match try_load(dir.path(), &name, &bytes) {
        Err(panic) => failures.push(panic),
        Ok(None) if words.is_empty() => {
            outcomes.1 += 1;
            let path = dir.path().join("loaded.gguf");
            std::fs::write(&path, &bytes).unwrap();
            if answer(&path) != expected {
                failures.push(format!("{name}: loaded but answers differently"));
            }
        }
        Ok(None) => failures.push(format!("{name}: loaded, expected an error about {words:?}")),
        Ok(Some(error)) => {
            outcomes.0 += 1;
            if !words.is_empty() && !words.iter().any(|w| error.contains(w)) {
                failures.push(format!("{name}: error `{error}` mentions none of {words:?}"));
            }
        }
    };
    for (name, bytes, words) in structural_cases(&base, "token_embd.weight", "output_norm.weight") {
        check(name, bytes, words);
    }
    for (name, key, value) in hyperparameter_cases() {
        check(name.to_owned(), base.clone().set_value(key, value).bytes(), &[key]);
    }
    let bytes = base.bytes();
    let header_end =
        bytes.len() - base.tensors.iter().map(|t| t.data.len().next_multiple_of(32)).sum::<usize>();
    let cuts = (0..header_end)
        .step_by(header_end / 60 + 1)
        .chain((header_end..bytes.len()).step_by(bytes.len() / 20));
    for cut in cuts.chain([bytes.len() - 1]) {
        check(format!("cut at {cut}"), bytes[..cut].to_vec(), &["truncated", "not a GGUF", "can hold"]);
    }
    assert!(
        failures.is_empty(),
        "{} of the crafted files misbehaved:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(outcomes.0 > 100 && outcomes.1 >= 1, "{outcomes:?}");
}

#[test]
fn crafted_gguf_adapters_fail_cleanly() {
    let model = load_model(&tiny("llama/model.gguf"), &LoadOptions::default()).unwrap().model;
    let config = model.config().clone();
    let base = Gguf::read(&tiny("lora/a.gguf"));
    let dir = tempfile::tempdir().unwrap();
    let load = |name: &str, bytes: &[u8]| {
        let path =
            dir.path().join(format!("{}.gguf", name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")));
        std::fs::write(&path, bytes).unwrap();
        std::panic::catch_unwind(|| {
            LoraAdapter::load(&path, &config, 16, DType::F32, &Device::Cpu).map(|_| ())
        })
        .map_err(|_| format!("{name}: the adapter reader panicked"))
    };
    assert!(load("rewritten", &base.bytes()).unwrap().is_ok(), "the writer reproduces the adapter");
    let mut failures = Vec::new();
    let (big, small) = (base.tensors[0].name.clone(), base.tensors[1].name.clone());
    let mut cases = structural_cases(&base, &big, &small);
    let bytes = base.bytes();
    for cut in (0..bytes.len()).step_by(bytes.len() / 80) {
        cases.push((format!("cut at {cut}"), bytes[..cut].to_vec(), &[""]));
    }
    for (name, bytes, words) in cases {
        match load(&name, &bytes) {
            Err(panic) => failures.push(panic),
            Ok(Ok(())) if words.is_empty() => {}
            Ok(Ok(())) => failures.push(format!("{name}: loaded, expected an error about {words:?}")),
            Ok(Err(e)) if words.is_empty() || words.iter().any(|w| e.to_string().contains(w)) => {}
            Ok(Err(e)) => failures.push(format!("{name}: error `{e}` mentions none of {words:?}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
