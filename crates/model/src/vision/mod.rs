//! The vision tower (docs/MODEL.md §8.9): an image's pixels to the decoder's input
//! embeddings for its span of the prompt. The steps, each in its file: the size the image
//! is brought to ([`geometry`]), its canvas and patches ([`canvas`], through Pillow's
//! bicubic filter in [`resample`]), the ViT ([`vit`]), the aligner ([`aligner`]), and the
//! order of the span's slots ([`layout`]). The reference they are checked against is
//! `tools/golden/vision.py`, a port of vLLM 0.33's vision path.

mod affine;
pub mod aligner;
pub mod canvas;
mod encoding;
pub mod geometry;
pub mod layout;
pub mod resample;
pub mod vit;

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::config::{VisionConfig, VisionFamily};

pub use encoding::Encoding;
pub use geometry::ImagePlan;
pub use layout::Slot;

/// A decoded image: rows of RGB bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pixels {
    pub width: usize,
    pub height: usize,
    /// `height · width · 3` bytes, row-major.
    pub rgb: Vec<u8>,
}

impl Pixels {
    /// SHA-256 of the size and the pixels: what tells one image from another (the prefix
    /// cache keys image spans by it, as vLLM's multimodal hashing does).
    pub fn digest(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update((self.width as u64).to_le_bytes());
        h.update((self.height as u64).to_le_bytes());
        h.update(&self.rgb);
        h.finalize().into()
    }
}

/// Why an image cannot become embeddings.
#[derive(Debug, thiserror::Error)]
pub enum VisionError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("image: {0}")]
    Shape(String),
}

/// The tower's weights: ViT, aligner and the learned delimiter vectors.
pub struct VisionTower {
    pub config: VisionConfig,
    vit: vit::Vit,
    aligner: aligner::Aligner,
    start: Vec<f32>,
    end: Vec<f32>,
    newline: Vec<f32>,
    /// V4's filler slot; V4.1 has none.
    pad: Option<Vec<f32>>,
    hidden: usize,
    /// The id V4.1's spans carry at every position (the text config's `image_token_id`).
    image_token_id: u32,
}

/// One image through the tower: its plan and the aligner's rows (`[plan.rows(), hidden]`,
/// reading order over the token grid).
pub struct EncodedImage {
    pub plan: ImagePlan,
    pub rows: Vec<f32>,
}

impl VisionTower {
    /// Loads the tower `config` describes for a decoder `hidden` wide whose image token (the
    /// id V4.1's spans carry) is `image_token_id`.
    pub fn load(
        ck: &Checkpoint,
        config: &VisionConfig,
        hidden: usize,
        image_token_id: u32,
    ) -> Result<Self, VisionError> {
        let vector = |name: &str| ck.vector(name, hidden);
        Ok(Self {
            vit: vit::Vit::load(ck, config)?,
            aligner: aligner::Aligner::load(ck, config, hidden)?,
            start: vector("image_start")?,
            end: vector("image_end")?,
            newline: vector("image_newline")?,
            pad: match config.family {
                VisionFamily::V4 => Some(vector("image_pad")?),
                VisionFamily::V41 => None,
            },
            config: config.clone(),
            hidden,
            image_token_id,
        })
    }

    /// The plan, canvas and patches of `image`, ready for [`Self::encode_patches`].
    pub fn prepare(&self, image: &Pixels) -> Result<(ImagePlan, Vec<f32>), VisionError> {
        let plan = ImagePlan::new(&self.config, image.width, image.height)?;
        let canvas = canvas::canvas(image, &plan);
        Ok((
            plan,
            canvas::patches(&canvas, &plan, self.config.patch_size),
        ))
    }

    /// `image` through the ViT and the aligner.
    pub fn encode(&self, image: &Pixels) -> Result<EncodedImage, VisionError> {
        let (plan, patches) = self.prepare(image)?;
        Ok(self.encode_patches(plan, &patches))
    }

    /// Prepared patches through the ViT and the aligner: every step of
    /// [`Self::begin_patches`] at once.
    pub fn encode_patches(&self, plan: ImagePlan, patches: &[f32]) -> EncodedImage {
        let mut e = self.begin_patches(plan, patches.to_vec());
        while !e.is_done() {
            self.advance(&mut e);
        }
        e.into_encoded().expect("every step ran")
    }

    /// The ViT's output for an image (`[plan.patches(), dim]`) through the aligner.
    pub fn align(&self, vit_out: &[f32], plan: ImagePlan) -> EncodedImage {
        EncodedImage {
            plan,
            rows: self.aligner.forward(vit_out, (plan.n_vit_h, plan.n_vit_w)),
        }
    }

    /// The ViT alone, for per-stage checks.
    pub fn vit(&self) -> &vit::Vit {
        &self.vit
    }

    /// The decoder's input embeddings for `slots` (`[slots.len(), hidden]`): aligner rows at
    /// image slots, the learned vectors at the others.
    pub fn span_embeddings(&self, slots: &[Slot], image: &EncodedImage) -> Vec<f32> {
        let h = self.hidden;
        let mut out = Vec::with_capacity(slots.len() * h);
        for slot in slots {
            out.extend_from_slice(match *slot {
                Slot::Image(i) => &image.rows[i * h..(i + 1) * h],
                Slot::Start => &self.start,
                Slot::End => &self.end,
                Slot::Newline => &self.newline,
                Slot::Pad => self.pad.as_deref().expect("only V4 spans hold pad slots"),
            });
        }
        out
    }

    /// The decoder's width: the values per span position.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// The token ids the prompt carries at `slots`.
    pub fn span_ids(&self, slots: &[Slot]) -> Vec<u32> {
        let family = self.config.family;
        slots
            .iter()
            .map(|s| s.token_id(family, self.config.sentinel_base, self.image_token_id))
            .collect()
    }

    /// The slots of `image`'s span when its first slot lands at prompt position `start`.
    pub fn span(&self, plan: &ImagePlan, start: usize) -> Vec<Slot> {
        layout::span(self.config.family, plan.n_llm_h, plan.n_llm_w, start)
    }
}
