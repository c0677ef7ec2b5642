//! vLLM's `KVEventBatch` in msgpack, as vLLM 0.24 and later write it (msgspec): the batch is an
//! array `[ts, events, data_parallel_rank]`; each event a map tagged by `"type"` with its fields
//! in declaration order, those without a default always present (nil when unset), those with a
//! default (`group_idx`, `kv_cache_spec_kind`, ...) present only when set.

use rmp::encode::{
    write_array_len, write_f64, write_map_len, write_nil, write_str, write_uint, ValueWriteError,
};

use crate::hashes::HashedEvent;

/// What a KV group's blocks are, for `kv_cache_spec_kind`: full attention, or a sliding window
/// of so many tokens.
pub type GroupWindows = [Option<usize>];

type Out = Vec<u8>;

fn uint(out: &mut Out, v: u64) {
    // Writing into a Vec cannot fail.
    let _ = write_uint(out, v);
}

fn text(out: &mut Out, s: &str) {
    let _ = write_str(out, s);
}

fn key(out: &mut Out, k: &str) {
    text(out, k);
}

fn uints(out: &mut Out, values: impl ExactSizeIterator<Item = u64>) -> Result<(), ValueWriteError> {
    write_array_len(out, values.len() as u32)?;
    for v in values {
        uint(out, v);
    }
    Ok(())
}

fn opt_uint(out: &mut Out, v: Option<u64>) {
    match v {
        Some(v) => uint(out, v),
        None => {
            let _ = write_nil(out);
        }
    }
}

fn event(out: &mut Out, e: &HashedEvent, windows: &GroupWindows) -> Result<(), ValueWriteError> {
    match e {
        HashedEvent::Stored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id,
            lora_name,
            group_idx,
            medium,
        } => {
            let window = windows.get(*group_idx).copied().flatten();
            // msgspec heads this map with map16 whatever its length (the struct declares more
            // fields than a fixmap holds); any decoder reads either.
            out.push(0xde);
            out.extend_from_slice(&(if window.is_some() { 11u16 } else { 10 }).to_be_bytes());
            key(out, "type");
            text(out, "BlockStored");
            key(out, "block_hashes");
            uints(out, block_hashes.iter().copied())?;
            key(out, "parent_block_hash");
            opt_uint(out, *parent_block_hash);
            key(out, "token_ids");
            uints(out, token_ids.iter().map(|&t| u64::from(t)))?;
            key(out, "block_size");
            uint(out, *block_size as u64);
            key(out, "lora_id");
            opt_uint(out, lora_id.map(u64::from));
            key(out, "medium");
            text(out, medium);
            key(out, "lora_name");
            match lora_name {
                Some(name) => text(out, name),
                None => {
                    let _ = write_nil(out);
                }
            }
            key(out, "group_idx");
            uint(out, *group_idx as u64);
            key(out, "kv_cache_spec_kind");
            text(out, if window.is_some() { "sliding_window" } else { "full_attention" });
            if let Some(w) = window {
                key(out, "kv_cache_spec_sliding_window");
                uint(out, w as u64);
            }
        }
        HashedEvent::Removed { block_hashes, group_idx, medium } => {
            write_map_len(out, 4)?;
            key(out, "type");
            text(out, "BlockRemoved");
            key(out, "block_hashes");
            uints(out, block_hashes.iter().copied())?;
            key(out, "medium");
            text(out, medium);
            key(out, "group_idx");
            uint(out, *group_idx as u64);
        }
        HashedEvent::Cleared => {
            write_map_len(out, 1)?;
            key(out, "type");
            text(out, "AllBlocksCleared");
        }
    }
    Ok(())
}

/// One batch's payload (the third frame of its message).
pub fn encode_batch(ts: f64, events: &[HashedEvent], windows: &GroupWindows) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 96);
    let written = (|| -> Result<(), ValueWriteError> {
        write_array_len(&mut out, 3)?;
        write_f64(&mut out, ts)?;
        write_array_len(&mut out, events.len() as u32)?;
        for e in events {
            event(&mut out, e, windows)?;
        }
        uint(&mut out, 0);
        Ok(())
    })();
    // Writing into a Vec cannot fail.
    debug_assert!(written.is_ok());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// vLLM 0.34's own classes (msgspec) encode this batch to exactly these bytes.
    #[test]
    fn matches_vllms_encoding_byte_for_byte() {
        let events = [
            HashedEvent::Stored {
                block_hashes: vec![8866452693264111234, 807986237951177663],
                parent_block_hash: None,
                token_ids: (1..=32).collect(),
                block_size: 16,
                lora_id: None,
                lora_name: None,
                group_idx: 0,
                medium: "GPU",
            },
            HashedEvent::Removed { block_hashes: vec![807986237951177663], group_idx: 0, medium: "GPU" },
            HashedEvent::Cleared,
        ];
        let want = "93cb41d954fc4020000093de000aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf7b0bf7bf7fd01682cf0b368b33d87bf3bfb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00200102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf0b368b33d87bf3bfa66d656469756da3475055a967726f75705f6964780081a474797065b0416c6c426c6f636b73436c656172656400";
        assert_eq!(hex(&encode_batch(1700000000.5, &events, &[None])), want);
    }
}
