//! The AVX-512 inner loops (sixteen f32 lanes, AVX-512 F + BW): the same decodes and the
//! same accumulation order as [`super::avx2`], on registers twice as wide. Where the cores
//! execute 512-bit operations whole (Zen 5, Intel server parts) this halves the decode cost
//! per weight, which is what bounds FP8 and FP4 decode. See `avx2.rs` for how each format is
//! decoded; only the lane count differs here.

use super::{Fp4Scales, Kernels, RowFormat};
use std::arch::x86_64::*;

/// Bytes ahead of the current load that each weight stream prefetches.
const PREFETCH: usize = 4096;

/// `2^90 · 2^(b-127)` for every E8M0 byte in the fast range (see `avx2.rs`).
static FP4_SCALE: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut b = 32;
    while b <= 158 {
        t[b] = f32::from_bits(((b + 90) as u32) << 23);
        b += 1;
    }
    t
};

/// E4M3 codes of the sixteen E2M1 values, once per 128-bit lane.
const E2M1_AS_E4M3: [u8; 64] = {
    const MAG: [u8; 8] = [0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C];
    let mut t = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        t[i] = MAG[i % 8] | if i % 16 >= 8 { 0x80 } else { 0 };
        i += 1;
    }
    t
};

const E4M3_FIELDS: i32 = 0x87F0_0000u32 as i32;

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

/// The eight f32 vectors of a 64-byte FP4 load (128 codes), position `p` lane `j` holding
/// element `8j + 2(p mod 4) + p / 4`, each times its group's scale.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn e2m1_vectors(v: __m512i, sv: __m512) -> [__m512; 8] {
    // SAFETY: the table is 64 bytes.
    let lut = unsafe { _mm512_loadu_si512(E2M1_AS_E4M3.as_ptr().cast()) };
    let nibble = _mm512_set1_epi8(0x0F);
    let even = e4m3_vectors(_mm512_shuffle_epi8(lut, _mm512_and_si512(v, nibble)));
    let odd = e4m3_vectors(_mm512_shuffle_epi8(
        lut,
        _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble),
    ));
    std::array::from_fn(|p| _mm512_mul_ps(if p < 4 { even[p] } else { odd[p - 4] }, sv))
}

/// The group scales of chunk `c` (128 elements) of row `r`: lanes `4t..4t+4` hold the scale
/// of elements `32t..32t+32`.
///
/// # Safety
/// Chunk `c`'s groups lie inside row `r`'s scales.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn scale_vector(s: &Fp4Scales, r: usize, c: usize) -> __m512 {
    let g = |t: usize| (128 * c + 32 * t) >> s.group_shift;
    // SAFETY: by the contract.
    let v = unsafe {
        _mm_setr_ps(
            FP4_SCALE[*s.rows[r].add(g(0)) as usize],
            FP4_SCALE[*s.rows[r].add(g(1)) as usize],
            FP4_SCALE[*s.rows[r].add(g(2)) as usize],
            FP4_SCALE[*s.rows[r].add(g(3)) as usize],
        )
    };
    let idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
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

/// See `avx2.rs`: one dot kernel's shape, `$elems` elements a chunk.
macro_rules! dot_kernel {
    ($name:ident, $ptr:ty, $extra:ty, $elems:expr, |$w:ident, $r:ident, $c:ident, $e:ident| $decode:expr) => {
        /// # Safety
        /// Each `w[r]` points at `chunks` whole chunks of its row, each `x[m]` at as many
        /// activations, and the extra arguments cover those rows.
        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn $name<const R: usize, const M: usize>(
            $w: [$ptr; R],
            x: [*const f32; M],
            chunks: usize,
            $e: &$extra,
        ) -> [[f32; M]; R] {
            let mut acc = [[[_mm512_setzero_ps(); 2]; M]; R];
            for $c in 0..chunks {
                for $r in 0..R {
                    // SAFETY: chunk c lies inside row r (the caller's contract).
                    let f = unsafe { $decode };
                    for (m, a) in acc[$r].iter_mut().enumerate() {
                        for (p, fp) in f.iter().enumerate() {
                            // SAFETY: as above, for the activation row.
                            let xv = unsafe { _mm512_loadu_ps(x[m].add($elems * $c + 16 * p)) };
                            a[p % 2] = _mm512_fmadd_ps(*fp, xv, a[p % 2]);
                        }
                    }
                }
            }
            acc.map(|row| row.map(|[a, b]| _mm512_reduce_add_ps(_mm512_add_ps(a, b))))
        }
    };
}

dot_kernel!(fp8_dots, *const u8, (), 64, |w, r, c, _e| {
    _mm_prefetch(w[r].wrapping_add(64 * c + PREFETCH).cast(), _MM_HINT_T0);
    e4m3_vectors(_mm512_loadu_si512(w[r].add(64 * c).cast()))
});

