//! The AVX2 + FMA family (eight f32 lanes): its vector operations and the decodes of each
//! stored format in registers, run by the loops of [`super::simd`] (the fused dots of
//! weight rows with activation rows, the row decode, the GEMM micro-kernel).
//!
//! Decoding avoids lookups into memory and lane-crossing shuffles (on Zen 2 the vector
//! shift/shuffle pipe is what binds); each format's trick leaves the lanes in a strided
//! element order that [`super::super::prepare`] gives the activations too:
//!
//! * **FP8 E4M3**: arithmetic 16-bit shifts place each byte's sign, exponent and mantissa in
//!   the matching f32 fields, so the lane reads `value · 2^-120` (exact, subnormals too).
//!   Activations arrive multiplied by their block scale and `2^64`; the sum is rescaled by
//!   `2^56`.
//! * **FP4 E2M1**: a `vpshufb` table turns each nibble into the E4M3 code of the same value,
//!   then the FP8 decode applies (lanes read `value · 2^-120`, never subnormal: FP4's `±0.5`
//!   would otherwise be an f32 subnormal, which costs a microcode assist per operand); each
//!   vector is multiplied (exactly) by its group's E8M0 scale times `2^90` and the
//!   activations arrive times `2^30`.
//! * **BF16**: the top half of an f32, so a shift and a mask give the even and odd elements.
//!
//! Every (weight row, activation row) pair accumulates into the same two registers in the
//! same order whatever `R` and `M` are, so a row's result never depends on the rest of the
//! batch.

use super::simd::{self, kernel_entries, Simd};
use super::{Fp4Scales, Kernels, Prefetch, RowFormat};
use std::arch::x86_64::*;

/// `2^90 · 2^(b-127)` for every E8M0 byte `b` in the fast range (others never looked up):
/// with the decode's `2^-120` and the activations' `2^30` the product is the true one.
static FP4_SCALE: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut b = 32;
    while b <= 158 {
        t[b] = f32::from_bits(((b + 90) as u32) << 23);
        b += 1;
    }
    t
};

/// E4M3 codes of the sixteen E2M1 values (every one is a normal E4M3 number), twice: one
/// table per 128-bit lane for `vpshufb`.
const E2M1_AS_E4M3: [u8; 32] = {
    const MAG: [u8; 8] = [0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C];
    let mut t = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        t[i] = MAG[i % 8] | if i % 16 >= 8 { 0x80 } else { 0 };
        i += 1;
    }
    t
};

/// Sign, exponent and mantissa of an E4M3 byte once shifted into an f32's fields.
const E4M3_FIELDS: i32 = 0x87F0_0000u32 as i32;

/// The four f32 vectors of a 32-byte FP8 E4M3 load (vector `q` lane `j` = byte `4j + q`),
/// each lane `value · 2^-120`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn e4m3_vectors(v: __m256i) -> [__m256; 4] {
    let mask = _mm256_set1_epi32(E4M3_FIELDS);
    let t = _mm256_srai_epi16(v, 4);
    let t2 = _mm256_srai_epi16(_mm256_slli_epi16(v, 8), 4);
    [
        _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(t2, 16), mask)),
        _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(t, 16), mask)),
        _mm256_castsi256_ps(_mm256_and_si256(t2, mask)),
        _mm256_castsi256_ps(_mm256_and_si256(t, mask)),
    ]
}

/// The eight f32 vectors of a 32-byte FP4 load (64 codes), in the order the activations
/// are laid out: position `p` holds element `8j + s` in lane `j`, `s = 2(p mod 4) + p / 4`
/// (low nibbles, the even elements, first), each times the group scale (`sv`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn e2m1_vectors(v: __m256i, sv: __m256) -> [__m256; 8] {
    // SAFETY: the table is 32 bytes.
    let lut = unsafe { _mm256_loadu_si256(E2M1_AS_E4M3.as_ptr().cast()) };
    let nibble = _mm256_set1_epi8(0x0F);
    let even = e4m3_vectors(_mm256_shuffle_epi8(lut, _mm256_and_si256(v, nibble)));
    let odd = e4m3_vectors(_mm256_shuffle_epi8(
        lut,
        _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble),
    ));
    // Byte 4j + q of the even codes is element 8j + 2q (of the odd ones 8j + 2q + 1);
    // scaling by a power of two is exact.
    let mut out = [_mm256_setzero_ps(); 8];
    for (p, o) in out.iter_mut().enumerate() {
        *o = _mm256_mul_ps(if p < 4 { even[p] } else { odd[p - 4] }, sv);
    }
    out
}

