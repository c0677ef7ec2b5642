//! SentencePiece (`tokenizer.ggml.model = "llama"`) vocabularies: a small synthetic vocabulary
//! written as a GGUF file (merge ranking, byte fallback, space prefix, token types, streaming),
//! and the real Gemma 3 vocabulary (ids checked against Hugging Face transformers' conversion of
//! the same file; the full comparison is in golden_gemma3.rs).

mod common;

use std::path::PathBuf;

use pagoda_text::{IncrementalDetokenizer, TokenDecoder, Tokenizer, TokenizerError};

/// A SentencePiece vocabulary under construction: pieces with their type and score.
struct Spm {
    tokens: Vec<String>,
    types: Vec<i32>,
    scores: Vec<f32>,
}

const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;

impl Spm {
    /// `<unk>`, `<s>`, `</s>`, the 256 byte pieces except `missing_bytes`, then single letters.
    fn new(missing_bytes: &[u8]) -> Self {
        let mut v = Spm { tokens: Vec::new(), types: Vec::new(), scores: Vec::new() };
        v.push("<unk>", UNKNOWN, 0.0);
        v.push("<s>", CONTROL, 0.0);
        v.push("</s>", CONTROL, 0.0);
        for b in (0..=255u8).filter(|b| !missing_bytes.contains(b)) {
            v.push(&format!("<0x{b:02X}>"), BYTE, 0.0);
        }
        for piece in ["▁", "a", "b", "c", "h", "i"] {
            v.push(piece, NORMAL, -100.0);
        }
        v
    }

    fn push(&mut self, token: &str, ty: i32, score: f32) -> u32 {
        self.tokens.push(token.to_owned());
        self.types.push(ty);
        self.scores.push(score);
        self.tokens.len() as u32 - 1
    }

    fn id(&self, token: &str) -> u32 {
        self.tokens.iter().position(|t| t == token).unwrap_or_else(|| panic!("{token:?}")) as u32
    }

    fn ids(&self, tokens: &[&str]) -> Vec<u32> {
        tokens.iter().map(|t| self.id(t)).collect()
    }

    /// The metadata every test file has; callers add the rest.
    fn writer(&self, arch: &str) -> common::GgufWriter {
        common::GgufWriter::new()
            .str("general.architecture", arch)
            .str("tokenizer.ggml.model", "llama")
            .strs("tokenizer.ggml.tokens", &self.tokens)
            .i32s("tokenizer.ggml.token_type", &self.types)
            .f32s("tokenizer.ggml.scores", &self.scores)
            .u32("tokenizer.ggml.bos_token_id", 1)
            .u32("tokenizer.ggml.eos_token_id", 2)
            .u32("tokenizer.ggml.unknown_token_id", 0)
    }
}

/// Writes `writer` to a fresh file, loads it, and removes the file.
fn load(name: &str, writer: common::GgufWriter) -> Result<Tokenizer, TokenizerError> {
    let path: PathBuf = common::temp_dir(name).join("model.gguf");
    writer.write(&path);
    let tok = Tokenizer::from_gguf(&path);
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    tok
}

fn no_prefix(v: &Spm, name: &str) -> Tokenizer {
    load(name, v.writer("llama").bool("tokenizer.ggml.add_space_prefix", false)).unwrap()
}

#[test]
fn merges_follow_the_merged_pieces_scores() {
    for (ab, bc, expected) in [(-1.0, -2.0, ["ab", "c"]), (-2.0, -1.0, ["a", "bc"])] {
        let mut v = Spm::new(&[]);
        v.push("ab", NORMAL, ab);
        v.push("bc", NORMAL, bc);
        let tok = no_prefix(&v, "scores");
        assert_eq!(tok.encode("abc", false).unwrap(), v.ids(&expected), "ab {ab}, bc {bc}");
        assert_eq!(tok.decode(&v.ids(&expected), false).unwrap(), "abc");
    }
}

#[test]
fn merges_build_up_through_intermediate_pieces() {
    let mut v = Spm::new(&[]);
    v.push("hi", NORMAL, -1.0);
    v.push("▁hi", NORMAL, -2.0);
    v.push("▁hiab", NORMAL, -4.0);
    v.push("ab", NORMAL, -3.0);
    let tok = load("chain", v.writer("llama")).unwrap();
    // ▁ h i a b -> ▁ hi a b -> ▁hi a b -> ▁hi ab -> ▁hiab
    assert_eq!(tok.encode("hiab", false).unwrap(), v.ids(&["▁hiab"]));
    assert_eq!(tok.encode("hiab hi", false).unwrap(), v.ids(&["▁hiab", "▁hi"]));
}

