//! The byte-level alphabet of GPT-2-style BPE vocabularies.
//!
//! Byte-level BPE spells every token as a string of 256 stand-in characters, one per byte value:
//! printable Latin-1 bytes stand for themselves and the rest (controls, space, some Latin-1) are
//! moved to U+0100 onwards, in byte order. `Ġ` (U+0120) is the space byte. This module converts
//! between the two spellings, e.g. to show a token's real text in logprobs.

use std::sync::OnceLock;

/// Bytes whose stand-in character is the byte itself (as a Latin-1 code point).
fn is_self_mapped(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// `[stand-in char for each byte]`, built once.
fn table() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut next_shifted = 0x100u32;
        for b in 0..=255u8 {
            table[b as usize] = if is_self_mapped(b) {
                char::from(b)
            } else {
                // Always a valid scalar: at most 0x100 + 68, far from the surrogate range.
                let c = char::from_u32(next_shifted).unwrap_or(char::REPLACEMENT_CHARACTER);
                next_shifted += 1;
                c
            };
        }
        table
    })
}

/// The stand-in character for byte `b`.
pub fn byte_to_char(b: u8) -> char {
    table()[b as usize]
}

/// The byte that stand-in character `c` spells, or `None` if `c` is not in the alphabet.
pub fn char_to_byte(c: char) -> Option<u8> {
    let code = c as u32;
    if let Ok(b) = u8::try_from(code) {
        return is_self_mapped(b).then_some(b);
    }
    let offset = code.checked_sub(0x100)?;
    // The shifted characters are handed out to non-self-mapped bytes in increasing order.
    (0..=255u8).filter(|&b| !is_self_mapped(b)).nth(usize::try_from(offset).ok()?)
}

/// Whether every character of `token` is in the byte-level alphabet.
pub fn is_byte_level(token: &str) -> bool {
    token.chars().all(|c| char_to_byte(c).is_some())
}

/// Spells raw bytes in the byte-level alphabet.
pub fn encode_bytes(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_to_char(b)).collect()
}

/// The raw bytes a byte-level token spells. A token with characters outside the alphabet (an
/// added token written in plain text) stands for its own UTF-8 bytes, which is also how the
/// byte-level decoder treats it.
pub fn decode_token(token: &str) -> Vec<u8> {
    token.chars().map(char_to_byte).collect::<Option<Vec<u8>>>().unwrap_or_else(|| token.as_bytes().to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_known_characters() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'\t'), 'ĉ');
        assert_eq!(byte_to_char(0), 'Ā');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xA0), 'ł');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        assert_eq!(byte_to_char(0xE9), 'é');
    }

    #[test]
    fn all_bytes_round_trip_and_are_distinct() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c), "duplicate stand-in {c:?}");
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(char_to_byte(' '), None);
        assert_eq!(char_to_byte('中'), None);
        assert_eq!(char_to_byte(char::from_u32(0x100 + 68).unwrap()), None);
    }

    #[test]
    fn tokens_decode_to_bytes() {
        assert_eq!(decode_token("Ġworld"), b" world");
        assert_eq!(encode_bytes("é".as_bytes()), "Ã©");
        assert_eq!(decode_token("Ã©"), "é".as_bytes());
        assert!(is_byte_level("Ġhello"));
        // A plain-text token (with a real space) is taken as its own bytes.
        assert!(!is_byte_level("a b"));
        assert_eq!(decode_token("a b"), b"a b");
    }
}
