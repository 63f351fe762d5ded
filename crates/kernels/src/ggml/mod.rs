//! llama.cpp's block formats, as GGUF files store them: each row of a matrix is a run of
//! fixed-size blocks, each block a scale and the codes of `elems` consecutive inputs.
//!
//! The decodes here follow ggml's reference `dequantize_row_*` (`ggml/src/ggml-quants.c` of
//! llama.cpp 0c1e570) value for value, each product and difference rounded once in the
//! order written there (what gguf-py's numpy decoders compute too).

use crate::formats::f16_to_f32;

pub mod dot;
pub mod f16dot;
pub mod grids;
pub mod iquants;
pub mod kdot;
pub mod kgemm;
pub mod kquants;
pub mod legacy;
pub mod q8;
pub mod q8k;

/// A block format of ggml that deepinfer computes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Block {
    /// `F16`: IEEE halves, one per "block". A GGUF file's F16 matrices (antirez's ds4 files
    /// keep the router, indexer, compressors and mHC so) are computed on as stored, their
    /// input rounded to f16 in gguf numerics as llama.cpp's F16 products round it.
    F16,
    /// `Q8_0`: an f16 scale `d`, then 32 signed bytes; `x = q · d`.
    Q8_0,
    /// `MXFP4`: an E8M0 byte `e`, then 16 bytes of E2M1 codes, element `j` in the low
    /// nibble of byte `j` and element `j + 16` in its high nibble; `x = e2m1 · 2^(e-127)`.
    Mxfp4,
    /// `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `IQ4_NL`: 32-blocks of 4- or 5-bit codes
    /// ([`legacy`]), what llama.cpp's quantizer falls back to where a row is not a whole
    /// number of 256-blocks.
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Iq4Nl,
    /// The K-quants: 256-blocks of 16 or 8 sub-blocks with their own 4- to 8-bit scales
    /// ([`kquants`]).
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    /// `IQ4_XS`: 256-blocks of `IQ4_NL` codes with six-bit scales per 32 ([`kquants`]).
    Iq4Xs,
    /// The lattice formats: 256-blocks whose groups of 8 (or 4) weights are points of a
    /// fixed grid, with signs or a shift, 1.56 to 3.44 bits a weight ([`iquants`]).
    Iq2Xxs,
    Iq2Xs,
    Iq2S,
    Iq3Xxs,
    Iq3S,
    Iq1S,
    Iq1M,
}

/// The activations' format a product on a [`Block`] reads in llama.cpp's CPU backend
/// (`type_traits_cpu[..].vec_dot_type`): it quantises each input row to it first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VecDot {
    /// 32-blocks with an f16 scale ([`q8`]); `Q8_1`, which adds each block's sum, holds
    /// the same values.
    Q8_0,
    /// 256-blocks with an f32 scale ([`q8k`]).
    Q8K,
    /// IEEE halves (`F16` weights' inputs).
    F16,
}

impl VecDot {
    /// Rounds `x` in place to the values its codes in this format stand for.
    pub fn round_trip(self, x: &mut [f32]) {
        match self {
            VecDot::Q8_0 => q8::Q8Row::round_trip(x),
            VecDot::Q8K => q8k::round_trip(x),
            VecDot::F16 => x
                .iter_mut()
                .for_each(|v| *v = half::f16::from_f32(*v).to_f32()),
        }
    }

    /// Inputs per block: a row this product reads is a whole number of them.
    pub fn elems(self) -> usize {
        match self {
            VecDot::Q8_0 => q8::QK,
            VecDot::Q8K => q8k::QK_K,
            VecDot::F16 => 1,
        }
    }
}

