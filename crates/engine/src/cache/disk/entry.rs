//! One disk entry: a cached block's paged data, or a boundary snapshot, in one file that
//! names what it holds and proves it is whole.
//!
//! ```text
//! magic "DIPC" | version u32 | kind u32 | identity [32] | chain [32] | parent [32]
//! | depth u32 | tokens n u32 | floats m u64 | token ids n × u32 | floats m × f32 | crc32
//! ```
//!
//! Little-endian throughout; the CRC covers every byte before it. A block entry carries its
//! tokens and its parent's chain hash, so a reader checks the whole prefix link by link
//! (content, not only the hash) as the memory cache does.

use super::key::Digest;

const MAGIC: &[u8; 4] = b"DIPC";
/// Bumped whenever the bytes of an entry change meaning.
pub const FORMAT_VERSION: u32 = 1;
const HEADER: usize = 4 + 4 + 4 + 32 * 3 + 4 + 4 + 8;

/// What an entry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// One node's block in every paged pool, pool after pool.
    Block,
    /// The fixed-size state a sequence resuming at the block's end reads.
    Snapshot,
}

impl Kind {
    pub fn extension(self) -> &'static str {
        match self {
            Kind::Block => "blk",
            Kind::Snapshot => "snap",
        }
    }

    fn code(self) -> u32 {
        match self {
            Kind::Block => 1,
            Kind::Snapshot => 2,
        }
    }
}

/// The header fields a writer fills in.
pub struct Head<'a> {
    pub kind: Kind,
    pub identity: &'a Digest,
    pub chain: &'a Digest,
    pub parent: &'a Digest,
    pub depth: u32,
    pub tokens: &'a [u32],
}

/// The bytes of an entry holding `floats` (the concatenation of the given slices).
pub fn encode(head: &Head, floats: &[&[f32]]) -> Vec<u8> {
    let m: usize = floats.iter().map(|f| f.len()).sum();
    let mut out = Vec::with_capacity(HEADER + 4 * (head.tokens.len() + m) + 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&head.kind.code().to_le_bytes());
    for d in [head.identity, head.chain, head.parent] {
        out.extend_from_slice(d);
    }
    out.extend_from_slice(&head.depth.to_le_bytes());
    out.extend_from_slice(&(head.tokens.len() as u32).to_le_bytes());
    out.extend_from_slice(&(m as u64).to_le_bytes());
    for t in head.tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    for f in floats.iter().flat_map(|s| s.iter()) {
        out.extend_from_slice(&f.to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Why bytes are not a usable entry.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("{0} bytes is shorter than an entry's header")]
    Short(usize),
    #[error("not a deepinfer prefix-cache entry (bad magic)")]
    Magic,
    #[error("format version {0}, this build reads {FORMAT_VERSION}")]
    Version(u32),
    #[error("{got} bytes where the header promises {want}: torn or truncated")]
    Length { got: usize, want: usize },
    #[error("checksum mismatch: the file is corrupt")]
    Checksum,
    #[error("it holds a {0} entry of another kind, model or prefix")]
    Other(&'static str),
}

/// A checked entry, borrowing the file's bytes.
#[derive(Debug)]
pub struct Entry<'a> {
    pub parent: Digest,
    pub depth: u32,
    tokens: &'a [u8],
    floats: &'a [u8],
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn digest_at(b: &[u8], at: usize) -> Digest {
    b[at..at + 32].try_into().expect("32 bytes")
}

/// Checks `bytes` whole (length, checksum) and that they hold `kind` for `chain` under
/// `identity`.
pub fn decode<'a>(
    bytes: &'a [u8],
    kind: Kind,
    identity: &Digest,
    chain: &Digest,
) -> Result<Entry<'a>, Invalid> {
    if bytes.len() < HEADER + 4 {
        return Err(Invalid::Short(bytes.len()));
    }
    if &bytes[..4] != MAGIC {
        return Err(Invalid::Magic);
    }
    let version = u32_at(bytes, 4);
    if version != FORMAT_VERSION {
        return Err(Invalid::Version(version));
    }
    let n = u32_at(bytes, HEADER - 12) as usize;
    let m = u64::from_le_bytes(bytes[HEADER - 8..HEADER].try_into().expect("8 bytes"));
    let want = (m as u128 + n as u128) * 4 + HEADER as u128 + 4;
    if want != bytes.len() as u128 {
        let want = usize::try_from(want).unwrap_or(usize::MAX);
        return Err(Invalid::Length {
            got: bytes.len(),
            want,
        });
    }
    let body = bytes.len() - 4;
    if crc32fast::hash(&bytes[..body]) != u32_at(bytes, body) {
        return Err(Invalid::Checksum);
    }
    let ours = u32_at(bytes, 8) == kind.code()
        && digest_at(bytes, 12) == *identity
        && digest_at(bytes, 44) == *chain;
    if !ours {
        return Err(Invalid::Other(kind.extension()));
    }
    let tokens_end = HEADER + 4 * n;
    Ok(Entry {
        parent: digest_at(bytes, 76),
        depth: u32_at(bytes, 108),
        tokens: &bytes[HEADER..tokens_end],
        floats: &bytes[tokens_end..body],
    })
}

