//! Integer dot products of a row of ggml blocks (Q8_0 or MXFP4 weights) with Q8_0
//! activations, as llama.cpp's CPU backend computes them (`ggml_vec_dot_q8_0_q8_0`,
//! `ggml_vec_dot_mxfp4_q8_0`): per block, the weight and activation codes multiplied in
//! integers, then scaled by both blocks' scales.
//!
//! Every family sums in one order, so their results are equal bit for bit: per block, eight
//! partial sums of four consecutive products (exact integers, `|s| ≤ 4 · 128 · 127`), each
//! times `d_w · d_x` added to its own lane's f32 accumulator by a fused multiply-add; at the
//! end the lanes as the tree `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`. A row's
//! result depends on that row alone.

use super::q8::{Q8Row, QK};
use super::{e8m0_half, Block, MXFP4_VALUES};
use crate::formats::f16_to_f32;

/// Activation rows one call takes.
pub const M_MAX: usize = 4;

/// The codes and scale of one weight block.
fn weight_block(block: Block, b: &[u8]) -> ([i8; QK], f32) {
    let mut w = [0i8; QK];
    match block {
        Block::Q8_0 => {
            for (o, &c) in w.iter_mut().zip(&b[2..34]) {
                *o = c as i8;
            }
            (w, f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
        }
        Block::Mxfp4 => {
            for (j, &c) in b[1..17].iter().enumerate() {
                w[j] = MXFP4_VALUES[(c & 0xF) as usize];
                w[j + 16] = MXFP4_VALUES[(c >> 4) as usize];
            }
            (w, e8m0_half(b[0]))
        }
        other => no_int_dots(other),
    }
}

#[cold]
fn no_int_dots(block: Block) -> ! {
    unreachable!("{} has no integer dots on Q8_0 rows", block.name())
}

/// The lanes' final sum, in the order the SIMD families take it.
fn lane_sum(a: [f32; 8]) -> f32 {
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (t[0] + t[2]) + (t[1] + t[3])
}

/// The dots of weight row `w` (whole blocks) with each row of `xs`: the portable path, and
/// the order of summation every family follows.
pub fn dots_scalar(block: Block, w: &[u8], xs: &[&Q8Row], out: &mut [f32]) {
    let mut acc = [[0.0f32; 8]; M_MAX];
    for (b, wb) in w.chunks_exact(block.bytes()).enumerate() {
        let (wq, wd) = weight_block(block, wb);
        for (x, acc) in xs.iter().zip(acc.iter_mut()) {
            let xq = &x.q[b * QK..(b + 1) * QK];
            let d = wd * x.d[b];
            for (l, a) in acc.iter_mut().enumerate() {
                let s: i32 = (4 * l..4 * l + 4)
                    .map(|j| wq[j] as i32 * xq[j] as i32)
                    .sum();
                *a = d.mul_add(s as f32, *a);
            }
        }
    }
    for (o, a) in out.iter_mut().zip(acc).take(xs.len()) {
        *o = lane_sum(a);
    }
}

/// [`dots_scalar`] on AVX2: each weight block decoded once for up to [`M_MAX`] activation
/// rows, its codes multiplied on `vpmaddubsw` (the sign moved onto the activations, as
/// llama.cpp does, so that `|w|` is unsigned).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
pub unsafe fn dots_avx2(block: Block, w: &[u8], xs: &[&Q8Row], out: &mut [f32]) {
    let blocks = w.len() / block.bytes();
    for x in xs {
        assert!(x.q.len() >= blocks * QK && x.d.len() >= blocks);
    }
    let q = |t: usize| xs[t.min(xs.len() - 1)].q.as_ptr();
    let d = |t: usize| xs[t.min(xs.len() - 1)].d.as_ptr();
    let w = [w.as_ptr()];
    // SAFETY: as the function's; every row holds `blocks` blocks (asserted).
    unsafe {
        match xs.len() {
            1 => out[0] = rows::<1, 1>(block, w, blocks, [q(0)], [d(0)])[0][0],
            2 => out[..2]
                .copy_from_slice(&rows::<1, 2>(block, w, blocks, [q(0), q(1)], [d(0), d(1)])[0]),
            3 => out[..3].copy_from_slice(
                &rows::<1, 3>(block, w, blocks, [q(0), q(1), q(2)], [d(0), d(1), d(2)])[0],
            ),
            4 => out[..4].copy_from_slice(
                &rows::<1, 4>(
                    block,
                    w,
                    blocks,
                    std::array::from_fn(q),
                    std::array::from_fn(d),
                )[0],
            ),
            n => panic!("dots_avx2 takes 1 to {M_MAX} rows, not {n}"),
        }
    }
}

/// The dots of two weight rows with one activation row, on AVX2: the two rows' streams
/// and sums are independent, which keeps more loads in flight than one row (what one
/// activation row, a decode step, needs to stream at the read roof). Each row's result is
/// [`dots_scalar`]'s.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
pub unsafe fn pair_avx2(block: Block, w: [&[u8]; 2], x: &Q8Row) -> [f32; 2] {
    let blocks = w[0].len() / block.bytes();
    assert!(w[1].len() == w[0].len() && x.q.len() >= blocks * QK && x.d.len() >= blocks);
    let (q, d) = ([x.q.as_ptr()], [x.d.as_ptr()]);
    // SAFETY: as the function's; both rows and `x` hold `blocks` blocks (asserted).
    let s = unsafe { rows::<2, 1>(block, w.map(<[u8]>::as_ptr), blocks, q, d) };
    [s[0][0], s[1][0]]
}

/// The dots of four weight rows with each of up to [`M_MAX`] activation rows, on AVX-512's
/// 32 registers (256-bit work: sixteen accumulators stay in registers): each activation
/// load serves four weight rows, where [`dots_avx2`] serves one. Each result is
/// [`dots_scalar`]'s.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-512 F and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
pub unsafe fn quad_avx512(block: Block, w: [&[u8]; 4], xs: &[&Q8Row]) -> [[f32; M_MAX]; 4] {
    let blocks = w[0].len() / block.bytes();
    assert!(w.iter().all(|r| r.len() == w[0].len()));
    for x in xs {
        assert!(x.q.len() >= blocks * QK && x.d.len() >= blocks);
    }
    let q = |t: usize| xs[t.min(xs.len() - 1)].q.as_ptr();
    let d = |t: usize| xs[t.min(xs.len() - 1)].d.as_ptr();
    let w = w.map(<[u8]>::as_ptr);
    let pad =
        |v: &[f32]| -> [f32; M_MAX] { std::array::from_fn(|t| v.get(t).copied().unwrap_or(0.0)) };
    // SAFETY: as the function's; every row holds `blocks` blocks (asserted).
    unsafe {
        match xs.len() {
            1 => rows_wide::<4, 1>(block, w, blocks, [q(0)], [d(0)]).map(|r| pad(&r)),
            2 => rows_wide::<4, 2>(block, w, blocks, [q(0), q(1)], [d(0), d(1)]).map(|r| pad(&r)),
            3 => rows_wide::<4, 3>(block, w, blocks, [q(0), q(1), q(2)], [d(0), d(1), d(2)])
                .map(|r| pad(&r)),
            4 => rows_wide::<4, 4>(
                block,
                w,
                blocks,
                std::array::from_fn(q),
                std::array::from_fn(d),
            ),
            n => panic!("quad_avx512 takes 1 to {M_MAX} rows, not {n}"),
        }
    }
}

/// The `M` dots of each of `R` weight rows ([`dots_avx2`], [`pair_avx2`]), the
/// accumulators in registers.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; each `w[r]` holds `blocks` blocks, each `q[t]` and
/// `d[t]` as many.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows<const R: usize, const M: usize>(
    block: Block,
    w: [*const u8; R],
    blocks: usize,
    q: [*const i8; M],
    d: [*const f32; M],
) -> [[f32; M]; R] {
    // SAFETY: as the function's.
    unsafe { rows_body(block, w, blocks, q, d) }
}

