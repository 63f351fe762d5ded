//! llama.cpp's block formats, as GGUF files store them: each row of a matrix is a run of
//! fixed-size blocks, each block a scale and the codes of `elems` consecutive inputs.
//!
//! The decodes here follow ggml's reference `dequantize_row_*` (`ggml/src/ggml-quants.c` of
//! llama.cpp 0c1e570) value for value; each product below is exact in f32, so they are the
//! numbers llama.cpp itself starts from.

use crate::formats::f16_to_f32;

pub mod dot;
pub mod q8;

/// A block format of ggml that deepinfer computes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Block {
    /// `Q8_0`: an f16 scale `d`, then 32 signed bytes; `x = q · d`.
    Q8_0,
    /// `MXFP4`: an E8M0 byte `e`, then 16 bytes of E2M1 codes, element `j` in the low
    /// nibble of byte `j` and element `j + 16` in its high nibble; `x = e2m1 · 2^(e-127)`.
    Mxfp4,
}

impl Block {
    /// ggml's name of the type (`ggml_type_name`).
    pub fn name(self) -> &'static str {
        match self {
            Block::Q8_0 => "q8_0",
            Block::Mxfp4 => "mxfp4",
        }
    }

    /// Inputs per block.
    pub fn elems(self) -> usize {
        32
    }

    /// Bytes per block.
    pub fn bytes(self) -> usize {
        match self {
            Block::Q8_0 => 34,
            Block::Mxfp4 => 17,
        }
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
        let blocks = row.chunks_exact(self.bytes());
        for (b, y) in blocks.zip(out.chunks_exact_mut(self.elems())) {
            match self {
                Block::Q8_0 => decode_q8_0(b, y),
                Block::Mxfp4 => decode_mxfp4(b, y),
            }
        }
    }
}

fn decode_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
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
}
