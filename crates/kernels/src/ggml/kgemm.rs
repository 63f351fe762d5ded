//! A GEMM for the K-quant products on Q8_K rows ([`BLOCKS`]: [`super::kdot`]'s, and Q3_K
//! and Q5_K): the weights of four rows are unpacked once per super-block ([`Unpacked`]) and
//! multiplied against every activation row of the step, where [`super::kdot`] decodes each
//! super-block again for every group of four activation rows.
//!
//! Every block type unpacks to one form, so one kernel multiplies them all: 256 unsigned
//! codes `u`, and per block of 16 values a scale `S_j`, a correction `C_j` and an offset
//! multiplier `M_j`, with
//! `A = Σ_j S_j Σ_{l ∈ j} u_l x_l − Σ_j C_j bsum_j` and `B = Σ_j M_j bsum_j`
//! (`bsum_j` the activation codes' sum over block `j`). These are the integers
//! [`super::kdot`] computes (exact in `i32`, so any order of summation gives them), and the
//! super-block adds `factor · ((d · d_x) · A − (dmin · d_x) · B)` to the row's sum in
//! [`super::kdot`]'s float steps. The results are therefore [`super::kdot`]'s bit for bit,
//! at any batch size and on every family: a row's result depends on that row alone.

use super::grids::{grids, signs};
use super::half;
use super::iquants::iq2_xxs_group;
use super::kquants::{self, QK_K};
use super::q8k::Q8KRow;
use super::Block;

/// The blocks the GEMM multiplies: [`super::kdot::BLOCKS`], and Q3_K and Q5_K, which only
/// it multiplies in integers (at every batch size).
pub const BLOCKS: [Block; 6] = [
    Block::Q2K,
    Block::Q3K,
    Block::Q4K,
    Block::Q5K,
    Block::Q6K,
    Block::Iq2Xxs,
];

/// Weight rows one kernel call takes.
pub const ROWS: usize = 4;

/// Activation rows from which the products take the GEMM (below it, [`super::kdot`]
/// reads each weight row once for up to four activation rows; the bits are the same).
pub const FROM: usize = 4;

/// One super-block of one weight row in the form the kernels multiply (see the module).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct Unpacked {
    /// The codes, each at most 127, so that `vpmaddubsw`'s pairs never saturate
    /// (`2 · 127 · 127 < 2^15`; activation codes are within ±127).
    pub u: [u8; QK_K],
    /// `S_j` for each 16-bit lane of `vpmaddubsw`'s results: lane `k` (values `2k`, `2k+1`)
    /// belongs to block `k / 8`.
    pub s: [i16; QK_K / 2],
    /// `−C_j`.
    pub c: [i16; 16],
    /// `M_j`.
    pub m: [i16; 16],
    pub d: f32,
    pub dmin: f32,
    pub factor: f32,
}

impl Default for Unpacked {
    fn default() -> Self {
        Unpacked {
            u: [0; QK_K],
            s: [0; QK_K / 2],
            c: [0; 16],
            m: [0; 16],
            d: 0.0,
            dmin: 0.0,
            factor: 1.0,
        }
    }
}

impl Unpacked {
    /// Unpacks super-block `wb` of one of [`super::kdot::BLOCKS`].
    pub fn unpack(&mut self, block: Block, wb: &[u8]) {
        let mut s = [0i16; 16];
        (self.c, self.m, self.factor) = ([0; 16], [0; 16], 1.0);
        match block {
            Block::Q2K => self.q2_k(wb, &mut s),
            Block::Q3K => self.q3_k(wb, &mut s),
            Block::Q4K => self.q45_k(&wb[16..144], wb, &mut s, |_, _| 0),
            Block::Q5K => {
                let qh = &wb[16..48];
                self.q45_k(&wb[48..176], wb, &mut s, |sub, l| ((qh[l] >> sub) & 1) << 4)
            }
            Block::Q6K => self.q6_k(wb, &mut s),
            Block::Iq2Xxs => self.iq2_xxs(wb, &mut s),
            other => unreachable!("{} has no integer GEMM", other.name()),
        }
        for (k, o) in self.s.iter_mut().enumerate() {
            *o = s[k / 8];
        }
    }

