//! The AVX-512 family (sixteen f32 lanes, AVX-512 F + BW): its vector operations and format
//! decodes, run by the loops of [`super::simd`]. The FP8 and BF16 decodes are
//! [`super::avx2`]'s on registers twice as wide (see `avx2.rs` for how they work). FP4 is decoded differently: sixteen lanes hold a
//! whole table of the E2M1 values, so each nibble is looked up (`vpermps`) in the values
//! times its group's scale, about half the work of going through E4M3 (FP4 decode is what
//! bounds its products on Zen 4, whose cores run 512-bit operations as two halves).

use super::avx2::Avx2;
use super::simd::{self, kernel_entries, RowKind, Simd};
use super::{Fp4Scales, Kernels, Prefetch, RowFormat};
use std::arch::x86_64::*;

/// `2^(b-127)` for every E8M0 byte `b` in the fast range (others never looked up).
static FP4_SCALE: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut b = 32;
    while b <= 158 {
        t[b] = f32::from_bits((b as u32) << 23);
        b += 1;
    }
    t
};

/// The sixteen E2M1 values, indexed by their code: a `vpermps` table.
const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

const E4M3_FIELDS: i32 = 0x87F0_0000u32 as i32;

/// The sum of the sixteen lanes, as a halving tree (lane `i` plus lane `i + 8`, then `+ 4`,
/// `+ 2`, `+ 1`): spelled out rather than left to `_mm512_reduce_add_ps`, because the GEMM
/// path folds its per-lane partial sums in this same order (see `gemm.rs`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn hsum(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    crate::vector::avx2::hsum(_mm256_add_ps(_mm512_castps512_ps256(v), hi))
}

/// The four f32 vectors of a 64-byte FP8 load (vector `q` lane `j` = byte `4j + q`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn e4m3_vectors(v: __m512i) -> [__m512; 4] {
    let mask = _mm512_set1_epi32(E4M3_FIELDS);
    let t = _mm512_srai_epi16(v, 4);
    let t2 = _mm512_srai_epi16(_mm512_slli_epi16(v, 8), 4);
    [
        _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(t2, 16), mask)),
        _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(t, 16), mask)),
        _mm512_castsi512_ps(_mm512_and_si512(t2, mask)),
        _mm512_castsi512_ps(_mm512_and_si512(t, mask)),
    ]
}

/// The eight f32 vectors of chunk `c` (64 bytes, 128 codes) of row `r`, each times its
/// group's scale: per 32 elements (16 bytes, one group or part of one), the even elements
/// (low nibbles) then the odd ones.
///
/// Each 16 bytes are widened to one 32-bit lane a byte and looked up in the sixteen E2M1
/// values times the group's scale (`vpermps` reads the low four bits of each lane, so the
/// high nibble needs only a shift): about half the operations of decoding through E4M3 as
/// the AVX2 kernels do, and the scaled values are exact (a power of two times an E2M1 value,
/// normal for every scale of the fast range).
///
/// # Safety
/// Chunk `c` lies inside row `r`, whose scales `s` covers.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn e2m1_vectors(w: *const u8, s: &Fp4Scales, r: usize, c: usize) -> [__m512; 8] {
    // SAFETY: the table holds sixteen floats.
    let values = unsafe { _mm512_loadu_ps(E2M1.as_ptr()) };
    let mut out = [_mm512_setzero_ps(); 8];
    for t in 0..4 {
        // SAFETY (both): by the contract.
        let b = unsafe { s.of(r, 128 * c + 32 * t) };
        let codes = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(w.add(64 * c + 16 * t).cast()) });
        let table = _mm512_mul_ps(values, _mm512_set1_ps(FP4_SCALE[b as usize]));
        out[2 * t] = _mm512_permutexvar_ps(codes, table);
        out[2 * t + 1] = _mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table);
    }
    out
}

/// The E2M1 values as bf16 bits, indexed by the low five bits of a 16-bit lane (`vpermw`
/// reads no more): the code, and one bit of whatever lies above it, so both halves alike.
const E2M1_BF16: [u16; 32] = {
    let v: [u16; 8] = [
        0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
    ];
    let mut t = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = v[i & 7] | if i & 8 != 0 { 0x8000 } else { 0 };
        i += 1;
    }
    t
};