#[test]
fn gemma_ranks_merges_by_piece_order_and_respells_space_runs() {
    let mut v = Spm::new(&[]);
    // By score "bc" would win; Gemma's scores are not its merge order, its piece order is.
    v.push("ab", NORMAL, -2.0);
    v.push("bc", NORMAL, -1.0);
    let spaces = v.push("  ", USER_DEFINED, 0.0);
    let tok = load("gemma", v.writer("gemma3").bool("tokenizer.ggml.add_space_prefix", false)).unwrap();
    assert_eq!(tok.encode("abc", false).unwrap(), v.ids(&["ab", "c"]));
    // The file spells the piece with real spaces; it stands for "▁▁" and merges produce it.
    let ids = tok.encode("a  b", false).unwrap();
    assert_eq!(ids, vec![v.id("a"), spaces, v.id("b")]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "a  b");
    assert_eq!(tok.token_bytes(spaces).unwrap(), b"  ");
    assert_eq!(tok.id_to_token(spaces).unwrap(), "▁▁");

    // The same file as a Llama vocabulary ranks by score and keeps the spelling.
    let tok = no_prefix(&v, "not-gemma");
    assert_eq!(tok.encode("abc", false).unwrap(), v.ids(&["a", "bc"]));
}

#[test]
fn space_prefix_is_added_and_stripped_again() {
    let mut v = Spm::new(&[]);
    v.push("▁a", NORMAL, -1.0);
    v.push("hi", NORMAL, -2.0);
    v.push("▁hi", NORMAL, -3.0);
    // Absent means on (llama.cpp's default for this model type).
    for writer in [v.writer("llama"), v.writer("llama").bool("tokenizer.ggml.add_space_prefix", true)] {
        let tok = load("prefix", writer).unwrap();
        let ids = tok.encode("hi a", false).unwrap();
        assert_eq!(ids, v.ids(&["▁hi", "▁a"]));
        assert_eq!(tok.decode(&ids, false).unwrap(), "hi a");
        // One leading space is the prefix; more are the text's own.
        let ids = tok.encode("  hi", false).unwrap();
        assert_eq!(ids, v.ids(&["▁", "▁", "▁hi"]));
        assert_eq!(tok.decode(&ids, false).unwrap(), "  hi");
        // Each stretch of text between added tokens gets the prefix (as llama.cpp does).
        let ids = tok.encode("a</s>hi", false).unwrap();
        assert_eq!(ids, v.ids(&["▁a", "</s>", "▁hi"]));
        assert_eq!(tok.decode(&ids, true).unwrap(), "a hi");
        assert_eq!(tok.encode("", false).unwrap(), Vec::<u32>::new());
    }

    let tok = no_prefix(&v, "no-prefix");
    let ids = tok.encode("hi a", false).unwrap();
    assert_eq!(ids, v.ids(&["hi", "▁a"]));
    assert_eq!(tok.decode(&ids, false).unwrap(), "hi a");
    assert_eq!(tok.decode(&v.ids(&["▁a"]), false).unwrap(), " a");
}

#[test]
fn characters_without_a_piece_fall_back_to_bytes() {
    let v = Spm::new(&[]);
    let tok = no_prefix(&v, "bytes");
    let ids = tok.encode("aé", false).unwrap();
    assert_eq!(ids, v.ids(&["a", "<0xC3>", "<0xA9>"]));
    assert_eq!(tok.decode(&ids, false).unwrap(), "aé");
    assert_eq!(tok.token_bytes(v.id("<0xC3>")).unwrap(), vec![0xC3]);
    assert_eq!(tok.token_bytes(v.id("▁")).unwrap(), b" ");
    assert_eq!(tok.token_bytes(v.id("<0x0A>")).unwrap(), b"\n");
    assert_eq!(tok.token_text(v.id("<0x41>")), "A");
    // Half a character decodes as U+FFFD per byte, as Hugging Face's byte-fallback decoder does.
    assert_eq!(tok.decode(&v.ids(&["a", "<0xC3>"]), false).unwrap(), "a\u{FFFD}");
    // A literal `<0xNN>` in the text is text, not a byte.
    let ids = tok.encode("<0x41>", false).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), "<0x41>");
    assert!(!ids.contains(&v.id("<0x41>")));
}