    /// Q2_K: four 2-bit planes per 32 code bytes (as [`kquants::q2_k`] reads them); a scale
    /// byte's low nibble is `S_j`, its high nibble `M_j`.
    fn q2_k(&mut self, wb: &[u8], s: &mut [i16; 16]) {
        for (j, &sc) in wb[..16].iter().enumerate() {
            (s[j], self.m[j]) = ((sc & 0xF) as i16, (sc >> 4) as i16);
        }
        for (half_no, q) in wb[16..80].chunks_exact(32).enumerate() {
            for plane in 0..4 {
                let u = &mut self.u[128 * half_no + 32 * plane..][..32];
                for (o, &c) in u.iter_mut().zip(q) {
                    *o = (c >> (2 * plane)) & 3;
                }
            }
        }
        (self.d, self.dmin) = (half(wb, 80), half(wb, 82));
    }

    /// Q3_K: a code's two low bits from its plane (as in Q2_K), less 4 where its `hmask`
    /// bit is clear (as [`kquants::q3_k`] reads them); kept as `code + 4` (0 to 7), the 4
    /// taken off through `C_j = 4 · S_j`; `S_j` a six-bit scale less 32.
    fn q3_k(&mut self, wb: &[u8], s: &mut [i16; 16]) {
        let (hmask, qs) = (&wb[..32], &wb[32..96]);
        for (j, &sc) in kquants::q3_k_scales(&wb[96..108]).iter().enumerate() {
            s[j] = sc as i16;
            self.c[j] = -4 * s[j];
        }
        for (half_no, q) in qs.chunks_exact(32).enumerate() {
            for plane in 0..4 {
                let bit = 1u8 << (4 * half_no + plane);
                let u = &mut self.u[128 * half_no + 32 * plane..][..32];
                for (l, o) in u.iter_mut().enumerate() {
                    let high = if hmask[l] & bit != 0 { 4 } else { 0 };
                    *o = ((q[l] >> (2 * plane)) & 3) + high;
                }
            }
        }
        (self.d, self.dmin) = (half(wb, 108), 0.0);
    }

    /// Q4_K and Q5_K: per 64 values, 32 code bytes whose low nibbles are the first 32 and
    /// high nibbles the next, `high(sub-block, l)` adding Q5_K's fifth bit (0 or 16); a
    /// sub-block of 32 is two blocks of 16 with its scale and offset.
    fn q45_k(
        &mut self,
        qs: &[u8],
        wb: &[u8],
        s: &mut [i16; 16],
        high: impl Fn(usize, usize) -> u8,
    ) {
        for j in 0..8 {
            let (sc, m) = kquants::scale_min(j, &wb[4..16]);
            (s[2 * j], s[2 * j + 1]) = (sc as i16, sc as i16);
            (self.m[2 * j], self.m[2 * j + 1]) = (m as i16, m as i16);
        }
        for (i, q) in qs.chunks_exact(32).enumerate() {
            for (l, &c) in q.iter().enumerate() {
                self.u[64 * i + l] = (c & 0xF) + high(2 * i, l);
                self.u[64 * i + 32 + l] = (c >> 4) + high(2 * i + 1, l);
            }
        }
        (self.d, self.dmin) = (half(wb, 0), half(wb, 2));
    }