/// `vpermb` indices that widen bytes `16 · (2h + 1) + l` and `16 · 2h + l` of a chunk into the
/// low and high 16-bit halves of lane `l` (the masked-off bytes between them become zero):
/// lane `l` then holds element `l` of two consecutive groups, the first group's in the high
/// half, which `vdpbf16ps` multiplies first.
const PAIR_IDX: [[u8; 64]; 2] = {
    let mut t = [[0u8; 64]; 2];
    let mut h = 0;
    while h < 2 {
        let mut l = 0;
        while l < 16 {
            t[h][4 * l] = (16 * (2 * h + 1) + l) as u8;
            t[h][4 * l + 2] = (16 * 2 * h + l) as u8;
            l += 1;
        }
        h += 1;
    }
    t
};

/// FP4 on bf16 dot products (`vdpbf16ps`), for activations exact in bf16: the same sums, in
/// the same order, as [`Fp4`](super::simd::Fp4) on f32 FMAs, hence the same results.
///
/// The f32 kernel sums, per output lane `l`, an even stream (the low nibbles: elements
/// `32t + 2l` of groups `t = 0..3` of a chunk, in that order) and an odd one (`32t + 2l + 1`).
/// Here a chunk is four vectors of bf16 pairs: lane `l` of vector `2h` holds elements
/// `64h + 2l` (high half) and `64h + 32 + 2l` (low half), of vector `2h + 1` the odd ones.
/// `vdpbf16ps` adds to lane `l` the high half's product, rounds, then the low half's and
/// rounds (measured on Zen 4 against FMAs in each order and a fused sum: this order, every
/// lane of 3.2 million), each product exact (two bf16 significands fit in f32's): two FMAs
/// of the even stream's chain, in its order. What it does not do is keep subnormals
/// (inputs or results flush to zero); the matrices it runs ([`QMatrix::dots_ok`]) and the
/// activations it is given ([`crate::linear::prepare::pack_pairs`]) keep every
/// product and partial sum normal.
///
/// Weights: the bytes of two groups widened to 16-bit lanes in one `vpermb`, each nibble
/// looked up in the bf16 E2M1 values (`vpermw`; the high nibbles after a shift), and the
/// group's scale added to the exponent of the nonzero ones (a power of two, so exact):
/// two byte-to-lane widenings and four lookups a chunk, where the f32 decode takes four
/// widenings and eight lookups, and half the multiply-adds.
///
/// [`QMatrix::dots_ok`]: crate::matrix::QMatrix
pub(super) struct Fp4Dots;

impl RowKind<Avx512, 4> for Fp4Dots {
    type Elem = u8;
    type Extra = Fp4Scales;
    const BYTES: usize = 64;
    #[inline(always)]
    unsafe fn chunk(w: *const u8, e: &Fp4Scales, r: usize, c: usize) -> [__m512; 4] {
        // SAFETY: by the contract.
        unsafe { e2m1_pairs(w, e, r, c) }
    }
    #[inline(always)]
    unsafe fn madd(w: __m512, x: __m512, acc: __m512) -> __m512 {
        // SAFETY: reinterpreting 16 lanes of bf16 pairs; the entry point enables AVX-512 BF16.
        let pairs = |v: __m512| unsafe { std::mem::transmute::<__m512, __m512bh>(v) };
        unsafe { _mm512_dpbf16_ps(acc, pairs(w), pairs(x)) }
    }
}

/// The four vectors of bf16 pairs of chunk `c` (64 bytes) of FP4 row `r` (see [`Fp4Dots`]).
///
/// # Safety
/// Chunk `c` lies inside row `r`, whose scales `s` covers; every scale is in the
/// dot-product range.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn e2m1_pairs(w: *const u8, s: &Fp4Scales, r: usize, c: usize) -> [__m512; 4] {
    // SAFETY (loads): the chunk, the tables.
    let (bytes, table) = unsafe {
        (
            _mm512_loadu_si512(w.add(64 * c).cast()),
            _mm512_loadu_si512(E2M1_BF16.as_ptr().cast()),
        )
    };
    let magnitude = _mm512_set1_epi16(7);
    let mut out = [_mm512_setzero_ps(); 4];
    for (h, idx) in PAIR_IDX.iter().enumerate() {
        // SAFETY: the index table holds 64 bytes.
        let idx = unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) };
        let lo = _mm512_maskz_permutexvar_epi8(0x5555_5555_5555_5555, idx, bytes);
        let hi = _mm512_srli_epi16(lo, 4);
        // The scales' exponents, the first group's in the high halves (b - 127 fits i16).
        // SAFETY: both groups lie in the row.
        let (first, second) =
            unsafe { (s.of(r, 128 * c + 64 * h), s.of(r, 128 * c + 64 * h + 32)) };
        let exp = |b: u8| (((b as i32 - 127) << 7) as u16) as u32;
        let add = _mm512_set1_epi32(((exp(first) << 16) | exp(second)) as i32);
        for (v, codes) in [(2 * h, lo), (2 * h + 1, hi)] {
            let values = _mm512_permutexvar_epi16(codes, table);
            let nonzero = _mm512_test_epi16_mask(codes, magnitude);
            let scaled = _mm512_mask_add_epi16(values, nonzero, values, add);
            out[v] = _mm512_castsi512_ps(scaled);
        }
    }
    out
}

