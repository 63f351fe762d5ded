//! The `dspark_*` fields of a checkpoint that ships the DSpark drafter (docs/MODEL.md §7.2): V4.1, and
//! V4-Flash-0731 / -DSpark style V4 checkpoints. The two read the target layer ids
//! differently (vLLM's `get_eagle3_aux_layers_from_config`): V4.1's id `l` names the streams
//! entering layer `l`, V4's id `i` the streams leaving layer `i`; both become
//! [`DsparkConfig::aux_layers`], in the entering sense.

use super::fields::Fields;
use super::{invalid, ConfigError};

/// The `dspark_*` settings of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DsparkConfig {
    /// `dspark_target_layer_ids` as the config writes them (V4.1-Flash: 37, 38, 39; V4-Flash:
    /// 40, 41, 42).
    pub target_layer_ids: Vec<usize>,
    /// The layers whose input streams feed the drafter, one per target id; the layer count
    /// stands for the final streams (before the head's collapse).
    pub aux_layers: Vec<usize>,
    pub block_size: usize,
    pub noise_token_id: u32,
    pub markov_rank: usize,
    pub stages: usize,
    /// The stages' routed experts (V4.1: 128, top 3; V4: the main model's).
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
}

/// The drafter `t` announces with `dspark_target_layer_ids`, for a model of `n` layers and
/// `vocab` ids; `v41` picks the id convention and where the stage count is read.
pub(super) fn parse(
    t: &Fields,
    n: usize,
    vocab: usize,
    v41: bool,
) -> Result<Option<DsparkConfig>, ConfigError> {
    let Some(target_layer_ids) = t.usize_list("dspark_target_layer_ids")? else {
        return Ok(None);
    };
    let shift = usize::from(!v41);
    let (lo, hi) = (1 - shift, n.saturating_sub(shift));
    for (i, &l) in target_layer_ids.iter().enumerate() {
        if !(lo..=hi).contains(&l) {
            return Err(invalid(
                format!("{}[{i}]", t.name("dspark_target_layer_ids")),
                l,
                format!("must be in {lo}..={hi}"),
            ));
        }
    }
    // vLLM's V4 drafter takes its stage count from `n_mtp_layers` (V4-Flash-0731's config
    // keeps `num_nextn_predict_layers: 1` beside three stages); V4.1's also from the latter.
    let stages_key = match v41 && !t.has("n_mtp_layers") {
        true => "num_nextn_predict_layers",
        false => "n_mtp_layers",
    };
    let experts = t.usize_or("n_routed_experts", 256)?;
    let dc = DsparkConfig {
        aux_layers: target_layer_ids.iter().map(|&l| l + shift).collect(),
        target_layer_ids,
        block_size: t.usize_or("dspark_block_size", 5)?,
        noise_token_id: token_id(t, "dspark_noise_token_id", 128_799, vocab)?,
        markov_rank: t.req_usize("dspark_markov_rank")?,
        stages: t.usize_or(stages_key, 3)?,
        n_routed_experts: t.usize_or("dspark_n_routed_experts", experts)?,
        num_experts_per_tok: t.usize_or(
            "dspark_num_experts_per_tok",
            t.usize_or("num_experts_per_tok", 6)?,
        )?,
    };
    for (key, v, lo, hi) in [
        ("dspark_block_size", dc.block_size, 2, 64),
        (stages_key, dc.stages, 1, 16),
        ("dspark_markov_rank", dc.markov_rank, 1, 4096),
        ("dspark_n_routed_experts", dc.n_routed_experts, 1, 4096),
        (
            "dspark_num_experts_per_tok",
            dc.num_experts_per_tok,
            1,
            dc.n_routed_experts,
        ),
    ] {
        if !(lo..=hi).contains(&v) {
            return Err(invalid(t.name(key), v, format!("must be in {lo}..={hi}")));
        }
    }
    Ok(Some(dc))
}

/// A token id field, which must name a token of the vocabulary.
fn token_id(t: &Fields, key: &str, default: usize, vocab: usize) -> Result<u32, ConfigError> {
    let v = t.usize_or(key, default)?;
    if v >= vocab {
        return Err(invalid(
            t.name(key),
            v,
            format!("not a token id (vocab_size = {vocab})"),
        ));
    }
    Ok(v as u32)
}