    /// Q6_K: a code's low four bits from `ql`, its high two from `qh` (as
    /// [`kquants::q6_k`] reads them), kept unsigned; the 32 it is less of taken off
    /// through `C_j = 32 · S_j`.
    fn q6_k(&mut self, wb: &[u8], s: &mut [i16; 16]) {
        let (ql, qh) = (&wb[..128], &wb[128..192]);
        for (j, &sc) in wb[192..208].iter().enumerate() {
            s[j] = sc as i8 as i16;
            self.c[j] = -32 * s[j];
        }
        for n in 0..2 {
            for g in 0..4 {
                for l in 0..32 {
                    let byte = ql[64 * n + 32 * (g % 2) + l];
                    let nib = if g < 2 { byte & 0xF } else { byte >> 4 };
                    self.u[128 * n + 32 * g + l] = nib | (((qh[32 * n + l] >> (2 * g)) & 3) << 4);
                }
            }
        }
        (self.d, self.dmin) = (half(wb, 208), 0.0);
    }

    /// IQ2_XXS: each grid point with its signs, plus 64 to make it unsigned (points are at
    /// most 43), the 64 taken off through `C_j = 64 · S_j`; `S_j = 2 s + 1` per 32 values,
    /// and ggml's `1/8` as the factor.
    fn iq2_xxs(&mut self, wb: &[u8], s: &mut [i16; 16]) {
        let grid = &grids().iq2xxs;
        for ib in 0..8 {
            let (idx, sg) = iq2_xxs_group(wb, ib);
            let scale = 2 * (sg >> 28) as i16 + 1;
            (s[2 * ib], s[2 * ib + 1]) = (scale, scale);
            (self.c[2 * ib], self.c[2 * ib + 1]) = (-64 * scale, -64 * scale);
            for l in 0..4 {
                let point = grid.point(((idx >> (8 * l)) & 0xFF) as usize);
                let sign = signs(sg >> (7 * l));
                for (j, &p) in point.iter().enumerate() {
                    let w = if sign & (1 << j) != 0 { -p } else { p };
                    self.u[32 * ib + 8 * l + j] = (w + 64) as u8;
                }
            }
        }
        (self.d, self.dmin, self.factor) = (half(wb, 0), 0.0, 0.125);
    }

    /// `(A, B)` against one activation super-block: the portable sums.
    pub fn sums(&self, xq: &[i8], bsums: &[i16]) -> (i32, i32) {
        let mut a = 0i32;
        for (k, &s) in self.s.iter().enumerate() {
            let pair = (2 * k..2 * k + 2).map(|l| self.u[l] as i32 * xq[l] as i32);
            a += s as i32 * pair.sum::<i32>();
        }
        let dot = |v: &[i16; 16]| (0..16).map(|j| v[j] as i32 * bsums[j] as i32).sum::<i32>();
        (a + dot(&self.c), dot(&self.m))
    }

    /// The super-block's term in a row's sum, from its integers: [`super::kdot`]'s float
    /// steps.
    #[inline(always)]
    pub fn term(&self, xd: f32, a: i32, b: i32) -> f32 {
        ((self.d * xd) * a as f32 - (self.dmin * xd) * b as f32) * self.factor
    }
}

/// The integer GEMM's kernels: `sb4(ups, xs, b, acc)` adds super-block `b` of four weight
/// rows ([`Unpacked`]) to `acc[t][r]` for every activation row `xs[t]`.
pub type Kernel = unsafe fn(&[Unpacked; ROWS], &[Q8KRow], usize, &mut [[f32; ROWS]]);

/// The portable kernel.
///
/// # Safety
/// None: safe to call; `unsafe` only to share [`Kernel`]'s type.
pub unsafe fn sb4_scalar(ups: &[Unpacked; ROWS], xs: &[Q8KRow], b: usize, acc: &mut [[f32; ROWS]]) {
    for (x, acc) in xs.iter().zip(acc) {
        let (xq, bsums) = (
            &x.q[b * QK_K..(b + 1) * QK_K],
            &x.bsums[16 * b..16 * b + 16],
        );
        for (up, acc) in ups.iter().zip(acc) {
            let (a, m) = up.sums(xq, bsums);
            *acc += up.term(x.d[b], a, m);
        }
    }
}

