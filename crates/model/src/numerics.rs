//! Which rounding the forward pass computes (docs/MODEL.md §5): the one place that decides every
//! point where DeepSeek's own inference code quantises an activation.
//!
//! - [`Numerics::Reference`] (the default) computes everything in f32 from the stored
//!   weights, which is what HF transformers computes in float32.
//! - [`Numerics::Official`] adds the quantisation DeepSeek trained with and runs with
//!   (`inference/model.py`): every FP8/FP4-weight projection sees its input through FP8 e4m3
//!   in 128-wide blocks, the window and compressed KV keep their non-RoPE dims through FP8 in
//!   64-wide blocks and their RoPE dims as bf16 (the official KV cache is bf16, and vLLM's
//!   record stores them so), and the indexer's queries and keys go through a Hadamard
//!   rotation and FP4 in 32-wide blocks. The products whose weights are BF16 or F32 there
//!   (the compressors' `wkv`/`wgate`, the indexer's `weights_proj`, the router, `wo_a` —
//!   dequantised to bf16 in `model.py` — and the head) read their input rounded to bf16:
//!   `model.py` holds those activations in bf16, and vLLM and SGLang feed those products
//!   bf16 activations too, whatever else they place differently. DeepSeek's code carries
//!   its other activations in bf16 as well, because it runs on bf16 hardware; those
//!   roundings are not reproduced (vLLM and SGLang place them differently, and the mHC
//!   mixes, pooling and norms are f32 products there), so the official mode's other
//!   activations between the quantisation points are f32. Rounding the dense products'
//!   inputs also lets the kernels multiply them on bf16 dot products with the f32 kernels'
//!   exact results (`deepinfer_kernels::linear`).
//! - [`Numerics::OfficialV41`] is what `official` means for DeepSeek-V4.1, whose own inference
//!   code is not published: the quantisation vLLM 0.33 serves it with on SM100 GPUs
//!   (docs/MODEL.md §8.8). Every FP8/FP4-weight projection — `wo_a` and the Engram `wkv`
//!   included — sees MXFP8 input (32-blocks, no amax floor); window rows and compressed
//!   entries keep all their dims as FP8 in 32-blocks (the 528-byte record); indexer queries
//!   and keys are FP8 with one scale per row and no rotation; the routing weights scale the
//!   experts' outputs rather than `w2`'s inputs. The bf16 inputs of the dense products and
//!   the f32 elsewhere are as for V4.
//! - [`Numerics::Gguf`] is llama.cpp's CPU backend on a GGUF file: each product's input
//!   quantised to its weights' `vec_dot_type` — Q8_0 (32-blocks, f16 scale) for Q8_0, MXFP4
//!   and the other 32-blocks, Q8_K (256-blocks, f32 scale) for the K-quants, bf16 for BF16,
//!   none for F32. Every product rounds its own input ([`Inputs::VecDot`]), as each of
//!   llama.cpp's does: one activation row may feed matrices stored in different types (a
//!   quantizer stores some of V4's BF16 and F32 matrices — the head, the compressors, mHC's
//!   — in blocks too). That is what lets the kernels multiply Q8_0 and MXFP4 in integers
//!   (`deepinfer_kernels::ggml::dot`). Not reproduced: llama.cpp's f16 KV cache (the cache
//!   stays f32), and the f16 rounding of an F16 matrix's input (F16 is widened at load).

use deepinfer_kernels::formats::{bf16_to_f32, f32_to_bf16};
use deepinfer_kernels::linear::Inputs;
use deepinfer_kernels::quant::{
    fp4_round_trip, fp8_round_trip, hadamard, mxfp8_round_trip, FP8_AMAX_FLOOR, MXFP8_AMAX_FLOOR,
    MX_BLOCK,
};
use std::fmt;
use std::str::FromStr;

/// Block width of the FP8 activation quantisation before a projection.
pub const ACT_BLOCK: usize = 128;
/// Block width of the FP8 round trip of a KV vector's non-RoPE dims.
pub const KV_BLOCK: usize = 64;
/// Block width of the FP4 round trip of the indexer's queries and keys.
pub const INDEXER_BLOCK: usize = 32;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    #[default]
    Reference,
    /// DeepSeek-V4's inference code.
    Official,
    /// DeepSeek-V4.1 as vLLM serves it in FP8: `official` for a V4.1 model
    /// ([`Self::for_model`]).
    OfficialV41,
    /// llama.cpp's CPU arithmetic on a GGUF file.
    Gguf,
}

