//! Pillow's bicubic resize of 8-bit RGB (`src/libImaging/Resample.c`: `precompute_coeffs`,
//! `normalize_coeffs_8bpc`, the horizontal then vertical pass of `ImagingResampleInner`),
//! which vLLM's preprocessing runs through `Image.resize` and `ImageOps.pad`. The canvas
//! decides the patches bit for bit, so the arithmetic is Pillow's: coefficients in double,
//! turned into 22-bit fixed point, sums in 32-bit integers rounded at the half.

use super::Pixels;

/// Fixed-point fraction bits: 32 less 8 for the sample and 2 for the filter's overshoot.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Keys' cubic with a = -0.5 (Pillow's `bicubic_filter`), support 2.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// For each output sample: the first input sample it reads and its fixed-point weights.
struct Coeffs {
    first: Vec<usize>,
    weights: Vec<Vec<i32>>,
}

/// Pillow's `precompute_coeffs` for `in_size → out_size` over the whole input, then
/// `normalize_coeffs_8bpc`.
fn coeffs(in_size: usize, out_size: usize) -> Coeffs {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = 2.0 * filterscale;
    let (mut first, mut weights) = (Vec::with_capacity(out_size), Vec::with_capacity(out_size));
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        let ss = 1.0 / filterscale;
        // C's `(int)` truncates toward zero.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let k: Vec<f64> = (xmin..xmax)
            .map(|x| bicubic((x as f64 - center + 0.5) * ss))
            .collect();
        let ww: f64 = k.iter().sum();
        let fixed = k
            .iter()
            .map(|&w| {
                let w = if ww != 0.0 { w / ww } else { w };
                let f = w * (1u32 << PRECISION_BITS) as f64;
                (if w < 0.0 { f - 0.5 } else { f + 0.5 }) as i32
            })
            .collect();
        first.push(xmin);
        weights.push(fixed);
    }
    Coeffs { first, weights }
}

/// `(sum + half) >> PRECISION_BITS`, clamped to a byte (Pillow's `clip8`).
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// `src` resized to `width × height` with Pillow's bicubic filter.
pub fn resize_bicubic(src: &Pixels, width: usize, height: usize) -> Pixels {
    if (src.width, src.height) == (width, height) {
        return src.clone();
    }
    let (cx, cy) = (coeffs(src.width, width), coeffs(src.height, height));
    let (need_h, need_v) = (width != src.width, height != src.height);
    // Pillow 13 shrinks height first when it loses more than twice the rows it loses
    // columns; otherwise the horizontal pass runs first, over only the rows the vertical
    // pass then reads. Each pass rounds to bytes.
    let (dh, dw) = (
        src.height as i64 - height as i64,
        src.width as i64 - width as i64,
    );
    if dh > 0 && dh > 2 * dw {
        let mid = vertical(src, &cy, 0);
        return if need_h {
            horizontal(&mid, &cx, 0..height)
        } else {
            mid
        };
    }
    if !need_h {
        return vertical(src, &cy, 0);
    }
    let y0 = cy.first[0];
    let y1 = cy.first[height - 1] + cy.weights[height - 1].len();
    let mid = horizontal(src, &cx, y0..y1);
    match need_v {
        true => vertical(&mid, &cy, y0),
        false => mid,
    }
}

fn horizontal(src: &Pixels, c: &Coeffs, rows: std::ops::Range<usize>) -> Pixels {
    let width = c.first.len();
    let mut rgb = Vec::with_capacity(width * rows.len() * 3);
    for y in rows.clone() {
        let line = &src.rgb[y * src.width * 3..(y + 1) * src.width * 3];
        for (x0, k) in c.first.iter().zip(&c.weights) {
            for ch in 0..3 {
                let mut acc = 1i32 << (PRECISION_BITS - 1);
                for (i, &w) in k.iter().enumerate() {
                    acc += i32::from(line[(x0 + i) * 3 + ch]) * w;
                }
                rgb.push(clip8(acc));
            }
        }
    }
    Pixels {
        width,
        height: rows.len(),
        rgb,
    }
}

fn vertical(src: &Pixels, c: &Coeffs, offset: usize) -> Pixels {
    let (width, height) = (src.width, c.first.len());
    let mut rgb = Vec::with_capacity(width * height * 3);
    for (y0, k) in c.first.iter().zip(&c.weights) {
        for v in 0..width * 3 {
            let mut acc = 1i32 << (PRECISION_BITS - 1);
            for (i, &w) in k.iter().enumerate() {
                acc += i32::from(src.rgb[(y0 - offset + i) * width * 3 + v]) * w;
            }
            rgb.push(clip8(acc));
        }
    }
    Pixels { width, height, rgb }
}
