//! The kernel loops, written once over a vector width ([`Simd`]): the fused dot kernels'
//! chunk loop and row loop, the row decode and the GEMM micro-kernel. A family
//! ([`super::avx2`], [`super::avx512`]) supplies its vector operations and format decodes
//! and instantiates these bodies inside its own `#[target_feature]` entry points
//! ([`kernel_entries`]), where every call here is inlined.

use super::{prefetch_lines, Extra, Fp4Scales, Kernels, Prefetch, RowFormat, PREFETCH};
use super::{x_block, SUB_ROWS};

/// A vector of `LANES` f32 and the decodes of each stored format into such vectors, in the
/// strided element order the activation layout ([`crate::linear::prepare`]) matches.
///
/// # Safety (every method)
/// Only called where the CPU has the family's features (inside its entry points); the
/// pointers cover what each method reads or writes.
pub(in crate::linear) trait Simd {
    type F: Copy;
    const LANES: usize;
    unsafe fn zero() -> Self::F;
    unsafe fn load(p: *const f32) -> Self::F;
    unsafe fn store(p: *mut f32, v: Self::F);
    unsafe fn splat(v: f32) -> Self::F;
    /// `lo` in the lower half of the lanes, `hi` in the upper half.
    unsafe fn halves(lo: f32, hi: f32) -> Self::F;
    /// `a · b + c`, one rounding.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    /// The sum of the lanes as a halving tree (lane `i` plus lane `i + LANES/2`, …): the
    /// GEMM path folds its per-lane sums in this order (see `gemm.rs`).
    unsafe fn hsum(v: Self::F) -> f32;
    /// The four vectors of `4 · LANES` FP8 E4M3 bytes, each lane `value · 2^-120`.
    unsafe fn fp8(w: *const u8) -> [Self::F; 4];
    /// The four vectors of `4 · LANES` BF16 values.
    unsafe fn bf16(w: *const u16) -> [Self::F; 4];
    /// The eight vectors of chunk `c` (`8 · LANES` codes) of the FP4 row at `w`, each times
    /// its group's scale (row `r` of `s`), with the family's factor (see
    /// [`crate::linear::fp4_x_mult`]).
    unsafe fn fp4(w: *const u8, s: &Fp4Scales, r: usize, c: usize) -> [Self::F; 8];
}

/// A stored format as the dot kernels read it: `N` vectors a chunk.
pub(super) trait RowKind<S: Simd, const N: usize> {
    /// The stored element type (FP4: a byte of two codes).
    type Elem: Copy;
    /// Per-row arguments beside the weights (FP4: the scales).
    type Extra: Extra;
    /// Stored bytes of one chunk.
    const BYTES: usize;
    /// Chunk `c` of the row at `w` (row `r` of `e`).
    ///
    /// # Safety
    /// As [`Simd`]; the chunk lies inside the row.
    unsafe fn chunk(w: *const Self::Elem, e: &Self::Extra, r: usize, c: usize) -> [S::F; N];

    /// `acc` plus the products of a decoded vector `w` and activation vector `x`, lane by
    /// lane: one FMA (a kind on bf16 pairs adds its two products in order, see
    /// `avx512::Fp4Dots`).
    ///
    /// # Safety
    /// As [`Simd`].
    #[inline(always)]
    unsafe fn madd(w: S::F, x: S::F, acc: S::F) -> S::F {
        // SAFETY: by the contract.
        unsafe { S::fmadd(w, x, acc) }
    }
}

pub(super) struct Fp8;
pub(super) struct Bf16;
pub(super) struct F32;
pub(super) struct Fp4;

impl<S: Simd> RowKind<S, 4> for Fp8 {
    type Elem = u8;
    type Extra = ();
    const BYTES: usize = 4 * S::LANES;
    #[inline(always)]
    unsafe fn chunk(w: *const u8, _: &(), _: usize, c: usize) -> [S::F; 4] {
        // SAFETY: by the contract.
        unsafe { S::fp8(w.add(4 * S::LANES * c)) }
    }
}

impl<S: Simd> RowKind<S, 4> for Bf16 {
    type Elem = u16;
    type Extra = ();
    const BYTES: usize = 8 * S::LANES;
    #[inline(always)]
    unsafe fn chunk(w: *const u16, _: &(), _: usize, c: usize) -> [S::F; 4] {
        // SAFETY: by the contract.
        unsafe { S::bf16(w.add(4 * S::LANES * c)) }
    }
}

