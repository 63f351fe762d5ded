//! Stored bytes → f32 for plain float tensors and block scales (exact: each stored format is
//! a subset of f32). Quantised weights stay stored ([`deepinfer_kernels::matrix::QMatrix`]).

use deepinfer_kernels::formats::{bf16_to_f32, e8m0_to_f32, f16_to_f32};
use rayon::prelude::*;
use safetensors::Dtype;

/// Elements per parallel task: large enough to amortise scheduling, small enough to spread a
/// big embedding table over all cores.
const CHUNK: usize = 1 << 16;

/// Decodes a plain float tensor. `bytes.len()` must be `out.len() * size_of(dtype)` and dtype
/// one of F32/BF16/F16 (callers check both).
pub(super) fn floats(dtype: Dtype, bytes: &[u8], out: &mut [f32]) {
    let width = dtype.bitsize() / 8;
    out.par_chunks_mut(CHUNK)
        .zip(bytes.par_chunks(CHUNK * width))
        .for_each(|(o, b)| match dtype {
            Dtype::F32 => {
                for (o, c) in o.iter_mut().zip(b.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            Dtype::BF16 => {
                for (o, c) in o.iter_mut().zip(b.chunks_exact(2)) {
                    *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
                }
            }
            Dtype::F16 => {
                for (o, c) in o.iter_mut().zip(b.chunks_exact(2)) {
                    *o = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
                }
            }
            _ => unreachable!("floats() called with {dtype:?}"),
        });
}

/// Decodes a block-scale tensor (E8M0, F32 or BF16) to f32.
pub(super) fn scales(dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        Dtype::F8_E8M0 => bytes.iter().map(|&b| e8m0_to_f32(b)).collect(),
        _ => {
            let mut out = vec![0.0; bytes.len() * 8 / dtype.bitsize()];
            floats(dtype, bytes, &mut out);
            out
        }
    }
}

/// Block size along one dimension of a weight given its extent and the scale's extent there.
/// 128 when it fits (every shipped FP8 tensor), otherwise the smallest power of two that tiles
/// `dim` into exactly `scale_dim` blocks (32 for FP4 groups and V4.1's FP8), otherwise the
/// smallest block that does. `None` when no block size gives that many blocks.
pub(super) fn block_size(dim: usize, scale_dim: usize) -> Option<usize> {
    if dim == 0 {
        return (scale_dim == 0).then_some(128);
    }
    if scale_dim == 0 {
        return None;
    }
    let blocks = |b: usize| dim.div_ceil(b);
    if blocks(128) == scale_dim {
        return Some(128);
    }
    let mut b = 1usize;
    while b < 2 * dim {
        if blocks(b) == scale_dim {
            return Some(b);
        }
        b *= 2;
    }
    let smallest = dim.div_ceil(scale_dim);
    (blocks(smallest) == scale_dim).then_some(smallest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_inference() {
        assert_eq!(block_size(4096, 32), Some(128));
        assert_eq!(block_size(130, 2), Some(128), "partial edge block");
        assert_eq!(block_size(200, 2), Some(128));
        assert_eq!(
            block_size(64, 1),
            Some(128),
            "one block covering a short dim"
        );
        assert_eq!(block_size(4096, 128), Some(32), "FP4 groups of 32");
        assert_eq!(block_size(4096, 4096), Some(1), "per-row scales");
        assert_eq!(block_size(96, 3), Some(32), "V4.1-style 32-blocks");
        assert_eq!(
            block_size(100, 4),
            Some(32),
            "power of two preferred over 25"
        );
        assert_eq!(
            block_size(12, 5),
            None,
            "no block size gives 5 blocks of 12"
        );
        assert_eq!(
            block_size(10, 4),
            Some(3),
            "no power of two fits: smallest exact block"
        );
        assert_eq!(block_size(9, 4), None);
        assert_eq!(block_size(10, 11), None);
        assert_eq!(block_size(10, 0), None);
        assert_eq!(block_size(0, 0), Some(128));
    }
}
