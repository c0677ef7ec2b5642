//! `pagoda-text`: tokenizers (GGUF metadata or tokenizer.json), incremental detokenizing, chat templates, stop strings.
