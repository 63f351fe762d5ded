//! The GEMM path, for prefill-sized batches (and the experts' share of one): a tile's
//! weight rows are decoded once into f32 rows, and multiplied with the activations
//! transposed once per call (`xt: [k][m]`) by a micro-kernel that broadcasts `NW` weights
//! and multiplies two vectors of activation columns, keeping `2 · NW` accumulators in
//! registers over the whole inner dimension. Nothing is packed per tile beyond the decode
//! the dot path does anyway, so the path pays off from a few dozen activation rows.
//!
//! It sums each output over `k` in one lane, unlike the dot kernels, so a row's result
//! differs from the small-batch path in the last bits; batches this large are prefills (or
//! their experts), not the decode steps whose rows must not depend on their neighbours.

use super::{tails, Kernels, Out, Prefetch, Rows, M_MAX};
use crate::linear::Plan;
use std::ops::Range;

/// Activation rows from which the GEMM path is used.
pub(super) const M_GEMM: usize = crate::linear::GEMM_M;
/// Padding after each decoded weight row, so the `NW` rows a micro-kernel broadcasts from
/// (`k` floats apart, `k` often a multiple of 4 KiB) do not all fall in the same L1 sets.
const ROW_PAD: usize = 16;
/// The largest micro-tile of any family (AVX-512: 12 rows × 32 columns or 24 × 16).
const TILE_MAX: usize = 12 * 32;

/// Rows `rows` of the plan's matrix against every activation row.
///
/// # Safety
/// As the tile's; the plan holds the transposed activations for family `K`.
pub(super) unsafe fn gemm_rows<K: Kernels>(plan: &Plan, rows: Range<usize>, how: &Rows) {
    let (k, m) = (plan.w().cols, plan.m);
    let main = how.main_elems::<K>();
    let (xt, xw, xw_last) = plan.xt();
    let nw = K::GEMM_NW[xw / K::LANES - 1];
    let ldw = k + ROW_PAD;
    // Few activation strips: decode a micro-tile's rows just before they are used (they
    // stay in L1/L2); many: decode the whole tile once and sweep the strips over it.
    let strips = m.div_ceil(xw);
    let per_group = strips <= 3;
    let buf_rows = if per_group { nw } else { rows.len() };
    super::super::with_scratch3(buf_rows * ldw, |wbuf| {
        let decode = |wbuf: &mut [f32], first: usize, n: usize| {
            for t in 0..n {
                let r = first + t;
                let dst = &mut wbuf[t * ldw..t * ldw + k];
                match how.in_place {
                    // SAFETY: an F32 row holds k floats.
                    Some(row) => {
                        dst.copy_from_slice(unsafe { std::slice::from_raw_parts(row(r), k) })
                    }
                    None => (how.decode)(r, dst.as_mut_ptr()),
                }
            }
        };
        if !per_group {
            decode(wbuf, rows.start, rows.len());
        }
        let mut out = [0.0f32; TILE_MAX];
        let n_rows = rows.len();
        // The plan's activations are as given here (the kernels' layout is in `xt`), so the
        // tail takes the exact weights with no factor to undo.
        let (exact, mult) = how.exact.unwrap_or((how.weight, 1.0));
        let mut tile = |wrows: &[f32], m0: usize, n0: usize, nr: usize, next: Prefetch| {
            let xw = if m0 + xw >= m { xw_last } else { xw };
            let cols = xw.min(m - m0);
            let row0 = rows.start + n0;
            // The outputs' cache lines, fetched while the micro-kernel computes (writing them
            // cold stalls on every line).
            for c in 0..cols {
                let y = plan.y.wrapping_add((m0 + c) * plan.n + row0 - plan.row0);
                for line in (0..nr).step_by(16) {
                    // SAFETY: a prefetch never faults.
                    unsafe {
                        std::arch::x86_64::_mm_prefetch(
                            y.wrapping_add(line).cast::<i8>(),
                            std::arch::x86_64::_MM_HINT_T0,
                        )
                    };
                }
            }
            if main > 0 {
                // SAFETY: decoded rows hold `main` floats, the strip of `xt` holds `k` rows
                // of `xw` floats, `out` holds NW · XW floats.
                unsafe {
                    K::gemm(
                        wrows.as_ptr(),
                        ldw,
                        nr,
                        xt.add(m0 * k),
                        xw,
                        main,
                        out.as_mut_ptr(),
                        next,
                    )
                };
            } else {
                out[..nr * xw].fill(0.0);
            }
            // Column by column: a column's rows are contiguous in `y` (`[m][n]`), so the
            // stores stream instead of striding `n` floats (often a multiple of 4 KiB, which
            // lands every store of a row in the same L1 set).
            for c in 0..cols {
                // SAFETY: (m0 + c, row0 + t) for t < nr belongs to this tile.
                let y = unsafe {
                    std::slice::from_raw_parts_mut(
                        plan.y.add((m0 + c) * plan.n + row0 - plan.row0),
                        nr,
                    )
                };
                for (t, v) in y.iter_mut().enumerate() {
                    *v = out[t * xw + c] * how.post;
                }
                if main < k {
                    for (t, v) in y.iter_mut().enumerate() {
                        let mut o: Out = [[0.0; M_MAX]; 2];
                        let mut xs = [std::ptr::null(); M_MAX];
                        xs[0] = plan.x_row(m0 + c).as_ptr();
                        tails(&mut o, row0 + t..row0 + t + 1, 1, xs, main, k, mult, exact);
                        *v += o[0][0];
                    }
                }
            }
        };
        if per_group {
            // The rows decoded next (past the tile: the matrix's next rows) are fetched from
            // memory while this group computes.
            let (stored, row_bytes) = how.stored;
            let w_rows = plan.w().rows;
            for n0 in (0..n_rows).step_by(nw) {
                let nr = nw.min(n_rows - n0);
                decode(wbuf, rows.start + n0, nr);
                let first = rows.start + n0 + nr;
                let next = Prefetch {
                    at: stored.wrapping_add(first * row_bytes),
                    bytes: nw.min(w_rows.saturating_sub(first)) * row_bytes,
                };
                for m0 in (0..m).step_by(xw) {
                    let next = if m0 == 0 { next } else { Prefetch::NONE };
                    tile(&wbuf[..], m0, n0, nr, next);
                }
            }
        } else {
            for m0 in (0..m).step_by(xw) {
                for n0 in (0..n_rows).step_by(nw) {
                    tile(
                        &wbuf[n0 * ldw..],
                        m0,
                        n0,
                        nw.min(n_rows - n0),
                        Prefetch::NONE,
                    );
                }
            }
        }
    })
}
