//! The GEMM path, for prefill-sized batches (and batched decode's, from a few rows on
//! AVX-512): a group of weight rows is decoded once into f32 rows and packed into a panel
//! `[k][rows]`, and a micro-kernel multiplies the panel with the activations transposed
//! once per call (`xt`, strips `[k][columns]`): each step of the inner dimension broadcasts
//! the group's weights (consecutive floats, one address register) against one or two
//! vectors of activation columns, with every accumulator in a register for the whole inner
//! dimension.
//!
//! It sums in the dot kernels' order: they keep `2 · LANES` independent sums per output
//! (lane `l` of the even vectors of every chunk, lane `l` of the odd ones), so element `q`
//! of the kernel order goes to sum `q mod 2·LANES`, in order. The micro-kernel sums one such
//! *stream* at a time (every `2·LANES`-th element; the activations are transposed and the
//! panel packed stream by stream, [`crate::linear::stream_slot`]), and its
//! epilogue folds the streams as the dot kernels' last step does, so a row's result is the
//! same bits on either path: whatever batch a token shares, it gets the same logits (what
//! makes a cached prefix equal to a cold prefill, bit for bit). That holds with power-of-two
//! FP8 block scales, as every V4 checkpoint has (the fused path scales the activations, the
//! GEMM the weights).

use super::{tails, Kernels, Out, Prefetch, Rows, M_MAX};
use crate::linear::{stream_slot, Plan};
use std::arch::x86_64::*;
use std::ops::Range;

/// Padding after each decoded weight row, so the rows a pack reads (`k` floats apart, `k`
/// often a multiple of 4 KiB) do not all fall in the same L1 sets.
const ROW_PAD: usize = 16;
/// The largest micro-tile of any family (AVX-512: 12 rows × 32 columns or 24 × 16).
const TILE_MAX: usize = 12 * 32;
/// The most lanes of any family (AVX-512: 16).
const LANES_MAX: usize = 16;

/// `out[slot(kk) · nr + n] = src[n · lds + kk]`: `nr` rows of `kc` floats (a multiple of 8
/// and of `streams`) into a panel, in 8 × 8 blocks transposed in registers, the panel rows
/// stream by stream as the activations are ([`stream_slot`]), so that the micro-kernel,
/// which sums one stream at a time, reads its broadcasts front to back (in kernel order
/// they lie `streams` panel rows apart: a new, mostly unused cache line every step, from
/// L2 once the panel outgrows L1).
///
/// # Safety
/// The CPU has AVX2; `src` holds the rows, `out` `kc · nr` floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn pack(
    src: *const f32,
    lds: usize,
    nr: usize,
    (kc, streams): (usize, usize),
    out: *mut f32,
) {
    let slot = |kk: usize| stream_slot(kk, streams, kc);
    let full = nr / 8 * 8;
    for n0 in (0..full).step_by(8) {
        for k0 in (0..kc).step_by(8) {
            // SAFETY (every block): rows n0..n0 + 8 and columns k0..k0 + 8 are in bounds.
            let r: [__m256; 8] =
                std::array::from_fn(|i| unsafe { _mm256_loadu_ps(src.add((n0 + i) * lds + k0)) });
            let t = [
                _mm256_unpacklo_ps(r[0], r[1]),
                _mm256_unpackhi_ps(r[0], r[1]),
                _mm256_unpacklo_ps(r[2], r[3]),
                _mm256_unpackhi_ps(r[2], r[3]),
                _mm256_unpacklo_ps(r[4], r[5]),
                _mm256_unpackhi_ps(r[4], r[5]),
                _mm256_unpacklo_ps(r[6], r[7]),
                _mm256_unpackhi_ps(r[6], r[7]),
            ];
            let u = [
                _mm256_shuffle_ps::<0x44>(t[0], t[2]),
                _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
                _mm256_shuffle_ps::<0x44>(t[1], t[3]),
                _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
                _mm256_shuffle_ps::<0x44>(t[4], t[6]),
                _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
                _mm256_shuffle_ps::<0x44>(t[5], t[7]),
                _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
            ];
            for j in 0..4 {
                let lo = _mm256_permute2f128_ps::<0x20>(u[j], u[j + 4]);
                let hi = _mm256_permute2f128_ps::<0x31>(u[j], u[j + 4]);
                unsafe {
                    _mm256_storeu_ps(out.add(slot(k0 + j) * nr + n0), lo);
                    _mm256_storeu_ps(out.add(slot(k0 + j + 4) * nr + n0), hi);
                }
            }
        }
    }
    for n in full..nr {
        for kk in 0..kc {
            // SAFETY: as above.
            unsafe { *out.add(slot(kk) * nr + n) = *src.add(n * lds + kk) };
        }
    }
}