/// Every weight row of `w` (whole super-blocks of `block`, `rb` bytes a row; `rows` of
/// them, at most [`ROWS`], the last repeated to fill a call) against every row of `xs`:
/// `acc[t][r]` is row `r`'s dot with `xs[t]`, [`super::kdot`]'s bits.
pub fn rows4(block: Block, w: &[&[u8]], xs: &[Q8KRow], acc: &mut [[f32; ROWS]], kernel: Kernel) {
    assert!((1..=ROWS).contains(&w.len()) && acc.len() == xs.len());
    let blocks = w[0].len() / block.bytes();
    for x in xs {
        assert!(x.q.len() >= blocks * QK_K && x.bsums.len() >= 16 * blocks);
    }
    acc.fill([0.0; ROWS]);
    let mut ups = [Unpacked::default(); ROWS];
    for b in 0..blocks {
        for (r, up) in ups.iter_mut().enumerate() {
            let wr = w[r.min(w.len() - 1)];
            up.unpack(block, &wr[b * block.bytes()..(b + 1) * block.bytes()]);
        }
        // SAFETY: every activation row holds `blocks` super-blocks (asserted); the kernel's
        // family was checked by whoever chose it.
        unsafe { kernel(&ups, xs, b, acc) };
    }
}

/// [`sb4_scalar`] on AVX-512 VNNI: per activation row, the four rows' codes on 512-bit
/// `vpmaddubsw`, weighted by their scales with `vpdpwssd`, the corrections and offsets on
/// 256-bit words, the four rows' sums reduced together, the float steps four rows wide.
///
/// # Safety
/// The CPU has AVX-512 F, BW, VL and VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
pub unsafe fn sb4_avx512(ups: &[Unpacked; ROWS], xs: &[Q8KRow], b: usize, acc: &mut [[f32; ROWS]]) {
    use std::arch::x86_64::*;
    let terms = Terms::new(ups);
    for (x, acc) in xs.iter().zip(acc) {
        // SAFETY (every load): `rows4` asserted the activation row's length; `Unpacked`'s
        // arrays are 64-byte aligned and as long as read.
        let xq = unsafe { x.q.as_ptr().add(b * QK_K) };
        let xv: [__m512i; 4] =
            std::array::from_fn(|c| unsafe { _mm512_loadu_si512(xq.add(64 * c).cast()) });
        let bs = unsafe { _mm256_loadu_si256(x.bsums.as_ptr().add(16 * b).cast()) };
        let mut a = [_mm256_setzero_si256(); ROWS];
        let mut m = [_mm256_setzero_si256(); ROWS];
        for r in 0..ROWS {
            let up = &ups[r];
            let mut v = _mm512_setzero_si512();
            for (c, &xc) in xv.iter().enumerate() {
                let u = unsafe { _mm512_load_si512(up.u.as_ptr().add(64 * c).cast()) };
                let s = unsafe { _mm512_load_si512(up.s.as_ptr().add(32 * c).cast()) };
                v = _mm512_dpwssd_epi32(v, _mm512_maddubs_epi16(u, xc), s);
            }
            let y = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
            let c = unsafe { _mm256_load_si256(up.c.as_ptr().cast()) };
            a[r] = _mm256_dpwssd_epi32(y, bs, c);
            m[r] = _mm256_madd_epi16(bs, unsafe { _mm256_load_si256(up.m.as_ptr().cast()) });
        }
        terms.add(x.d[b], a, m, acc);
    }
}