impl<S: Simd> RowKind<S, 4> for F32 {
    type Elem = f32;
    type Extra = ();
    const BYTES: usize = 16 * S::LANES;
    #[inline(always)]
    unsafe fn chunk(w: *const f32, _: &(), _: usize, c: usize) -> [S::F; 4] {
        let p = w.wrapping_add(4 * S::LANES * c);
        // SAFETY: by the contract.
        std::array::from_fn(|q| unsafe { S::load(p.add(S::LANES * q)) })
    }
}

impl<S: Simd> RowKind<S, 8> for Fp4 {
    type Elem = u8;
    type Extra = Fp4Scales;
    const BYTES: usize = 4 * S::LANES;
    #[inline(always)]
    unsafe fn chunk(w: *const u8, e: &Fp4Scales, r: usize, c: usize) -> [S::F; 8] {
        // SAFETY: by the contract.
        unsafe { S::fp4(w, e, r, c) }
    }
}

/// Adds chunks `c0..c1` of `R` weight rows times `M` activation rows to `acc` (two
/// accumulators per pair, the even and the odd vectors of a chunk), prefetching each row's
/// stream `ahead` bytes on.
///
/// # Safety
/// As [`Simd`]; each `w[r]` points at row `r` (chunks `c0..c1` inside it), each `x[m]` at an
/// activation row in the format's layout, and `e` covers those rows.
#[inline(always)]
unsafe fn dots<S: Simd, K: RowKind<S, N>, const N: usize, const R: usize, const M: usize>(
    w: [*const K::Elem; R],
    x: [*const f32; M],
    (c0, c1): (usize, usize),
    (e, ahead): (&K::Extra, usize),
    acc: &mut [[[S::F; 2]; M]; R],
) {
    // The sums in a local copy for the loop, so they stay in registers (through the
    // caller's array, indexed by row, the compiler kept them in memory).
    let mut sums = *acc;
    for c in c0..c1 {
        for r in 0..R {
            // One 64-byte line ahead per line of the stream.
            if (c * K::BYTES).is_multiple_of(64) {
                let at = w[r].cast::<u8>().wrapping_add(c * K::BYTES + ahead);
                prefetch_lines(at, K::BYTES.max(64));
            }
            // SAFETY: chunk c lies inside row r (the caller's contract).
            let f = unsafe { K::chunk(w[r], e, r, c) };
            for (m, a) in sums[r].iter_mut().enumerate() {
                for (p, fp) in f.iter().enumerate() {
                    // SAFETY: as above, for the activation row.
                    let xv = unsafe { S::load(x[m].add(N * S::LANES * c + S::LANES * p)) };
                    a[p % 2] = unsafe { K::madd(*fp, xv, a[p % 2]) };
                }
            }
        }
    }
    *acc = sums;
}

