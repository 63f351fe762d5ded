//! The bytes behind a token, for logprobs: OpenAI's `bytes` field must let a client rebuild
//! characters split across tokens, so it cannot come from decoding one token alone (that
//! gives U+FFFD for a partial character).

use std::collections::HashMap;
use std::sync::OnceLock;

/// GPT-2's `bytes_to_unicode`, inverted: byte-level BPE spells every byte as one printable
/// char (printable Latin-1 as itself, the rest shifted to U+0100…).
fn symbol_to_byte() -> &'static HashMap<char, u8> {
    static TABLE: OnceLock<HashMap<char, u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut next = 256u32;
        (0..=255u8)
            .map(|b| {
                let c = if printable(b) {
                    u32::from(b)
                } else {
                    next += 1;
                    next - 1
                };
                (char::from_u32(c).expect("below U+0200"), b)
            })
            .collect()
    })
}

/// The bytes a byte-level token string spells; `None` if a char is not a byte symbol.
pub(crate) fn byte_level_bytes(token: &str) -> Option<Vec<u8>> {
    let table = symbol_to_byte();
    token.chars().map(|c| table.get(&c).copied()).collect()
}

/// The `token` string of a logprob entry for `bytes`: its text where the bytes are valid
/// UTF-8, and each byte of a partial character written as `\xNN`, as DeepSeek's own API
/// reports them (vLLM writes U+FFFD, which loses the bytes; `bytes` carries them exactly
/// either way).
pub fn logprob_token_text(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_symbols_map_back_to_bytes() {
        // "Ġ" is the space, "Ċ" the newline; "ä½" are bytes 0xE4 0xBD (half of 你).
        assert_eq!(byte_level_bytes("Ġhi").unwrap(), b" hi");
        assert_eq!(byte_level_bytes("Ċ").unwrap(), b"\n");
        assert_eq!(byte_level_bytes("ä½").unwrap(), [0xE4, 0xBD]);
        assert_eq!(byte_level_bytes("｜"), None);
        assert_eq!(symbol_to_byte().len(), 256);
    }

    #[test]
    fn partial_characters_are_escaped() {
        assert_eq!(logprob_token_text("你好".as_bytes()), "你好");
        assert_eq!(logprob_token_text(&[0xE4, 0xBD]), "\\xe4\\xbd");
        assert_eq!(
            logprob_token_text(&[b' ', 0xF0, 0x9F, 0xA6]),
            " \\xf0\\x9f\\xa6"
        );
        assert_eq!(logprob_token_text(&[0xA0, b'a']), "\\xa0a");
    }
}
