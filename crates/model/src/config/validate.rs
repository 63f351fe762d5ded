//! Checks shared by both flavours, run on the finished [`ModelConfig`] so each rule is
//! written once; the rejected field is still named as the file spells it, via `Keys`.

use std::fmt::Display;

use super::{invalid, ConfigError, ModelConfig};

impl ModelConfig {
    pub(super) fn validate(&self, k: &Keys) -> Result<(), ConfigError> {
        self.check_positive(k)?;
        self.check_upper_bounds(k)?;
        self.check_token_ids(k)?;
        self.check_head_shapes(k)?;
        self.check_layer_lists(k)?;
        self.check_counts(k)?;
        self.check_scalars(k)?;
        self.check_rope(k)?;
        Ok(())
    }

    /// Every count and size that must be > 0.
    fn check_positive(&self, k: &Keys) -> Result<(), ConfigError> {
        let n = self.num_hidden_layers;
        for (field, v) in [
            (k.vocab, self.vocab_size),
            (k.hidden, self.hidden_size),
            (k.layers, n),
            (k.heads, self.num_attention_heads),
            (k.q_lora, self.q_lora_rank),
            (k.o_lora, self.o_lora_rank),
            (k.inter, self.moe_intermediate_size),
            (k.experts, self.n_routed_experts),
            (k.topk, self.num_experts_per_tok),
            (k.index_heads, self.index_n_heads),
            (k.max_pos, self.max_position_embeddings),
        ] {
            ensure(v > 0, field, v, "must be > 0")?;
        }
        Ok(())
    }

    /// BOS and EOS ids inside the vocabulary.
    fn check_token_ids(&self, k: &Keys) -> Result<(), ConfigError> {
        for (field, id) in self
            .bos_token_id
            .iter()
            .map(|&id| ("bos_token_id", id))
            .chain(self.eos_token_ids.iter().map(|&id| ("eos_token_id", id)))
        {
            ensure(
                (id as usize) < self.vocab_size,
                field,
                id,
                format!("outside the vocabulary ({} = {})", k.vocab, self.vocab_size),
            )?;
        }
        Ok(())
    }

    /// Head widths that RoPE and the output groups divide.
    fn check_head_shapes(&self, k: &Keys) -> Result<(), ConfigError> {
        let rd = self.qk_rope_head_dim;
        ensure(
            rd > 0 && rd.is_multiple_of(2),
            k.rope_dim,
            rd,
            "RoPE rotates pairs: must be even and > 0",
        )?;
        ensure(
            self.head_dim.is_multiple_of(2),
            k.head_dim,
            self.head_dim,
            "must be even",
        )?;
        ensure(
            self.head_dim >= rd,
            k.head_dim,
            self.head_dim,
            format!("must be >= {} = {rd}", k.rope_dim),
        )?;
        ensure(
            self.index_head_dim >= rd,
            k.index_dim,
            self.index_head_dim,
            format!(
                "indexer heads carry RoPE too: must be >= {} = {rd}",
                k.rope_dim
            ),
        )?;
        ensure(self.o_groups > 0, k.o_groups, self.o_groups, "must be > 0")?;
        ensure(
            self.num_attention_heads.is_multiple_of(self.o_groups),
            k.o_groups,
            self.o_groups,
            format!("must divide {} = {}", k.heads, self.num_attention_heads),
        )?;
        Ok(())
    }

    /// One layer kind and one MoE kind per layer.
    fn check_layer_lists(&self, k: &Keys) -> Result<(), ConfigError> {
        let n = self.num_hidden_layers;
        for (field, len) in [
            (k.layer_types, self.layer_types.len()),
            (k.mlp_types, self.mlp_layer_types.len()),
        ] {
            ensure(
                len == n,
                field,
                format!("{len} entries"),
                format!("needs one entry per layer ({} = {n})", k.layers),
            )?;
        }
        Ok(())
    }

    /// Ratios, routing and mixing counts within what the forward pass computes.
    fn check_counts(&self, k: &Keys) -> Result<(), ConfigError> {
        ensure(
            self.compress_rate_csa >= 2,
            k.csa_rate,
            self.compress_rate_csa,
            "must be >= 2",
        )?;
        ensure(
            self.compress_rate_hca >= 2,
            k.hca_rate,
            self.compress_rate_hca,
            "must be >= 2",
        )?;
        ensure(
            self.num_experts_per_tok <= self.n_routed_experts,
            k.topk,
            self.num_experts_per_tok,
            format!("cannot exceed {} = {}", k.experts, self.n_routed_experts),
        )?;
        ensure(
            self.index_topk >= 1,
            k.index_topk,
            self.index_topk,
            "must be >= 1",
        )?;
        ensure(self.hc_mult >= 1, k.hc_mult, self.hc_mult, "must be >= 1")?;
        ensure(
            self.hc_sinkhorn_iters >= 1,
            k.hc_iters,
            self.hc_sinkhorn_iters,
            "must be >= 1",
        )?;
        ensure(
            self.sliding_window >= 1,
            k.window,
            self.sliding_window,
            "must be >= 1",
        )?;
        Ok(())
    }

