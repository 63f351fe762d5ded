//! The AVX-512 inner loops (sixteen f32 lanes, AVX-512 F + BW): the FP8 and BF16 decodes
//! and the accumulation order of [`super::avx2`], on registers twice as wide (see `avx2.rs`
//! for how those formats are decoded). FP4 is decoded differently: sixteen lanes hold a
//! whole table of the E2M1 values, so each nibble is looked up (`vpermps`) in the values
//! times its group's scale, about half the work of going through E4M3 (FP4 decode is what
//! bounds its products on Zen 4, whose cores run 512-bit operations as two halves).

use super::{
    prefetch, prefetch_lines, Extra, Fp4Scales, Kernels, Prefetch, RowFormat, SUB_ROWS, X_BLOCK,
};
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

/// See `avx2.rs`: one dot kernel's shape, `$elems` elements a chunk, and its row loop.
macro_rules! dot_kernel {
    ($name:ident, $rows:ident, $ptr:ty, $extra:ty, $elems:expr, $bytes:expr, |$w:ident, $r:ident, $c:ident, $e:ident| $decode:expr) => {
        /// Adds chunks `c0..c1` of `R` weight rows times `M` activation rows to `acc` (two
        /// accumulators per pair, the even and the odd vectors of a chunk).
        ///
        /// # Safety
        /// Each `w[r]` points at row `r` (chunks `c0..c1` inside it), each `x[m]` at an
        /// activation row in the format's layout, and the extra arguments cover those rows.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn $name<const R: usize, const M: usize>(
            $w: [$ptr; R],
            x: [*const f32; M],
            (c0, c1): (usize, usize),
            $e: &$extra,
            acc: &mut [[[__m512; 2]; M]; R],
        ) {
            for $c in c0..c1 {
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
        }

        /// [`Kernels`]' row loop over `$name`: rows in groups of [`SUB_ROWS`], and within a
        /// group the inner dimension in blocks whose activations stay in L1 while every row
        /// of the group passes over them (their partial sums wait in `acc`); each
        /// (row, activation row) still accumulates every product in the same order.
        ///
        /// # Safety
        /// As [`Kernels::fp8_rows`].
        #[target_feature(enable = "avx512f,avx512bw")]
        unsafe fn $rows<const M: usize>(
            w: $ptr,
            ldw: usize,
            n: usize,
            x: [*const f32; M],
            chunks: usize,
            e: &$extra,
            (out, ldo): (*mut f32, usize),
        ) {
            let block = (X_BLOCK / (4 * M * $elems)).max(1);
            let pairs = M <= Avx512::PAIRS_UP_TO;
            let mut acc = [[[_mm512_setzero_ps(); 2]; M]; SUB_ROWS];
            for s0 in (0..n).step_by(SUB_ROWS) {
                let sn = SUB_ROWS.min(n - s0);
                acc[..sn].iter_mut().for_each(|a| *a = [[_mm512_setzero_ps(); 2]; M]);
                for c0 in (0..chunks).step_by(block) {
                    let c1 = (c0 + block).min(chunks);
                    if block < chunks {
                        // The next group's share of this block, into L2 meanwhile (its
                        // rows are read a block at a time, which the per-row stream
                        // prefetch does not foresee).
                        for row in (s0 + SUB_ROWS..s0 + 2 * SUB_ROWS).take_while(|&r| r < n) {
                            let at = w.wrapping_add(row * ldw).cast::<u8>();
                            prefetch_lines(at.wrapping_add(c0 * $bytes), (c1 - c0) * $bytes);
                        }
                    }
                    let mut r = 0;
                    // SAFETY (every call): rows below n lie in the matrix.
                    while r < sn {
                        let row = s0 + r;
                        if pairs && r + 1 < sn {
                            let a: &mut [_; 2] = (&mut acc[r..r + 2]).try_into().expect("two rows");
                            let w2 = unsafe { [w.add(row * ldw), w.add((row + 1) * ldw)] };
                            unsafe { $name::<2, M>(w2, x, (c0, c1), &e.at_row(row), a) };
                            r += 2;
                        } else {
                            let a: &mut [_; 1] = (&mut acc[r..r + 1]).try_into().expect("one row");
                            let w1 = unsafe { [w.add(row * ldw)] };
                            unsafe { $name::<1, M>(w1, x, (c0, c1), &e.at_row(row), a) };
                            r += 1;
                        }
                    }
                }
                for (r, a) in acc[..sn].iter().enumerate() {
                    for (m, [a0, a1]) in a.iter().enumerate() {
                        // SAFETY: row s0 + r's results lie in `out`.
                        unsafe { *out.add((s0 + r) * ldo + m) = hsum(_mm512_add_ps(*a0, *a1)) };
                    }
                }
            }
        }
    };
}