/// The group scales of chunk `c` of row `r` as one vector (lanes 0–3 the first 32
/// elements' group, lanes 4–7 the second's).
///
/// # Safety
/// Chunk `c`'s groups lie inside row `r`'s scales.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scale_vector(s: &Fp4Scales, r: usize, c: usize) -> __m256 {
    // SAFETY: by the contract.
    let (lo, hi) = unsafe {
        (
            FP4_SCALE[s.of(r, 64 * c) as usize],
            FP4_SCALE[s.of(r, 64 * c + 32) as usize],
        )
    };
    _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(lo)), _mm_set1_ps(hi), 1)
}

/// The four f32 vectors of 32 BF16 values: per 16, the even elements then the odd ones.
///
/// # Safety
/// `p` points at 32 readable values.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn bf16_vectors(p: *const u16) -> [__m256; 4] {
    let hi = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    // SAFETY: by the contract.
    let (v0, v1) = unsafe {
        (
            _mm256_loadu_si256(p.cast()),
            _mm256_loadu_si256(p.add(16).cast()),
        )
    };
    [
        _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)),
        _mm256_castsi256_ps(_mm256_and_si256(v0, hi)),
        _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)),
        _mm256_castsi256_ps(_mm256_and_si256(v1, hi)),
    ]
}

/// The AVX2 + FMA family.
pub(crate) struct Avx2;

impl Simd for Avx2 {
    type F = __m256;
    const LANES: usize = 8;
    // SAFETY (every method): the trait's contract (AVX2 + FMA present, pointers valid).
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m256 {
        _mm256_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn halves(lo: f32, hi: f32) -> __m256 {
        _mm256_blend_ps::<0xF0>(_mm256_set1_ps(lo), _mm256_set1_ps(hi))
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        unsafe { crate::vector::avx2::hsum(v) }
    }
    #[inline(always)]
    unsafe fn fp8(w: *const u8) -> [__m256; 4] {
        unsafe { e4m3_vectors(_mm256_loadu_si256(w.cast())) }
    }
    #[inline(always)]
    unsafe fn bf16(w: *const u16) -> [__m256; 4] {
        unsafe { bf16_vectors(w) }
    }
    #[inline(always)]
    unsafe fn fp4(w: *const u8, s: &Fp4Scales, r: usize, c: usize) -> [__m256; 8] {
        unsafe {
            e2m1_vectors(
                _mm256_loadu_si256(w.add(32 * c).cast()),
                scale_vector(s, r, c),
            )
        }
    }
}

/// The GEMM micro-kernel on `8 · V` columns.
///
/// # Safety
/// As [`simd::gemm_micro`].
#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_micro<const NW: usize, const V: usize>(
    panel: *const f32,
    xt: *const f32,
    kc: (usize, usize),
    out: *mut f32,
    next: Prefetch,
    adds: &[*const f32],
) {
    // SAFETY: by the contract.
    unsafe { simd::gemm_micro::<Avx2, NW, V>(panel, xt, kc, out, next, adds) }
}

impl Kernels for Avx2 {
    const ISA: crate::cpu::Isa = crate::cpu::Isa::Avx2;
    const M_GROUP: usize = 4;
    // Two weight rows at two activation rows need eight accumulators beside a decoded chunk
    // and its activations, more than sixteen registers: the sums went to the stack, and one
    // row at a time ran 20 % (FP8) to 30 % (FP4) faster there (`bench kernels --shapes
    // flash`, docs/PERFORMANCE.md).
    const PAIRS_UP_TO: usize = 1;
    const GEMM_NW: [usize; 2] = [12, 6];

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
                    [1 2 3 4 5 6 7 8 9 10 11] 12,
                    |N| gemm_micro::<N, 1>(panel, xt, kc, out, next, adds)
                )
            } else {
                by_width!(
                    nw,
                    [1 2 3 4 5] 6,
                    |N| gemm_micro::<N, 2>(panel, xt, kc, out, next, adds)
                )
            }
        }
    }

    kernel_entries!("avx2,fma");
}
