//! [`QuantizedWeight`]'s values against the GGUF definitions and, for random bytes of every
//! format, against candle's own dequantization bit for bit.

use std::borrow::Cow;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Device;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// Byte offsets of the f16 fields in one GGUF block of `format`.
fn half_fields(format: QuantFormat) -> &'static [usize] {
    match format {
        QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => &[0],
        QuantFormat::Q4_1 | QuantFormat::Q4K | QuantFormat::Q5K => &[0, 2],
        QuantFormat::Q6K => &[208],
    }
}

/// GGUF bytes of a `[rows, cols]` matrix of `format`: random codes and packed sub-block scales,
/// with every f16 field (`d`, `m`, `dmin`) drawn by `half`.
pub(crate) fn random_gguf(
    rng: &mut StdRng,
    format: QuantFormat,
    rows: usize,
    cols: usize,
    half: impl Fn(&mut StdRng) -> f16,
) -> Vec<u8> {
    let blocks = rows * cols / format.gguf_block_elems();
    let block_bytes = format.gguf_block_bytes();
    let mut bytes: Vec<u8> = (0..blocks * block_bytes).map(|_| rng.random()).collect();
    for block in bytes.chunks_exact_mut(block_bytes) {
        for &at in half_fields(format) {
            block[at..at + 2].copy_from_slice(&half(rng).to_le_bytes());
        }
    }
    bytes
}

/// A random `[rows, cols]` matrix of `format` whose f16 scales (and minimums) lie within
/// plus or minus 0.02.
pub(crate) fn small_random_weight(
    rng: &mut StdRng,
    format: QuantFormat,
    rows: usize,
    cols: usize,
) -> QuantizedWeight {
    let bytes = random_gguf(rng, format, rows, cols, |r| f16::from_f32(r.random_range(-0.02f32..0.02)));
    QuantizedWeight::from_gguf(format, rows, cols, &bytes).unwrap()
}

/// Any finite f16: negative, subnormal and large ones included.
pub(crate) fn any_finite_half(rng: &mut StdRng) -> f16 {
    loop {
        let h = f16::from_bits(rng.random());
        if h.is_finite() {
            return h;
        }
    }
}

fn candle_dtype(format: QuantFormat) -> GgmlDType {
    match format {
        QuantFormat::Q4_0 => GgmlDType::Q4_0,
        QuantFormat::Q4_1 => GgmlDType::Q4_1,
        QuantFormat::Q5_0 => GgmlDType::Q5_0,
        QuantFormat::Q8_0 => GgmlDType::Q8_0,
        QuantFormat::Q4K => GgmlDType::Q4K,
        QuantFormat::Q5K => GgmlDType::Q5K,
        QuantFormat::Q6K => GgmlDType::Q6K,
    }
}

