"""DeepSeek's official checkpoint layout seen from HF transformers' DeepSeek-V4 state dict:
which official name and storage kind each HF tensor has, and the rounding of a tensor of a
kind onto its official tensors.

The names follow DeepSeek-V4's `inference/model.py` parameter names (and its
`inference/convert.py` mapping) against transformers 5.23's `modeling_deepseek_v4` names;
the kinds are the dtypes of the released FP8 checkpoints: FP8 e4m3 + E8M0 128x128 block
scales for the dense projections, FP4 e2m1 experts (I8, low nibble first) + E8M0 1x32 scales
(HF stacks the experts as gate_up_proj / down_proj), BF16 norms/embed/head/compressors, F32
mHC/sinks/ape/bias, I64 tid2eid.
"""

import torch

from golden.storage import bf16_round, fp4_quant, fp8_block_quant, raw


def official_name_and_format(hf_name):
    """Map an HF state-dict name to (official name, storage kind) for the official layout."""
    n = hf_name
    top = {
        "model.embed_tokens.weight": ("embed.weight", "bf16"),
        "lm_head.weight": ("head.weight", "bf16"),
        "model.norm.weight": ("norm.weight", "bf16"),
        "model.hc_head.hc_fn": ("hc_head_fn", "f32"),
        "model.hc_head.hc_base": ("hc_head_base", "f32"),
        "model.hc_head.hc_scale": ("hc_head_scale", "f32"),
    }
    if n in top:
        return top[n]
    assert n.startswith("model.layers."), n
    rest = n[len("model.layers."):]
    layer, rest = rest.split(".", 1)
    p = f"layers.{layer}."
    table = {
        "input_layernorm.weight": ("attn_norm.weight", "bf16"),
        "post_attention_layernorm.weight": ("ffn_norm.weight", "bf16"),
        "attn_hc.fn": ("hc_attn_fn", "f32"), "attn_hc.base": ("hc_attn_base", "f32"),
        "attn_hc.scale": ("hc_attn_scale", "f32"),
        "ffn_hc.fn": ("hc_ffn_fn", "f32"), "ffn_hc.base": ("hc_ffn_base", "f32"),
        "ffn_hc.scale": ("hc_ffn_scale", "f32"),
        "self_attn.q_a_proj.weight": ("attn.wq_a.weight", "fp8"),
        "self_attn.q_a_norm.weight": ("attn.q_norm.weight", "bf16"),
        "self_attn.q_b_proj.weight": ("attn.wq_b.weight", "fp8"),
        "self_attn.kv_proj.weight": ("attn.wkv.weight", "fp8"),
        "self_attn.kv_norm.weight": ("attn.kv_norm.weight", "bf16"),
        "self_attn.o_a_proj.weight": ("attn.wo_a.weight", "fp8"),
        "self_attn.o_b_proj.weight": ("attn.wo_b.weight", "fp8"),
        "self_attn.sinks": ("attn.attn_sink", "f32"),
        "self_attn.compressor.kv_proj.weight": ("attn.compressor.wkv.weight", "bf16"),
        "self_attn.compressor.gate_proj.weight": ("attn.compressor.wgate.weight", "bf16"),
        "self_attn.compressor.position_bias": ("attn.compressor.ape", "f32"),
        "self_attn.compressor.kv_norm.weight": ("attn.compressor.norm.weight", "bf16"),
        "self_attn.compressor.indexer.kv_proj.weight": ("attn.indexer.compressor.wkv.weight", "bf16"),
        "self_attn.compressor.indexer.gate_proj.weight": ("attn.indexer.compressor.wgate.weight", "bf16"),
        "self_attn.compressor.indexer.position_bias": ("attn.indexer.compressor.ape", "f32"),
        "self_attn.compressor.indexer.kv_norm.weight": ("attn.indexer.compressor.norm.weight", "bf16"),
        "self_attn.compressor.indexer.q_b_proj.weight": ("attn.indexer.wq_b.weight", "fp8"),
        "self_attn.compressor.indexer.scorer.weights_proj.weight": ("attn.indexer.weights_proj.weight", "bf16"),
        "mlp.gate.weight": ("ffn.gate.weight", "bf16"),
        "mlp.gate.e_score_correction_bias": ("ffn.gate.bias", "f32"),
        "mlp.gate.tid2eid": ("ffn.gate.tid2eid", "ids"),
        "mlp.shared_experts.gate_proj.weight": ("ffn.shared_experts.w1.weight", "fp8"),
        "mlp.shared_experts.up_proj.weight": ("ffn.shared_experts.w3.weight", "fp8"),
        "mlp.shared_experts.down_proj.weight": ("ffn.shared_experts.w2.weight", "fp8"),
        "mlp.experts.gate_up_proj": ("ffn.experts", "experts_gate_up"),
        "mlp.experts.down_proj": ("ffn.experts", "experts_down"),
    }
    name, kind = table[rest]
    return p + name, kind


def round_experts(kind, oname, t, official):
    """HF's stacked experts `t` [E, ...] (gate_up_proj: w1 rows then w3 rows; down_proj: w2)
    rounded onto FP4: adds `{oname}.{e}.{w}.weight/.scale` to `official`, returns the stacked
    dequantised values (exact in bf16 and f32)."""
    deqs = []
    for e in range(t.shape[0]):
        w = t[e]
        if kind == "experts_gate_up":
            inter = w.shape[0] // 2
            parts = [("w1", w[:inter]), ("w3", w[inter:])]
        else:
            parts = [("w2", w)]
        deq_parts = []
        for wname, wp in parts:
            packed, exps, deq = fp4_quant(wp.contiguous())
            official[f"{oname}.{e}.{wname}.weight"] = raw(packed, "I8")
            official[f"{oname}.{e}.{wname}.scale"] = raw(exps, "F8_E8M0")
            deq_parts.append(deq)
        deqs.append(torch.cat(deq_parts, dim=0))
    return torch.stack(deqs)


def round_onto_format(kind, oname, t, official):
    """Round one HF-named float32 tensor onto its official storage format; add the official
    tensors to `official`, return the rounded float32 values (what HF computes with)."""
    if kind == "f32":
        official[oname] = raw(t, "F32")
        return t
    if kind == "bf16":
        r = bf16_round(t)
        official[oname] = raw(r, "BF16")
        return r
    if kind == "fp8":
        codes, exps, _scale, deq = fp8_block_quant(t)
        official[oname] = raw(codes, "F8_E4M3")
        official[oname[: -len(".weight")] + ".scale"] = raw(exps, "F8_E8M0")
        return deq
    if kind in ("experts_gate_up", "experts_down"):
        return round_experts(kind, oname, t, official)
    raise ValueError(kind)
