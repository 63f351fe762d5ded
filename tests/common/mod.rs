//! Fixture access shared by the golden tests.
#![allow(dead_code)]

use deepinfer_engine::cache::{CacheBudget, CacheConfig, CacheError, CacheManager, SeqId};
use deepinfer_engine::engine::EngineHandle;
use deepinfer_engine::request::{FinishReason, RequestOutput};
use deepinfer_engine::runner::{ModelRunner, RunnerError};
use deepinfer_engine::sampling_params::SamplingParams;
use deepinfer_model::batch::{ForwardBatch, Logits, SeqSpan};
use deepinfer_model::kernels::topk::argmax;
use deepinfer_model::v4::Model;
use safetensors::SafeTensors;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;

pub const LOGIT_TOL: f32 = 1e-4;

pub fn fixture(config: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/golden")
        .join(config)
}

/// What HF computed for one config (tools/make_golden.py).
pub struct Golden {
    pub meta: Value,
    bytes: Vec<u8>,
}

impl Golden {
    pub fn load(config: &str) -> Self {
        Self::load_named(config, "golden")
    }

    /// `{name}.json` and `{name}.safetensors` of a config (`golden`, `mtp_golden`).
    pub fn load_named(config: &str, name: &str) -> Self {
        let dir = fixture(config);
        let json = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
        let meta = serde_json::from_str(&json).unwrap();
        let bytes = std::fs::read(dir.join(format!("{name}.safetensors"))).unwrap();
        Self { meta, bytes }
    }

