//! Turns a batch of logits rows into next tokens, each row under its own request's
//! [`SamplingParams`], following vLLM V1's order of operations.
//!
//! Two properties matter more than speed here:
//! - **Batch invariance.** A row's token depends only on its logits, its request's history
//!   and its own RNG stream: every non-greedy row draws exactly one uniform per step from a
//!   per-request [`SeqRng`], and greedy rows draw none. So a seeded request gives the same
//!   text whether it runs alone or next to a hundred others, and preemption or batch
//!   reshuffles never change it.
//! - **Raw logprobs.** Reported logprobs describe the model, not the sampler's filters, so
//!   they come from the logits before any penalty, bias or truncation (vLLM's default
//!   "raw_logprobs" mode).
//!
//! The hot path avoids work a row doesn't ask for: rows without penalties, bias or a pending
//! `min_tokens` are read in place, greedy rows are a single argmax, top-k rows work on k
//! selected candidates, and no row ever sorts the whole vocabulary.

use crate::constraint::TokenMask;
use crate::sampling_params::SamplingParams;
use crate::scripted::ScriptedOutput;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha12Rng;
use std::cmp::Ordering;

/// A request's private random stream.
///
/// ChaCha is counter-based and portable, so a seed reproduces the same stream on every
/// machine and build, which is what an API `seed` promises.
#[derive(Clone, Debug)]
pub struct SeqRng(ChaCha12Rng);

impl SeqRng {
    /// Seeds from `seed`, or from OS entropy when the request gave none.
    pub fn new(seed: Option<u64>) -> Self {
        Self(match seed {
            Some(seed) => ChaCha12Rng::seed_from_u64(seed),
            None => rand::make_rng(),
        })
    }

    /// One uniform in [0, 1). The sampler takes exactly one of these per non-greedy step;
    /// anything else that needs request randomness (speculative-decoding acceptance) should
    /// draw through here too so the stream stays a function of the request alone.
    pub fn uniform(&mut self) -> f64 {
        self.0.random::<f64>()
    }
}

/// One logits row's context: the request's settings and history, and its RNG.
pub struct SampleRow<'a> {
    pub params: &'a SamplingParams,
    pub prompt_ids: &'a [u32],
    pub output_ids: &'a [u32],
    /// The model's end-of-sequence ids, masked while `min_tokens` is pending.
    pub eos_ids: &'a [u32],
    pub rng: &'a mut SeqRng,
    /// The tokens a structured-output grammar allows here; `None` when unconstrained.
    pub mask: Option<&'a TokenMask>,
}

/// The chosen token and its logprobs under the raw (unprocessed) distribution.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub token: u32,
    /// `log_softmax(raw logits)[token]`; NaN when the request asked for no logprobs (the
    /// full-vocabulary normaliser is then skipped, and NaN cannot pass for a real value).
    pub logprob: f32,
    /// The `logprobs` most likely tokens under the raw logits, most likely first (ties by
    /// id); empty when `logprobs` is `None` or `Some(0)`.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Head of a distribution examined first, and the range size below which selection gives
/// way to sorting: peaked distributions finish in one round, and sorting it is free.
const FIRST_CHUNK: usize = 64;

/// Holds scratch buffers so steady-state sampling does not allocate (except the returned
/// `Vec`s); one per engine thread.
#[derive(Debug, Default)]
pub struct Sampler {
    /// Copy of a row's logits when it needs processing (the raw row stays intact for logprobs).
    processed: Vec<f32>,
    /// `(key, id)` candidates: a logit while selecting top-k, a weight afterwards.
    cand: Vec<(f64, u32)>,
    /// Per-vocab output-token counts; all zero between rows.
    counts: Vec<u32>,
    /// Per-vocab "seen in prompt or output" flags; all false between rows.
    seen: Vec<bool>,
    /// Ids whose `counts`/`seen` entries were set, so resetting costs O(history), not O(vocab).
    touched: Vec<u32>,
    /// Test hook (see [`Sampler::scripted`]): the output rows must produce.
    script: Option<ScriptedOutput>,
}

impl Sampler {
    pub fn new() -> Self {
        Self::default()
    }

    /// A test hook, never used in production: a row's token at output index `i` is the
    /// `i`-th of its prompt's script text ([`ScriptedOutput::for_prompt`]), and the row's
    /// first EOS id once the text is spent, whatever the logits say (a prompt no turn of the
    /// script matches is sampled as usual). A model with random weights never writes tool calls or reasoning markers, so
    /// end-to-end tests of the output parsers script the model's text this way; everything
    /// after the choice of token (logprobs from the raw logits, stop checks, detokenization)
    /// runs as usual. No RNG is drawn for a scripted row.
    pub fn scripted(script: ScriptedOutput) -> Self {
        Self {
            script: Some(script),
            ..Self::default()
        }
    }

    /// The scripted token of `row`, when a script is set (a row without EOS ids falls back
    /// to normal sampling after the script).
    fn scripted_token(&self, row: &SampleRow<'_>) -> Option<u32> {
        let script = self.script.as_ref()?.for_prompt(row.prompt_ids)?;
        script
            .get(row.output_ids.len())
            .or_else(|| row.eos_ids.first())
            .copied()
    }

