//! reshape_and_cache writes exactly the given slots (nothing else) and rejects bad arguments
//! without touching the cache.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{random_tensor, rng, values};
use pagoda_ops::reshape_and_cache;
use rand::seq::SliceRandom;

const POISON: f32 = -7.0;

fn poisoned(shape: (usize, usize, usize, usize), dtype: DType) -> Tensor {
    Tensor::full(POISON, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

#[test]
fn writes_exactly_the_mapped_slots() {
    let (nb, bs, kvh, hd) = (6, 4, 3, 8);
    let row = kvh * hd;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let mut rng = rng(1);
        let mut all: Vec<u32> = (0..(nb * bs) as u32).collect();
        all.shuffle(&mut rng);
        let slots = all[..9].to_vec();
        let k = random_tensor(&mut rng, &[slots.len(), kvh, hd], dtype).unwrap();
        let v = random_tensor(&mut rng, &[slots.len(), kvh, hd], dtype).unwrap();
        let (kc, vc) = (poisoned((nb, bs, kvh, hd), dtype), poisoned((nb, bs, kvh, hd), dtype));
        let sm = Tensor::new(slots.as_slice(), &Device::Cpu).unwrap();
        reshape_and_cache(&k, &v, &kc, &vc, &sm).unwrap();

        for (cache, src) in [(&kc, &k), (&vc, &v)] {
            let mut expected = vec![POISON; nb * bs * row];
            let src = values(src);
            for (t, &s) in slots.iter().enumerate() {
                let s = s as usize;
                expected[s * row..(s + 1) * row].copy_from_slice(&src[t * row..(t + 1) * row]);
            }
            assert_eq!(values(cache), expected, "{dtype:?}");
            assert_eq!(cache.dtype(), dtype);
        }
    }
}

#[test]
fn strided_source_rows_are_read_in_place() {
    let (nb, bs, kvh, hd) = (2, 4, 2, 4);
    let mut rng = rng(2);
    // k and v as the last heads of a fused [T, 6, hd] QKV projection (2 q heads).
    let qkv = random_tensor(&mut rng, &[3, 6, hd], DType::F32).unwrap();
    let (k, v) = (qkv.narrow(1, 2, kvh).unwrap(), qkv.narrow(1, 4, kvh).unwrap());
    assert!(!k.is_contiguous());
    let (kc, vc) = (poisoned((nb, bs, kvh, hd), DType::F32), poisoned((nb, bs, kvh, hd), DType::F32));
    let sm = Tensor::new(&[7u32, 0, 3], &Device::Cpu).unwrap();
    reshape_and_cache(&k, &v, &kc, &vc, &sm).unwrap();
    let flat = kc.reshape((nb * bs, kvh, hd)).unwrap();
    for (t, slot) in [7usize, 0, 3].into_iter().enumerate() {
        assert_eq!(values(&flat.get(slot).unwrap()), values(&k.get(t).unwrap()));
    }
    let vflat = vc.reshape((nb * bs, kvh, hd)).unwrap();
    assert_eq!(values(&vflat.get(3).unwrap()), values(&v.get(2).unwrap()));
    assert_eq!(values(&vflat.get(1).unwrap()), vec![POISON; kvh * hd]);
}

/// f32 rows into an f16 or bf16 cache are rounded as they are copied, to the bits of
/// `to_dtype` first; strided rows included.
#[test]
fn f32_rows_are_rounded_into_a_narrower_cache() {
    let (nb, bs, kvh, hd) = (3, 4, 2, 8);
    let mut rng = rng(4);
    let qkv = random_tensor(&mut rng, &[5, 6, hd], DType::F32).unwrap();
    let (k, v) = (qkv.narrow(1, 2, kvh).unwrap(), qkv.narrow(1, 4, kvh).unwrap());
    let sm = Tensor::new(&[9u32, 0, 3, 11, 4], &Device::Cpu).unwrap();
    for dtype in [DType::F16, DType::BF16] {
        let (kc, vc) = (poisoned((nb, bs, kvh, hd), dtype), poisoned((nb, bs, kvh, hd), dtype));
        reshape_and_cache(&k, &v, &kc, &vc, &sm).unwrap();
        let (kw, vw) = (poisoned((nb, bs, kvh, hd), dtype), poisoned((nb, bs, kvh, hd), dtype));
        let (k_narrow, v_narrow) = (k.to_dtype(dtype).unwrap(), v.to_dtype(dtype).unwrap());
        reshape_and_cache(&k_narrow, &v_narrow, &kw, &vw, &sm).unwrap();
        let bits =
            |t: &Tensor| t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1::<f32>().unwrap();
        let bits = |t: &Tensor| bits(t).into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(bits(&kc), bits(&kw), "{dtype:?} k");
        assert_eq!(bits(&vc), bits(&vw), "{dtype:?} v");
        assert_eq!(kc.dtype(), dtype);
        // k and v must agree: an f16 k beside an f32 v is refused.
        let k16 = k.to_dtype(DType::F16).unwrap();
        assert!(reshape_and_cache(&k16, &v, &kc, &vc, &sm).is_err());
    }
}

#[test]
fn rejects_bad_arguments_and_leaves_the_cache_untouched() {
    let (nb, bs, kvh, hd) = (2, 4, 2, 4);
    let cpu = &Device::Cpu;
    let mut rng = rng(3);
    let k = random_tensor(&mut rng, &[2, kvh, hd], DType::F32).unwrap();
    let v = random_tensor(&mut rng, &[2, kvh, hd], DType::F32).unwrap();
    let (kc, vc) = (poisoned((nb, bs, kvh, hd), DType::F32), poisoned((nb, bs, kvh, hd), DType::F32));
    let untouched = vec![POISON; nb * bs * kvh * hd];
    let ok_slots = Tensor::new(&[1u32, 2], cpu).unwrap();

    // Slot == num_blocks * block_size is one past the end; the valid slot 1 must not be written.
    let bad = Tensor::new(&[1u32, (nb * bs) as u32], cpu).unwrap();
    let e = reshape_and_cache(&k, &v, &kc, &vc, &bad).unwrap_err();
    assert!(matches!(e, candle_core::Error::InvalidIndex { index: 8, size: 8, .. }), "{e}");
    // dtype mismatch between k and the cache.
    let k16 = k.to_dtype(DType::BF16).unwrap();
    assert!(reshape_and_cache(&k16, &v, &kc, &vc, &ok_slots).is_err());
    // Wrong number of kv heads.
    let k1 = k.narrow(1, 0, 1).unwrap();
    assert!(reshape_and_cache(&k1, &v, &kc, &vc, &ok_slots).is_err());
    // slot_mapping length != tokens, and a non-u32 slot_mapping.
    let one = Tensor::new(&[1u32], cpu).unwrap();
    assert!(reshape_and_cache(&k, &v, &kc, &vc, &one).is_err());
    let i64_slots = Tensor::new(&[1i64, 2], cpu).unwrap();
    assert!(reshape_and_cache(&k, &v, &kc, &vc, &i64_slots).is_err());
    // v_cache with a different shape, and a non-contiguous cache.
    let vc_small = poisoned((nb - 1, bs, kvh, hd), DType::F32);
    assert!(reshape_and_cache(&k, &v, &kc, &vc_small, &ok_slots).is_err());
    let strided = poisoned((nb, kvh, bs, hd), DType::F32).transpose(1, 2).unwrap();
    assert!(reshape_and_cache(&k, &v, &strided, &vc, &ok_slots).is_err());
    // Non-float cache.
    let (ku, vu) = (kc.to_dtype(DType::U32).unwrap(), vc.to_dtype(DType::U32).unwrap());
    let (kw, vw) = (k.to_dtype(DType::U32).unwrap(), v.to_dtype(DType::U32).unwrap());
    assert!(reshape_and_cache(&kw, &vw, &ku, &vu, &ok_slots).is_err());

    assert_eq!(values(&kc), untouched);
    assert_eq!(values(&vc), untouched);
    // And the valid call still works afterwards.
    reshape_and_cache(&k, &v, &kc, &vc, &ok_slots).unwrap();
    assert_ne!(values(&kc), untouched);
}

#[test]
fn empty_batch_is_a_no_op_and_repeated_slots_keep_the_later_row() {
    let (nb, bs, kvh, hd) = (2, 2, 1, 4);
    let cpu = &Device::Cpu;
    let (kc, vc) = (poisoned((nb, bs, kvh, hd), DType::F32), poisoned((nb, bs, kvh, hd), DType::F32));
    let none = Tensor::zeros((0, kvh, hd), DType::F32, cpu).unwrap();
    let no_slots = Tensor::zeros(0, DType::U32, cpu).unwrap();
    reshape_and_cache(&none, &none, &kc, &vc, &no_slots).unwrap();
    assert_eq!(values(&kc), vec![POISON; nb * bs * kvh * hd]);

    let k = Tensor::new(&[[[1f32; 4]], [[2f32; 4]]], cpu).unwrap();
    let slots = Tensor::new(&[3u32, 3], cpu).unwrap();
    reshape_and_cache(&k, &k, &kc, &vc, &slots).unwrap();
    let flat = kc.reshape((nb * bs, kvh * hd)).unwrap();
    assert_eq!(values(&flat.get(3).unwrap()), vec![2.0; 4]);
}
