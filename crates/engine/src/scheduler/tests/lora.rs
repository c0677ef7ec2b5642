//! LoRA requests in the scheduler: `max_loras` adapters run at once (base-model requests do not
//! count), a sequence of another adapter waits for a slot among them.

use super::*;

fn adapter_req(id: RequestId, lora: Option<u32>, max_tokens: usize) -> Request {
    let mut r = req(id, prompt(6, id as u32), max_tokens);
    r.lora = lora;
    r
}

#[test]
fn at_most_max_loras_adapters_run_at_once() {
    let mut config = EngineConfig::new(4, 128, 256);
    config.max_loras = Some(1);
    let mut h = Harness::new(config);
    h.add(adapter_req(1, Some(7), 5));
    h.add(adapter_req(2, Some(8), 5));
    h.add(adapter_req(3, None, 5));
    h.add(adapter_req(4, Some(7), 5));
    let first = h.step();
    let ids: Vec<Option<u32>> = first.seqs.iter().map(|s| s.lora).collect();
    // Adapter 7 twice and the base model; adapter 8 waits.
    assert_eq!(ids, vec![Some(7), None, Some(7)]);
    let mut adapter_8_started = None;
    let mut step = 1;
    while h.sched.has_unfinished() {
        let batch = h.step();
        step += 1;
        let running: Vec<Option<u32>> = batch.seqs.iter().map(|s| s.lora).collect();
        assert!(!(running.contains(&Some(7)) && running.contains(&Some(8))), "step {step}: {running:?}");
        if running.contains(&Some(8)) {
            adapter_8_started.get_or_insert(step);
        }
    }
    assert!(
        adapter_8_started.is_some_and(|s| s >= 5),
        "adapter 8 waited for adapter 7: {adapter_8_started:?}"
    );
    for id in 1..=4 {
        assert_eq!(h.tokens(id, 0).len(), 5);
    }
}