/// The partial sums a lane's odd stream adds in its epilogue, in order: its even stream's
/// (already in `lane`'s slot), then those of the lanes the fused kernels' halving tree adds
/// to it (`lane + lanes/2`, `+ lanes/4`, … while `lane` is below that half), which are final
/// by then as lanes run from the last. Slots are `len` floats apart from `base`.
fn fold_partners(
    base: *const f32,
    lane: usize,
    lanes: usize,
    len: usize,
) -> ([*const f32; 5], usize) {
    let mut adds = [std::ptr::null(); 5];
    adds[0] = base.wrapping_add(lane * len);
    let mut n = 1;
    let mut half = lanes / 2;
    while half > 0 {
        if lane < half {
            adds[n] = base.wrapping_add((lane + half) * len);
            n += 1;
        }
        half /= 2;
    }
    (adds, n)
}

/// One micro-tile in the fused kernels' order: each of the `2 · LANES` streams summed on its
/// own (`run` rows: a contiguous run of the panel if it is packed stream by stream, `sorted`,
/// else every `2 · LANES`-th row; a contiguous run of the strip `xt = (strip, xw)`), lane by
/// lane from the last, even stream then odd, the odd one's
/// epilogue folding ([`fold_partners`]); the tile's results end in `partial[..nr · xw]`.
///
/// # Safety
/// As [`Kernels::gemm`] for every stream; `partial` holds `LANES · nr · xw` floats.
unsafe fn stream_sums<K: Kernels>(
    (panel, sorted): (*const f32, bool),
    nr: usize,
    (strip, xw): (*const f32, usize),
    run: usize,
    partial: &mut [f32],
    next: Prefetch,
) {
    let (lanes, len) = (K::LANES, nr * xw);
    let streams = 2 * lanes;
    assert!(partial.len() >= lanes * len);
    let base = partial.as_mut_ptr();
    for lane in (0..lanes).rev() {
        for (odd, st) in [(false, lane), (true, lanes + lane)] {
            let (adds, n_adds) = if odd {
                fold_partners(base.cast_const(), lane, lanes, len)
            } else {
                ([std::ptr::null(); 5], 0)
            };
            let next = Prefetch {
                at: next.at.wrapping_add(st * next.bytes / streams),
                bytes: (st + 1) * next.bytes / streams - st * next.bytes / streams,
            };
            let (first, stride) = if sorted { (st * run, 1) } else { (st, streams) };
            // SAFETY: stream `st` is panel rows `first + stride · j` and strip rows
            // `st · run ..` (the caller's contract); slot `lane` lies in `partial`.
            unsafe {
                K::gemm(
                    panel.add(first * nr),
                    nr,
                    (strip.add(st * run * xw), xw),
                    (run, stride),
                    base.add(lane * len),
                    next,
                    &adds[..n_adds],
                )
            };
        }
    }
}

/// What every micro-tile of one [`gemm_rows`] call shares.
struct TileRun<'a, 'b> {
    plan: &'a Plan,
    how: &'a Rows<'b>,
    /// The first of the call's weight rows.
    row0: usize,
    /// Elements per row the micro-kernels cover (the rest is the scalar tail).
    main: usize,
    /// Panel rows per stream (`main / (2 · LANES)`).
    run: usize,
    /// Whether the panel is packed stream by stream ([`pack`]).
    sorted: bool,
}