/// [`Kernels`]' row loop: rows in groups of [`SUB_ROWS`], and within a group the inner
/// dimension in blocks whose activations stay in L1 while every row of the group passes
/// over them (their partial sums wait in `acc`), two rows a call while the registers allow
/// ([`Kernels::PAIRS_UP_TO`]); each (row, activation row) accumulates every product in the
/// same order whatever the batch, and ends as `hsum(even + odd)`.
///
/// # Safety
/// As [`Kernels::fp8_rows`].
#[inline(always)]
pub(super) unsafe fn rows<S: Kernels, K: RowKind<S, N>, const N: usize, const M: usize>(
    w: *const K::Elem,
    ldw: usize,
    n: usize,
    x: [*const f32; M],
    chunks: usize,
    e: &K::Extra,
    (out, ldo): (*mut f32, usize),
) {
    let block = (x_block() / (4 * M * N * S::LANES)).max(1);
    let pairs = M <= S::PAIRS_UP_TO;
    // SAFETY (every vector operation below): as the function's.
    let zero = || unsafe { [[S::zero(); 2]; M] };
    let mut acc = [zero(); SUB_ROWS];
    // How far ahead a call's streams prefetch. Rows are contiguous and a call reads its
    // `rows` rows side by side, so what the next call reads (the next rows, at the same
    // block) lies `rows` rows down: `PREFETCH` bytes on from a row's load would, for rows of
    // 8 KB and more, land in the rows being read now and leave the next call's unfetched
    // (V4-Flash's 129 280 × 4 096 BF16 head streamed at 57–61 % of the read roof, 82–85 %
    // this way; its 4 096 × 8 192 FP8 `wo_b` 55–61 %, 76–81 %). Whole calls of rows ahead,
    // at least `PREFETCH` bytes.
    let row_bytes = ldw * std::mem::size_of::<K::Elem>();
    let ahead = |rows: usize| PREFETCH.div_ceil(rows * row_bytes).max(1) * rows * row_bytes;
    for s0 in (0..n).step_by(SUB_ROWS) {
        let sn = SUB_ROWS.min(n - s0);
        acc[..sn].iter_mut().for_each(|a| *a = zero());
        for c0 in (0..chunks).step_by(block) {
            let c1 = (c0 + block).min(chunks);
            if block < chunks {
                // The next group's share of this block, into L2 meanwhile (its rows are
                // read a block at a time, which the per-row stream prefetch does not
                // foresee).
                for row in (s0 + SUB_ROWS..s0 + 2 * SUB_ROWS).take_while(|&r| r < n) {
                    let at = w.wrapping_add(row * ldw).cast::<u8>();
                    prefetch_lines(at.wrapping_add(c0 * K::BYTES), (c1 - c0) * K::BYTES);
                }
            }
            let mut r = 0;
            // SAFETY (every call): rows below n lie in the matrix.
            while r < sn {
                let row = s0 + r;
                if pairs && r + 1 < sn {
                    let a: &mut [_; 2] = (&mut acc[r..r + 2]).try_into().expect("two rows");
                    let w2 = unsafe { [w.add(row * ldw), w.add((row + 1) * ldw)] };
                    let ahead = ahead(2);
                    unsafe { dots::<S, K, N, 2, M>(w2, x, (c0, c1), (&e.at_row(row), ahead), a) };
                    r += 2;
                } else {
                    let a: &mut [_; 1] = (&mut acc[r..r + 1]).try_into().expect("one row");
                    let w1 = unsafe { [w.add(row * ldw)] };
                    let ahead = ahead(1);
                    unsafe { dots::<S, K, N, 1, M>(w1, x, (c0, c1), (&e.at_row(row), ahead), a) };
                    r += 1;
                }
            }
        }
        for (r, a) in acc[..sn].iter().enumerate() {
            for (m, [a0, a1]) in a.iter().enumerate() {
                // SAFETY: row s0 + r's results lie in `out`.
                unsafe { *out.add((s0 + r) * ldo + m) = S::hsum(S::add(*a0, *a1)) };
            }
        }
    }
}

/// Stores `v` at `out`, vector after vector.
///
/// # Safety
/// As [`Simd`]; `out` has room for `N · LANES` floats.
#[inline(always)]
unsafe fn store<S: Simd, const N: usize>(out: *mut f32, v: &[S::F; N]) {
    for (p, vp) in v.iter().enumerate() {
        // SAFETY: by the contract.
        unsafe { S::store(out.add(S::LANES * p), *vp) };
    }
}

/// One row's `chunks` whole chunks decoded into f32 in kernel order (as the dot kernels see
/// them), for the decode-once and GEMM paths.
///
/// The block scales (times 2^64) of an FP8 chunk starting at element `e0`, lane by lane: lane
/// `j` of every decoded vector holds elements `e0 + 4j .. e0 + 4j + 3`, so with blocks of a
/// multiple of 4 each lane lies in one block — all lanes in the same one where blocks span
/// the chunk (V4's 128), two halves for V4.1's 32 on 16 lanes.
///
/// # Safety
/// `scales` covers the blocks of elements `e0 .. e0 + 4 · LANES`; `bc` is a multiple of 4.
#[inline(always)]
unsafe fn fp8_chunk_scales<S: Simd>(scales: *const f32, bc: usize, e0: usize) -> S::F {
    let chunk = 4 * S::LANES;
    let at = |e: usize| unsafe { *scales.add(e / bc) } * 2f32.powi(64);
    // SAFETY (all): within the row's scales by the contract.
    if bc.is_multiple_of(chunk) {
        return unsafe { S::splat(at(e0)) };
    }
    if 2 * bc == chunk {
        return unsafe { S::halves(at(e0), at(e0 + bc)) };
    }
    let mut lanes = [0.0f32; 16];
    for (j, l) in lanes.iter_mut().take(S::LANES).enumerate() {
        *l = at(e0 + 4 * j);
    }
    unsafe { S::load(lanes.as_ptr()) }
}

