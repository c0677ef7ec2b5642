//! Block hashes of prompts with images: a block holding an image's placeholder is keyed by the
//! image's hash too (and every block after it, through the chain), so equal tokens with other
//! images never hit the prefix cache, and the same image does.

use std::sync::Arc;

use super::*;
use crate::multimodal::{ImageHash, ImageInput, PixelTensor};

fn with_image(id: u64, tokens: Vec<u32>, hash: u128, positions: std::ops::Range<u32>) -> Sequence {
    let mut s = Sequence::new(id, id, 0, tokens, 0);
    let pixels = Arc::new(PixelTensor { shape: vec![1], data: vec![0.0] });
    let image = ImageInput { hash: ImageHash(hash), pixels, placeholder_positions: positions.collect() };
    s.images = Some(Arc::from(vec![image]));
    s
}

fn hashes(bm: &BlockManager, s: &mut Sequence) -> Vec<u64> {
    bm.extend_hashes(s, s.len() / bm.block_size());
    s.block_hashes.clone()
}

#[test]
fn blocks_holding_placeholders_are_keyed_by_the_image() {
    let bm = BlockManager::new(16, 4, true);
    let tokens: Vec<u32> = (0..16).collect();
    // The image fills positions 5..7: block 1 holds it, blocks 2 and 3 chain from it.
    let a = hashes(&bm, &mut with_image(1, tokens.clone(), 0xA, 5..7));
    let a_again = hashes(&bm, &mut with_image(2, tokens.clone(), 0xA, 5..7));
    let b = hashes(&bm, &mut with_image(3, tokens.clone(), 0xB, 5..7));
    let text = hashes(&bm, &mut Sequence::new(4, 4, 0, tokens.clone(), 0));
    assert_eq!(a, a_again, "the same image, the same hashes");
    assert_eq!(a[0], b[0], "the block before the image does not depend on it");
    assert_eq!(a[0], text[0]);
    for j in 1..4 {
        assert_ne!(a[j], b[j], "block {j}: another image");
        assert_ne!(a[j], text[j], "block {j}: no image");
    }
    // Only blocks holding a placeholder mix the image in: one that ends before it does not.
    let later = hashes(&bm, &mut with_image(5, tokens, 0xA, 12..14));
    assert_eq!(later[..3], text[..3]);
    assert_ne!(later[3], text[3]);
}

#[test]
fn a_prompt_with_another_image_misses_where_the_image_starts() {
    let mut bm = BlockManager::new(32, 4, true);
    let tokens: Vec<u32> = (0..17).collect();
    let mut copies = Vec::new();
    for (id, hash, cached) in [(1, 0xA, 0), (2, 0xA, 16), (3, 0xB, 4)] {
        let mut s = with_image(id, tokens.clone(), hash, 5..7);
        let plan = bm.plan_admission(&mut s, 16);
        assert_eq!(plan.num_cached_tokens, cached, "request {id}");
        let q = s.len() - plan.num_cached_tokens;
        bm.admit(&mut s, plan, q, &mut copies).unwrap();
        s.num_computed_tokens = s.len();
        bm.commit_computed(&mut s);
        bm.free(&mut s);
    }
}
