//! The IQ formats' codebooks: each group of 8 (IQ3: 4) weights of an IQ1/IQ2/IQ3 block is
//! an index into a fixed table of lattice points, ggml's `iq*_grid` (`ggml-common.h` of
//! llama.cpp 0c1e570). `grids.txt` holds them as `tools/make_iq_grids.py` extracted them
//! (checked there against gguf-py's copies): per grid its few distinct values, then each
//! point as hex indices into them. Parsed once, on the first IQ block decoded.

use std::sync::OnceLock;

/// One grid: each point as one little-endian word (value 0 in the low byte), as ggml's
/// tables hold them; a point of 4 (IQ3) in the low half.
pub struct Grid {
    width: usize,
    words: Vec<u64>,
}

impl Grid {
    /// Point `i`'s values: the first `width` of these (the rest are 0).
    #[inline(always)]
    pub fn point(&self, i: usize) -> [i8; 8] {
        self.words[i].to_le_bytes().map(|v| v as i8)
    }

    /// Point `i` as its word: what a SIMD kernel loads.
    #[inline(always)]
    pub fn word(&self, i: usize) -> u64 {
        self.words[i]
    }

    pub fn len(&self) -> usize {
        self.words.len()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }
}

/// Every grid, by the format that reads it.
pub struct Grids {
    pub iq2xxs: Grid,
    pub iq2xs: Grid,
    pub iq2s: Grid,
    pub iq3xxs: Grid,
    pub iq3s: Grid,
    pub iq1s: Grid,
}

/// The grids, parsed on first use.
pub fn grids() -> &'static Grids {
    static GRIDS: OnceLock<Grids> = OnceLock::new();
    GRIDS.get_or_init(|| {
        let mut text = include_str!("grids.txt")
            .lines()
            .filter(|l| !l.starts_with('#'));
        let mut next = |name: &str, points: usize, width: usize| {
            let grid = parse(&mut text, name);
            assert_eq!(
                (grid.len(), grid.width),
                (points, width),
                "grids.txt: {name}"
            );
            grid
        };
        Grids {
            iq2xxs: next("iq2xxs_grid", 256, 8),
            iq2xs: next("iq2xs_grid", 512, 8),
            iq2s: next("iq2s_grid", 1024, 8),
            iq3xxs: next("iq3xxs_grid", 256, 4),
            iq3s: next("iq3s_grid", 512, 4),
            iq1s: next("iq1s_grid", 2048, 8),
        }
    })
}

/// One `grid <name> <points> <width> <values…>` header and its lines of points. The file
/// is compiled in, so a malformed one is a build's bug: it panics, naming the grid.
fn parse<'a>(lines: &mut impl Iterator<Item = &'a str>, name: &str) -> Grid {
    let header: Vec<&str> = lines.next().unwrap_or_default().split(' ').collect();
    assert!(
        header.len() > 4 && header[..2] == ["grid", name],
        "grids.txt: {name}'s header"
    );
    let num = |s: &str| s.parse::<i64>().expect("grids.txt: a number");
    let (points, width) = (num(header[2]) as usize, num(header[3]) as usize);
    let distinct: Vec<i8> = header[4..].iter().map(|s| num(s) as i8).collect();
    let mut words = Vec::with_capacity(points);
    while words.len() < points {
        let line = lines.next().expect("grids.txt: a grid's points");
        for point in line.split(' ') {
            assert_eq!(point.len(), width, "grids.txt: {name}'s point {point}");
            // Value 0 is the first digit and the word's low byte.
            let word = point.chars().rev().fold(0u64, |w, c| {
                let v = distinct[c.to_digit(16).expect("grids.txt: a hex index") as usize];
                (w << 8) | v as u8 as u64
            });
            words.push(word);
        }
    }
    Grid { width, words }
}

/// `ksigns_iq2xs`: seven sign bits widened to eight by their parity, so that a group of 8
/// always has an even number of negative values (the eighth sign is implied).
#[inline(always)]
pub const fn signs(seven: u32) -> u8 {
    let s = (seven & 127) as u8;
    s | (((s.count_ones() & 1) as u8) << 7)
}

/// [`signs`] as eight bytes, `0xFF` (−1) for a negative value and `1` otherwise: the
/// multipliers `vpsignb` applies to eight activation codes at once.
pub static SIGN_BYTES: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let s = signs(i as u32);
        let mut j = 0;
        while j < 8 {
            let byte: u64 = if s & (1 << j) != 0 { 0xFF } else { 0x01 };
            t[i] |= byte << (8 * j);
            j += 1;
        }
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_hold_ggml_s_points() {
        let g = grids();
        // The first and last points of each, as ggml-common.h writes them (little-endian
        // words: value 0 is the lowest byte).
        let word = |p: [i8; 8]| p.iter().rev().fold(0u64, |a, &v| (a << 8) | v as u8 as u64);
        assert_eq!(word(g.iq2xxs.point(1)), 0x080808080808082b);
        assert_eq!(word(g.iq2xxs.point(255)), 0x2b2b2b1908081908);
        assert_eq!(word(g.iq2xs.point(511)), 0x2b2b2b2b2b2b2b2b);
        assert_eq!(word(g.iq2s.point(1023)), 0x2b2b2b2b2b2b2b2b);
        assert_eq!(word(g.iq2s.point(1022)), 0x2b2b2b2b2b082b08);
        assert_eq!(word(g.iq3xxs.point(0)), 0x04040404);
        assert_eq!(word(g.iq3s.point(511)), 0x0f0f0101);
        assert_eq!(word(g.iq1s.point(0)), 0xffffffffffffffff);
        assert_eq!(word(g.iq1s.point(2047)), 0x0101010101010101);
        assert_eq!(g.iq2xxs.word(1), 0x080808080808082b);
    }

    #[test]
    fn signs_are_ksigns_iq2xs() {
        // ggml's table's first and last rows.
        let first = [
            0, 129, 130, 3, 132, 5, 6, 135, 136, 9, 10, 139, 12, 141, 142, 15,
        ];
        let last = [
            240, 113, 114, 243, 116, 245, 246, 119, 120, 249, 250, 123, 252, 125, 126, 255,
        ];
        for i in 0..16 {
            assert_eq!(signs(i as u32), first[i]);
            assert_eq!(signs(112 + i as u32), last[i]);
        }
    }
}
