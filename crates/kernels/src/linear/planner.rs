//! Planning one call's products: which path each takes (fused, GEMM, AMX, bf16 dots), the
//! activation copies it needs (prepared, transposed, AMX pairs) carved from the call's
//! scratch, shared between products with the same activations, and its place in the call's
//! tiles.

use super::{
    family, fp4_x_mult, on_amx, on_dots, prepare, row_step, tile_rows, x_stride, CallScratch,
    Inputs, Matmul, Plan, BATCH_INVARIANT, FP8_DOTS_FROM,
};
use crate::cpu::Isa;
use crate::formats::{bf16_to_f32, f32_to_bf16};
use crate::ggml::VecDot;
use crate::matrix::Format;

/// How a call routes its products: the kernel family, whether AMX tiles and bf16 dot
/// products are in use, and from how many activation rows the GEMM path takes over.
#[derive(Clone, Copy)]
struct Route {
    isa: Isa,
    tiles: bool,
    dots: bool,
    from: usize,
}

fn lanes(f: Isa) -> usize {
    if f == Isa::Avx512 {
        16
    } else {
        8
    }
}

/// The factor FP4 activations are laid out with on family `fam` (1 for other formats).
fn x_mult(format: Format, fam: Isa) -> f32 {
    if format == Format::Fp4 {
        fp4_x_mult(fam)
    } else {
        1.0
    }
}

impl Route {
    fn amx(&self, j: &Matmul) -> bool {
        on_amx(j, self.isa, self.tiles)
    }

    fn dots(&self, j: &Matmul) -> bool {
        let fp8_window = j.w.format() != Format::Fp8 || (FP8_DOTS_FROM..self.from).contains(&j.m);
        !self.amx(j) && fp8_window && on_dots(j, self.isa, self.dots)
    }

    /// Activations in the kernels' layout: a permuted copy for the fused and decode-once
    /// paths (made here), the transposition pass's own for the GEMM path.
    fn laid_out(&self, j: &Matmul) -> bool {
        family(j.w, self.isa) != Isa::Scalar
            && j.w.format() != Format::F32
            && j.m > 0
            && !self.amx(j)
    }

    /// Whether `j` gets a prepared copy of its activations. F32 weights need no layout, but
    /// several activation rows still get a copy whose rows are padded apart (see
    /// `x_stride`).
    fn needs_prep(&self, j: &Matmul) -> bool {
        let f = family(j.w, self.isa);
        f != Isa::Scalar
            && j.m > 0
            && (j.m < self.from || self.dots(j))
            && (j.w.format() != Format::F32 || j.m > 1)
            && !self.amx(j)
    }

    /// The GEMM path reads the activations transposed, in strips of two vectors of
    /// columns, or of one where that pads less (16 rows: one strip of 16, not half of 32;
    /// 48: three), the last one narrower where that pads less: one vector, or on AVX-512
    /// half of one (its 256-bit FMAs do as much per cycle where cores split 512-bit ones,
    /// as Zen 4 does, and none of it on padding: an expert's 40 rows are 16 + 16 + 8, not
    /// 48). Returns the columns of the transposed copy, the strip width and the last
    /// strip's; `None` off the GEMM path.
    fn gemm_cols(&self, j: &Matmul) -> Option<(usize, usize, usize)> {
        let f = family(j.w, self.isa);
        let l = lanes(f);
        // AVX2's one-vector micro-kernel (12 rows × 8 columns) multiplies at 40-60 % of the
        // rate of its two-vector one (6 × 16): 50-57 against 91-140 GFLOP/s at 200 and 500
        // rows on two cores of an AVX2-only EPYC (`bench kernels --shapes flash`,
        // docs/PERFORMANCE.md). So there the strips are two vectors wide and only the last
        // may be one.
        let pads_less = j.m.next_multiple_of(2 * l) - j.m > j.m.next_multiple_of(l) - j.m;
        let xw = if pads_less && (f == Isa::Avx512 || j.m <= l) {
            l
        } else {
            2 * l
        };
        let rem = j.m % xw;
        let last = match rem {
            0 => xw,
            r if f == Isa::Avx512 && r <= l / 2 => l / 2,
            r if r <= l => l,
            _ => xw,
        };
        let cols = j.m - rem + if rem == 0 { 0 } else { last };
        let gemm = f != Isa::Scalar && j.m >= self.from && !self.amx(j) && !self.dots(j);
        gemm.then_some((cols, xw, last))
    }