/// [`rows`] compiled for AVX-512 ([`quad_avx512`]): 32 registers for the sums.
///
/// # Safety
/// As [`rows`], and the CPU has AVX-512 F and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn rows_wide<const R: usize, const M: usize>(
    block: Block,
    w: [*const u8; R],
    blocks: usize,
    q: [*const i8; M],
    d: [*const f32; M],
) -> [[f32; M]; R] {
    // SAFETY: as the function's.
    unsafe { rows_body(block, w, blocks, q, d) }
}

/// The body of [`rows`] and [`rows_wide`], inlined into each, which bring its instruction
/// sets.
///
/// # Safety
/// As [`rows`]; only called from functions that enable AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rows_body<const R: usize, const M: usize>(
    block: Block,
    w: [*const u8; R],
    blocks: usize,
    q: [*const i8; M],
    d: [*const f32; M],
) -> [[f32; M]; R] {
    use std::arch::x86_64::*;
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(MXFP4_VALUES.as_ptr().cast()));
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); M]; R];
    let bytes = block.bytes();
    for b in 0..blocks {
        for r in 0..R {
            // SAFETY (every access): inside the blocks the contract promises.
            let wb = unsafe { w[r].add(b * bytes) };
            // The rows after this one, into L2 (see `crate::linear::PREFETCH`): a prefetch never
            // faults.
            _mm_prefetch(wb.wrapping_add(crate::linear::PREFETCH).cast(), _MM_HINT_T2);
            let (wq, wd) = unsafe {
                match block {
                    Block::Q8_0 => (
                        _mm256_loadu_si256(wb.add(2).cast()),
                        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                            wb.cast::<u16>().read_unaligned() as i32,
                        ))),
                    ),
                    Block::Mxfp4 => {
                        let packed = _mm_loadu_si128(wb.add(1).cast());
                        let nib = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
                        let codes = _mm256_and_si256(nib, low);
                        (_mm256_shuffle_epi8(table, codes), e8m0_half(*wb))
                    }
                    other => no_int_dots(other),
                }
            };
            let aw = _mm256_sign_epi8(wq, wq);
            for t in 0..M {
                let (xq, xd) =
                    unsafe { (_mm256_loadu_si256(q[t].add(b * QK).cast()), *d[t].add(b)) };
                let p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xq, wq));
                let p32 = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(wd * xd), p32, acc[r][t]);
            }
        }
    }
    acc.map(|row| {
        row.map(|a| {
            let t = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
            _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)))
        })
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fixed pseudo-random stream (xorshift64), for the ggml kernels' tests.
    pub(crate) struct Rng(pub(crate) u64);

    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        pub(crate) fn byte(&mut self) -> u8 {
            (self.next() >> 32) as u8
        }

        /// Uniform in `[-a, a)`.
        pub(crate) fn float(&mut self, a: f32) -> f32 {
            ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a
        }
    }

    fn random_row(block: Block, blocks: usize, rng: &mut Rng) -> Vec<u8> {
        let mut w = Vec::new();
        for _ in 0..blocks {
            match block {
                // Scales of either sign and codes across the whole range, -128 included.
                Block::Q8_0 => {
                    let d = half::f16::from_f32(rng.float(0.05));
                    w.extend(d.to_bits().to_le_bytes());
                    w.extend((0..32).map(|_| rng.byte()));
                }
                Block::Mxfp4 => {
                    w.push(100 + rng.byte() % 50);
                    w.extend((0..16).map(|_| rng.byte()));
                }
                other => unreachable!("{} has no integer dots", other.name()),
            }
        }
        w
    }

    fn q8_row(k: usize, rng: &mut Rng) -> Q8Row {
        let mut x: Vec<f32> = (0..k).map(|_| rng.float(3.0)).collect();
        Q8Row::round_trip(&mut x);
        let mut r = Q8Row::default();
        assert!(r.quantize(&x));
        r
    }

    /// The integer dots equal the f64 sum of the decoded weights times the activations'
    /// values within f32 rounding, one row's bits do not depend on the others, and AVX2
    /// (one, two or four weight rows at a time) gives the portable path's bits.
    #[test]
    fn integer_dots_are_the_products_of_the_values() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for block in [Block::Q8_0, Block::Mxfp4] {
            let k = 32 * 40;
            let w = random_row(block, k / 32, &mut rng);
            let mut wv = vec![0.0f32; k];
            block.decode_row(&w, &mut wv);
            let rows: Vec<Q8Row> = (0..M_MAX).map(|_| q8_row(k, &mut rng)).collect();
            let xs: Vec<&Q8Row> = rows.iter().collect();
            let mut got = [0.0f32; M_MAX];
            dots_scalar(block, &w, &xs, &mut got);
            for (m, x) in rows.iter().enumerate() {
                let term = |j: usize| wv[j] as f64 * x.q[j] as f64 * x.d[j / 32] as f64;
                let want: f64 = (0..k).map(term).sum();
                let size: f64 = (0..k).map(|j| term(j).abs()).sum();
                let err = (got[m] as f64 - want).abs();
                assert!(err <= 1e-6 * size, "{block:?} row {m}: {err} of {size}");
            }
            for (m, x) in xs.iter().enumerate() {
                let mut one = [0.0f32; 1];
                dots_scalar(block, &w, &[x], &mut one);
                assert_eq!(one[0].to_bits(), got[m].to_bits());
            }
            #[cfg(target_arch = "x86_64")]
            if crate::cpu::detected() >= crate::cpu::Isa::Avx2 {
                let mut simd = [0.0f32; M_MAX];
                // SAFETY: the CPU has AVX2 and FMA.
                unsafe { dots_avx2(block, &w, &xs, &mut simd) };
                assert_eq!(simd.map(f32::to_bits), got.map(f32::to_bits), "{block:?}");
                let w2 = random_row(block, k / 32, &mut rng);
                let mut second = [0.0f32; 1];
                dots_scalar(block, &w2, &xs[..1], &mut second);
                // SAFETY: as above.
                let pair = unsafe { pair_avx2(block, [&w, &w2], xs[0]) };
                assert_eq!(
                    pair.map(f32::to_bits),
                    [got[0], second[0]].map(f32::to_bits)
                );
                if crate::cpu::detected() == crate::cpu::Isa::Avx512 {
                    for n in 1..=M_MAX {
                        // SAFETY: the CPU has AVX-512 F and VL besides AVX2 and FMA.
                        let quad = unsafe { quad_avx512(block, [&w, &w2, &w2, &w], &xs[..n]) };
                        for (r, wr) in [&w, &w2, &w2, &w].into_iter().enumerate() {
                            let mut want = [0.0f32; M_MAX];
                            dots_scalar(block, wr, &xs[..n], &mut want);
                            let bits =
                                |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(&quad[r][..n]),
                                bits(&want[..n]),
                                "{block:?}: {n}, {r}"
                            );
                        }
                    }
                }
            }
        }
    }
}