impl Numerics {
    /// What `self` means for a model: `official` on DeepSeek-V4.1 is [`Self::OfficialV41`].
    pub fn for_model(self, v41: bool) -> Self {
        match (self, v41) {
            (Numerics::Official, true) => Numerics::OfficialV41,
            (Numerics::OfficialV41, false) => Numerics::Official,
            (n, _) => n,
        }
    }

    /// Before a projection whose weights are stored in FP8 or FP4 (`wq_a`, `wq_b`, `wkv`,
    /// `wo_b`, the indexer's `wq_b`, every expert's `w1`/`w3`/`w2`, the MTP block's
    /// `e_proj`/`h_proj`; for V4.1 also `wo_a` and Engram's `wkv`): each `width`-wide row of
    /// `x` through FP8 in 128-blocks (V4) or MXFP8 (V4.1).
    pub fn projection_input(self, x: &mut [f32], width: usize) {
        match self {
            Numerics::Reference => {}
            Numerics::Official => x
                .chunks_exact_mut(width)
                .for_each(|row| fp8_round_trip(row, ACT_BLOCK)),
            Numerics::OfficialV41 => x.chunks_exact_mut(width).for_each(mxfp8_round_trip),
            // The product quantises its own copy, to its weights' format ([`Self::inputs`]).
            Numerics::Gguf => {}
        }
    }

    /// What a projection's product is told of its input ([`Self::projection_input`]'s
    /// rounding, or the rounding the product does itself).
    pub fn inputs(self) -> Inputs {
        match self {
            Numerics::Reference => Inputs::F32,
            Numerics::Official | Numerics::OfficialV41 => Inputs::Bf16Exact,
            Numerics::Gguf => Inputs::VecDot,
        }
    }

    /// The blocks [`Self::projection_input`] rounds a row in, `(width, amax floor)`: what a
    /// rank holding part of the row needs to round its part alike
    /// (`tensor_parallel::round_split_input`). `None` in reference numerics.
    pub fn projection_blocks(self) -> Option<(usize, f32)> {
        match self {
            Numerics::Reference | Numerics::Gguf => None,
            Numerics::Official => Some((ACT_BLOCK, FP8_AMAX_FLOOR)),
            Numerics::OfficialV41 => Some((MX_BLOCK, MXFP8_AMAX_FLOOR)),
        }
    }

    /// `wo_a`'s input, `width`-wide rows of one output group: a dense product's (bf16) in
    /// DeepSeek's V4 code, which dequantises `wo_a`; an MXFP8 projection's in V4.1's; a
    /// Q8_0 one's in llama.cpp's.
    pub fn wo_a_input(self, x: &mut [f32], width: usize) {
        match self {
            // A GGUF file holds `wo_a` as Q8_0 (llama.cpp's converter requantises it).
            Numerics::OfficialV41 | Numerics::Gguf => self.projection_input(x, width),
            _ => self.dense_input(x),
        }
    }

    /// Whether the routing weights scale each expert's output (V4.1's MoE finalize) rather
    /// than its `w2` input (DeepSeek's V4 code, and reference numerics, where it is the
    /// same product).
    pub fn weights_after_down(self) -> bool {
        self == Numerics::OfficialV41
    }

    /// What a product whose input no numerics rounds (mHC's mixes) is told of it: the
    /// values as they are, but in llama.cpp's numerics, where every product on a quantised
    /// matrix quantises its own input, [`Inputs::VecDot`] (a GGUF quantizer may store
    /// mHC's matrices in blocks).
    pub fn unrounded_inputs(self) -> Inputs {
        match self {
            Numerics::Gguf => Inputs::VecDot,
            _ => Inputs::F32,
        }
    }

    /// Whether [`Self::projection_input`] leaves its values exact in bf16 (an FP8 value times
    /// a power of two), so the kernels may multiply them in bf16 without loss
    /// ([`Inputs::Bf16Exact`]).
    pub fn bf16_exact_inputs(self) -> bool {
        self.inputs() == Inputs::Bf16Exact
    }

