//! The vision tower's settings (docs/MODEL.md §8.9), which the two model families write
//! differently: V4-Flash-Vision-Exp as flat `vision_*` keys beside the text model's (vLLM 0.33
//! reads them off HF's `DeepseekV4Config` as loose attributes), V4.1 as a nested
//! `vision_config` with HF's names (vLLM's `transformers_utils/configs/deepseek_v41.py`
//! flattens it into the same `vision_*` fields, with the defaults used below). A config
//! without a tower, or with zero layers, has none.

use super::fields::Fields;
use super::{invalid, ConfigError};

/// Which model the tower belongs to: the two lay an image's tokens out differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VisionFamily {
    /// V4-Flash-Vision-Exp: sentinel ids, rows paired into an "N" order, a compressor pad.
    V4,
    /// V4.1: every span position is `image_token_id`, rows in reading order.
    V41,
}

/// The ViT, the aligner and the image budget.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    pub family: VisionFamily,
    pub n_layers: usize,
    pub dim: usize,
    pub n_heads: usize,
    pub inter_dim: usize,
    pub patch_size: usize,
    pub rope_theta: f64,
    /// The aligner folds `r × r` patches into one decoder token.
    pub downsample_ratio: usize,
    /// Most decoder tokens one image may take, its delimiters included.
    pub max_n_token: usize,
    /// Smaller images are scaled up to about this many pixels.
    pub min_pixels: usize,
    /// Wider images than this ratio are squeezed to it (none: any aspect).
    pub max_wh_ratio: Option<f64>,
    /// V4: the first of the five consecutive reserved ids a span's positions carry (vLLM's
    /// `IMAGE_SENTINEL_BASE_ID`, 129257). Published configs leave it out; the key
    /// `image_sentinel_base_id` moves it, so that tiny test models can hold the ids in a
    /// tiny vocabulary.
    pub sentinel_base: u32,
}

/// vLLM's `IMAGE_SENTINEL_BASE_ID`.
pub const V4_SENTINEL_BASE: u32 = 129_257;

/// The tower `root` declares (`v41`: in its `vision_config`), if any.
pub(super) fn parse(root: &Fields, v41: bool) -> Result<Option<VisionConfig>, ConfigError> {
    let nested;
    let (f, names) = match v41 {
        true => match root.obj("vision_config")? {
            Some(f) => {
                nested = f;
                (&nested, &V41_NAMES)
            }
            None => return Ok(None),
        },
        false => (root, &V4_NAMES),
    };
    let n_layers = f.usize_or(names[0], 0)?;
    if n_layers == 0 {
        return Ok(None);
    }
    let c = VisionConfig {
        family: if v41 {
            VisionFamily::V41
        } else {
            VisionFamily::V4
        },
        n_layers,
        dim: f.usize_or(names[1], 1024)?,
        n_heads: f.usize_or(names[2], 16)?,
        inter_dim: f.usize_or(names[3], 2816)?,
        patch_size: f.usize_or(names[4], 14)?,
        rope_theta: f.f64_or(names[5], 10000.0)?,
        downsample_ratio: f.usize_or(names[6], 3)?,
        max_n_token: f.usize_or(names[7], 1024)?,
        min_pixels: f.usize_or(names[8], 295_936)?,
        max_wh_ratio: f.f64(names[9])?,
        sentinel_base: match root.usize("image_sentinel_base_id")? {
            None => V4_SENTINEL_BASE,
            Some(b) => u32::try_from(b)
                .ok()
                .filter(|b| b.checked_add(5).is_some())
                .ok_or_else(|| {
                    invalid(
                        root.name("image_sentinel_base_id"),
                        b,
                        "must fit in 32 bits",
                    )
                })?,
        },
    };
    check(f, names, &c)?;
    Ok(Some(c))
}

const V4_NAMES: [&str; 10] = [
    "vision_n_layers",
    "vision_dim",
    "vision_n_heads",
    "vision_inter_dim",
    "vision_patch_size",
    "vision_rope_theta",
    "vision_downsample_ratio",
    "vision_max_n_token",
    "vision_min_pixels",
    "vision_max_wh_ratio",
];

const V41_NAMES: [&str; 10] = [
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "patch_size",
    "rope_theta",
    "downsample_ratio",
    "max_image_tokens",
    "min_pixels",
    "max_wh_ratio",
];

/// Bounds that keep every later size computation finite and the rotary split whole: the
/// head width splits into a row and a column half, each of rotated pairs.
fn check(f: &Fields, names: &[&str; 10], c: &VisionConfig) -> Result<(), ConfigError> {
    let bounded = [
        (names[0], c.n_layers, 1, 256),
        (names[1], c.dim, 4, 65_536),
        (names[2], c.n_heads, 1, 1024),
        (names[3], c.inter_dim, 1, 262_144),
        (names[4], c.patch_size, 1, 1024),
        (names[6], c.downsample_ratio, 1, 64),
        (names[7], c.max_n_token, 8, 1 << 20),
        (names[8], c.min_pixels, 0, 1 << 30),
    ];
    for (key, v, lo, hi) in bounded {
        if !(lo..=hi).contains(&v) {
            return Err(invalid(f.name(key), v, format!("must be in {lo}..={hi}")));
        }
    }
    if !c.dim.is_multiple_of(c.n_heads) || !(c.dim / c.n_heads).is_multiple_of(4) {
        return Err(invalid(
            f.name(names[1]),
            c.dim,
            format!(
                "must be {} heads of a width divisible by 4 (2-D rotary pairs)",
                c.n_heads
            ),
        ));
    }
    if !(c.rope_theta.is_finite() && c.rope_theta > 1.0) {
        return Err(invalid(
            f.name(names[5]),
            c.rope_theta,
            "must be a number above 1",
        ));
    }
    if let Some(r) = c
        .max_wh_ratio
        .filter(|r| !(r.is_finite() && *r >= 1.0 && *r <= 1e4))
    {
        return Err(invalid(f.name(names[9]), r, "must be in 1..=10000 or null"));
    }
    Ok(())
}

impl VisionConfig {
    /// V4's five sentinel ids (start, pad, image, newline, end).
    pub fn sentinels(&self) -> std::ops::Range<u32> {
        self.sentinel_base..self.sentinel_base + 5
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.dim / self.n_heads
    }

    /// Values in one flattened patch: three channels of `patch_size²` pixels.
    pub fn patch_values(&self) -> usize {
        3 * self.patch_size * self.patch_size
    }
}
