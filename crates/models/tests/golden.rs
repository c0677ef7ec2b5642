//! The CPU model against the golden fixture of scripts/golden.py (numpy forward pass over the
//! dequantized GGUF weights): last-position logits and greedy continuations.

mod common;

use common::*;

/// Every golden case: the top-20 reference logits within `tolerance`, and at every step of the
/// reference's greedy continuation (teacher-forced, one decode step each) our argmax is the
/// reference's token, or a token we prefer to it by no more than `tolerance`: the reference's
/// continuations have near-ties (0.005 on the long prompt), which a path that drifts by up to
/// `tolerance` may resolve either way. For the f32 path (1e-3) that is every token equal.
/// Returns the largest logit difference seen.
fn assert_matches_reference(runner: &mut pagoda_models::ModelRunner, tolerance: f32) -> f32 {
    let fixture = fixture();
    let mut worst = 0f32;
    for case in fixture["logits_cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let expected = ids(&case["greedy"]);
        let forced: Vec<u32> = prompt.iter().chain(&expected[..expected.len() - 1]).copied().collect();
        let rows = teacher_forced(runner, &forced, prompt.len());
        assert_eq!(rows.len(), expected.len());
        for (step, (row, &want)) in rows.iter().zip(&expected).enumerate() {
            let ours = argmax(row);
            let preference = row[ours as usize] - row[want as usize];
            assert!(
                ours == want || preference <= tolerance,
                "{name}: greedy step {step} picks {ours} over the reference's {want} by {preference}"
            );
        }
        let logits = &rows[0];
        for pair in case["top20"].as_array().unwrap() {
            let id = pair[0].as_u64().unwrap() as usize;
            let reference = pair[1].as_f64().unwrap() as f32;
            let diff = (logits[id] - reference).abs();
            worst = worst.max(diff);
            assert!(
                diff <= tolerance,
                "{name}: logit of token {id}: ours {}, reference {reference}",
                logits[id]
            );
        }
    }
    worst
}

#[test]
fn dequantized_f32_path_matches_reference_logits_and_greedy_continuation() {
    assert_matches_reference(&mut runner(true, 64), 1e-3);
}

/// candle's quantized matmul quantizes activations to 8 bits per block (as llama.cpp does), so
/// its logits drift from the f32 reference: measured up to ~1.5 on the chat prompt, ~0.5 on the
/// plain ones. Greedy tokens can only be expected to agree where the reference's top-2 margin is
/// larger than that drift; the chat prompt's first step has a margin of 0.08 (a near-tie between
/// "The" and another token), so there the quantized answer must be the reference's runner-up.
const QUANTIZED_LOGIT_TOLERANCE: f32 = 2.0;

/// Every golden case within [`QUANTIZED_LOGIT_TOLERANCE`] on the top-20 logits, and the first
/// 16 greedy tokens equal where the reference's top-2 margin allows it. Returns the largest
/// logit difference seen.
fn assert_agrees_like_8_bit_activations(runner: &mut pagoda_models::ModelRunner, what: &str) -> f32 {
    let fixture = fixture();
    let mut worst = 0f32;
    for case in fixture["logits_cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let expected = ids(&case["greedy"]);
        let (logits, generated) = greedy(runner, &prompt, 16);
        let top20 = case["top20"].as_array().unwrap();
        for pair in top20 {
            let id = pair[0].as_u64().unwrap() as usize;
            let reference = pair[1].as_f64().unwrap() as f32;
            let diff = (logits[id] - reference).abs();
            worst = worst.max(diff);
            assert!(diff <= QUANTIZED_LOGIT_TOLERANCE, "{what}, {name}: token {id} logit off by {diff}");
        }
        let margin = top20[0][1].as_f64().unwrap() - top20[1][1].as_f64().unwrap();
        if margin >= 0.1 {
            assert_eq!(generated, expected[..16], "{what}, {name}: greedy continuation differs");
        } else {
            let top2: Vec<u32> = top20[..2].iter().map(|p| p[0].as_u64().unwrap() as u32).collect();
            assert!(
                top2.contains(&generated[0]),
                "{what}, {name}: first token {} not in the reference top 2",
                generated[0]
            );
        }
    }
    worst
}

#[test]
fn quantized_path_agrees_on_the_first_16_greedy_tokens() {
    let mut runner = runner(false, 64);
    assert!(runner.model().is_quantized());
    assert_agrees_like_8_bit_activations(&mut runner, "candle's quantized matmul");
}

/// `--cpu-gemm-dtype int8`: every step multiplies the GGUF codes by 8-bit activations (our
/// kernel, the precision of candle's quantized matmul above and of llama.cpp), with an f16
/// cache as the server runs it.
#[test]
fn int8_gemm_agrees_like_8_bit_activations() {
    let mut runner =
        runner_with_panels(true, 64, candle_core::DType::F16, pagoda_models::PanelPrecision::Int8);
    let worst = assert_agrees_like_8_bit_activations(&mut runner, "int8 panels");
    eprintln!("largest logit difference with int8 GEMMs and an f16 cache: {worst}");
}

/// K/V stored as f16 (the server's default for f32 models) round each cached value to 11
/// significant bits; the logits drift from the reference by up to 0.011 (measured).
const F16_CACHE_LOGIT_TOLERANCE: f32 = 0.03;