impl Block {
    /// ggml's name of the type (`ggml_type_name`).
    pub fn name(self) -> &'static str {
        match self {
            Block::F16 => "f16",
            Block::Q8_0 => "q8_0",
            Block::Mxfp4 => "mxfp4",
            Block::Q4_0 => "q4_0",
            Block::Q4_1 => "q4_1",
            Block::Q5_0 => "q5_0",
            Block::Q5_1 => "q5_1",
            Block::Iq4Nl => "iq4_nl",
            Block::Q2K => "q2_K",
            Block::Q3K => "q3_K",
            Block::Q4K => "q4_K",
            Block::Q5K => "q5_K",
            Block::Q6K => "q6_K",
            Block::Iq4Xs => "iq4_xs",
            Block::Iq2Xxs => "iq2_xxs",
            Block::Iq2Xs => "iq2_xs",
            Block::Iq2S => "iq2_s",
            Block::Iq3Xxs => "iq3_xxs",
            Block::Iq3S => "iq3_s",
            Block::Iq1S => "iq1_s",
            Block::Iq1M => "iq1_m",
        }
    }

    /// Inputs per block.
    pub fn elems(self) -> usize {
        match self.vec_dot() {
            VecDot::Q8K => kquants::QK_K,
            VecDot::Q8_0 => 32,
            VecDot::F16 => 1,
        }
    }

    /// Bytes per block.
    pub fn bytes(self) -> usize {
        match self {
            Block::F16 => 2,
            Block::Q8_0 => 34,
            Block::Mxfp4 => 17,
            Block::Q4_0 | Block::Iq4Nl => 18,
            Block::Q4_1 => 20,
            Block::Q5_0 => 22,
            Block::Q5_1 => 24,
            Block::Q2K => 84,
            Block::Q3K => 110,
            Block::Q4K => 144,
            Block::Q5K => 176,
            Block::Q6K => 210,
            Block::Iq4Xs => 136,
            Block::Iq2Xxs => 66,
            Block::Iq2Xs => 74,
            Block::Iq2S => 82,
            Block::Iq3Xxs => 98,
            Block::Iq3S => 110,
            Block::Iq1S => 50,
            Block::Iq1M => 56,
        }
    }

    /// The format llama.cpp quantises this product's inputs to.
    pub fn vec_dot(self) -> VecDot {
        match self {
            Block::Q8_0
            | Block::Mxfp4
            | Block::Q4_0
            | Block::Q4_1
            | Block::Q5_0
            | Block::Q5_1
            | Block::Iq4Nl => VecDot::Q8_0,
            Block::F16 => VecDot::F16,
            _ => VecDot::Q8K,
        }
    }

    /// Whether the kernels multiply this format in integers, on its [`Self::vec_dot`] rows
    /// ([`dot`] on [`q8::Q8Row`]s, [`kdot`] and [`kgemm`] on [`q8k::Q8KRow`]s); the
    /// others decode a weight row to f32 first.
    pub fn has_int_dots(self) -> bool {
        matches!(self, Block::Q8_0 | Block::Mxfp4) || kgemm::BLOCKS.contains(&self)
    }

    /// Sets a block's f16 scales (and offsets, where it has them) to `d`'s bits, leaving
    /// its codes: tests and benchmarks fill blocks with random bytes, then give them the
    /// scales checkpoints have (`F16`: its value). `MXFP4`'s E8M0 scale is not an f16; it is
    /// left as it is.
    pub fn set_scales(self, block: &mut [u8], d: u16) {
        let fields: &[usize] = match self {
            Block::Mxfp4 => &[],
            Block::Q4_1 | Block::Q5_1 | Block::Q4K | Block::Q5K => &[0, 2],
            Block::Q2K => &[80, 82],
            Block::Q3K => &[108],
            Block::Q6K => &[208],
            Block::Iq1M => return iquants::iq1_m_set_scale(block, d),
            _ => &[0],
        };
        for &at in fields {
            block[at..at + 2].copy_from_slice(&d.to_le_bytes());
        }
    }

    /// Every block format, in ggml's type order.
    pub const ALL: [Block; 21] = [
        Block::F16,
        Block::Q4_0,
        Block::Q4_1,
        Block::Q5_0,
        Block::Q5_1,
        Block::Q8_0,
        Block::Q2K,
        Block::Q3K,
        Block::Q4K,
        Block::Q5K,
        Block::Q6K,
        Block::Iq2Xxs,
        Block::Iq2Xs,
        Block::Iq3Xxs,
        Block::Iq1S,
        Block::Iq4Nl,
        Block::Iq3S,
        Block::Iq2S,
        Block::Iq4Xs,
        Block::Iq1M,
        Block::Mxfp4,
    ];

    /// The format ggml names `name` ([`Self::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.name() == name)
    }

    /// Bytes of a row of `cols` inputs (a whole number of blocks).
    pub fn row_bytes(self, cols: usize) -> usize {
        cols / self.elems() * self.bytes()
    }

    /// Decodes one row's blocks (`out.len()` inputs, a multiple of [`Self::elems`]).
    pub fn decode_row(self, row: &[u8], out: &mut [f32]) {
        assert_eq!(
            row.len(),
            self.row_bytes(out.len()),
            "decode_row: {} bytes do not hold {} {} inputs",
            row.len(),
            out.len(),
            self.name()
        );
        let decode: fn(&[u8], &mut [f32]) = match self {
            // A row at once: one call per value would be the whole cost.
            Block::F16 => return decode_f16(row, out),
            Block::Q8_0 => decode_q8_0,
            Block::Mxfp4 => decode_mxfp4,
            Block::Q4_0 => legacy::q4_0,
            Block::Q4_1 => legacy::q4_1,
            Block::Q5_0 => legacy::q5_0,
            Block::Q5_1 => legacy::q5_1,
            Block::Iq4Nl => legacy::iq4_nl,
            Block::Q2K => kquants::q2_k,
            Block::Q3K => kquants::q3_k,
            Block::Q4K => kquants::q4_k,
            Block::Q5K => kquants::q5_k,
            Block::Q6K => kquants::q6_k,
            Block::Iq4Xs => kquants::iq4_xs,
            Block::Iq2Xxs => iquants::iq2_xxs,
            Block::Iq2Xs => iquants::iq2_xs,
            Block::Iq2S => iquants::iq2_s,
            Block::Iq3Xxs => iquants::iq3_xxs,
            Block::Iq3S => iquants::iq3_s,
            Block::Iq1S => iquants::iq1_s,
            Block::Iq1M => iquants::iq1_m,
        };
        let blocks = row.chunks_exact(self.bytes());
        for (b, y) in blocks.zip(out.chunks_exact_mut(self.elems())) {
            decode(b, y);
        }
    }
}