/// BF16 on bf16 dot products (`vdpbf16ps`), for activations exact in bf16: the same sums,
/// in the same order, as [`Bf16`](super::simd::Bf16) on f32 FMAs, hence the same results.
///
/// The f32 kernel sums, per output lane `l` of a 64-element chunk, an even stream (elements
/// `2l`, then `32 + 2l`) and an odd one (`2l + 1`, then `33 + 2l`). Here a chunk is two
/// vectors of bf16 pairs, lane `l` of the first holding elements `2l` (high half) and
/// `32 + 2l` (low half), of the second `2l + 1` and `33 + 2l`: `vdpbf16ps` adds the high
/// half's product and rounds, then the low half's (see [`Fp4Dots`]), each product exact,
/// so two FMAs of the stream's chain in its order. The stored pairs (element `2l` low,
/// `2l + 1` high) become those with a shift and a blend each; the f32 decode takes as many
/// operations, and here half the multiply-adds follow. Subnormals flush, so only matrices
/// whose weights keep every product and partial sum normal run it
/// ([`QMatrix::dots_ok`](crate::matrix::QMatrix)), with activations checked as they are
/// packed ([`crate::linear::prepare::pack_pairs`]).
pub(super) struct Bf16Dots;

impl RowKind<Avx512, 2> for Bf16Dots {
    type Elem = u16;
    type Extra = ();
    const BYTES: usize = 128;
    #[inline(always)]
    unsafe fn chunk(w: *const u16, _: &(), _: usize, c: usize) -> [__m512; 2] {
        // SAFETY: by the contract, the chunk's 64 values lie in the row.
        let (v0, v1) = unsafe {
            (
                _mm512_loadu_si512(w.add(64 * c).cast()),
                _mm512_loadu_si512(w.add(64 * c + 32).cast()),
            )
        };
        // The low 16-bit halves of the 32-bit lanes (the even 16-bit positions) from the
        // second half of the chunk.
        const LOW: __mmask32 = 0x5555_5555;
        let even = _mm512_mask_blend_epi16(LOW, _mm512_slli_epi32(v0, 16), v1);
        let odd = _mm512_mask_blend_epi16(LOW, v0, _mm512_srli_epi32(v1, 16));
        [_mm512_castsi512_ps(even), _mm512_castsi512_ps(odd)]
    }
    #[inline(always)]
    unsafe fn madd(w: __m512, x: __m512, acc: __m512) -> __m512 {
        // SAFETY: as Fp4Dots::madd.
        unsafe { <Fp4Dots as RowKind<Avx512, 4>>::madd(w, x, acc) }
    }
}

/// `vpshufb` controls that place, in each 32-bit lane of bytes `b0..b3`, the even pair's
/// bytes (`b0` high, `b2` low) or the odd pair's (`b1`, `b3`) in the high bytes of its two
/// 16-bit halves (the low bytes zero).
const FP8_PAIRS: [[i8; 16]; 2] = {
    let mut t = [[-128i8; 16]; 2];
    let mut j = 0;
    while j < 4 {
        t[0][4 * j + 1] = (4 * j + 2) as i8;
        t[0][4 * j + 3] = (4 * j) as i8;
        t[1][4 * j + 1] = (4 * j + 3) as i8;
        t[1][4 * j + 3] = (4 * j + 1) as i8;
        j += 1;
    }
    t
};

/// The E4M3 subnormals `m · 2^-9` (`m` = 0..7) as bf16 bits, indexed by `m` (`vpermw` reads
/// five bits; the rest repeat).
const E4M3_SUB_BF16: [u16; 32] = {
    let v: [u16; 8] = [
        0x0000, 0x3B00, 0x3B80, 0x3BC0, 0x3C00, 0x3C20, 0x3C40, 0x3C60,
    ];
    let mut t = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = v[i & 7];
        i += 1;
    }
    t
};

