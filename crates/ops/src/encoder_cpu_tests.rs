//! The encoder kernels against plain float64 loops.

use super::*;

/// Deterministic values in about [-scale, scale].
fn values(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 * 0.618_034 + seed as f32 * 0.414_213_6).fract() * 2.0 - 1.0) * scale).collect()
}

#[test]
fn layer_norm_of_the_residual_sum_matches_f64() {
    let (rows, width) = (300, 120);
    let (y, residual) = (values(rows * width, 1, 3.0), values(rows * width, 2, 1.0));
    let (bias, gamma, beta) = (values(width, 3, 0.5), values(width, 4, 2.0), values(width, 5, 0.3));
    let got = add_layer_norm(&y, &bias, &residual, &gamma, &beta, 1e-12);
    for r in 0..rows {
        let v: Vec<f64> = (0..width)
            .map(|c| f64::from(y[r * width + c]) + f64::from(bias[c]) + f64::from(residual[r * width + c]))
            .collect();
        let mean = v.iter().sum::<f64>() / width as f64;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / width as f64;
        for c in 0..width {
            let want = (v[c] - mean) / (var + 1e-12).sqrt() * f64::from(gamma[c]) + f64::from(beta[c]);
            let got = f64::from(got[r * width + c]);
            assert!((got - want).abs() < 2e-6 * (1.0 + want.abs()), "row {r} col {c}: {got} vs {want}");
        }
    }
}

#[test]
fn attention_stays_in_each_sequence_and_matches_f64() {
    // Head sizes that are not a whole vector, and a sequence longer than one key block.
    for (heads, dim) in [(3, 20), (2, 32)] {
        let bounds = [0, 5, 5, 17, 17 + KEY_BLOCK + 9];
        let tokens = *bounds.last().unwrap();
        let hidden = heads * dim;
        let qkv = values(tokens * 3 * hidden, 7, 1.5);
        let bias = values(3 * hidden, 8, 0.5);
        let scale = 1.0 / (dim as f32).sqrt();
        let got =
            encoder_attention(&qkv, &bias, &bounds, EncoderAttentionShape { heads, head_dim: dim, scale });
        assert_eq!(got.len(), tokens * hidden);
        let at = |t: usize, col: usize| f64::from(qkv[t * 3 * hidden + col]) + f64::from(bias[col]);
        for w in bounds.windows(2) {
            for i in w[0]..w[1] {
                for h in 0..heads {
                    let score = |j: usize| {
                        (0..dim).map(|d| at(i, h * dim + d) * at(j, (heads + h) * dim + d)).sum::<f64>()
                            * f64::from(scale)
                    };
                    let scores: Vec<f64> = (w[0]..w[1]).map(score).collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for d in 0..dim {
                        let want: f64 = (w[0]..w[1])
                            .zip(&e)
                            .map(|(j, p)| p * at(j, (2 * heads + h) * dim + d))
                            .sum::<f64>()
                            / sum;
                        let got = f64::from(got[i * hidden + h * dim + d]);
                        assert!((got - want).abs() < 2e-6, "token {i} head {h} dim {d}: {got} vs {want}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_row_is_the_same_alone_or_batched() {
    let (heads, dim) = (2, 16);
    let hidden = heads * dim;
    let qkv = values(30 * 3 * hidden, 9, 1.0);
    let bias = values(3 * hidden, 10, 0.2);
    let shape = EncoderAttentionShape { heads, head_dim: dim, scale: 0.25 };
    let batched = encoder_attention(&qkv, &bias, &[0, 12, 30], shape);
    let alone = encoder_attention(&qkv[12 * 3 * hidden..], &bias, &[0, 18], shape);
    assert_eq!(&batched[12 * hidden..], &alone[..]);
}