    pub fn f32s(&self, name: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(name).unwrap();
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    pub fn i64s(&self, name: &str) -> Vec<i64> {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(name).unwrap();
        t.data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    pub fn prompts(&self) -> &Vec<Value> {
        self.meta["prompts"].as_array().unwrap()
    }
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Whether two rows are the same bits (a batch-invariant computation gives a row the same
/// bits whatever shares its step).
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A golden prompt's ids, its greedy tokens, and the sequence that feeds both in one pass
/// (prompt + greedy tokens but the last): position `len(prompt) - 1 + s` predicts step `s`.
fn teacher_forced(p: &Value) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let prompt = ids(&p["ids"]);
    let greedy = ids(&p["greedy"]);
    let seq = prompt
        .iter()
        .chain(&greedy[..greedy.len() - 1])
        .copied()
        .collect();
    (prompt, greedy, seq)
}

/// How [`check_teacher_forced`] bounds logits.
pub enum LogitTol {
    /// Every compared logit within this of the reference's.
    Absolute(f32),
    /// Within this times the larger of 1 and the row's largest |logit| (the reference's for
    /// the last prompt position, ours for a greedy step).
    Relative(f32),
}

impl LogitTol {
    fn diff(&self, got: &[f32], want: &[f32], scale_row: &[f32]) -> f32 {
        match self {
            LogitTol::Absolute(_) => max_abs_diff(got, want),
            LogitTol::Relative(_) => {
                max_abs_diff(got, want) / scale_row.iter().fold(1.0f32, |m, v| m.max(v.abs()))
            }
        }
    }

    fn bound(&self) -> f32 {
        match self {
            LogitTol::Absolute(t) | LogitTol::Relative(t) => *t,
        }
    }
}

/// Every prompt of `g`, whole, against its goldens ([`check_teacher_forced`]), after making
/// sure at least three are tie-safe (checked strictly), so the comparison bites.
pub fn check_whole_prompts(r: &mut TestRunner, g: &Golden, label: &str) {
    let safe = g
        .prompts()
        .iter()
        .filter(|p| p["tie_safe"].as_bool().unwrap())
        .count();
    assert!(safe >= 3, "{label}: only {safe} tie-safe prompts");
    for p in g.prompts() {
        check_teacher_forced(r, g, p, usize::MAX, LogitTol::Absolute(LOGIT_TOL), label);
    }
}

/// Golden prompt `p` with its greedy tokens fed teacher-forced in chunks of `chunk`: the
/// prompt positions' argmax, the last prompt position's logits, and every greedy step's
/// choice and top logits against `g`. Tie-safe prompts must agree everywhere within `tol`;
/// the others (a near-tied choice may go either way) on at least 90 % of the positions'
/// argmax, so that a real bug cannot hide behind the flag. Returns the last prompt
/// position's logits.
pub fn check_teacher_forced(
    r: &mut TestRunner,
    g: &Golden,
    p: &Value,
    chunk: usize,
    tol: LogitTol,
    label: &str,
) -> Vec<f32> {
    let pi = p["index"].as_u64().unwrap();
    let (prompt, greedy, seq) = teacher_forced(p);
    let tie_safe = p["tie_safe"].as_bool().unwrap();
    let logits = chunked_logits(r, &seq, chunk);
    let n = prompt.len();
    let last = &logits[n - 1];
    let want_last = g.f32s(&format!("p{pi}.last_logits"));
    let diff = tol.diff(last, &want_last, &want_last);
    let argmax_want = g.i64s(&format!("p{pi}.argmax"));
    let agree = (0..n)
        .filter(|&i| argmax(&logits[i]) as i64 == argmax_want[i])
        .count();
    let top_ids = g.i64s(&format!("p{pi}.top_ids"));
    let top_logits = g.f32s(&format!("p{pi}.top_logits"));
    let k = top_ids.len() / greedy.len();
    let (mut step_diff, mut greedy_agree) = (0.0f32, 0);
    for (s, &tok) in greedy.iter().enumerate() {
        let row = &logits[n - 1 + s];
        greedy_agree += usize::from(argmax(row) as u32 == tok);
        let got: Vec<f32> = (0..k).map(|j| row[top_ids[s * k + j] as usize]).collect();
        let want = &top_logits[s * k..(s + 1) * k];
        step_diff = step_diff.max(tol.diff(&got, want, row));
    }
    eprintln!(
        "{label} p{pi} len {n}: last-logit diff {diff:.2e}, step diff {step_diff:.2e}, \
         argmax {agree}/{n}, greedy {greedy_agree}/{}, tie_safe {tie_safe}",
        greedy.len()
    );
    if tie_safe {
        let bound = tol.bound();
        assert!(
            diff <= bound,
            "{label} p{pi}: last-position logits differ by {diff}"
        );
        assert_eq!(agree, n, "{label} p{pi}: per-position argmax differs");
        assert_eq!(
            greedy_agree,
            greedy.len(),
            "{label} p{pi}: greedy tokens differ"
        );
        assert!(
            step_diff <= bound,
            "{label} p{pi}: per-step top logits differ by {step_diff}"
        );
    } else {
        assert!(
            agree * 10 >= n * 9,
            "{label} p{pi}: only {agree}/{n} argmax agree"
        );
    }
    last.to_vec()
}

/// prompt + greedy continuation of prompt `pi`: a sequence long enough to cross windows.
pub fn long_sequence(g: &Golden, pi: usize) -> Vec<u32> {
    let p = &g.prompts()[pi];
    [ids(&p["ids"]), ids(&p["greedy"])].concat()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// [`max_abs_diff`] over the larger of 1 and the reference `want`'s largest |value|.
pub fn relative_diff(got: &[f32], want: &[f32]) -> f32 {
    max_abs_diff(got, want) / want.iter().fold(1.0f32, |m, v| m.max(v.abs()))
}

pub fn load(config: &str, layout: &str) -> Model {
    Model::load(&fixture(config).join(layout)).unwrap_or_else(|e| panic!("{config}/{layout}: {e}"))
}

/// Cache settings for the tests: `budget` bytes, `max_seqs` state slots, `slack` tokens of
/// rollback, small blocks so that entries cross block boundaries often.
pub fn cache_config(budget: usize, max_seqs: usize, slack: usize) -> CacheConfig {
    CacheConfig {
        budget: CacheBudget::Bytes(budget),
        max_seqs,
        rollback_slack: slack,
        block_tokens: 16,
        ..CacheConfig::default()
    }
}

/// The smallest budget whose pools hold one sequence of `tokens` tokens.
pub fn budget_for_one(config: &str, max_seqs: usize, tokens: usize) -> usize {
    let model = load(config, "official");
    let mut budget = 1 << 16;
    loop {
        let cfg = cache_config(budget, max_seqs, 0);
        if let Ok(m) = CacheManager::new(&model.config, cfg) {
            if m.max_tokens_per_seq() >= tokens {
                return budget;
            }
        }
        budget += budget / 8;
    }
}

/// The model runner and a cache, driven directly (no scheduler): the harness keeps each
/// sequence's tokens, as the engine's `Sequence` does.
pub struct TestRunner {
    pub runner: ModelRunner,
    pub cache: CacheManager,
    seqs: HashMap<SeqId, Vec<u32>>,
}

/// Tokens to append to one sequence in a step; logits of every one or of the last.
pub struct Feed<'a> {
    pub seq: SeqId,
    pub tokens: &'a [u32],
    pub all_logits: bool,
}

impl TestRunner {
    pub fn model(&self) -> &Model {
        self.runner.model()
    }

    pub fn cache(&self) -> &CacheManager {
        &self.cache
    }

    pub fn add_sequence(&mut self) -> Result<SeqId, CacheError> {
        let s = self.cache.add_seq()?;
        self.seqs.insert(s, Vec::new());
        Ok(s)
    }

    /// Appends every item's tokens to its sequence in one step (reserving the room first).
    pub fn step(&mut self, feeds: &[Feed<'_>]) -> Result<&Logits, RunnerError> {
        self.runner.clear();
        for f in feeds {
            let history = &self.seqs[&f.seq];
            let len = history.len();
            self.cache.ensure_capacity(f.seq, len + f.tokens.len())?;
            let n = if f.all_logits { f.tokens.len() } else { 1 };
            self.runner.add(f.seq, len, f.tokens.iter().copied(), n);
            self.runner.add_lookback(history.iter().copied());
        }
        self.runner.run(&mut self.cache, false)?;
        for f in feeds {
            self.seqs
                .get_mut(&f.seq)
                .unwrap()
                .extend_from_slice(f.tokens);
        }
        Ok(self.runner.logits())
    }

    pub fn truncate(&mut self, seq: SeqId, to: usize) -> Result<(), CacheError> {
        self.cache.truncate(seq, to)?;
        self.seqs.get_mut(&seq).unwrap().truncate(to);
        Ok(())
    }

    pub fn free(&mut self, seq: SeqId) -> Result<(), CacheError> {
        self.seqs.remove(&seq);
        self.cache.free_seq(seq)
    }
}

/// A runner over `model` with room for `max_seqs` sequences and `slack` tokens of rollback.
/// A cache for `max_seqs` sequences of `model`, no rollback slack.
pub fn cache_for(model: &Model, max_seqs: usize) -> CacheManager {
    CacheManager::new(&model.config, cache_config(64 << 20, max_seqs, 0)).unwrap()
}

pub fn runner(model: Model, max_seqs: usize, slack: usize) -> TestRunner {
    let cache = CacheManager::new(&model.config, cache_config(256 << 20, max_seqs, slack)).unwrap();
    TestRunner {
        runner: ModelRunner::new(model),
        cache,
        seqs: HashMap::new(),
    }
}

/// Appends `tokens` to `seq` in one step; logits of every token or of the last.
pub fn feed(r: &mut TestRunner, seq: SeqId, tokens: &[u32], all_logits: bool) -> Logits {
    r.step(&[Feed {
        seq,
        tokens,
        all_logits,
    }])
    .unwrap()
    .clone()
}

/// Logits of every position of `tokens` fed to a fresh sequence in chunks of `chunk`.
pub fn chunked_logits(r: &mut TestRunner, tokens: &[u32], chunk: usize) -> Vec<Vec<f32>> {
    let seq = r.add_sequence().unwrap();
    let mut out = Vec::new();
    for part in tokens.chunks(chunk) {
        let l = feed(r, seq, part, true);
        out.extend((0..l.rows()).map(|i| l.row(i).to_vec()));
    }
    r.free(seq).unwrap();
    out
}

/// Every delta of one request: tokens, their top logprobs as bits, cached tokens.
pub type Outcome = (Vec<u32>, Vec<u32>, usize);

/// The [`Outcome`] of a finished request's deltas.
pub fn outcome(rx: Receiver<RequestOutput>) -> Outcome {
    let (mut tokens, mut bits, mut cached) = (Vec::new(), Vec::new(), 0);
    for out in rx.try_iter() {
        tokens.extend(&out.new_token_ids);
        for lp in out.logprobs.iter().flatten() {
            bits.push(lp.logprob.to_bits());
            bits.extend(lp.top.iter().map(|t| t.1.to_bits()));
        }
        cached = out.num_cached_tokens;
    }
    (tokens, bits, cached)
}

/// Greedy decoding of exactly `max_tokens` tokens (EOS ignored).
pub fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

/// Every token of a request's stream, and how it finished.
pub fn collect(rx: Receiver<RequestOutput>) -> (Vec<u32>, Option<FinishReason>) {
    let mut toks = Vec::new();
    let mut reason = None;
    for d in rx {
        toks.extend(d.new_token_ids);
        reason = d.finish_reason.or(reason);
    }
    (toks, reason)
}

/// tiny-c's official checkpoint without its MTP block (`mtp.safetensors` left out).
pub fn tiny_c_without_mtp() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(
            fixture("tiny-c").join("official").join(f),
            dir.path().join(f),
        )
        .unwrap();
    }
    dir
}

/// The prompts whose router and indexer margins let tokens be compared exactly.
pub fn tie_safe(g: &Golden) -> Vec<&Value> {
    g.prompts()
        .iter()
        .filter(|p| p["tie_safe"].as_bool().unwrap())
        .collect()
}

/// tiny-a's two longest prompts, twice each: submitted at once into pools for one
/// 732-token sequence ([`budget_for_one`]), they make the scheduler preempt.
pub const PREEMPTION_PICKS: [usize; 4] = [3, 2, 3, 2];

/// Submits prompts `picks` of `g` at once; each must get HF's 32 greedy tokens and finish
/// by length.
pub fn expect_golden_greedy_picks(h: &EngineHandle, g: &Golden, picks: &[usize], label: &str) {
    let rxs: Vec<_> = picks
        .iter()
        .map(|&i| {
            h.add_request(ids(&g.prompts()[i]["ids"]), greedy(32))
                .unwrap()
                .1
        })
        .collect();
    for (&i, rx) in picks.iter().zip(rxs) {
        let (toks, reason) = collect(rx);
        assert_eq!(toks, ids(&g.prompts()[i]["greedy"]), "{label} p{i}");
        assert_eq!(reason, Some(FinishReason::Length), "{label} p{i}");
    }
}

/// Submits every tie-safe prompt of `g` at once; each must get HF's 32 greedy tokens.
pub fn expect_golden_greedy(h: &EngineHandle, g: &Golden, label: &str) {
    let prompts = tie_safe(g);
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| h.add_request(ids(&p["ids"]), greedy(32)).unwrap().1)
        .collect();
    for (p, rx) in prompts.iter().zip(rxs) {
        let (toks, reason) = collect(rx);
        assert_eq!(
            toks,
            ids(&p["greedy"]),
            "{label} p{}: tokens differ from HF's greedy tokens",
            p["index"]
        );
        assert_eq!(reason, Some(FinishReason::Length));
    }
}

/// The residual streams after every layer of one whole forward over the golden's
/// intermediates prompt, against the reference's (the positions it kept), each layer within
/// `tol` times the larger of 1 and its largest |value|: where a mismatch first shows.
pub fn check_layer_streams(config: &str, tol: f32) {
    use deepinfer_model::batch::ForwardBatch;
    let g = Golden::load(config);
    let mut model = load(config, "official");
    let pi = g.meta["intermediates_prompt"].as_u64().unwrap() as usize;
    let prompt = ids(&g.prompts()[pi]["ids"]);
    let mut cache = cache_for(&model, 1);
    let seq = cache.add_seq().unwrap();
    cache.ensure_capacity(seq, prompt.len()).unwrap();
    let batch = ForwardBatch::from_prompts(std::slice::from_ref(&prompt), false);
    let mut trace = Vec::new();
    model
        .forward_traced(&batch, &mut cache.view(&[seq]).unwrap(), &mut trace)
        .unwrap();
    assert_eq!(trace.len(), model.config.num_hidden_layers);
    let keep = g.meta["intermediates_positions"].as_u64().unwrap() as usize;
    let row = model.config.hc_mult * model.config.hidden_size;
    let from = prompt.len().saturating_sub(keep) * row;
    for (l, got) in trace.iter().enumerate() {
        let want = g.f32s(&format!("p{pi}.layer{l}"));
        let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        let diff = max_abs_diff(&got[from..], &want);
        eprintln!("{config} layer {l}: streams differ by {diff:.2e} (scale {scale:.1})");
        assert!(
            diff <= tol * scale,
            "{config} layer {l}: streams differ by {diff}"
        );
    }
}

/// One sequence of a mixed-batch run: its tokens, the size of its first chunk and of every
/// later one, and the step it joins at.
pub struct BatchPlan {
    pub tokens: Vec<u32>,
    pub first: usize,
    pub later: usize,
    pub joins: usize,
}

/// Runs `plans` side by side in one runner of `config` (chunks of different sizes, sequences
/// joining at different steps): every position's logits are, bit for bit, what the sequence
/// gets alone.
pub fn check_mixed_batches(config: &str, plans: &[BatchPlan]) {
    let mut alone_runner = runner(load(config, "official"), 1, 0);
    let alone: Vec<Vec<Vec<f32>>> = plans
        .iter()
        .map(|p| chunked_logits(&mut alone_runner, &p.tokens, p.tokens.len()))
        .collect();
    let mut r = runner(load(config, "official"), plans.len(), 0);
    let seqs: Vec<_> = plans.iter().map(|_| r.add_sequence().unwrap()).collect();
    let mut fed = vec![0usize; plans.len()];
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); plans.len()];
    let mut step = 0;
    while fed.iter().zip(plans).any(|(f, p)| *f < p.tokens.len()) {
        let mut work = Vec::new();
        let mut who = Vec::new();
        for (i, p) in plans.iter().enumerate() {
            if step < p.joins || fed[i] == p.tokens.len() {
                continue;
            }
            let chunk = if fed[i] == 0 { p.first } else { p.later };
            let n = chunk.min(p.tokens.len() - fed[i]);
            work.push(Feed {
                seq: seqs[i],
                tokens: &p.tokens[fed[i]..fed[i] + n],
                all_logits: true,
            });
            who.push((i, n));
        }
        let logits = r.step(&work).unwrap();
        let mut row = 0;
        for (i, n) in who {
            got[i].extend((row..row + n).map(|j| logits.row(j).to_vec()));
            row += n;
            fed[i] += n;
        }
        step += 1;
    }
    for (i, (g_i, a_i)) in got.iter().zip(&alone).enumerate() {
        assert_eq!(g_i.len(), a_i.len());
        for (pos, (a, b)) in g_i.iter().zip(a_i).enumerate() {
            assert!(
                same_bits(a, b),
                "{config}: sequence {i} position {pos} differs by {} in a mixed batch",
                max_abs_diff(a, b)
            );
        }
    }
}

