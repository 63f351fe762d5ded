//! The MoE's passes over its selected experts: which experts go together, where their
//! weights come from (the resident layer, or the expert cache, waiting for reads), and one
//! pass's products and activations over the rows grouped by expert.

use super::swiglu::{activate, Activation};
use crate::experts::ExpertError;
use crate::experts::ExpertWeights;
use crate::experts::RoutedExperts;
use crate::profile::{self, scope, Op};
use deepinfer_kernels::linear::Matmul;
use smallvec::SmallVec;
use std::sync::Arc;

/// Experts whose products share one parallel pass (bounds the stack-held job list).
const EXPERTS_PER_PASS: usize = 64;

/// The experts of one pass: borrowed from the resident layer, or lent by the expert
/// cache (pinned while this lives).
pub(super) enum PassExperts<'a> {
    /// The layer's experts held here (the first one's id), and the pass's ids.
    Resident(&'a [ExpertWeights], usize, &'a [usize]),
    Streamed(Vec<Arc<ExpertWeights>>),
}

impl PassExperts<'_> {
    fn get(&self, i: usize) -> &ExpertWeights {
        match self {
            PassExperts::Resident(held, first, group) => &held[group[i] - first],
            PassExperts::Streamed(v) => &v[i],
        }
    }
}

/// The experts of `group`, waiting for reads where they are streamed; the next group's
/// reads start before this one's products.
pub(super) fn pass_experts<'a>(
    experts: &'a RoutedExperts,
    group: &'a [usize],
    next: Option<&[usize]>,
) -> Result<PassExperts<'a>, ExpertError> {
    match experts {
        RoutedExperts::Resident { first, experts } => {
            Ok(PassExperts::Resident(experts, *first, group))
        }
        RoutedExperts::Streamed { store, layer } => {
            let got = store.get(*layer, group)?;
            if let Some(next) = next {
                store.prefetch(next.iter().map(|&e| (*layer, e)));
            }
            Ok(PassExperts::Streamed(got))
        }
        RoutedExperts::Sharded(_) => Err(ExpertError::Invalid {
            reason: "experts split by width have no passes (a bug)".into(),
        }),
    }
}

/// Experts per pass: all of a decode step's and up to [`EXPERTS_PER_PASS`] of a
/// prefill's, at most half the expert cache (the other half reads the next pass).
pub(super) fn experts_per_pass(experts: &RoutedExperts) -> usize {
    match experts {
        RoutedExperts::Resident { .. } | RoutedExperts::Sharded(_) => EXPERTS_PER_PASS,
        RoutedExperts::Streamed { store, .. } => (store.capacity() / 2).clamp(1, EXPERTS_PER_PASS),
    }
}

/// The active experts in pass order, as two runs each chunked into passes of its own:
/// resident, all in expert order; streamed, the experts already cached (or on their way)
/// first — their products run while the rest are read — then the others.
pub(super) fn pass_order(
    experts: &RoutedExperts,
    active: &[usize],
) -> (SmallVec<[usize; 256]>, SmallVec<[usize; 256]>) {
    match experts {
        RoutedExperts::Resident { .. } | RoutedExperts::Sharded(_) => {
            (active.into(), SmallVec::new())
        }
        RoutedExperts::Streamed { store, layer } => {
            let cached = store.request(*layer, active);
            let pick = |want: bool| {
                active
                    .iter()
                    .zip(&cached)
                    .filter(|(_, &c)| c == want)
                    .map(|(&e, _)| e)
                    .collect()
            };
            (pick(true), pick(false))
        }
    }
}

/// The shared expert's buffers: gate, up, output (`[T, ·]`), and unit routing weights.
pub(super) struct SharedBufs<'a> {
    pub(super) gs: &'a mut [f32],
    pub(super) us: &'a mut [f32],
    pub(super) ys: &'a mut [f32],
    pub(super) ones: &'a [f32],
}

impl SharedBufs<'_> {
    /// The shared expert on its own: gate and up, activation, down.
    pub(super) fn run(
        &mut self,
        s: &ExpertWeights,
        x: &[f32],
        t: usize,
        act: Activation,
        tmp: &mut [f32],
    ) {
        let inputs = act.numerics.inputs();
        let mut jobs = [
            Matmul::new(&s.w1.w, x, t, self.gs).with_inputs(inputs),
            Matmul::new(&s.w3.w, x, t, self.us).with_inputs(inputs),
        ];
        profile::matmuls(&mut jobs);
        self.activate(s, act, tmp);
        profile::matmuls(&mut [Matmul::new(&s.w2.w, self.gs, t, self.ys).with_inputs(inputs)]);
    }

    fn activate(&mut self, s: &ExpertWeights, act: Activation, tmp: &mut [f32]) {
        let _p = scope(Op::Moe);
        activate(self.gs, self.us, self.ones, s.w1.out_dim(), act, tmp);
    }
}

