//! kernels/lora.cu on the kernel simulator, through the launch the CUDA op makes, against the
//! CPU op: segments of different ranks with rows of no adapter between them, every dtype,
//! output poisoned with NaN first; and a row's bits alone and in a batch.

use candle_core::{DType, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::lora::{lora_launch, LoraArgs};
use super::sim_tests::{f32_values, random, rel_err, run, tolerance, HostBuf};
use crate::LoraSegment;

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The kernel's output for `base` and `x` with `segments`, as f32 (bits kept).
fn on_sim(base: &Tensor, x: &Tensor, segments: &[LoraSegment]) -> Vec<f32> {
    let (rows, width) = base.dims2().unwrap();
    let input = x.dim(1).unwrap();
    let (mut bb, mut xb) = (HostBuf::of(base), HostBuf::of(x));
    let mut mats: Vec<(HostBuf, HostBuf)> =
        segments.iter().map(|s| (HostBuf::of(&s.a), HostBuf::of(&s.b))).collect();
    let mut table: Vec<i64> = Vec::new();
    for (s, (a, b)) in segments.iter().zip(&mut mats) {
        table.extend([
            s.start as i64,
            s.rows as i64,
            s.a.dim(0).unwrap() as i64,
            a.addr(0) as i64,
            b.addr(0) as i64,
        ]);
    }
    let mut out = HostBuf::poisoned(base.dtype(), rows * width);
    let args = LoraArgs {
        dtype: base.dtype(),
        base: bb.addr(0),
        x: xb.addr(0),
        out: out.addr(0),
        segments: table.as_mut_ptr() as u64,
        num_segments: segments.len(),
        rows,
        input,
        width,
        max_rank: segments.iter().map(|s| s.a.dim(0).unwrap()).max().unwrap_or(0),
    };
    run(lora_launch(&args).unwrap());
    out.to_f32()
}

fn segment(
    rng: &mut StdRng,
    start: usize,
    rows: usize,
    rank: usize,
    input: usize,
    width: usize,
    dtype: DType,
) -> LoraSegment {
    LoraSegment { start, rows, a: random(rng, &[rank, input], dtype), b: random(rng, &[rank, width], dtype) }
}

#[test]
fn lora_add_matches_cpu_with_gaps_and_mixed_ranks() {
    let mut rng = StdRng::seed_from_u64(46);
    for dtype in DTYPES {
        for (rows, input, width) in [(1, 64, 48), (9, 576, 192), (6, 100, 1536)] {
            let x = random(&mut rng, &[rows, input], dtype);
            let base = random(&mut rng, &[rows, width], dtype);
            let segments: Vec<LoraSegment> = if rows == 1 {
                vec![segment(&mut rng, 0, 1, 8, input, width, dtype)]
            } else {
                vec![
                    segment(&mut rng, 1, 2, 4, input, width, dtype),
                    segment(&mut rng, 3, 1, 16, input, width, dtype),
                    segment(&mut rng, 5, 1, 1, input, width, dtype),
                ]
            };
            let want = f32_values(&crate::lora_add(&base, &x, &segments).unwrap());
            let got = on_sim(&base, &x, &segments);
            let err = rel_err(&got, &want);
            // The delta sums rank * in products: a little more rounding than one dot product.
            assert!(err <= 4.0 * tolerance(dtype), "lora_add {dtype:?} {rows}x{input}->{width}: {err}");
            if rows > 1 {
                // Rows of no adapter are base's bits.
                let base_values = f32_values(&base);
                assert_eq!(got[..width], base_values[..width], "{dtype:?}: row 0 passes through");
            }
        }
    }
}

#[test]
fn lora_add_gives_a_row_the_same_bits_alone_and_batched() {
    let mut rng = StdRng::seed_from_u64(47);
    let (rows, input, width) = (7, 320, 96);
    let x = random(&mut rng, &[rows, input], DType::BF16);
    let base = random(&mut rng, &[rows, width], DType::BF16);
    let s = segment(&mut rng, 0, rows, 8, input, width, DType::BF16);
    let all = on_sim(&base, &x, std::slice::from_ref(&s));
    for row in [0, 3, 6] {
        let alone = LoraSegment { start: 0, rows: 1, ..s.clone() };
        let one = on_sim(&base.narrow(0, row, 1).unwrap(), &x.narrow(0, row, 1).unwrap(), &[alone]);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&one), bits(&all[row * width..(row + 1) * width]), "row {row}");
    }
}
