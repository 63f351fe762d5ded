//! Names on disk: chained block hashes, as vLLM's `sha256` prefix-caching option computes
//! them, seeded with the cache's identity so that no entry of another model, numerics or
//! layout can ever be found.

use sha2::{Digest as _, Sha256};

pub type Digest = [u8; 32];

/// The hash of the block `tokens` after the prefix whose hash is `parent` (the identity for
/// the first block).
pub fn chain(parent: &Digest, tokens: impl Iterator<Item = u32>) -> Digest {
    let mut h = Sha256::new();
    h.update(parent);
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.finalize().into()
}

/// The hash of a sequence of labelled parts (the cache identity).
pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Digest {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finalize().into()
}

pub fn hex(d: &Digest) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest a file name spells, if it is one.
pub fn from_hex(s: &str) -> Option<Digest> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut d = [0u8; 32];
    for (i, b) in d.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_chain_and_spell_back() {
        let root = of_parts([b"a".as_slice(), b"bc"]);
        assert_ne!(
            root,
            of_parts([b"ab".as_slice(), b"c"]),
            "parts are delimited"
        );
        let a = chain(&root, [1, 2, 3].into_iter());
        assert_ne!(a, chain(&root, [1, 2, 4].into_iter()));
        assert_ne!(chain(&a, [5].into_iter()), chain(&root, [5].into_iter()));
        assert_eq!(from_hex(&hex(&a)), Some(a));
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex(&"g".repeat(64)), None);
    }
}
