//! The model runner: keeps every running sequence's block tables between steps (brought up to
//! date from each batch's changes, [`BlockTableStore`]), turns a [`ScheduledBatch`] into flat
//! tensors (token ids, positions, query starts, context lengths, and per KV group a slot mapping
//! and block tables), runs the model over the whole mixed batch at once, and samples one token
//! per sequence that asked for one (verifying its proposed tokens first, when it carries any).

use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{Device, Tensor};
use pagoda_engine::sampler::with_thread_sampler;
use pagoda_engine::speculative::{propose_after_step, try_verify, Proposer};
use pagoda_engine::{
    BlockTableStore, ExecutorDraft, ExecutorError, KvGroups, LoraId, ModelExecutor, PooledOutput,
    PromptLogprobsOutput, SampledToken, ScheduledBatch, StepOutput,
};
use pagoda_ops::AttentionMetadata;
use rayon::prelude::*;

use crate::decode_graphs::DecodeGraphs;
use crate::drafter::{DraftModel, ModelDrafter, SelfDrafter};
use crate::encoder_cache::{EncoderCache, DEFAULT_ENCODER_CACHE_BYTES};
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::lora::LoraBatch;
use crate::model::{ForwardInput, Model};

// The engine marks released blocks with the value the kernels skip.
const _: () = assert!(pagoda_engine::NULL_BLOCK == pagoda_ops::NULL_BLOCK);

pub struct ModelRunner {
    pub(crate) model: Model,
    pub(crate) cache: KvCache,
    pub(crate) device: Device,
    /// A separate draft model for speculative decoding ([`ExecutorDraft::Model`]).
    pub(crate) draft: Option<DraftModel>,
    /// The block tables of the sequences the engine runs, as of the last step.
    tables: BlockTableStore,
    /// The block copies of a step that failed after making them with a sequence rejected: the
    /// engine runs it again without that sequence, and copying again could copy a source block
    /// that the failed step had already handed to, and written for, another sequence.
    copies_done: Option<Vec<(u32, u32)>>,
    /// Runs each whole step, so that the CPU ops' parallel loops start on a pool thread. Called
    /// from the engine thread instead, every op would hand its work to the pool and sleep until
    /// it is done: two thread wake-ups per op, hundreds per step (a fifth of a decode step).
    pool: Arc<rayon::ThreadPool>,
    /// Decode steps replayed as CUDA graphs, when enabled ([`ModelRunner::enable_decode_graphs`]).
    graphs: Option<Mutex<DecodeGraphs>>,
    /// A vision model's image features by image hash ([`crate::encoder_cache`]).
    encoder_cache: EncoderCache,
}

/// Host-side flattening of one batch.
pub(crate) struct FlatBatch<'t> {
    /// Per sequence, its block tables (one per KV group).
    pub(crate) tables: Vec<&'t [Vec<u32>]>,
    pub(crate) input_ids: Vec<u32>,
    pub(crate) positions: Vec<u32>,
    /// Per KV group.
    pub(crate) slot_mappings: Vec<Vec<u32>>,
    cu_seqlens_q: Vec<u32>,
    pub(crate) context_lens: Vec<u32>,
    pub(crate) logits_rows: Vec<u32>,
    /// The token rows of the pooling sequences, which they pool; `pooled_bounds[i]..[i + 1]`
    /// are the `i`-th one's.
    pub(crate) pooled_rows: Vec<u32>,
    pooled_bounds: Vec<usize>,
    /// Each row's LoRA adapter.
    pub(crate) lora: LoraBatch,
    /// Image features in place of placeholder rows ([`crate::step_images`]).
    pub(crate) placeholders: Option<crate::multimodal::PlaceholderEmbeds>,
}

