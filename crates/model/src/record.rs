//! How the cache pools hold a KV vector (window rows and compressed entries) and an indexer
//! key: as the f32 the attention computed with (reference numerics), or, in official
//! numerics, as the packed records DeepSeek's quantisation makes lossless:
//!
//! - **KV record**, V4: the `nd = head_dim − rope_dim` non-RoPE dims as FP8 e4m3 codes, one
//!   E8M0 scale byte per 64 of them, then the RoPE dims as bf16; padded to 4 bytes. V4: 448 +
//!   7 + 128 = 583 → 584 bytes, the size of vLLM's `fp8_ds_mla` record (2048 as f32).
//!   V4.1: every dim as FP8 codes, one E8M0 byte per 32: 512 + 16 = 528 bytes, the record
//!   vLLM writes for V4.1 on SM100 (`deepseek_v41/attention.py` 130-138).
//! - **Indexer key**, V4: `index_head_dim` FP4 e2m1 codes, two a byte (low nibble first),
//!   then one E8M0 scale byte per 32: V4 64 + 4 = 68 bytes (512 as f32), vLLM's MXFP4 key.
//!   V4.1: FP8 codes, then one E8M0 byte for the row: 128 + 1 → 132 bytes, vLLM's V4.1 FP8
//!   key (`deepseek_v41/common/ops/indexer_k_store.py` 243-266, which keeps the scale in 4).
//!
//! Official numerics rounds every stored value onto exactly these grids first
//! ([`Numerics::kv`], [`Numerics::indexer`]), so storing is lossless: a record decodes to
//! the bits that were stored. The cache's rows are `f32` words; a record occupies
//! [`kv_words`] / [`key_words`] of them and is read and written as bytes.

use crate::config::ModelConfig;
use crate::numerics::{Numerics, INDEXER_BLOCK, KV_BLOCK};
use deepinfer_kernels::formats::{
    bf16_to_f32, e2m1_to_f32, e4m3_to_f32, e8m0_to_f32, f32_to_bf16, f32_to_e4m3,
};
use deepinfer_kernels::quant::{f32_to_e2m1, fp4_block_scale, fp8_block_scale, MX_BLOCK};

fn words(bytes: usize) -> usize {
    bytes.div_ceil(size_of::<f32>())
}

fn packed(c: &ModelConfig) -> bool {
    c.numerics.packs_cache()
}

/// A KV record's layout: the first `codes` dims as FP8 codes with one E8M0 byte per `block`
/// of them, the rest (`bf16` dims) as bf16.
struct KvLayout {
    codes: usize,
    block: usize,
    bf16: usize,
}

impl KvLayout {
    fn of(c: &ModelConfig) -> Self {
        match c.numerics {
            Numerics::OfficialV41 => KvLayout {
                codes: c.head_dim,
                block: MX_BLOCK,
                bf16: 0,
            },
            _ => KvLayout {
                codes: c.head_dim - c.qk_rope_head_dim,
                block: KV_BLOCK,
                bf16: c.qk_rope_head_dim,
            },
        }
    }

    fn scales(&self) -> usize {
        self.codes.div_ceil(self.block)
    }
}

/// Cache words (f32-sized) one KV vector takes.
pub fn kv_words(c: &ModelConfig) -> usize {
    if packed(c) {
        let l = KvLayout::of(c);
        words(l.codes + l.scales() + 2 * l.bf16)
    } else {
        c.head_dim
    }
}

/// Whether indexer keys are FP8 with one scale per row (V4.1) rather than FP4 in 32-blocks.
fn fp8_keys(c: &ModelConfig) -> bool {
    c.numerics == Numerics::OfficialV41
}

/// Cache words one indexer key takes.
pub fn key_words(c: &ModelConfig) -> usize {
    let d = c.index_head_dim;
    match (packed(c), fp8_keys(c)) {
        (false, _) => d,
        (true, true) => words(d + 1),
        (true, false) => words(d.div_ceil(2) + d.div_ceil(INDEXER_BLOCK)),
    }
}

/// Stores the KV vector `row` (`head_dim` floats) into `rec` ([`kv_words`] words).
pub fn store_kv(c: &ModelConfig, row: &[f32], rec: &mut [f32]) {
    if !packed(c) {
        rec.copy_from_slice(row);
        return;
    }
    let l = KvLayout::of(c);
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(rec);
    let (codes, rest) = bytes.split_at_mut(l.codes);
    let (scales, rest) = rest.split_at_mut(l.scales());
    let (nope, rope) = row.split_at(l.codes);
    store_fp8(nope, l.block, codes, scales);
    for (o, &v) in rest.chunks_exact_mut(2).zip(rope) {
        o.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
    }
}

