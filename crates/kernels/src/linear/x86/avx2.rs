//! The AVX2 + FMA inner loops (eight f32 lanes): dots of `R` weight rows, decoded from their
//! stored format in registers, with `M` activation rows; and the same decodes writing f32
//! rows to a buffer.
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

use super::{
    prefetch, prefetch_lines, Extra, Fp4Scales, Kernels, Prefetch, RowFormat, SUB_ROWS, X_BLOCK,
};
use crate::vector::avx2::hsum;
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

/// Every dot kernel's shape: `R` weight rows of `chunks` 32-element chunks (64 for FP4), `M`
/// activation rows laid out for the format.
macro_rules! dot_kernel {
    ($name:ident, $rows:ident, $ptr:ty, $extra:ty, $elems:expr, $bytes:expr, |$w:ident, $r:ident, $c:ident, $e:ident| $decode:expr) => {
        /// Adds chunks `c0..c1` of `R` weight rows times `M` activation rows to `acc` (two
        /// accumulators per pair, the even and the odd vectors of a chunk).
        ///
        /// # Safety
        /// Each `w[r]` points at row `r` (chunks `c0..c1` inside it), each `x[m]` at an
        /// activation row in the format's layout, and the extra arguments cover those rows.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn $name<const R: usize, const M: usize>(
            $w: [$ptr; R],
            x: [*const f32; M],
            (c0, c1): (usize, usize),
            $e: &$extra,
            acc: &mut [[[__m256; 2]; M]; R],
        ) {
            for $c in c0..c1 {
                for $r in 0..R {
                    // SAFETY: chunk c lies inside row r (the caller's contract).
                    let f = unsafe { $decode };
                    for (m, a) in acc[$r].iter_mut().enumerate() {
                        for (p, fp) in f.iter().enumerate() {
                            // SAFETY: as above, for the activation row.
                            let xv = unsafe { _mm256_loadu_ps(x[m].add($elems * $c + 8 * p)) };
                            a[p % 2] = _mm256_fmadd_ps(*fp, xv, a[p % 2]);
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
        #[target_feature(enable = "avx2,fma")]
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
            let pairs = M <= Avx2::PAIRS_UP_TO;
            let mut acc = [[[_mm256_setzero_ps(); 2]; M]; SUB_ROWS];
            for s0 in (0..n).step_by(SUB_ROWS) {
                let sn = SUB_ROWS.min(n - s0);
                acc[..sn].iter_mut().for_each(|a| *a = [[_mm256_setzero_ps(); 2]; M]);
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
                        unsafe { *out.add((s0 + r) * ldo + m) = hsum(_mm256_add_ps(*a0, *a1)) };
                    }
                }
            }
        }
    };
}

dot_kernel!(fp8_dots, fp8_rows, *const u8, (), 32, 32, |w, r, c, _e| {
    if c % 2 == 0 {
        prefetch(w[r].wrapping_add(32 * c), 64);
    }
    e4m3_vectors(_mm256_loadu_si256(w[r].add(32 * c).cast()))
});

dot_kernel!(
    bf16_dots,
    bf16_rows,
    *const u16,
    (),
    32,
    64,
    |w, r, c, _e| {
        prefetch(w[r].wrapping_add(32 * c), 64);
        bf16_vectors(w[r].add(32 * c))
    }
);

dot_kernel!(
    f32_dots,
    f32_rows,
    *const f32,
    (),
    32,
    128,
    |w, r, c, _e| {
        prefetch(w[r].wrapping_add(32 * c), 128);
        let p = w[r].add(32 * c);
        [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ]
    }
);

dot_kernel!(
    fp4_dots,
    fp4_rows,
    *const u8,
    Fp4Scales,
    64,
    32,
    |w, r, c, e| {
        if c % 2 == 0 {
            prefetch(w[r].wrapping_add(32 * c), 64);
        }
        e2m1_vectors(
            _mm256_loadu_si256(w[r].add(32 * c).cast()),
            scale_vector(e, r, c),
        )
    }
);

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

/// Decodes the `chunks` whole chunks of one row into f32 in kernel order (as the dot
/// kernels see them), for the decode-once path.
///
/// # Safety
/// `w` points at the row, `out` has room for the chunks' elements, `scales` (FP4) covers
/// the row as its row 0.
#[target_feature(enable = "avx2,fma")]
unsafe fn decode_row(format: RowFormat, chunks: usize, out: *mut f32) {
    // SAFETY (every arm): in bounds by the contract.
    unsafe {
        match format {
            RowFormat::Fp8(w) => {
                for c in 0..chunks {
                    let f = e4m3_vectors(_mm256_loadu_si256(w.add(32 * c).cast()));
                    store(out.add(32 * c), &f);
                }
            }
            RowFormat::Fp8Scaled(w, scales, bc) => {
                for c in 0..chunks {
                    let sc = _mm256_set1_ps(*scales.add(32 * c / bc) * 2f32.powi(64));
                    let f = e4m3_vectors(_mm256_loadu_si256(w.add(32 * c).cast()));
                    store(out.add(32 * c), &f.map(|v| _mm256_mul_ps(v, sc)));
                }
            }
            RowFormat::Bf16(w) => {
                for c in 0..chunks {
                    store(out.add(32 * c), &bf16_vectors(w.add(32 * c)));
                }
            }
            RowFormat::Fp4(w, s) => {
                for c in 0..chunks {
                    let v = _mm256_loadu_si256(w.add(32 * c).cast());
                    store(out.add(64 * c), &e2m1_vectors(v, scale_vector(&s, 0, c)));
                }
            }
        }
    }
}

/// # Safety
/// `out` has room for `8 · N` floats.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn store<const N: usize>(out: *mut f32, v: &[__m256; N]) {
    for (p, vp) in v.iter().enumerate() {
        // SAFETY: by the contract.
        unsafe { _mm256_storeu_ps(out.add(8 * p), *vp) };
    }
}

