//! Prompts with images in the scheduler, on the fake executor (whose KV at an image's
//! placeholders depends on the image, see [`crate::fake`]): chunks hand the executor the images
//! whose placeholders they cover, outputs do not depend on chunking, preemption or `n`, and the
//! prefix cache shares an image's blocks only with the same image.

use super::*;
use crate::multimodal::{ImageHash, ImageInput, ImageRequestError, PixelTensor};
use crate::request::RequestError;

const PLACEHOLDER: u32 = 31;

/// A 30-token prompt with two images: the first's placeholders at 5..9 and 10..14 (a text
/// token between its tiles), the second's at 20..24.
fn image_prompt() -> Vec<u32> {
    let mut p = prompt(30, 3);
    for pos in (5..9).chain(10..14).chain(20..24) {
        p[pos] = PLACEHOLDER;
    }
    p
}

fn image(hash: u128, positions: impl IntoIterator<Item = u32>) -> ImageInput {
    ImageInput {
        hash: ImageHash(hash),
        pixels: Arc::new(PixelTensor { shape: vec![1, 3, 1, 1], data: vec![0.5; 3] }),
        placeholder_positions: positions.into_iter().collect::<Vec<_>>().into(),
    }
}

/// Request `id` over [`image_prompt`] with images hashed `first` and `second`.
fn image_req(id: RequestId, first: u128, second: u128) -> Request {
    let mut r = req(id, image_prompt(), 6);
    r.images = vec![image(first, (5..9).chain(10..14)), image(second, 20..24)];
    r
}

fn harness(budget: usize, num_blocks: usize) -> Harness {
    let mut config = EngineConfig::new(4, num_blocks, 4 * num_blocks);
    config.max_num_batched_tokens = budget;
    config.max_num_seqs = budget.min(4);
    config.images = true;
    Harness::new(config)
}

/// Output of `r` run alone, its prompt in one step.
fn alone(r: &Request) -> Vec<Vec<u32>> {
    let mut h = harness(256, 256);
    h.add(r.clone());
    h.run();
    (0..r.n).map(|i| h.tokens(r.id, i)).collect()
}

#[test]
fn chunks_carry_the_images_whose_placeholders_they_cover() {
    let mut h = harness(8, 64);
    h.add(image_req(1, 0xA, 0xB));
    let mut carried = Vec::new();
    while h.sched.has_unfinished() {
        let batch = h.step();
        let Some(seq) = batch.seqs.first() else { continue };
        carried.push((seq.start_pos, batch.images_of(seq.seq_id).map(|i| i.len())));
    }
    // Chunks of 8: 0..8 and 8..16 cover the first image, 16..24 the second, 24..30 none, and
    // decodes none.
    assert_eq!(&carried[..4], &[(0, Some(2)), (8, Some(2)), (16, Some(2)), (24, None)]);
    assert!(carried[4..].iter().all(|&(_, images)| images.is_none()));
    assert_eq!(h.tokens(1, 0), alone(&image_req(1, 0xA, 0xB))[0]);
}

#[test]
fn outputs_follow_the_images_not_the_chunking() {
    let a = alone(&image_req(1, 0xA, 0xB));
    assert_ne!(a, alone(&image_req(1, 0xC, 0xB)), "the first image changes the output");
    assert_ne!(a, alone(&image_req(1, 0xA, 0xC)), "the second image changes the output");
    for budget in [3, 5, 7, 13] {
        let mut h = harness(budget, 64);
        h.add(image_req(1, 0xA, 0xB));
        h.run();
        assert_eq!(vec![h.tokens(1, 0)], a, "chunks of {budget}");
    }
}

#[test]
fn the_prefix_cache_shares_blocks_of_the_same_image_only() {
    let mut h = harness(256, 64);
    h.add(image_req(1, 0xA, 0xB));
    h.run();
    // The same images: every full block of the prompt comes from the cache.
    let same = image_req(2, 0xA, 0xB);
    h.add(same.clone());
    h.run();
    assert_eq!(h.usage(2).cached_prompt_tokens, 28);
    assert_eq!(h.tokens(2, 0), alone(&same)[0]);
    // Another second image with the same tokens: blocks up to the one holding its first
    // placeholder (20..24) hit, that one and everything after it do not.
    let other = image_req(3, 0xA, 0xD);
    h.add(other.clone());
    h.run();
    assert_eq!(h.usage(3).cached_prompt_tokens, 20);
    assert_eq!(h.tokens(3, 0), alone(&other)[0]);
    // Another first image: nothing from the block holding position 5 on.
    let first = image_req(4, 0xE, 0xB);
    h.add(first.clone());
    h.run();
    assert_eq!(h.usage(4).cached_prompt_tokens, 4);
    assert_eq!(h.tokens(4, 0), alone(&first)[0]);
}

#[test]
fn preemption_and_samples_keep_image_outputs() {
    // Two samples each of 30 + 30 tokens on 32 blocks of 4: two such requests cannot run to
    // the end side by side.
    let mut h = harness(16, 32);
    let requests: Vec<Request> =
        (0..3).map(|id| image_req(id, 0x10 + id as u128, 0xB).with_n(2).with_max_tokens(30)).collect();
    for r in &requests {
        h.add(r.clone());
    }
    h.run();
    assert!(h.sched.num_preemptions() > 0, "no preemption");
    for r in &requests {
        let outputs = alone(r);
        assert_eq!((0..2).map(|i| h.tokens(r.id, i)).collect::<Vec<_>>(), outputs, "request {}", r.id);
    }
    assert_eq!(h.sched.block_manager().num_free_blocks(), 32);
}

#[test]
fn images_are_refused_without_an_encoder_out_of_place_or_for_a_kv_transfer() {
    let mut h = Harness::small(4, 64);
    let err = h.sched.add_request(image_req(1, 0xA, 0xB)).unwrap_err();
    assert!(
        matches!(err, AddRequestError::Invalid(RequestError::Image(ImageRequestError::NoVisionEncoder))),
        "{err}"
    );
    let mut h = harness(64, 64);
    let mut r = image_req(2, 0xA, 0xB);
    r.images[1] = image(0xB, [20, 40]);
    let err = h.sched.add_request(r).unwrap_err();
    assert!(err.to_string().contains("position 40 is outside the prompt of 30 tokens"), "{err}");
    let mut held = image_req(3, 0xA, 0xB);
    held.kv_hold = Some(crate::KvHold { key: "k".into(), timeout: std::time::Duration::from_secs(5) });
    let err = h.sched.add_request(held).unwrap_err();
    assert!(matches!(err, AddRequestError::Invalid(RequestError::Image(ImageRequestError::KvTransfer))));
}
