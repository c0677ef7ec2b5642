use super::*;

use CpuKernel::{Blocks, Panels};
use PanelPrecision::{Bf16, Int16, Int8, F32};

const NEITHER: CpuFeatures = CpuFeatures { bf16: false, int8: false };
const INT8: CpuFeatures = CpuFeatures { bf16: false, int8: true };
const BF16: CpuFeatures = CpuFeatures { bf16: true, int8: false };
const BOTH: CpuFeatures = CpuFeatures { bf16: true, int8: true };

fn request(cpu_gemm_dtype: CpuGemmDtype, batch_invariant: bool) -> KernelRequest {
    KernelRequest { cpu_gemm_dtype, batch_invariant }
}

/// Resolves without a weight to time: `auto` keeps its default.
fn untimed(r: KernelRequest, cpu: CpuFeatures) -> KernelPlan {
    r.resolve(cpu, |_| None).plan
}

fn timing(seconds: &[(PanelPrecision, f64)]) -> PanelTiming {
    PanelTiming { rows: PROBE_ROWS, seconds: seconds.to_vec() }
}

fn plan(decode_sized: CpuKernel, prefill_sized: CpuKernel) -> KernelPlan {
    KernelPlan { decode_sized, prefill_sized, batch_invariant: false }
}

#[test]
fn named_dtypes_are_what_they_say() {
    for cpu in [NEITHER, INT8, BF16, BOTH] {
        for invariant in [false, true] {
            let r = |d| untimed(request(d, invariant), cpu);
            let expect = |p| if invariant { KernelPlan::batch_invariant(p) } else { KernelPlan::panels(p) };
            assert_eq!(r(CpuGemmDtype::Float32), expect(F32));
            assert_eq!(r(CpuGemmDtype::Bfloat16), expect(Bf16));
        }
    }
    assert_eq!(untimed(request(CpuGemmDtype::Float32, false), BOTH), plan(Blocks, Panels(F32)));
    assert_eq!(untimed(request(CpuGemmDtype::Bfloat16, false), BOTH), plan(Blocks, Panels(Bf16)));
    assert_eq!(untimed(request(CpuGemmDtype::Int8, false), INT8), plan(Panels(Int8), Panels(Int8)));
    assert_eq!(untimed(request(CpuGemmDtype::Int16, false), INT8), plan(Panels(Int16), Panels(Int16)));
    let invariant = untimed(request(CpuGemmDtype::Float32, true), BOTH);
    assert_eq!((invariant.decode_sized, invariant.prefill_sized), (Blocks, Blocks));
    assert!(invariant.batch_invariant);
}

#[test]
fn integer_dtypes_without_integer_kernels_fall_back_to_auto_with_a_warning() {
    for invariant in [false, true] {
        for dtype in [CpuGemmDtype::Int8, CpuGemmDtype::Int16] {
            let got = request(dtype, invariant).resolve(BF16, |_| None);
            assert_eq!(got.plan, untimed(request(CpuGemmDtype::Auto, invariant), BF16));
            assert!(got.fallback.unwrap().contains("needs AVX2 or AVX512-VNNI"));
        }
    }
    assert_eq!(request(CpuGemmDtype::Int8, false).resolve(INT8, |_| None).fallback, None);
}

#[test]
fn batch_invariant_auto_is_int16_with_integer_kernels_else_the_exact_blocks() {
    let auto = request(CpuGemmDtype::Auto, true);
    for cpu in [INT8, BOTH] {
        assert_eq!(untimed(auto, cpu), KernelPlan::batch_invariant(Int16));
    }
    for cpu in [NEITHER, BF16] {
        assert_eq!(untimed(auto, cpu), KernelPlan::batch_invariant(F32));
    }
    // Nothing is timed.
    auto.resolve(BOTH, |_| panic!("timed a batch-invariant plan"));
}