dot_kernel!(fp8_dots, fp8_rows, *const u8, (), 64, 64, |w, r, c, _e| {
    prefetch(w[r].wrapping_add(64 * c), 64);
    e4m3_vectors(_mm512_loadu_si512(w[r].add(64 * c).cast()))
});

dot_kernel!(
    bf16_dots,
    bf16_rows,
    *const u16,
    (),
    64,
    128,
    |w, r, c, _e| {
        prefetch(w[r].wrapping_add(64 * c), 128);
        bf16_vectors(w[r].add(64 * c))
    }
);

dot_kernel!(
    f32_dots,
    f32_rows,
    *const f32,
    (),
    64,
    256,
    |w, r, c, _e| {
        prefetch(w[r].wrapping_add(64 * c), 256);
        let p = w[r].add(64 * c);
        [
            _mm512_loadu_ps(p),
            _mm512_loadu_ps(p.add(16)),
            _mm512_loadu_ps(p.add(32)),
            _mm512_loadu_ps(p.add(48)),
        ]
    }
);

dot_kernel!(
    fp4_dots,
    fp4_rows,
    *const u8,
    Fp4Scales,
    128,
    64,
    |w, r, c, e| {
        prefetch(w[r].wrapping_add(64 * c), 64);
        e2m1_vectors(w[r], e, r, c)
    }
);

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
                    store(out.add(128 * c), &e2m1_vectors(w, &s, 0, c));
                }
            }
        }
    }
}

/// The GEMM micro-kernel: a panel of `NW` weight rows (`[kc][NW]`, broadcast) times `V` vectors
/// of activation columns of the transposed activations (`xt`, one strip of `16 · V`
/// columns a row), summed over `kc`, into `out[n][0..16 · V]`.
///
/// # Safety
/// The panel holds `kc · NW` floats, `xt` `kc` rows of `16 · V` floats, `out` room for
/// `NW · 16 · V` floats.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn gemm_micro<const NW: usize, const V: usize>(
    panel: *const f32,
    xt: *const f32,
    (kc, stride): (usize, usize),
    out: *mut f32,
    next: Prefetch,
    adds: &[*const f32],
) {
    let mut acc = [[_mm512_setzero_ps(); V]; NW];
    for kk in 0..kc {
        if kk % 8 == 0 {
            next.step(kk / 8, kc.div_ceil(8));
        }
        // SAFETY (every block): in bounds by the contract.
        let x: [_; V] =
            std::array::from_fn(|v| unsafe { _mm512_loadu_ps(xt.add((kk * V + v) * 16)) });
        for (n, a) in acc.iter_mut().enumerate() {
            let wv = _mm512_set1_ps(unsafe { *panel.add(kk * stride * NW + n) });
            for (av, xv) in a.iter_mut().zip(&x) {
                *av = _mm512_fmadd_ps(wv, *xv, *av);
            }
        }
    }
    for &p in adds {
        for (n, a) in acc.iter_mut().enumerate() {
            for (v, av) in a.iter_mut().enumerate() {
                *av = _mm512_add_ps(*av, unsafe { _mm512_loadu_ps(p.add((n * V + v) * 16)) });
            }
        }
    }
    for (n, a) in acc.iter().enumerate() {
        for (v, av) in a.iter().enumerate() {
            unsafe { _mm512_storeu_ps(out.add((n * V + v) * 16), *av) };
        }
    }
}

