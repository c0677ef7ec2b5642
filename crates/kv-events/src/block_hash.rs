//! vLLM's prefix-cache block hash with `--prefix-caching-hash-algo sha256_cbor`: a full block's
//! hash is `sha256(cbor([parent, tokens, extra_keys]))`, where `parent` is the previous block's
//! 32-byte digest (for the first block, `NONE_HASH = sha256(cbor(seed))`), `tokens` the block's
//! token ids, and `extra_keys` null or an array (LoRA, cache salt). CBOR is canonical (minimal
//! heads, definite lengths). Events carry the digest's last 8 bytes read big-endian
//! (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, on by default).
//!
//! The seed is `$PYTHONHASHSEED` when the vLLM deployment sets it, else `"vllm-none-hash"`
//! (vLLM 0.29 and later); the LoRA extra key is the tagged form of vLLM 0.31 and later,
//! `("lora", name, path)`.

use ciborium::Value;
use sha2::{Digest, Sha256};

/// vLLM's seed of the first block's parent when `PYTHONHASHSEED` is unset.
pub const DEFAULT_SEED: &str = "vllm-none-hash";

/// A block's full hash, the chain's link.
pub type BlockDigest = [u8; 32];

/// What besides the tokens a block's hash covers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraKeys {
    /// The LoRA adapter's name and path, on every block of its requests.
    pub lora: Option<(String, String)>,
    /// The identifiers of the images with a placeholder in the block (vLLM's multimodal
    /// `extra_keys`, after the adapter's as vLLM orders them): our image hashes in hex. vLLM
    /// names an image by a hash of its own, so these blocks' hashes are ours alone; what they
    /// guarantee is that equal tokens with other images never share a hash.
    pub images: Vec<String>,
}

impl ExtraKeys {
    fn cbor(&self) -> Value {
        let mut keys = Vec::new();
        if let Some((name, path)) = &self.lora {
            keys.push(Value::Array(vec![
                Value::Text("lora".into()),
                Value::Text(name.clone()),
                Value::Text(path.clone()),
            ]));
        }
        keys.extend(self.images.iter().map(|id| Value::Text(id.clone())));
        if keys.is_empty() {
            Value::Null
        } else {
            Value::Array(keys)
        }
    }
}

/// Hashes blocks as vLLM does.
#[derive(Debug, Clone)]
pub struct BlockHasher {
    none_hash: BlockDigest,
}

fn sha256_cbor(value: &Value) -> BlockDigest {
    let mut bytes = Vec::with_capacity(128);
    // Writing into a Vec cannot fail, and these values are all serializable.
    ciborium::into_writer(value, &mut bytes).expect("CBOR into a Vec");
    Sha256::digest(&bytes).into()
}

impl BlockHasher {
    /// With vLLM's seed: `$PYTHONHASHSEED` as the deployment sets it, or [`DEFAULT_SEED`].
    pub fn new(seed: &str) -> Self {
        Self { none_hash: sha256_cbor(&Value::Text(seed.to_owned())) }
    }

    /// The first block's parent.
    pub fn none_hash(&self) -> &BlockDigest {
        &self.none_hash
    }

    /// The hash of a full block of `tokens` after `parent` (`None`: the first block).
    pub fn hash(&self, parent: Option<&BlockDigest>, tokens: &[u32], extra: &ExtraKeys) -> BlockDigest {
        let parent = parent.unwrap_or(&self.none_hash);
        sha256_cbor(&Value::Array(vec![
            Value::Bytes(parent.to_vec()),
            Value::Array(tokens.iter().map(|&t| Value::Integer(t.into())).collect()),
            extra.cbor(),
        ]))
    }

