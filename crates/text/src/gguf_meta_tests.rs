//! Tests for the GGUF metadata reader, on files built byte by byte.

use super::*;

/// Builds GGUF headers and metadata in memory.
struct Builder {
    bytes: Vec<u8>,
}

impl Builder {
    fn new(version: u32, tensor_count: u64, kv_count: u64) -> Self {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend_from_slice(&version.to_le_bytes());
        bytes.extend_from_slice(&tensor_count.to_le_bytes());
        bytes.extend_from_slice(&kv_count.to_le_bytes());
        Self { bytes }
    }

    fn string(&mut self, s: &str) -> &mut Self {
        self.bytes.extend_from_slice(&(s.len() as u64).to_le_bytes());
        self.bytes.extend_from_slice(s.as_bytes());
        self
    }

    fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(b);
        self
    }

    fn key(&mut self, key: &str, ty: u32) -> &mut Self {
        self.string(key).raw(&ty.to_le_bytes())
    }

    fn write(&self, name: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("pagoda-text-gguf-{}-{name}.gguf", std::process::id()));
        std::fs::write(&path, &self.bytes).unwrap();
        path
    }
}

/// A file with one key of every value type, including a nested array.
fn every_type(version: u32) -> Builder {
    let mut b = Builder::new(version, 7, 16);
    b.key("u8", 0).raw(&[200]);
    b.key("i8", 1).raw(&(-5i8).to_le_bytes());
    b.key("u16", 2).raw(&60000u16.to_le_bytes());
    b.key("i16", 3).raw(&(-3000i16).to_le_bytes());
    b.key("u32", 4).raw(&4_000_000_000u32.to_le_bytes());
    b.key("i32", 5).raw(&(-7i32).to_le_bytes());
    b.key("f32", 6).raw(&1.5f32.to_le_bytes());
    b.key("bool", 7).raw(&[1]);
    b.key("general.architecture", 8).string("llama");
    b.key("u64", 10).raw(&(1u64 << 40).to_le_bytes());
    b.key("i64", 11).raw(&(-1i64 << 40).to_le_bytes());
    b.key("f64", 12).raw(&0.25f64.to_le_bytes());
    b.key("strs", 9).raw(&8u32.to_le_bytes()).raw(&3u64.to_le_bytes());
    b.string("a").string("").string("ü😀");
    b.key("ints", 9).raw(&5u32.to_le_bytes()).raw(&2u64.to_le_bytes());
    b.raw(&1i32.to_le_bytes()).raw(&(-2i32).to_le_bytes());
    // An array of two arrays of u16.
    b.key("nested", 9).raw(&9u32.to_le_bytes()).raw(&2u64.to_le_bytes());
    b.raw(&2u32.to_le_bytes()).raw(&1u64.to_le_bytes()).raw(&7u16.to_le_bytes());
    b.raw(&2u32.to_le_bytes()).raw(&0u64.to_le_bytes());
    b.key("empty", 9).raw(&8u32.to_le_bytes()).raw(&0u64.to_le_bytes());
    // Tensor infos would follow; the reader must not need them.
    b.raw(b"tensor info garbage");
    b
}

#[test]
fn reads_every_value_type_in_v2_and_v3() {
    for version in [2, 3] {
        let path = every_type(version).write(&format!("types-v{version}"));
        let meta = GgufMetadata::read(&path).unwrap();
        assert_eq!(meta.version(), version);
        assert_eq!(meta.tensor_count(), 7);
        assert_eq!(meta.keys().count(), 16);
        assert_eq!(meta.keys().next(), Some("u8"));
        assert_eq!(meta.architecture().unwrap(), "llama");
        assert_eq!(meta.get_u32("u8").unwrap(), 200);
        assert_eq!(meta.get_i64("i8").unwrap(), -5);
        assert_eq!(meta.get_u32("u16").unwrap(), 60000);
        assert_eq!(meta.get_i64("i16").unwrap(), -3000);
        assert_eq!(meta.get_u32("u32").unwrap(), 4_000_000_000);
        assert_eq!(meta.get_u64("u64").unwrap(), 1 << 40);
        assert_eq!(meta.get_i64("i64").unwrap(), -1 << 40);
        assert_eq!(meta.get_f64("f32").unwrap(), 1.5);
        assert_eq!(meta.get_f64("f64").unwrap(), 0.25);
        assert!(meta.get_bool("bool").unwrap());
        assert_eq!(meta.get_str_array("strs").unwrap(), vec!["a", "", "ü😀"]);
        assert_eq!(meta.get_i32_array("ints").unwrap(), vec![1, -2]);
        assert_eq!(meta.get_f64_array("ints").unwrap(), vec![1.0, -2.0]);
        assert_eq!(meta.get_str_array("empty").unwrap(), Vec::<&str>::new());
        assert_eq!(
            meta.get("nested"),
            Some(&MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::U16(7)]),
                MetaValue::Array(vec![]),
            ]))
        );
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn integer_accessors_check_range_and_sign() {
    let path = every_type(3).write("ranges");
    let meta = GgufMetadata::read(&path).unwrap();
    // Negative values do not fit unsigned accessors; u64 values above u32::MAX not u32.
    assert!(matches!(
        meta.get_u32("i8"),
        Err(GgufError::WrongType { ref key, .. }) if key == "i8"
    ));
    assert!(meta.get_u64("i64").is_err());
    assert!(meta.get_u32("u64").is_err());
    assert_eq!(meta.get_u64("u32").unwrap(), 4_000_000_000);
    std::fs::remove_file(path).unwrap();
}

