//! What every layer reads about the batch besides its activations: where each flat row
//! belongs ([`BatchRows`]) and the rope angles of every row ([`Angles`]). The model builds
//! them once per forward; blocks, attention and the MTP block only read them.

use super::workspace::Workspace;
use crate::batch::{ImageSpan, SeqSpan};
use crate::vision::layout::v4_start_slot;
use deepinfer_kernels::rope::Rope;

/// Where each flat row of a batch belongs: `(span index, the span's first position, the
/// span's first row)`, plus the batch's positions and spans.
pub struct BatchRows<'a> {
    pub positions: &'a [usize],
    pub spans: &'a [SeqSpan],
    pub row_seq: Vec<(usize, usize, usize)>,
    window_floor: &'a [usize],
    /// With V4-Flash-Vision-Exp's widening: the batch's image spans (see
    /// [`crate::batch::ForwardBatch::image_spans`]) and how far an image position sees
    /// across its span (the tower's `max_n_token`).
    images: Option<(&'a [ImageSpan], usize)>,
}

impl<'a> BatchRows<'a> {
    /// Rows of a batch whose windows reach back as far as they can (benchmarks that drive
    /// single blocks).
    pub fn new(
        positions: &'a [usize],
        spans: &'a [SeqSpan],
        row_seq: Vec<(usize, usize, usize)>,
    ) -> Self {
        Self {
            positions,
            spans,
            row_seq,
            window_floor: &[],
            images: None,
        }
    }

    /// Rows whose span `s` may reach back no further than `window_floor[s]`.
    pub fn with_window_floors(
        positions: &'a [usize],
        spans: &'a [SeqSpan],
        row_seq: Vec<(usize, usize, usize)>,
        window_floor: &'a [usize],
    ) -> Self {
        Self {
            positions,
            spans,
            row_seq,
            window_floor,
            images: None,
        }
    }

    /// Rows whose image positions see their whole image span in both directions, as far as
    /// `reach` positions (vLLM 0.33 `sparse_swa.py` `_compute_image_visibility_kernel`).
    pub fn with_image_spans(mut self, spans: &'a [ImageSpan], reach: usize) -> Self {
        self.images = Some((spans, reach));
        self
    }

    /// The window of span `s`'s row at position `p`: `lo..=hi`. Plain: the last `window`
    /// positions up to `p`. Inside an image block, from its start slot `a` (after the
    /// compressor pad) to its last slot `b`, V4-Flash-Vision-Exp's prefill
    /// widens it (vLLM's `_compute_swa_indices_and_lens_kernel`): `left = min(p − a,
    /// reach − 1)` positions back count on top of the window, `right = min(b − p, reach)`
    /// positions past `p` are seen too.
    pub fn window(&self, s: usize, p: usize, window: usize) -> (usize, usize) {
        let (left, right) = self
            .images
            .and_then(|(spans, reach)| {
                let (a, b) = spans
                    .iter()
                    .filter(|im| im.seq == s)
                    .map(|im| (v4_start_slot(im.first), im.last))
                    .find(|&(a, b)| (a..=b).contains(&p))?;
                Some(((p - a).min(reach - 1), (b - p).min(reach)))
            })
            .unwrap_or((0, 0));
        let back = window - 1 + left.saturating_sub(window - 1);
        (p.saturating_sub(back).max(self.window_floor(s)), p + right)
    }

    /// The first position span `s`'s sliding window may reach back to.
    pub fn window_floor(&self, s: usize) -> usize {
        self.window_floor.get(s).copied().unwrap_or(0)
    }
}

/// One rope table's `(cos, sin)` at every row's position, `[N, rd/2]` each: computed once
/// per forward and shared by every head and layer that uses the table.
pub struct Angles {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Angles {
    pub fn new(rope: &Rope, positions: &[usize], ws: &mut Workspace) -> Self {
        let half = rope.dim() / 2;
        let (mut cos, mut sin) = (
            ws.take(positions.len() * half),
            ws.take(positions.len() * half),
        );
        rope.table(positions, &mut cos, &mut sin);
        Self { half, cos, sin }
    }

    pub fn row(&self, i: usize) -> (&[f32], &[f32]) {
        let r = i * self.half..(i + 1) * self.half;
        (&self.cos[r.clone()], &self.sin[r])
    }

    pub fn recycle(self, ws: &mut Workspace) {
        ws.give(self.cos);
        ws.give(self.sin);
    }
}
