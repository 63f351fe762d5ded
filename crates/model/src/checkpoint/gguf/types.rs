//! ggml's tensor types as GGUF numbers them (`enum ggml_type` in `ggml/include/ggml.h`), with
//! their block sizes (`GGML_QUANT_SIZES` in gguf-py's `constants.py`).

use deepinfer_kernels::ggml::Block;

/// A ggml type a GGUF tensor may have. The ids are the file's; every type llama.cpp 0c1e570
/// writes is known here, so a file is described fully even where deepinfer cannot compute
/// on a type (see [`GgmlType::block`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType {
    id: u32,
}

/// `(id, name, values per block, bytes per block)`.
const TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
    (42, "Q2_0", 64, 18),
];

pub const F32: GgmlType = GgmlType { id: 0 };
pub const F16: GgmlType = GgmlType { id: 1 };
#[cfg(test)]
pub const Q8_0: GgmlType = GgmlType { id: 8 };
pub const I32: GgmlType = GgmlType { id: 26 };
pub const BF16: GgmlType = GgmlType { id: 30 };
#[cfg(test)]
pub const MXFP4: GgmlType = GgmlType { id: 39 };

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        TYPES.iter().any(|t| t.0 == id).then_some(Self { id })
    }

    fn entry(self) -> &'static (u32, &'static str, u64, u64) {
        TYPES
            .iter()
            .find(|t| t.0 == self.id)
            .expect("built from a known id")
    }

    /// ggml's name of the type, upper-case as llama.cpp's tools print it.
    pub fn name(self) -> &'static str {
        self.entry().1
    }

    pub fn block_elems(self) -> u64 {
        self.entry().2
    }

    pub fn block_bytes(self) -> u64 {
        self.entry().3
    }

    /// Bytes of a tensor of dimensions `ne` (ggml order), if its rows are whole blocks and
    /// the size fits in 64 bits.
    pub fn byte_len(self, ne: &[u64]) -> Option<u64> {
        let (&row, rest) = ne.split_first()?;
        if row % self.block_elems() != 0 {
            return None;
        }
        let rows = rest.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        (row / self.block_elems())
            .checked_mul(self.block_bytes())?
            .checked_mul(rows)
    }

    /// The block format the kernels compute on, for the quantised types they know.
    pub fn block(self) -> Option<Block> {
        Block::ALL
            .into_iter()
            .find(|b| b.name().eq_ignore_ascii_case(self.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_formats_agree_with_the_kernels() {
        for b in Block::ALL {
            let t = TYPES
                .iter()
                .find(|t| t.1.eq_ignore_ascii_case(b.name()))
                .map(|t| GgmlType { id: t.0 })
                .unwrap_or_else(|| panic!("{} is a ggml type", b.name()));
            assert_eq!(t.block(), Some(b));
            assert_eq!(t.block_elems() as usize, b.elems());
            assert_eq!(t.block_bytes() as usize, b.bytes());
        }
        assert_eq!(Q8_0.block(), Some(Block::Q8_0));
        assert_eq!(MXFP4.block(), Some(Block::Mxfp4));
        assert_eq!(F16.block(), Some(Block::F16));
        for unknown in [F32, BF16, GgmlType { id: 35 }, GgmlType { id: 40 }] {
            assert_eq!(unknown.block(), None, "{}", unknown.name());
        }
        assert_eq!(Q8_0.byte_len(&[64, 3]), Some(3 * 68));
        assert_eq!(Q8_0.byte_len(&[48, 3]), None);
        assert_eq!(F32.byte_len(&[u64::MAX, 2]), None);
        assert!(GgmlType::from_id(31).is_none());
    }
}