impl ModelRunner {
    pub fn new(model: Model, cache: KvCache, device: Device) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("pagoda-cpu-{i}")).build()?;
        Ok(Self {
            model,
            cache,
            device,
            draft: None,
            tables: BlockTableStore::new(),
            copies_done: None,
            pool: Arc::new(pool),
            graphs: None,
            encoder_cache: EncoderCache::new(DEFAULT_ENCODER_CACHE_BYTES, Default::default()),
        })
    }

    /// Keeps up to `bytes` of image features (0: none; every chunk over an image encodes it),
    /// counting into `stats`; what the cache held is dropped.
    pub fn set_encoder_cache(&mut self, bytes: usize, stats: Arc<pagoda_engine::EncoderCacheStats>) {
        self.encoder_cache = EncoderCache::new(bytes, stats);
    }

    /// The most bytes of image features the encoder cache keeps.
    pub fn encoder_cache_bytes(&self) -> usize {
        self.encoder_cache.capacity_bytes()
    }

    /// The encoder cache's counters (hits, misses, what it holds), for metrics.
    pub fn encoder_cache_stats(&self) -> Arc<pagoda_engine::EncoderCacheStats> {
        Arc::clone(self.encoder_cache.stats())
    }

    /// Drops the cached image features (their memory is the device's).
    pub fn clear_encoder_cache(&mut self) {
        self.encoder_cache.clear();
    }

    /// Attaches a draft model, whose cache must have this runner's block size and number of
    /// blocks (the block tables page both caches alike).
    pub fn set_draft(&mut self, draft: DraftModel) -> Result<()> {
        self.check_draft_cache(draft.cache())?;
        self.draft = Some(draft);
        Ok(())
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Swaps in another cache (start-up sizes the real one after profiling with a scratch one).
    /// A draft model is attached after that, with a cache of the final geometry.
    pub fn replace_cache(&mut self, cache: KvCache) -> KvCache {
        self.tables.clear();
        let old = std::mem::replace(&mut self.cache, cache);
        // Graphs captured the old cache's addresses.
        if let Some(graphs) = self.graphs.take() {
            let graphs = graphs.into_inner().unwrap_or_else(PoisonError::into_inner);
            self.graphs = Some(Mutex::new(graphs.for_cache(&self.model, &self.cache)));
        }
        old
    }

    /// Runs decode steps of up to `max_batch` sequences (up to 128) of contexts of up to
    /// `max_context` tokens as CUDA graphs, captured on first use (see
    /// [`crate::decode_graphs`]); with `capture` false, on the same padded buffers without a
    /// graph (how the CPU tests check that path).
    pub fn enable_decode_graphs(&mut self, max_batch: usize, max_context: usize, capture: bool) {
        let graphs = DecodeGraphs::new(&self.model, &self.cache, max_batch, max_context, capture);
        self.graphs = Some(Mutex::new(graphs));
    }

    /// The decode batch sizes captured (or prepared) so far.
    pub fn decode_graph_sizes(&self) -> Vec<usize> {
        self.graphs
            .as_ref()
            .map(|g| g.lock().unwrap_or_else(PoisonError::into_inner).prepared_sizes())
            .unwrap_or_default()
    }

    fn check_draft_cache(&self, cache: &KvCache) -> Result<()> {
        let (ours, theirs) =
            ((self.cache.block_size(), self.cache.num_blocks()), (cache.block_size(), cache.num_blocks()));
        if ours != theirs || cache.layout().num_groups() != 1 || self.cache.layout().num_groups() != 1 {
            return Err(ModelError::InvalidOption(format!(
                "the draft model's cache (block size, blocks) {theirs:?} in {} KV groups must match the \
                 target's {ours:?} in one group",
                cache.layout().num_groups()
            )));
        }
        Ok(())
    }

    /// Runs the batch and returns f32 logits `[n, vocab]`, in batch order: for each sequence
    /// with `sample: Some`, one row per verified position (the last `num_draft_tokens + 1`).
    pub fn logits(&mut self, batch: &ScheduledBatch) -> Result<Tensor> {
        let invalid = |e: ExecutorError| ModelError::InvalidOption(e.to_string());
        self.tables.apply(batch).map_err(invalid)?;
        let placeholders = self.step_placeholders(batch).map_err(invalid)?;
        let mut flat = flatten(batch, &self.tables, &self.model, &self.cache).map_err(invalid)?;
        flat.placeholders = placeholders;
        self.cache.copy_blocks(&batch.block_copies)?;
        Ok(self.forward_flat(flat)?.0)
    }

    /// The target's forward pass over a batch already checked and flattened, its block copies
    /// done (they run only after the check, so that a batch retried without a rejected sequence
    /// copies nothing twice).
    fn forward_flat(&self, flat: FlatBatch<'_>) -> Result<(Tensor, Option<Tensor>)> {
        if let Some(graphs) = self.graphs.as_ref().filter(|_| flat.placeholders.is_none()) {
            let mut graphs = graphs.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(logits) = graphs.forward(&self.model, &self.cache, &self.device, &flat)? {
                return Ok((logits, None));
            }
        }
        forward_with(&self.model, &self.cache, &self.device, flat, None)
    }

    /// Loads the adapter at `dir` (PEFT directory or GGUF file) as adapter `id` of the engine's requests (see
    /// [`Model::add_lora`]).
    pub fn add_lora(
        &mut self,
        id: pagoda_engine::LoraId,
        dir: &std::path::Path,
        max_rank: usize,
    ) -> Result<()> {
        self.model.add_lora(id, dir, max_rank, &self.device)
    }

    /// How adapters added from now on store their matrices ([`Model::set_lora_dtype`]).
    pub fn set_lora_dtype(&mut self, lora_dtype: crate::lora::LoraDtype) {
        self.model.set_lora_dtype(lora_dtype);
    }

    /// Drops adapter `id`; false when it was not loaded.
    pub fn remove_lora(&mut self, id: LoraId) -> bool {
        self.model.remove_lora(id)
    }
}

