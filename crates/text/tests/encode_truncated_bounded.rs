//! Cutting a long text to a token limit by tokenizing a prefix gives the ids of tokenizing the
//! whole text and cutting it, on ordinary texts of every kind and at every limit; and a count
//! without a limit never overflows.

mod common;

use pagoda_text::Tokenizer;

fn texts() -> Vec<String> {
    let prose = "The quick brown fox jumps over the lazy dog; it's 3.14159 o'clock, isn't it? ";
    let code = "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{:?}\", x);\n}\n\n";
    let mixed = "Ünïcödé — 日本語のテキスト、中文文本 and emoji 🦀🚀 mixed\twith\ttabs  and   runs.\n";
    vec![
        prose.repeat(400),
        code.repeat(300),
        mixed.repeat(300),
        "word ".repeat(5000),
        "a".repeat(20_000),
        format!("{}<|im_end|> after a special token {}", prose.repeat(50), prose.repeat(50)),
        "x".repeat(10),
        String::new(),
    ]
}

fn whole_then_cut(tok: &Tokenizer, text: &str, max_len: usize) -> (Vec<u32>, bool) {
    tok.encode_truncated(text, max_len).unwrap()
}

#[test]
fn a_prefix_gives_the_ids_of_the_whole_text_cut() {
    let tok = common::smollm2();
    for text in texts() {
        for max_len in [1, 7, 64, 256, 512, 2048] {
            let expected = whole_then_cut(&tok, &text, max_len);
            let bounded = tok.encode_truncated_bounded(&text, max_len).unwrap();
            assert_eq!(bounded, expected, "max_len {max_len}, text {:?}...", &text[..text.len().min(40)]);
        }
    }
}

#[test]
fn a_count_without_a_limit_counts_long_texts() {
    let tok = common::smollm2();
    // Longer than one counting piece (16 KiB), as a count_tokens prompt of ~3,000 tokens is.
    let text = "lorem ipsum dolor sit amet ".repeat(1000);
    let whole = tok.encode(&text, true).unwrap();
    assert_eq!(tok.encode_bounded(&text, true, usize::MAX).unwrap(), whole);
}
