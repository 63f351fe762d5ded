//! The pixel size an image is brought to and the grids it then makes, as vLLM 0.33's
//! `load_image` computes them (`models/deepseek_v4/common/mm_preprocess.py` lines 90-195 for
//! V4-Flash-Vision-Exp, `models/deepseek_v41/common/mm_preprocess.py` lines 72-160 for V4.1,
//! which shrink differently). Python's float arithmetic is IEEE double, as is ours; the
//! operations are kept in its order so that a size on a rounding edge lands where it does
//! there.

use crate::config::{VisionConfig, VisionFamily};

use super::VisionError;

/// Where one image's pixels go: its canvas, the ViT's patch grid and the decoder's token grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImagePlan {
    pub width: usize,
    pub height: usize,
    pub n_vit_h: usize,
    pub n_vit_w: usize,
    pub n_llm_h: usize,
    pub n_llm_w: usize,
    /// Squeezed to the canvas (an image wider than `max_wh_ratio`) instead of fitted and
    /// padded with grey.
    pub stretch: bool,
}

impl ImagePlan {
    /// The plan for an image of `width × height` pixels.
    pub fn new(c: &VisionConfig, width: usize, height: usize) -> Result<Self, VisionError> {
        let (p, r) = (c.patch_size, c.downsample_ratio);
        let (mut w, mut h) = (width as f64, height as f64);
        if let Some(ratio) = c.max_wh_ratio.filter(|&q| w > h * q) {
            w = h * ratio;
        }
        if 0.0 < w * h && w * h < c.min_pixels as f64 {
            let up = (c.min_pixels as f64 / (w * h)).powf(0.5);
            w = (w * up).trunc();
            h = (h * up).trunc();
        }
        let best = (
            (h / p as f64).ceil() as usize * p,
            (w / p as f64).ceil() as usize * p,
        );
        let (bh, bw) = match c.family {
            VisionFamily::V4 => v4_fit(c, (h, w), best)?,
            VisionFamily::V41 => v41_fit(c, (h, w), best)?,
        };
        let (n_vit_h, n_vit_w) = (bh / p, bw / p);
        if n_vit_h == 0 || n_vit_w == 0 {
            return Err(VisionError::Shape(format!(
                "a {width}×{height} image leaves no patch rows or columns within {} tokens",
                c.max_n_token
            )));
        }
        let stretch = c
            .max_wh_ratio
            .is_some_and(|q| width as f64 >= q * height as f64);
        Ok(Self {
            width: bw,
            height: bh,
            n_vit_h,
            n_vit_w,
            n_llm_h: n_vit_h.div_ceil(r),
            n_llm_w: n_vit_w.div_ceil(r),
            stretch,
        })
    }

    /// Patches the ViT sees.
    pub fn patches(&self) -> usize {
        self.n_vit_h * self.n_vit_w
    }

    /// Aligner rows: the decoder tokens that carry the image itself.
    pub fn rows(&self) -> usize {
        self.n_llm_h * self.n_llm_w
    }
}

/// The decoder token grid a canvas of `(h, w)` pixels makes.
fn llm_grid(c: &VisionConfig, (h, w): (usize, usize)) -> (usize, usize) {
    let (p, r) = (c.patch_size, c.downsample_ratio);
    ((h / p).div_ceil(r), (w / p).div_ceil(r))
}

/// V4's block length for a token grid: rows of `w + 1` (a newline each), an odd last row
/// padded to a pair, and the pair count's parity evened out (`grid_tokens`).
pub(super) fn v4_block_tokens(n_llm_h: usize, n_llm_w: usize) -> usize {
    let row = n_llm_w + 1;
    let mut n = n_llm_h * row + 2;
    if n_llm_h % 2 == 1 {
        n += row;
    }
    n + n_llm_h.div_ceil(2) * row % 2 * 2
}