#[test]
fn characters_whose_bytes_lack_pieces_become_one_unknown() {
    // Without <0xF0>, 4-byte characters starting with it cannot fall back to bytes.
    let mut v = Spm::new(&[0xF0]);
    let unk = v.id("<unk>");
    let tok = no_prefix(&v, "unk");
    assert_eq!(tok.encode("a😀😀b", false).unwrap(), vec![v.id("a"), unk, v.id("b")]);
    assert_eq!(tok.encode("<unk>", false).unwrap(), vec![unk]);

    // Without a usable unknown_token_id the piece of type unknown is used.
    let extra = v.push("x", NORMAL, -1.0);
    for unk_key in [None, Some(100_000)] {
        let mut writer = common::GgufWriter::new()
            .str("tokenizer.ggml.model", "llama")
            .strs("tokenizer.ggml.tokens", &v.tokens)
            .i32s("tokenizer.ggml.token_type", &v.types)
            .f32s("tokenizer.ggml.scores", &v.scores)
            .bool("tokenizer.ggml.add_space_prefix", false);
        if let Some(id) = unk_key {
            writer = writer.u32("tokenizer.ggml.unknown_token_id", id);
        }
        let tok = load("unk-by-type", writer).unwrap();
        assert_eq!(tok.encode("x😀", false).unwrap(), vec![extra, unk]);
        // No BOS id: nothing to add, even though add_bos defaults to true.
        assert_eq!(tok.bos_id(), None);
        assert!(!tok.add_bos());
    }
}

#[test]
fn control_user_defined_and_unknown_pieces() {
    let mut v = Spm::new(&[]);
    let turn = v.push("<|turn|>", CONTROL, 0.0);
    let think = v.push("<think>", USER_DEFINED, 0.0);
    let tok = no_prefix(&v, "types");
    let (bos, eos, unk) = (v.id("<s>"), v.id("</s>"), v.id("<unk>"));
    assert_eq!(
        tok.encode("a<|turn|>b<think>c</s>", false).unwrap(),
        vec![v.id("a"), turn, v.id("b"), think, v.id("c"), eos]
    );
    // Control and unknown pieces are special; user-defined ones are text.
    let ids = [bos, v.id("a"), turn, think, unk, eos];
    assert_eq!(tok.decode(&ids, true).unwrap(), "a<think>");
    assert_eq!(tok.decode(&ids, false).unwrap(), "<s>a<|turn|><think><unk></s>");
    // Added tokens are matched in the raw text, before spaces become "▁".
    assert_eq!(tok.encode("a <think>", false).unwrap(), vec![v.id("a"), v.id("▁"), think]);
    assert_eq!(tok.bos_token(), Some("<s>"));
    assert_eq!(tok.eos_token(), Some("</s>"));
    assert_eq!(tok.eos_token_ids(), &[eos]);
    assert_eq!(tok.vocab_size(), v.tokens.len());
    assert!(tok.missing_byte_tokens().is_empty());
}

#[test]
fn bos_by_default_and_eos_on_request() {
    let v = Spm::new(&[]);
    let (bos, eos, a) = (v.id("<s>"), v.id("</s>"), v.id("a"));
    let prefix = |w: common::GgufWriter| w.bool("tokenizer.ggml.add_space_prefix", false);

    let tok = load("bos-default", prefix(v.writer("llama"))).unwrap();
    assert!(tok.add_bos());
    assert_eq!(tok.encode("a", true).unwrap(), vec![bos, a]);
    assert_eq!(tok.encode("", true).unwrap(), vec![bos]);
    assert_eq!(tok.encode("a", false).unwrap(), vec![a]);

    let tok = load("bos-off", prefix(v.writer("llama")).bool("tokenizer.ggml.add_bos_token", false)).unwrap();
    assert!(!tok.add_bos());
    assert_eq!(tok.encode("a", true).unwrap(), vec![a]);

    let tok = load("eos-on", prefix(v.writer("llama")).bool("tokenizer.ggml.add_eos_token", true)).unwrap();
    assert_eq!(tok.encode("a", true).unwrap(), vec![bos, a, eos]);
    assert_eq!(tok.encode("a", false).unwrap(), vec![a]);
}

