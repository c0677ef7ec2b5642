//! Tests of [`super`]: every vector path against the portable loops, bit for bit, with f32
//! and bfloat16 matrices.

use super::*;

fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// Every path of this CPU gives the bits of the portable one, for every block height, ranks
/// that are and are not multiples of the tile, and widths with leftover columns and inputs.
#[test]
fn the_vector_paths_give_the_portable_bits() {
    for (input, out, rank, columns) in [(37, 150, 5, 3..150), (64, 64, 16, 0..64), (200, 97, 8, 16..81)] {
        let x = values(1, 4 * input);
        let (a, b) = (values(2, rank * input), values(3, rank * out));
        let base = values(4, 4 * columns.len());
        for rows in 1..=4 {
            let xs: Vec<&[f32]> = x.chunks_exact(input).take(rows).collect();
            let bases: Vec<&[f32]> = base.chunks_exact(columns.len()).take(rows).collect();
            let block = Block { xs: &xs, a: &a, b: &b, rank, out, columns: columns.clone(), bases: &bases };
            let mut want = vec![0f32; rows * columns.len()];
            let mut dst: Vec<&mut [f32]> = want.chunks_exact_mut(columns.len()).collect();
            let mut t = vec![0f32; rows * rank];
            shrink_rows(&block, &mut t);
            expand_rows(&block, &t, &mut dst);
            let mut got = vec![0f32; rows * columns.len()];
            let mut dst: Vec<&mut [f32]> = got.chunks_exact_mut(columns.len()).collect();
            add_block(&block, &mut dst);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{input} {out} {rank} {rows}"
            );
            // And it is the sum it claims to be.
            for j in 0..rows {
                for (c, col) in columns.clone().enumerate() {
                    let t: Vec<f64> = (0..rank)
                        .map(|k| (0..input).map(|e| x[j * input + e] as f64 * a[k * input + e] as f64).sum())
                        .collect();
                    let delta: f64 = (0..rank).map(|k| t[k] * b[k * out + col] as f64).sum();
                    let exact = base[j * columns.len() + c] as f64 + delta;
                    assert!((got[j * columns.len() + c] as f64 - exact).abs() < 1e-4, "{j} {col}");
                }
            }
        }
    }
}

/// A bfloat16 adapter gives, on every path this CPU has (whatever `PAGODA_CPU_ISA` caps),
/// the bits of the portable loops over an f32 adapter of the same values: widening is exact
/// and the sums are the f32 ones. Also over bfloat16 base outputs, with values at the edges
/// of bfloat16 (negative zero, the smallest normal, large magnitudes), and for blocks of up
/// to two tiles of rows, each row's bits those it has alone.
#[test]
fn bfloat16_weights_give_the_f32_bits_on_every_path() {
    let paths = available_paths();
    assert!(paths.contains(&Path::Portable));
    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for (input, out, rank, columns) in [(37, 150, 5, 3..150), (64, 64, 16, 0..64), (576, 1536, 16, 640..1536)]
    {
        let x = values(11, 2 * TILE_ROWS * input);
        let mut a16: Vec<bf16> = values(12, rank * input).iter().map(|&v| bf16::from_f32(v)).collect();
        let b16: Vec<bf16> = values(13, rank * out).iter().map(|&v| bf16::from_f32(v * 0.1)).collect();
        a16[0] = bf16::NEG_ZERO;
        a16[1] = bf16::MIN_POSITIVE;
        a16[2] = bf16::from_f32(3.0e4);
        let (a32, b32): (Vec<f32>, Vec<f32>) =
            (a16.iter().map(|v| v.to_f32()).collect(), b16.iter().map(|v| v.to_f32()).collect());
        let width = columns.len();
        let base = values(14, 2 * TILE_ROWS * width);
        let base16: Vec<bf16> = base.iter().map(|&v| bf16::from_f32(v)).collect();
        for rows in 1..=2 * TILE_ROWS {
            let xs: Vec<&[f32]> = x.chunks_exact(input).take(rows).collect();
            let bases: Vec<&[f32]> = base.chunks_exact(width).take(rows).collect();
            let bases16: Vec<&[bf16]> = base16.chunks_exact(width).take(rows).collect();
            /// The block's outputs on `path`.
            fn run<T: Float, W: Weight>(path: Path, block: &Block<'_, T, W>) -> Vec<T> {
                let width = block.columns.len();
                let mut got = vec![T::from_f32(0.0); block.xs.len() * width];
                add_block_on(path, block, &mut got.chunks_exact_mut(width).collect::<Vec<_>>());
                got
            }
            /// The block of `xs` over `columns` with matrices `a`, `b` and base outputs `bases`.
            fn block<'a, T, W>(
                xs: &'a [&'a [f32]],
                (a, b): (&'a [W], &'a [W]),
                bases: &'a [&'a [T]],
                (rank, out, columns): (usize, usize, std::ops::Range<usize>),
            ) -> Block<'a, T, W> {
                Block { xs, a, b, rank, out, columns, bases }
            }
            let shape = || (rank, out, columns.clone());
            let (m16, m32) = ((&a16[..], &b16[..]), (&a32[..], &b32[..]));
            let want = run(Path::Portable, &block(&xs, m32, &bases, shape()));
            let want16 = run(Path::Portable, &block(&xs, m32, &bases16, shape()));
            // Each row alone gives its bits in the block.
            for j in 0..rows {
                let one = Block {
                    xs: &xs[j..j + 1],
                    a: &a32[..],
                    b: &b32[..],
                    rank,
                    out,
                    columns: columns.clone(),
                    bases: &bases[j..j + 1],
                };
                let mut alone = vec![0f32; width];
                add_block_on(Path::Portable, &one, &mut [&mut alone[..]]);
                assert_eq!(bits(&alone), bits(&want[j * width..(j + 1) * width]), "row {j} of {rows}");
            }
            for &path in &paths {
                let case = format!("{path:?} {input} {out} {rank} {rows}");
                let half = |a: &[f32]| a.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>();
                assert_eq!(half(&a32), a16, "the f32 copies hold the same values");
                assert_eq!(bits(&run(path, &block(&xs, m16, &bases, shape()))), bits(&want), "{case}");
                assert_eq!(bits(&run(path, &block(&xs, m32, &bases, shape()))), bits(&want), "{case}, f32");
                assert_eq!(run(path, &block(&xs, m16, &bases16, shape())), want16, "{case}, bf16 bases");
            }
        }
    }
}
