//! Images in requests: their bytes (data URIs; fetching http(s) URLs is off), their decoding
//! (the `image` crate, limits set before any pixel is decoded), and the prompt they make:
//! the rendered text is cut at each image's placeholder and the image's span of tokens put
//! between the pieces, its pixels for the engine to put through the model's vision tower.

use std::io::Cursor;
use std::sync::Arc;

use base64::Engine as _;
use deepinfer_engine::request::{ImageSource, Prompt, PromptImage};
use deepinfer_model::vision::{ImagePlan, Pixels, VisionTower};
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits, RgbImage};

use crate::chat::tokens::IMAGE_PLACEHOLDER;
use crate::openai::ApiError;
use crate::tokenizer::Tokenizer;

/// What one request's images may cost.
#[derive(Clone, Copy, Debug)]
pub struct ImageLimits {
    pub max_images: usize,
    /// Encoded bytes of one image (after base64).
    pub max_bytes: usize,
    /// Pixels of one decoded image: its memory is three bytes each.
    pub max_pixels: u64,
    /// Longer side over shorter side.
    pub max_aspect: u32,
}

impl Default for ImageLimits {
    fn default() -> Self {
        Self {
            max_images: 8,
            max_bytes: 20 << 20,
            max_pixels: 32 << 20,
            max_aspect: 200,
        }
    }
}

/// The formats decoded (GIF: its first frame).
const FORMATS: [ImageFormat; 4] = [
    ImageFormat::Png,
    ImageFormat::Jpeg,
    ImageFormat::WebP,
    ImageFormat::Gif,
];

/// The pixels `url` carries; `field` names the request field in errors.
pub fn decode_url(
    url: Option<&str>,
    field: &str,
    limits: &ImageLimits,
) -> Result<Pixels, ApiError> {
    let bad = |why: String| ApiError::invalid(field, format!("`{field}`: {why}"));
    let url = url.ok_or_else(|| bad("an image part needs `image_url.url`".into()))?;
    if url.starts_with("http://") || url.starts_with("https://") {
        return Err(bad(
            "fetching images from http(s) URLs is off; send the image inline as a data URL \
             (data:image/png;base64,…)"
                .into(),
        ));
    }
    let payload = url
        .strip_prefix("data:")
        .and_then(|rest| rest.split_once(','))
        .filter(|(meta, _)| meta.ends_with(";base64"))
        .map(|(_, data)| data)
        .ok_or_else(|| {
            bad("expected a data URL with base64 content (data:image/png;base64,…)".into())
        })?;
    if payload.len() / 4 * 3 > limits.max_bytes {
        return Err(bad(format!(
            "the image is larger than {} bytes",
            limits.max_bytes
        )));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(payload.trim_end())
        .map_err(|e| bad(format!("the data URL is not valid base64: {e}")))?;
    decode_bytes(&bytes, limits).map_err(bad)
}

/// Decodes `bytes` within `limits`: dimensions are read from the header and checked before
/// the decoder allocates, so a small file declaring a huge canvas costs nothing.
pub fn decode_bytes(bytes: &[u8], limits: &ImageLimits) -> Result<Pixels, String> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| format!("cannot read the image: {e}"))?;
    match reader.format() {
        Some(f) if FORMATS.contains(&f) => {}
        Some(f) => {
            return Err(format!(
                "{f:?} images are not supported (PNG, JPEG, WebP or GIF)"
            ))
        }
        None => return Err("not an image in a known format (PNG, JPEG, WebP or GIF)".into()),
    }
    let (w, h) = reader
        .into_dimensions()
        .map_err(|e| format!("cannot read the image's size: {e}"))?;
    check_size(w, h, limits)?;
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| format!("cannot read the image: {e}"))?;
    let mut lim = Limits::default();
    lim.max_image_width = Some(w);
    lim.max_image_height = Some(h);
    lim.max_alloc = Some(limits.max_pixels * 4 + (16 << 20));
    reader.limits(lim);
    let bad = |e: image::ImageError| format!("cannot decode the image: {e}");
    let mut decoder = reader.into_decoder().map_err(bad)?;
    let orientation = decoder.orientation().map_err(bad)?;
    let mut img = DynamicImage::from_decoder(decoder).map_err(bad)?;
    img.apply_orientation(orientation);
    let rgb = on_white(img);
    Ok(Pixels {
        width: rgb.width() as usize,
        height: rgb.height() as usize,
        rgb: rgb.into_raw(),
    })
}

