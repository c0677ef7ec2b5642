//! CUDA graphs of decode steps. Launching a decode step's few hundred small kernels one by one
//! costs the host more time than the GPU takes to run them at small batches; a graph replays
//! them all with one launch.
//!
//! - A step whose sequences each compute one token, with no LoRA adapter, pooling or layer
//!   limit, runs at the smallest capture size that holds it (1, 2, 4, 8, 16, 32, 64, 128, up to
//!   the limit); the rows past its sequences are padding that writes no KV and is not read.
//! - Each size keeps its inputs in buffers of its own, written in place before each replay
//!   (`pagoda_ops::write_u32_in_place`), and its attention metadata plans for the longest
//!   context the buffers hold (`AttentionMetadata::for_replay`): the kernels read each context
//!   length when they run, so one capture serves every step of that size.
//! - A size is captured the first time a step needs it, after one eager run on its buffers that
//!   loads every kernel and makes the attention plan (a capture may do neither). A size whose
//!   capture fails runs eagerly from then on, with a warning.
//! - Mixed prefill steps, and every step on the CPU, run eagerly. On the CPU the same buffers
//!   and padding can be exercised without a capture ([`DecodeGraphs::new`] with
//!   `capture: false`), which is how the tests check the path.

use std::collections::{HashMap, HashSet};

use candle_core::{DType, Device, Tensor};
use pagoda_ops::{write_u32_in_place, AttentionMetadata, HostAttentionMetadata, PADDING_SLOT};

use crate::error::Result;
use crate::kv_cache::KvCache;
use crate::model::{ForwardInput, Model};
use crate::runner::FlatBatch;

/// The batch sizes decode steps are captured at, up to the limit.
const CAPTURE_SIZES: [usize; 8] = [1, 2, 4, 8, 16, 32, 64, 128];

/// The captured decode steps of one model over one cache.
pub(crate) struct DecodeGraphs {
    sizes: Vec<usize>,
    max_batch: usize,
    max_context: usize,
    /// Block-table width of every size's buffers: the longest sequence the cache holds.
    max_blocks_per_seq: usize,
    block_size: usize,
    /// Record CUDA graphs (false: replay runs the forward eagerly on the buffers).
    capture: bool,
    replays: HashMap<usize, Replay>,
    /// Sizes whose capture failed.
    failed: HashSet<usize>,
}

/// One size's buffers, and its graph once captured.
struct Replay {
    input_ids: Tensor,
    positions: Tensor,
    logits_rows: Tensor,
    /// One per KV group.
    attention: Vec<AttentionMetadata>,
    /// f32 `[size, vocab]`: every replay writes its logits here.
    logits: Tensor,
    graph: Option<Graph>,
}

impl DecodeGraphs {
    /// Graphs of decode steps of up to `max_batch` sequences (rounded up to a capture size,
    /// at most 128) of up to `max_context` tokens each, for `model` over `cache`.
    pub(crate) fn new(
        model: &Model,
        cache: &KvCache,
        max_batch: usize,
        max_context: usize,
        capture: bool,
    ) -> Self {
        let limit = CAPTURE_SIZES.iter().copied().find(|&s| s >= max_batch).unwrap_or(CAPTURE_SIZES[7]);
        let block_size = cache.block_size();
        let longest = max_context.min(model.config().max_position_embeddings).div_ceil(block_size);
        let longest = longest.min(cache.num_blocks());
        Self {
            max_batch,
            max_context,
            sizes: CAPTURE_SIZES.iter().copied().filter(|&s| s <= limit).collect(),
            max_blocks_per_seq: longest.max(1),
            block_size,
            capture,
            replays: HashMap::new(),
            failed: HashSet::new(),
        }
    }