/// The GEMM micro-kernel: a panel of `NW` weight rows (`[kc][NW]`, broadcast) times `V` vectors
/// of activation columns of the transposed activations (`xt`, one strip of `8 · V`
/// columns a row), summed over `kc`, into `out[n][0..8 · V]`.
///
/// # Safety
/// The panel holds `kc · NW` floats, `xt` `kc` rows of `8 · V` floats, `out` room for
/// `NW · 8 · V` floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_micro<const NW: usize, const V: usize>(
    panel: *const f32,
    xt: *const f32,
    (kc, stride): (usize, usize),
    out: *mut f32,
    next: Prefetch,
    adds: &[*const f32],
) {
    let mut acc = [[_mm256_setzero_ps(); V]; NW];
    for kk in 0..kc {
        if kk % 8 == 0 {
            next.step(kk / 8, kc.div_ceil(8));
        }
        // SAFETY (every block): in bounds by the contract.
        let x: [_; V] =
            std::array::from_fn(|v| unsafe { _mm256_loadu_ps(xt.add((kk * V + v) * 8)) });
        for (n, a) in acc.iter_mut().enumerate() {
            let wv = _mm256_set1_ps(unsafe { *panel.add(kk * stride * NW + n) });
            for (av, xv) in a.iter_mut().zip(&x) {
                *av = _mm256_fmadd_ps(wv, *xv, *av);
            }
        }
    }
    for &p in adds {
        for (n, a) in acc.iter_mut().enumerate() {
            for (v, av) in a.iter_mut().enumerate() {
                *av = _mm256_add_ps(*av, unsafe { _mm256_loadu_ps(p.add((n * V + v) * 8)) });
            }
        }
    }
    for (n, a) in acc.iter().enumerate() {
        for (v, av) in a.iter().enumerate() {
            unsafe { _mm256_storeu_ps(out.add((n * V + v) * 8), *av) };
        }
    }
}

/// The AVX2 + FMA family.
pub(crate) struct Avx2;

impl Kernels for Avx2 {
    const ISA: crate::cpu::Isa = crate::cpu::Isa::Avx2;
    const M_GROUP: usize = 4;
    const PAIRS_UP_TO: usize = 2;
    const LANES: usize = 8;
    const GEMM_NW: [usize; 2] = [12, 6];

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
                    [1 2 3 4 5 6 7 8 9 10 11] 12,
                    gemm_micro::<_, 1>(panel, xt, kc, out, next, adds)
                )
            } else {
                by_width!(
                    nw,
                    [1 2 3 4 5] 6,
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