/// candle's dequantization of the same bytes.
fn candle_dequantize(format: QuantFormat, rows: usize, cols: usize, bytes: &[u8]) -> Vec<f32> {
    // candle views the bytes as blocks with f16 fields: the allocator's alignment (at least 8)
    // covers their 2.
    let bytes = bytes.to_vec();
    let storage = QStorage::from_data(Cow::Borrowed(&bytes), &Device::Cpu, candle_dtype(format)).unwrap();
    let t = QTensor::new(storage, (rows, cols)).unwrap().dequantize(&Device::Cpu).unwrap();
    t.flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn every_format_dequantizes_exactly_as_candle() {
    let mut rng = StdRng::seed_from_u64(5);
    for format in QuantFormat::ALL {
        let width = format.gguf_block_elems();
        for (rows, cols) in [(1, width), (3, 2 * width), (5, 4 * width), (2, 1024)] {
            let bytes = random_gguf(&mut rng, format, rows, cols, any_finite_half);
            let w = QuantizedWeight::from_gguf(format, rows, cols, &bytes).unwrap();
            let ours = w.dequantize();
            let theirs = candle_dequantize(format, rows, cols, &bytes);
            assert_eq!(ours.len(), theirs.len());
            for (i, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{format:?} [{rows}x{cols}] element {i}: {a} vs {b}");
            }
            let mut row = vec![f32::NAN; cols];
            w.dequantize_row(rows - 1, &mut row);
            assert_eq!(row, ours[(rows - 1) * cols..]);
            let blocks = rows * cols / QUANT_BLOCK;
            assert_eq!(w.size_in_bytes(), blocks * format.block_bytes(), "{format:?}");
        }
    }
}

#[test]
fn memory_stays_close_to_the_file() {
    // Bits per weight in memory against the file's.
    let want = [
        (QuantFormat::Q4_0, 5.0, 4.5),
        (QuantFormat::Q4_1, 6.0, 5.0),
        (QuantFormat::Q5_0, 6.0, 5.5),
        (QuantFormat::Q8_0, 9.0, 8.5),
        (QuantFormat::Q4K, 6.0, 4.5),
        (QuantFormat::Q5K, 7.0, 5.5),
        (QuantFormat::Q6K, 8.0, 6.5625),
    ];
    for (format, memory, file) in want {
        assert_eq!(format.block_bytes() as f64 * 8.0 / QUANT_BLOCK as f64, memory, "{format:?}");
        let file_bits = format.gguf_block_bytes() as f64 * 8.0 / format.gguf_block_elems() as f64;
        assert_eq!(file_bits, file, "{format:?}");
    }
}

/// One GGUF Q4_1 block from its parts.
fn q4_1_block(d: f32, m: f32, q: &[u8; 32]) -> Vec<u8> {
    let mut b = f16::from_f32(d).to_le_bytes().to_vec();
    b.extend(f16::from_f32(m).to_le_bytes());
    b.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
    b
}

#[test]
fn q4_1_values_follow_the_gguf_definition() {
    let q: [u8; 32] = std::array::from_fn(|i| (i % 16) as u8);
    let bytes = q4_1_block(0.5, -2.0, &q);
    let w = QuantizedWeight::from_gguf(QuantFormat::Q4_1, 1, 32, &bytes).unwrap();
    let want: Vec<f32> = q.iter().map(|&q| 0.5 * q as f32 - 2.0).collect();
    assert_eq!(w.dequantize(), want);
}

#[test]
fn q8_0_values_follow_the_gguf_definition() {
    let mut bytes = f16::from_f32(0.25).to_le_bytes().to_vec();
    bytes.extend((0..32).map(|i| (i as i8 - 16) as u8));
    let w = QuantizedWeight::from_gguf(QuantFormat::Q8_0, 1, 32, &bytes).unwrap();
    let want: Vec<f32> = (0..32).map(|i| 0.25 * (i as f32 - 16.0)).collect();
    assert_eq!(w.dequantize(), want);
}

#[test]
fn q5_0_values_follow_the_gguf_definition() {
    // Codes 0..32 in order: the high bit is set for elements 16..32.
    let mut bytes = f16::from_f32(0.5).to_le_bytes().to_vec();
    bytes.extend(0xFFFF_0000u32.to_le_bytes());
    bytes.extend((0..16u8).map(|j| j | (j << 4)));
    let w = QuantizedWeight::from_gguf(QuantFormat::Q5_0, 1, 32, &bytes).unwrap();
    let want: Vec<f32> = (0..32).map(|i| 0.5 * (i as f32 - 16.0)).collect();
    assert_eq!(w.dequantize(), want);
}

#[test]
fn q6_k_values_follow_the_gguf_definition() {
    // All low nibbles 1, high nibbles 2, bit pairs 3, scales k - 8 for sub-block k of 16.
    let mut bytes = vec![0x21u8; 128];
    bytes.extend([0xFFu8; 64]);
    bytes.extend((0..16).map(|k| (k as i8 - 8) as u8));
    bytes.extend(f16::from_f32(0.5).to_le_bytes());
    let w = QuantizedWeight::from_gguf(QuantFormat::Q6K, 1, 256, &bytes).unwrap();
    // Runs of 32: low nibbles (q = 1 + 48) for the first two of each 128, then high (2 + 48).
    let got = w.dequantize();
    for (i, v) in got.iter().enumerate() {
        let q = if i % 128 < 64 { 49.0 } else { 50.0 };
        let sc = (i / 16) as f32 - 8.0;
        assert_eq!(*v, 0.5 * sc * (q - 32.0), "element {i}");
    }
}

#[test]
fn bad_sizes_are_errors() {
    assert!(QuantizedWeight::from_gguf(QuantFormat::Q8_0, 1, 30, &[0; 32]).is_err());
    assert!(QuantizedWeight::from_gguf(QuantFormat::Q8_0, 2, 32, &[0; 34]).is_err());
    let err = QuantizedWeight::from_gguf(QuantFormat::Q4K, 1, 128, &[0; 72]).unwrap_err();
    assert!(err.to_string().contains("not a multiple of its 256-element blocks"), "{err}");
    assert!(QuantizedWeight::from_gguf(QuantFormat::Q6K, 1, 256, &[0; 209]).is_err());
    assert!(QuantizedWeight::from_gguf(QuantFormat::Q5_0, 1, 64, &[0; 44]).is_ok());
}

#[test]
fn concat_rows_stacks_and_checks_widths() {
    let a = QuantizedWeight::from_gguf(QuantFormat::Q4_1, 1, 32, &q4_1_block(1.0, 0.0, &[1; 32])).unwrap();
    let b = QuantizedWeight::from_gguf(QuantFormat::Q4_1, 1, 32, &q4_1_block(2.0, 1.0, &[3; 32])).unwrap();
    let ab = QuantizedWeight::concat_rows(&[&a, &b]).unwrap();
    assert_eq!(ab.rows(), 2);
    assert_eq!(ab.dequantize(), [a.dequantize(), b.dequantize()].concat());
    let wide = QuantizedWeight::from_gguf(QuantFormat::Q4_1, 1, 64, &[0; 40]).unwrap();
    assert!(QuantizedWeight::concat_rows(&[&a, &wide]).is_err());
    let mut rng = StdRng::seed_from_u64(9);
    for format in QuantFormat::ALL {
        let cols = format.gguf_block_elems() * 2;
        let parts: Vec<QuantizedWeight> = [2, 3]
            .iter()
            .map(|&rows| {
                let bytes = random_gguf(&mut rng, format, rows, cols, any_finite_half);
                QuantizedWeight::from_gguf(format, rows, cols, &bytes).unwrap()
            })
            .collect();
        let stacked = QuantizedWeight::concat_rows(&[&parts[0], &parts[1]]).unwrap();
        assert_eq!(stacked.dequantize(), [parts[0].dequantize(), parts[1].dequantize()].concat());
        assert_eq!(stacked.size_in_bytes(), parts[0].size_in_bytes() + parts[1].size_in_bytes());
    }
}
