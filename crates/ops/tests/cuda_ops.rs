//! Each CUDA op against its CPU op on one GPU (`cargo test -p pagoda-ops --features cuda` on a
//! machine with an NVIDIA GPU of compute capability 8.0+; without one these tests fail, they
//! do not skip). The wider comparison, over many shapes, runs in the GPU check
//! (crates/gpu-check, scripts/gpu-check.sh); without a GPU the kernel simulator tests cover the
//! same kernels (`--features kernel-sim`).
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor};
use pagoda_ops::{AttentionMetadata, RotaryStyle};

fn gpu() -> Device {
    Device::new_cuda(0).expect("these tests need a CUDA GPU")
}

fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let a: Vec<f32> = a
        .to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let b: Vec<f32> = b.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let scale = b.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(&b)
        .map(|(x, y)| if x.is_finite() { (x - y).abs() } else { f32::INFINITY })
        .fold(0.0, f32::max)
        / scale
}

fn random(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::randn(0f32, 1.0, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

#[test]
fn elementwise_ops_match_cpu() {
    let gpu = gpu();
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 1e-2)] {
        let x = random(&[5, 576], dtype);
        let r = random(&[5, 576], dtype);
        let w = random(&[576], dtype);
        let (xg, rg, wg) =
            (x.to_device(&gpu).unwrap(), r.to_device(&gpu).unwrap(), w.to_device(&gpu).unwrap());
        assert!(
            rel_err(
                &pagoda_ops::rms_norm(&xg, &wg, 1e-5).unwrap(),
                &pagoda_ops::rms_norm(&x, &w, 1e-5).unwrap()
            ) <= tol
        );
        let (gn, gs) = pagoda_ops::add_rms_norm(&xg, &rg, &wg, 1e-5).unwrap();
        let (cn, cs) = pagoda_ops::add_rms_norm(&x, &r, &w, 1e-5).unwrap();
        assert!(rel_err(&gn, &cn) <= tol && rel_err(&gs, &cs) <= tol);
        let fused = random(&[7, 64], dtype);
        let fg = fused.to_device(&gpu).unwrap();
        let g =
            pagoda_ops::silu_and_mul(&fg.narrow(1, 0, 32).unwrap(), &fg.narrow(1, 32, 32).unwrap()).unwrap();
        let c = pagoda_ops::silu_and_mul(&fused.narrow(1, 0, 32).unwrap(), &fused.narrow(1, 32, 32).unwrap())
            .unwrap();
        assert!(rel_err(&g, &c) <= tol);

        let inv = pagoda_ops::rotary_inv_freq(10_000.0, 64, Default::default()).unwrap();
        let (cos, sin) = pagoda_ops::rotary_tables_from_inv_freq(&inv, 128, &Device::Cpu).unwrap();
        let (q, k) = (random(&[3, 9, 64], dtype), random(&[3, 3, 64], dtype));
        let pos = Tensor::new(&[0u32, 5, 127], &Device::Cpu).unwrap();
        for style in [RotaryStyle::Interleaved, RotaryStyle::Halves] {
            let on = |d: &Device| {
                pagoda_ops::rotary_embedding(
                    &q.to_device(d).unwrap(),
                    &k.to_device(d).unwrap(),
                    &pos.to_device(d).unwrap(),
                    &cos.to_device(d).unwrap(),
                    &sin.to_device(d).unwrap(),
                    style,
                )
                .unwrap()
            };
            let ((gq, gk), (cq, ck)) = (on(&gpu), on(&Device::Cpu));
            assert!(rel_err(&gq, &cq) <= tol && rel_err(&gk, &ck) <= tol);
        }
    }
}

#[test]
fn write_then_attend_matches_cpu() {
    let gpu = gpu();
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::BF16, 1e-2)] {
        // Two sequences: a 40-token prefill and a decode at context 19; blocks of 16.
        let tables = vec![vec![3u32, 0, 5], vec![1, 4]];
        let (cu, ctx) = (vec![0u32, 40, 41], vec![40u32, 19]);
        let mut slots: Vec<u32> = (0..40).map(|p| tables[0][p / 16] * 16 + (p % 16) as u32).collect();
        slots.push(tables[1][18 / 16] * 16 + 18 % 16);
        let (kv_heads, q_heads, d) = (2, 8, 64);
        let caches = [random(&[6, 16, kv_heads, d], dtype), random(&[6, 16, kv_heads, d], dtype)];
        let gpu_caches = [caches[0].to_device(&gpu).unwrap(), caches[1].to_device(&gpu).unwrap()];
        let (k, v, q) = (
            random(&[41, kv_heads, d], dtype),
            random(&[41, kv_heads, d], dtype),
            random(&[41, q_heads, d], dtype),
        );
        let mut outs = Vec::new();
        for (device, [kc, vc]) in [(Device::Cpu, &caches), (gpu.clone(), &gpu_caches)] {
            let meta =
                AttentionMetadata::new(slots.clone(), cu.clone(), ctx.clone(), &tables, &device).unwrap();
            let (k, v, q) =
                (k.to_device(&device).unwrap(), v.to_device(&device).unwrap(), q.to_device(&device).unwrap());
            pagoda_ops::reshape_and_cache(&k, &v, kc, vc, &meta.slot_mapping).unwrap();
            outs.push(pagoda_ops::paged_attention(&q, kc, vc, &meta, 0.125).unwrap());
        }
        assert!(rel_err(&gpu_caches[0], &caches[0]) == 0.0 && rel_err(&gpu_caches[1], &caches[1]) == 0.0);
        assert!(rel_err(&outs[1], &outs[0]) <= tol, "{dtype:?}");
    }
}
