//! The stored bytes of FP8, FP4, BF16 and F32 tensors decode, with the format codecs, to
//! exactly the generator's draws rounded onto each format.

use deepinfer_kernels::formats::{e2m1_to_f32, e4m3_to_f32, e8m0_to_f32};
use safetensors::Dtype;

use super::tiny::{planned, stored_bytes, write_tiny};
use crate::checkpoint::Checkpoint;
use crate::synth::*;

/// Asserts that `code` is a round-to-nearest-even encoding of `x` among `grid` (every
/// finite code with its value): no code is nearer, and a tie went to the even code.
fn assert_nearest_even(grid: &[(u8, f32)], code: u8, x: f32, at: (usize, usize)) {
    let value = grid.iter().find(|g| g.0 == code).map(|g| g.1).unwrap();
    let best = grid
        .iter()
        .map(|g| (g.1 - x).abs())
        .fold(f32::INFINITY, f32::min);
    let d = (value - x).abs();
    assert_eq!(d, best, "{at:?}: {x} stored as {value}");
    let tied = grid
        .iter()
        .filter(|g| (g.1 - x).abs() == best && g.1 != value);
    if tied.count() > 0 && value != 0.0 {
        assert_eq!(code & 1, 0, "{at:?}: tie at {x} not rounded to even");
    }
}

#[test]
fn stored_bytes_decode_to_the_drawn_values_rounded() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny(dir.path(), 3, SHARD_BYTES);
    let ck = Checkpoint::open(dir.path()).unwrap();

    // FP8: every element is the nearest e4m3 multiple of its block's scale, and each scale is
    // the smallest power of two that fits the block.
    let name = "layers.1.attn.wq_b.weight";
    let t = planned(name);
    let drawn = draw_values(&t, 3).unwrap();
    let (dtype, shape, codes) = stored_bytes(dir.path(), name);
    assert_eq!((dtype, shape.clone()), (Dtype::F8_E4M3, t.shape.clone()));
    let (sdtype, sshape, scales) = stored_bytes(dir.path(), "layers.1.attn.wq_b.scale");
    assert_eq!(sdtype, Dtype::F8_E8M0);
    let (rows, cols) = (shape[0], shape[1]);
    assert_eq!(sshape, [rows.div_ceil(128), cols.div_ceil(128)]);
    let grid: Vec<(u8, f32)> = (0..=255u8)
        .map(|c| (c, e4m3_to_f32(c)))
        .filter(|g| g.1.is_finite())
        .collect();
    let mut decoded = vec![0.0; rows * cols];
    let mut amax = vec![0.0f32; sshape[0] * sshape[1]];
    for i in 0..rows {
        for j in 0..cols {
            let b = (i / 128) * sshape[1] + j / 128;
            let s = e8m0_to_f32(scales[b]);
            let (x, code) = (drawn[i * cols + j], codes[i * cols + j]);
            assert_nearest_even(&grid, code, x / s, (i, j));
            decoded[i * cols + j] = e4m3_to_f32(code) * s;
            amax[b] = amax[b].max(x.abs());
        }
    }
    for (b, &a) in amax.iter().enumerate() {
        let ratio = a / e8m0_to_f32(scales[b]);
        assert!(
            ratio > 224.0 && ratio <= 448.0,
            "block {b}: amax/scale {ratio}"
        );
    }
    assert_eq!(
        ck.tensor_f32(name, &shape).unwrap(),
        decoded,
        "loader agrees"
    );

    // FP4: low nibble = even element, one power-of-two scale per 32 inputs.
    let name = "layers.2.ffn.experts.3.w2.weight";
    let t = planned(name);
    let drawn = draw_values(&t, 3).unwrap();
    let (dtype, shape, packed) = stored_bytes(dir.path(), name);
    assert_eq!((dtype, shape.clone()), (Dtype::I8, t.shape.clone()));
    let (rows, cols) = (shape[0], 2 * shape[1]);
    let (sdtype, sshape, scales) = stored_bytes(dir.path(), "layers.2.ffn.experts.3.w2.scale");
    assert_eq!(
        (sdtype, sshape.clone()),
        (Dtype::F8_E8M0, vec![rows, cols / 32])
    );
    let grid: Vec<(u8, f32)> = (0..16u8).map(|c| (c, e2m1_to_f32(c))).collect();
    let mut decoded = vec![0.0; rows * cols];
    for i in 0..rows {
        for j in 0..cols {
            let s = e8m0_to_f32(scales[i * (cols / 32) + j / 32]);
            let byte = packed[i * cols / 2 + j / 2];
            let code = if j % 2 == 0 { byte & 0xF } else { byte >> 4 };
            assert_nearest_even(&grid, code, drawn[i * cols + j] / s, (i, j));
            decoded[i * cols + j] = e2m1_to_f32(code) * s;
        }
        for g in 0..cols / 32 {
            let a = drawn[i * cols + g * 32..i * cols + g * 32 + 32]
                .iter()
                .fold(0.0f32, |m, v| m.max(v.abs()));
            let ratio = a / e8m0_to_f32(scales[i * (cols / 32) + g]);
            assert!(ratio > 3.0 && ratio <= 6.0, "row {i} group {g}: {ratio}");
        }
    }
    assert_eq!(ck.tensor_f32(name, &[rows, cols]).unwrap(), decoded);

    // BF16 and F32 tensors hold the draws rounded / as drawn.
    let t = planned("layers.0.attn.attn_sink");
    assert_eq!(
        ck.tensor_f32(&t.name, &t.shape).unwrap(),
        draw_values(&t, 3).unwrap()
    );
    let t = planned("embed.weight");
    let want: Vec<f32> = draw_values(&t, 3)
        .unwrap()
        .iter()
        .map(|&x| half::bf16::from_f32(x).to_f32())
        .collect();
    assert_eq!(ck.tensor_f32(&t.name, &t.shape).unwrap(), want);
}