/// Flattens `batch`, whose sequences' block tables `tables` holds, for `model` over `cache`,
/// checking every sequence against them; the first one that cannot run is reported on its own
/// so that the engine fails only its request.
pub(crate) fn flatten<'t>(
    batch: &ScheduledBatch,
    tables: &'t BlockTableStore,
    model: &Model,
    cache: &KvCache,
) -> std::result::Result<FlatBatch<'t>, ExecutorError> {
    let block_size = cache.block_size();
    let num_blocks = cache.num_blocks() as u32;
    let max_len = model.config().max_position_embeddings;
    let num_tokens = batch.num_tokens();
    let num_groups = cache.layout().num_groups();
    let mut flat = FlatBatch {
        tables: Vec::with_capacity(batch.seqs.len()),
        input_ids: Vec::with_capacity(num_tokens),
        positions: Vec::with_capacity(num_tokens),
        slot_mappings: vec![Vec::with_capacity(num_tokens); num_groups],
        cu_seqlens_q: Vec::with_capacity(batch.seqs.len() + 1),
        context_lens: Vec::with_capacity(batch.seqs.len()),
        logits_rows: Vec::new(),
        pooled_rows: Vec::new(),
        pooled_bounds: vec![0],
        lora: LoraBatch::default(),
        placeholders: None,
    };
    flat.cu_seqlens_q.push(0);
    for seq in &batch.seqs {
        let invalid = |message: String| ExecutorError::InvalidSequence { seq_id: seq.seq_id, message };
        if seq.token_ids.is_empty() {
            return Err(invalid("no tokens to compute".into()));
        }
        if seq.context_len() > max_len {
            return Err(invalid(format!(
                "the context of {} tokens exceeds the model's {max_len} positions",
                seq.context_len()
            )));
        }
        let adapter = match seq.lora {
            Some(id) => Some(Arc::clone(
                model.lora(id).ok_or_else(|| invalid(format!("LoRA adapter {id} is not loaded")))?,
            )),
            None => None,
        };
        flat.lora.push(seq.q_len(), adapter);
        let block_tables = tables.get(seq.seq_id).unwrap_or_default();
        if block_tables.len() != num_groups {
            return Err(invalid(format!(
                "{} block tables for a cache of {num_groups} KV groups",
                block_tables.len()
            )));
        }
        for table in block_tables {
            if table.len() * block_size < seq.context_len() {
                return Err(invalid(format!(
                    "{} blocks cannot hold {} tokens",
                    table.len(),
                    seq.context_len()
                )));
            }
            // Released entries (NULL_BLOCK) are checked against each layer's window by the
            // attention op; the blocks this step writes must be real.
            let written = &table[seq.start_pos / block_size..seq.context_len().div_ceil(block_size)];
            if let Some(b) = table.iter().find(|&&b| b >= num_blocks && b != pagoda_ops::NULL_BLOCK) {
                return Err(invalid(format!("block {b} outside the cache of {num_blocks} blocks")));
            }
            if written.contains(&pagoda_ops::NULL_BLOCK) {
                return Err(invalid("a block this step writes was released".into()));
            }
        }
        for (offset, &token) in seq.token_ids.iter().enumerate() {
            let pos = seq.start_pos + offset;
            flat.input_ids.push(token);
            flat.positions.push(pos as u32);
            for (slots, table) in flat.slot_mappings.iter_mut().zip(block_tables) {
                let block = table[pos / block_size] as usize;
                slots.push((block * block_size + pos % block_size) as u32);
            }
        }
        flat.tables.push(block_tables);
        flat.cu_seqlens_q.push(flat.input_ids.len() as u32);
        flat.context_lens.push(seq.context_len() as u32);
        if seq.num_draft_tokens >= seq.q_len() || (seq.num_draft_tokens > 0 && seq.sample.is_none()) {
            return Err(invalid(format!(
                "{} proposed tokens in a step of {} that samples {}",
                seq.num_draft_tokens,
                seq.q_len(),
                if seq.sample.is_some() { "one" } else { "none" }
            )));
        }
        let end = flat.input_ids.len() as u32;
        flat.logits_rows.extend(end - seq.num_logits_rows() as u32..end);
        if seq.pool {
            if seq.start_pos != 0 {
                return Err(invalid(format!("pooling from position {}, not the whole input", seq.start_pos)));
            }
            flat.pooled_rows.extend(end - seq.q_len() as u32..end);
            flat.pooled_bounds.push(flat.pooled_rows.len());
        }
    }
    Ok(flat)
}