    /// The hashes of the full blocks of `tokens`, chained from the first.
    pub fn chain(&self, tokens: &[u32], block_size: usize, extra: &ExtraKeys) -> Vec<BlockDigest> {
        let mut out: Vec<BlockDigest> = Vec::with_capacity(tokens.len() / block_size.max(1));
        for block in tokens.chunks_exact(block_size.max(1)) {
            out.push(self.hash(out.last(), block, extra));
        }
        out
    }
}

/// The 64-bit form events carry: the digest's last 8 bytes, big-endian.
pub fn event_hash(digest: &BlockDigest) -> u64 {
    u64::from_be_bytes(digest[24..].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: &BlockDigest) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    // The vectors are vLLM's own functions' output (vLLM 0.34, `hash_block_tokens` with
    // `sha256_cbor`, `init_none_hash`), for tokens 1..=40 and blocks of 16.
    #[test]
    fn matches_vllm_for_the_default_seed() {
        let h = BlockHasher::new(DEFAULT_SEED);
        assert_eq!(hex(h.none_hash()), "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0");
        let tokens: Vec<u32> = (1..=40).collect();
        let chain = h.chain(&tokens, 16, &ExtraKeys::default());
        assert_eq!(chain.len(), 2);
        assert_eq!(hex(&chain[0]), "cd7c51bc5a8fc8643f383a2b9e01522fba7473c669e9270c7b0bf7bf7fd01682");
        assert_eq!(hex(&chain[1]), "2533ea50426b36e9e4d68296cac6bce8cf602e46957d0fe40b368b33d87bf3bf");
        assert_eq!(
            chain.iter().map(event_hash).collect::<Vec<_>>(),
            [8866452693264111234, 807986237951177663]
        );
    }

    #[test]
    fn matches_vllm_for_a_pythonhashseed() {
        let h = BlockHasher::new("0");
        assert_eq!(hex(h.none_hash()), "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e");
        let tokens: Vec<u32> = (1..=40).collect();
        let ints: Vec<u64> = h.chain(&tokens, 16, &ExtraKeys::default()).iter().map(event_hash).collect();
        assert_eq!(ints, [3236607068019569386, 2758186210834249151]);
    }

    #[test]
    fn lora_blocks_hash_apart() {
        let h = BlockHasher::new(DEFAULT_SEED);
        let tokens: Vec<u32> = (1..=32).collect();
        let lora =
            ExtraKeys { lora: Some(("my-lora".into(), "/adapters/my-lora".into())), ..ExtraKeys::default() };
        let base = h.chain(&tokens, 16, &ExtraKeys::default());
        let adapted = h.chain(&tokens, 16, &lora);
        assert_ne!(base, adapted);
        // Python's cbor2 + hashlib over vLLM 0.34's extra keys for that adapter, the reference
        // that reproduces vLLM's own vector for the same adapter with a cache salt.
        assert_eq!(
            adapted.iter().map(event_hash).collect::<Vec<_>>(),
            [17545897215080021822, 16746835161408628684]
        );
    }

    #[test]
    fn image_blocks_hash_apart_by_image_and_keep_the_adapters_key_first() {
        let h = BlockHasher::new(DEFAULT_SEED);
        let tokens: Vec<u32> = (1..=16).collect();
        let image = |id: &str| ExtraKeys { images: vec![id.into()], ..ExtraKeys::default() };
        let (a, b) = (h.chain(&tokens, 16, &image("aa")), h.chain(&tokens, 16, &image("bb")));
        assert_ne!(a, b);
        assert_ne!(a, h.chain(&tokens, 16, &ExtraKeys::default()));
        assert_eq!(a, h.chain(&tokens, 16, &image("aa")));
        // The adapter's key, then the images', as vLLM orders its extra keys.
        let both = ExtraKeys { lora: Some(("l".into(), "/l".into())), images: vec!["aa".into()] };
        let Value::Array(keys) = both.cbor() else { panic!("extra keys are an array") };
        assert!(matches!(&keys[..], [Value::Array(_), Value::Text(t)] if t == "aa"), "{keys:?}");
    }
}