#[test]
fn wrong_type_and_missing_key_errors_name_file_and_key() {
    let path = every_type(3).write("errors");
    let meta = GgufMetadata::read(&path).unwrap();
    let err = meta.get_str("u8").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("\"u8\"") && msg.contains("string") && msg.contains("u8 200"), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(matches!(meta.get_bool("general.architecture"), Err(GgufError::WrongType { .. })));
    assert!(matches!(meta.get_str_array("ints"), Err(GgufError::WrongType { .. })));
    assert!(matches!(meta.get_i32_array("strs"), Err(GgufError::WrongType { .. })));
    assert!(matches!(meta.get_i32_array("u32"), Err(GgufError::WrongType { .. })));
    assert!(matches!(meta.get_f64_array("strs"), Err(GgufError::WrongType { .. })));
    assert!(matches!(meta.get_f64_array("f32"), Err(GgufError::WrongType { .. })));
    let err = meta.get_u32("nope").unwrap_err();
    assert!(matches!(err, GgufError::MissingKey { ref key, .. } if key == "nope"));
    assert!(err.to_string().contains("missing"));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn missing_file_is_not_found() {
    let path = std::env::temp_dir().join("pagoda-text-no-such-file.gguf");
    let err = GgufMetadata::read(&path).unwrap_err();
    assert!(matches!(err, GgufError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("pagoda-text-no-such-file.gguf"));
}

#[test]
fn bad_magic_is_reported() {
    let mut b = every_type(3);
    b.bytes[..4].copy_from_slice(b"\x7fELF");
    let path = b.write("magic");
    let err = GgufMetadata::read(&path).unwrap_err();
    assert!(matches!(err, GgufError::BadMagic { found, .. } if &found == b"\x7fELF"), "{err:?}");
    assert!(err.to_string().contains("not a GGUF file"));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn unsupported_versions_are_reported() {
    for version in [1, 4, 0x0300_0000] {
        let path = every_type(version).write(&format!("version-{version}"));
        let err = GgufMetadata::read(&path).unwrap_err();
        assert!(matches!(err, GgufError::UnsupportedVersion { version: v, .. } if v == version), "{err:?}");
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn every_truncation_point_is_an_error_not_a_panic() {
    let full = every_type(3);
    // Up to the end of the metadata; the trailing bytes stand for tensor infos.
    let meta_end = full.bytes.len() - b"tensor info garbage".len();
    for cut in 0..meta_end {
        let b = Builder { bytes: full.bytes[..cut].to_vec() };
        let path = b.write("cut");
        let err = GgufMetadata::read(&path).unwrap_err();
        assert!(matches!(err, GgufError::Truncated { .. }), "cut at {cut}: {err:?}");
        assert!(err.to_string().contains("truncated"));
    }
    let _ = std::fs::remove_file(
        std::env::temp_dir().join(format!("pagoda-text-gguf-{}-cut.gguf", std::process::id())),
    );
}

#[test]
fn absurd_lengths_are_truncation_not_allocation() {
    let mut b = Builder::new(3, 0, 1);
    b.key("big", 9).raw(&8u32.to_le_bytes()).raw(&u64::MAX.to_le_bytes());
    let path = b.write("absurd-array");
    assert!(matches!(GgufMetadata::read(&path), Err(GgufError::Truncated { .. })));

    let mut b = Builder::new(3, 0, 1);
    b.raw(&(1u64 << 60).to_le_bytes());
    let path2 = b.write("absurd-key");
    assert!(matches!(GgufMetadata::read(&path2), Err(GgufError::Truncated { .. })));

    let b = Builder::new(3, 0, u64::MAX);
    let path3 = b.write("absurd-count");
    assert!(matches!(GgufMetadata::read(&path3), Err(GgufError::Truncated { .. })));
    for p in [path, path2, path3] {
        std::fs::remove_file(p).unwrap();
    }
}

#[test]
fn malformed_values_are_reported() {
    let mut b = Builder::new(3, 0, 1);
    b.key("x", 13).raw(&[0; 8]);
    let path = b.write("unknown-type");
    let err = GgufMetadata::read(&path).unwrap_err();
    assert!(err.to_string().contains("unknown value type 13"), "{err}");

    let mut b = Builder::new(3, 0, 1);
    b.key("flag", 7).raw(&[2]);
    let path2 = b.write("bad-bool");
    assert!(matches!(GgufMetadata::read(&path2), Err(GgufError::Malformed { .. })));

    let mut b = Builder::new(3, 0, 2);
    b.key("k", 0).raw(&[1]).key("k", 0).raw(&[2]);
    let path3 = b.write("dup");
    let err = GgufMetadata::read(&path3).unwrap_err();
    assert!(err.to_string().contains("appears twice"), "{err}");

    let mut b = Builder::new(3, 0, 1);
    b.key("s", 8).raw(&2u64.to_le_bytes()).raw(&[0xff, 0xfe]);
    let path4 = b.write("utf8");
    let err = GgufMetadata::read(&path4).unwrap_err();
    assert!(err.to_string().contains("UTF-8"), "{err}");

    // Arrays nested past the limit.
    let mut b = Builder::new(3, 0, 1);
    b.key("deep", 9);
    for _ in 0..=MAX_ARRAY_DEPTH {
        b.raw(&9u32.to_le_bytes()).raw(&1u64.to_le_bytes());
    }
    b.raw(&[0; 64]);
    let path5 = b.write("deep");
    let err = GgufMetadata::read(&path5).unwrap_err();
    assert!(err.to_string().contains("too deeply"), "{err}");
    for p in [path, path2, path3, path4, path5] {
        std::fs::remove_file(p).unwrap();
    }
}