/// The forward pass of `model` over its `cache` for a batch already checked and flattened,
/// through the first `num_layers` layers or all: the logits, and the final-normed hidden states
/// of the pooling sequences' rows when there are any.
pub(crate) fn forward_with(
    model: &Model,
    cache: &KvCache,
    dev: &Device,
    flat: FlatBatch<'_>,
    num_layers: Option<usize>,
) -> Result<(Tensor, Option<Tensor>)> {
    let attention = flat
        .slot_mappings
        .into_iter()
        .enumerate()
        .map(|(g, slots)| {
            let tables: Vec<&[u32]> = flat.tables.iter().map(|t| t[g].as_slice()).collect();
            AttentionMetadata::new(slots, flat.cu_seqlens_q.clone(), flat.context_lens.clone(), &tables, dev)
        })
        .collect::<candle_core::Result<Vec<_>>>()?;
    let num_tokens = flat.input_ids.len();
    let num_rows = flat.logits_rows.len();
    let input_ids = Tensor::from_vec(flat.input_ids, num_tokens, dev)?;
    let positions = Tensor::from_vec(flat.positions, num_tokens, dev)?;
    // CUDA cannot hold an empty list: a step that wants no logits passes none.
    let logits_rows =
        (num_rows > 0).then(|| Tensor::from_vec(flat.logits_rows, num_rows, dev)).transpose()?;
    let num_pooled = flat.pooled_rows.len();
    let hidden_rows =
        (num_pooled > 0).then(|| Tensor::from_vec(flat.pooled_rows, num_pooled, dev)).transpose()?;
    let input = ForwardInput {
        input_ids: &input_ids,
        positions: &positions,
        attention: &attention,
        logits_rows: logits_rows.as_ref(),
        num_layers,
        hidden_rows: hidden_rows.as_ref(),
        lora: flat.lora.is_active().then_some(&flat.lora),
        placeholders: flat.placeholders.as_ref(),
    };
    model.forward_parts(&input, cache)
}