    /// The size a step of `flat` replays at, if it is a decode step that fits one.
    fn size_for(&self, flat: &FlatBatch<'_>) -> Option<usize> {
        let n = flat.context_lens.len();
        let decode_only = flat.input_ids.len() == n
            && flat.logits_rows.iter().copied().eq(0..n as u32)
            && flat.pooled_rows.is_empty()
            && !flat.lora.is_active()
            && flat.tables.iter().flat_map(|t| t.iter()).all(|t| t.len() <= self.max_blocks_per_seq);
        let size = self.sizes.iter().copied().find(|&s| s >= n)?;
        (decode_only && n > 0 && !self.failed.contains(&size)).then_some(size)
    }

    /// The logits `[n, vocab]` of a decode step of `n` sequences, replayed; `None` when the
    /// step is not one this replays (the caller runs it eagerly).
    pub(crate) fn forward(
        &mut self,
        model: &Model,
        cache: &KvCache,
        device: &Device,
        flat: &FlatBatch<'_>,
    ) -> Result<Option<Tensor>> {
        let Some(size) = self.size_for(flat) else {
            return Ok(None);
        };
        if !self.replays.contains_key(&size) {
            match self.prepare(size, model, cache, device) {
                Ok(replay) => {
                    self.replays.insert(size, replay);
                }
                Err(e) => {
                    tracing::warn!("decode steps of {size} sequences run without a CUDA graph: {e}");
                    self.failed.insert(size);
                    return Ok(None);
                }
            }
        }
        let replay = self.replays.get_mut(&size).expect("prepared above");
        replay.write(flat, self.max_blocks_per_seq)?;
        replay.run(model, cache, device)?;
        Ok(Some(replay.logits.narrow(0, 0, flat.context_lens.len())?))
    }

    /// Graphs with these settings over another cache (none captured yet).
    pub(crate) fn for_cache(&self, model: &Model, cache: &KvCache) -> Self {
        Self::new(model, cache, self.max_batch, self.max_context, self.capture)
    }

    /// The sizes captured so far (or prepared, without capture).
    pub(crate) fn prepared_sizes(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> = self.replays.keys().copied().collect();
        sizes.sort_unstable();
        sizes
    }

    /// Makes size `size`'s buffers, runs it once eagerly and captures it.
    fn prepare(&self, size: usize, model: &Model, cache: &KvCache, device: &Device) -> Result<Replay> {
        let attention = (0..cache.layout().num_groups())
            .map(|_| AttentionMetadata::for_replay(size, self.max_blocks_per_seq, self.block_size, device))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut replay = Replay {
            input_ids: Tensor::zeros(size, DType::U32, device)?,
            positions: Tensor::zeros(size, DType::U32, device)?,
            logits_rows: Tensor::arange(0u32, size as u32, device)?,
            attention,
            logits: Tensor::zeros((size, model.config().vocab_size), DType::F32, device)?,
            graph: None,
        };
        // Candle uploads the shapes and strides of its strided ops from host memory at each
        // call, which a graph would replay from freed host memory: from the warm-up run to the
        // end of the capture, it keeps each upload in device memory and reuses it instead.
        let _uploads_cached = uploads_cached(device);
        // The padding rows write no KV (PADDING_SLOT), so this run leaves the cache as it was.
        replay.forward_into_logits(model, cache)?;
        if self.capture {
            replay.graph = Some(Graph::capture(device, || replay.forward_into_logits(model, cache))?);
        }
        Ok(replay)
    }
}

impl Replay {
    /// Writes `flat`'s decodes into the buffers, padding the rows past them.
    fn write(&mut self, flat: &FlatBatch<'_>, width: usize) -> Result<()> {
        let size = self.input_ids.dim(0)?;
        let n = flat.context_lens.len();
        let padded = |real: &[u32], pad: u32| -> Vec<u32> {
            real.iter().copied().chain(std::iter::repeat_n(pad, size - n)).collect()
        };
        write_u32_in_place(&self.input_ids, &padded(&flat.input_ids, 0))?;
        write_u32_in_place(&self.positions, &padded(&flat.positions, 0))?;
        for (g, meta) in self.attention.iter_mut().enumerate() {
            let mut block_tables = vec![0u32; size * width];
            for (row, tables) in block_tables.chunks_mut(width).zip(&flat.tables) {
                row[..tables[g].len()].copy_from_slice(&tables[g]);
            }
            meta.write_replay(HostAttentionMetadata {
                slot_mapping: padded(&flat.slot_mappings[g], PADDING_SLOT),
                cu_seqlens_q: (0..=size as u32).collect(),
                context_lens: padded(&flat.context_lens, 1),
                block_tables,
                max_blocks_per_seq: width,
            })?;
        }
        Ok(())
    }

