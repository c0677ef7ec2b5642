//! A deterministic fake model ([`FakeExecutor`]) and decoder ([`FakeDecoder`]) for tests and
//! benchmarks of everything above the executor boundary.
//!
//! The fake is a pure function of a sequence's full token history, and it reads that history
//! back from its own fake KV store: every computed token is written to its slot through the
//! block table (after the step's block copies), and the context is read back through the block
//! table, checking each slot holds the expected position. A wrong block table, a bad prefix-cache
//! hit or a missing copy-on-write therefore shows up as a different output or an error, just as
//! it would with a real model.
//!
//! With KV groups ([`FakeExecutor::with_groups`]) every token is written through each group's
//! table, and each windowed group's keys are read back for the window of every scheduled
//! sequence's first query, so a block released too early, or a page two groups share, shows up
//! too. The output comes from the first full group's history; with windowed groups only, from the
//! last query's window (a model that sees nothing else).
//!
//! Images ([`ScheduledBatch::images`]) stand in for an encoder: a placeholder position of an
//! image is written with a value made from the image's hash and the feature row instead of its
//! token, so outputs depend on the image, and a prefix-cache hit on another image's blocks, or a
//! chunk missing its image, shows up as a different output.

use pagoda_text::TokenDecoder;

use crate::block_tables::BlockTableStore;
use crate::executor::{
    ExecutorDraft, ExecutorError, ModelExecutor, PooledOutput, PromptLogprobsOutput, SampledToken,
    ScheduledBatch, ScheduledSeq, StepOutput,
};
use crate::kv_groups::{KvGroups, NULL_BLOCK};
use crate::multimodal::ImageHash;
use crate::rng::{combine, mix64};
use crate::sampler::Sampler;
use crate::speculative::{verify, DraftChain};

/// One KV slot: the token written there and its position, `EMPTY` until written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    token: u32,
    pos: u32,
    group: u32,
}

const EMPTY: Slot = Slot { token: u32::MAX, pos: u32::MAX, group: u32::MAX };

/// The group mark of a slot a drafting pass wrote (see [`FakeExecutor::propose`]).
const DRAFTED: u32 = u32::MAX - 1;

/// See the module docs.
#[derive(Debug)]
pub struct FakeExecutor {
    block_size: usize,
    num_blocks: usize,
    vocab_size: usize,
    groups: KvGroups,
    kv: Vec<Slot>,
    /// Every running sequence's block tables, kept up to date from each batch.
    tables: BlockTableStore,
    sampler: Sampler,
    history: Vec<u32>,
    steps: u64,
    tokens_computed: u64,
}

impl FakeExecutor {
    pub fn new(block_size: usize, num_blocks: usize, vocab_size: usize) -> Self {
        Self::with_groups(block_size, num_blocks, vocab_size, KvGroups::single())
    }