    /// Epsilons and scales: finite, and positive where they divide or scale.
    fn check_scalars(&self, k: &Keys) -> Result<(), ConfigError> {
        let eps = self.rms_norm_eps;
        ensure(
            eps > 0.0 && eps.is_finite(),
            k.norm_eps,
            eps,
            "must be a finite number > 0 (as f32)",
        )?;
        let hc_eps = self.hc_eps;
        ensure(
            hc_eps >= 0.0 && hc_eps.is_finite(),
            k.hc_eps,
            hc_eps,
            "must be finite and >= 0",
        )?;
        let rs = self.routed_scaling_factor;
        ensure(
            rs > 0.0 && rs.is_finite(),
            k.route_scale,
            rs,
            "must be finite and > 0",
        )?;
        ensure(
            self.swiglu_limit > 0.0,
            k.swiglu,
            self.swiglu_limit,
            "must be > 0",
        )?;
        Ok(())
    }

    /// RoPE thetas and YaRN parameters: finite and positive.
    fn check_rope(&self, k: &Keys) -> Result<(), ConfigError> {
        for (rope, theta_key, yarn_keys) in [
            (&self.rope_main, k.rope_theta, k.main_yarn),
            (&self.rope_compress, k.compress_theta, k.compress_yarn),
        ] {
            // ln(theta) divides the YaRN correction range and the frequencies degenerate at 1.
            ensure(
                rope.theta > 1.0 && rope.theta.is_finite(),
                theta_key,
                rope.theta,
                "must be finite and > 1",
            )?;
            if let Some(y) = &rope.yarn {
                let [factor, orig, fast, slow] = yarn_keys;
                ensure(
                    y.factor > 0.0 && y.factor.is_finite(),
                    factor,
                    y.factor,
                    "must be finite and > 0",
                )?;
                let o = y.original_max_position_embeddings;
                ensure(o > 0.0 && o.is_finite(), orig, o, "must be finite and > 0")?;
                ensure(
                    y.beta_fast > 0.0 && y.beta_fast.is_finite(),
                    fast,
                    y.beta_fast,
                    "must be finite and > 0",
                )?;
                ensure(
                    y.beta_slow > 0.0 && y.beta_slow.is_finite(),
                    slow,
                    y.beta_slow,
                    "must be finite and > 0",
                )?;
            }
        }
        Ok(())
    }
}

/// Most layers a config may declare, checked before anything is sized by the count.
pub(super) const MAX_LAYERS: usize = 1024;

impl ModelConfig {
    /// Upper bounds on every size that sizes memory or loops: far above any DeepSeek-V4
    /// (V4-Pro: hidden 7168, 61 layers, 128 heads of 512, 384 experts of 3072, index top-k
    /// 1024, window 128, HCA rate 128, 20 Sinkhorn iterations), so a real checkpoint never
    /// meets them, while a corrupted value is refused by name before it can make an
    /// allocation fail or a loop run for ever. Sizes with tensors behind them are also
    /// checked against those tensors when the weights load.
    fn check_upper_bounds(&self, k: &Keys) -> Result<(), ConfigError> {
        for (field, v, max) in [
            (k.vocab, self.vocab_size, 1 << 22),
            (k.hidden, self.hidden_size, 1 << 16),
            (k.layers, self.num_hidden_layers, MAX_LAYERS),
            (k.heads, self.num_attention_heads, 1 << 12),
            (k.head_dim, self.head_dim, 1 << 13),
            (k.q_lora, self.q_lora_rank, 1 << 16),
            (k.o_lora, self.o_lora_rank, 1 << 16),
            (k.window, self.sliding_window, 1 << 16),
            (k.csa_rate, self.compress_rate_csa, 1 << 12),
            (k.hca_rate, self.compress_rate_hca, 1 << 12),
            (k.index_heads, self.index_n_heads, 1 << 12),
            (k.index_dim, self.index_head_dim, 1 << 13),
            (k.index_topk, self.index_topk, 1 << 16),
            (k.experts, self.n_routed_experts, 1 << 14),
            (k.shared, self.n_shared_experts, 64),
            (k.inter, self.moe_intermediate_size, 1 << 18),
            (k.hc_mult, self.hc_mult, 16),
            (k.hc_iters, self.hc_sinkhorn_iters, 1000),
            (k.nextn, self.num_nextn_predict_layers, 16),
        ] {
            ensure(v <= max, field, v, format!("must be at most {max}"))?;
        }
        Ok(())
    }
}