/// # Safety
/// As [`Kernels::decode`].
#[inline(always)]
pub(super) unsafe fn decode_row<S: Simd>(format: RowFormat, chunks: usize, out: *mut f32) {
    let chunk = 4 * S::LANES;
    // SAFETY (every arm): in bounds by the contract.
    unsafe {
        match format {
            RowFormat::Fp8(w) => {
                for c in 0..chunks {
                    store::<S, 4>(out.add(chunk * c), &S::fp8(w.add(chunk * c)));
                }
            }
            RowFormat::Fp8Scaled(w, scales, bc) => {
                for c in 0..chunks {
                    let sc = fp8_chunk_scales::<S>(scales, bc, chunk * c);
                    let f = S::fp8(w.add(chunk * c)).map(|v| S::mul(v, sc));
                    store::<S, 4>(out.add(chunk * c), &f);
                }
            }
            RowFormat::Bf16(w) => {
                for c in 0..chunks {
                    store::<S, 4>(out.add(chunk * c), &S::bf16(w.add(chunk * c)));
                }
            }
            RowFormat::Fp4(w, s) => {
                for c in 0..chunks {
                    store::<S, 8>(out.add(2 * chunk * c), &S::fp4(w, &s, 0, c));
                }
            }
        }
    }
}

/// The GEMM micro-kernel: a panel of `NW` weight rows (`[kc][NW]`, broadcast) times `V`
/// vectors of activation columns of the transposed activations (`xt`, one strip of
/// `LANES · V` columns a row), summed over `kc` (panel rows `0, stride, 2·stride, …`),
/// plus each tile at `adds` in order, into `out[n][0..LANES · V]`; prefetching `next`
/// along the way.
///
/// # Safety
/// As [`Simd`]; the panel holds `kc · stride · NW` floats, `xt` `kc` rows of `LANES · V`
/// floats, `out` and every `adds` tile `NW · LANES · V`.
#[inline(always)]
pub(super) unsafe fn gemm_micro<S: Simd, const NW: usize, const V: usize>(
    panel: *const f32,
    xt: *const f32,
    (kc, stride): (usize, usize),
    out: *mut f32,
    next: Prefetch,
    adds: &[*const f32],
) {
    let l = S::LANES;
    // SAFETY (every block): in bounds by the contract.
    let mut acc = [[unsafe { S::zero() }; V]; NW];
    for kk in 0..kc {
        if kk % 8 == 0 {
            next.step(kk / 8, kc.div_ceil(8));
        }
        let x: [_; V] = std::array::from_fn(|v| unsafe { S::load(xt.add((kk * V + v) * l)) });
        for (n, a) in acc.iter_mut().enumerate() {
            let wv = unsafe { S::splat(*panel.add(kk * stride * NW + n)) };
            for (av, xv) in a.iter_mut().zip(&x) {
                *av = unsafe { S::fmadd(wv, *xv, *av) };
            }
        }
    }
    for &p in adds {
        for (n, a) in acc.iter_mut().enumerate() {
            for (v, av) in a.iter_mut().enumerate() {
                *av = unsafe { S::add(*av, S::load(p.add((n * V + v) * l))) };
            }
        }
    }
    for (n, a) in acc.iter().enumerate() {
        for (v, av) in a.iter().enumerate() {
            unsafe { S::store(out.add((n * V + v) * l), *av) };
        }
    }
}

/// A family's [`Kernels`] entry points other than the GEMM's, each compiled with the
/// family's target features (`$feat`) around the bodies above.
macro_rules! kernel_entries {
    ($feat:literal) => {
        #[target_feature(enable = $feat)]
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
            unsafe { simd::rows::<Self, simd::Fp8, 4, M>(w, ldw, n, x, chunks, e, out) }
        }

        #[target_feature(enable = $feat)]
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
            unsafe { simd::rows::<Self, simd::Bf16, 4, M>(w, ldw, n, x, chunks, e, out) }
        }

        #[target_feature(enable = $feat)]
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
            unsafe { simd::rows::<Self, simd::F32, 4, M>(w, ldw, n, x, chunks, e, out) }
        }

        #[target_feature(enable = $feat)]
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
            unsafe { simd::rows::<Self, simd::Fp4, 8, M>(w, ldw, n, x, chunks, e, out) }
        }

        #[target_feature(enable = $feat)]
        unsafe fn decode(format: RowFormat, chunks: usize, out: *mut f32) {
            // SAFETY: as above.
            unsafe { simd::decode_row::<Self>(format, chunks, out) }
        }
    };
}
pub(super) use kernel_entries;