dot_kernel!(bf16_dots, *const u16, (), 64, |w, r, c, _e| {
    _mm_prefetch(w[r].wrapping_add(64 * c + PREFETCH / 2).cast(), _MM_HINT_T0);
    _mm_prefetch(
        w[r].wrapping_add(64 * c + 32 + PREFETCH / 2).cast(),
        _MM_HINT_T0,
    );
    bf16_vectors(w[r].add(64 * c))
});

dot_kernel!(f32_dots, *const f32, (), 64, |w, r, c, _e| {
    let p = w[r].add(64 * c);
    [
        _mm512_loadu_ps(p),
        _mm512_loadu_ps(p.add(16)),
        _mm512_loadu_ps(p.add(32)),
        _mm512_loadu_ps(p.add(48)),
    ]
});

dot_kernel!(fp4_dots, *const u8, Fp4Scales, 128, |w, r, c, e| {
    _mm_prefetch(w[r].wrapping_add(64 * c + PREFETCH).cast(), _MM_HINT_T0);
    e2m1_vectors(
        _mm512_loadu_si512(w[r].add(64 * c).cast()),
        scale_vector(e, r, c),
    )
});

/// # Safety
/// `out` has room for `16 · N` floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn store<const N: usize>(out: *mut f32, v: &[__m512; N]) {
    for (p, vp) in v.iter().enumerate() {
        // SAFETY: by the contract.
        unsafe { _mm512_storeu_ps(out.add(16 * p), *vp) };
    }
}

/// # Safety
/// As [`Kernels::decode`].
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn decode_row(format: RowFormat, chunks: usize, out: *mut f32) {
    // SAFETY (every arm): in bounds by the contract.
    unsafe {
        match format {
            RowFormat::Fp8(w) => {
                for c in 0..chunks {
                    let f = e4m3_vectors(_mm512_loadu_si512(w.add(64 * c).cast()));
                    store(out.add(64 * c), &f);
                }
            }
            RowFormat::Fp8Scaled(w, scales, bc) => {
                for c in 0..chunks {
                    let sc = _mm512_set1_ps(*scales.add(64 * c / bc) * 2f32.powi(64));
                    let f = e4m3_vectors(_mm512_loadu_si512(w.add(64 * c).cast()));
                    store(out.add(64 * c), &f.map(|v| _mm512_mul_ps(v, sc)));
                }
            }
            RowFormat::Bf16(w) => {
                for c in 0..chunks {
                    store(out.add(64 * c), &bf16_vectors(w.add(64 * c)));
                }
            }
            RowFormat::Fp4(w, s) => {
                for c in 0..chunks {
                    let v = _mm512_loadu_si512(w.add(64 * c).cast());
                    store(out.add(128 * c), &e2m1_vectors(v, scale_vector(&s, 0, c)));
                }
            }
        }
    }
}

/// The GEMM micro-kernel: `NW` weight rows (broadcast, rows `ldw` apart) times `V` vectors
/// of activation columns of the transposed activations (`xt`, one strip of `16 · V`
/// columns a row), summed over `kc`, into `out[n][0..16 · V]`.
///
/// # Safety
/// The weight rows hold `kc` floats, `xt` `kc` rows of `16 · V` floats, `out` room for
/// `NW · 16 · V` floats.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn gemm_micro<const NW: usize, const V: usize>(
    w: *const f32,
    ldw: usize,
    xt: *const f32,
    kc: usize,
    out: *mut f32,
) {
    let mut acc = [[_mm512_setzero_ps(); V]; NW];
    for kk in 0..kc {
        // SAFETY (every block): in bounds by the contract.
        let x: [_; V] =
            std::array::from_fn(|v| unsafe { _mm512_loadu_ps(xt.add((kk * V + v) * 16)) });
        for (n, a) in acc.iter_mut().enumerate() {
            let wv = _mm512_set1_ps(unsafe { *w.add(n * ldw + kk) });
            for (av, xv) in a.iter_mut().zip(&x) {
                *av = _mm512_fmadd_ps(wv, *xv, *av);
            }
        }
    }
    for (n, a) in acc.iter().enumerate() {
        for (v, av) in a.iter().enumerate() {
            unsafe { _mm512_storeu_ps(out.add((n * V + v) * 16), *av) };
        }
    }
}

/// The AVX-512 family.
pub(crate) struct Avx512;

impl Kernels for Avx512 {
    const LANES: usize = 16;
    const M_DECODED: usize = 6;
    const GEMM_NW: [usize; 2] = [24, 12];