/// Reads a KV vector back from `rec` into `row` (`head_dim` floats).
pub fn load_kv(c: &ModelConfig, rec: &[f32], row: &mut [f32]) {
    if !packed(c) {
        row.copy_from_slice(rec);
        return;
    }
    let l = KvLayout::of(c);
    let bytes: &[u8] = bytemuck::cast_slice(rec);
    let (codes, rest) = bytes.split_at(l.codes);
    let (scales, rest) = rest.split_at(l.scales());
    let (nope, rope) = row.split_at_mut(l.codes);
    load_fp8(codes, scales, l.block, nope);
    for (o, b) in rope.iter_mut().zip(rest.chunks_exact(2)) {
        *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// `values` as FP8 codes with one E8M0 scale byte per `block` (values already on that grid).
fn store_fp8(values: &[f32], block: usize, codes: &mut [u8], scales: &mut [u8]) {
    for ((chunk, out), scale) in values
        .chunks(block)
        .zip(codes.chunks_mut(block))
        .zip(scales.iter_mut())
    {
        *scale = fp8_block_scale(chunk);
        let s = e8m0_to_f32(*scale);
        for (o, &v) in out.iter_mut().zip(chunk) {
            *o = f32_to_e4m3(v / s);
        }
    }
}

/// The values [`store_fp8`] stored.
fn load_fp8(codes: &[u8], scales: &[u8], block: usize, out: &mut [f32]) {
    for ((o, chunk), &scale) in out.chunks_mut(block).zip(codes.chunks(block)).zip(scales) {
        let s = e8m0_to_f32(scale);
        for (v, &b) in o.iter_mut().zip(chunk) {
            *v = e4m3_to_f32(b) * s;
        }
    }
}

/// Stores the indexer key `row` (`index_head_dim` floats) into `rec` ([`key_words`] words).
pub fn store_key(c: &ModelConfig, row: &[f32], rec: &mut [f32]) {
    if !packed(c) {
        rec.copy_from_slice(row);
        return;
    }
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(rec);
    if fp8_keys(c) {
        let (codes, scale) = bytes.split_at_mut(row.len());
        return store_fp8(row, row.len(), codes, &mut scale[..1]);
    }
    let (codes, scales) = bytes.split_at_mut(row.len().div_ceil(2));
    codes.fill(0);
    for (b, block) in row.chunks(INDEXER_BLOCK).enumerate() {
        scales[b] = fp4_block_scale(block);
        let s = e8m0_to_f32(scales[b]);
        for (i, &v) in block.iter().enumerate() {
            let k = b * INDEXER_BLOCK + i;
            codes[k / 2] |= f32_to_e2m1(v / s) << (4 * (k % 2));
        }
    }
}

/// Reads an indexer key back from `rec` into `row` (`index_head_dim` floats).
pub fn load_key(c: &ModelConfig, rec: &[f32], row: &mut [f32]) {
    if !packed(c) {
        row.copy_from_slice(rec);
        return;
    }
    let bytes: &[u8] = bytemuck::cast_slice(rec);
    if fp8_keys(c) {
        let (codes, scale) = bytes.split_at(row.len());
        return load_fp8(&codes[..row.len()], &scale[..1], row.len(), row);
    }
    let (codes, scales) = bytes.split_at(row.len().div_ceil(2));
    for (k, o) in row.iter_mut().enumerate() {
        let s = e8m0_to_f32(scales[k / INDEXER_BLOCK]);
        *o = e2m1_to_f32(codes[k / 2] >> (4 * (k % 2))) * s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(numerics: Numerics) -> ModelConfig {
        let mut c = crate::synth::preset("tiny").unwrap().config;
        (c.head_dim, c.qk_rope_head_dim, c.index_head_dim) = (512, 64, 128);
        c.numerics = numerics;
        c
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 * 0.731 + seed as f32).sin() * 3.0).powi(3))
            .collect()
    }

    #[test]
    fn records_have_vllms_sizes() {
        let c = config(Numerics::Official);
        assert_eq!(kv_words(&c) * 4, 584);
        assert_eq!(key_words(&c) * 4, 68);
        let v41 = config(Numerics::OfficialV41);
        assert_eq!(kv_words(&v41) * 4, 528);
        assert_eq!(key_words(&v41) * 4, 132);
        let r = config(Numerics::Reference);
        assert_eq!((kv_words(&r), key_words(&r)), (512, 128));
    }

    /// What official numerics rounds comes back bit for bit; reference stores plain f32.
    #[test]
    fn rounded_values_survive_a_record() {
        for n in [
            Numerics::Official,
            Numerics::OfficialV41,
            Numerics::Reference,
        ] {
            let c = config(n);
            for seed in 0..20 {
                let mut kv = values(512, seed);
                kv[seed as usize] = 0.0;
                n.kv(&mut kv, 512, 64);
                let mut rec = vec![0.0; kv_words(&c)];
                store_kv(&c, &kv, &mut rec);
                let mut back = vec![0.0; 512];
                load_kv(&c, &rec, &mut back);
                assert_eq!(back, kv, "{n} kv seed {seed}");

                let mut key = values(128, seed + 100);
                if seed == 3 {
                    key.fill(0.0);
                }
                n.indexer(&mut key, 128);
                let mut rec = vec![0.0; key_words(&c)];
                store_key(&c, &key, &mut rec);
                let mut back = vec![0.0; 128];
                load_key(&c, &rec, &mut back);
                assert_eq!(back, key, "{n} key seed {seed}");
            }
        }
    }
}