impl ModelExecutor for ModelRunner {
    fn execute(&mut self, batch: &ScheduledBatch) -> std::result::Result<StepOutput, ExecutorError> {
        let pool = Arc::clone(&self.pool);
        pool.install(|| self.execute_in_pool(batch))
    }

    fn install_lora(
        &mut self,
        id: LoraId,
        adapter: pagoda_engine::PreparedLora,
    ) -> std::result::Result<(), ExecutorError> {
        let adapter = adapter
            .downcast::<crate::lora::LoraAdapter>()
            .map_err(|_| ExecutorError::Execution("the adapter was not prepared for this model".into()))?;
        self.model
            .install_lora(id, *adapter, &self.device)
            .map_err(|e| ExecutorError::Execution(e.to_string()))
    }

    fn unload_lora(&mut self, id: LoraId) -> bool {
        self.remove_lora(id)
    }

    fn block_size(&self) -> usize {
        self.cache.block_size()
    }

    fn num_blocks(&self) -> usize {
        self.cache.num_blocks()
    }

    fn kv_groups(&self) -> KvGroups {
        self.cache.layout().kv_groups()
    }

    fn num_layers(&self) -> Option<usize> {
        Some(self.model.config().num_layers)
    }

    fn has_draft_model(&self) -> bool {
        self.draft.is_some()
    }

    fn takes_images(&self) -> bool {
        self.model.takes_images()
    }

    fn kv_page_layout(&self) -> Option<pagoda_engine::KvPageLayout> {
        self.cache.page_layout()
    }

    fn read_kv_pages(&mut self, blocks: &[u32]) -> std::result::Result<Vec<u8>, ExecutorError> {
        self.cache.read_pages(blocks).map_err(|e| ExecutorError::Execution(e.to_string()))
    }

    fn write_kv_pages(&mut self, blocks: &[u32], pages: &[u8]) -> std::result::Result<(), ExecutorError> {
        self.cache.write_pages(blocks, pages).map_err(|e| ExecutorError::Execution(e.to_string()))
    }
}

impl ModelRunner {
    fn execute_in_pool(&mut self, batch: &ScheduledBatch) -> std::result::Result<StepOutput, ExecutorError> {
        let failed = |e: ModelError| ExecutorError::Execution(e.to_string());
        self.tables.apply(batch)?;
        if self.model.is_encoder() {
            return self.embed(batch);
        }
        if let Some(seq) = batch.seqs.iter().find(|s| s.pool).filter(|_| self.model.pooling().is_none()) {
            return Err(ExecutorError::InvalidSequence {
                seq_id: seq.seq_id,
                message: "this model serves no embeddings (a decoder embeds when started with --pooling)"
                    .into(),
            });
        }
        let placeholders = self.step_placeholders(batch)?;
        let mut flat = flatten(batch, &self.tables, &self.model, &self.cache)?;
        flat.placeholders = placeholders;
        if self.copies_done.as_ref() != Some(&batch.block_copies) {
            self.cache.copy_blocks(&batch.block_copies).map_err(failed)?;
            if let Some(draft) = &self.draft {
                draft.cache.copy_blocks(&batch.block_copies).map_err(failed)?;
            }
        }
        let result = self.sample_and_draft(batch, flat);
        self.copies_done = match &result {
            Err(ExecutorError::InvalidSequence { .. }) => Some(batch.block_copies.clone()),
            _ => None,
        };
        result
    }