#[test]
fn inconsistent_metadata_is_an_error() {
    let v = Spm::new(&[]);
    let writer = common::GgufWriter::new()
        .str("tokenizer.ggml.model", "llama")
        .strs("tokenizer.ggml.tokens", &v.tokens)
        .f32s("tokenizer.ggml.scores", &v.scores[..10]);
    let err = load("scores-short", writer).unwrap_err();
    assert!(matches!(err, TokenizerError::InvalidVocab { .. }), "{err:?}");
    assert!(err.to_string().contains("10 scores"), "{err}");

    let writer = common::GgufWriter::new()
        .str("tokenizer.ggml.model", "llama")
        .strs("tokenizer.ggml.tokens", &v.tokens)
        .u32("tokenizer.ggml.eos_token_id", 100_000);
    let err = load("eos-range", writer).unwrap_err();
    assert!(err.to_string().contains("100000"), "{err}");

    // Asked for EOS without an EOS id.
    let writer = common::GgufWriter::new()
        .str("tokenizer.ggml.model", "llama")
        .strs("tokenizer.ggml.tokens", &v.tokens)
        .bool("tokenizer.ggml.add_eos_token", true);
    let err = load("eos-missing", writer).unwrap_err();
    assert!(matches!(err, TokenizerError::InvalidVocab { .. }), "{err:?}");
}

#[test]
fn a_file_without_scores_or_types_still_loads() {
    let mut v = Spm::new(&[]);
    v.push("ab", NORMAL, 0.0);
    let writer = common::GgufWriter::new()
        .str("tokenizer.ggml.model", "llama")
        .strs("tokenizer.ggml.tokens", &v.tokens)
        .bool("tokenizer.ggml.add_space_prefix", false);
    let tok = load("bare", writer).unwrap();
    assert_eq!(tok.encode("ab", false).unwrap(), v.ids(&["ab"]));
}

/// Streams `out` after `prompt`; returns the deltas, the flush last.
fn stream(tok: &Tokenizer, prompt: &[u32], out: &[u32], skip: bool) -> Vec<String> {
    let mut d = IncrementalDetokenizer::new(prompt, skip);
    let mut deltas: Vec<String> = out.iter().map(|&id| d.push(tok, id)).collect();
    deltas.push(d.flush(tok));
    deltas
}

#[test]
fn streaming_holds_byte_pieces_until_the_character_is_complete() {
    let mut v = Spm::new(&[]);
    v.push("▁a", NORMAL, -1.0);
    for prefix in [true, false] {
        let tok = load("stream", v.writer("llama").bool("tokenizer.ggml.add_space_prefix", prefix)).unwrap();
        let text = "a 中😀 a é";
        let ids = tok.encode(text, false).unwrap();
        assert!(ids.len() > 10, "{ids:?}");
        for prompt in [vec![], tok.encode("a a", true).unwrap()] {
            let deltas = stream(&tok, &prompt, &ids, true);
            for d in &deltas {
                assert!(!d.contains('\u{FFFD}'), "U+FFFD in {d:?} ({deltas:?})");
            }
            // Some pushes end inside a character and release nothing.
            assert!(deltas[..ids.len()].iter().any(String::is_empty));
            let whole = TokenDecoder::decode(&tok, &ids, true);
            if prompt.is_empty() {
                assert_eq!(deltas.concat(), whole);
            } else {
                // After a prompt the first piece's "▁" is a real space, not the prefix.
                assert_eq!(deltas.concat(), if prefix { format!(" {whole}") } else { whole });
            }
        }
    }
}

// ---- The real Gemma 3 vocabulary -----------------------------------------------------------------

#[test]
fn gemma3_metadata() {
    let tok = common::gemma3();
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(tok.bos_id(), Some(2));
    assert_eq!(tok.eos_id(), Some(1));
    assert_eq!(tok.bos_token(), Some("<bos>"));
    assert_eq!(tok.eos_token(), Some("<eos>"));
    assert!(tok.add_bos());
    assert!(tok.is_eos(1) && tok.is_eos(106), "{:?}", tok.eos_token_ids());
    assert_eq!(tok.token_to_id("<end_of_turn>"), Some(106));
    // This file carries no `tokenizer.chat_template`.
    assert_eq!(tok.chat_template(), None);
    assert!(tok.missing_byte_tokens().is_empty());
}

