//! The vision tower against our port of vLLM 0.33's vision path (tools/golden/vision.py,
//! written by tools/make_vision_golden.py) on tiny V4-Flash-Vision-Exp-style and V4.1-style
//! towers: each image's plan and canvas exactly (Pillow's bicubic filter included), then the
//! patch embedding, the first block, the whole ViT, the aligner and the span's embeddings
//! stage by stage (each stage fed the reference's input, so a mismatch names its stage).

use std::path::{Path, PathBuf};

use deepinfer_model::checkpoint::Checkpoint;
use deepinfer_model::config::{ModelConfig, VisionFamily};
use deepinfer_model::vision::{EncodedImage, ImagePlan, Pixels, Slot, VisionTower};
use safetensors::SafeTensors;
use serde_json::Value;

/// Relative tolerance (of the stage's largest value) for a stage fed the reference's input:
/// f32 in other summation orders (seen: under 7.3e-7).
const STAGE_TOL: f32 = 1e-5;
/// The whole ViT from the patches, where the differences of its blocks compound (seen: under
/// 1.2e-6).
const VIT_TOL: f32 = 1e-5;

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vision")
        .join(name)
}

struct Golden {
    meta: Value,
    bytes: Vec<u8>,
}

impl Golden {
    fn load(name: &str) -> Self {
        let d = dir(name);
        let json = std::fs::read_to_string(d.join("vision_golden.json")).unwrap();
        let bytes = std::fs::read(d.join("vision_golden.safetensors")).unwrap();
        Self {
            meta: serde_json::from_str(&json).unwrap(),
            bytes,
        }
    }

    fn raw(&self, name: &str) -> Vec<u8> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        st.tensor(name)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .data()
            .to_vec()
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        let b = self.raw(name);
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn i64s(&self, name: &str) -> Vec<i64> {
        let b = self.raw(name);
        b.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn images(&self) -> &Vec<Value> {
        self.meta["images"].as_array().unwrap()
    }
}

fn usize_of(v: &Value, key: &str) -> usize {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}")) as usize
}

fn relative(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
        / scale
}

fn check(label: &str, got: &[f32], want: &[f32], tol: f32) {
    let d = relative(got, want);
    assert!(d <= tol, "{label}: relative difference {d:e} > {tol:e}");
}

fn tower(name: &str) -> VisionTower {
    let model = dir(name).join("model");
    let config = ModelConfig::from_file(&model.join("config.json")).unwrap();
    let vc = config
        .vision
        .as_ref()
        .expect("the fixture declares a tower");
    let ck = Checkpoint::open(&model).unwrap();
    let image_id = config
        .v41
        .as_ref()
        .and_then(|v| v.image_token_id)
        .unwrap_or(0);
    VisionTower::load(&ck, vc, config.hidden_size, image_id).unwrap()
}

/// The role number the reference writes for a slot.
fn role(family: VisionFamily, slot: Slot) -> i64 {
    match (family, slot) {
        (_, Slot::Start) => 0,
        (VisionFamily::V4, Slot::Pad) => 1,
        (VisionFamily::V4, Slot::Image(_)) => 2,
        (VisionFamily::V4, Slot::Newline) => 3,
        (VisionFamily::V4, Slot::End) => 4,
        (VisionFamily::V41, Slot::Image(_)) => 1,
        (VisionFamily::V41, Slot::Newline) => 2,
        (VisionFamily::V41, Slot::End) => 3,
        (VisionFamily::V41, Slot::Pad) => panic!("V4.1 spans have no pad"),
    }
}

fn check_plan(label: &str, plan: &ImagePlan, m: &Value) {
    let got = [
        plan.width,
        plan.height,
        plan.n_vit_h,
        plan.n_vit_w,
        plan.n_llm_h,
        plan.n_llm_w,
    ];
    let keys = [
        "best_width",
        "best_height",
        "n_vit_h",
        "n_vit_w",
        "n_llm_h",
        "n_llm_w",
    ];
    let want = keys.map(|k| usize_of(m, k));
    assert_eq!(got, want, "{label}: plan {keys:?}");
    assert_eq!(plan.stretch, m["path"] == "stretch", "{label}: path");
}

