#!/usr/bin/env python3
"""Build tiny random-weight DeepSeek-V4 checkpoints and record HF transformers' outputs.

Run by hand (outputs are committed under tests/fixtures/golden/):

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers==5.23.0 numpy
    /tmp/venv/bin/python tools/make_golden.py

For every config it writes
  official/  DeepSeek's own layout and dtypes: FP8 e4m3 + E8M0 128x128 block scales for the
             dense projections, FP4 e2m1 experts (I8, low nibble first) + E8M0 1x32 scales,
             BF16 norms/embed/head/compressors, F32 mHC/sinks/ape/bias, I64 tid2eid.
  hf/        HF names (`model.layers.N.self_attn.q_a_proj.weight`, stacked experts): FP8 with
             F32 `weight_scale_inv`, BF16 stacked experts, I32 tid2eid.
  golden.safetensors + golden.json: what HF computes in float32 on exactly those values
             (the weights are drawn, then rounded onto their storage format, so both layouts
             hold the same numbers the reference ran on).
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden.hf_v4 import (CONFIGS, GREEDY_STEPS, INTER_POSITIONS, TIE_GAP, TOPK_LOGITS, build_model,  # noqa: E402
                          record_prompt, run_prompt)
from golden.layout import official_name_and_format, round_onto_format  # noqa: E402
from golden.paths import GOLDEN as OUT  # noqa: E402
from golden.storage import fp8_block_quant, raw, write_safetensors  # noqa: E402

RETRIES = 6


# ---------------------------------------------------------------- writing

def quantise_and_save(model, cfg, out_dir):
    """Round every weight onto its storage format, load the rounded values back into the model,
    and write both layouts."""
    sd = model.state_dict()
    official, hf, new_sd = {}, {}, {}
    for hf_name, t in sd.items():
        if "rotary_emb" in hf_name:
            continue
        oname, kind = official_name_and_format(hf_name)
        t = t.detach().to(torch.float32) if kind != "ids" else t.detach()
        if kind == "ids":
            new_sd[hf_name] = t
            official[oname] = raw(t, "I64")
            hf[hf_name] = raw(t, "I32")
        elif kind == "fp8":
            # HF's layout keeps the FP8 codes too, with F32 scales (`weight_scale_inv`).
            codes, exps, scale, deq = fp8_block_quant(t)
            new_sd[hf_name] = deq
            base = oname[: -len(".weight")]
            official[oname] = raw(codes, "F8_E4M3")
            official[base + ".scale"] = raw(exps, "F8_E8M0")
            hf[hf_name] = raw(codes, "F8_E4M3")
            hf[hf_name[: -len(".weight")] + ".weight_scale_inv"] = raw(scale, "F32")
        else:
            # F32, BF16 and the FP4 experts: HF's layout holds the rounded values themselves
            # (FP4 values are exact in bf16; HF stacks the experts).
            new_sd[hf_name] = r = round_onto_format(kind, oname, t, official)
            hf[hf_name] = raw(r, "F32" if kind == "f32" else "BF16")
    missing, unexpected = model.load_state_dict(new_sd, strict=False)
    assert not unexpected and all("rotary_emb" in m for m in missing), (missing, unexpected)

    os.makedirs(os.path.join(out_dir, "official"), exist_ok=True)
    os.makedirs(os.path.join(out_dir, "hf"), exist_ok=True)
    write_safetensors(os.path.join(out_dir, "hf", "model.safetensors"), hf)
    names = sorted(official)
    shards = cfg["official_shards"]
    if shards == 1:
        write_safetensors(os.path.join(out_dir, "official", "model.safetensors"), official)
    else:
        weight_map = {}
        per = math.ceil(len(names) / shards)
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: official[n] for n in names[s * per:(s + 1) * per]}
            write_safetensors(os.path.join(out_dir, "official", fname), part)
            weight_map.update({n: fname for n in part})
        with open(os.path.join(out_dir, "official", "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1, sort_keys=True)


def write_configs(model, cfg, out_dir, flavour):
    hf_cfg = model.config.to_dict()
    with open(os.path.join(out_dir, "hf", "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2, sort_keys=True)
    h = cfg["hf"]
    ratios = []
    for t in h["layer_types"]:
        ratios.append({"sliding_attention": 0,
                       "compressed_sparse_attention": h["compress_rates"]["compressed_sparse_attention"],
                       "heavily_compressed_attention": h["compress_rates"]["heavily_compressed_attention"]}[t])
    ratios += [0] * h["num_nextn_predict_layers"]
    n_hash = sum(1 for t in h["mlp_layer_types"] if t == "hash_moe")
    rope_dim = int(h["head_dim"] * h["partial_rotary_factor"])
    rp = h.get("rope_parameters")
    if flavour == "shipped":
        # What real checkpoints ship: HF-style keys with the legacy fields HF folds in.
        off = {k: v for k, v in h.items() if k not in (
            "layer_types", "compress_rates", "mlp_layer_types", "partial_rotary_factor", "rope_parameters")}
        off.update(architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4",
                   compress_ratios=ratios, num_hash_layers=n_hash, qk_rope_head_dim=rope_dim,
                   torch_dtype="bfloat16",
                   quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic",
                                        "fmt": "e4m3", "scale_fmt": "ue8m0",
                                        "weight_block_size": [128, 128]},
                   expert_dtype="fp4")
        if rp:
            off["rope_scaling"] = dict(rp, type="yarn")
    else:
        # DeepSeek's own inference/config.json names (ModelArgs).
        off = dict(
            vocab_size=h["vocab_size"], dim=h["hidden_size"], moe_inter_dim=h["moe_intermediate_size"],
            n_layers=h["num_hidden_layers"], n_hash_layers=n_hash, n_mtp_layers=h["num_nextn_predict_layers"],
            n_heads=h["num_attention_heads"], n_routed_experts=h["n_routed_experts"],
            n_shared_experts=h["n_shared_experts"], n_activated_experts=h["num_experts_per_tok"],
            score_func=h["scoring_func"], route_scale=h["routed_scaling_factor"],
            swiglu_limit=h["swiglu_limit"], q_lora_rank=h["q_lora_rank"], head_dim=h["head_dim"],
            rope_head_dim=rope_dim, norm_eps=h["rms_norm_eps"], o_groups=h["o_groups"],
            o_lora_rank=h["o_lora_rank"], window_size=h["sliding_window"], compress_ratios=ratios,
            compress_rope_theta=h["compress_rope_theta"], rope_theta=h["rope_theta"],
            original_seq_len=rp["original_max_position_embeddings"], rope_factor=rp["factor"],
            beta_fast=rp["beta_fast"], beta_slow=rp["beta_slow"], index_n_heads=h["index_n_heads"],
            index_head_dim=h["index_head_dim"], index_topk=h["index_topk"], hc_mult=h["hc_mult"],
            hc_sinkhorn_iters=h["hc_sinkhorn_iters"], hc_eps=h["hc_eps"],
            max_seq_len=h["max_position_embeddings"], dtype="fp8", scale_fmt="ue8m0", expert_dtype="fp4",
        )
    with open(os.path.join(out_dir, "official", "config.json"), "w") as f:
        json.dump(off, f, indent=2, sort_keys=True)


# ---------------------------------------------------------------- goldens

def pick_prompt(model, g, vocab, n, want_layers):
    """Prefer prompts whose selections have comfortable margins; long prompts rarely have
    them and are kept (marked not tie-safe) after a few tries."""
    for _attempt in range(RETRIES):
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        r = run_prompt(model, ids, want_layers)
        tie_safe = min(r["router_gap"], r["indexer_gap"]) > TIE_GAP and r["greedy_gap"] > TIE_GAP
        if tie_safe:
            break
    return ids, r, tie_safe


def record_goldens(model, cname, cfg, out_dir):
    """golden.safetensors + golden.json: HF's float32 outputs on the config's prompts."""
    g = torch.Generator().manual_seed(1000 + cfg["seed"])
    vocab = cfg["hf"]["vocab_size"]
    golden, meta = {}, {"config": cname, "greedy_steps": GREEDY_STEPS, "top_logprobs": TOPK_LOGITS,
                        "tie_gap": TIE_GAP, "prompts": []}
    for pi, n in enumerate(cfg["prompt_lengths"]):
        ids, r, tie_safe = pick_prompt(model, g, vocab, n, pi == cfg["intermediates_prompt"])
        record_prompt(meta, golden, pi, ids, r, tie_safe)
        print(f"{cname} prompt {pi} len {n}: router gap {r['router_gap']:.3g} "
              f"indexer gap {r['indexer_gap']:.3g} greedy gap {r['greedy_gap']:.3g} tie_safe {tie_safe}")
    meta["intermediates_prompt"] = cfg["intermediates_prompt"]
    meta["intermediates_positions"] = INTER_POSITIONS
    write_safetensors(os.path.join(out_dir, "golden.safetensors"), golden)
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(meta, f, indent=1)


def main():
    only = sys.argv[1:]
    for cname, cfg in CONFIGS.items():
        if only and cname not in only:
            continue
        out_dir = os.path.join(OUT, cname)
        model = build_model(cfg)
        quantise_and_save(model, cfg, out_dir)
        write_configs(model, cfg, out_dir, "modelargs" if cname == "tiny-b" else "shipped")
        record_goldens(model, cname, cfg, out_dir)

if __name__ == "__main__":
    main()