/// The parent chain hash in the header of the file at `path`, if it starts like an entry of
/// this format (the rest is checked when it is read).
pub fn parent_of(path: &std::path::Path) -> Option<Digest> {
    use std::io::Read;
    let mut head = [0u8; HEADER];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    (&head[..4] == MAGIC && u32_at(&head, 4) == FORMAT_VERSION).then(|| digest_at(&head, 76))
}

impl Entry<'_> {
    pub fn tokens(&self) -> impl Iterator<Item = u32> + '_ {
        self.tokens
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
    }

    pub fn floats_len(&self) -> usize {
        self.floats.len() / 4
    }

    /// Copies floats `start..start + out.len()` into `out`.
    pub fn floats_into(&self, start: usize, out: &mut [f32]) {
        let bytes = &self.floats[4 * start..4 * (start + out.len())];
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes(c.try_into().expect("4 bytes"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let head = Head {
            kind: Kind::Block,
            identity: &[1; 32],
            chain: &[2; 32],
            parent: &[3; 32],
            depth: 5,
            tokens: &[10, 11, 12, 13],
        };
        encode(&head, &[&[1.5, -0.0], &[f32::NAN, 7.0]])
    }

    #[test]
    fn an_entry_reads_back_bit_for_bit() {
        let bytes = sample();
        let e = decode(&bytes, Kind::Block, &[1; 32], &[2; 32]).unwrap();
        assert_eq!((e.parent, e.depth), ([3; 32], 5));
        assert_eq!(e.tokens().collect::<Vec<_>>(), [10, 11, 12, 13]);
        let mut out = [0.0f32; 4];
        e.floats_into(0, &mut out);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&out), bits(&[1.5, -0.0, f32::NAN, 7.0]));
        let mut tail = [0.0f32; 1];
        e.floats_into(3, &mut tail);
        assert_eq!(tail, [7.0]);
    }

    #[test]
    fn every_flipped_byte_and_every_truncation_is_refused() {
        let bytes = sample();
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(
                decode(&bad, Kind::Block, &[1; 32], &[2; 32]).is_err(),
                "byte {i} flipped"
            );
        }
        for len in 0..bytes.len() {
            let e = decode(&bytes[..len], Kind::Block, &[1; 32], &[2; 32]).unwrap_err();
            assert!(
                matches!(e, Invalid::Short(_) | Invalid::Length { .. }),
                "{len}: {e}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode(&long, Kind::Block, &[1; 32], &[2; 32]).is_err());
    }

    #[test]
    fn another_models_or_prefixs_entry_is_not_ours() {
        let bytes = sample();
        let other = |kind, id: u8, chain: u8| decode(&bytes, kind, &[id; 32], &[chain; 32]);
        assert_eq!(
            other(Kind::Snapshot, 1, 2).unwrap_err(),
            Invalid::Other("snap")
        );
        assert_eq!(other(Kind::Block, 9, 2).unwrap_err(), Invalid::Other("blk"));
        assert_eq!(other(Kind::Block, 1, 9).unwrap_err(), Invalid::Other("blk"));
    }
}