fn check_image(t: &VisionTower, g: &Golden, k: usize, m: &Value) {
    let label = format!("image {k} ({}×{})", m["width"], m["height"]);
    let src = Pixels {
        width: usize_of(m, "width"),
        height: usize_of(m, "height"),
        rgb: g.raw(&format!("image{k}.rgb")),
    };
    let plan = ImagePlan::new(&t.config, src.width, src.height).unwrap();
    check_plan(&label, &plan, m);
    let canvas = deepinfer_model::vision::canvas::canvas(&src, &plan);
    let want = g.raw(&format!("image{k}.canvas"));
    let differ = canvas.rgb.iter().zip(&want).filter(|(a, b)| a != b).count();
    assert_eq!(canvas.rgb.len(), want.len(), "{label}: canvas size");
    assert_eq!(
        differ, 0,
        "{label}: {differ} canvas bytes differ from Pillow's"
    );

    let (_, patches) = t.prepare(&src).unwrap();
    let n = plan.patches();
    let embed = t.vit().embed(&patches, n);
    check(
        &format!("{label} patch embedding"),
        &embed,
        &g.f32s(&format!("image{k}.embed")),
        STAGE_TOL,
    );
    let mut x = g.f32s(&format!("image{k}.embed"));
    t.vit().block(0, &mut x, (plan.n_vit_h, plan.n_vit_w));
    check(
        &format!("{label} block 0"),
        &x,
        &g.f32s(&format!("image{k}.block0")),
        STAGE_TOL,
    );
    let vit = t.vit().forward(&patches, (plan.n_vit_h, plan.n_vit_w));
    check(
        &format!("{label} ViT"),
        &vit,
        &g.f32s(&format!("image{k}.vit")),
        VIT_TOL,
    );
    check_span(t, g, k, &label, plan);
}

/// The aligner on the reference's ViT output, then the span in prompt order.
fn check_span(t: &VisionTower, g: &Golden, k: usize, label: &str, plan: ImagePlan) {
    let vit_ref = g.f32s(&format!("image{k}.vit"));
    let rows = t.align(&vit_ref, plan);
    check(
        &format!("{label} aligner"),
        &rows.rows,
        &g.f32s(&format!("image{k}.aligner")),
        STAGE_TOL,
    );
    let fam = t.config.family;
    let slots = t.span(&plan, 3);
    let roles: Vec<i64> = slots.iter().map(|&s| role(fam, s)).collect();
    assert_eq!(
        roles,
        g.i64s(&format!("image{k}.types")),
        "{label}: slot roles"
    );
    if fam == VisionFamily::V4 {
        let perm: Vec<i64> = slots
            .iter()
            .filter_map(|s| match s {
                Slot::Image(i) => Some(*i as i64),
                _ => None,
            })
            .collect();
        assert_eq!(
            perm,
            g.i64s(&format!("image{k}.perm")),
            "{label}: image order"
        );
    }
    let reference = EncodedImage {
        plan,
        rows: g.f32s(&format!("image{k}.aligner")),
    };
    let span = t.span_embeddings(&slots, &reference);
    check(
        &format!("{label} span"),
        &span,
        &g.f32s(&format!("image{k}.span")),
        0.0,
    );
}

#[test]
fn v4_vision_exp_tower_matches_the_reference() {
    let (t, g) = (tower("tiny-v4"), Golden::load("tiny-v4"));
    assert_eq!(t.config.family, VisionFamily::V4);
    for (k, m) in g.images().iter().enumerate() {
        check_image(&t, &g, k, m);
    }
    // The compressor pad: a block starting anywhere begins its image rows on a group of 4.
    for (k, m) in g.images().iter().enumerate() {
        let plan = ImagePlan::new(&t.config, usize_of(m, "width"), usize_of(m, "height")).unwrap();
        for (start, want) in m["blocks_at_start"].as_array().unwrap().iter().enumerate() {
            let roles: Vec<i64> = t
                .span(&plan, start)
                .iter()
                .map(|&s| role(VisionFamily::V4, s))
                .collect();
            let want: Vec<i64> = want
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect();
            assert_eq!(roles, want, "image {k}: block at start {start}");
        }
    }
}

#[test]
fn v41_tower_matches_the_reference() {
    let (t, g) = (tower("tiny-v41"), Golden::load("tiny-v41"));
    assert_eq!(t.config.family, VisionFamily::V41);
    for (k, m) in g.images().iter().enumerate() {
        check_image(&t, &g, k, m);
    }
}

/// Pillow's resize and pad of small random images to random sizes (up and down on each
/// axis, one pass or two, either pass first): ours, byte for byte.
#[test]
fn resampler_matches_pillow_byte_for_byte() {
    let path = dir("").join("resample_golden.safetensors");
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let pixels = |name: &str| {
        let t = st.tensor(name).unwrap();
        let s = t.shape();
        Pixels {
            width: s[1],
            height: s[0],
            rgb: t.data().to_vec(),
        }
    };
    let mut cases = 0;
    while st.tensor(&format!("case{cases}.src")).is_ok() {
        let src = pixels(&format!("case{cases}.src"));
        for (path, stretch) in [("resize", true), ("pad", false)] {
            let want = pixels(&format!("case{cases}.{path}"));
            let plan = ImagePlan {
                width: want.width,
                height: want.height,
                n_vit_h: 0,
                n_vit_w: 0,
                n_llm_h: 0,
                n_llm_w: 0,
                stretch,
            };
            let got = deepinfer_model::vision::canvas::canvas(&src, &plan);
            let label = format!(
                "case {cases} {path}: {}×{} → {}×{}",
                src.width, src.height, want.width, want.height
            );
            assert_eq!(got, want, "{label}");
        }
        cases += 1;
    }
    assert!(cases >= 40, "only {cases} cases");
}
