//! llguidance's view of our vocabulary: a [`toktrie::TokTrie`] of every token's bytes, built from
//! [`pagoda_text::Tokenizer`] so every vocabulary Pagoda loads (GGUF or Hugging Face, byte-level
//! or sentencepiece) works, plus the tokenize callback llguidance uses to force tokens.
//!
//! Special tokens are spelled `\xff` + their text (llguidance's convention), so grammar text can
//! never produce `<|im_end|>` by spelling it; ids without a token (holes in a vocabulary) and
//! byte values a vocabulary lacks simply have no bytes, and the grammar cannot produce them.

use std::sync::Arc;

use pagoda_text::Tokenizer;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// The trie plus our tokenizer, for llguidance.
pub struct PagodaTokEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl PagodaTokEnv {
    /// Builds the trie of `tokenizer`'s vocabulary. Its end-of-sequence set is every id that
    /// ends generation for us, so a grammar allows each of them exactly where it may end.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        let vocab_size = tokenizer.vocab_size();
        let special: std::collections::HashMap<u32, String> = tokenizer
            .inner()
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, t)| (id, t.content))
            .collect();
        let words: Vec<Vec<u8>> = (0..vocab_size as u32)
            .map(|id| match special.get(&id) {
                Some(text) => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(text.as_bytes());
                    w
                }
                None => tokenizer.token_bytes(id).unwrap_or_default(),
            })
            .collect();
        let eos_ids = tokenizer.eos_token_ids();
        // A vocabulary without any end token still needs one id for llguidance; that id is then
        // only ever allowed where the grammar is complete, and the grammar ends the sample.
        let eos = tokenizer.eos_id().or_else(|| eos_ids.first().copied()).unwrap_or(0);
        let mut info = TokRxInfo::new(vocab_size as u32, eos);
        info.tok_bos = tokenizer.bos_id();
        let mut trie = TokTrie::from(&info, &words);
        if !eos_ids.is_empty() {
            trie = trie.with_eos_tokens(eos_ids);
        }
        Self { trie, tokenizer }
    }

    pub fn into_tok_env(self) -> TokEnv {
        Arc::new(self)
    }
}

impl TokenizerEnv for PagodaTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Our tokenizer takes text; bytes that are not UTF-8 fall back to the trie's greedy split.
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false).unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}