impl TileRun<'_, '_> {
    /// Rows `row0 + n0 ..` (`nr` of them, packed in `panel`) against the strip of columns
    /// from `m0`: the micro-kernels' sums (in the fused kernels' streams when the plan is
    /// batch invariant), then each output's rescale and scalar tail, into `y`.
    ///
    /// # Safety
    /// As [`gemm_rows`]; the panel holds `main` rows of `nr` floats, this tile owns its
    /// outputs, `partial` holds `LANES_MAX` tiles.
    unsafe fn tile<K: Kernels>(
        &self,
        panel: &[f32],
        (m0, n0, nr): (usize, usize, usize),
        next: Prefetch,
        partial: &mut [f32],
    ) {
        let (plan, main) = (self.plan, self.main);
        let (k, m) = (plan.w().cols, plan.m);
        let (xt, xw, xw_last) = plan.xt();
        let xw = if m0 + xw >= m { xw_last } else { xw };
        let cols = xw.min(m - m0);
        let row0 = self.row0 + n0;
        // The outputs' cache lines, fetched while the micro-kernel computes (writing them
        // cold stalls on every line).
        for c in 0..cols {
            let y = plan.y.wrapping_add((m0 + c) * plan.n + row0 - plan.row0);
            for line in (0..nr).step_by(16) {
                // SAFETY: a prefetch never faults.
                unsafe { _mm_prefetch(y.wrapping_add(line).cast::<i8>(), _MM_HINT_T0) };
            }
        }
        let len = nr * xw;
        if main > 0 && !plan.invariant {
            // SAFETY: the panel holds `main` rows of `nr` floats, the strip of `xt`
            // `k` rows of `xw` floats, `partial` at least NW · XW floats.
            unsafe {
                let x = (xt.add(m0 * k), xw);
                K::gemm(
                    panel.as_ptr(),
                    nr,
                    x,
                    (main, 1),
                    partial.as_mut_ptr(),
                    next,
                    &[],
                )
            };
        } else if main > 0 {
            let strip = xt.wrapping_add(m0 * k);
            // SAFETY: the panel holds `main` rows of `nr` floats, the strip `k` rows of
            // `xw` floats laid out stream by stream; `partial` holds LANES_MAX tiles.
            unsafe {
                let panel = (panel.as_ptr(), self.sorted);
                stream_sums::<K>(panel, nr, (strip, xw), self.run, partial, next)
            };
        } else {
            partial[..len].fill(0.0);
        }
        // SAFETY: as the function's.
        unsafe { self.store(&partial[..len], (m0, cols, xw), row0, nr) };
    }

    /// Writes a tile's results `out` (`[row][column]`, `xw` columns a row) for columns
    /// `m0 .. m0 + cols` and rows `row0 .. row0 + nr`, rescaled, plus each output's scalar
    /// tail. Column by column: a column's rows are contiguous in `y` (`[m][n]`), so the
    /// stores stream instead of striding `n` floats (often a multiple of 4 KiB, which lands
    /// every store of a row in the same L1 set).
    ///
    /// # Safety
    /// This tile owns those outputs.
    unsafe fn store(
        &self,
        out: &[f32],
        (m0, cols, xw): (usize, usize, usize),
        row0: usize,
        nr: usize,
    ) {
        let (plan, how, main) = (self.plan, self.how, self.main);
        let k = plan.w().cols;
        // The plan's activations are as given here (the kernels' layout is in `xt`), so the
        // tail takes the exact weights with no factor to undo.
        let (exact, mult) = how.exact.unwrap_or((how.weight, 1.0));
        for c in 0..cols {
            // SAFETY: (m0 + c, row0 + t) for t < nr belongs to this tile.
            let y = unsafe {
                std::slice::from_raw_parts_mut(plan.y.add((m0 + c) * plan.n + row0 - plan.row0), nr)
            };
            for (t, v) in y.iter_mut().enumerate() {
                *v = out[t * xw + c] * how.post;
            }
            if main < k {
                for (t, v) in y.iter_mut().enumerate() {
                    let mut o: Out = [[0.0; M_MAX]; 2];
                    let mut xs = [std::ptr::null(); M_MAX];
                    xs[0] = plan.x_row(m0 + c).as_ptr();
                    tails(&mut o, row0 + t..row0 + t + 1, 1, xs, main..k, mult, exact);
                    *v += o[0][0];
                }
            }
        }
    }
}

