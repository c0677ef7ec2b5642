//! The executor's two [`Proposer`]s on the tiny random-weight Llama (tests/fixtures/tiny): each
//! drafts exactly as many tokens as a sequence asks for and its block tables and positions have
//! room for, never more, and nothing for a sequence that drew no token or asks for none.

use std::borrow::Cow;

use candle_core::DType;
use pagoda_engine::BlockTableUpdate;

use super::*;
use crate::loader::{load_model, LoadOptions};

const BLOCK_SIZE: usize = 4;
const NUM_BLOCKS: usize = 32;

fn tiny() -> (Model, KvCache) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/llama");
    let model = load_model(&dir, &LoadOptions::default()).unwrap().model;
    let cache = KvCache::new(model.config(), NUM_BLOCKS, BLOCK_SIZE, DType::F32, &Device::Cpu).unwrap();
    (model, cache)
}

/// Sequence `id`'s block tables: `blocks` blocks from `first` on.
fn tables(specs: &[(SeqId, u32, u32)]) -> BlockTableStore {
    let mut tables = BlockTableStore::new();
    for &(id, first, blocks) in specs {
        tables.update(id, &BlockTableUpdate::replace(vec![(first..first + blocks).collect()])).unwrap();
    }
    tables
}

fn seq(id: SeqId, tokens: Vec<u32>, start_pos: usize, drawn: bool, max_tokens: usize) -> ProposeSeq<'static> {
    ProposeSeq { tokens: Cow::Owned(tokens), start_pos, drawn, max_tokens, seq_id: Some(id), grammar: None }
}

/// A step's sequences: one that asks for 3 with room for 12, one that asks for 6 with room for
/// 2 (8 slots, drawn token at 6), a prefill chunk, and one that drew a token but asks for none.
fn step() -> (BlockTableStore, Vec<ProposeSeq<'static>>) {
    let tables = tables(&[(1, 0, 4), (2, 4, 2), (3, 8, 2), (4, 12, 2)]);
    let seqs = vec![
        seq(1, vec![5, 17, 42, 8, 99], 0, true, 3),
        seq(2, vec![7, 7, 300, 12], 3, true, 6),
        seq(3, vec![1, 2, 3, 4, 5], 0, false, 0),
        seq(4, vec![60, 61], 2, true, 0),
    ];
    (tables, seqs)
}

fn check(drafter: &dyn Proposer<Error = ExecutorError>, seqs: &mut [ProposeSeq<'_>], vocab: usize) {
    let asked: Vec<usize> = seqs.iter().map(|s| s.max_tokens).collect();
    let mut out = vec![Vec::new(); seqs.len()];
    drafter.propose(seqs, &mut out).unwrap();
    let lens: Vec<usize> = out.iter().map(Vec::len).collect();
    assert_eq!(lens, [3, 2, 0, 0], "as asked, cut to the block tables' room");
    assert!(lens.iter().zip(&asked).all(|(got, asked)| got <= asked), "{lens:?} within {asked:?}");
    assert!(out.iter().flatten().all(|&t| (t as usize) < vocab));
    assert_eq!(drafter.kind(), ProposerKind::Executor);
}

#[test]
fn the_self_drafter_proposes_within_its_limits() {
    let (model, cache) = tiny();
    let (tables, mut seqs) = step();
    let vocab = model.config().vocab_size;
    let drafter = SelfDrafter::new(&model, &cache, &tables, &Device::Cpu, 1);
    check(&drafter, &mut seqs, vocab);
}

#[test]
fn the_draft_model_drafter_proposes_within_its_limits() {
    let (draft, cache) = tiny();
    let vocab = draft.config().vocab_size;
    let draft = DraftModel::new(draft, cache);
    let (tables, mut seqs) = step();
    let drafter = ModelDrafter::new(&draft, &tables, &Device::Cpu);
    check(&drafter, &mut seqs, vocab);
}

#[test]
fn proposals_from_the_scheduler_side_have_no_tables_and_get_nothing() {
    let (model, cache) = tiny();
    let tables = BlockTableStore::new();
    let drafter = SelfDrafter::new(&model, &cache, &tables, &Device::Cpu, 1);
    let tokens = [5, 6, 7];
    let mut out = vec![Vec::new()];
    drafter.propose(&mut [ProposeSeq::whole(&tokens, 3)], &mut out).unwrap();
    assert!(out[0].is_empty());
}
