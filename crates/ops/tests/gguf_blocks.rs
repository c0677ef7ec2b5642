//! `QuantizedWeight` on a real GGUF file: every tensor of Gemma 3 270M's Q4_K_M file in a block
//! format (Q5_0, Q8_0, Q4_K, Q6_K) dequantizes exactly as candle does, and `quant_matmul` on
//! the first layer's weights matches an f64 product of candle's values. The file comes from
//! `make model-gemma3` (`models/gemma-3-270m-q4_k_m.gguf`, or the path in `PAGODA_GEMMA3_GGUF`);
//! without it the test fails.

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;
use std::sync::Arc;

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};
use pagoda_ops::{quant_matmul, QuantFormat, QuantizedWeight};

fn model_path() -> PathBuf {
    std::env::var_os("PAGODA_GEMMA3_GGUF").map(PathBuf::from).unwrap_or_else(|| {
        // Cargo's run-time value: a test binary reused from another checkout's build still
        // carries that checkout's compile-time path.
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
            .join("../../models/gemma-3-270m-q4_k_m.gguf")
    })
}

fn format_of(dtype: GgmlDType) -> Option<QuantFormat> {
    Some(match dtype {
        GgmlDType::Q4_0 => QuantFormat::Q4_0,
        GgmlDType::Q4_1 => QuantFormat::Q4_1,
        GgmlDType::Q5_0 => QuantFormat::Q5_0,
        GgmlDType::Q8_0 => QuantFormat::Q8_0,
        GgmlDType::Q4K => QuantFormat::Q4K,
        GgmlDType::Q5K => QuantFormat::Q5K,
        GgmlDType::Q6K => QuantFormat::Q6K,
        _ => return None,
    })
}

/// At most this many rows of a tensor are compared (the embedding has 262,144).
const MAX_ROWS: usize = 4096;

#[test]
fn real_blocks_dequantize_as_candle_and_multiply() {
    let path = model_path();
    assert!(path.exists(), "{} is missing: run `make model-gemma3`", path.display());
    let mut reader = BufReader::new(File::open(&path).unwrap());
    let content = Content::read(&mut reader).unwrap();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut checked = std::collections::BTreeMap::<String, usize>::new();
    for name in names {
        let q = content.tensor(&mut reader, name, &Device::Cpu).unwrap();
        let Some(format) = format_of(q.dtype()) else { continue };
        let [rows, cols] = <[usize; 2]>::try_from(q.shape().dims()).unwrap();
        let rows = rows.min(MAX_ROWS);
        let bytes = q.data().unwrap();
        let bytes = &bytes[..rows * cols / format.gguf_block_elems() * format.gguf_block_bytes()];
        let w = QuantizedWeight::from_gguf(format, rows, cols, bytes).unwrap();
        let owned = bytes.to_vec();
        let storage =
            QStorage::from_data(std::borrow::Cow::Borrowed(&owned), &Device::Cpu, q.dtype()).unwrap();
        let theirs = QTensor::new(storage, (rows, cols)).unwrap().dequantize(&Device::Cpu).unwrap();
        let theirs: Vec<f32> = theirs.flatten_all().unwrap().to_vec1().unwrap();
        let ours = w.dequantize();
        let same = ours.iter().zip(&theirs).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same && ours.len() == theirs.len(), "{name} ({format:?}) differs from candle");
        *checked.entry(format!("{format:?}")).or_default() += 1;

        if name.starts_with("blk.0.") {
            let x: Vec<f32> = (0..3 * cols).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect();
            let xt = Tensor::from_vec(x.clone(), (3, cols), &Device::Cpu).unwrap();
            let y: Vec<f32> =
                quant_matmul(&xt, &Arc::new(w)).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            for (t, xr) in x.chunks_exact(cols).enumerate() {
                for (r, wr) in theirs.chunks_exact(cols).enumerate() {
                    let terms = wr.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64);
                    let (want, mag) = terms.fold((0.0, 0.0), |(s, m), v| (s + v, m + v.abs()));
                    let got = y[t * rows + r] as f64;
                    assert!((got - want).abs() <= 1e-5 * mag, "{name} token {t} row {r}: {got} vs {want}");
                }
            }
        }
    }
    eprintln!("tensors checked per format: {checked:?}");
    assert!(checked.len() >= 4, "expected Q5_0, Q8_0, Q4_K and Q6_K tensors, got {checked:?}");
}