/// The even (`which` 0) or odd pairs of a 64-byte FP8 chunk `v` as bf16 (see [`Fp8Dots`]).
///
/// # Safety
/// AVX-512 F and BW are present.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn e4m3_pair(v: __m512i, which: usize) -> __m512 {
    // SAFETY: constant tables of the sizes read.
    let (ctl, sub) = unsafe {
        (
            _mm_loadu_si128(FP8_PAIRS[which].as_ptr().cast()),
            _mm512_loadu_si512(E4M3_SUB_BF16.as_ptr().cast()),
        )
    };
    let t = _mm512_shuffle_epi8(v, _mm512_broadcast_i32x4(ctl));
    // s eeee mmm at bits 15..8 → s at 15, eeee at 10..7, mmm at 6..4.
    let r = _mm512_and_si512(_mm512_srai_epi16(t, 4), _mm512_set1_epi16(0x87F0u16 as i16));
    let normal = _mm512_test_epi16_mask(t, _mm512_set1_epi16(0x7800));
    let r = _mm512_mask_add_epi16(r, normal, r, _mm512_set1_epi16(120 << 7));
    let r = _mm512_mask_permutexvar_epi16(r, !normal, _mm512_srli_epi16(t, 8), sub);
    // The looked-up subnormals (and zeros) get their sign back: r | (t & sign).
    let sign = _mm512_set1_epi32(0x8000_8000u32 as i32);
    _mm512_castsi512_ps(_mm512_ternarylogic_epi32::<0xF8>(r, t, sign))
}

/// FP8 on bf16 dot products (`vdpbf16ps`), for activations scaled by their blocks' scales and
/// exact in bf16: the same sums, in the same order, as [`Fp8`](super::simd::Fp8) on f32 FMAs.
///
/// The f32 kernel's vector `q` lane `j` holds byte `4j + q` of a 64-byte chunk, and lane `j`
/// sums an even stream (bytes `4j`, then `4j + 2`) and an odd one (`4j + 1`, `4j + 3`). Here
/// the chunk is two vectors of bf16 pairs in that order (`vpshufb` puts each byte in the high
/// byte of its 16-bit half), and each E4M3 code becomes its exact value in bf16: sign and
/// the seven exponent and mantissa bits moved into place with the exponent rebiased (+120),
/// subnormals (`m · 2^-9`) looked up. The products are exact and summed in the f32 kernel's
/// order (see [`Fp4Dots`]); the f32 kernel's weights carry `2^-120` and its activations
/// `2^64`, these neither, so the sums are the same up to that power of two.
pub(super) struct Fp8Dots;

impl RowKind<Avx512, 2> for Fp8Dots {
    type Elem = u8;
    type Extra = ();
    const BYTES: usize = 64;
    #[inline(always)]
    unsafe fn chunk(w: *const u8, _: &(), _: usize, c: usize) -> [__m512; 2] {
        // SAFETY: by the contract, the chunk's 64 bytes lie in the row.
        unsafe {
            let v = _mm512_loadu_si512(w.add(64 * c).cast());
            [e4m3_pair(v, 0), e4m3_pair(v, 1)]
        }
    }
    #[inline(always)]
    unsafe fn madd(w: __m512, x: __m512, acc: __m512) -> __m512 {
        // SAFETY: as Fp4Dots::madd.
        unsafe { <Fp4Dots as RowKind<Avx512, 4>>::madd(w, x, acc) }
    }
}

/// The four f32 vectors of 64 BF16 values: per 32, the even elements then the odd ones.
///
/// # Safety
/// `p` points at 64 readable values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn bf16_vectors(p: *const u16) -> [__m512; 4] {
    let hi = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
    // SAFETY: by the contract.
    let (v0, v1) = unsafe {
        (
            _mm512_loadu_si512(p.cast()),
            _mm512_loadu_si512(p.add(32).cast()),
        )
    };
    [
        _mm512_castsi512_ps(_mm512_slli_epi32(v0, 16)),
        _mm512_castsi512_ps(_mm512_and_si512(v0, hi)),
        _mm512_castsi512_ps(_mm512_slli_epi32(v1, 16)),
        _mm512_castsi512_ps(_mm512_and_si512(v1, hi)),
    ]
}

/// The AVX-512 family.
pub(crate) struct Avx512;

