//! Prefill/decode disaggregation, the engine's share: a prefill instance *holds* the KV blocks of
//! a finished prompt under a transfer key until a decode instance reads them, and a decode
//! instance *imports* pages it received into its prefix cache, where the request's admission
//! then finds them as an ordinary cache hit. Moving the bytes between machines is not the
//! engine's business (the server's transport does it); the engine only pins, reads and writes
//! pages, through the executor ([`crate::ModelExecutor::read_kv_pages`]).
//!
//! Pages travel block-major: block after block, and within one block every layer's K page then
//! its V page, as the executor stores them (`[block_size, num_kv_heads, head_dim]` each).

use std::time::{Duration, Instant};

/// The largest magnitude a received K or V value may have: f16's largest finite value. Keys
/// and values of a real prompt stay far below it, while an attention score over a larger one
/// can overflow to infinity even in f32 and make the logits of every request that hits the
/// cached block NaN.
pub const MAX_KV_MAGNITUDE: f32 = 65504.0;

/// The shape of one KV page as an executor stores it. Two instances can exchange pages only
/// when their layouts are equal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPageLayout {
    /// The element type's name (`bf16`, `f16`, `f32`, `f8e4m3`).
    pub dtype: String,
    pub element_bytes: usize,
    pub num_layers: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// An FP8 cache's K and V scales, one pair per layer, as f32 bit patterns (compared
    /// exactly: the same codes under other scales are other values); empty for a float cache.
    pub scales: Vec<[u32; 2]>,
}

impl KvPageLayout {
    /// Bytes of one block: K and V of every layer.
    pub fn block_bytes(&self) -> usize {
        2 * self.num_layers * self.layer_page_bytes()
    }

    /// [`Self::block_bytes`] for a layout that came from elsewhere: `None` on overflow.
    pub fn checked_block_bytes(&self) -> Option<usize> {
        [self.num_kv_heads, self.head_dim, self.element_bytes, self.num_layers, 2]
            .into_iter()
            .try_fold(self.block_size, usize::checked_mul)
    }

    /// Bytes of one layer's K (or V) page of one block.
    pub fn layer_page_bytes(&self) -> usize {
        self.block_size * self.num_kv_heads * self.head_dim * self.element_bytes
    }

    /// Why `pages` (received from another instance) must not enter the prefix cache, if they
    /// must not: a value that is NaN, infinite or beyond [`MAX_KV_MAGNITUDE`] (for an FP8 cache,
    /// a NaN code: e4m3 has no infinities and its largest code is 448 times the scale, which
    /// both instances share), or an element type whose values this check cannot read. Values
    /// are little-endian, as executors write them.
    pub fn check_values(&self, pages: &[u8]) -> Result<(), String> {
        let in_range = |v: f32| v.abs() <= MAX_KV_MAGNITUDE;
        let first_bad = match (self.dtype.as_str(), self.element_bytes) {
            ("f32", 4) => {
                pages.chunks_exact(4).position(|w| !in_range(f32::from_le_bytes([w[0], w[1], w[2], w[3]])))
            }
            ("bf16", 2) => pages
                .chunks_exact(2)
                .position(|w| !in_range(f32::from_bits(u32::from(u16::from_le_bytes([w[0], w[1]])) << 16))),
            // Every finite f16 is within the bound; all-ones exponent bits are infinity or NaN.
            ("f16", 2) => {
                pages.chunks_exact(2).position(|w| u16::from_le_bytes([w[0], w[1]]) & 0x7c00 == 0x7c00)
            }
            ("f8e4m3", 1) => pages.iter().position(|&code| code & 0x7f == 0x7f),
            (dtype, bytes) => {
                return Err(format!("values of {bytes}-byte {dtype:?} KV pages cannot be checked"))
            }
        };
        match first_bad {
            None => Ok(()),
            Some(at) => Err(format!(
                "KV value {at} of the received pages is NaN, infinite or beyond ±{MAX_KV_MAGNITUDE}"
            )),
        }
    }
}

/// The KV of a prompt's leading full blocks: `token_ids` (a whole number of blocks) and their
/// pages, block-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPrefix {
    pub layout: KvPageLayout,
    pub token_ids: Vec<u32>,
    pub pages: Vec<u8>,
}

impl KvPrefix {
    /// Number of whole blocks it holds.
    pub fn num_blocks(&self) -> usize {
        self.token_ids.len() / self.layout.block_size.max(1)
    }

    /// Why it cannot be imported as it is, if it cannot: the pages must cover the tokens
    /// exactly, in whole blocks.
    pub fn check(&self) -> Result<(), String> {
        let bs = self.layout.block_size.max(1);
        if !self.token_ids.len().is_multiple_of(bs) {
            return Err(format!("{} token ids are not whole blocks of {bs}", self.token_ids.len()));
        }
        let want = self.layout.checked_block_bytes().and_then(|b| b.checked_mul(self.num_blocks()));
        if want != Some(self.pages.len()) {
            let want = want.map_or("more than memory holds".to_owned(), |w| w.to_string());
            return Err(format!(
                "{} bytes of pages for {} blocks, expected {want}",
                self.pages.len(),
                self.num_blocks()
            ));
        }
        Ok(())
    }