/// The image as RGB the way vLLM's loader makes it (`convert_image_mode(image, "RGB")`):
/// one with transparency is pasted onto white through its alpha, with Pillow's rounding
/// (`paste.c`'s `BLEND`: `(c·a + 255·(255 − a)) / 255` rounded to nearest).
fn on_white(img: DynamicImage) -> RgbImage {
    if !img.color().has_alpha() {
        return img.into_rgb8();
    }
    let rgba = img.into_rgba8();
    let (w, h) = rgba.dimensions();
    let blend = |c: u8, a: u8| {
        let v = u32::from(c) * u32::from(a) + 255 * (255 - u32::from(a)) + 128;
        ((v + (v >> 8)) >> 8) as u8
    };
    RgbImage::from_fn(w, h, |x, y| {
        let [r, g, b, a] = rgba.get_pixel(x, y).0;
        image::Rgb([blend(r, a), blend(g, a), blend(b, a)])
    })
}

fn check_size(w: u32, h: u32, limits: &ImageLimits) -> Result<(), String> {
    if w == 0 || h == 0 {
        return Err(format!("the image is {w}×{h} pixels: empty"));
    }
    if u64::from(w) * u64::from(h) > limits.max_pixels {
        return Err(format!(
            "the image is {w}×{h} pixels, more than the {} this server decodes",
            limits.max_pixels
        ));
    }
    if w.max(h) / w.min(h) > limits.max_aspect {
        return Err(format!(
            "the image is {w}×{h} pixels: sides further apart than {}:1",
            limits.max_aspect
        ));
    }
    Ok(())
}

/// One image of a prompt, decoded and planned, with its span's place.
pub struct PlacedImage {
    pub pixels: Pixels,
    pub plan: ImagePlan,
    pub offset: usize,
    pub len: usize,
}

/// `text` (the rendered prompt, one placeholder per image) tokenized with each image's span
/// at its placeholder; the images are planned, not yet encoded ([`encode`]).
pub fn splice(
    tok: &Tokenizer,
    text: &str,
    images: Vec<(String, Pixels)>,
    tower: &VisionTower,
) -> Result<(Vec<u32>, Vec<PlacedImage>), ApiError> {
    let pieces: Vec<&str> = text.split(IMAGE_PLACEHOLDER).collect();
    if pieces.len() != images.len() + 1 {
        return Err(ApiError::invalid(
            "messages",
            format!("message text must not contain the reserved image placeholder {IMAGE_PLACEHOLDER:?}"),
        ));
    }
    let mut ids = Vec::new();
    let mut placed = Vec::with_capacity(images.len());
    for (piece, image) in pieces
        .iter()
        .zip(images.into_iter().map(Some).chain([None]))
    {
        ids.extend(
            tok.encode(piece, false)
                .map_err(|e| ApiError::invalid("messages", e.to_string()))?,
        );
        let Some((field, pixels)) = image else { break };
        let plan = ImagePlan::new(&tower.config, pixels.width, pixels.height)
            .map_err(|e| ApiError::invalid(&field, format!("`{field}`: {e}")))?;
        let slots = tower.span(&plan, ids.len());
        let offset = ids.len();
        ids.extend(tower.span_ids(&slots));
        placed.push(PlacedImage {
            pixels,
            plan,
            offset,
            len: slots.len(),
        });
    }
    Ok((ids, placed))
}

