//! Rounding drawn f32 values onto the checkpoint's storage formats, exactly as DeepSeek's
//! converter does: power-of-two block scales from the block's absolute maximum (stored as
//! E8M0), then round-to-nearest-even onto FP8 e4m3 or FP4 e2m1.

use deepinfer_kernels::formats::{e8m0_to_f32, f32_to_e4m3, E4M3_MAX};
use deepinfer_kernels::quant::{f32_to_e2m1, fp4_block_scale, pow2_scale_byte, FP8_AMAX_FLOOR};

/// FP4 experts carry one scale per 32 inputs of a row.
pub(super) const FP4_GROUP: usize = 32;

/// Quantises `rows` full rows of a `cols`-wide matrix onto FP8 with one scale per
/// `[br, bc]` block (128×128 in V4-Flash/Pro, 32×32 in V4.1). `rows` must cover whole
/// `br`-row blocks (the matrix's last block may be short), so callers chunk on block
/// boundaries. Appends the codes and the chunk's scale rows.
pub(super) fn fp8_rows(
    x: &[f32],
    cols: usize,
    [br, bc]: [usize; 2],
    codes: &mut Vec<u8>,
    scales: &mut Vec<u8>,
) {
    let col_blocks = cols.div_ceil(bc);
    for block in x.chunks(br * cols) {
        let mut amax = vec![0.0f32; col_blocks];
        for row in block.chunks_exact(cols) {
            for (j, &v) in row.iter().enumerate() {
                let a = &mut amax[j / bc];
                *a = a.max(v.abs());
            }
        }
        let bytes: Vec<u8> = amax
            .iter()
            .map(|&a| pow2_scale_byte(a, FP8_AMAX_FLOOR, E4M3_MAX))
            .collect();
        let inv: Vec<f32> = bytes.iter().map(|&b| 1.0 / e8m0_to_f32(b)).collect();
        for row in block.chunks_exact(cols) {
            codes.extend(
                row.iter()
                    .enumerate()
                    .map(|(j, &v)| f32_to_e4m3(v * inv[j / bc])),
            );
        }
        scales.extend_from_slice(&bytes);
    }
}

/// Quantises rows of a `cols`-wide matrix onto FP4 with one scale per 32 inputs of a row,
/// packing two codes a byte, element `2k` in the low nibble. Appends codes and scales.
pub(super) fn fp4_rows(x: &[f32], cols: usize, packed: &mut Vec<u8>, scales: &mut Vec<u8>) {
    for row in x.chunks_exact(cols) {
        for group in row.chunks(FP4_GROUP) {
            let b = fp4_block_scale(group);
            let inv = 1.0 / e8m0_to_f32(b);
            scales.push(b);
            packed.extend(
                group
                    .chunks_exact(2)
                    .map(|p| f32_to_e2m1(p[0] * inv) | (f32_to_e2m1(p[1] * inv) << 4)),
            );
        }
    }
}