#[test]
fn gemma3_ids_match_hugging_face() {
    // From transformers 5.23's conversion of the same file (AutoTokenizer, gguf_file=...).
    let tok = common::gemma3();
    let cases: &[(&str, &[u32])] = &[
        ("", &[2]),
        ("Hello world", &[2, 9259, 1902]),
        (" Hello", &[2, 26352]),
        ("Hello  world", &[2, 9259, 138, 12392]),
        ("tabs\tand\tspaces  \t mixed", &[2, 39218, 255968, 624, 255968, 35220, 138, 255968, 9726]),
        (
            "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
            &[2, 105, 2364, 107, 10979, 993, 106, 107, 105, 4368, 107],
        ),
        ("\u{0}\u{1}\u{2} ctrl", &[2, 238, 249732, 241247, 72417]),
        ("\u{10FFFF}\u{E0001}", &[2, 482, 381, 429, 429, 481, 398, 366, 367]),
        ("<0x41>", &[2, 236820, 236771, 236781, 236812, 236770, 236813]),
    ];
    for (text, ids) in cases {
        assert_eq!(tok.encode(text, true).unwrap(), *ids, "{text:?}");
        assert_eq!(tok.encode(text, false).unwrap(), ids[1..], "{text:?}");
        assert_eq!(tok.decode(&ids[1..], false).unwrap(), *text);
    }
}

#[test]
fn gemma3_token_bytes_are_the_real_bytes() {
    let tok = common::gemma3();
    // Byte pieces <0x00>..<0xFF> are ids 238..=493.
    for b in 0..=255u8 {
        assert_eq!(tok.token_bytes(238 + u32::from(b)).unwrap(), vec![b]);
    }
    assert_eq!(tok.token_bytes(236743).unwrap(), b" "); // "▁"
    assert_eq!(tok.token_bytes(138).unwrap(), b"  "); // spelled "  " in the file
    assert_eq!(tok.token_bytes(26352).unwrap(), b" Hello");
    assert_eq!(tok.token_bytes(107).unwrap(), b"\n");
    assert_eq!(tok.token_bytes(106).unwrap(), b"<end_of_turn>");
    // Every id has bytes, and joined they give what decode gives for plain text.
    let ids = tok.encode("Grüße, 世界! 😀 ꙮ\u{10FFFF} done", false).unwrap();
    let bytes: Vec<u8> = ids.iter().flat_map(|&id| tok.token_bytes(id).unwrap()).collect();
    assert_eq!(String::from_utf8(bytes).unwrap(), "Grüße, 世界! 😀 ꙮ\u{10FFFF} done");
}

#[test]
fn gemma3_streams_multilingual_text_exactly() {
    let tok = common::gemma3();
    let prompt =
        tok.encode("<start_of_turn>user\nSay something.<end_of_turn>\n<start_of_turn>model\n", true).unwrap();
    for text in [
        "Plain English, with punctuation!",
        " leading space and trailing space ",
        "naïve café — résumé, Ångström, Kraków, São Paulo",
        "日本語のテキスト、中文文本。한국어 텍스트",
        "Emoji: 😀👍🏽🇫🇷 ❤️ 👨‍👩‍👧 🤗🤗",
        // Characters without a piece: byte fallback, 2 to 4 byte tokens each.
        "rare: ꙮ ᚠᛇᚻ 𓀀 𒀀 \u{10FFFF}\u{E0001} \u{378} ǅ",
        "code:\n\tlet s = \"é\";\n    return  x;\n\n",
    ] {
        let ids = tok.encode(text, false).unwrap();
        for skip in [true, false] {
            let deltas = stream(&tok, &prompt, &ids, skip);
            for d in &deltas {
                assert!(!d.contains('\u{FFFD}'), "U+FFFD in {d:?} for {text:?}");
            }
            assert_eq!(deltas.concat(), text);
            assert_eq!(deltas.concat(), TokenDecoder::decode(&tok, &ids, skip));
        }
    }
}