    /// Floats a rounded copy of `n` activations needs ([`Self::projection_view`]): none in
    /// reference numerics, which reads the activations as they are.
    pub fn copy_len(self, n: usize) -> usize {
        match self {
            Numerics::Reference | Numerics::Gguf => 0,
            _ => n,
        }
    }

    /// `x` as a projection reads it while other consumers read `x` itself: `x` in
    /// reference numerics, else its rounded copy in `buf` (of [`Self::copy_len`] floats).
    pub fn projection_view<'a>(self, x: &'a [f32], width: usize, buf: &'a mut [f32]) -> &'a [f32] {
        if matches!(self, Numerics::Reference | Numerics::Gguf) {
            return x;
        }
        buf.copy_from_slice(x);
        self.projection_input(buf, width);
        buf
    }

    /// Before a product whose weights are BF16/F32 in DeepSeek's code (the compressors'
    /// `wkv`/`wgate`, the indexer's `weights_proj`, the router, `wo_a`, the head): `x`
    /// through bf16 (round to nearest even).
    pub fn dense_input(self, x: &mut [f32]) {
        // In llama.cpp's numerics the product rounds its own input, to bf16 for BF16
        // weights and to its blocks' format for quantised ones ([`Self::inputs`]).
        if matches!(self, Numerics::Official | Numerics::OfficialV41) {
            x.iter_mut().for_each(|v| *v = bf16_to_f32(f32_to_bf16(*v)));
        }
    }

    /// `x` as a dense product reads it ([`Self::dense_input`]) while other consumers read
    /// `x` itself: `x` in reference numerics, else its rounded copy in `buf` (of
    /// [`Self::copy_len`] floats).
    pub fn dense_view<'a>(self, x: &'a [f32], buf: &'a mut [f32]) -> &'a [f32] {
        if matches!(self, Numerics::Reference | Numerics::Gguf) {
            return x;
        }
        buf.copy_from_slice(x);
        self.dense_input(buf);
        buf
    }

    /// A window or compressed KV vector, `[nope | rope]` rows of `width`. V4: the first
    /// `width − rope_dim` dims of each through FP8 in 64-blocks, the RoPE dims through bf16;
    /// V4.1: every dim through FP8 in 32-blocks. What the cache then holds is exactly what
    /// the attention computed with.
    pub fn kv(self, rows: &mut [f32], width: usize, rope_dim: usize) {
        match self {
            Numerics::Reference => {}
            Numerics::Official => {
                for row in rows.chunks_exact_mut(width) {
                    let (nope, rope) = row.split_at_mut(width - rope_dim);
                    fp8_round_trip(nope, KV_BLOCK);
                    rope.iter_mut()
                        .for_each(|v| *v = bf16_to_f32(f32_to_bf16(*v)));
                }
            }
            Numerics::OfficialV41 => rows
                .chunks_exact_mut(width)
                .for_each(|row| fp8_round_trip(row, MX_BLOCK)),
            Numerics::Gguf => {}
        }
    }

    /// Whether the cache pools keep packed records ([`crate::record`]) rather than f32.
    pub fn packs_cache(self) -> bool {
        matches!(self, Numerics::Official | Numerics::OfficialV41)
    }

    /// Whether the indexer rotates its queries and keys ([`Self::indexer`]), which needs a
    /// power-of-two head.
    pub fn rotates_indexer(self) -> bool {
        self == Numerics::Official
    }

    /// An indexer query head or key (`head_dim` wide, rows of it). V4: rotated by the
    /// orthonormal Hadamard transform, then through FP4 in 32-blocks (the rotation leaves
    /// `q · k` unchanged, so keys and queries must both take it or neither); V4.1: through
    /// FP8 with one scale per row.
    pub fn indexer(self, rows: &mut [f32], head_dim: usize) {
        match self {
            Numerics::Reference | Numerics::Gguf => {}
            Numerics::Official => {
                for row in rows.chunks_exact_mut(head_dim) {
                    hadamard(row);
                    fp4_round_trip(row, INDEXER_BLOCK);
                }
            }
            Numerics::OfficialV41 => rows
                .chunks_exact_mut(head_dim)
                .for_each(|row| fp8_round_trip(row, head_dim)),
        }
    }

