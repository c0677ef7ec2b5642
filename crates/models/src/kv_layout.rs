//! [`KvLayout`]: how a model's layers are split into KV cache groups of equal layer count, so
//! that sliding-window layers can give back the pages their windows no longer see (the engine's
//! `KvGroups`).
//!
//! Full-attention layers and windowed layers go into separate groups of `group_size` layers,
//! `group_size` being the smaller of the two counts (Gemma 3 270M: 3 global layers, 15 local
//! ones, so 1 full group and 5 windowed groups of 3); the last group of a kind is padded when the
//! count does not divide. Each group's layer `j` uses the cache's slot `j`, so one page (a block
//! id) holds `block_size` tokens of K and V for the `group_size` layers of whichever group owns
//! it. With no windowed layers there is one group holding every layer, as with a plain cache.

use pagoda_engine::KvGroups;

use crate::config::ModelConfig;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    /// Layers per group (the cache's slots per page).
    group_size: usize,
    /// Window of each group, `None` for full attention.
    windows: Vec<Option<usize>>,
    /// `(group, slot)` of each layer.
    placement: Vec<(usize, usize)>,
}

impl KvLayout {
    /// The grouping of `config`'s layers.
    pub fn for_config(config: &ModelConfig) -> Self {
        let n = config.num_layers;
        let (windowed, full): (Vec<usize>, Vec<usize>) =
            (0..n).partition(|&i| config.layer_window(i).is_some());
        if windowed.is_empty() || full.is_empty() {
            let window = windowed.first().and_then(|&i| config.layer_window(i));
            return Self {
                group_size: n,
                windows: vec![window],
                placement: (0..n).map(|i| (0, i)).collect(),
            };
        }
        let group_size = full.len().min(windowed.len());
        let mut windows = Vec::new();
        let mut placement = vec![(0, 0); n];
        for (kind, window) in [(&full, None), (&windowed, config.sliding_window)] {
            for chunk in kind.chunks(group_size) {
                for (slot, &layer) in chunk.iter().enumerate() {
                    placement[layer] = (windows.len(), slot);
                }
                windows.push(window);
            }
        }
        Self { group_size, windows, placement }
    }

    /// Layers per group: K/V slots per page.
    pub fn group_size(&self) -> usize {
        self.group_size
    }

    pub fn num_groups(&self) -> usize {
        self.windows.len()
    }

    /// The engine's view of the groups.
    pub fn kv_groups(&self) -> KvGroups {
        KvGroups::new(self.windows.clone()).expect("configs have positive windows")
    }

    /// Group of layer `layer`.
    pub fn group_of(&self, layer: usize) -> usize {
        self.placement[layer].0
    }

    /// Cache slot (position in its group) of layer `layer`.
    pub fn slot_of(&self, layer: usize) -> usize {
        self.placement[layer].1
    }

    /// Bytes of one page of `block_size` tokens at `dtype_size` bytes per element.
    pub fn page_bytes(&self, config: &ModelConfig, block_size: usize, dtype_size: usize) -> usize {
        2 * self.group_size * config.kv_size() * dtype_size * block_size
    }

    /// Bytes per token one decoding sequence of `len` tokens holds: every page of the full
    /// groups, the window's pages (plus the one being filled) of the windowed ones.
    pub fn bytes_per_token(
        &self,
        config: &ModelConfig,
        len: usize,
        block_size: usize,
        dtype_size: usize,
    ) -> f64 {
        let pages = self.kv_groups().max_pages_for_sequence(len, 0, block_size);
        (pages * self.page_bytes(config, block_size, dtype_size)) as f64 / len.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{sliding_pattern, GEMMA3_SLIDING_PATTERN};

    fn config(layers: usize, sliding: Vec<bool>) -> ModelConfig {
        let mut c = crate::kv_cache::tests::config();
        c.num_layers = layers;
        c.sliding_window = Some(512);
        c.sliding_layers = sliding;
        c
    }

    #[test]
    fn gemma3_splits_into_one_full_and_five_windowed_groups() {
        let c = config(18, sliding_pattern(18, GEMMA3_SLIDING_PATTERN));
        let l = KvLayout::for_config(&c);
        assert_eq!(l.group_size(), 3);
        assert_eq!(l.kv_groups().windows(), &[None, Some(512), Some(512), Some(512), Some(512), Some(512)]);
        // Global layers 5, 11, 17 are group 0's slots 0..3; locals 0..5 fill groups 1 and 2.
        assert_eq!((l.group_of(5), l.slot_of(5)), (0, 0));
        assert_eq!((l.group_of(17), l.slot_of(17)), (0, 2));
        assert_eq!((l.group_of(0), l.slot_of(0)), (1, 0));
        assert_eq!((l.group_of(3), l.slot_of(3)), (2, 0));
        assert_eq!((l.group_of(16), l.slot_of(16)), (5, 2));
    }

    #[test]
    fn one_group_without_mixed_layers_and_padding_otherwise() {
        let plain = KvLayout::for_config(&config(4, vec![false; 4]));
        assert_eq!((plain.group_size(), plain.kv_groups()), (4, KvGroups::single()));
        assert_eq!((plain.group_of(3), plain.slot_of(3)), (0, 3));
        let mistral = KvLayout::for_config(&config(4, vec![true; 4]));
        assert_eq!(mistral.kv_groups().windows(), &[Some(512)]);
        // 2 full, 5 windowed: groups of 2, the last windowed one padded.
        let odd = KvLayout::for_config(&config(7, vec![true, false, true, true, false, true, true]));
        assert_eq!(odd.group_size(), 2);
        assert_eq!(odd.kv_groups().windows(), &[None, Some(512), Some(512), Some(512)]);
        assert_eq!((odd.group_of(6), odd.slot_of(6)), (3, 0));
    }
}
