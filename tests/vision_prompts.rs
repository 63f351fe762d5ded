//! Prompts with images through the whole model: V4.1 (tiny-v41-b's decoder with a tiny
//! tower) against our float32 ports of vLLM 0.33's vision path and V4.1 text model
//! (tools/make_vision_decoder_golden.py). Our tower encodes the images from their pixels;
//! the spans' embeddings replace the image token's at their positions. Then: every
//! position's logits, greedy tokens on the cache, and chunked prefill cutting the image spans
//! at every size equal to the whole prefill bit for bit.

mod common;

use std::path::{Path, PathBuf};

use common::{cache_for, relative_diff};
use deepinfer_engine::cache::CacheManager;
use deepinfer_engine::request::{ImageSource, PromptImage};
use deepinfer_engine::runner::{ModelRunner, SeqWork};
use deepinfer_model::kernels::topk::argmax;
use deepinfer_model::v4::Model;
use deepinfer_model::vision::Pixels;
use safetensors::SafeTensors;
use serde_json::Value;

/// Relative to the largest |logit| of the row: the tower's and the decoder's f32 sums in
/// other orders (seen: under 1.4e-6).
const LOGIT_TOL: f32 = 2e-5;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vision")
        .join(name)
}

fn dir() -> PathBuf {
    fixture("tiny-v41")
}

struct Files {
    /// The fixture: its `model/` and its decoder goldens.
    dir: PathBuf,
    meta: Value,
    decoder: Vec<u8>,
    vision: Vec<u8>,
}

impl Files {
    /// tiny-v41-b's decoder with a tiny tower.
    fn load() -> Self {
        Self::load_from(dir(), dir())
    }

    /// A V4-Flash-Vision-Exp decoder (hash layers, every layer kind, `bias_vl`) with
    /// tiny-v4's tower, whose vision goldens hold the source images
    /// (tools/make_vision_v4_decoder_golden.py).
    fn load_v4() -> Self {
        Self::load_from(fixture("tiny-v4-exp"), fixture("tiny-v4"))
    }

    fn load_from(dir: PathBuf, vision_dir: PathBuf) -> Self {
        let read = |d: &Path, name: &str| std::fs::read(d.join(name)).unwrap();
        Self {
            meta: serde_json::from_slice(&read(&dir, "decoder_golden.json")).unwrap(),
            decoder: read(&dir, "decoder_golden.safetensors"),
            vision: read(&vision_dir, "vision_golden.safetensors"),
            dir,
        }
    }

    fn model(&self) -> Model {
        Model::load(&self.dir.join("model")).unwrap()
    }

