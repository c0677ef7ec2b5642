use super::*;

#[test]
fn row_threads_cover_the_row_in_whole_warps() {
    assert_eq!(row_threads(1), 32);
    assert_eq!(row_threads(576), 128);
    assert_eq!(row_threads(4096), 512);
    assert_eq!(row_threads(1 << 20), 1024);
}

#[test]
fn names_follow_the_kernel_entry_points() {
    let a = NormArgs {
        x_dtype: DType::BF16,
        w_dtype: DType::F32,
        x: 1,
        x_row_stride: 8,
        weight: 2,
        out: 3,
        rows: 5,
        hidden: 8,
        eps: 1e-5,
    };
    let l = rms_norm(&a).unwrap().unwrap();
    assert_eq!(l.function, "pagoda_rms_norm_bf16_f32");
    assert_eq!(l.grid, [5, 1, 1]);
    assert_eq!(add_rms_norm(&a, 4, 8).unwrap().unwrap().function, "pagoda_add_rms_norm_bf16_f32");
    assert!(rms_norm(&NormArgs { rows: 0, ..a }).unwrap().is_none());
    assert!(rms_norm(&NormArgs { x_dtype: DType::U8, ..a }).is_err());
}

fn attention_args(dtype: DType, head_dim: usize) -> AttentionArgs {
    AttentionArgs {
        dtype,
        fp8_cache: false,
        head_dim,
        q: 1,
        q_row_stride: 32 * head_dim,
        k_cache: 2,
        v_cache: 3,
        block_tables: 4,
        max_blocks_per_seq: 10,
        block_size: 16,
        num_kv_heads: 8,
        group: 4,
        softmax_scale: 0.125,
        window: 0,
        logit_softcap: 0.0,
        v_scale: 1.0,
        out: 5,
        part_o: 6,
        part_lse: 7,
        context_lens: 8,
    }
}

#[test]
fn attention_launches_pick_the_instantiated_kernel() {
    let a = attention_args(DType::BF16, 128);
    let simt = attention(&a, AttentionKernel::Simt { rows: 4 }, 9, 64).unwrap().unwrap();
    assert_eq!(simt.function, "pagoda_paged_attention_simt_bf16_d128_r4");
    assert_eq!((simt.grid, simt.block, simt.shared_mem_bytes), ([64, 8, 1], [128, 1, 1], 0));
    assert_eq!(simt.args.len(), 18);
    assert_eq!(simt.args[10], Arg::F32(0.125 * std::f32::consts::LOG2_E));
    let mma = attention(&a, AttentionKernel::Mma, 9, 3).unwrap().unwrap();
    assert_eq!(mma.function, "pagoda_paged_attention_mma_bf16_d128");
    assert_eq!(mma.shared_mem_bytes, 87_040);
    assert_eq!(mma.args.len(), 15);
    let r8 =
        attention(&attention_args(DType::F32, 80), AttentionKernel::Simt { rows: 6 }, 9, 1).unwrap().unwrap();
    assert_eq!(r8.function, "pagoda_paged_attention_simt_f32_d80_r8");
    assert!(attention(&attention_args(DType::F32, 80), AttentionKernel::Mma, 9, 1).is_err());
    assert!(attention(&attention_args(DType::F16, 72), AttentionKernel::Mma, 9, 1).is_err());
    // Head dim 256: CUDA cores, half precision.
    let wide = attention(&attention_args(DType::F16, 256), AttentionKernel::Simt { rows: 8 }, 9, 1).unwrap();
    assert_eq!(wide.unwrap().function, "pagoda_paged_attention_simt_f16_d256_r8");
    assert!(attention(&attention_args(DType::F16, 256), AttentionKernel::Mma, 9, 1).is_err());
    let local = AttentionArgs { window: 512, ..attention_args(DType::BF16, 64) };
    let mma = attention(&local, AttentionKernel::Mma, 9, 1).unwrap().unwrap();
    assert_eq!(mma.function, "pagoda_paged_attention_mma_local_bf16_d64");
    assert_eq!(mma.args[11], Arg::I32(512));
    assert!(attention(&attention_args(DType::F32, 256), AttentionKernel::Simt { rows: 4 }, 9, 1).is_err());
    assert!(attention(&a, AttentionKernel::Mma, 9, 0).unwrap().is_none());
    let c = attention_combine(&a, 9, 2).unwrap().unwrap();
    assert_eq!((c.function.as_str(), c.grid), ("pagoda_attention_combine_bf16", [2, 8, 1]));
    // Over an FP8 cache: the queries' dtype, then `_fp8`; the V scale after the soft cap.
    let fp8 = AttentionArgs { fp8_cache: true, v_scale: 0.25, ..attention_args(DType::F16, 256) };
    let simt = attention(&fp8, AttentionKernel::Simt { rows: 4 }, 9, 1).unwrap().unwrap();
    assert_eq!(simt.function, "pagoda_paged_attention_simt_f16_fp8_d256_r4");
    assert_eq!(simt.args[13], Arg::F32(0.25));
    let fp8 = AttentionArgs { head_dim: 128, ..fp8 };
    let mma = attention(&fp8, AttentionKernel::Mma, 9, 1).unwrap().unwrap();
    assert_eq!(
        (mma.function.as_str(), mma.shared_mem_bytes),
        ("pagoda_paged_attention_mma_f16_fp8_d128", 84_992)
    );
    let f32_fp8 = AttentionArgs { dtype: DType::F32, ..fp8 };
    assert!(attention(&f32_fp8, AttentionKernel::Mma, 9, 1).is_err());
    let simt = attention(&f32_fp8, AttentionKernel::Simt { rows: 8 }, 9, 1).unwrap().unwrap();
    assert_eq!(simt.function, "pagoda_paged_attention_simt_f32_fp8_d128_r8");
}

#[test]
fn reshape_into_an_fp8_cache_names_the_source_dtype() {
    let l = reshape_and_cache_fp8(1, DType::BF16, 24, 2, 3, 5, 16, 64, 0.5).unwrap().unwrap();
    assert_eq!((l.function.as_str(), l.grid), ("pagoda_reshape_and_cache_fp8_bf16", [5, 1, 1]));
    assert_eq!(l.args[6], Arg::F32(0.5));
    assert!(reshape_and_cache_fp8(1, DType::BF16, 24, 2, 3, 0, 16, 64, 0.5).unwrap().is_none());
}

#[test]
fn mma_shared_memory_fits_an_sm() {
    // 227 KiB is the most one block may opt into on sm_90 (163 KiB on sm_80).
    for d in CUDA_MMA_HEAD_DIMS {
        assert!(mma_shared_bytes(d, false) <= 163 * 1024);
        assert!(mma_shared_bytes(d, true) <= mma_shared_bytes(d, false));
    }
}