    unsafe fn gemm(
        w: *const f32,
        ldw: usize,
        nw: usize,
        xt: *const f32,
        xw: usize,
        kc: usize,
        out: *mut f32,
    ) {
        // SAFETY: as above.
        unsafe {
            if xw == 16 {
                match nw {
                    1 => gemm_micro::<1, 1>(w, ldw, xt, kc, out),
                    2 => gemm_micro::<2, 1>(w, ldw, xt, kc, out),
                    3 => gemm_micro::<3, 1>(w, ldw, xt, kc, out),
                    4 => gemm_micro::<4, 1>(w, ldw, xt, kc, out),
                    5 => gemm_micro::<5, 1>(w, ldw, xt, kc, out),
                    6 => gemm_micro::<6, 1>(w, ldw, xt, kc, out),
                    7 => gemm_micro::<7, 1>(w, ldw, xt, kc, out),
                    8 => gemm_micro::<8, 1>(w, ldw, xt, kc, out),
                    9 => gemm_micro::<9, 1>(w, ldw, xt, kc, out),
                    10 => gemm_micro::<10, 1>(w, ldw, xt, kc, out),
                    11 => gemm_micro::<11, 1>(w, ldw, xt, kc, out),
                    12 => gemm_micro::<12, 1>(w, ldw, xt, kc, out),
                    13 => gemm_micro::<13, 1>(w, ldw, xt, kc, out),
                    14 => gemm_micro::<14, 1>(w, ldw, xt, kc, out),
                    15 => gemm_micro::<15, 1>(w, ldw, xt, kc, out),
                    16 => gemm_micro::<16, 1>(w, ldw, xt, kc, out),
                    17 => gemm_micro::<17, 1>(w, ldw, xt, kc, out),
                    18 => gemm_micro::<18, 1>(w, ldw, xt, kc, out),
                    19 => gemm_micro::<19, 1>(w, ldw, xt, kc, out),
                    20 => gemm_micro::<20, 1>(w, ldw, xt, kc, out),
                    21 => gemm_micro::<21, 1>(w, ldw, xt, kc, out),
                    22 => gemm_micro::<22, 1>(w, ldw, xt, kc, out),
                    23 => gemm_micro::<23, 1>(w, ldw, xt, kc, out),
                    _ => gemm_micro::<24, 1>(w, ldw, xt, kc, out),
                }
            } else {
                match nw {
                    1 => gemm_micro::<1, 2>(w, ldw, xt, kc, out),
                    2 => gemm_micro::<2, 2>(w, ldw, xt, kc, out),
                    3 => gemm_micro::<3, 2>(w, ldw, xt, kc, out),
                    4 => gemm_micro::<4, 2>(w, ldw, xt, kc, out),
                    5 => gemm_micro::<5, 2>(w, ldw, xt, kc, out),
                    6 => gemm_micro::<6, 2>(w, ldw, xt, kc, out),
                    7 => gemm_micro::<7, 2>(w, ldw, xt, kc, out),
                    8 => gemm_micro::<8, 2>(w, ldw, xt, kc, out),
                    9 => gemm_micro::<9, 2>(w, ldw, xt, kc, out),
                    10 => gemm_micro::<10, 2>(w, ldw, xt, kc, out),
                    11 => gemm_micro::<11, 2>(w, ldw, xt, kc, out),
                    _ => gemm_micro::<12, 2>(w, ldw, xt, kc, out),
                }
            }
        }
    }

    unsafe fn fp8<const R: usize, const M: usize>(
        w: [*const u8; R],
        x: [*const f32; M],
        chunks: usize,
        e: &(),
    ) -> [[f32; M]; R] {
        // SAFETY: the trait's contract is the kernel's.
        unsafe { fp8_dots(w, x, chunks, e) }
    }

    unsafe fn bf16<const R: usize, const M: usize>(
        w: [*const u16; R],
        x: [*const f32; M],
        chunks: usize,
        e: &(),
    ) -> [[f32; M]; R] {
        // SAFETY: as above.
        unsafe { bf16_dots(w, x, chunks, e) }
    }

    unsafe fn f32<const R: usize, const M: usize>(
        w: [*const f32; R],
        x: [*const f32; M],
        chunks: usize,
        e: &(),
    ) -> [[f32; M]; R] {
        // SAFETY: as above.
        unsafe { f32_dots(w, x, chunks, e) }
    }

    unsafe fn fp4<const R: usize, const M: usize>(
        w: [*const u8; R],
        x: [*const f32; M],
        chunks: usize,
        e: &Fp4Scales,
    ) -> [[f32; M]; R] {
        // SAFETY: as above.
        unsafe { fp4_dots(w, x, chunks, e) }
    }

    unsafe fn decode(format: RowFormat, chunks: usize, out: *mut f32) {
        // SAFETY: as above.
        unsafe { decode_row(format, chunks, out) }
    }
}