    /// Runs the step on the buffers: the graph, or the forward pass when there is none.
    fn run(&mut self, model: &Model, cache: &KvCache, device: &Device) -> Result<()> {
        match &self.graph {
            Some(graph) => graph.launch(device),
            None => self.forward_into_logits(model, cache),
        }
    }

    /// The forward pass over the buffers, its logits copied into `self.logits`.
    fn forward_into_logits(&self, model: &Model, cache: &KvCache) -> Result<()> {
        let input = ForwardInput {
            input_ids: &self.input_ids,
            positions: &self.positions,
            attention: &self.attention,
            logits_rows: Some(&self.logits_rows),
            num_layers: None,
            hidden_rows: None,
            lora: None,
            placeholders: None,
        };
        let (logits, _) = model.forward_parts(&input, cache)?;
        self.logits.slice_set(&logits, 0, 0)?;
        Ok(())
    }
}

/// Candle's cache of host-to-device uploads, on while the guard lives (its type is not exported).
#[cfg(feature = "cuda")]
fn uploads_cached(device: &Device) -> Option<impl Sized> {
    match device {
        Device::Cuda(dev) => Some(dev.enable_cuda_graph_htod_cache()),
        _ => None,
    }
}

#[cfg(not(feature = "cuda"))]
fn uploads_cached(_device: &Device) -> Option<impl Sized> {
    None::<()>
}

/// A captured CUDA graph (never made on the CPU).
struct Graph {
    #[cfg(feature = "cuda")]
    graph: candle_core::cuda_backend::cudarc::driver::CudaGraph,
}

// SAFETY: a graph is only used by the runner that owns it, one call at a time; moving it to
// another thread (the engine's) is what the CUDA driver allows for graph objects.
unsafe impl Send for Graph {}

impl Graph {
    /// Records what `record` enqueues on `device`'s stream, without running it.
    #[cfg(feature = "cuda")]
    fn capture(device: &Device, record: impl FnOnce() -> Result<()>) -> Result<Self> {
        use candle_core::cuda_backend::cudarc::driver::sys;
        use candle_core::cuda_backend::WrapErr;
        let Device::Cuda(dev) = device else {
            return Err(crate::error::ModelError::Graph("a capture needs a CUDA device".into()));
        };
        let stream = dev.cuda_stream();
        stream.synchronize().w()?;
        // Thread-local: other threads' CUDA calls neither join nor break this capture.
        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).w()?;
        let recorded = record();
        // The capture ends whatever happened, so the stream is usable again.
        let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0)).w();
        recorded?;
        let graph =
            ended?.ok_or_else(|| crate::error::ModelError::Graph("the capture recorded nothing".into()))?;
        graph.upload().w()?;
        Ok(Self { graph })
    }

    #[cfg(not(feature = "cuda"))]
    fn capture(_device: &Device, _record: impl FnOnce() -> Result<()>) -> Result<Self> {
        Err(crate::error::ModelError::Graph("built without CUDA".into()))
    }

    #[cfg(feature = "cuda")]
    fn launch(&self, _device: &Device) -> Result<()> {
        use candle_core::cuda_backend::WrapErr;
        Ok(self.graph.launch().w()?)
    }

    #[cfg(not(feature = "cuda"))]
    fn launch(&self, _device: &Device) -> Result<()> {
        Err(crate::error::ModelError::Graph("built without CUDA".into()))
    }
}