/// The prompt for the engine: `ids` with each placed image's pixels, which the engine puts
/// through the tower between its steps (its cost scheduled like a prefill chunk's).
pub fn prompt(ids: Vec<u32>, placed: Vec<PlacedImage>) -> Prompt {
    let images = placed
        .into_iter()
        .map(|p| PromptImage {
            offset: p.offset,
            len: p.len,
            digest: p.pixels.digest(),
            source: ImageSource::Pixels(Arc::new(p.pixels), p.plan),
        })
        .collect();
    Prompt { ids, images }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{DynamicImage, RgbImage};

    fn encoded(w: u32, h: u32, format: ImageFormat) -> Vec<u8> {
        let img = RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, (x ^ y) as u8]));
        let mut out = Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(img)
            .write_to(&mut out, format)
            .unwrap();
        out.into_inner()
    }

    /// A PNG whose header declares `w × h` but whose data is a few bytes.
    fn declared_png(w: u32, h: u32) -> Vec<u8> {
        let mut png = encoded(4, 4, ImageFormat::Png);
        // IHDR: its type at 12..16, width and height at 16..24, its CRC at 29..33.
        png[16..20].copy_from_slice(&w.to_be_bytes());
        png[20..24].copy_from_slice(&h.to_be_bytes());
        let crc = crc32(&png[12..29]);
        png[29..33].copy_from_slice(&crc.to_be_bytes());
        png
    }

    /// PNG's CRC-32 (reflected, polynomial 0xEDB88320), bit by bit.
    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = !0u32;
        for &b in bytes {
            c ^= u32::from(b);
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
        }
        !c
    }

    /// Transparency and EXIF orientation as vLLM's loader treats them: the RGB bytes Pillow
    /// makes (tools/make_image_decode_fixtures.py), exactly.
    #[test]
    fn alpha_and_orientation_decode_as_vllm_does() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/vision/decode");
        let expected: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        let files = expected.as_object().unwrap();
        assert_eq!(files.len(), 7);
        for (name, want) in files {
            let px = decode_bytes(
                &std::fs::read(dir.join(name)).unwrap(),
                &ImageLimits::default(),
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            let size = (
                want["width"].as_u64().unwrap(),
                want["height"].as_u64().unwrap(),
            );
            assert_eq!((px.width as u64, px.height as u64), size, "{name}");
            let rgb = std::fs::read(dir.join(format!("{name}.rgb"))).unwrap();
            assert!(px.rgb == rgb, "{name}: pixels differ from Pillow's");
        }
    }

    #[test]
    fn every_accepted_format_decodes_to_its_size() {
        let limits = ImageLimits::default();
        for format in FORMATS {
            let px = decode_bytes(&encoded(37, 21, format), &limits).unwrap();
            assert_eq!(
                (px.width, px.height, px.rgb.len()),
                (37, 21, 37 * 21 * 3),
                "{format:?}"
            );
        }
        let png = decode_bytes(&encoded(37, 21, ImageFormat::Png), &limits).unwrap();
        assert_eq!(&png.rgb[..6], &[0, 0, 0, 1, 0, 1], "pixels as encoded");
    }

    #[test]
    fn bad_images_are_refused_before_decoding() {
        let limits = ImageLimits::default();
        let err = |bytes: &[u8]| decode_bytes(bytes, &limits).unwrap_err();
        assert!(err(b"not an image").contains("known format"));
        let bmp = [b"BM".as_slice(), &[0u8; 60]].concat();
        assert!(err(&bmp).contains("not supported"));
        assert!(err(&declared_png(60_000, 60_000)).contains("more than"));
        assert!(err(&encoded(1, 400, ImageFormat::Png)).contains("200:1"));
        let mut cut = encoded(64, 64, ImageFormat::Png);
        cut.truncate(cut.len() / 2);
        assert!(err(&cut).contains("cannot decode"));
    }

    #[test]
    fn data_urls_only() {
        let limits = ImageLimits::default();
        let field = "messages[0].content[0]";
        let msg = |url: &str| decode_url(Some(url), field, &limits).unwrap_err().message;
        assert!(msg("https://example.com/a.png").contains("data URL"));
        assert!(msg("data:image/png,rawbytes").contains("base64"));
        assert!(msg("data:image/png;base64,@@").contains("base64"));
        let ok = base64::engine::general_purpose::STANDARD.encode(encoded(5, 3, ImageFormat::Png));
        let px = decode_url(Some(&format!("data:image/png;base64,{ok}")), field, &limits).unwrap();
        assert_eq!((px.width, px.height), (5, 3));
    }
}