    /// Samples one token per row of `logits` (`rows.len()` rows of `vocab` each).
    pub fn sample(
        &mut self,
        logits: &[f32],
        vocab: usize,
        rows: &mut [SampleRow<'_>],
    ) -> Vec<Sample> {
        assert!(vocab > 0, "empty vocabulary");
        assert_eq!(
            logits.len(),
            rows.len() * vocab,
            "logits must hold one row of {vocab} per sample row"
        );
        rows.iter_mut()
            .zip(logits.chunks_exact(vocab))
            .map(|(row, raw)| self.sample_row(raw, row))
            .collect()
    }

    /// One row of [`Sampler::sample`]: what the engine calls per sequence.
    pub fn sample_row(&mut self, raw: &[f32], row: &mut SampleRow<'_>) -> Sample {
        let token = match self.scripted_token(row) {
            Some(token) => token,
            None => self.choose(raw, row, None),
        };
        Self::with_logprobs(raw, token, row.params)
    }

    /// Speculative decoding's test of a draft token at one row. Drafters here propose
    /// deterministically (the draft distribution is a point mass), so rejection sampling
    /// accepts the draft with probability `p(draft)` under the row's processed, filtered
    /// distribution `p`, and on rejection draws from `p` with the draft removed: the
    /// returned token is distributed exactly as `p`, whatever the draft. Greedy (and
    /// scripted) rows take their usual token and accept the draft when they agree, drawing
    /// no randomness. Returns the token and whether it is the draft.
    pub fn verify_row(
        &mut self,
        raw: &[f32],
        row: &mut SampleRow<'_>,
        draft: u32,
    ) -> (Sample, bool) {
        let token = match self.scripted_token(row) {
            Some(token) => token,
            None => self.choose(raw, row, Some(draft)),
        };
        (Self::with_logprobs(raw, token, row.params), token == draft)
    }

    /// The row's token from its processed logits: the argmax, a draw, or (given a draft)
    /// the rejection-sampling test of the draft.
    fn choose(&mut self, raw: &[f32], row: &mut SampleRow<'_>, draft: Option<u32>) -> u32 {
        let params = row.params;
        let mut processed = std::mem::take(&mut self.processed);
        let logits: &[f32] = if needs_processing(row) {
            processed.clear();
            processed.extend_from_slice(raw);
            self.process_logits(row, &mut processed);
            &processed
        } else {
            raw
        };
        let token = match (params.is_greedy(), draft) {
            (true, _) => argmax(logits),
            (false, None) => {
                let u = row.rng.uniform();
                self.draw(logits, params, u)
            }
            (false, Some(d)) => self.accept_or_resample(logits, params, d, row.rng),
        };
        self.processed = processed;
        // Processors after the grammar's mask may leave nothing (`min_tokens` masking the end
        // the grammar requires): the grammar wins, so the output stays well formed.
        match row.mask {
            Some(m) if !m.allows(token) => m.first_allowed().unwrap_or(token),
            _ => token,
        }
    }

    /// Keeps `draft` with probability `p(draft)`, else draws from `p` without it.
    fn accept_or_resample(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        draft: u32,
        rng: &mut SeqRng,
    ) -> u32 {
        let Some(kept) = self.candidates(logits, params) else {
            return argmax(logits);
        };
        let at = self.cand.iter().position(|c| c.1 == draft);
        let w = at.map_or(0.0, |i| self.cand[i].0);
        if rng.uniform() < w / kept {
            return draft;
        }
        if let Some(i) = at {
            self.cand[i].0 = 0.0;
        }
        let u = rng.uniform();
        self.pick(u * (kept - w))
    }

    /// `token` with its logprobs from the raw row, as the request asked.
    fn with_logprobs(raw: &[f32], token: u32, params: &SamplingParams) -> Sample {
        let (logprob, top_logprobs) = match params.logprobs {
            Some(n) => Self::raw_logprobs(raw, token, n),
            None => (f32::NAN, Vec::new()),
        };
        Sample {
            token,
            logprob,
            top_logprobs,
        }
    }

    /// Applies the logits processors in vLLM V1's order: the structured-output mask,
    /// `min_tokens` masking, `logit_bias`, then repetition, frequency and presence penalties.
    /// Logits no processor targets are left bit-for-bit unchanged; history ids outside
    /// `logits` are ignored.
    pub fn process_logits(&mut self, row: &SampleRow<'_>, logits: &mut [f32]) {
        let p = row.params;
        let vocab = logits.len();
        if let Some(mask) = row.mask {
            mask.apply(logits);
        }

        if row.output_ids.len() < p.min_tokens {
            let eos: &[u32] = if p.ignore_eos { &[] } else { row.eos_ids };
            for &id in eos.iter().chain(&p.stop_token_ids) {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }

        for &(id, bias) in p.logit_bias.iter() {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }

        if p.repetition_penalty != 1.0 {
            let r = p.repetition_penalty;
            if self.seen.len() < vocab {
                self.seen.resize(vocab, false);
            }
            for &id in row.prompt_ids.iter().chain(row.output_ids) {
                let i = id as usize;
                if i < vocab && !self.seen[i] {
                    self.seen[i] = true;
                    self.touched.push(id);
                    let l = &mut logits[i];
                    // Dividing a positive logit and multiplying a negative one both make
                    // the token less likely (HF's convention).
                    *l = if *l > 0.0 { *l / r } else { *l * r };
                }
            }
            for &id in &self.touched {
                self.seen[id as usize] = false;
            }
            self.touched.clear();
        }

        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            if self.counts.len() < vocab {
                self.counts.resize(vocab, 0);
            }
            for &id in row.output_ids {
                let i = id as usize;
                if i < vocab {
                    if self.counts[i] == 0 {
                        self.touched.push(id);
                    }
                    self.counts[i] += 1;
                }
            }
            for &id in &self.touched {
                let i = id as usize;
                let l = &mut logits[i];
                *l -= p.frequency_penalty * self.counts[i] as f32;
                *l -= p.presence_penalty;
                self.counts[i] = 0;
            }
            self.touched.clear();
        }
    }

    /// Inverts the CDF of the filtered, renormalised distribution at `u`, walking tokens in
    /// descending probability (ties by id) so the mapping from `u` to a token is fixed.
    fn draw(&mut self, logits: &[f32], p: &SamplingParams, u: f64) -> u32 {
        match self.candidates(logits, p) {
            Some(kept) => self.pick(u * kept),
            // Everything masked (e.g. min_tokens over an all-stop vocabulary; NaN and
            // infinite logits are never sampleable): fall back to the deterministic choice.
            None => argmax(logits),
        }
    }

    /// Leaves in `cand` the tokens the filters keep, each with its unnormalised weight
    /// (relative to the maximum), and returns their total; `None` if nothing is sampleable.
    ///
    /// Every filter keeps a prefix of the descending order (top-k, top-p by construction;
    /// min-p because its threshold is relative to the maximum), and the top-p cut is a
    /// "first position whose running mass passes x" question, which a weighted quickselect
    /// answers in expected O(n) without sorting the vocabulary.
    fn candidates(&mut self, logits: &[f32], p: &SamplingParams) -> Option<f64> {
        let cand = &mut self.cand;
        cand.clear();
        cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (l as f64, i as u32)),
        );
        if cand.is_empty() {
            return None;
        }
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, cmp_desc);
            cand.truncate(p.top_k);
        }

        // Unnormalised weights relative to the maximum: the top token's weight is exactly 1.
        let max = cand.iter().fold(f64::NEG_INFINITY, |m, c| m.max(c.0));
        let t = f64::from(p.temperature);
        let mut total = 0.0;
        for c in cand.iter_mut() {
            c.0 = ((c.0 - max) / t).exp();
            total += c.0;
        }

        // min-p before top-p is equivalent to the spec'd order: both keep prefixes, and the
        // top-p mass below is measured against `total`, the pre-min-p normaliser.
        let mut kept_mass = total;
        if p.min_p > 0.0 {
            let threshold = f64::from(p.min_p);
            cand.retain(|c| c.0 >= threshold);
            kept_mass = cand.iter().map(|c| c.0).sum();
        }

        if p.top_p < 1.0 {
            let cutoff = f64::from(p.top_p) * total;
            let len = first_passing(cand, cutoff, true).map_or(cand.len(), |i| i + 1);
            cand.truncate(len);
            kept_mass = cand.iter().map(|c| c.0).sum();
        }
        Some(kept_mass)
    }

    /// The first candidate, in descending order, at which the running weight passes
    /// `target`.
    fn pick(&mut self, target: f64) -> u32 {
        let cand = &mut self.cand;
        match first_passing(cand, target, false) {
            Some(i) => cand[i].1,
            None => {
                // Rounding left the target at the very top of the CDF: take the last
                // token that has any probability.
                cand.sort_unstable_by(cmp_desc);
                let last = cand.iter().rposition(|c| c.0 > 0.0).unwrap_or(0);
                cand[last].1
            }
        }
    }

    /// The chosen token's logprob and the `n` best alternatives, from the raw row in f64.
    fn raw_logprobs(raw: &[f32], token: u32, n: usize) -> (f32, Vec<(u32, f32)>) {
        let max = raw
            .iter()
            .filter(|l| !l.is_nan())
            .fold(f32::NEG_INFINITY, |m, &l| m.max(l));
        let max = f64::from(max);
        let sum: f64 = raw
            .iter()
            .filter(|l| !l.is_nan())
            .map(|&l| (f64::from(l) - max).exp())
            .sum();
        let lse = max + sum.ln();
        let logprob = |l: f64| (l - lse) as f32;
        let chosen = logprob(f64::from(raw[token as usize]));

        // n <= 20: a sorted insertion buffer beats collecting and selecting the vocabulary.
        let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
        if n > 0 {
            for (i, &l) in raw.iter().enumerate() {
                // Ids arrive ascending, so an equal logit never displaces an earlier id.
                if l.is_nan() || (top.len() == n && l <= top[n - 1].1) {
                    continue;
                }
                let at = top.partition_point(|&(_, t)| t >= l);
                top.insert(at, (i as u32, l));
                top.truncate(n);
            }
        }
        for (_, l) in &mut top {
            *l = logprob(f64::from(*l));
        }
        (chosen, top)
    }
}