    /// A fake whose layers form `groups` (see the module docs).
    pub fn with_groups(block_size: usize, num_blocks: usize, vocab_size: usize, groups: KvGroups) -> Self {
        Self {
            block_size,
            num_blocks,
            vocab_size: vocab_size.max(1),
            groups,
            kv: vec![EMPTY; block_size * num_blocks],
            tables: BlockTableStore::new(),
            sampler: Sampler::new(),
            history: Vec::new(),
            steps: 0,
            tokens_computed: 0,
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Steps executed so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The block tables as this executor holds them.
    pub fn tables(&self) -> &BlockTableStore {
        &self.tables
    }

    /// Tokens computed so far (all steps).
    pub fn tokens_computed(&self) -> u64 {
        self.tokens_computed
    }

    /// The fake model: logits in `[-4, 4)` after `history`, a pure function of it.
    pub fn logits_for(history: &[u32], vocab_size: usize, out: &mut Vec<f32>) {
        let h = history.iter().fold(combine(0xFA4E, history.len() as u64), |h, &t| combine(h, u64::from(t)));
        out.clear();
        out.extend(
            (0..vocab_size as u64).map(|i| (mix64(h ^ i) >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0),
        );
    }

    fn slot(&self, seq: &ScheduledSeq, group: usize, pos: usize) -> Result<usize, ExecutorError> {
        let tables = self.tables.get(seq.seq_id).unwrap_or_default();
        let block = *tables.get(group).and_then(|t| t.get(pos / self.block_size)).ok_or_else(|| {
            ExecutorError::InvalidBatch(format!(
                "sequence {}: no group {group} block for position {pos}",
                seq.seq_id
            ))
        })?;
        if block == NULL_BLOCK {
            return Err(ExecutorError::InvalidBatch(format!(
                "sequence {}: group {group} released the block of position {pos}",
                seq.seq_id
            )));
        }
        let block = block as usize;
        if block >= self.num_blocks {
            return Err(ExecutorError::InvalidBatch(format!(
                "sequence {}: block {block} out of range",
                seq.seq_id
            )));
        }
        Ok(block * self.block_size + pos % self.block_size)
    }

    /// A pooling sequence's "embedding": its length, token sum and a hash of its tokens, read
    /// back through its block table, so pooling a sequence whose tables or tokens went wrong
    /// gives other values.
    fn pool(&self, seq: &ScheduledSeq, group: usize) -> Result<Vec<f32>, ExecutorError> {
        if seq.start_pos != 0 {
            return Err(ExecutorError::InvalidSequence {
                seq_id: seq.seq_id,
                message: format!("pooling from position {}, not from the start", seq.start_pos),
            });
        }
        let (mut sum, mut hash) = (0f32, 0u64);
        for pos in 0..seq.context_len() {
            let token = self.read(seq, group, pos)?;
            sum += token as f32;
            hash = combine(hash, u64::from(token));
        }
        Ok(vec![seq.context_len() as f32, sum, (mix64(hash) >> 40) as f32])
    }

    /// The group the output is read from, and the window it sees: the first full group's
    /// whole history, or with windowed groups only, group 0's window (see the module docs).
    fn history_group(&self) -> (usize, Option<usize>) {
        match (0..self.groups.len()).find(|&g| self.groups.window(g).is_none()) {
            Some(g) => (g, None),
            None => (0, self.groups.window(0)),
        }
    }

    /// The token in group `group`'s slot of `pos`, checking it was written there for `pos` by
    /// that group.
    fn read(&self, seq: &ScheduledSeq, group: usize, pos: usize) -> Result<u32, ExecutorError> {
        let slot = self.kv[self.slot(seq, group, pos)?];
        if slot.pos != pos as u32 || slot.group != group as u32 {
            return Err(ExecutorError::InvalidBatch(format!(
                "sequence {}: group {group}'s KV slot for position {pos} holds group {}'s position {}",
                seq.seq_id, slot.group as i64, slot.pos as i64
            )));
        }
        Ok(slot.token)
    }
}

impl FakeExecutor {
    /// The fake's drafter, after the tokens `seq` kept this step (`kept`: accepted proposals,
    /// then the drawn token, which no step has computed yet): the model's greedy token after
    /// the history, except where a hash of the history and `salt` says to be wrong (a quarter of
    /// the time), as many times as `seq` asks for after what it accepted. Under a grammar, each draft is drawn under its
    /// position's mask, as the real drafters do.
    ///
    /// Each drafting pass writes its input's slot, as a pass of the target's first layers does:
    /// with a mark [`read`](Self::read) refuses, so a step that attends to a drafted slot it did
    /// not compute again fails, and block tables without slots for the drafts fail too.
    fn propose(&mut self, seq: &ScheduledSeq, kept: &[u32], salt: usize) -> Result<Vec<u32>, ExecutorError> {
        let Some((&drawn, accepted)) = kept.split_last() else { return Ok(Vec::new()) };
        let (group, window) = self.history_group();
        // The position of the drawn token: after the step's own tokens and accepted proposals.
        let at = seq.start_pos + seq.q_len() - seq.num_draft_tokens + accepted.len();
        let first = window.map_or(0, |w| (at + 1).saturating_sub(w));
        let mut history = (first..at).map(|pos| self.read(seq, group, pos)).collect::<Result<Vec<_>, _>>()?;
        history.push(drawn);
        let mut chain = seq.sample.as_ref().and_then(|req| DraftChain::after(req, kept));
        let mut logits = Vec::new();
        let want = seq.num_to_draft_after(accepted.len());
        let mut drafts = Vec::with_capacity(want);
        for j in 0..want {
            let pos = at + j;
            for g in 0..self.groups.len() {
                let slot = self.slot(seq, g, pos)?;
                self.kv[slot] = Slot { token: history[history.len() - 1], pos: pos as u32, group: DRAFTED };
            }
            let start = window.map_or(0, |w| history.len().saturating_sub(w));
            Self::logits_for(&history[start..], self.vocab_size, &mut logits);
            if let Some(mask) = chain.as_mut().and_then(DraftChain::next_mask) {
                mask.apply(&mut logits);
            }
            let best = (0..logits.len())
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
                .unwrap_or(0);
            let h = history.iter().fold(salt as u64, |h, &t| combine(h, u64::from(t)));
            let token = if mix64(h).is_multiple_of(4) { (best + 1) % self.vocab_size } else { best } as u32;
            history.push(token);
            drafts.push(token);
            if let Some(chain) = &mut chain {
                chain.push(token);
            }
        }
        Ok(drafts)
    }
}

/// The fake's "feature" at prompt position `pos` when an image has a placeholder there.
fn image_feature(images: &[crate::multimodal::ImageInput], pos: usize) -> Option<u32> {
    images.iter().find_map(|image| {
        let row = image.features_in(pos..pos + 1)?.start;
        let ImageHash(hash) = image.hash;
        let h = combine(combine(hash as u64, (hash >> 64) as u64), row as u64);
        Some((mix64(h) >> 33) as u32 | 0x8000_0000)
    })
}

impl ModelExecutor for FakeExecutor {
    fn execute(&mut self, batch: &ScheduledBatch) -> Result<StepOutput, ExecutorError> {
        if self.kv.is_empty() {
            return Err(ExecutorError::Execution("the fake executor is asleep".into()));
        }
        self.steps += 1;
        self.tables.apply(batch)?;
        let bs = self.block_size;
        for &(src, dst) in &batch.block_copies {
            let (src, dst) = (src as usize, dst as usize);
            if src >= self.num_blocks || dst >= self.num_blocks {
                return Err(ExecutorError::InvalidBatch(format!("block copy {src} -> {dst} out of range")));
            }
            self.kv.copy_within(src * bs..(src + 1) * bs, dst * bs);
        }
        // The fake's drafts differ by what drafts them, not by what it computes.
        let draft_salt = batch.executor_draft.map(|how| match how {
            ExecutorDraft::Layers(layers) => layers,
            ExecutorDraft::Model => usize::MAX,
        });
        // Like a real forward pass: every new token's KV is written before anything attends.
        for seq in &batch.seqs {
            let images = batch.images_of(seq.seq_id);
            for g in 0..self.groups.len() {
                for (i, &token) in seq.token_ids.iter().enumerate() {
                    let pos = seq.start_pos + i;
                    let token = images.and_then(|images| image_feature(images, pos)).unwrap_or(token);
                    let slot = self.slot(seq, g, pos)?;
                    self.kv[slot] = Slot { token, pos: pos as u32, group: g as u32 };
                }
            }
            self.tokens_computed += seq.token_ids.len() as u64;
        }
        // Windowed groups: what the first query of each sequence reads.
        for seq in &batch.seqs {
            for g in 0..self.groups.len() {
                let Some(w) = self.groups.window(g) else { continue };
                for pos in (seq.start_pos + 1).saturating_sub(w)..seq.context_len() {
                    self.read(seq, g, pos)?;
                }
            }
        }
        let (group, window) = self.history_group();
        let mut sampled = Vec::new();
        for seq in &batch.seqs {
            let Some(req) = &seq.sample else { continue };
            // Logits are needed after each of the last `num_draft_tokens + 1` positions.
            let first_end = seq.context_len() - seq.num_draft_tokens;
            let first = window.map_or(0, |w| first_end.saturating_sub(w));
            self.history.clear();
            for pos in first..seq.context_len() {
                let token = self.read(seq, group, pos)?;
                self.history.push(token);
            }
            let (history, vocab_size) = (&self.history, self.vocab_size);
            let rows = (0..=seq.num_draft_tokens).map(|i| {
                let end = first_end + i;
                let start = window.map_or(0, |w| end.saturating_sub(w));
                let mut logits = Vec::new();
                Self::logits_for(&history[start - first..end - first], vocab_size, &mut logits);
                logits
            });
            let (token_ids, logprobs) = verify(&mut self.sampler, rows, req, seq.draft_tokens())
                // As the model runner does: a row that cannot be sampled fails its sequence only.
                .map_err(|e| ExecutorError::InvalidSequence { seq_id: seq.seq_id, message: e.to_string() })?;
            let proposals = match draft_salt {
                Some(salt) if seq.num_to_draft > 0 => self.propose(seq, &token_ids, salt)?,
                _ => Vec::new(),
            };
            sampled.push(SampledToken { seq_id: seq.seq_id, token_ids, logprobs, proposals });
        }
        let mut prompt_logprobs = Vec::new();
        for seq in &batch.seqs {
            let Some(request) = &seq.prompt_logprobs else { continue };
            let mut logprobs = Vec::with_capacity(request.targets.len());
            let mut logits = Vec::new();
            for (i, &target) in request.targets.iter().enumerate() {
                let end = seq.start_pos + i + 1;
                let first = window.map_or(0, |w| end.saturating_sub(w));
                self.history.clear();
                for pos in first..end {
                    let token = self.read(seq, group, pos)?;
                    self.history.push(token);
                }
                Self::logits_for(&self.history, self.vocab_size, &mut logits);
                logprobs.push(self.sampler.token_logprobs(&logits, target, request.top));
            }
            prompt_logprobs.push(PromptLogprobsOutput { seq_id: seq.seq_id, logprobs });
        }
        let mut pooled = Vec::new();
        for seq in batch.seqs.iter().filter(|s| s.pool) {
            let values = self.pool(seq, group)?;
            pooled.push(PooledOutput { seq_id: seq.seq_id, values });
        }
        Ok(StepOutput { sampled, pooled, prompt_logprobs })
    }

    /// Drops the fake KV (both levels: the fake has no weights); waking gives empty pages back.
    fn sleep(&mut self, _level: crate::SleepLevel) -> Result<(), crate::SleepError> {
        self.kv = Vec::new();
        Ok(())
    }

    fn wake_up(&mut self) -> Result<(), crate::SleepError> {
        self.kv = vec![EMPTY; self.block_size * self.num_blocks];
        Ok(())
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn kv_groups(&self) -> KvGroups {
        self.groups.clone()
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Any number of "layers" drafts (the fake has no real ones).
    fn num_layers(&self) -> Option<usize> {
        Some(usize::MAX)
    }

    /// Drafts "with a model" too.
    fn has_draft_model(&self) -> bool {
        true
    }

    /// Its "encoder" is the stand-in of the module docs.
    fn takes_images(&self) -> bool {
        true
    }

    /// One "layer" whose K page holds each slot's token and position and whose V page its
    /// group, so an import lands exactly what the reads check.
    fn kv_page_layout(&self) -> Option<crate::KvPageLayout> {
        (self.groups.len() == 1).then(|| crate::KvPageLayout {
            dtype: "fake".into(),
            element_bytes: 8,
            num_layers: 1,
            block_size: self.block_size,
            num_kv_heads: 1,
            head_dim: 1,
            scales: Vec::new(),
        })
    }

    fn read_kv_pages(&mut self, blocks: &[u32]) -> Result<Vec<u8>, ExecutorError> {
        let bs = self.block_size;
        let mut pages = Vec::with_capacity(blocks.len() * bs * 16);
        for &b in blocks {
            let slots = self
                .kv
                .get(b as usize * bs..(b as usize + 1) * bs)
                .ok_or_else(|| ExecutorError::InvalidBatch(format!("block {b} is outside the cache")))?;
            for s in slots {
                pages.extend_from_slice(&s.token.to_le_bytes());
                pages.extend_from_slice(&s.pos.to_le_bytes());
            }
            for s in slots {
                pages.extend_from_slice(&u64::from(s.group).to_le_bytes());
            }
        }
        Ok(pages)
    }

    fn write_kv_pages(&mut self, blocks: &[u32], pages: &[u8]) -> Result<(), ExecutorError> {
        let bs = self.block_size;
        if pages.len() != blocks.len() * bs * 16 || blocks.iter().any(|&b| b as usize >= self.num_blocks) {
            return Err(ExecutorError::InvalidBatch("pages do not fit the blocks".into()));
        }
        let word = |at: usize| u32::from_le_bytes(pages[at..at + 4].try_into().unwrap_or_default());
        for (k, &b) in blocks.iter().enumerate() {
            let page = k * bs * 16;
            for i in 0..bs {
                let (kv, v) = (page + i * 8, page + bs * 8 + i * 8);
                self.kv[b as usize * bs + i] = Slot { token: word(kv), pos: word(kv + 4), group: word(v) };
            }
        }
        Ok(())
    }
}

/// Decodes id `i` to one lowercase letter (`'a' + i % 26`), twice for odd `i / 26`, so tokens
/// have different lengths and stop strings can straddle them.
#[derive(Debug, Clone, Copy, Default)]
pub struct FakeDecoder;

impl FakeDecoder {
    pub fn piece(id: u32) -> String {
        let mut s = String::new();
        Self::push_piece(&mut s, id);
        s
    }

    fn push_piece(out: &mut String, id: u32) {
        let c = char::from(b'a' + (id % 26) as u8);
        out.push(c);
        if (id / 26) % 2 == 1 {
            out.push(c);
        }
    }
}

impl TokenDecoder for FakeDecoder {
    fn decode(&self, ids: &[u32], _skip_special_tokens: bool) -> String {
        let mut out = String::with_capacity(ids.len() * 2);
        for &id in ids {
            Self::push_piece(&mut out, id);
        }
        out
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::block_tables::BlockTableUpdate;
    use crate::executor::SampleRequest;

    fn greedy() -> Option<SampleRequest> {
        Some(SampleRequest::greedy())
    }

    fn seq(id: u64, tokens: &[u32], start: usize, table: Vec<u32>) -> ScheduledSeq {
        ScheduledSeq {
            seq_id: id,
            token_ids: tokens.to_vec(),
            start_pos: start,
            block_table_update: BlockTableUpdate::replace(vec![table]),
            sample: greedy(),
            num_draft_tokens: 0,
            num_to_draft: 0,
            pool: false,
            second_segment: None,
            lora: None,
            prompt_logprobs: None,
        }
    }

    fn run(
        exec: &mut FakeExecutor,
        seqs: Vec<ScheduledSeq>,
        copies: Vec<(u32, u32)>,
    ) -> Result<Vec<u32>, ExecutorError> {
        let out = exec.execute(&ScheduledBatch { seqs, block_copies: copies, ..Default::default() })?;
        Ok(out.sampled.iter().map(|s| s.token_ids[0]).collect())
    }

    #[test]
    fn output_depends_on_the_history_read_back_through_the_block_table() {
        let mut a = FakeExecutor::new(2, 8, 16);
        let one_chunk = run(&mut a, vec![seq(1, &[3, 4, 5], 0, vec![6, 1])], vec![]).unwrap();
        // The same history computed in two chunks through other blocks gives the same token.
        let mut b = FakeExecutor::new(2, 8, 16);
        let mut first = seq(1, &[3, 4], 0, vec![2]);
        first.sample = None;
        run(&mut b, vec![first], vec![]).unwrap();
        assert_eq!(run(&mut b, vec![seq(1, &[5], 2, vec![2, 7])], vec![]).unwrap(), one_chunk);
        // A block table pointing at blocks that hold other data is caught.
        let err = run(&mut b, vec![seq(2, &[5], 2, vec![0, 3])], vec![]).unwrap_err();
        assert!(matches!(err, ExecutorError::InvalidBatch(_)), "{err}");
    }

    #[test]
    fn block_copies_apply_before_compute() {
        let mut e = FakeExecutor::new(2, 8, 16);
        let mut first = seq(1, &[3], 0, vec![0]);
        first.sample = None;
        run(&mut e, vec![first], vec![]).unwrap();
        // Block 5 receives a copy of block 0 and then the token at position 1.
        let via_copy = run(&mut e, vec![seq(2, &[4], 1, vec![5])], vec![(0, 5)]).unwrap();
        let mut fresh = FakeExecutor::new(2, 8, 16);
        assert_eq!(run(&mut fresh, vec![seq(1, &[3, 4], 0, vec![0])], vec![]).unwrap(), via_copy);
        let err = run(&mut e, vec![], vec![(0, 8)]).unwrap_err();
        assert!(matches!(err, ExecutorError::InvalidBatch(_)));
    }

    #[test]
    fn logits_are_a_pure_function_of_the_history() {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        FakeExecutor::logits_for(&[1, 2, 3], 16, &mut x);
        FakeExecutor::logits_for(&[1, 2, 3], 16, &mut y);
        assert_eq!(x, y);
        FakeExecutor::logits_for(&[1, 2, 4], 16, &mut y);
        assert_ne!(x, y);
        assert!(x.iter().all(|l| (-4.0..4.0).contains(l)));
    }

    #[test]
    fn decoder_pieces_concatenate() {
        assert_eq!(FakeDecoder.decode(&[0, 1, 27], false), "abbb");
        assert_eq!(FakeDecoder::piece(27), "bb");
    }
}