#[test]
fn f16_kv_cache_stays_close_to_reference_logits_and_greedy_continuation() {
    let mut runner = runner_with_cache(true, 64, candle_core::DType::F16);
    let worst = assert_matches_reference(&mut runner, F16_CACHE_LOGIT_TOLERANCE);
    eprintln!("largest logit difference with an f16 cache: {worst}");
}

/// The server's default on CPUs with AVX512-BF16: steps over 16 tokens (all three prompts'
/// prefills here) multiply bfloat16-rounded weights and activations. Measured drift 0.094 with
/// every greedy continuation unchanged, against ~1.5 for 8-bit activations (above).
const BF16_GEMM_LOGIT_TOLERANCE: f32 = 0.25;

#[test]
fn bf16_gemm_with_f16_kv_cache_stays_close_to_reference_logits_and_greedy_continuation() {
    let mut runner =
        runner_with_panels(true, 64, candle_core::DType::F16, pagoda_models::PanelPrecision::Bf16);
    let worst = assert_matches_reference(&mut runner, BF16_GEMM_LOGIT_TOLERANCE);
    eprintln!("largest logit difference with bf16 GEMMs and an f16 cache: {worst}");
}

/// `--cpu-gemm-dtype int16`: steps over 16 tokens (all three prompts' prefills here) multiply
/// the GGUF codes by activations rounded to 16 bits per block of 32. Their drift is far below
/// bfloat16's: measured 0.0088 against 0.0069 for the f16 cache alone (above).
const INT16_GEMM_LOGIT_TOLERANCE: f32 = 0.05;

#[test]
fn int16_gemm_with_f16_kv_cache_stays_close_to_reference_logits_and_greedy_continuation() {
    let mut runner =
        runner_with_panels(true, 64, candle_core::DType::F16, pagoda_models::PanelPrecision::Int16);
    let worst = assert_matches_reference(&mut runner, INT16_GEMM_LOGIT_TOLERANCE);
    eprintln!("largest logit difference with int16 GEMMs and an f16 cache: {worst}");
}

/// The server's default on CPUs with AVX512-VNNI and AVX512-BF16: steps of up to 16 tokens (every
/// decode step here) on int16 panels, larger ones (the prefills) on bfloat16 panels, f16 cache.
/// Where the CPU lacks them, the portable kernels run.
#[test]
fn default_cpu_gemms_with_int16_small_steps_stay_close_to_reference_logits_and_greedy_continuation() {
    let plan = pagoda_models::KernelPlan::panels(pagoda_models::PanelPrecision::Bf16).with_int16_decode();
    let mut runner = runner_with_plan(true, 64, candle_core::DType::F16, plan);
    let worst = assert_matches_reference(&mut runner, BF16_GEMM_LOGIT_TOLERANCE);
    eprintln!("largest logit difference with int16 small steps, bf16 GEMMs and an f16 cache: {worst}");
}

/// `--cpu-gemm-dtype auto`: the kernel plan times the prefill-sized kernels this CPU runs
/// natively on one of the model's weights and names the one it chose. A 24-token prefill (a
/// prefill-sized step) then has the bits of that kernel, and not those of another candidate.
#[test]
fn auto_times_the_prefill_sized_kernels_and_runs_the_one_it_chose() {
    use pagoda_models::kernel_plan::{CpuFeatures, PROBE_ROWS};
    use pagoda_models::{
        load_model, resolve_kernel_plan, CpuKernel, KernelPlan, KernelRequest, KvCache, LoadOptions,
        ModelRunner,
    };

    let cpu = CpuFeatures::detect();
    let options = LoadOptions { dequantize: Some(true), ..LoadOptions::default() };
    let request = KernelRequest::default();
    let resolved = resolve_kernel_plan(&model_path(), &options, request).unwrap();
    assert_eq!(resolved.timing.is_some(), cpu.bf16 || cpu.int8, "timed where there is a choice");
    let Some(timing) = resolved.timing.clone() else { return };
    eprintln!("prefill-sized kernels: {timing:?}; plan: {}", resolved.plan);
    assert_eq!(timing.rows, PROBE_ROWS);
    assert_eq!(request.resolve(cpu, |_| Some(timing.clone())).plan, resolved.plan);
    // Timed once per file and process: a second resolution takes the first one's timing.
    assert_eq!(resolve_kernel_plan(&model_path(), &options, request).unwrap(), resolved);

    let prompt: Vec<u32> = (0..24).map(|i| 100 + i * 37).collect();
    let logits_bits = |model: pagoda_models::Model| {
        let cache =
            KvCache::new(model.config(), 4, BLOCK_SIZE, candle_core::DType::F32, &candle_core::Device::Cpu)
                .unwrap();
        let mut runner = ModelRunner::new(model, cache, candle_core::Device::Cpu).unwrap();
        let seq = TestSeq::new(1, prompt.clone(), 0);
        let logits = runner.logits(&batch(vec![seq.chunk(prompt.len())])).unwrap();
        logits
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>()
    };
    let load = |plan: KernelPlan| {
        logits_bits(
            load_model(&model_path(), &LoadOptions { kernel_plan: plan, ..options.clone() }).unwrap().model,
        )
    };
    let chosen = load(resolved.plan);
    for (other, _) in
        timing.seconds.iter().filter(|(p, _)| CpuKernel::Panels(*p) != resolved.plan.prefill_sized)
    {
        let plan = KernelPlan { prefill_sized: CpuKernel::Panels(*other), ..resolved.plan };
        assert!(chosen != load(plan), "a 24-token step runs the chosen kernel, not {other:?}");
    }
}