/// V4: shrinks the budget one token at a time until the block, with room for the
/// compressor pad (up to 3 tokens), fits (`safe_resize`, `solve_resize_ratio`).
fn v4_fit(
    c: &VisionConfig,
    hw: (f64, f64),
    best: (usize, usize),
) -> Result<(usize, usize), VisionError> {
    let max = c.max_n_token - 3;
    let (mut best, mut budget) = (best, max);
    loop {
        let (gh, gw) = llm_grid(c, best);
        if v4_block_tokens(gh, gw) <= max {
            return Ok(best);
        }
        best = v4_solve(c, hw, budget)?;
        budget = budget
            .checked_sub(1)
            .filter(|&b| b > 4)
            .ok_or_else(|| VisionError::Shape(format!("no grid fits {} tokens", c.max_n_token)))?;
    }
}

fn v4_solve(
    c: &VisionConfig,
    (h, w): (f64, f64),
    budget: usize,
) -> Result<(usize, usize), VisionError> {
    let (p, cell) = (c.patch_size, c.patch_size * c.downsample_ratio);
    let (max_w, max_h) = grid_bounds((h, w), budget);
    if max_w < 1.0 {
        let rows = (budget - 2) / 2;
        return Ok(((rows - rows % 2) * cell, cell));
    }
    if max_h < 2.0 {
        let cols = (budget - 2) / 2 - 1;
        if cols <= 1 {
            return Err(VisionError::Shape(format!(
                "a {w}×{h} image is too wide for {} tokens",
                c.max_n_token
            )));
        }
        return Ok((2 * cell, cols * cell));
    }
    let (fw, fh) = (max_w.floor(), max_h.floor());
    let fh = fh - fh.rem_euclid(2.0);
    let beta = (fw * cell as f64 / w).min(fh * cell as f64 / h);
    Ok(scaled((h, w), beta, p))
}

/// V4.1: one solve at the full budget (`safe_resize`, `solve_resize_ratio`).
fn v41_fit(
    c: &VisionConfig,
    (h, w): (f64, f64),
    best: (usize, usize),
) -> Result<(usize, usize), VisionError> {
    let tokens = |(gh, gw): (usize, usize)| gh * (gw + 1) + 2;
    if tokens(llm_grid(c, best)) <= c.max_n_token {
        return Ok(best);
    }
    let (p, cell, max) = (
        c.patch_size,
        c.patch_size * c.downsample_ratio,
        c.max_n_token,
    );
    let r = h / w;
    let max_w = ((max - 2) as f64 / r + 0.25).sqrt() - 0.5;
    let max_h = max_w * r;
    let fitted = if max_w < 1.0 {
        ((max - 2) / 2 * cell, cell)
    } else if max_h < 1.0 {
        (cell, (max - 3) * cell)
    } else {
        let beta = (max_w.floor() * cell as f64 / w).min(max_h.floor() * cell as f64 / h);
        scaled((h, w), beta, p)
    };
    if tokens(llm_grid(c, fitted)) > max {
        return Err(VisionError::Shape(format!(
            "a {w}×{h} image does not fit {max} tokens"
        )));
    }
    Ok(fitted)
}

/// The widest and tallest token grid (in cells, fractional) an image of aspect `h / w` may
/// take within `budget` tokens, a newline per row and two delimiters counted
/// (`solve_resize_ratio`'s `max_w_float`, `max_h_float`).
fn grid_bounds((h, w): (f64, f64), budget: usize) -> (f64, f64) {
    let r = h / w;
    let max_w = ((budget - 2) as f64 / r + 0.25).sqrt() - 0.5;
    (max_w, max_w * r)
}

/// `(h, w)` scaled by `beta`, each side floored to whole patches.
fn scaled((h, w): (f64, f64), beta: f64, p: usize) -> (usize, usize) {
    (patch_floor(h * beta, p), patch_floor(w * beta, p))
}

/// `math.floor(x / p) * p` for a non-negative `x`.
fn patch_floor(x: f64, p: usize) -> usize {
    (x / p as f64).floor() as usize * p
}