/// [`sb4_scalar`] on AVX2: as [`sb4_avx512`], on 256-bit words, `vpmaddwd` then an add
/// where VNNI fuses them.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub unsafe fn sb4_avx2(ups: &[Unpacked; ROWS], xs: &[Q8KRow], b: usize, acc: &mut [[f32; ROWS]]) {
    use std::arch::x86_64::*;
    let terms = Terms::new(ups);
    for (x, acc) in xs.iter().zip(acc) {
        // SAFETY (every load): as in `sb4_avx512`.
        let xq = unsafe { x.q.as_ptr().add(b * QK_K) };
        let bs = unsafe { _mm256_loadu_si256(x.bsums.as_ptr().add(16 * b).cast()) };
        let mut a = [_mm256_setzero_si256(); ROWS];
        let mut m = [_mm256_setzero_si256(); ROWS];
        for c in 0..8 {
            let xc = unsafe { _mm256_loadu_si256(xq.add(32 * c).cast()) };
            for r in 0..ROWS {
                let u = unsafe { _mm256_load_si256(ups[r].u.as_ptr().add(32 * c).cast()) };
                let s = unsafe { _mm256_load_si256(ups[r].s.as_ptr().add(16 * c).cast()) };
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xc), s);
                a[r] = _mm256_add_epi32(a[r], p);
            }
        }
        for r in 0..ROWS {
            let c = unsafe { _mm256_load_si256(ups[r].c.as_ptr().cast()) };
            a[r] = _mm256_add_epi32(a[r], _mm256_madd_epi16(bs, c));
            m[r] = _mm256_madd_epi16(bs, unsafe { _mm256_load_si256(ups[r].m.as_ptr().cast()) });
        }
        terms.add(x.d[b], a, m, acc);
    }
}

/// The float steps of four weight rows' super-blocks, four lanes wide, for the SIMD
/// kernels: [`Unpacked::term`]'s operations in its order, added to the rows' sums.
#[cfg(target_arch = "x86_64")]
struct Terms {
    d: std::arch::x86_64::__m128,
    dmin: std::arch::x86_64::__m128,
    factor: std::arch::x86_64::__m128,
}

#[cfg(target_arch = "x86_64")]
impl Terms {
    #[target_feature(enable = "avx2")]
    fn new(ups: &[Unpacked; ROWS]) -> Self {
        use std::arch::x86_64::_mm_setr_ps;
        let lanes =
            |f: fn(&Unpacked) -> f32| _mm_setr_ps(f(&ups[0]), f(&ups[1]), f(&ups[2]), f(&ups[3]));
        Terms {
            d: lanes(|u| u.d),
            dmin: lanes(|u| u.dmin),
            factor: lanes(|u| u.factor),
        }
    }

    /// Adds to `acc` each row's term from its integers `A` (`a`) and `B` (`m`), one vector
    /// of lanes per row, against an activation super-block of scale `xd`.
    #[target_feature(enable = "avx2")]
    fn add(
        &self,
        xd: f32,
        a: [std::arch::x86_64::__m256i; ROWS],
        m: [std::arch::x86_64::__m256i; ROWS],
        acc: &mut [f32; ROWS],
    ) {
        use std::arch::x86_64::*;
        let xd = _mm_set1_ps(xd);
        let t = _mm_sub_ps(
            _mm_mul_ps(_mm_mul_ps(self.d, xd), _mm_cvtepi32_ps(reduce4(a))),
            _mm_mul_ps(_mm_mul_ps(self.dmin, xd), _mm_cvtepi32_ps(reduce4(m))),
        );
        // SAFETY: `acc` is four floats.
        let sum = _mm_add_ps(
            unsafe { _mm_loadu_ps(acc.as_ptr()) },
            _mm_mul_ps(t, self.factor),
        );
        // SAFETY: as above.
        unsafe { _mm_storeu_ps(acc.as_mut_ptr(), sum) };
    }
}