    /// Floats of the AMX path's activation pairs for `j`.
    fn pairs_len(&self, j: &Matmul) -> usize {
        #[cfg(target_arch = "x86_64")]
        return super::x86::amx::pairs_len(j.m, j.w.cols);
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = j;
            0
        }
    }
}

/// Fills `s` with the plans of `jobs`, permuting activations for the fused kernels.
pub(super) fn plan(
    jobs: &mut [Matmul<'_>],
    (isa, tiles, dots): (Isa, bool, bool),
    from: usize,
    s: &mut CallScratch,
) {
    s.plans.clear();
    let r = Route {
        isa,
        tiles,
        dots,
        from,
    };
    reserve(jobs, &r, s);
    let invariant = BATCH_INVARIANT.with(|c| c.get());
    let mut at = Offsets::default();
    for j in jobs.iter_mut() {
        let p = plan_one(j, &r, invariant, s, &mut at);
        if j.m > 0 && p.tiles() > 0 {
            at.tiles_before += p.tiles();
            s.plans.push(p);
        }
    }
}

/// Grows the scratch for every copy the call's products need, each starting on a cache
/// line.
fn reserve(jobs: &[Matmul<'_>], r: &Route, s: &mut CallScratch) {
    let prep_len: usize = jobs
        .iter()
        .filter(|j| r.needs_prep(j))
        .map(|j| (j.m * x_stride(j.w.cols, j.m)).next_multiple_of(16))
        .sum();
    s.prepared.grow(prep_len);
    let rounded_len: usize = jobs
        .iter()
        .filter(|j| rounding(j).is_some())
        .map(|j| (j.m * j.w.cols).next_multiple_of(16))
        .sum();
    s.rounded.grow(rounded_len);
    let t_len: usize = jobs
        .iter()
        .filter_map(|j| {
            r.gemm_cols(j)
                .map(|(c, _, _)| (c * j.w.cols).next_multiple_of(16))
        })
        .sum();
    s.transposed.grow(t_len);
    let p_len: usize = jobs
        .iter()
        .filter(|j| r.amx(j))
        .map(|j| r.pairs_len(j))
        .sum();
    s.pairs.grow(p_len);
    // Grown before any plan points into them.
    let rows = |act| -> usize { jobs.iter().filter(|j| int_dots(j, act)).map(|j| j.m).sum() };
    grow_rows(&mut s.q8, rows(VecDot::Q8_0));
    grow_rows(&mut s.q8k, rows(VecDot::Q8K));
}

/// `v` holding at least `n` rows.
fn grow_rows<T: Default>(v: &mut Vec<T>, n: usize) {
    if v.len() < n {
        v.resize_with(n, T::default);
    }
}

/// Whether `j` is a product on ggml blocks that the integer dots take on `act` rows: Q8_0
/// rows are quantised for any input (a row on their grid is exact), Q8_K rows only for a
/// product told to quantise its input.
fn int_dots(j: &Matmul, act: VecDot) -> bool {
    let told = act == VecDot::Q8_0 || j.inputs == Inputs::VecDot;
    matches!(j.w.format(), Format::Ggml(b) if b.has_int_dots() && b.vec_dot() == act) && told
}

/// A K-quant product's activations as Q8_K rows: a twin's (an earlier product of the same
/// activations: an expert's gate and up), or quantised here into the call's scratch; null
/// unless [`int_dots`] takes it.
fn q8k_rows(j: &Matmul, s: &mut CallScratch, at: &mut Offsets) -> *const crate::ggml::q8k::Q8KRow {
    if !int_dots(j, VecDot::Q8K) {
        return std::ptr::null();
    }
    let k = j.w.cols;
    let twin = s
        .plans
        .iter()
        .find(|p| p.src == j.x.as_ptr() && p.m == j.m && p.k == k && !p.q8k.is_null());
    if let Some(p) = twin {
        return p.q8k;
    }
    let rows = &mut s.q8k[at.q8k..at.q8k + j.m];
    at.q8k += j.m;
    for (row, x) in rows.iter_mut().zip(j.x.chunks_exact(k)) {
        row.quantize(x);
    }
    rows.as_ptr()
}

/// How a product told to quantise its own input ([`Inputs::VecDot`]) rounds it, where it
/// reads a rounded copy: the blocks without integer dots to their `vec_dot_type`, BF16
/// weights to bf16 (llama.cpp's `vec_dot_type` for them). The integer blocks quantise into
/// [`q8_rows`] instead; f32 weights read the values as they are.
fn rounding(j: &Matmul) -> Option<fn(&mut [f32])> {
    if j.inputs != Inputs::VecDot {
        return None;
    }
    match j.w.format() {
        Format::Ggml(b) if !b.has_int_dots() => Some(match b.vec_dot() {
            VecDot::Q8_0 => |x| VecDot::Q8_0.round_trip(x),
            VecDot::Q8K => |x| VecDot::Q8K.round_trip(x),
            VecDot::F16 => |x| VecDot::F16.round_trip(x),
        }),
        Format::Bf16 => Some(|x| x.iter_mut().for_each(|v| *v = bf16_to_f32(f32_to_bf16(*v)))),
        _ => None,
    }
}

/// The activations a product reads: the caller's, or a copy rounded as [`rounding`] says.
fn rounded_x<'a>(j: &Matmul<'a>, s: &mut CallScratch, at: &mut Offsets) -> &'a [f32] {
    let Some(round) = rounding(j) else {
        return j.x;
    };
    let k = j.w.cols;
    let dst = &mut s.rounded[at.rounded..at.rounded + j.m * k];
    at.rounded += (j.m * k).next_multiple_of(16);
    dst.copy_from_slice(&j.x[..j.m * k]);
    dst.chunks_exact_mut(k.max(1)).for_each(round);
    // SAFETY: the call's scratch is neither grown nor reused while its plans live, so the
    // copy outlives every plan of the call.
    unsafe { std::slice::from_raw_parts(dst.as_ptr(), dst.len()) }
}