/// A block's little-endian 32-bit field at byte `at`.
#[inline(always)]
fn word(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A block's f16 field at byte `at`, as f32.
#[inline(always)]
fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// A row of halves, through `half`'s slice conversion (F16C where the CPU has it): this is
/// the f32 path's decode of every F16 product, so it must not be one call per value.
fn decode_f16(row: &[u8], out: &mut [f32]) {
    let mut halves = [half::f16::ZERO; 64];
    for (b, y) in row.chunks(128).zip(out.chunks_mut(64)) {
        for (h, pair) in halves.iter_mut().zip(b.chunks_exact(2)) {
            *h = half::f16::from_bits(u16::from_le_bytes([pair[0], pair[1]]));
        }
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(&halves[..y.len()], y);
    }
}

fn decode_q8_0(b: &[u8], y: &mut [f32]) {
    let d = half(b, 0);
    for (o, &q) in y.iter_mut().zip(&b[2..34]) {
        *o = q as i8 as f32 * d;
    }
}

/// ggml's E2M1 values doubled (`kvalues_mxfp4`), so that they are integers; the scale is
/// halved to match ([`e8m0_half`]).
pub const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e-128)` as ggml builds it (`ggml_e8m0_to_fp32_half`): exact, subnormal for `e < 2`,
/// and `e = 255` is `2^127` rather than NaN.
const fn e8m0_half_bits(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// A table, because the kernels read one per 32 weights and the branch costs more.
static E8M0_HALF: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut e = 0;
    while e < 256 {
        t[e] = e8m0_half_bits(e as u8);
        e += 1;
    }
    t
};

/// `2^(e-128)`, as [`e8m0_half_bits`] builds it.
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    E8M0_HALF[e as usize]
}

fn decode_mxfp4(b: &[u8], y: &mut [f32]) {
    let d = e8m0_half(b[0]);
    for (j, &q) in b[1..17].iter().enumerate() {
        y[j] = MXFP4_VALUES[(q & 0xF) as usize] as f32 * d;
        y[j + 16] = MXFP4_VALUES[(q >> 4) as usize] as f32 * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::{e2m1_to_f32, e8m0_to_f32};

    #[test]
    fn half_scale_is_the_e8m0_scale_halved() {
        for e in 0..=254u8 {
            assert_eq!(e8m0_half(e) * 2.0, e8m0_to_f32(e), "e = {e}");
        }
        assert_eq!(e8m0_half(255), 2f32.powi(127));
    }

    #[test]
    fn mxfp4_values_are_e2m1_doubled() {
        for c in 0..16u8 {
            assert_eq!(MXFP4_VALUES[c as usize] as f32, 2.0 * e2m1_to_f32(c));
        }
    }

    #[test]
    fn blocks_decode_by_their_layout() {
        // Q8_0: d = 0.5 (f16 0x3800), codes 0, 1, -1, 127, -128, ...
        let mut q = vec![0x00, 0x38];
        q.extend((0..32).map(|j: i32| ((j * 37 - 64) as i8) as u8));
        let mut y = [0.0f32; 32];
        Block::Q8_0.decode_row(&q, &mut y);
        for (j, v) in y.iter().enumerate() {
            assert_eq!(*v, ((j as i32 * 37 - 64) as i8) as f32 * 0.5);
        }
        // MXFP4: e = 128 (scale 2 on e2m1, 1 on the doubled values); byte j = low j, high 15-j.
        let mut m = vec![128u8];
        m.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        Block::Mxfp4.decode_row(&m, &mut y);
        for j in 0..16 {
            assert_eq!(y[j], 2.0 * e2m1_to_f32(j as u8));
            assert_eq!(y[j + 16], 2.0 * e2m1_to_f32(15 - j as u8));
        }
        assert_eq!(Block::Mxfp4.row_bytes(64), 34);
        assert_eq!(Block::Q8_0.row_bytes(64), 68);
    }

    fn words(line: &str, tag: &str) -> Vec<u32> {
        let rest = line.strip_prefix(tag).expect("the fixture's layout");
        rest.split_whitespace()
            .map(|w| u32::from_str_radix(w, 16).unwrap())
            .collect()
    }

    fn hex_bytes(h: &str) -> Vec<u8> {
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Blocks from llama.cpp's quantizer decode to gguf-py's values bit for bit (which ggml's
    /// own decoders give too: tools/make_ggml_block_fixtures.py checks), every format.
    #[test]
    fn blocks_decode_as_gguf_py_does() {
        let mut lines = include_str!("blocks.txt")
            .lines()
            .filter(|l| !l.starts_with('#'));
        let mut seen = std::collections::HashSet::new();
        while let Some(line) = lines.next() {
            let Some(rest) = line.strip_prefix("block ") else {
                continue;
            };
            let (name, hex) = rest.split_once(' ').unwrap();
            let block = Block::from_name(name).unwrap_or_else(|| panic!("{name}"));
            let want = words(lines.next().unwrap(), "values ");
            let mut got = vec![0.0f32; want.len()];
            block.decode_row(&hex_bytes(hex), &mut got);
            for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    *w,
                    "{name}: value {j}: {g} vs {}",
                    f32::from_bits(*w)
                );
            }
            seen.insert(block);
        }
        let missing: Vec<_> = Block::ALL
            .into_iter()
            .filter(|b| !matches!(b, Block::F16 | Block::Q8_0 | Block::Mxfp4) && !seen.contains(b))
            .collect();
        assert!(missing.is_empty(), "no fixture for {missing:?}");
    }

    /// Rows rounded through Q8_K give the values of `quantize_row_q8_K_ref`'s codes.
    #[test]
    fn q8_k_rounds_as_llama_cpp() {
        let mut lines = include_str!("blocks.txt").lines();
        let mut rows = 0;
        while let Some(line) = lines.next() {
            if !line.starts_with("q8_K ") {
                continue;
            }
            let mut x: Vec<f32> = words(line, "q8_K ")
                .into_iter()
                .map(f32::from_bits)
                .collect();
            let want = words(lines.next().unwrap(), "values ");
            VecDot::Q8K.round_trip(&mut x);
            for (j, (g, w)) in x.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), *w, "row {rows}: value {j}");
            }
            rows += 1;
        }
        assert_eq!(rows, 4);
        let mut zeros = [0.0f32; 256];
        VecDot::Q8K.round_trip(&mut zeros);
        assert!(zeros.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn names_and_sizes_are_ggml_s() {
        for b in Block::ALL {
            assert_eq!(Block::from_name(b.name()), Some(b));
            assert!(b.elems().is_multiple_of(b.vec_dot().elems()));
        }
        assert_eq!(Block::Q6K.row_bytes(512), 420);
        assert_eq!(Block::Q4_0.vec_dot(), VecDot::Q8_0);
        assert_eq!(Block::Q2K.vec_dot(), VecDot::Q8K);
    }
}