    /// Keeps the first `blocks` blocks only (of a prefix that passed [`Self::check`]).
    pub fn truncate_blocks(&mut self, blocks: usize) {
        let blocks = blocks.min(self.num_blocks());
        self.token_ids.truncate(blocks * self.layout.block_size);
        self.pages.truncate(blocks * self.layout.block_bytes());
    }
}

/// What a request asks the engine to do with its prompt's KV once it finishes: hold its full
/// blocks under `key` for a decode instance to read, for at most `timeout` (then they are
/// released, as if never held).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvHold {
    pub key: String,
    pub timeout: Duration,
}

/// What a read of a transfer key finds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeldExport {
    /// The held prefix, now released here.
    Ready(KvPrefix),
    /// Nothing yet: the prefill may still be running (or may never come).
    Pending,
    /// Nothing will come: the prefill failed, or its blocks were read or expired (the reason).
    Gone(String),
}

/// Blocks pinned for one transfer.
#[derive(Debug, Clone)]
pub(crate) struct HeldBlocks {
    /// As a one-group block table, for the audit.
    pub table: Vec<Vec<u32>>,
    pub token_ids: Vec<u32>,
    pub deadline: Instant,
    /// The hold's timeout, which also bounds how long its key is remembered once gone.
    pub timeout: Duration,
}

/// A key whose blocks will never be there, and why, until `deadline`.
#[derive(Debug, Clone)]
pub(crate) struct GoneKey {
    pub reason: &'static str,
    pub deadline: Instant,
}

/// Why the engine could not export or import a prefix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KvTransferError {
    #[error(transparent)]
    Engine(#[from] crate::EngineError),
    /// The engine refused: no transferable cache, a layout mismatch, or the executor failed.
    #[error("{0}")]
    Refused(String),
}

impl crate::EngineHandle {
    /// Reads the prompt pages held under `key` and releases them; otherwise says whether they
    /// may still come.
    pub async fn export_held(&self, key: &str) -> Result<HeldExport, KvTransferError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.transfer_command(crate::handle::Command::ExportHeld { key: key.to_owned(), reply }, answer).await
    }

    /// Writes a received prefix into the prefix cache for adapter `lora`; returns how many of
    /// its leading tokens the cache now holds (fewer when blocks ran short).
    pub async fn import_prefix(
        &self,
        prefix: KvPrefix,
        lora: Option<crate::LoraId>,
    ) -> Result<usize, KvTransferError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.transfer_command(crate::handle::Command::ImportPrefix { prefix, lora, reply }, answer).await
    }

    async fn transfer_command<T>(
        &self,
        command: crate::handle::Command,
        answer: tokio::sync::oneshot::Receiver<Result<T, String>>,
    ) -> Result<T, KvTransferError> {
        self.health()?;
        let dead = || crate::EngineError::Dead(self.inner.shared.death_reason());
        if self.inner.tx.send(command).is_err() {
            return Err(dead().into());
        }
        match answer.await {
            Ok(result) => result.map_err(KvTransferError::Refused),
            Err(_) => Err(dead().into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(dtype: &str, element_bytes: usize) -> KvPageLayout {
        KvPageLayout {
            dtype: dtype.into(),
            element_bytes,
            num_layers: 1,
            block_size: 1,
            num_kv_heads: 1,
            head_dim: 2,
            scales: Vec::new(),
        }
    }

    #[test]
    fn received_values_must_be_finite_and_in_range() {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let f32_layout = layout("f32", 4);
        assert!(f32_layout.check_values(&f32s(&[0.5, -3.0, 65504.0, -0.0])).is_ok());
        for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e30] {
            let err = f32_layout.check_values(&f32s(&[1.0, bad])).unwrap_err();
            assert!(err.contains("value 1 "), "{bad}: {err}");
        }
        let bf16 = layout("bf16", 2);
        // 1.0, then +inf, NaN and 2^127 in bf16.
        assert!(bf16.check_values(&0x3f80u16.to_le_bytes()).is_ok());
        for bad in [0x7f80u16, 0xffc0, 0x7f00] {
            assert!(bf16.check_values(&bad.to_le_bytes()).is_err(), "{bad:#x}");
        }
        let f16 = layout("f16", 2);
        assert!(f16.check_values(&0x7bffu16.to_le_bytes()).is_ok(), "65504");
        for bad in [0x7c00u16, 0xfc00, 0x7e00] {
            assert!(f16.check_values(&bad.to_le_bytes()).is_err(), "{bad:#x}");
        }
        let fp8 = layout("f8e4m3", 1);
        assert!(fp8.check_values(&[0x00, 0x7e, 0xfe, 0x38]).is_ok(), "±448 and 1.0");
        assert!(fp8.check_values(&[0x38, 0x7f]).is_err());
        assert!(fp8.check_values(&[0xff]).is_err());
        assert!(layout("fake", 8).check_values(&[0; 8]).is_err(), "unknown types are not taken on trust");
    }
}
