//! One tile of a product on ggml blocks (GGUF weights).
//!
//! On Q8_0 and MXFP4 weights, an activation row whose values are exactly its Q8_0 codes
//! times their scales — or whose product was told to quantise it ([`Inputs::VecDot`]), as
//! llama.cpp's numerics do — is multiplied in integers ([`crate::ggml::dot`]): each
//! product is then exact, as in f32, and only the order of summation differs. Any other
//! row, and every row on the other blocks (their input already rounded by the planner
//! where told so), takes the portable path: the weight row decoded exactly, then an f32
//! dot. Which path a row takes depends on its own values only, so batch invariance holds.
//!
//! [`Inputs::VecDot`]: super::Inputs::VecDot

use std::cell::RefCell;
use std::ops::Range;

use super::{with_scratch, Plan};
use crate::cpu::Isa;
use crate::ggml::dot::{self, M_MAX};
use crate::ggml::q8::Q8Row;
use crate::ggml::q8k::Q8KRow;
use crate::ggml::{kdot, kgemm, Block};
use crate::matrix::Data;
use crate::vector::dot_portable;

/// Which of a tile's activation rows are exact, reused by the thread's tiles.
#[derive(Default)]
struct Rows {
    exact: Vec<usize>,
    inexact: Vec<usize>,
}

thread_local! {
    static ROWS: RefCell<Rows> = RefCell::default();
}

/// The `m` rows of `x` (`k` wide) quantised into `rows`: once per call, before any tile.
pub(super) fn quantize(x: &[f32], k: usize, rows: &mut [Q8Row]) {
    for (row, xr) in rows.iter_mut().zip(x.chunks_exact(k)) {
        row.quantize(xr);
    }
}

pub(super) fn tile(plan: &Plan, rows: Range<usize>) {
    ROWS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut r) => run(plan, rows, &mut r),
        Err(_) => run(plan, rows, &mut Rows::default()),
    })
}

fn run(plan: &Plan, rows: Range<usize>, r: &mut Rows) {
    let w = plan.w();
    let Data::Ggml { block, bytes } = &w.data else {
        unreachable!("ggml::tile runs products on ggml blocks")
    };
    if !plan.q8k.is_null() {
        return k_rows(plan, *block, bytes.as_bytes(), rows);
    }
    if *block == Block::F16 && w.cols.is_multiple_of(8) {
        return f16_rows(plan, bytes.as_bytes(), rows);
    }
    let q8: &[Q8Row] = if plan.q8.is_null() {
        &[]
    } else {
        // SAFETY: the planner quantised the plan's `m` rows before any tile runs, into the
        // call's scratch, which outlives the call.
        unsafe { std::slice::from_raw_parts(plan.q8, plan.m) }
    };
    r.exact.clear();
    r.inexact.clear();
    for i in 0..plan.m {
        if q8.get(i).is_some_and(|row| row.exact) {
            r.exact.push(i);
        } else {
            r.inexact.push(i);
        }
    }
    let rb = block.row_bytes(w.cols);
    let bytes = bytes.as_bytes();
    let wrow = |row: usize| &bytes[row * rb..(row + 1) * rb];
    exact_rows(plan, *block, (bytes, rb), rows.clone(), &r.exact, q8);
    if r.inexact.is_empty() {
        return;
    }
    for row in rows {
        with_scratch(w.cols, |buf| {
            block.decode_row(wrow(row), buf);
            for &i in &r.inexact {
                let v = dot_portable(buf, plan.x_row(i));
                // SAFETY: this tile owns row `row`'s outputs; i < m.
                unsafe { plan.store(i, 1, row..row + 1, &[[v]]) };
            }
        });
    }
}