/// A ggml product's activations as Q8_0 rows: a twin's (an earlier product of the same
/// activations), or quantised here into the call's scratch; null for other formats. Told
/// to quantise its input ([`Inputs::VecDot`]), the product takes the codes as its input:
/// every row is then exact.
fn q8_rows(j: &Matmul, s: &mut CallScratch, at: &mut Offsets) -> *const crate::ggml::q8::Q8Row {
    if !int_dots(j, VecDot::Q8_0) {
        return std::ptr::null();
    }
    let k = j.w.cols;
    let twin = s.plans.iter().find(|p| {
        p.src == j.x.as_ptr() && p.m == j.m && p.k == k && !p.q8.is_null() && p.inputs == j.inputs
    });
    if let Some(p) = twin {
        return p.q8;
    }
    let rows = &mut s.q8[at.q8..at.q8 + j.m];
    at.q8 += j.m;
    super::ggml::quantize(j.x, k, rows);
    if j.inputs == Inputs::VecDot {
        rows.iter_mut().for_each(|r| r.exact = true);
    }
    rows.as_ptr()
}

/// Where the next product's copies go in each scratch, and the tiles planned so far.
#[derive(Default)]
struct Offsets {
    prepared: usize,
    transposed: usize,
    pairs: usize,
    q8: usize,
    q8k: usize,
    rounded: usize,
    tiles_before: usize,
}

/// A product planned earlier with the same activations, format, family and path (gate and
/// up of an expert, the projections of one input): its copies serve this one too.
type Twin = (*const f32, usize, *const f32, usize, usize, *const u32);

fn twin(s: &CallScratch, j: &Matmul, r: &Route) -> Option<Twin> {
    let fam = family(j.w, r.isa);
    s.plans
        .iter()
        .find(|p| {
            p.src == j.x.as_ptr()
                && p.m == j.m
                && p.k == j.w.cols
                && p.family == fam
                && p.w().format() == j.w.format()
                && p.amx == r.amx(j)
                && p.dots == r.dots(j)
                && p.inputs == j.inputs
        })
        .map(|p| (p.x, p.ldx, p.xt, p.xw, p.xw_last, p.pairs))
}

/// The activations as the kernels read them, `(row 0, row stride, packed for bf16 dots)`:
/// a twin's copy, a prepared copy made here (packed for the bf16 dot products unless an
/// activation is not fit for them; FP8 activations get their scales per block, in the
/// tile), or the caller's.
fn prepared_x(
    j: &Matmul,
    src: &[f32],
    r: &Route,
    twin: Option<Twin>,
    s: &mut CallScratch,
    at: &mut Offsets,
) -> (*const f32, usize, bool) {
    let (k, fam) = (j.w.cols, family(j.w, r.isa));
    if let Some((x, ldx, ..)) = twin {
        return (x, ldx, r.dots(j));
    }
    if !r.needs_prep(j) {
        return (src.as_ptr(), k, false);
    }
    let format = j.w.format();
    let ldx = x_stride(k, j.m);
    let dst = &mut s.prepared[at.prepared..at.prepared + j.m * ldx];
    let src = src.chunks_exact(k.max(1));
    // FP8's pairs are packed in its tiles, once the activations carry their blocks' scales.
    let in_tile = format == Format::Fp8;
    let packed = r.dots(j)
        && !in_tile
        && src
            .clone()
            .zip(dst.chunks_exact_mut(ldx))
            .all(|(src, out)| {
                prepare::pack_pairs(src, &mut out[..k], prepare::pairs_chunk(format))
            });
    if !packed {
        for (src, out) in src.zip(dst.chunks_exact_mut(ldx)) {
            let mult = x_mult(format, fam);
            prepare::permute_row(format, lanes(fam), src, &mut out[..k], mult);
        }
    }
    at.prepared += (j.m * ldx).next_multiple_of(16);
    (dst.as_ptr(), ldx, packed || (in_tile && r.dots(j)))
}