/// Prefill of `config`'s long sequence `pi` in chunks of each of `chunks` tokens (1 =
/// decode) gives, bit for bit, the whole forward's logits at every position; returns the
/// runner for checks on what it left behind.
pub fn check_chunked_prefill(config: &str, pi: usize, chunks: &[usize]) -> TestRunner {
    let g = Golden::load(config);
    let tokens = long_sequence(&g, pi);
    let mut r = runner(load(config, "official"), 1, 0);
    let full = chunked_logits(&mut r, &tokens, tokens.len());
    for &chunk in chunks {
        let got = chunked_logits(&mut r, &tokens, chunk);
        for (i, (a, b)) in got.iter().zip(&full).enumerate() {
            assert!(
                same_bits(a, b),
                "{config} chunk {chunk}: position {i} differs by {}",
                max_abs_diff(a, b)
            );
        }
    }
    r
}

/// A cache with the MTP block's window ring (one draft layer).
pub fn mtp_cache(model: &Model) -> CacheManager {
    let cfg = CacheConfig {
        draft_layers: 1,
        ..cache_config(64 << 20, 1, 8)
    };
    CacheManager::new(&model.config, cfg).unwrap()
}

/// One MTP pass over positions `start..start + tokens.len()` of `seq`.
pub fn mtp_pass(
    model: &mut Model,
    cache: &mut CacheManager,
    seq: SeqId,
    start: usize,
    tokens: &[u32],
    hidden: &[f32],
) -> (Logits, Vec<f32>) {
    let n = tokens.len();
    let batch = ForwardBatch {
        token_ids: tokens.to_vec(),
        positions: (start..start + n).collect(),
        spans: vec![SeqSpan { start: 0, len: n }],
        logits_rows: (0..n).collect(),
        ..ForwardBatch::default()
    };
    let mut logits = Logits {
        vocab: 0,
        data: Vec::new(),
    };
    let mut out = Vec::new();
    let mut view = cache.view(&[seq]).unwrap();
    model
        .forward_mtp(&batch, hidden, &mut view, &mut logits, &mut out)
        .unwrap();
    (logits, out)
}

/// A cache with the drafter's rings, filled by one target pass over `tokens`.
pub fn dspark_target_pass(model: &mut Model, tokens: &[u32]) -> (CacheManager, SeqId) {
    let mut config = cache_config(64 << 20, 1, 0);
    config.draft_layers = model.dspark.as_ref().unwrap().config.stages;
    let mut cache = CacheManager::new(&model.config, config).unwrap();
    let seq = cache.add_seq().unwrap();
    cache.ensure_capacity(seq, tokens.len()).unwrap();
    let batch = ForwardBatch::from_prompts(&[tokens.to_vec()], false);
    model
        .forward(&batch, &mut cache.view(&[seq]).unwrap())
        .unwrap();
    (cache, seq)
}

/// FNV-1a over the bits of everything hashed: a fingerprint of outputs to compare between
/// two commits of a refactoring (tests/fingerprint.rs).
pub struct Fingerprint(pub u64);

impl Fingerprint {
    pub fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    pub fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub fn f32s(&mut self, v: &[f32]) {
        for x in v {
            self.bytes(&x.to_bits().to_le_bytes());
        }
    }

    pub fn u32s(&mut self, v: &[u32]) {
        for x in v {
            self.bytes(&x.to_le_bytes());
        }
    }
}
