//! The engine over the real SmolLM2 model on the CPU, for tests that go through scheduling.

use std::sync::{Arc, Mutex};

use candle_core::{DType, Device};
use pagoda_engine::{
    Engine, EngineConfig, EngineHandle, EngineObserver, Shutdown, SpeculativeMethod, StepStats,
};
use pagoda_models::{load_model, DraftModel, KvCache, LoadOptions, ModelRunner};
use pagoda_text::{ChatMessage, ChatTemplate, Tokenizer};

use super::{model_path, BLOCK_SIZE};

#[derive(Default)]
pub struct StepLog(pub Mutex<Vec<StepStats>>);

impl EngineObserver for StepLog {
    fn on_step(&self, stats: &StepStats) {
        self.0.lock().unwrap().push(*stats);
    }
}

pub fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_gguf(model_path()).unwrap())
}

pub fn chat_ids(tokenizer: &Tokenizer, system: Option<&str>, user: &str) -> Vec<u32> {
    let template =
        ChatTemplate::new(tokenizer.chat_template().unwrap(), tokenizer.bos_token(), tokenizer.eos_token())
            .unwrap();
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(ChatMessage::new("system", s));
    }
    messages.push(ChatMessage::new("user", user));
    tokenizer.encode(&template.render(&messages, true).unwrap(), false).unwrap()
}

/// Starts an engine over the real model with `tweak` applied to a default config. With
/// `SpeculativeMethod::DraftModel`, the model is its own draft (a second copy, with its own
/// cache): the only same-tokenizer draft at hand, and one whose greedy proposals the target
/// accepts nearly always, unless the draft's cache goes out of step with the target's.
pub fn engine(num_blocks: usize, tweak: impl FnOnce(&mut EngineConfig)) -> (EngineHandle, Arc<StepLog>) {
    let new_cache = |config: &pagoda_models::ModelConfig| {
        KvCache::new(config, num_blocks, BLOCK_SIZE, DType::F32, &Device::Cpu).unwrap()
    };
    let loaded = load_model(&model_path(), &LoadOptions::default()).unwrap();
    let cache = new_cache(loaded.model.config());
    let mut runner = ModelRunner::new(loaded.model, cache, Device::Cpu).unwrap();
    let mut config = EngineConfig::new(BLOCK_SIZE, num_blocks, (num_blocks * BLOCK_SIZE).min(2048));
    tweak(&mut config);
    if config.speculative.is_some_and(|s| s.method == SpeculativeMethod::DraftModel) {
        let draft = load_model(&model_path(), &LoadOptions::default()).unwrap().model;
        let cache = new_cache(draft.config());
        runner.set_draft(DraftModel::new(draft, cache)).unwrap();
    }
    let log = Arc::new(StepLog::default());
    let (handle, _thread) = Engine::spawn(config, runner, tokenizer(), log.clone(), Shutdown::new()).unwrap();
    (handle, log)
}