    /// The image features of `batch`'s placeholder rows ([`crate::step_images`]).
    fn step_placeholders(
        &mut self,
        batch: &ScheduledBatch,
    ) -> std::result::Result<Option<crate::multimodal::PlaceholderEmbeds>, ExecutorError> {
        crate::step_images::step_placeholders(batch, &self.model, &mut self.encoder_cache, &self.device)
    }

    /// The step after its block copies: the target's pass and sampling, then the drafts of
    /// the batch's drafter, if it names one.
    fn sample_and_draft(
        &self,
        batch: &ScheduledBatch,
        flat: FlatBatch<'_>,
    ) -> std::result::Result<StepOutput, ExecutorError> {
        let mut output = self.verify(batch, flat)?;
        if let Some(how) = batch.executor_draft {
            propose_after_step(&*self.drafter(how)?, batch, &mut output.sampled)?;
        }
        Ok(output)
    }

    /// The executor's proposer `how` names: the self-drafter over the target, or the draft
    /// model's drafter where one is attached.
    fn drafter(
        &self,
        how: ExecutorDraft,
    ) -> std::result::Result<Box<dyn Proposer<Error = ExecutorError> + '_>, ExecutorError> {
        Ok(match how {
            ExecutorDraft::Layers(layers) => {
                Box::new(SelfDrafter::new(&self.model, &self.cache, &self.tables, &self.device, layers))
            }
            ExecutorDraft::Model => {
                let draft =
                    self.draft.as_ref().ok_or_else(|| ExecutorError::Execution("no draft model".into()))?;
                Box::new(ModelDrafter::new(draft, &self.tables, &self.device))
            }
        })
    }

    /// An encoder's step: each sequence is one whole input (the scheduler sends nothing else
    /// for pooling), embedded on its own tokens; the cache is not touched.
    fn embed(&self, batch: &ScheduledBatch) -> std::result::Result<StepOutput, ExecutorError> {
        let config = self.model.config();
        let (mut ids, mut types, mut positions, mut bounds) = (Vec::new(), Vec::new(), Vec::new(), vec![0]);
        for seq in &batch.seqs {
            let invalid = |message: String| ExecutorError::InvalidSequence { seq_id: seq.seq_id, message };
            if !seq.pool || seq.start_pos != 0 {
                return Err(invalid(
                    "this is an embedding model: it embeds whole inputs and generates nothing".into(),
                ));
            }
            if seq.q_len() > config.max_position_embeddings {
                return Err(invalid(format!(
                    "the input of {} tokens exceeds the model's {} positions",
                    seq.q_len(),
                    config.max_position_embeddings
                )));
            }
            if let Some(&bad) = seq.token_ids.iter().find(|&&t| t as usize >= config.vocab_size) {
                return Err(invalid(format!(
                    "token id {bad} is outside the vocabulary of {}",
                    config.vocab_size
                )));
            }
            ids.extend_from_slice(&seq.token_ids);
            let second = seq.second_segment.unwrap_or(seq.q_len());
            types.extend((0..seq.q_len()).map(|i| u32::from(i >= second)));
            positions.extend(0..seq.q_len() as u32);
            bounds.push(ids.len());
        }
        if ids.is_empty() {
            return Ok(StepOutput::default());
        }
        let failed = |e: candle_core::Error| ExecutorError::Execution(e.to_string());
        let n = ids.len();
        let ids = Tensor::from_vec(ids, n, &self.device).map_err(failed)?;
        let types = Tensor::from_vec(types, n, &self.device).map_err(failed)?;
        let positions = Tensor::from_vec(positions, n, &self.device).map_err(failed)?;
        let values = self
            .model
            .embed(&ids, &types, &positions, &bounds)
            .map_err(|e| ExecutorError::Execution(e.to_string()))?;
        let pooled = batch
            .seqs
            .iter()
            .zip(values)
            .map(|(seq, values)| PooledOutput { seq_id: seq.seq_id, values })
            .collect();
        Ok(StepOutput { pooled, ..StepOutput::default() })
    }

    /// The target's forward pass over `batch`: its sampled (verified) tokens, the pooled states
    /// of its pooling sequences and the logprobs of the prompt tokens it scores.
    fn verify(
        &self,
        batch: &ScheduledBatch,
        flat: FlatBatch<'_>,
    ) -> std::result::Result<StepOutput, ExecutorError> {
        let failed = |e: ModelError| ExecutorError::Execution(e.to_string());
        let bounds = flat.pooled_bounds.clone();
        let (logits, hidden) = self.forward_flat(flat).map_err(failed)?;
        let pooled = match (hidden, self.model.pooling()) {
            (Some(hidden), Some(pooling)) => {
                let values = pooling.pool(&hidden, &bounds).map_err(failed)?;
                let seqs = batch.seqs.iter().filter(|s| s.pool);
                seqs.zip(values).map(|(s, values)| PooledOutput { seq_id: s.seq_id, values }).collect()
            }
            _ => Vec::new(),
        };
        let scoring = batch.seqs.iter().any(|s| s.prompt_logprobs.is_some());
        if batch.seqs.iter().all(|s| s.sample.is_none()) && !scoring {
            return Ok(StepOutput { pooled, ..StepOutput::default() });
        }
        // On a GPU the logits stay there: only ids and logprobs come back (prompt scoring reads
        // its rows on the host).
        if self.device.is_cuda() && !scoring {
            if let Some(sampled) = crate::device_sampling::sample_batch(batch, &logits)? {
                return Ok(StepOutput { sampled, pooled, prompt_logprobs: Vec::new() });
            }
        }
        let mut rows = logits.to_vec2::<f32>().map_err(|e| failed(e.into()))?.into_iter();
        let (mut wanted, mut scored) = (Vec::new(), Vec::new());
        for seq in &batch.seqs {
            // A sequence's rows: the prompt positions it scores, then the ones it samples at.
            let mut seq_rows: Vec<Vec<f32>> = rows.by_ref().take(seq.num_logits_rows()).collect();
            if let Some(request) = &seq.prompt_logprobs {
                let sampling_rows = seq_rows.split_off(request.targets.len().min(seq_rows.len()));
                scored.push((seq, request, seq_rows));
                seq_rows = sampling_rows;
            }
            if let Some(req) = &seq.sample {
                wanted.push((seq, req, seq_rows));
            }
        }
        let prompt_logprobs = scored
            .into_par_iter()
            .map(|(seq, request, rows)| {
                let logprobs = rows
                    .iter()
                    .zip(&request.targets)
                    .map(|(row, &target)| with_thread_sampler(|s| s.token_logprobs(row, target, request.top)))
                    .collect();
                PromptLogprobsOutput { seq_id: seq.seq_id, logprobs }
            })
            .collect();
        // Sequences are sampled in parallel: a softmax over the vocabulary per row.
        let sampled = wanted
            .into_par_iter()
            .map(|(seq, req, rows)| {
                let seq_id = seq.seq_id;
                let (token_ids, logprobs) = try_verify(rows, req, seq.draft_tokens())
                    .map_err(|e| ExecutorError::InvalidSequence { seq_id, message: e.to_string() })?;
                Ok(SampledToken { seq_id, token_ids, logprobs, proposals: Vec::new() })
            })
            .collect::<std::result::Result<_, ExecutorError>>()?;
        Ok(StepOutput { sampled, pooled, prompt_logprobs })
    }
}