/// Rows without processors are sampled straight from the engine's logits buffer.
fn needs_processing(row: &SampleRow<'_>) -> bool {
    let p = row.params;
    let masking = row.output_ids.len() < p.min_tokens
        && (!p.stop_token_ids.is_empty() || (!p.ignore_eos && !row.eos_ids.is_empty()));
    masking
        || row.mask.is_some()
        || !p.logit_bias.is_empty()
        || p.repetition_penalty != 1.0
        || p.frequency_penalty != 0.0
        || p.presence_penalty != 0.0
}

/// The lowest id among the maxima; NaN never wins (an all-NaN row gives 0).
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_val = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if l > best_val {
            best = i;
            best_val = l;
        }
    }
    best as u32
}

/// Descending key, ascending id: a total order, so selection and sorting are deterministic.
fn cmp_desc(a: &(f64, u32), b: &(f64, u32)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// The first position, in descending order, at which the running total of weights passes
/// `target` (`>=` when `inclusive`, else `>`); `None` if even the full total does not.
///
/// On return `cand[..=i]` holds exactly the top `i + 1` candidates, so truncating to
/// `i + 1` keeps that prefix. Ranges are narrowed by selection (the head chunk first, since
/// real distributions are peaked, then halves) and only the last small range is sorted.
fn first_passing(cand: &mut [(f64, u32)], target: f64, inclusive: bool) -> Option<usize> {
    let passes = |cum: f64| {
        if inclusive {
            cum >= target
        } else {
            cum > target
        }
    };
    let (mut lo, mut hi) = (0, cand.len());
    // Mass of `cand[..lo]`, all of which precede `cand[lo..]` in the order.
    let mut acc = 0.0;
    let mut split = FIRST_CHUNK;
    while hi - lo > FIRST_CHUNK {
        let mid = lo + split.min(hi - lo - 1);
        cand[lo..hi].select_nth_unstable_by(mid - lo, cmp_desc);
        let mass: f64 = cand[lo..mid].iter().map(|c| c.0).sum();
        if passes(acc + mass) {
            hi = mid;
        } else {
            acc += mass;
            lo = mid;
        }
        split = (hi - lo) / 2;
    }
    cand[lo..hi].sort_unstable_by(cmp_desc);
    for (i, c) in cand.iter().enumerate().take(hi).skip(lo) {
        acc += c.0;
        if passes(acc) {
            return Some(i);
        }
    }
    // The block total passed but the element-wise one fell short by rounding: the block's
    // last element is where it crossed.
    if hi < cand.len() {
        Some(hi - 1)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row<'a>(
        params: &'a SamplingParams,
        output_ids: &'a [u32],
        rng: &'a mut SeqRng,
    ) -> SampleRow<'a> {
        SampleRow {
            params,
            prompt_ids: &[],
            output_ids,
            eos_ids: &[],
            rng,
            mask: None,
        }
    }

    /// A grammar's mask: greedy and sampled rows only ever choose allowed tokens, a draft it
    /// forbids is never accepted, and when the other processors leave none of its tokens
    /// (`min_tokens` masking the end it requires) the grammar still wins.
    #[test]
    fn a_mask_keeps_rows_to_the_allowed_tokens() {
        let logits = noise_logits(3, 64);
        let mut mask = TokenMask::new(64);
        for id in [7, 40, 41] {
            mask.allow(id);
        }
        let mut sampler = Sampler::new();
        for (temperature, seed) in [(0.0, 1), (1.0, 2), (1.5, 3)] {
            let params = SamplingParams {
                temperature,
                seed: Some(seed),
                ..Default::default()
            };
            let mut rng = SeqRng::new(Some(seed));
            for _ in 0..50 {
                let mut r = row(&params, &[], &mut rng);
                r.mask = Some(&mask);
                let s = sampler.sample_row(&logits, &mut r);
                assert!(
                    mask.allows(s.token),
                    "{} at temperature {temperature}",
                    s.token
                );
                let mut r = row(&params, &[], &mut rng);
                r.mask = Some(&mask);
                let (v, hit) = sampler.verify_row(&logits, &mut r, 8);
                assert!(!hit && mask.allows(v.token));
            }
        }
        let mut end = TokenMask::new(64);
        end.allow(2);
        let params = SamplingParams {
            min_tokens: 5,
            ..Default::default()
        };
        let mut rng = SeqRng::new(None);
        let mut r = row(&params, &[], &mut rng);
        r.eos_ids = &[2];
        r.mask = Some(&end);
        assert_eq!(sampler.sample_row(&logits, &mut r).token, 2);
    }

    fn sample_one(sampler: &mut Sampler, logits: &[f32], r: SampleRow<'_>) -> Sample {
        let mut rows = [r];
        sampler.sample(logits, logits.len(), &mut rows).remove(0)
    }

    /// Deterministic pseudo-random logits in roughly [-4, 4).
    fn noise_logits(seed: u64, vocab: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        (0..vocab)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 4.0) as f32
            })
            .collect()
    }

    #[test]
    fn a_script_overrides_the_logits_then_ends_with_eos() {
        let mut sampler = Sampler::scripted(ScriptedOutput::always(vec![4, 2]));
        let params = SamplingParams {
            temperature: 0.7,
            logprobs: Some(1),
            ..Default::default()
        };
        let logits = [0.0, 0.0, 1.0, 9.0, -1.0];
        let mut got = Vec::new();
        let mut rng = SeqRng::new(Some(3));
        let before = rng.clone().uniform();
        for out in [&[][..], &[4], &[4, 2], &[4, 2, 1]] {
            let r = SampleRow {
                params: &params,
                prompt_ids: &[],
                output_ids: out,
                eos_ids: &[1, 0],
                rng: &mut rng,
                mask: None,
            };
            got.push(sample_one(&mut sampler, &logits, r));
        }
        let tokens: Vec<u32> = got.iter().map(|s| s.token).collect();
        assert_eq!(tokens, [4, 2, 1, 1]);
        // Logprobs still describe the model: the forced token's raw logprob, the real top.
        let (lp, top) = Sampler::raw_logprobs(&logits, 4, 1);
        assert_eq!(got[0].logprob, lp);
        assert_eq!(got[0].top_logprobs, top);
        assert_eq!(top[0].0, 3);
        // No uniform was drawn.
        assert_eq!(rng.uniform(), before);
    }

    #[test]
    fn greedy_is_argmax_with_lowest_id_on_ties() {
        let mut sampler = Sampler::new();
        let params = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        let mut rng = SeqRng::new(Some(1));
        let logits = [1.0, 3.0, -2.0, 3.0, 2.5];
        let s = sample_one(&mut sampler, &logits, row(&params, &[], &mut rng));
        assert_eq!(s.token, 1);

        let top_k1 = SamplingParams {
            top_k: 1,
            ..Default::default()
        };
        let logits = [0.5, -1.0, 7.0, 7.0, 7.0];
        let s = sample_one(&mut sampler, &logits, row(&top_k1, &[], &mut rng));
        assert_eq!(s.token, 2);
    }

    #[test]
    fn greedy_consumes_no_randomness() {
        let mut sampler = Sampler::new();
        let params = SamplingParams {
            temperature: 0.0,
            repetition_penalty: 1.3,
            ..Default::default()
        };
        let mut rng = SeqRng::new(Some(99));
        for step in 0..20 {
            let logits = noise_logits(step, 50);
            sample_one(&mut sampler, &logits, row(&params, &[3, 4], &mut rng));
        }
        assert_eq!(rng.uniform(), SeqRng::new(Some(99)).uniform());
    }

    #[test]
    fn sampled_rows_draw_exactly_one_uniform_per_step() {
        let mut sampler = Sampler::new();
        let params = SamplingParams {
            temperature: 0.8,
            top_k: 7,
            top_p: 0.9,
            min_p: 0.05,
            ..Default::default()
        };
        let mut rng = SeqRng::new(Some(5));
        let steps = 13;
        for step in 0..steps {
            let logits = noise_logits(step, 40);
            sample_one(&mut sampler, &logits, row(&params, &[], &mut rng));
        }
        let mut reference = SeqRng::new(Some(5));
        for _ in 0..steps {
            reference.uniform();
        }
        assert_eq!(rng.uniform(), reference.uniform());
    }

    #[test]
    fn same_seed_same_samples() {
        let params = SamplingParams {
            temperature: 1.2,
            ..Default::default()
        };
        let run = |seed: u64| -> Vec<u32> {
            let mut sampler = Sampler::new();
            let mut rng = SeqRng::new(Some(seed));
            (0..100)
                .map(|step| {
                    let logits = noise_logits(step, 64);
                    sample_one(&mut sampler, &logits, row(&params, &[], &mut rng)).token
                })
                .collect()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
        // Unseeded streams come from OS entropy and differ.
        let mut a = SeqRng::new(None);
        let mut b = SeqRng::new(None);
        assert_ne!((a.uniform(), a.uniform()), (b.uniform(), b.uniform()));
    }

    #[test]
    fn batch_invariance_over_200_steps() {
        const VOCAB: usize = 96;
        let target = SamplingParams {
            temperature: 0.9,
            top_p: 0.92,
            min_p: 0.02,
            repetition_penalty: 1.15,
            frequency_penalty: 0.3,
            presence_penalty: 0.2,
            logit_bias: vec![(5, 0.7)].into(),
            min_tokens: 10,
            stop_token_ids: vec![1],
            logprobs: Some(3),
            seed: Some(1234),
            max_tokens: 200,
            ..Default::default()
        };
        let others = [
            SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            SamplingParams {
                temperature: 1.4,
                top_k: 5,
                seed: Some(1),
                ..Default::default()
            },
            SamplingParams {
                temperature: 0.6,
                min_p: 0.1,
                seed: None,
                logprobs: Some(0),
                ..Default::default()
            },
        ];
        let prompt = [3u32, 9, 9, 40];
        let eos = [2u32];
        let logits_for = |who: u64, step: u64| noise_logits(who * 1_000_003 + step, VOCAB);

        // Alone.
        let mut sampler = Sampler::new();
        let mut rng = SeqRng::new(target.seed);
        let mut alone_out: Vec<u32> = Vec::new();
        let mut alone_lp = Vec::new();
        for step in 0..200 {
            let logits = logits_for(0, step);
            let mut rows = [SampleRow {
                params: &target,
                prompt_ids: &prompt,
                output_ids: &alone_out,
                eos_ids: &eos,
                rng: &mut rng,
                mask: None,
            }];
            let s = sampler.sample(&logits, VOCAB, &mut rows).remove(0);
            alone_out.push(s.token);
            alone_lp.push((s.logprob, s.top_logprobs));
        }

        // In a batch, second of four rows, with its own sampler history interleaved.
        let mut sampler = Sampler::new();
        let mut rng = SeqRng::new(target.seed);
        let mut other_rngs: Vec<SeqRng> = others.iter().map(|p| SeqRng::new(p.seed)).collect();
        let mut outs: Vec<Vec<u32>> = vec![Vec::new(); 4];
        let mut batch_lp = Vec::new();
        for step in 0..200 {
            let mut logits = logits_for(1, step);
            logits.extend(logits_for(0, step));
            logits.extend(logits_for(2, step));
            logits.extend(logits_for(3, step));
            let (o0, rest) = outs.split_first().unwrap();
            let (o1, rest) = rest.split_first().unwrap();
            let [r0, r1, r2] = &mut other_rngs[..] else {
                unreachable!()
            };
            let mut rows = [
                SampleRow {
                    params: &others[0],
                    prompt_ids: &prompt,
                    output_ids: o0,
                    eos_ids: &eos,
                    rng: r0,
                    mask: None,
                },
                SampleRow {
                    params: &target,
                    prompt_ids: &prompt,
                    output_ids: o1,
                    eos_ids: &eos,
                    rng: &mut rng,
                    mask: None,
                },
                SampleRow {
                    params: &others[1],
                    prompt_ids: &[],
                    output_ids: &rest[0],
                    eos_ids: &eos,
                    rng: r1,
                    mask: None,
                },
                SampleRow {
                    params: &others[2],
                    prompt_ids: &[7],
                    output_ids: &rest[1],
                    eos_ids: &eos,
                    rng: r2,
                    mask: None,
                },
            ];
            let samples = sampler.sample(&logits, VOCAB, &mut rows);
            for (out, s) in outs.iter_mut().zip(&samples) {
                out.push(s.token);
            }
            batch_lp.push((samples[1].logprob, samples[1].top_logprobs.clone()));
        }
        assert_eq!(alone_out, outs[1]);
        assert_eq!(alone_lp, batch_lp);
        // The target's stream really was random, and min_tokens held off its stop id.
        assert!(
            alone_out
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len()
                > 10
        );
        assert!(!alone_out[..10].contains(&1) && !alone_out[..10].contains(&2));
    }

    // ---- statistics -------------------------------------------------------------------

    /// Independent reference: the exact target distribution, by full sort, in f64.
    fn reference_dist(logits: &[f32], t: f64, top_k: usize, top_p: f64, min_p: f64) -> Vec<f64> {
        let n = logits.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap().then(a.cmp(&b)));
        let softmax = |keep: &[bool]| -> Vec<f64> {
            let m = (0..n)
                .filter(|&i| keep[i])
                .map(|i| f64::from(logits[i]) / t)
                .fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = (0..n)
                .map(|i| {
                    if keep[i] {
                        (f64::from(logits[i]) / t - m).exp()
                    } else {
                        0.0
                    }
                })
                .collect();
            let z: f64 = e.iter().sum();
            e.iter().map(|x| x / z).collect()
        };
        let mut keep = vec![false; n];
        let k = if top_k == 0 { n } else { top_k.min(n) };
        for &i in &order[..k] {
            keep[i] = true;
        }
        if top_p < 1.0 {
            let p = softmax(&keep);
            let mut cum = 0.0;
            let mut done = false;
            for &i in &order {
                if !keep[i] {
                    continue;
                }
                if done {
                    keep[i] = false;
                    continue;
                }
                cum += p[i];
                assert!((cum - top_p).abs() > 1e-6, "top_p on a boundary");
                done = cum >= top_p;
            }
        }
        if min_p > 0.0 {
            let p = softmax(&keep);
            let pmax = p.iter().cloned().fold(0.0, f64::max);
            for i in 0..n {
                assert!((p[i] - min_p * pmax).abs() > 1e-6, "min_p on a boundary");
                if p[i] < min_p * pmax {
                    keep[i] = false;
                }
            }
        }
        softmax(&keep)
    }

    fn check_distribution(logits: &[f32], params: &SamplingParams, expected: &[f64]) {
        const N: usize = 20_000;
        let mut sampler = Sampler::new();
        let mut rng = SeqRng::new(params.seed);
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..N {
            let s = sample_one(&mut sampler, logits, row(params, &[], &mut rng));
            counts[s.token as usize] += 1;
        }
        for (id, (&c, &p)) in counts.iter().zip(expected).enumerate() {
            if p == 0.0 {
                assert_eq!(c, 0, "token {id} is excluded but was drawn {c} times");
                continue;
            }
            let freq = c as f64 / N as f64;
            let se = (p * (1.0 - p) / N as f64).sqrt();
            assert!(
                (freq - p).abs() <= 5.0 * se,
                "token {id}: frequency {freq:.5}, expected {p:.5} (±{:.5}) under {params:?}",
                5.0 * se
            );
        }
    }

    /// Ten tokens, ids not in logit order, with a tie (ids 3 and 8) to test tie-breaking.
    const LOGITS: [f32; 10] = [1.0, 2.0, 0.5, 1.2, 1.5, 0.3, 0.0, -0.5, 1.2, -2.0];

    fn stats_case(temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) {
        let params = SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: Some(seed),
            ..Default::default()
        };
        params.validate(LOGITS.len()).unwrap();
        let expected = reference_dist(
            &LOGITS,
            f64::from(temperature),
            top_k,
            f64::from(top_p),
            f64::from(min_p),
        );
        check_distribution(&LOGITS, &params, &expected);
    }

    #[test]
    fn statistics_temperature() {
        stats_case(0.7, 0, 1.0, 0.0, 11);
        stats_case(1.5, 0, 1.0, 0.0, 12);
        stats_case(1.0, 0, 1.0, 0.0, 13);
    }

    #[test]
    fn statistics_top_k() {
        // k = 3 cuts between the tied ids 3 and 8: the lower id must survive.
        stats_case(1.0, 3, 1.0, 0.0, 21);
        let e = reference_dist(&LOGITS, 1.0, 3, 1.0, 0.0);
        assert!(e[3] > 0.0 && e[8] == 0.0);
        stats_case(0.7, 6, 1.0, 0.0, 22);
    }

    #[test]
    fn statistics_top_p() {
        stats_case(1.0, 0, 0.75, 0.0, 31);
        stats_case(1.5, 0, 0.5, 0.0, 32);
        // Tiny top_p still keeps the single most likely token.
        stats_case(1.0, 0, 0.01, 0.0, 33);
    }

    #[test]
    fn statistics_min_p() {
        stats_case(1.0, 0, 1.0, 0.3, 41);
        stats_case(1.5, 0, 1.0, 0.15, 42);
    }

    #[test]
    fn statistics_combinations() {
        stats_case(0.8, 6, 0.9, 0.1, 51);
        stats_case(1.3, 7, 0.85, 0.0, 52);
        stats_case(1.2, 0, 0.9, 0.25, 53);
        stats_case(0.9, 5, 1.0, 0.3, 54);
    }

    /// Rejection sampling against a point-mass draft: whatever the draft (likely,
    /// unlikely, filtered out), the emitted token has the target's distribution, and the
    /// draft is accepted with probability p(draft).
    fn verify_case(
        logits: &[f32],
        params: &SamplingParams,
        output: &[u32],
        draft: u32,
        expected: &[f64],
    ) {
        const N: usize = 20_000;
        let mut sampler = Sampler::new();
        let mut rng = SeqRng::new(params.seed);
        let mut counts = vec![0usize; logits.len()];
        let mut accepted = 0;
        for _ in 0..N {
            let mut r = row(params, output, &mut rng);
            let (s, hit) = sampler.verify_row(logits, &mut r, draft);
            assert_eq!(hit, s.token == draft);
            counts[s.token as usize] += 1;
            accepted += usize::from(hit);
        }
        for (id, (&c, &p)) in counts.iter().zip(expected).enumerate() {
            let freq = c as f64 / N as f64;
            let se = (p * (1.0 - p) / N as f64).sqrt();
            assert!(
                (freq - p).abs() <= 5.0 * se,
                "draft {draft}, token {id}: frequency {freq:.5}, expected {p:.5} under {params:?}"
            );
        }
        assert_eq!(accepted, counts[draft as usize]);
    }

    #[test]
    fn verification_keeps_the_target_distribution() {
        for (t, k, p, min_p, seed) in [
            (1.0, 0, 1.0, 0.0, 61),
            (0.7, 6, 0.9, 0.0, 62),
            (1.3, 0, 0.85, 0.1, 63),
        ] {
            let params = SamplingParams {
                temperature: t,
                top_k: k,
                top_p: p,
                min_p,
                seed: Some(seed),
                ..Default::default()
            };
            let expected = reference_dist(&LOGITS, f64::from(t), k, f64::from(p), f64::from(min_p));
            // The most likely token, a middling one, and one the filters drop (id 9).
            for draft in [1, 3, 9] {
                verify_case(&LOGITS, &params, &[], draft, &expected);
            }
        }
        // Processors apply first: penalties and bias shape the distribution drafts face.
        let params = SamplingParams {
            temperature: 1.0,
            repetition_penalty: 1.5,
            frequency_penalty: 0.3,
            logit_bias: vec![(9, 2.5)].into(),
            seed: Some(64),
            ..Default::default()
        };
        let output = [1, 1, 4];
        let processed = processed(&params, &[], &output, &[]);
        let expected = reference_dist(&processed, 1.0, 0, 1.0, 0.0);
        for draft in [1, 4, 9] {
            verify_case(&PLOGITS, &params, &output, draft, &expected);
        }
    }

    #[test]
    fn greedy_verification_accepts_only_the_argmax_and_draws_nothing() {
        let params = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        let mut sampler = Sampler::new();
        let mut rng = SeqRng::new(Some(1));
        let mut reference = SeqRng::new(Some(1));
        for draft in 0..LOGITS.len() as u32 {
            let (s, hit) = sampler.verify_row(&LOGITS, &mut row(&params, &[], &mut rng), draft);
            assert_eq!((s.token, hit), (1, draft == 1));
        }
        assert_eq!(rng.uniform(), reference.uniform(), "greedy drew randomness");
    }

    #[test]
    fn statistics_filters_really_bite() {
        // Guard against the cases above degenerating into plain temperature sampling.
        let nonzero = |d: Vec<f64>| d.iter().filter(|&&p| p > 0.0).count();
        assert_eq!(nonzero(reference_dist(&LOGITS, 1.0, 0, 0.75, 0.0)), 5);
        assert_eq!(nonzero(reference_dist(&LOGITS, 1.0, 0, 1.0, 0.3)), 5);
        let top_k_only = nonzero(reference_dist(&LOGITS, 0.8, 6, 1.0, 0.0));
        let combo = nonzero(reference_dist(&LOGITS, 0.8, 6, 0.9, 0.1));
        assert!(combo < top_k_only);
    }

    #[test]
    fn statistics_wide_vocab_walks_past_first_chunk() {
        // A flat-ish 300-token distribution makes both the top-p cut and the draw walk far
        // beyond FIRST_CHUNK, exercising the weighted quickselect.
        let logits: Vec<f32> = noise_logits(7, 300).iter().map(|l| l * 0.25).collect();
        for (top_k, top_p, seed) in [(0, 1.0, 61), (0, 0.9, 62), (250, 0.95, 63)] {
            let params = SamplingParams {
                temperature: 1.0,
                top_k,
                top_p,
                seed: Some(seed),
                ..Default::default()
            };
            let expected = reference_dist(&logits, 1.0, top_k, f64::from(top_p), 0.0);
            check_distribution(&logits, &params, &expected);
        }
    }

    // ---- processors ---------------------------------------------------------------------

    const PLOGITS: [f32; 10] = [1.0, -1.0, 2.0, -2.0, 0.5, 0.0, 3.0, -3.0, 0.7, -0.3];

    fn processed(params: &SamplingParams, prompt: &[u32], output: &[u32], eos: &[u32]) -> Vec<f32> {
        let mut rng = SeqRng::new(Some(0));
        let r = SampleRow {
            params,
            prompt_ids: prompt,
            output_ids: output,
            eos_ids: eos,
            rng: &mut rng,
            mask: None,
        };
        let mut logits = PLOGITS.to_vec();
        let mut sampler = Sampler::new();
        sampler.process_logits(&r, &mut logits);
        // The scratch buffers are clean again: a second pass gives the same answer.
        let mut again = PLOGITS.to_vec();
        sampler.process_logits(&r, &mut again);
        assert_eq!(bits(&logits), bits(&again));
        logits
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn assert_only_changed(got: &[f32], expected_changes: &[(usize, f32)]) {
        let mut expected = PLOGITS.to_vec();
        for &(i, v) in expected_changes {
            expected[i] = v;
        }
        assert_eq!(
            bits(got),
            bits(&expected),
            "got {got:?}, expected {expected:?}"
        );
    }

    #[test]
    fn repetition_penalty_over_prompt_and_output() {
        let params = SamplingParams {
            repetition_penalty: 1.5,
            ..Default::default()
        };
        // 0 (+) and 1 (-) in the prompt, 2 (+), 3 (-), 5 (zero) in the output; repeats
        // are penalised once.
        let got = processed(&params, &[0, 1, 1, 0], &[2, 3, 2, 5, 99], &[]);
        assert_only_changed(
            &got,
            &[
                (0, 1.0 / 1.5),
                (1, -1.5),
                (2, 2.0 / 1.5),
                (3, -2.0 * 1.5),
                (5, 0.0),
            ],
        );
        // Penalty < 1 rewards instead.
        let params = SamplingParams {
            repetition_penalty: 0.5,
            ..Default::default()
        };
        let got = processed(&params, &[4], &[7], &[]);
        assert_only_changed(&got, &[(4, 0.5 / 0.5), (7, -3.0 * 0.5)]);
    }

    #[test]
    fn presence_and_frequency_count_output_only() {
        let params = SamplingParams {
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..Default::default()
        };
        // Prompt tokens 0 and 1 are not penalised; output 2 ×3, 3 ×1, 8 ×2.
        let got = processed(&params, &[0, 1, 2], &[2, 3, 8, 2, 8, 2], &[]);
        let pen = |l: f32, c: f32| l - 0.25 * c - 0.5;
        assert_only_changed(
            &got,
            &[(2, pen(2.0, 3.0)), (3, pen(-2.0, 1.0)), (8, pen(0.7, 2.0))],
        );

        let presence_only = SamplingParams {
            presence_penalty: -1.0,
            ..Default::default()
        };
        let got = processed(&presence_only, &[4], &[6, 6, 6], &[]);
        assert_only_changed(&got, &[(6, 3.0 + 1.0)]);
    }

    #[test]
    fn logit_bias_on_given_ids_only() {
        let params = SamplingParams {
            logit_bias: vec![(5, 1.5), (7, -0.25), (9, 100.0)].into(),
            ..Default::default()
        };
        let got = processed(&params, &[0, 1], &[2], &[]);
        assert_only_changed(&got, &[(5, 1.5), (7, -3.25), (9, -0.3 + 100.0)]);
    }

    #[test]
    fn processors_compose_in_vllm_order() {
        let params = SamplingParams {
            logit_bias: vec![(2, 1.0)].into(),
            repetition_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..Default::default()
        };
        // Bias first, then repetition (prompt + output), then frequency/presence (output).
        let got = processed(&params, &[0], &[2, 2], &[]);
        assert_only_changed(
            &got,
            &[(0, 1.0 / 2.0), (2, (2.0f32 + 1.0) / 2.0 - 0.5 * 2.0 - 0.25)],
        );
    }

    #[test]
    fn min_tokens_masks_eos_and_stop_ids_until_reached() {
        let params = SamplingParams {
            min_tokens: 3,
            stop_token_ids: vec![4],
            ..Default::default()
        };
        let eos = [6u32];
        let ninf = f32::NEG_INFINITY;
        let got = processed(&params, &[], &[0, 1], &eos);
        assert_only_changed(&got, &[(4, ninf), (6, ninf)]);
        let got = processed(&params, &[], &[0, 1, 2], &eos);
        assert_only_changed(&got, &[]);

        let ignore = SamplingParams {
            ignore_eos: true,
            ..params.clone()
        };
        let got = processed(&ignore, &[], &[0], &eos);
        assert_only_changed(&got, &[(4, ninf)]);

        // Through the sampler: EOS is the argmax, but greedy must pick the runner-up.
        let greedy = SamplingParams {
            temperature: 0.0,
            ..params
        };
        let mut sampler = Sampler::new();
        let mut rng = SeqRng::new(Some(0));
        let r = SampleRow {
            params: &greedy,
            prompt_ids: &[],
            output_ids: &[0],
            eos_ids: &eos,
            rng: &mut rng,
            mask: None,
        };
        assert_eq!(sample_one(&mut sampler, &PLOGITS, r).token, 2);
        let r = SampleRow {
            params: &greedy,
            prompt_ids: &[],
            output_ids: &[0, 0, 0],
            eos_ids: &eos,
            rng: &mut rng,
            mask: None,
        };
        assert_eq!(sample_one(&mut sampler, &PLOGITS, r).token, 6);
        // Sampled rows never draw a masked id.
        let sampled = SamplingParams {
            temperature: 2.0,
            ..greedy
        };
        for _ in 0..500 {
            let r = SampleRow {
                params: &sampled,
                prompt_ids: &[],
                output_ids: &[],
                eos_ids: &eos,
                rng: &mut rng,
                mask: None,
            };
            let t = sample_one(&mut sampler, &PLOGITS, r).token;
            assert!(t != 4 && t != 6);
        }
    }

    // ---- logprobs -----------------------------------------------------------------------

    fn log_softmax(logits: &[f32]) -> Vec<f64> {
        let m = logits
            .iter()
            .fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l)));
        let z: f64 = logits.iter().map(|&l| (f64::from(l) - m).exp()).sum();
        logits.iter().map(|&l| f64::from(l) - m - z.ln()).collect()
    }

    #[test]
    fn logprobs_come_from_raw_logits() {
        let vocab = 50;
        let logits = noise_logits(3, vocab);
        let expected = log_softmax(&logits);
        let mut sampler = Sampler::new();
        // Heavy processing changes the choice but not the reported logprobs.
        let params = SamplingParams {
            temperature: 0.5,
            logit_bias: vec![(17, 20.0)].into(),
            repetition_penalty: 1.7,
            logprobs: Some(5),
            seed: Some(8),
            ..Default::default()
        };
        let mut rng = SeqRng::new(params.seed);
        for _ in 0..20 {
            let s = sample_one(&mut sampler, &logits, row(&params, &[1, 2], &mut rng));
            assert_eq!(s.token, 17);
            assert!((f64::from(s.logprob) - expected[17]).abs() < 1e-6);
            assert_eq!(s.top_logprobs.len(), 5);
            let mut order: Vec<usize> = (0..vocab).collect();
            order.sort_by(|&a, &b| expected[b].partial_cmp(&expected[a]).unwrap());
            for (k, &(id, lp)) in s.top_logprobs.iter().enumerate() {
                assert_eq!(id as usize, order[k]);
                assert!((f64::from(lp) - expected[id as usize]).abs() < 1e-6);
            }
            assert!(s.top_logprobs.windows(2).all(|w| w[0].1 >= w[1].1));
        }
    }

    #[test]
    fn logprobs_lengths_and_greedy() {
        let logits = [0.0f32, 1.0, 1.0, -1.0];
        let expected = log_softmax(&logits);
        let mut sampler = Sampler::new();
        let mut rng = SeqRng::new(Some(0));
        for (n, len) in [(0, 0), (1, 1), (3, 3), (20, 4)] {
            let params = SamplingParams {
                temperature: 0.0,
                logprobs: Some(n),
                ..Default::default()
            };
            let s = sample_one(&mut sampler, &logits, row(&params, &[], &mut rng));
            assert_eq!(s.token, 1);
            assert!((f64::from(s.logprob) - expected[1]).abs() < 1e-6);
            assert_eq!(s.top_logprobs.len(), len);
            if len >= 2 {
                // The tie is listed lowest id first.
                assert_eq!(s.top_logprobs[0].0, 1);
                assert_eq!(s.top_logprobs[1].0, 2);
            }
        }
        let none = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        let s = sample_one(&mut sampler, &logits, row(&none, &[], &mut rng));
        assert!(s.logprob.is_nan() && s.top_logprobs.is_empty());
    }

    #[test]
    fn fully_masked_row_falls_back_without_panicking() {
        let params = SamplingParams {
            min_tokens: 1,
            stop_token_ids: vec![0, 1, 2],
            ..Default::default()
        };
        let mut sampler = Sampler::new();
        let mut rng = SeqRng::new(Some(0));
        let s = sample_one(&mut sampler, &[1.0, 2.0, 3.0], row(&params, &[], &mut rng));
        assert!(s.token < 3);
    }
}