    fn tensor(bytes: &[u8], name: &str) -> (Vec<usize>, Vec<u8>) {
        let st = SafeTensors::deserialize(bytes).unwrap();
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        (t.shape().to_vec(), t.data().to_vec())
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        let (_, b) = Self::tensor(&self.decoder, name);
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Source image `k` of the vision golden.
    fn image(&self, k: usize) -> Pixels {
        let (shape, rgb) = Self::tensor(&self.vision, &format!("image{k}.rgb"));
        Pixels {
            width: shape[1],
            height: shape[0],
            rgb,
        }
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The prompt's images through our tower, checked to sit where the prompt's ids say.
fn prompt_images(model: &Model, f: &Files, p: &Value) -> Vec<PromptImage> {
    let tower = model.vision.as_ref().expect("the fixture ships a tower");
    let prompt = ids(&p["ids"]);
    let mut out = Vec::new();
    for im in p["images"].as_array().unwrap() {
        let (k, offset) = (
            im["image"].as_u64().unwrap() as usize,
            im["offset"].as_u64().unwrap() as usize,
        );
        let px = f.image(k);
        let enc = tower.encode(&px).unwrap();
        let slots = tower.span(&enc.plan, offset);
        assert_eq!(
            tower.span_ids(&slots),
            prompt[offset..offset + slots.len()],
            "image {k}'s span ids"
        );
        out.push(PromptImage {
            offset,
            len: slots.len(),
            source: ImageSource::Embeds(tower.span_embeddings(&slots, &enc).into()),
            digest: px.digest(),
        });
    }
    out
}

/// Feeds `tokens` to a fresh sequence in chunks of `chunk`; every position's logits.
fn run_chunks(
    r: &mut ModelRunner,
    cache: &mut CacheManager,
    tokens: &[u32],
    images: &[PromptImage],
    chunk: usize,
) -> Vec<Vec<f32>> {
    let seq = cache.add_seq().unwrap();
    let mut out = Vec::new();
    for start in (0..tokens.len()).step_by(chunk) {
        let part = &tokens[start..(start + chunk).min(tokens.len())];
        cache.ensure_capacity(seq, start + part.len()).unwrap();
        let work = SeqWork {
            seq,
            start,
            tokens: part,
            num_logits: part.len(),
            history: &tokens[..start],
            images,
        };
        let l = r.step(cache, &[work]).unwrap();
        out.extend((0..l.rows()).map(|i| l.row(i).to_vec()));
    }
    cache.free_seq(seq).unwrap();
    out
}

fn prompts(f: &Files) -> &Vec<Value> {
    f.meta["prompts"].as_array().unwrap()
}

#[test]
fn image_prompts_match_the_reference() {
    matches_the_reference(&Files::load());
}

/// V4-Flash-Vision-Exp: the sentinels route with `bias_vl` (hash layers too) and the image
/// positions see their whole block in prefill.
#[test]
fn v4_image_prompts_match_the_reference() {
    matches_the_reference(&Files::load_v4());
}

/// Every position's logits of each golden prompt (prefilled whole) within [`LOGIT_TOL`],
/// then its greedy tokens decoded on the cache.
fn matches_the_reference(f: &Files) {
    let model = f.model();
    let mut cache = cache_for(&model, 1);
    let images: Vec<_> = prompts(f)
        .iter()
        .map(|p| prompt_images(&model, f, p))
        .collect();
    let mut r = ModelRunner::new(model);
    for (i, p) in prompts(f).iter().enumerate() {
        let tokens = ids(&p["ids"]);
        let got = run_chunks(&mut r, &mut cache, &tokens, &images[i], tokens.len());
        let want = f.f32s(&format!("p{i}.logits"));
        let vocab = want.len() / tokens.len();
        for (t, row) in got.iter().enumerate() {
            let d = relative_diff(row, &want[t * vocab..(t + 1) * vocab]);
            assert!(
                d <= LOGIT_TOL,
                "prompt {i} position {t}: relative logit difference {d:e}"
            );
        }
        assert!(
            p["tie_safe"].as_bool().unwrap(),
            "prompt {i} is not tie-safe"
        );
        let greedy = ids(&p["greedy"]);
        let mut seq_tokens = tokens.clone();
        let seq = cache.add_seq().unwrap();
        let mut last = got.last().unwrap().clone();
        // The prompt again through the cache, then one token per step on our own argmax.
        let mut start = 0;
        for step in 0..greedy.len() {
            if step > 0 {
                seq_tokens.push(argmax(&last) as u32);
            }
            let part = &seq_tokens[start..];
            cache.ensure_capacity(seq, seq_tokens.len()).unwrap();
            let work = SeqWork {
                seq,
                start,
                tokens: part,
                num_logits: 1,
                history: &seq_tokens[..start],
                images: &images[i],
            };
            last = r.step(&mut cache, &[work]).unwrap().row(0).to_vec();
            start = seq_tokens.len();
        }
        seq_tokens.push(argmax(&last) as u32);
        assert_eq!(
            seq_tokens[tokens.len()..],
            greedy[..],
            "prompt {i}: greedy tokens"
        );
        cache.free_seq(seq).unwrap();
    }
}

/// Prefill in chunks that cut the image spans anywhere (one token = decode) gives the
/// whole prefill's logits at every position, bit for bit.
#[test]
fn chunked_prefill_through_image_spans_equals_the_whole() {
    let f = Files::load();
    let model = Files::load().model();
    let mut cache = cache_for(&model, 1);
    let p = &prompts(&f)[1];
    let images = prompt_images(&model, &f, p);
    let tokens = ids(&p["ids"]);
    let mut r = ModelRunner::new(model);
    let whole = run_chunks(&mut r, &mut cache, &tokens, &images, tokens.len());
    for chunk in [1, 3, 5, 16] {
        let got = run_chunks(&mut r, &mut cache, &tokens, &images, chunk);
        for (t, (a, b)) in got.iter().zip(&whole).enumerate() {
            assert!(
                common::same_bits(a, b),
                "chunks of {chunk}: position {t} differs"
            );
        }
    }
    // Without the images' embeddings the logits move: the spans are read.
    let plain = run_chunks(&mut r, &mut cache, &tokens, &[], tokens.len());
    assert!(relative_diff(plain.last().unwrap(), whole.last().unwrap()) > 1e-3);
}

/// Tokens per prefix-cache block here: small, so that the spans cross block boundaries.
const BLOCK: usize = 16;

fn engine(prefix: bool) -> deepinfer_engine::engine::EngineCore {
    engine_with(Files::load().model(), engine_config(prefix))
}

fn engine_with(
    model: Model,
    config: deepinfer_engine::engine::EngineConfig,
) -> deepinfer_engine::engine::EngineCore {
    let metrics = std::sync::Arc::new(deepinfer_engine::metrics::EngineMetrics::new("vision"));
    deepinfer_engine::engine::EngineCore::new(model, config, metrics).unwrap()
}

/// Two sequences, a 64-token step budget, prefill in chunks of 12.
fn engine_config(prefix: bool) -> deepinfer_engine::engine::EngineConfig {
    use deepinfer_engine::cache::CacheConfig;
    use deepinfer_engine::engine::EngineConfig;
    use deepinfer_engine::scheduler::SchedulerConfig;
    EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 2,
            max_num_batched_tokens: 64,
            prefill_chunk: Some(12),
            max_model_len: 128,
        },
        cache: CacheConfig {
            prefix_caching: prefix,
            block_tokens: BLOCK,
            ..common::cache_config(32 << 20, 2, 0)
        },
        model_name: "vision".into(),
        forced_output: None,
        speculative: None,
        prefix_disk: None,
    }
}

/// Queues a request for `max_tokens` greedy tokens with top-5 logprobs.
fn add(
    core: &mut deepinfer_engine::engine::EngineCore,
    id: u64,
    prompt: &[u32],
    images: &[PromptImage],
    max_tokens: usize,
) -> std::sync::mpsc::Receiver<deepinfer_engine::request::RequestOutput> {
    use deepinfer_engine::request::Request;
    use deepinfer_engine::sampling_params::SamplingParams;
    let (tx, rx) = std::sync::mpsc::channel();
    let params = SamplingParams {
        logprobs: Some(5),
        ..common::greedy(max_tokens)
    };
    let req = Request {
        id,
        prompt_ids: prompt.to_vec(),
        params,
        arrival: std::time::Instant::now(),
        images: images.to_vec(),
    };
    core.add_request(req, Box::new(tx));
    rx
}

/// Greedy tokens, their top-5 logprobs as bits, and the cached prompt tokens of one request.
fn serve(
    core: &mut deepinfer_engine::engine::EngineCore,
    id: u64,
    prompt: &[u32],
    images: &[PromptImage],
) -> (Vec<u32>, Vec<u32>, usize) {
    let rx = add(core, id, prompt, images, 8);
    while core.has_work() {
        core.step().unwrap();
    }
    common::outcome(rx)
}

/// `images` as the server sends them: pixels, planned, for the engine's tower.
fn as_pixels(model: &Model, f: &Files, p: &Value, images: &[PromptImage]) -> Vec<PromptImage> {
    let tower = model.vision.as_ref().unwrap();
    images
        .iter()
        .zip(p["images"].as_array().unwrap())
        .map(|(im, spec)| {
            let px = f.image(spec["image"].as_u64().unwrap() as usize);
            let plan = tower.encode(&px).unwrap().plan;
            PromptImage {
                source: ImageSource::Pixels(std::sync::Arc::new(px), plan),
                ..im.clone()
            }
        })
        .collect()
}

/// Images sent as pixels go through the engine's tower and answer as their embeddings
/// made beforehand do, bit for bit; the tower runs a step at a time between the engine's
/// steps, so a request already decoding gets a token in every step while they encode.
#[test]
fn the_engine_encodes_pixels_between_its_steps() {
    let f = Files::load();
    let model = Files::load().model();
    let tower = model.vision.clone().unwrap();
    for p in &prompts(&f)[..2] {
        let tokens = ids(&p["ids"]);
        let embeds = prompt_images(&model, &f, p);
        let pixels = as_pixels(&model, &f, p, &embeds);
        let want = serve(&mut engine(false), 0, &tokens, &embeds);
        assert_eq!(serve(&mut engine(false), 0, &tokens, &pixels), want);
    }

    let p = &prompts(&f)[1];
    let (tokens, embeds) = (ids(&p["ids"]), prompt_images(&model, &f, p));
    let pixels = as_pixels(&model, &f, p, &embeds);
    // The engine's budget (64 rows a step) holds one tower step of the first image.
    let ImageSource::Pixels(_, plan) = &pixels[0].source else {
        unreachable!()
    };
    assert!(plan.patches() > 64, "{} patches", plan.patches());
    let tower_steps = tower.steps();

    // Steps until the image request's first token, beside a decoding request; each step
    // must give the decoding request its token.
    let steps_to_answer = |images: &[PromptImage]| {
        let mut core = engine(false);
        let text = add(&mut core, 0, &tokens[..5], &[], 100);
        while text.try_iter().count() == 0 {
            core.step().unwrap();
        }
        let image = add(&mut core, 1, &tokens, images, 4);
        let mut steps = 0;
        loop {
            core.step().unwrap();
            steps += 1;
            let decoded: usize = text.try_iter().map(|o| o.new_token_ids.len()).sum();
            assert_eq!(
                decoded, 1,
                "step {steps}: the decoding request got {decoded} tokens"
            );
            if image.try_iter().count() > 0 {
                return steps;
            }
        }
    };
    let (encoded, from_pixels) = (steps_to_answer(&embeds), steps_to_answer(&pixels));
    assert!(
        from_pixels + 1 >= encoded + tower_steps,
        "from pixels: {from_pixels} steps, from embeddings: {encoded}; the tower takes {tower_steps}"
    );
}

/// The same image again hits the prefix cache and answers as a cold run does, bit for bit;
/// another image of the same size (one pixel changed) misses from its span on and answers
/// as its own cold run.
#[test]
fn prefix_cache_tells_images_apart_and_hits_are_bit_exact() {
    let f = Files::load();
    let model = Files::load().model();
    let p = &prompts(&f)[1];
    let tokens = ids(&p["ids"]);
    let images = prompt_images(&model, &f, p);
    // Image 0 (at offset 4, in the first block) with one pixel changed.
    let mut other = f.image(p["images"][0]["image"].as_u64().unwrap() as usize);
    other.rgb[0] ^= 0x40;
    let tower = model.vision.clone().unwrap();
    let enc = tower.encode(&other).unwrap();
    let slots = tower.span(&enc.plan, images[0].offset);
    let mut changed = images.clone();
    changed[0].source = ImageSource::Embeds(tower.span_embeddings(&slots, &enc).into());
    changed[0].digest = other.digest();
    assert_ne!(changed[0].embeds(), images[0].embeds());

    let (mut warm, mut cold) = (engine(true), engine(false));
    let want = serve(&mut cold, 0, &tokens, &images);
    let want_changed = serve(&mut cold, 1, &tokens, &changed);
    assert_ne!(want.1, want_changed.1, "the changed pixel changes nothing");
    let first = serve(&mut warm, 0, &tokens, &images);
    let again = serve(&mut warm, 1, &tokens, &images);
    let moved = serve(&mut warm, 2, &tokens, &changed);
    assert_eq!((&first.0, &first.1), (&want.0, &want.1), "first run");
    assert_eq!((&again.0, &again.1), (&want.0, &want.1), "cached run");
    assert_eq!(
        (&moved.0, &moved.1),
        (&want_changed.0, &want_changed.1),
        "other image"
    );
    assert_eq!(first.2, 0);
    assert!(
        again.2 >= tokens.len() / BLOCK * BLOCK,
        "the same image reused {} tokens",
        again.2
    );
    assert_eq!(moved.2, 0, "another image's span must not hit the cache");
}

/// Two image prompts (three images of different sizes) in the same steps, beside each
/// other: every position's logits those of each prompt alone, bit for bit.
#[test]
fn image_prompts_batched_together_equal_each_alone() {
    batched_equal_alone(&Files::load(), 7);
}

/// V4-Flash-Vision-Exp: two image prompts prefilled whole side by side in one step (its
/// image blocks are never cut) equal each alone, bit for bit.
#[test]
fn v4_image_prompts_batched_together_equal_each_alone() {
    batched_equal_alone(&Files::load_v4(), usize::MAX);
}

/// The first two golden prompts fed side by side in steps of `chunk` tokens each.
fn batched_equal_alone(f: &Files, chunk: usize) {
    let model = f.model();
    let mut cache = cache_for(&model, 2);
    let ps: Vec<(Vec<u32>, Vec<PromptImage>)> = prompts(f)[..2]
        .iter()
        .map(|p| (ids(&p["ids"]), prompt_images(&model, f, p)))
        .collect();
    let mut r = ModelRunner::new(model);
    let alone: Vec<_> = ps
        .iter()
        .map(|(t, im)| run_chunks(&mut r, &mut cache, t, im, t.len()))
        .collect();
    let seqs = [cache.add_seq().unwrap(), cache.add_seq().unwrap()];
    let longest = ps.iter().map(|p| p.0.len()).max().unwrap();
    let chunk = chunk.min(longest);
    let mut got = [Vec::new(), Vec::new()];
    for start in (0..longest).step_by(chunk) {
        let mut work = Vec::new();
        let mut who = Vec::new();
        for (k, (t, im)) in ps.iter().enumerate().filter(|(_, p)| start < p.0.len()) {
            let part = &t[start..(start + chunk).min(t.len())];
            cache.ensure_capacity(seqs[k], start + part.len()).unwrap();
            work.push(SeqWork {
                seq: seqs[k],
                start,
                tokens: part,
                num_logits: part.len(),
                history: &t[..start],
                images: im,
            });
            who.push((k, part.len()));
        }
        let l = r.step(&mut cache, &work).unwrap();
        let mut row = 0;
        for (k, n) in who {
            got[k].extend((row..row + n).map(|i| l.row(i).to_vec()));
            row += n;
        }
    }
    for k in 0..2 {
        for (t, (a, b)) in got[k].iter().zip(&alone[k]).enumerate() {
            assert!(
                common::same_bits(a, b),
                "prompt {k} position {t} differs when batched"
            );
        }
    }
}

/// The handle refuses image spans that cannot be filled, naming the image: overlapping
/// spans, embeddings of the wrong width, pixels whose plan makes another span length.
#[test]
fn the_handle_refuses_spans_it_cannot_fill() {
    use deepinfer_engine::engine::{start, EngineError};
    use deepinfer_engine::request::Prompt;
    let f = Files::load();
    let model = Files::load().model();
    let p = &prompts(&f)[1];
    let (tokens, embeds) = (ids(&p["ids"]), prompt_images(&model, &f, p));
    let pixels = as_pixels(&model, &f, p, &embeds);
    let (handle, join) = start(model, engine_config(false)).unwrap();
    let refused = |images: Vec<PromptImage>| {
        let prompt = Prompt {
            ids: tokens.clone(),
            images,
        };
        let (tx, _rx) = std::sync::mpsc::channel();
        match handle.add_constrained_request_to(prompt, common::greedy(1), None, Box::new(tx)) {
            Err(EngineError::BadImage { index, reason }) => (index, reason),
            other => panic!("not refused: {other:?}"),
        }
    };
    let mut overlap = embeds.clone();
    overlap[1].offset = overlap[0].offset + 1;
    assert_eq!(refused(overlap).0, 1);
    let mut narrow = embeds.clone();
    narrow[0].source = ImageSource::Embeds(vec![0.0; narrow[0].len].into());
    assert!(refused(narrow).1.contains("embedding values"));
    let mut short = pixels.clone();
    short[1].len -= 1;
    let (index, reason) = refused(short);
    assert!(index == 1 && reason.contains("positions"), "{reason}");
    handle.shutdown();
    join.join().unwrap().unwrap();
}

/// V4-Flash-Vision-Exp: a cached prefix that ends inside an image block is not resumed there
/// (the block's positions see one another, so its rows past the cut would miss their left
/// side): the request resumes from before the block and answers as a cold run does.
#[test]
fn v4_a_hit_inside_an_image_block_resumes_before_it() {
    let f = Files::load_v4();
    let model = f.model();
    let p = &prompts(&f)[1];
    let (tokens, images) = (ids(&p["ids"]), prompt_images(&model, &f, p));
    let first = &images[0];
    let cut = first.offset + BLOCK; // past a block boundary inside the first block
    assert!(
        cut < first.offset + first.len,
        "the first block is too short"
    );
    let hidden = model.config.hidden_size;
    let part = PromptImage {
        len: cut - first.offset,
        source: ImageSource::Embeds(
            first.embeds().unwrap()[..(cut - first.offset) * hidden].into(),
        ),
        ..first.clone()
    };
    let want = serve(
        &mut engine_with(f.model(), engine_config(false)),
        0,
        &tokens,
        &images,
    );
    let mut warm = engine_with(f.model(), engine_config(true));
    // A prompt cut inside the image leaves blocks up to the cut in the cache.
    serve(&mut warm, 0, &tokens[..cut + 1], &[part]);
    let got = serve(&mut warm, 1, &tokens, &images);
    assert_eq!((&got.0, &got.1), (&want.0, &want.1));
    assert!(
        got.2 <= first.offset,
        "resumed at {} inside the block {}..{}",
        got.2,
        first.offset,
        first.offset + first.len
    );
}

/// V4-Flash-Vision-Exp through the engine from pixels, its prefill in chunks of 12 (which
/// stop before an image block or take it whole) and whole: the reference's greedy tokens,
/// and the same logprob bits either way.
#[test]
fn v4_the_engine_answers_as_the_reference() {
    let f = Files::load_v4();
    let model = f.model();
    for p in prompts(&f) {
        let tokens = ids(&p["ids"]);
        let embeds = prompt_images(&model, &f, p);
        let pixels = as_pixels(&model, &f, p, &embeds);
        let mut whole = engine_config(false);
        whole.scheduler.prefill_chunk = None;
        let chunked = serve(
            &mut engine_with(f.model(), engine_config(true)),
            0,
            &tokens,
            &pixels,
        );
        let want = serve(&mut engine_with(f.model(), whole), 0, &tokens, &embeds);
        assert_eq!(chunked.0[..], ids(&p["greedy"])[..chunked.0.len()]);
        assert_eq!((chunked.0, chunked.1), (want.0, want.1));
    }
}

/// Prefill cut inside an image block (one token at a time) moves the logits: its positions
/// see the block's later slots only when it is prefilled whole.
#[test]
fn v4_a_block_cut_by_a_chunk_sees_less() {
    let f = Files::load_v4();
    let model = f.model();
    let mut cache = cache_for(&model, 1);
    let p = &prompts(&f)[0];
    let (tokens, images) = (ids(&p["ids"]), prompt_images(&model, &f, p));
    let mut r = ModelRunner::new(model);
    let whole = run_chunks(&mut r, &mut cache, &tokens, &images, tokens.len());
    let cut = run_chunks(&mut r, &mut cache, &tokens, &images, 1);
    let first = images[0].offset;
    assert!(
        common::same_bits(&cut[first], &whole[first]),
        "the pad slot sees as before"
    );
    let d = relative_diff(cut.last().unwrap(), whole.last().unwrap());
    assert!(
        d > 1e-3,
        "cutting the block moved the last logits by only {d:e}"
    );
}