/// The GEMM path's transposed activations `(xt, strip width, last strip's, owned)`: a
/// twin's, or a slot of the scratch this plan fills; null off the GEMM path.
fn transposed_x(
    j: &Matmul,
    r: &Route,
    twin: Option<Twin>,
    s: &mut CallScratch,
    at: &mut Offsets,
) -> (*const f32, usize, usize, bool) {
    match (r.gemm_cols(j), twin) {
        (Some(_), Some((_, _, xt, xw, last, _))) => (xt, xw, last, false),
        (Some((cols, xw, last)), None) => {
            let k = j.w.cols;
            let t = &mut s.transposed[at.transposed..at.transposed + cols * k];
            at.transposed += (cols * k).next_multiple_of(16);
            (t.as_ptr(), xw, last, true)
        }
        (None, _) => (std::ptr::null(), 0, 0, false),
    }
}

/// The AMX path's activations `(pairs, owned)`, laid out by the transposition pass (or a
/// twin's); null off the AMX path.
fn amx_pairs(
    j: &Matmul,
    r: &Route,
    twin: Option<Twin>,
    s: &mut CallScratch,
    at: &mut Offsets,
) -> (*const u32, bool) {
    match twin {
        _ if !r.amx(j) => (std::ptr::null(), false),
        Some((.., pairs)) => (pairs, false),
        None => {
            let len = r.pairs_len(j);
            let t = &mut s.pairs[at.pairs..at.pairs + len];
            at.pairs += len;
            (t.as_ptr().cast::<u32>(), true)
        }
    }
}

/// One product's plan, its copies carved from `s` at `at`.
fn plan_one(
    j: &mut Matmul<'_>,
    r: &Route,
    invariant: bool,
    s: &mut CallScratch,
    at: &mut Offsets,
) -> Plan {
    let fam = family(j.w, r.isa);
    let twin = twin(s, j, r);
    let src = rounded_x(j, s, at);
    let (x, ldx, packed) = prepared_x(j, src, r, twin, s, at);
    // Filled by the transposition pass before any tile runs.
    let xt_layout = r.laid_out(j).then(|| {
        let format = j.w.format();
        (format, lanes(fam), x_mult(format, fam))
    });
    let (xt, xw, xw_last, xt_owner) = transposed_x(j, r, twin, s, at);
    let (pairs, pairs_owner) = amx_pairs(j, r, twin, s, at);
    let q8 = q8_rows(j, s, at);
    let q8k = q8k_rows(j, s, at);
    let amx = r.amx(j);
    let mut p = Plan {
        w: j.w,
        x,
        k: j.w.cols,
        ldx,
        xt,
        xw,
        xw_last,
        xt_layout,
        xt_owner: xt_owner || pairs_owner,
        src: src.as_ptr(),
        m: j.m,
        y: j.y.as_mut_ptr(),
        row0: j.rows.start,
        n: j.rows.len(),
        tile_rows: tile_rows(j.w, !xt.is_null()).next_multiple_of(row_step(amx)),
        m_parts: 1,
        tiles_before: at.tiles_before,
        family: fam,
        invariant,
        amx,
        pairs,
        dots: packed,
        call_isa: r.isa,
        q8,
        q8k,
        inputs: j.inputs,
    };
    // A matrix of few row tiles splits its activation strips too, so every core has work.
    if !p.xt.is_null() {
        let (row_tiles, threads) = (p.tiles(), rayon::current_num_threads());
        if row_tiles < 2 * threads {
            p.m_parts = (2 * threads)
                .div_ceil(row_tiles.max(1))
                .min(j.m.div_ceil(p.xw));
        }
    }
    p
}
