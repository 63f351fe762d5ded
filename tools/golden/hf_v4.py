"""The HF transformers side of the V4 goldens: the tiny DeepSeek-V4 configs, their random
weights, and what transformers 5.23's `DeepseekV4ForCausalLM` computes on them in float32
(make_golden.py writes the checkpoints and goldens, make_mtp_golden.py adds the MTP block,
make_saved_fixtures.py records the same on checkpoints transformers saved).

Importing it registers a "softmax" router activation: HF 5.23 has none, and tiny-c scores its
router with torch's softmax over the expert axis under that name.
"""

import math

import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.activations import ACT2FN
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mdl

from golden.storage import raw

# The format of golden.json / golden.safetensors (and of the saved-* goldens).
GREEDY_STEPS = 32
TOPK_LOGITS = 20
TIE_GAP = 1e-4
INTER_POSITIONS = 12

CONFIGS = {
    # SWA + CSA + HCA(m=8) + CSA; hash layers 0-1; sqrtsoftplus; YaRN on the compress rope.
    "tiny-a": dict(
        seed=1,
        hf=dict(
            vocab_size=320, hidden_size=192, num_hidden_layers=4, num_attention_heads=4,
            head_dim=96, partial_rotary_factor=0.5, q_lora_rank=96, o_groups=2, o_lora_rank=48,
            sliding_window=8,
            layer_types=["sliding_attention", "compressed_sparse_attention",
                         "heavily_compressed_attention", "compressed_sparse_attention"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
            index_n_heads=16, index_head_dim=64, index_topk=5,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
            scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, swiglu_limit=0.6,
            hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
            rope_theta=10000.0, compress_rope_theta=160000.0,
            rope_parameters={"rope_type": "yarn", "factor": 16.0,
                             "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1},
            max_position_embeddings=4096, num_nextn_predict_layers=1,
        ),
        prompt_lengths=[5, 37, 130, 700],
        intermediates_prompt=1,
        official_shards=2,
    ),
    # V4-Pro-like order (HCA first), HCA m=16, a trailing SWA layer, hc_mult 3, sigmoid scoring,
    # one hash layer, sizes that are not powers of two and not multiples of 128, YaRN with a
    # small original context so the interpolated band is exercised.
    "tiny-b": dict(
        seed=2,
        hf=dict(
            vocab_size=300, hidden_size=128, num_hidden_layers=5, num_attention_heads=6,
            head_dim=64, partial_rotary_factor=0.5, q_lora_rank=80, o_groups=3, o_lora_rank=40,
            sliding_window=16,
            layer_types=["heavily_compressed_attention", "heavily_compressed_attention",
                         "compressed_sparse_attention", "heavily_compressed_attention",
                         "sliding_attention"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
            mlp_layer_types=["hash_moe", "moe", "moe", "moe", "moe"],
            index_n_heads=16, index_head_dim=64, index_topk=9,
            n_routed_experts=6, num_experts_per_tok=3, n_shared_experts=1, moe_intermediate_size=32,
            scoring_func="sigmoid", routed_scaling_factor=2.5, swiglu_limit=0.8,
            hc_mult=3, hc_sinkhorn_iters=7, hc_eps=1e-6, rms_norm_eps=1e-6,
            rope_theta=10000.0, compress_rope_theta=160000.0,
            rope_parameters={"rope_type": "yarn", "factor": 4.0,
                             "original_max_position_embeddings": 128, "beta_fast": 32, "beta_slow": 1},
            max_position_embeddings=4096, num_nextn_predict_layers=0,
        ),
        prompt_lengths=[3, 64, 333, 600],
        intermediates_prompt=1,
        official_shards=1,
    ),
    # Softmax router scoring (HF 5.23 has no "softmax" activation; the script registers
    # torch's softmax over the expert axis under that name), no hash layers, hc_mult 2, one
    # output group, a plain (non-YaRN) compress rope, and a one-token prompt.
    "tiny-c": dict(
        seed=3,
        hf=dict(
            vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
            head_dim=64, partial_rotary_factor=0.25, q_lora_rank=32, o_groups=1, o_lora_rank=32,
            sliding_window=4,
            layer_types=["compressed_sparse_attention", "sliding_attention"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
            mlp_layer_types=["moe", "moe"],
            index_n_heads=16, index_head_dim=32, index_topk=2,
            n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
            scoring_func="softmax", routed_scaling_factor=1.0, swiglu_limit=0.7,
            hc_mult=2, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
            rope_theta=10000.0, compress_rope_theta=160000.0,
            max_position_embeddings=4096, num_nextn_predict_layers=0,
        ),
        prompt_lengths=[1, 9, 50, 200],
        intermediates_prompt=2,
        official_shards=1,
    ),
}

ACT2FN["softmax"] = (torch.nn.Softmax, {"dim": -1})


# ---------------------------------------------------------------- weights

def build_model(cfg):
    """A float32 eager `DeepseekV4ForCausalLM` of `cfg["hf"]` with weights drawn from
    `cfg["seed"]` (each kind of tensor its own distribution; not yet rounded onto storage)."""
    torch.manual_seed(cfg["seed"])
    config = DeepseekV4Config(**cfg["hf"])
    config._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM(config).eval().to(torch.float32)
    c = config
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.normal_(0.0, 1.0)
            elif name.endswith("position_bias"):
                p.normal_(0.0, 0.5)
            elif name.endswith(("attn_hc.base", "ffn_hc.base", "hc_head.hc_base")):
                p.normal_(0.0, 0.3)
            elif name.endswith(("attn_hc.scale", "ffn_hc.scale", "hc_head.hc_scale")):
                p.uniform_(0.5, 1.5)
            elif name.endswith(("attn_hc.fn", "ffn_hc.fn", "hc_head.hc_fn")):
                p.normal_(0.0, 0.05)
            elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.normal_(1.0, 0.1)
            elif "experts.gate_up_proj" in name or "experts.down_proj" in name:
                p.normal_(0.0, 0.06)
            elif "shared_experts" in name:
                p.normal_(0.0, 0.06)
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.15)
            elif "indexer.q_b_proj" in name:
                p.normal_(0.0, 0.1)
            elif name.endswith("scorer.weights_proj.weight"):
                p.normal_(0.0, 0.3)
            elif name == "lm_head.weight":
                p.normal_(0.0, 0.1)
            elif name.endswith("embed_tokens.weight"):
                p.normal_(0.0, 1.0)
            elif p.dim() == 2:
                p.normal_(0.0, 0.05)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.1)
            elif name.endswith("tid2eid"):
                rows = [torch.randperm(c.n_routed_experts)[: c.num_experts_per_tok] for _ in range(c.vocab_size)]
                b.copy_(torch.stack(rows))
    return model


# ---------------------------------------------------------------- reference runs

class GapRecorder:
    """Smallest margin of every top-k selection (router and indexer) seen while hooked."""

    def __init__(self, model):
        self.router = math.inf
        self.indexer = math.inf
        self.handles = []
        for layer in model.model.layers:
            gate = layer.mlp.gate
            if isinstance(gate, mdl.DeepseekV4TopKRouter):
                self.handles.append(gate.register_forward_hook(self._router_hook))
            comp = layer.self_attn.compressor
            if isinstance(comp, mdl.DeepseekV4CSACompressor):
                ratio = comp.compress_rate
                topk = comp.indexer.index_topk
                self.handles.append(comp.indexer.scorer.register_forward_hook(
                    lambda m, i, o, r=ratio, k=topk: self._indexer_hook(o, r, k)))

    def _router_hook(self, module, inputs, output):
        logits = output[0]
        s = module.score_fn(logits) + module.e_score_correction_bias
        top = s.topk(module.top_k + 1, dim=-1).values
        self.router = min(self.router, (top[:, module.top_k - 1] - top[:, module.top_k]).min().item())

    def _indexer_hook(self, scores, ratio, topk):
        s = scores[0]  # [S, T]
        seq, entries = s.shape
        for t in range(seq):
            valid = (t + 1) // ratio
            if valid > topk:
                top = s[t, :valid].topk(topk + 1).values
                self.indexer = min(self.indexer, (top[topk - 1] - top[topk]).item())

    def close(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def run_prompt(model, ids, want_layers):
    gaps = GapRecorder(model)
    layer_out = []
    hooks = []
    if want_layers:
        hooks = [l.register_forward_hook(lambda m, i, o: layer_out.append((o if isinstance(o, torch.Tensor) else o[0]).clone()))
                 for l in model.model.layers]
    x = torch.tensor([ids])
    logits = model(input_ids=x, use_cache=False).logits[0]
    for h in hooks:
        h.remove()
    res = {
        "last_logits": logits[-1].clone(),
        "argmax": logits.argmax(dim=-1),
        "layers": layer_out,
    }
    # greedy by full recompute (no cache: the reference's cached decode is not what we test here)
    seq = list(ids)
    greedy, top_ids, top_vals, greedy_gap = [], [], [], math.inf
    last = logits[-1]
    for step in range(GREEDY_STEPS):
        v, i = last.topk(TOPK_LOGITS)
        greedy_gap = min(greedy_gap, (v[0] - v[1]).item())
        tok = int(i[0])
        greedy.append(tok)
        top_ids.append(i.clone())
        top_vals.append(v.clone())
        seq.append(tok)
        if step + 1 < GREEDY_STEPS:
            last = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
    gaps.close()
    res.update(greedy=torch.tensor(greedy), top_ids=torch.stack(top_ids), top_vals=torch.stack(top_vals),
               router_gap=gaps.router, indexer_gap=gaps.indexer, greedy_gap=greedy_gap)
    return res


def record_prompt(meta, golden, pi, ids, r, tie_safe, **extra):
    """Records prompt `pi` (`ids`, `run_prompt`'s result `r`) into the golden's `meta` and
    tensors; `extra` fields join its meta entry."""
    meta["prompts"].append({
        "index": pi, "len": len(ids), "ids": ids, "greedy": r["greedy"].tolist(),
        "router_gap": None if math.isinf(r["router_gap"]) else r["router_gap"],
        "indexer_gap": None if math.isinf(r["indexer_gap"]) else r["indexer_gap"],
        "greedy_gap": r["greedy_gap"], "tie_safe": tie_safe, **extra,
    })
    golden[f"p{pi}.last_logits"] = raw(r["last_logits"], "F32")
    golden[f"p{pi}.argmax"] = raw(r["argmax"], "I64")
    golden[f"p{pi}.greedy"] = raw(r["greedy"], "I64")
    golden[f"p{pi}.top_ids"] = raw(r["top_ids"], "I64")
    golden[f"p{pi}.top_logits"] = raw(r["top_vals"], "F32")
    for li, h in enumerate(r["layers"]):
        # [last INTER_POSITIONS tokens, hc, D] after layer li (kept short: fixture size)
        golden[f"p{pi}.layer{li}"] = raw(h[0][-INTER_POSITIONS:], "F32")