/// The activation rows `exact` (on the Q8_0 grid) against the tile's weight rows, on the
/// integer dots: one activation row (a decode step) two weight rows at a time; several,
/// four weight rows at a time on AVX-512 (its registers hold the sixteen sums), else one.
/// Every path gives [`dot::dots_scalar`]'s bits.
fn exact_rows(
    plan: &Plan,
    block: Block,
    (bytes, rb): (&[u8], usize),
    rows: Range<usize>,
    exact: &[usize],
    q8: &[Q8Row],
) {
    let isa = plan.call_isa;
    let wrow = |row: usize| &bytes[row * rb..(row + 1) * rb];
    let group_of =
        |g: &[usize]| -> [&Q8Row; M_MAX] { std::array::from_fn(|t| &q8[g[t.min(g.len() - 1)]]) };
    let mut rows = rows;
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && exact.len() == 1 {
        let i = exact[0];
        while rows.len() >= 2 {
            let row = rows.start;
            // SAFETY: the call's family is AVX2 or wider: the CPU has AVX2, FMA and F16C.
            let v = unsafe { dot::pair_avx2(block, [wrow(row), wrow(row + 1)], &q8[i]) };
            // SAFETY: this tile owns these rows' outputs; i < m.
            unsafe { plan.store(i, 1, row..row + 2, &[[v[0]], [v[1]]]) };
            rows.start += 2;
        }
    } else if isa == Isa::Avx512 && exact.len() > 1 {
        for first in rows.clone().step_by(4) {
            let quad = first..(first + 4).min(rows.end);
            let w: [&[u8]; 4] = std::array::from_fn(|r| wrow((first + r).min(quad.end - 1)));
            for g in exact.chunks(M_MAX) {
                // SAFETY: the call's family is AVX-512: the CPU has AVX2, FMA, F16C, and
                // AVX-512 F and VL.
                let out = unsafe { dot::quad_avx512(block, w, &group_of(g)[..g.len()]) };
                for (row, out) in quad.clone().zip(out) {
                    for (&i, &v) in g.iter().zip(&out) {
                        // SAFETY: this tile owns row `row`'s outputs; i < m.
                        unsafe { plan.store(i, 1, row..row + 1, &[[v]]) };
                    }
                }
            }
        }
        return;
    }
    for row in rows {
        for g in exact.chunks(M_MAX) {
            let xs = group_of(g);
            let mut out = [0.0f32; M_MAX];
            if isa >= Isa::Avx2 {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the call's family is AVX2 or wider, so the CPU has AVX2 and FMA.
                unsafe {
                    dot::dots_avx2(block, wrow(row), &xs[..g.len()], &mut out)
                };
            } else {
                dot::dots_scalar(block, wrow(row), &xs[..g.len()], &mut out);
            }
            for (&i, &v) in g.iter().zip(&out) {
                // SAFETY: this tile owns row `row`'s outputs; i < m.
                unsafe { plan.store(i, 1, row..row + 1, &[[v]]) };
            }
        }
    }
}

/// A product on F16 weights ([`crate::ggml::f16dot`]), up to [`M_MAX`] activation rows
/// (rounded by the planner where told so) per weight row read.
fn f16_rows(plan: &Plan, bytes: &[u8], rows: Range<usize>) {
    let avx2 = cfg!(target_arch = "x86_64") && plan.call_isa >= Isa::Avx2;
    grouped(
        plan,
        bytes,
        2 * plan.w().cols,
        rows,
        |wrow, first, n, out| {
            let xs: [&[f32]; M_MAX] = std::array::from_fn(|t| plan.x_row(first + t.min(n - 1)));
            if avx2 {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the call's family is AVX2 or wider: the CPU has AVX2, FMA and F16C;
                // the row and the activations are `cols` (a multiple of 8) wide.
                unsafe {
                    crate::ggml::f16dot::dots_avx2(wrow, &xs[..n], out)
                };
            } else {
                crate::ggml::f16dot::dots_scalar(wrow, &xs[..n], out);
            }
        },
    );
}