impl Simd for Avx512 {
    type F = __m512;
    const LANES: usize = 16;
    // SAFETY (every method): the trait's contract (AVX-512 F + BW present, pointers valid).
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m512 {
        _mm512_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn halves(lo: f32, hi: f32) -> __m512 {
        _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(lo), _mm512_set1_ps(hi))
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn hsum(v: __m512) -> f32 {
        unsafe { hsum(v) }
    }
    #[inline(always)]
    unsafe fn fp8(w: *const u8) -> [__m512; 4] {
        unsafe { e4m3_vectors(_mm512_loadu_si512(w.cast())) }
    }
    #[inline(always)]
    unsafe fn bf16(w: *const u16) -> [__m512; 4] {
        unsafe { bf16_vectors(w) }
    }
    #[inline(always)]
    unsafe fn fp4(w: *const u8, s: &Fp4Scales, r: usize, c: usize) -> [__m512; 8] {
        unsafe { e2m1_vectors(w, s, r, c) }
    }
}

/// The GEMM micro-kernel on `16 · V` columns.
///
/// # Safety
/// As [`simd::gemm_micro`].
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn gemm_micro<const NW: usize, const V: usize>(
    panel: *const f32,
    xt: *const f32,
    kc: (usize, usize),
    out: *mut f32,
    next: Prefetch,
    adds: &[*const f32],
) {
    // SAFETY: by the contract.
    unsafe { simd::gemm_micro::<Avx512, NW, V>(panel, xt, kc, out, next, adds) }
}

/// The GEMM micro-kernel on eight columns (a narrow last strip): the AVX2 body, with
/// AVX-512's 32 registers holding the accumulators.
///
/// # Safety
/// As [`simd::gemm_micro`], with `xt` rows of 8 floats.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn gemm_micro_narrow<const NW: usize>(
    panel: *const f32,
    xt: *const f32,
    kc: (usize, usize),
    out: *mut f32,
    next: Prefetch,
    adds: &[*const f32],
) {
    // SAFETY: by the contract.
    unsafe { simd::gemm_micro::<Avx2, NW, 1>(panel, xt, kc, out, next, adds) }
}

impl Kernels for Avx512 {
    const ISA: crate::cpu::Isa = crate::cpu::Isa::Avx512;
    const M_GROUP: usize = 8;
    const PAIRS_UP_TO: usize = 4;
    const GEMM_NW: [usize; 2] = [24, 12];

    unsafe fn gemm(
        panel: *const f32,
        nw: usize,
        (xt, xw): (*const f32, usize),
        kc: (usize, usize),
        out: *mut f32,
        next: Prefetch,
        adds: &[*const f32],
    ) {
        // SAFETY: as above.
        unsafe {
            if xw == 8 {
                by_width!(
                    nw,
                    [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23] 24,
                    |N| gemm_micro_narrow::<N>(panel, xt, kc, out, next, adds)
                )
            } else if xw == 16 {
                by_width!(
                    nw,
                    [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23] 24,
                    |N| gemm_micro::<N, 1>(panel, xt, kc, out, next, adds)
                )
            } else {
                by_width!(
                    nw,
                    [1 2 3 4 5 6 7 8 9 10 11] 12,
                    |N| gemm_micro::<N, 2>(panel, xt, kc, out, next, adds)
                )
            }
        }
    }

    kernel_entries!("avx512f,avx512bw");

    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn fp8_dots_rows<const M: usize>(
        w: *const u8,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &(),
        out: (*mut f32, usize),
    ) {
        // SAFETY: as fp4_dots_rows.
        unsafe { simd::rows::<Self, Fp8Dots, 2, M>(w, ldw, n, x, chunks, e, out) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn bf16_dots_rows<const M: usize>(
        w: *const u16,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &(),
        out: (*mut f32, usize),
    ) {
        // SAFETY: as fp4_dots_rows.
        unsafe { simd::rows::<Self, Bf16Dots, 2, M>(w, ldw, n, x, chunks, e, out) }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx512vbmi")]
    unsafe fn fp4_dots_rows<const M: usize>(
        w: *const u8,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &Fp4Scales,
        out: (*mut f32, usize),
    ) {
        // SAFETY: the trait's contract is the loop's; the plan chose this kernel where the
        // CPU has AVX-512 BF16 and VBMI.
        unsafe { simd::rows::<Self, Fp4Dots, 4, M>(w, ldw, n, x, chunks, e, out) }
    }
}