/// Rows `rows` of the plan's matrix against the activation strips of `part`.
///
/// # Safety
/// As the tile's; the plan holds the transposed activations for family `K`.
pub(super) unsafe fn gemm_rows<K: Kernels>(
    plan: &Plan,
    rows: Range<usize>,
    part: usize,
    how: &Rows,
) {
    let k = plan.w().cols;
    let main = how.main_elems::<K>();
    let (_, xw, _) = plan.xt();
    let nw = K::GEMM_NW[xw / K::LANES - 1];
    let ldw = k + ROW_PAD;
    let n_rows = rows.len();
    // Few activation strips: decode and pack a group's rows just before they are used
    // (they stay in L1/L2); many: the whole tile once, then sweep the strips over it.
    let mine = plan.strips_of(part);
    let per_group = mine.len() <= 3;
    // A whole tile's panel is packed stream by stream, the order the micro-kernel reads it
    // in (see `pack`: 512 rows 9-16 % faster on an Intel Xeon); a group's, read once or
    // twice while fresh, keeps the kernel order, which packs faster (sorted, 16-32 rows
    // lost 5-15 %).
    let streams = if plan.invariant && !per_group {
        2 * K::LANES
    } else {
        1
    };
    let run = TileRun {
        plan,
        how,
        row0: rows.start,
        main,
        run: main / (2 * K::LANES),
        sorted: streams > 1,
    };
    let panel_len = if per_group { nw * main } else { n_rows * main };
    super::super::with_scratch3(nw * ldw + panel_len, |buf| {
        let (rowbuf, panels) = buf.split_at_mut(nw * ldw);
        // Rows first..first + n decoded and packed into `panel` ([main][n]).
        let mut prepare = |panel: &mut [f32], first: usize, n: usize| {
            let (src, lds) = match how.in_place {
                Some(row) => (row(first), k),
                None => {
                    for t in 0..n {
                        (how.decode)(first + t, rowbuf[t * ldw..].as_mut_ptr());
                    }
                    (rowbuf.as_ptr(), ldw)
                }
            };
            // SAFETY: n rows of at least `main` floats, `lds` apart; the panel holds
            // main · n floats; every AVX family has AVX2.
            unsafe { pack(src, lds, n, (main, streams), panel.as_mut_ptr()) };
        };
        // Each lane's folded sums; lane 0 ends with the tile's results.
        let mut partial = [0.0f32; LANES_MAX * TILE_MAX];
        let strips = mine.clone().map(|s| s * xw);
        if per_group {
            // The rows decoded next (past the tile: the matrix's next rows) are fetched from
            // memory while this group computes.
            let (stored, row_bytes) = how.stored;
            let w_rows = plan.w().rows;
            for n0 in (0..n_rows).step_by(nw) {
                let nr = nw.min(n_rows - n0);
                prepare(panels, rows.start + n0, nr);
                let first = rows.start + n0 + nr;
                let next = Prefetch {
                    at: stored.wrapping_add(first * row_bytes),
                    bytes: nw.min(w_rows.saturating_sub(first)) * row_bytes,
                };
                for (i, m0) in strips.clone().enumerate() {
                    let next = if i == 0 { next } else { Prefetch::NONE };
                    // SAFETY: as the function's; the group's panel was just packed.
                    unsafe { run.tile::<K>(panels, (m0, n0, nr), next, &mut partial) };
                }
            }
        } else {
            for n0 in (0..n_rows).step_by(nw) {
                let nr = nw.min(n_rows - n0);
                prepare(&mut panels[n0 * main..], rows.start + n0, nr);
            }
            for m0 in strips {
                for n0 in (0..n_rows).step_by(nw) {
                    let (nr, panel) = (nw.min(n_rows - n0), &panels[n0 * main..]);
                    // SAFETY: as the function's; every panel was packed above.
                    unsafe { run.tile::<K>(panel, (m0, n0, nr), Prefetch::NONE, &mut partial) };
                }
            }
        }
    })
}