#[test]
fn auto_times_every_kernel_the_cpu_runs_natively() {
    let auto = request(CpuGemmDtype::Auto, false);
    let asked = |cpu| {
        let mut asked = None;
        let got = auto.resolve(cpu, |c: &[PanelPrecision]| {
            asked = Some(c.to_vec());
            None
        });
        (asked, got.plan)
    };
    // Only f32 panels: nothing to choose, nothing timed.
    assert_eq!(asked(NEITHER), (None, plan(Blocks, Panels(F32))));
    assert_eq!(asked(BF16), (Some(vec![Bf16, F32]), plan(Blocks, Panels(Bf16))));
    // Integer kernels without BF16 (Cascade Lake, AVX2-only AMD): f32 panels against int16.
    assert_eq!(asked(INT8), (Some(vec![F32, Int16]), plan(Panels(Int16), Panels(F32))));
    assert_eq!(asked(BOTH), (Some(vec![Bf16, F32, Int16]), plan(Panels(Int16), Panels(Bf16))));
}

#[test]
fn a_challenger_replaces_the_default_only_when_clearly_faster() {
    let auto = request(CpuGemmDtype::Auto, false);
    let choose = |cpu, seconds: &[(PanelPrecision, f64)]| {
        let got = auto.resolve(cpu, |_| Some(timing(seconds)));
        assert_eq!(got.timing, Some(timing(seconds)));
        got.plan.prefill_sized
    };
    assert_eq!(choose(BOTH, &[(Bf16, 1.4e-3), (F32, 3e-3), (Int16, 1.0e-3)]), Panels(Int16));
    assert_eq!(choose(BOTH, &[(Bf16, 1.16e-3), (F32, 3e-3), (Int16, 1.0e-3)]), Panels(Int16));
    assert_eq!(choose(BOTH, &[(Bf16, 1.1e-3), (F32, 3e-3), (Int16, 1.0e-3)]), Panels(Bf16));
    assert_eq!(choose(BOTH, &[(Bf16, 0.8e-3), (F32, 3e-3), (Int16, 1.0e-3)]), Panels(Bf16));
    assert_eq!(choose(BOTH, &[(Bf16, 3e-3), (F32, 1.0e-3), (Int16, 2e-3)]), Panels(F32));
    assert_eq!(choose(INT8, &[(F32, 2.64e-3), (Int16, 2.12e-3)]), Panels(Int16));
    assert_eq!(choose(INT8, &[(F32, 1.0e-3), (Int16, 1.0e-3)]), Panels(F32));
    // int16 for both step sizes keeps one copy and one kernel.
    let p = auto.resolve(BOTH, |_| Some(timing(&[(Bf16, 2e-3), (F32, 3e-3), (Int16, 1e-3)]))).plan;
    assert_eq!(p, KernelPlan::panels(Int16));
}

#[test]
fn the_plan_names_each_step_sizes_kernel() {
    assert_eq!(
        plan(Panels(Int16), Panels(Bf16)).to_string(),
        "decode-sized steps (up to 16 tokens) on int16 panels (16-bit activations), prefill-sized steps on \
         bfloat16 panels"
    );
    assert_eq!(
        KernelPlan::batch_invariant(F32).to_string(),
        "batch-invariant, exact f32 blocks at every step size"
    );
    assert_eq!(KernelPlan::default().kernel_for(DECODE_SIZED_MAX_TOKENS), Blocks);
    assert_eq!(KernelPlan::default().kernel_for(DECODE_SIZED_MAX_TOKENS + 1), Panels(F32));
    assert_eq!(KernelPlan::batch_invariant(F32).dense_precision(), F32);
    assert_eq!(KernelPlan::batch_invariant(Int8).dense_precision(), Int8);
}

#[test]
fn batch_invariant_refuses_what_its_kernels_do_not_cover() {
    assert_eq!(batch_invariant_refusal(false, DType::F32, None), None);
    assert_eq!(batch_invariant_refusal(true, DType::BF16, Some(true)), None);
    assert!(batch_invariant_refusal(false, DType::F32, Some(false)).unwrap().contains("dequantized"));
    assert!(batch_invariant_refusal(false, DType::BF16, None).unwrap().contains("float32"));
    assert!(batch_invariant_refusal(true, DType::F32, None).unwrap().contains("bfloat16"));
}