/// The GEMM micro-kernel on eight columns (a narrow last strip): `NW` weight rows
/// (broadcast) times one 256-bit vector of activation columns, with AVX-512's 32 registers
/// holding the accumulators.
///
/// # Safety
/// As [`gemm_micro`], with `xt` rows of 8 floats.
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn gemm_micro_narrow<const NW: usize>(
    panel: *const f32,
    xt: *const f32,
    (kc, stride): (usize, usize),
    out: *mut f32,
    next: Prefetch,
    adds: &[*const f32],
) {
    let mut acc = [_mm256_setzero_ps(); NW];
    for kk in 0..kc {
        if kk % 8 == 0 {
            next.step(kk / 8, kc.div_ceil(8));
        }
        // SAFETY (every block): in bounds by the contract.
        let x = unsafe { _mm256_loadu_ps(xt.add(kk * 8)) };
        for (n, a) in acc.iter_mut().enumerate() {
            let wv = _mm256_set1_ps(unsafe { *panel.add(kk * stride * NW + n) });
            *a = _mm256_fmadd_ps(wv, x, *a);
        }
    }
    for &p in adds {
        for (n, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_ps(*a, unsafe { _mm256_loadu_ps(p.add(n * 8)) });
        }
    }
    for (n, a) in acc.iter().enumerate() {
        unsafe { _mm256_storeu_ps(out.add(n * 8), *a) };
    }
}

/// The AVX-512 family.
pub(crate) struct Avx512;

impl Kernels for Avx512 {
    const ISA: crate::cpu::Isa = crate::cpu::Isa::Avx512;
    const M_GROUP: usize = 8;
    const PAIRS_UP_TO: usize = 4;
    const LANES: usize = 16;
    const GEMM_NW: [usize; 2] = [24, 12];

    unsafe fn gemm(
        panel: *const f32,
        nw: usize,
        xt: *const f32,
        xw: usize,
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
                    gemm_micro_narrow::<_>(panel, xt, kc, out, next, adds)
                )
            } else if xw == 16 {
                by_width!(
                    nw,
                    [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23] 24,
                    gemm_micro::<_, 1>(panel, xt, kc, out, next, adds)
                )
            } else {
                by_width!(
                    nw,
                    [1 2 3 4 5 6 7 8 9 10 11] 12,
                    gemm_micro::<_, 2>(panel, xt, kc, out, next, adds)
                )
            }
        }
    }

    unsafe fn fp8_rows<const M: usize>(
        w: *const u8,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &(),
        out: (*mut f32, usize),
    ) {
        // SAFETY: the trait's contract is the loop's.
        unsafe { fp8_rows(w, ldw, n, x, chunks, e, out) }
    }

    unsafe fn bf16_rows<const M: usize>(
        w: *const u16,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &(),
        out: (*mut f32, usize),
    ) {
        // SAFETY: as above.
        unsafe { bf16_rows(w, ldw, n, x, chunks, e, out) }
    }

    unsafe fn f32_rows<const M: usize>(
        w: *const f32,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &(),
        out: (*mut f32, usize),
    ) {
        // SAFETY: as above.
        unsafe { f32_rows(w, ldw, n, x, chunks, e, out) }
    }

    unsafe fn fp4_rows<const M: usize>(
        w: *const u8,
        ldw: usize,
        n: usize,
        x: [*const f32; M],
        chunks: usize,
        e: &Fp4Scales,
        out: (*mut f32, usize),
    ) {
        // SAFETY: as above.
        unsafe { fp4_rows(w, ldw, n, x, chunks, e, out) }
    }

    unsafe fn decode(format: RowFormat, chunks: usize, out: *mut f32) {
        // SAFETY: as above.
        unsafe { decode_row(format, chunks, out) }
    }
}
