//! Where an image's embeddings sit among the prompt's tokens. V4-Flash-Vision-Exp (vLLM 0.33
//! `models/deepseek_v4/common/mm_preprocess.py` lines 198-232, `build_image_block`) walks the
//! token grid two rows at a time, column by column (an "N" order), pads an odd last row and
//! an odd pair count, and starts the block so that it begins a compressor group of 4. V4.1
//! (`models/deepseek_v41/common/mm_preprocess.py` lines 163-168) reads the grid row by row
//! with no padding. Both open and close the span and end each row with a newline slot.

use crate::config::VisionFamily;

/// One position of an image's span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    Start,
    /// V4's filler (odd rows, pair parity, compressor alignment).
    Pad,
    /// The aligner's row `i` (reading order over the token grid).
    Image(usize),
    Newline,
    End,
}

/// V4.1-Flash's `image_token_id` (`<｜deepseek_image｜>`), for a config that leaves it out.
pub const V41_IMAGE_TOKEN: u32 = 129_264;

/// V4's compressor groups the block is aligned to.
const V4_PAD_TO: usize = 4;

impl Slot {
    /// The token id the prompt carries at this slot: V4's sentinel of its role (counted from
    /// `sentinel_base`, `<|place_holder_mm_span_0431|>` in published checkpoints), V4.1's
    /// `image_token_id` for every slot.
    pub fn token_id(self, family: VisionFamily, sentinel_base: u32, image_token_id: u32) -> u32 {
        let role = match self {
            Slot::Start => 0,
            Slot::Pad => 1,
            Slot::Image(_) => 2,
            Slot::Newline => 3,
            Slot::End => 4,
        };
        match family {
            VisionFamily::V4 => sentinel_base + role,
            VisionFamily::V41 => image_token_id,
        }
    }
}

/// Where a V4 block placed at `offset` starts seeing across itself: its start slot, after
/// the compressor pad (vLLM 0.33 `v1/attention/backends/utils.py`, the image range with
/// `span_pad` 4); the pad slots keep the plain window.
pub fn v4_start_slot(offset: usize) -> usize {
    offset - offset % V4_PAD_TO + V4_PAD_TO - 1
}

/// The span of an `n_llm_h × n_llm_w` token grid whose first slot lands at prompt position
/// `start` (V4's alignment pad depends on it; V4.1's span does not).
pub fn span(family: VisionFamily, n_llm_h: usize, n_llm_w: usize, start: usize) -> Vec<Slot> {
    match family {
        VisionFamily::V4 => v4_block(n_llm_h, n_llm_w, start),
        VisionFamily::V41 => v41_span(n_llm_h, n_llm_w),
    }
}

fn v41_span(h: usize, w: usize) -> Vec<Slot> {
    let mut slots = Vec::with_capacity(h * (w + 1) + 2);
    slots.push(Slot::Start);
    for r in 0..h {
        slots.extend((0..w).map(|c| Slot::Image(r * w + c)));
        slots.push(Slot::Newline);
    }
    slots.push(Slot::End);
    slots
}

fn v4_block(h: usize, w: usize, start: usize) -> Vec<Slot> {
    let align = V4_PAD_TO - 1 - start % V4_PAD_TO;
    let (rows, row_len) = (h + h % 2, w + 1);
    let cell = |r: usize, c: usize| match (r < h, c < w) {
        (false, _) => Slot::Pad,
        (true, true) => Slot::Image(r * w + c),
        (true, false) => Slot::Newline,
    };
    let mut slots = vec![Slot::Pad; align];
    slots.push(Slot::Start);
    for pair in 0..rows / 2 {
        for c in 0..row_len {
            slots.extend([cell(2 * pair, c), cell(2 * pair + 1, c)]);
        }
    }
    slots.extend(std::iter::repeat_n(Slot::Pad, rows / 2 * row_len % 2 * 2));
    slots.push(Slot::End);
    slots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_blocks_pair_rows_and_align_to_compressor_groups() {
        // 3 × 2: rows padded to 4, walked as pairs; 2 pairs of 3 columns is even: no tail.
        let b = v4_block(3, 2, 3);
        use Slot::*;
        let want = [
            Start,
            Image(0),
            Image(2),
            Image(1),
            Image(3),
            Newline,
            Newline,
            Image(4),
            Pad,
            Image(5),
            Pad,
            Newline,
            Pad,
            End,
        ];
        assert_eq!(b, want);
        assert_eq!(b.len(), super::super::geometry::v4_block_tokens(3, 2));
        for start in 0..8 {
            let at = v4_block(3, 2, start);
            assert_eq!((start + at.len() - want.len() + 1) % 4, 0, "start {start}");
        }
    }

    #[test]
    fn v41_spans_read_rows_in_order() {
        use Slot::*;
        let s = v41_span(2, 2);
        let want = [
            Start,
            Image(0),
            Image(1),
            Newline,
            Image(2),
            Image(3),
            Newline,
            End,
        ];
        assert_eq!(s, want);
    }
}