fn ensure(
    ok: bool,
    field: &str,
    value: impl Display,
    reason: impl Into<String>,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(invalid(field, value, reason))
    }
}

/// Source-file names of the fields `validate` checks, per flavour, so errors quote what the
/// user actually wrote.
pub(super) struct Keys {
    vocab: &'static str,
    hidden: &'static str,
    layers: &'static str,
    heads: &'static str,
    head_dim: &'static str,
    rope_dim: &'static str,
    q_lora: &'static str,
    o_groups: &'static str,
    o_lora: &'static str,
    window: &'static str,
    layer_types: &'static str,
    mlp_types: &'static str,
    csa_rate: &'static str,
    hca_rate: &'static str,
    index_heads: &'static str,
    index_dim: &'static str,
    index_topk: &'static str,
    experts: &'static str,
    shared: &'static str,
    topk: &'static str,
    inter: &'static str,
    route_scale: &'static str,
    swiglu: &'static str,
    hc_mult: &'static str,
    hc_iters: &'static str,
    hc_eps: &'static str,
    nextn: &'static str,
    norm_eps: &'static str,
    max_pos: &'static str,
    rope_theta: &'static str,
    compress_theta: &'static str,
    /// factor, original length, beta_fast, beta_slow.
    main_yarn: [&'static str; 4],
    compress_yarn: [&'static str; 4],
}

pub(super) const HF_KEYS: Keys = Keys {
    vocab: "vocab_size",
    hidden: "hidden_size",
    layers: "num_hidden_layers",
    heads: "num_attention_heads",
    head_dim: "head_dim",
    rope_dim: "qk_rope_head_dim",
    q_lora: "q_lora_rank",
    o_groups: "o_groups",
    o_lora: "o_lora_rank",
    window: "sliding_window",
    layer_types: "layer_types",
    mlp_types: "mlp_layer_types",
    csa_rate: "compress_rates.compressed_sparse_attention",
    hca_rate: "compress_rates.heavily_compressed_attention",
    index_heads: "index_n_heads",
    index_dim: "index_head_dim",
    index_topk: "index_topk",
    experts: "n_routed_experts",
    shared: "n_shared_experts",
    topk: "num_experts_per_tok",
    inter: "moe_intermediate_size",
    route_scale: "routed_scaling_factor",
    swiglu: "swiglu_limit",
    hc_mult: "hc_mult",
    hc_iters: "hc_sinkhorn_iters",
    hc_eps: "hc_eps",
    nextn: "num_nextn_predict_layers",
    norm_eps: "rms_norm_eps",
    max_pos: "max_position_embeddings",
    rope_theta: "rope_theta",
    compress_theta: "compress_rope_theta",
    main_yarn: [
        "rope_parameters.main.factor",
        "rope_parameters.main.original_max_position_embeddings",
        "rope_parameters.main.beta_fast",
        "rope_parameters.main.beta_slow",
    ],
    compress_yarn: [
        "rope_parameters.compress.factor",
        "rope_parameters.compress.original_max_position_embeddings",
        "rope_parameters.compress.beta_fast",
        "rope_parameters.compress.beta_slow",
    ],
};

pub(super) const OFFICIAL_KEYS: Keys = Keys {
    vocab: "vocab_size",
    hidden: "dim",
    layers: "n_layers",
    heads: "n_heads",
    head_dim: "head_dim",
    rope_dim: "rope_head_dim",
    q_lora: "q_lora_rank",
    o_groups: "o_groups",
    o_lora: "o_lora_rank",
    window: "window_size",
    layer_types: "compress_ratios",
    mlp_types: "n_hash_layers",
    csa_rate: "compress_ratios",
    hca_rate: "compress_ratios",
    index_heads: "index_n_heads",
    index_dim: "index_head_dim",
    index_topk: "index_topk",
    experts: "n_routed_experts",
    shared: "n_shared_experts",
    topk: "n_activated_experts",
    inter: "moe_inter_dim",
    route_scale: "route_scale",
    swiglu: "swiglu_limit",
    hc_mult: "hc_mult",
    hc_iters: "hc_sinkhorn_iters",
    hc_eps: "hc_eps",
    nextn: "n_mtp_layers",
    norm_eps: "norm_eps",
    max_pos: "max_seq_len",
    rope_theta: "rope_theta",
    compress_theta: "compress_rope_theta",
    main_yarn: ["rope_factor", "original_seq_len", "beta_fast", "beta_slow"],
    compress_yarn: ["rope_factor", "original_seq_len", "beta_fast", "beta_slow"],
};