/// The four vectors' lane sums, as one vector (integer adds: any order is exact).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn reduce4(v: [std::arch::x86_64::__m256i; 4]) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::*;
    let t01 = _mm256_add_epi32(
        _mm256_unpacklo_epi32(v[0], v[1]),
        _mm256_unpackhi_epi32(v[0], v[1]),
    );
    let t23 = _mm256_add_epi32(
        _mm256_unpacklo_epi32(v[2], v[3]),
        _mm256_unpackhi_epi32(v[2], v[3]),
    );
    let s = _mm256_add_epi32(
        _mm256_unpacklo_epi64(t01, t23),
        _mm256_unpackhi_epi64(t01, t23),
    );
    _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::dot::tests::Rng;
    use crate::ggml::kdot::{kdots_scalar, BLOCKS};

    /// Random super-blocks with checkpoint-like scales.
    fn random_rows(block: Block, rows: usize, blocks: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
        (0..rows)
            .map(|_| {
                let mut w: Vec<u8> = (0..blocks * block.bytes()).map(|_| rng.byte()).collect();
                for b in w.chunks_exact_mut(block.bytes()) {
                    block.set_scales(
                        b,
                        half::f16::from_f32(0.01 + 0.002 * rng.float(1.0)).to_bits(),
                    );
                }
                w
            })
            .collect()
    }

    /// On every block type, at batch sizes around the row groups, every kernel gives the
    /// portable kernel's bits for every weight and activation row (rows fewer than
    /// [`ROWS`] included); those are [`kdots_scalar`]'s where it multiplies the type, and
    /// within f32 rounding (1e-6 of `Σ|w·x|`) of the decoded weights times the activations'
    /// values, summed in f64.
    #[test]
    fn the_gemm_gives_kdots_bits() {
        let mut rng = Rng(0x5EED_1234_ABCD_0042);
        let mut kernels: Vec<(&str, Kernel)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if crate::cpu::detected() >= crate::cpu::Isa::Avx2 {
                kernels.push(("avx2", sb4_avx2));
            }
            if crate::cpu::vnni_detected() {
                kernels.push(("avx512", sb4_avx512));
            }
        }
        for block in super::BLOCKS {
            let blocks = 3;
            let w = random_rows(block, ROWS, blocks, &mut rng);
            for m in [1, 2, 5, 17] {
                let xs: Vec<Q8KRow> = (0..m)
                    .map(|_| {
                        let x: Vec<f32> = (0..blocks * QK_K).map(|_| rng.float(3.0)).collect();
                        let mut r = Q8KRow::default();
                        r.quantize(&x);
                        r
                    })
                    .collect();
                let refs: Vec<&Q8KRow> = xs.iter().collect();
                for rows in [ROWS, 3, 1] {
                    let wr: Vec<&[u8]> = w[..rows].iter().map(Vec::as_slice).collect();
                    let mut first = vec![[0.0f32; ROWS]; m];
                    rows4(block, &wr, &xs, &mut first, sb4_scalar);
                    for r in 0..rows {
                        let mut wv = vec![0.0f32; blocks * QK_K];
                        block.decode_row(wr[r], &mut wv);
                        for (t, x) in refs.iter().enumerate() {
                            let term =
                                |j: usize| wv[j] as f64 * x.q[j] as f64 * x.d[j / QK_K] as f64;
                            let want: f64 = (0..wv.len()).map(term).sum();
                            let size: f64 = (0..wv.len()).map(|j| term(j).abs()).sum();
                            let err = (first[t][r] as f64 - want).abs();
                            assert!(
                                err <= 1e-6 * size,
                                "{block:?} row {r}, activation {t}: {err:e} of {size:e}"
                            );
                            if BLOCKS.contains(&block) {
                                let mut kd = [0.0f32];
                                kdots_scalar(block, wr[r], &[x], &mut kd);
                                assert_eq!(
                                    first[t][r].to_bits(),
                                    kd[0].to_bits(),
                                    "{block:?}: kdot's"
                                );
                            }
                        }
                    }
                    for (name, kernel) in &kernels {
                        let mut acc = vec![[0.0f32; ROWS]; m];
                        rows4(block, &wr, &xs, &mut acc, *kernel);
                        for (t, (a, f)) in acc.iter().zip(&first).enumerate() {
                            assert_eq!(
                                a[..rows].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                                f[..rows].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                                "{block:?} {name}: {rows} rows, activation {t} of {m}"
                            );
                        }
                    }
                }
            }
        }
    }
}
