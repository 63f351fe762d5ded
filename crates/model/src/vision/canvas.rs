//! An image brought to its plan's canvas and cut into the ViT's patches, as vLLM 0.33's
//! `load_image` does (`models/deepseek_v4/common/mm_preprocess.py` lines 180-193): squeezed by
//! `Image.resize` when wider than `max_wh_ratio`, else fitted by `ImageOps.pad` (resized to
//! fit, centred on grey 127); then `x / 255`, `(x - 0.5) / 0.5` in f32, rounded to bf16.

use half::bf16;

use super::geometry::ImagePlan;
use super::resample::resize_bicubic;
use super::Pixels;

/// The grey `ImageOps.pad` fills around a fitted image.
const PAD_GREY: u8 = 127;

/// `src` on `plan`'s canvas.
pub fn canvas(src: &Pixels, plan: &ImagePlan) -> Pixels {
    let (w, h) = (plan.width, plan.height);
    if plan.stretch {
        return resize_bicubic(src, w, h);
    }
    pad(src, w, h)
}

/// Pillow 13's `ImageOps.pad(image, (w, h), color=127)`: `ImageOps.contain` resizes the
/// image to the canvas's width or height, whichever binds (the other side by Python's
/// `round`, halves to even), and `pad` pastes it centred, again by `round`.
fn pad(src: &Pixels, w: usize, h: usize) -> Pixels {
    let src_ratio = src.width as f64 / src.height as f64;
    let dst_ratio = w as f64 / h as f64;
    let (fw, fh) = if src_ratio > dst_ratio {
        let nh = (src.height as f64 / src.width as f64 * w as f64).round_ties_even();
        (w, nh as usize)
    } else if src_ratio < dst_ratio {
        let nw = (src.width as f64 / src.height as f64 * h as f64).round_ties_even();
        (nw as usize, h)
    } else {
        (w, h)
    };
    if (fw, fh) == (w, h) {
        return resize_bicubic(src, w, h);
    }
    let mut out = Pixels {
        width: w,
        height: h,
        rgb: vec![PAD_GREY; w * h * 3],
    };
    if fw == 0 || fh == 0 {
        return out;
    }
    let fitted = resize_bicubic(src, fw, fh);
    let centre = |room: usize, used: usize| ((room - used) as f64 * 0.5).round_ties_even() as usize;
    match fw != w {
        true => paste(&mut out, &fitted, centre(w, fw), 0),
        false => paste(&mut out, &fitted, 0, centre(h, fh)),
    }
    out
}

/// Copies `src` into `dst` at `(x, y)`, clipped to `dst`.
fn paste(dst: &mut Pixels, src: &Pixels, x: usize, y: usize) {
    let cols = src.width.min(dst.width.saturating_sub(x));
    for r in 0..src.height.min(dst.height.saturating_sub(y)) {
        let from = &src.rgb[r * src.width * 3..][..cols * 3];
        let at = ((y + r) * dst.width + x) * 3;
        dst.rgb[at..at + cols * 3].copy_from_slice(from);
    }
}

/// The canvas's patches, `[n_vit_h · n_vit_w, 3 · p · p]` in row-major patch order, each
/// patch channel-major then row then column, values normalised to [-1, 1] through bf16.
pub fn patches(canvas: &Pixels, plan: &ImagePlan, p: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(plan.patches() * 3 * p * p);
    for (ph, pw) in (0..plan.n_vit_h).flat_map(|i| (0..plan.n_vit_w).map(move |j| (i, j))) {
        for ch in 0..3 {
            for y in ph * p..(ph + 1) * p {
                for x in pw * p..(pw + 1) * p {
                    let v = f32::from(canvas.rgb[(y * canvas.width + x) * 3 + ch]) / 255.0;
                    out.push(bf16::from_f32((v - 0.5) / 0.5).to_f32());
                }
            }
        }
    }
    out
}