/// The routed rows' buffers, grouped by expert (`offsets`), for the passes.
pub(super) struct PassRows<'a> {
    pub(super) offsets: &'a [usize],
    pub(super) xs: &'a [f32],
    pub(super) g: &'a mut [f32],
    pub(super) u: &'a mut [f32],
    pub(super) y: &'a mut [f32],
    pub(super) row_wts: &'a [f32],
    pub(super) d: usize,
    pub(super) inter: usize,
}

/// `buf`'s rows of each expert of `group` (ascending), `width` floats per row.
fn rows_of_group<'b>(
    buf: &'b mut [f32],
    group: &[usize],
    offsets: &[usize],
    width: usize,
) -> SmallVec<[&'b mut [f32]; EXPERTS_PER_PASS]> {
    let mut out = SmallVec::new();
    let (mut rest, mut at) = (buf, 0);
    for &e in group {
        let (start, end) = (offsets[e], offsets[e + 1]);
        let (_, tail) = std::mem::take(&mut rest).split_at_mut((start - at) * width);
        let (mine, tail) = tail.split_at_mut((end - start) * width);
        out.push(mine);
        (rest, at) = (tail, end);
    }
    out
}

impl PassRows<'_> {
    /// One pass over `group`'s experts: gate and up products in one parallel pass (with
    /// the shared expert's when it rides along), the activations, the down products.
    pub(super) fn run(
        &mut self,
        group: &[usize],
        experts: &PassExperts,
        ride: Option<(&ExpertWeights, &mut SharedBufs, &[f32], usize)>,
        act: Activation,
        tmp: &mut [f32],
    ) {
        let (d, inter, offsets) = (self.d, self.inter, self.offsets);
        let rows = |e: usize| offsets[e]..offsets[e + 1];
        let inputs = act.numerics.inputs();
        let mut ride = ride;
        {
            let mut jobs: SmallVec<[Matmul; 2 * EXPERTS_PER_PASS + 2]> = SmallVec::new();
            let gs = rows_of_group(self.g, group, offsets, inter);
            let us = rows_of_group(self.u, group, offsets, inter);
            for (i, ((&e, gh), uh)) in group.iter().zip(gs).zip(us).enumerate() {
                let xe = &self.xs[rows(e).start * d..rows(e).end * d];
                let ex = experts.get(i);
                jobs.push(Matmul::new(&ex.w1.w, xe, rows(e).len(), gh).with_inputs(inputs));
                jobs.push(Matmul::new(&ex.w3.w, xe, rows(e).len(), uh).with_inputs(inputs));
            }
            if let Some((s, sh, x, t)) = ride.as_mut() {
                jobs.push(Matmul::new(&s.w1.w, x, *t, sh.gs).with_inputs(inputs));
                jobs.push(Matmul::new(&s.w3.w, x, *t, sh.us).with_inputs(inputs));
            }
            profile::matmuls(&mut jobs);
        }
        {
            let _p = scope(Op::Moe);
            for &e in group {
                let (a, b) = (rows(e).start * inter, rows(e).end * inter);
                let wts = &self.row_wts[rows(e)];
                activate(&mut self.g[a..b], &self.u[a..b], wts, inter, act, tmp);
            }
        }
        if let Some((s, sh, _, _)) = ride.as_mut() {
            sh.activate(s, act, tmp);
        }
        let mut jobs: SmallVec<[Matmul; EXPERTS_PER_PASS + 1]> = SmallVec::new();
        let ys = rows_of_group(self.y, group, offsets, d);
        for (i, (&e, yh)) in group.iter().zip(ys).enumerate() {
            let he = &self.g[rows(e).start * inter..rows(e).end * inter];
            jobs.push(Matmul::new(&experts.get(i).w2.w, he, rows(e).len(), yh).with_inputs(inputs));
        }
        if let Some((s, sh, _, t)) = ride.as_mut() {
            jobs.push(Matmul::new(&s.w2.w, sh.gs, *t, sh.ys).with_inputs(inputs));
        }
        profile::matmuls(&mut jobs);
    }
}
