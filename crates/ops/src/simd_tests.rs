//! The vector helpers against plain loops and `std`: widening, dots, weighted rows, exp.

use super::*;

#[test]
fn widening_in_hardware_equals_the_portable_widening_for_every_half() {
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let mut want = vec![0f32; all.len()];
    <f16 as Float>::to_f32_slice(&all, &mut want);
    // Odd lengths reach the scalar tail too.
    for len in [all.len(), all.len() - 5] {
        let mut got = vec![0f32; len];
        Fused::widen_f16(&all[..len], &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "half {i:#06x}: {g} vs {w}");
        }
    }
}

#[test]
fn dot_matches_naive_sum_for_odd_lengths() {
    for n in [0usize, 1, 7, 16, 17, 64, 100] {
        let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let naive: f64 = a.iter().zip(&b).map(|(x, y)| (*x as f64) * (*y as f64)).sum();
        assert!((dot::<Separate>(&a, &b) as f64 - naive).abs() < 1e-4, "n = {n}");
        assert!((dot::<Fused>(&a, &b) as f64 - naive).abs() < 1e-4, "n = {n}");
    }
}

#[test]
fn dot_rows_equal_dot_for_any_count_and_length() {
    for n in [1usize, 7, 8, 64, 100] {
        for count in [0usize, 1, 7, 8, 9, 17] {
            let q: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let rows: Vec<Vec<f32>> =
                (0..count).map(|j| (0..n + 3).map(|i| ((i * 7 + j) as f32 * 0.11).cos()).collect()).collect();
            let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
            let mut out = vec![f32::NAN; count];
            dot_rows_portable::<Separate>(&q, &refs, &mut out);
            for (j, o) in out.iter().enumerate() {
                let want = dot::<Separate>(&q, &rows[j]);
                assert!((o - want).abs() <= 1e-5 * (1.0 + want.abs()), "n {n} row {j}: {o} vs {want}");
            }
        }
    }
}

#[test]
fn weighted_rows_match_naive_sum_for_any_width() {
    for width in [1usize, 31, 32, 64, 80, 128] {
        let rows_n = 5;
        let rows: Vec<f32> = (0..rows_n * width).map(|i| (i as f32 * 0.3).sin()).collect();
        let weights: Vec<f32> = (0..rows_n).map(|j| j as f32 - 1.5).collect();
        let mut out: Vec<f32> = (0..width).map(|d| d as f32).collect();
        let mut expected = out.clone();
        for (j, w) in weights.iter().enumerate() {
            for d in 0..width {
                expected[d] += w * rows[j * width + d];
            }
        }
        let refs: Vec<&[f32]> = rows.chunks_exact(width).collect();
        add_weighted_rows::<Separate>(&mut out, &weights, &refs);
        for (o, e) in out.iter().zip(&expected) {
            assert!((o - e).abs() < 1e-4, "width {width}: {o} vs {e}");
        }
    }
}

#[test]
fn exp_matches_std_over_its_range() {
    let mut xs: Vec<f32> = (0..20_000).map(|i| -(i as f32) * 0.0045).collect();
    xs.extend([0.0, -1e-30, -86.9, -87.0, -100.0, f32::NEG_INFINITY]);
    let inputs = xs.clone();
    exp_nonpositive(&mut xs);
    for (got, x) in xs.iter().zip(&inputs) {
        // Below the clamp the result is e^EXP_MIN, itself accurate.
        let want = x.max(EXP_MIN).exp();
        assert!((got - want).abs() <= 3e-7 * want, "e^{x}: {got} vs {want}");
    }
    let mut nan = [f32::NAN];
    exp_nonpositive(&mut nan);
    assert!(nan[0].is_nan());
}

#[test]
fn scale_multiplies_in_place() {
    let mut y = vec![3.0f32, 0.0, -4.0];
    scale(&mut y, 0.5);
    assert_eq!(y, vec![1.5, 0.0, -2.0]);
}