/// A K-quant product on Q8_K rows (its input quantised by the planner): every row on the
/// integer dots ([`crate::ggml::kdot`]), up to [`M_MAX`] activation rows per weight row read.
fn k_rows(plan: &Plan, block: Block, bytes: &[u8], rows: Range<usize>) {
    // SAFETY: the planner quantised the plan's `m` rows before any tile runs, into the
    // call's scratch, which outlives the call.
    let q8k = unsafe { std::slice::from_raw_parts(plan.q8k, plan.m) };
    let rb = block.row_bytes(plan.w().cols);
    let kernel = gemm_kernel(plan.call_isa);
    // Q3_K and Q5_K have only the GEMM; the others take it from `FROM` rows where the
    // family has one (the same bits either way).
    let on_kdots = kdot::BLOCKS.contains(&block) && (plan.m < kgemm::FROM || kernel.is_none());
    if !on_kdots {
        let kernel = kernel.unwrap_or(kgemm::sb4_scalar);
        return k_gemm(plan, block, bytes, rb, rows, q8k, kernel);
    }
    let avx2 = cfg!(target_arch = "x86_64") && plan.call_isa >= Isa::Avx2;
    grouped(plan, bytes, rb, rows, |wrow, first, n, out| {
        let xs: [&Q8KRow; M_MAX] = std::array::from_fn(|t| &q8k[first + t.min(n - 1)]);
        if avx2 {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the call's family is AVX2 or wider: the CPU has AVX2 and F16C.
            unsafe {
                kdot::kdots_avx2(block, wrow, &xs[..n], out)
            };
        } else {
            kdot::kdots_scalar(block, wrow, &xs[..n], out);
        }
    });
}

/// The integer GEMM's kernel for family `isa` (none for the scalar one, which keeps
/// [`kdot`] where it can: the same bits).
fn gemm_kernel(isa: Isa) -> Option<kgemm::Kernel> {
    #[cfg(target_arch = "x86_64")]
    {
        if isa == Isa::Avx512 && crate::cpu::vnni_detected() {
            return Some(kgemm::sb4_avx512);
        }
        if isa >= Isa::Avx2 {
            return Some(kgemm::sb4_avx2);
        }
    }
    let _ = isa;
    None
}

/// A K-quant product on the integer GEMM ([`kgemm`]): each four weight rows' super-blocks
/// unpacked once for all `m` activation rows.
fn k_gemm(
    plan: &Plan,
    block: Block,
    bytes: &[u8],
    rb: usize,
    rows: Range<usize>,
    q8k: &[Q8KRow],
    kernel: kgemm::Kernel,
) {
    ACC.with(|cell| {
        let mut acc = cell.borrow_mut();
        acc.resize(plan.m, [0.0; kgemm::ROWS]);
        for first in rows.clone().step_by(kgemm::ROWS) {
            let group = first..(first + kgemm::ROWS).min(rows.end);
            let w: [&[u8]; kgemm::ROWS] = std::array::from_fn(|r| {
                let r = (first + r).min(group.end - 1);
                &bytes[r * rb..(r + 1) * rb]
            });
            kgemm::rows4(block, &w[..group.len()], q8k, &mut acc, kernel);
            for (t, a) in acc.iter().enumerate() {
                let out: [[f32; 1]; kgemm::ROWS] = std::array::from_fn(|r| [a[r]]);
                // SAFETY: this tile owns the group's outputs; t < m.
                unsafe { plan.store(t, 1, group.clone(), &out) };
            }
        }
    })
}

thread_local! {
    /// The GEMM's sums, `m` rows of [`kgemm::ROWS`], reused by the thread's tiles.
    static ACC: RefCell<Vec<[f32; kgemm::ROWS]>> = const { RefCell::new(Vec::new()) };
}

/// Every weight row of the tile (`rb` bytes each) against the plan's activation rows in
/// groups of up to [`M_MAX`]: `dots(weight row, first activation row, count, out)` fills
/// `out[..count]`, which is stored.
fn grouped(
    plan: &Plan,
    bytes: &[u8],
    rb: usize,
    rows: Range<usize>,
    dots: impl Fn(&[u8], usize, usize, &mut [f32]),
) {
    for row in rows {
        let wrow = &bytes[row * rb..(row + 1) * rb];
        for first in (0..plan.m).step_by(M_MAX) {
            let n = M_MAX.min(plan.m - first);
            let mut out = [0.0f32; M_MAX];
            dots(wrow, first, n, &mut out);
            for (t, &v) in out[..n].iter().enumerate() {
                // SAFETY: this tile owns row `row`'s outputs; the row index is below m.
                unsafe { plan.store(first + t, 1, row..row + 1, &[[v]]) };
            }
        }
    }
}
