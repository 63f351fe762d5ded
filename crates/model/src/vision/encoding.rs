//! One image through the tower a step at a time, so that an engine can spread an image's
//! work over its steps (between other requests' decode steps) instead of stalling them for
//! the whole tower. The steps: the canvas, patches and patch embedding; each ViT block's
//! attention, then its MLP; the final norm and the aligner. [`VisionTower::encode_patches`]
//! is these steps run to the end.

use std::sync::Arc;

use super::{canvas, EncodedImage, ImagePlan, Pixels, VisionTower};

/// An image part way through the tower ([`VisionTower::begin`], [`VisionTower::advance`]).
pub struct Encoding {
    plan: ImagePlan,
    stage: Stage,
}

enum Stage {
    Pixels(Arc<Pixels>),
    Patches(Vec<f32>),
    /// The ViT's rows, the image's rotary table, and the next half block to run (`2b`:
    /// block `b`'s attention, `2b + 1`: its MLP).
    Blocks {
        x: Vec<f32>,
        rope: Vec<(f32, f32)>,
        next: usize,
    },
    Done(EncodedImage),
}

impl Encoding {
    pub fn plan(&self) -> ImagePlan {
        self.plan
    }

    pub fn is_done(&self) -> bool {
        matches!(self.stage, Stage::Done(_))
    }

    /// The aligner's rows once every step has run.
    pub fn into_encoded(self) -> Option<EncodedImage> {
        match self.stage {
            Stage::Done(image) => Some(image),
            _ => None,
        }
    }
}

impl VisionTower {
    /// `pixels`, planned as `plan`, ready to go through the tower in [`Self::steps`] steps.
    pub fn begin(&self, pixels: Arc<Pixels>, plan: ImagePlan) -> Encoding {
        Encoding {
            plan,
            stage: Stage::Pixels(pixels),
        }
    }

    /// Prepared patches ([`Self::prepare`]) ready for the same steps.
    pub fn begin_patches(&self, plan: ImagePlan, patches: Vec<f32>) -> Encoding {
        Encoding {
            plan,
            stage: Stage::Patches(patches),
        }
    }

    /// The steps an image takes: the patch embedding, every block's two halves, the
    /// aligner.
    pub fn steps(&self) -> usize {
        2 * self.vit.n_blocks() + 2
    }

    /// Runs `e`'s next step (nothing once it is done). Every step's rows are the image's
    /// patches, so its cost is `plan.patches()` rows of a ViT layer.
    pub fn advance(&self, e: &mut Encoding) {
        let plan = e.plan;
        let grid = (plan.n_vit_h, plan.n_vit_w);
        let embedded = |patches: &[f32]| Stage::Blocks {
            x: self.vit.embed(patches, plan.patches()),
            rope: self.vit.rope_table(grid),
            next: 0,
        };
        let next = match &mut e.stage {
            Stage::Pixels(pixels) => {
                let canvas = canvas::canvas(pixels, &plan);
                Some(embedded(&canvas::patches(
                    &canvas,
                    &plan,
                    self.config.patch_size,
                )))
            }
            Stage::Patches(patches) => Some(embedded(patches)),
            Stage::Blocks { x, rope, next } if *next < 2 * self.vit.n_blocks() => {
                match *next % 2 {
                    0 => self.vit.attention_half(*next / 2, x, rope),
                    _ => self.vit.mlp_half(*next / 2, x),
                }
                *next += 1;
                None
            }
            Stage::Blocks { x, .. } => {
                self.vit.final_norm(x);
                Some(Stage::Done(self.align(x, plan)))
            }
            Stage::Done(_) => None,
        };
        if let Some(stage) = next {
            e.stage = stage;
        }
    }
}