    /// The name `--numerics` takes: V4.1's rounding is `official` too.
    pub fn name(self) -> &'static str {
        match self {
            Numerics::Reference => "reference",
            Numerics::Official | Numerics::OfficialV41 => "official",
            Numerics::Gguf => "gguf",
        }
    }
}

impl fmt::Display for Numerics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Numerics {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "reference" => Ok(Numerics::Reference),
            "official" => Ok(Numerics::Official),
            "gguf" => Ok(Numerics::Gguf),
            other => Err(format!(
                "unknown numerics `{other}` (expected `reference`, `official` or `gguf`)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_changes_nothing_and_official_rounds_only_its_dims() {
        let x: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin() * 3.1).collect();
        let mut y = x.clone();
        Numerics::Reference.projection_input(&mut y, 128);
        Numerics::Reference.kv(&mut y, 128, 64);
        Numerics::Reference.indexer(&mut y, 128);
        Numerics::Reference.dense_input(&mut y);
        assert_eq!(y, x);
        let mut d = x.clone();
        Numerics::Official.dense_input(&mut d);
        for (r, v) in d.iter().zip(&x) {
            assert_eq!(r.to_bits() & 0xFFFF, 0, "dense inputs are bf16");
            assert!(
                (r - v).abs() <= v.abs() * 2f32.powi(-8),
                "and rounded to nearest"
            );
        }
        let mut kv = x.clone();
        Numerics::Official.kv(&mut kv, 128, 64);
        for row in 0..2 {
            let (a, b) = (&kv[row * 128..], &x[row * 128..]);
            for (x, y) in a[64..128].iter().zip(&b[64..128]) {
                assert_eq!(*x, bf16_to_f32(f32_to_bf16(*y)), "RoPE dims through bf16");
            }
            assert_ne!(a[..64], b[..64], "non-RoPE dims are rounded");
        }
        let mut p = x.clone();
        Numerics::Official.projection_input(&mut p, 256);
        let mut want = x.clone();
        fp8_round_trip(&mut want[..128], 128);
        fp8_round_trip(&mut want[128..], 128);
        assert_eq!(p, want);
    }

    /// V4.1's rounding: MXFP8 projection inputs (no floor), every KV dim FP8 in 32-blocks,
    /// indexer rows FP8 with one scale and no rotation; `official` means it on V4.1 only.
    #[test]
    fn v41_rounds_where_vllm_does() {
        let v41 = Numerics::Official.for_model(true);
        assert_eq!(v41, Numerics::OfficialV41);
        assert_eq!(v41.for_model(false), Numerics::Official);
        assert_eq!(Numerics::Reference.for_model(true), Numerics::Reference);
        assert_eq!(v41.name(), "official");
        let x: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin() * 3.1).collect();
        let mut p = x.clone();
        v41.projection_input(&mut p, 64);
        let mut want = x.clone();
        want.chunks_mut(32).for_each(mxfp8_round_trip);
        assert_eq!(p, want);
        let mut kv = x.clone();
        v41.kv(&mut kv, 64, 16);
        let mut want = x.clone();
        want.chunks_mut(32).for_each(|b| fp8_round_trip(b, 32));
        assert_eq!(kv, want, "the RoPE dims are FP8 too");
        let mut key = x.clone();
        v41.indexer(&mut key, 64);
        let mut want = x.clone();
        want.chunks_mut(64).for_each(|b| fp8_round_trip(b, 64));
        assert_eq!(key, want, "one scale per row, no rotation");
        let mut wo_a = x.clone();
        v41.wo_a_input(&mut wo_a, 64);
        assert_eq!(wo_a, p, "wo_a reads MXFP8");
        let mut wo_a = x.clone();
        Numerics::Official.wo_a_input(&mut wo_a, 64);
        let mut bf16 = x.clone();
        Numerics::Official.dense_input(&mut bf16);
        assert_eq!(wo_a, bf16, "V4's wo_a reads bf16");
        assert!(v41.weights_after_down() && !Numerics::Official.weights_after_down());
        assert!(!v41.rotates_indexer());
    }

    #[test]
    fn names_parse_back() {
        for n in [Numerics::Reference, Numerics::Official, Numerics::Gguf] {
            assert_eq!(n.name().parse::<Numerics>(), Ok(n));
        }
        assert!("bf16"
            .parse::<Numerics>()
            .unwrap_err()
            .contains("reference"));
    }
}
