#!/usr/bin/env python3
"""DSpark drafting for DeepSeek-V4.1 on the CPU, in float32, and goldens from it.

Run by hand, after tools/make_v41_golden.py (outputs are committed):

    /tmp/venv/bin/python tools/make_dspark_golden.py

It builds on golden/v41.py (the V41 model, its Store and storage formats; the loop shared
with the V4 drafter is golden/dspark.py) and writes, for the tiny-v41-a config:

  tests/fixtures/golden/tiny-v41-a/official/dspark.safetensors
      the DSpark weights (stages mtp.0..2 and the head stack) under their official names, drawn
      with the Store rules of golden/v41.py. model.safetensors is NOT rewritten: the target's
      weights are rebuilt in memory with golden.v41.build() (same seed) and checked byte for
      byte against the file on disk before anything runs.
  tests/fixtures/golden/tiny-v41-a/dspark_golden.safetensors, dspark_golden.json
      the DSpark config fields, two fully recorded draft blocks, and a greedy speculative decode
      loop against plain greedy decoding.

The computation, part by part, and the vLLM 0.33.0 source each part follows
(paths under vllm/; "spec" is docs/MODEL.md):

  1. Target and aux states (models/deepseek_v41/nvidia/model.py: DeepseekV4Model._run_layers,
     DeepseekV4DecoderLayer.forward with capture_previous_aux; the id convention comes from
     v1/worker/gpu/spec_decode/eagle/eagle3_utils.py get_eagle3_aux_layers_from_config).
     For model_type deepseek_v41 the ids of `dspark_target_layer_ids` are used as they are,
     and the layer with index L (0-based) captures the mean over its hc streams of the
     residual ENTERING it: the post-mapped output of layer L-1, taken before layer L's Engram
     injection (the Engram branch takes the mean of `previous_post` before calling the Engram).
     The real model's [37, 38, 39] (40 layers) are the inputs of its last three layers; the
     tiny analogue for 5 layers is [2, 3, 4]. Layer 3 of tiny-v41-a is an Engram layer, so the
     second aux state shows whether a port captures before the injection. The three states are
     concatenated in id order ([T, 3D]).
  2. main_x (models/deepseek_v41/nvidia/dspark.py combine_hidden_states):
     main_x = main_norm(main_proj(concat)), one row per target token; main_proj is FP8 with
     32x32 block scales like every dense projection, main_norm a plain RMSNorm (rms_norm_eps).
  3. Context KV (dspark.py precompute_and_store_context_kv and _insert_context_kv;
     v1/worker/gpu/spec_decode/dflash/speculator.py _prepare_dflash_inputs_kernel):
     for every stage s and every context row p, kv = RoPE_p(kv_norm_s(wkv_s · main_x[p]))
     with the stage's own wkv and kv_norm (no attn_norm, no mHC in front), RoPE'd at the
     target position p of that row (the same GPT-J-interleaved rotation of the trailing
     qk_rope_head_dim dims the stage applies to its own keys; ratio-0 layer, so rope_theta
     and no YaRN). Context rows are the target tokens that were accepted (a verify step's
     rejected rows write nothing).
  4. Draft block (dflash/speculator.py _prepare_dflash_inputs_kernel with
     SAMPLE_FROM_ANCHOR, dspark/speculator.py): with P0 = number of context tokens (the
     position of the target's freshly sampled "bonus" token, which the target has not run
     yet), the block has block_size = 5 rows at positions P0 .. P0+4 with ids
     [bonus, noise, noise, noise, noise]; row j predicts the token at position P0+j+1.
     The embedding (shared with the target) is broadcast to hc streams.
  5. Stages (dspark.py DSparkDeepseekV4Model.forward; model.py DeepseekV4DecoderLayer): three
     V4.1 decoder blocks, layer ids num_hidden_layers+i, compress ratio 0 (window only), no
     Engram, scored MoE with `dspark_n_routed_experts` experts, `dspark_num_experts_per_tok`
     active (model.py DeepseekV4MoE reads those two for layer ids >= num_hidden_layers; same
     moe_intermediate_size, shared expert, router, swiglu limit as the target). Shifted mHC
     exactly as the target: stage 0's attention takes stream 0 of the broadcast (pre_mix is
     None: kernels/mhc/torch.py mhc_pre_delayed_torch), every later sublayer the previous
     sublayer's pre, and the pre chain runs on from one stage into the next.
  6. Attention of a stage (v1/attention/backends/mla/sparse_swa.py
     ComputeDSparkNoncausalSWAIndicesKernel; models/deepseek_v41/attention.py): queries are
     the V4.1 ones (q = wq_b(q_norm(wq_a x)), no per-head RMS) RoPE'd at the row's position;
     the block's own keys kv = RoPE(kv_norm(wkv x)) at the row positions are written into the
     window cache first; then EVERY row of the block attends to the same set: the context
     rows at positions max(0, P0 - sliding_window) .. P0-1 (exactly `sliding_window` of them
     once P0 >= window — one more than a causal row sees) plus all block_size rows, the
     later ones included (non-causal). Sink softmax, scale head_dim^-1/2, inverse RoPE of the
     output at the row position, grouped wo_a, wo_b — as the target's window attention.
  7. Head (dspark.py forward and compute_logits): after the last stage the streams are
     collapsed with the last stage's FFN pre (no hc_head in V4.1) into the "head hidden"
     h [5, D] (pre-norm); base logits = head(norm(h)) with mtp.{last}.norm and the target's
     head (shared).
  8. Markov head (dspark/speculator.py _sample_sequential, model_executor/models/
     qwen3_dspark.py DSparkMarkovHead): prev = bonus; for j = 0..4: e_j = markov_w1[prev]
     (an embedding row, [r]), logits_j = base_j + markov_w2 · e_j ([V]), d_j = argmax
     (greedy; vLLM samples with Gumbel noise at temperature > 0), prev = d_j.
  9. Confidence (qwen3_dspark.py DSparkConfidenceHead, dspark.py compute_confidence):
     c_j = sigmoid(proj · [h_j ; e_j]), h_j the pre-norm head hidden, e_j the Markov embedding
     of the token BEFORE slot j (the one that biased logits_j); proj [1, D + r], no bias.
 10. Verification (greedy): the target runs [bonus, d_0..d_4] at P0..P0+5; accepted = the
     longest prefix with d_j == argmax of the target at P0+j; the committed tokens grow by
     the bonus and the accepted drafts, the target's argmax after the last accepted draft is
     the next bonus. The output equals plain greedy decoding by construction.

Checkpoint names (dspark.py DSparkDeepseekV4ForCausalLM.load_weights / _remap_dspark_name):
mtp.{i}.<rest> maps to the stage-i decoder layer, except main_proj.* and main_norm.* (shipped
under mtp.0), norm.*, markov_head.* and confidence_head.* (shipped under the last stage,
mtp.2), which live at model level; markov_head.embed / markov_head.head are markov_w1 /
markov_w2. Stage tensors are those of a window-only V4.1 layer (no compressor, indexer,
Engram); `gate.bias_vl` is stored as golden/v41.py stores it on every target layer.

Choices (vLLM does not fix them for a tiny model, or the reference had to pick):
  - dspark_target_layer_ids [2, 3, 4] (above); dspark_block_size 5 (as shipped);
    dspark_noise_token_id 511 (the last id of the 512 vocab; the real 128799 is outside it);
    dspark_markov_rank 16; num_nextn_predict_layers 3; dspark_n_routed_experts 6 and
    dspark_num_experts_per_tok 3 (the real model also gives its stages their own counts,
    128 top-3 against 384 top-6; both differ from the target's 8 top-2 here so that a port
    that ignores either override fails); compress_ratios extended with [0, 0, 0] for the
    stages (attention.py treats missing entries as 0 anyway).
  - The context window is the config's sliding_window (6 here, 128 shipped); the "128-slot
    ring" of the spec is that window. The cache must also hold the 5 block rows beside the
    window: a literal ring of exactly `sliding_window` slots would let the block's own rows
    overwrite the oldest visible context rows (vLLM's paged cache has separate slots).
  - Nothing is special at position 0: DSpark has no MTP-style zeroed embedding; the context
    simply starts at position 0 and a short prefix shows fewer than `sliding_window` rows.
  - Context rows are recomputed from a full target forward over the committed tokens; since
    the target is causal this equals vLLM's incremental insertion of each verify step's
    accepted rows.
  - float32 throughout with dequantized weights: no activation quantization, no bf16 rounding
    of activations, no KV-cache quantization — the same numerics as golden/v41.py (vLLM keeps the mean
    aux states, main_x and the cache in bf16/fp8).
  - Confidence proj stored as F32 (vLLM creates the parameter in float32; the shipped dtype
    was not seen); Markov factors BF16 (vLLM's ROCm kernel notes 129280 x 256 bf16).
  - Greedy argmax everywhere (vLLM's temperature-0 path); ties are avoided by retrying the
    prompt until every recorded decision has a margin above TIE_GAP.

Where vLLM and docs/MODEL.md §7.2 differ, vLLM was followed:
  - the spec's final `head(norm(hc_head(X)))`: V4.1 has no hc_head; the collapse uses the
    last stage's FFN pre (docs/MODEL.md §8.1 says as much for the target);
  - the spec's "last committed token" as the first draft id: it is the bonus token the
    target has just sampled, at position P0 = number of context rows, not yet run by the
    target (no context row of its own);
  - the spec lists `mtp.2.hc_head_*`: a V4.1 loader maps it to a stage parameter that does
    not exist, so V4.1 checkpoints cannot carry it; none is written;
  - the spec's 128-slot ring: the visible context is the last `sliding_window` rows before
    P0, whatever the window.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden.dspark import draw_stage, record, sequential_drafts  # noqa: E402
from golden.paths import GOLDEN  # noqa: E402
from golden.primitives import rms_norm, rope_tail, sparse_attn  # noqa: E402
from golden.read import read_safetensors_raw  # noqa: E402
from golden.storage import write_safetensors  # noqa: E402
from golden.v41 import CONFIGS, V41, Gaps, build, store  # noqa: E402

CONFIG = "tiny-v41-a"
DSPARK_SEED = 4100
PROMPT_SEED = 4200

DSPARK_FIELDS = dict(
    dspark_target_layer_ids=[2, 3, 4],
    dspark_block_size=5,
    dspark_noise_token_id=511,
    dspark_markov_rank=16,
    num_nextn_predict_layers=3,
    dspark_n_routed_experts=6,
    dspark_num_experts_per_tok=3,
)


# ---------------------------------------------------------------- config and weights

def dspark_config(c):
    d = dict(c)
    d.update(DSPARK_FIELDS)
    L = c["num_hidden_layers"]
    d["compress_ratios"] = list(c["compress_ratios"][:L]) + [0] * d["num_nextn_predict_layers"]
    # Id L captures the streams entering layer L (L == num_hidden_layers: the final streams);
    # layer 0 has no previous post, so vLLM records nothing for id 0.
    assert all(1 <= t <= L for t in d["dspark_target_layer_ids"])
    assert d["dspark_noise_token_id"] < c["vocab_size"]
    return d


def announce_drafter(path, dc):
    """Adds the DSpark fields to the checkpoint's config.json (its text_config), as V4.1's
    config ships them: the stages count as next-token layers and get ratio-0 entries."""
    with open(path) as f:
        cfg = json.load(f)
    text = cfg["text_config"]
    for k, v in DSPARK_FIELDS.items():
        text[k] = v
    text["compress_ratios"] = dc["compress_ratios"]
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def build_dspark(c):
    """DSpark weights in official names: (values for the forward, stored bytes)."""
    s = store(DSPARK_SEED)
    D, V, r = c["hidden_size"], c["vocab_size"], c["dspark_markov_rank"]
    n, last = c["num_nextn_predict_layers"], c["num_nextn_predict_layers"] - 1
    k = len(c["dspark_target_layer_ids"])
    w = {
        "main_proj": s.fp8("mtp.0.main_proj.weight", s.draw((D, k * D), 0.05)),
        "main_norm": s.bf16("mtp.0.main_norm.weight", s.draw((D,), 0.1, 1.0)),
        "layers": [draw_stage(s, f"mtp.{i}", c) for i in range(n)],
    }
    w["norm"] = s.bf16(f"mtp.{last}.norm.weight", s.draw((D,), 0.1, 1.0))
    w["markov_w1"] = s.bf16(f"mtp.{last}.markov_head.embed.weight", s.draw((V, r), 0.5))
    w["markov_w2"] = s.bf16(f"mtp.{last}.markov_head.head.weight", s.draw((V, r), 0.5))
    w["confidence"] = s.f32(f"mtp.{last}.confidence_head.proj.weight", s.draw((1, D + r), 0.05))
    return w, s.files


def check_target_file(files, path):
    """The in-memory rebuild must be the committed model.safetensors, tensor for tensor."""
    disk = read_safetensors_raw(path)
    if set(disk) != set(files):
        raise SystemExit(f"{path}: tensor names differ from golden.v41.build()")
    for k, v in files.items():
        if tuple(disk[k][:2]) != (v[0], list(v[1])) or disk[k][2] != v[2]:
            raise SystemExit(f"{path}: {k} differs from golden.v41.build(); rerun make_v41_golden.py first")


# ---------------------------------------------------------------- the draft model

class DSpark:
    def __init__(self, target, c, w):
        self.t, self.c, self.w = target, c, w
        # The stages reuse V41's mHC and MoE code through a V41 whose "layers" are the stages
        # and whose expert counts are the dspark_* ones (no Engram, no compressed layers).
        sc = dict(c, n_routed_experts=c["dspark_n_routed_experts"],
                  num_experts_per_tok=c["dspark_num_experts_per_tok"], engram_layer_ids=[])
        self.stages = V41(sc, {"layers": w["layers"]})
        self.fc = target.fc_main  # ratio-0 layers: rope_theta, no YaRN
        self.eps = c["rms_norm_eps"]

    def aux_states(self, layers):
        """Mean over hc of the streams entering each target layer: layers[L-1] is the output of
        layer L-1 (V41.forward records it before layer L's Engram)."""
        return torch.cat([layers[L - 1].mean(1) for L in self.c["dspark_target_layer_ids"]], -1)

    def main_x(self, aux):
        return rms_norm(aux @ self.w["main_proj"].T, self.w["main_norm"], self.eps)

    def kv(self, lw, x, pos):
        rd = self.c["qk_rope_head_dim"]
        return rope_tail(rms_norm(x @ lw["wkv"].T, lw["kv_norm"], self.eps), self.fc[pos], rd)

    def attention(self, i, x, pos, ctx_kv):
        c, lw, T = self.c, self.w["layers"][i], x.shape[0]
        H, hd, rd = c["num_attention_heads"], c["head_dim"], c["qk_rope_head_dim"]
        qr = rms_norm(x @ lw["wq_a"].T, lw["q_norm"], self.eps)
        q = rope_tail((qr @ lw["wq_b"].T).view(T, H, hd), self.fc[pos], rd)
        keys = torch.cat([ctx_kv, self.kv(lw, x, pos)], 0)
        # Non-causal: every row sees the whole context window and every block row.
        idx = torch.arange(keys.shape[0]).unsqueeze(0).repeat(T, 1)
        o = sparse_attn(q, keys, lw["sink"], idx, hd ** -0.5)
        o = rope_tail(o, self.fc[pos], rd, inverse=True)
        g = c["o_groups"]
        o = torch.einsum("sgd,grd->sgr", o.reshape(T, g, -1), lw["wo_a"].view(g, c["o_lora_rank"], -1))
        return o.flatten(1) @ lw["wo_b"].T

    @torch.no_grad()
    def draft(self, aux, bonus):
        """aux [P0, 3D] (one row per context token, positions 0..P0-1), bonus = the token at P0."""
        c, sm = self.c, self.stages
        P0, B, win = aux.shape[0], c["dspark_block_size"], c["sliding_window"]
        gaps = Gaps()
        ctx_pos = torch.arange(max(0, P0 - win), P0)
        mx = self.main_x(aux[ctx_pos])
        ctx_kv = [self.kv(lw, mx, ctx_pos) for lw in self.w["layers"]]
        pos = torch.arange(P0, P0 + B)
        ids = [bonus] + [c["dspark_noise_token_id"]] * (B - 1)
        X = self.t.w["embed"][torch.tensor(ids)].unsqueeze(1).repeat(1, c["hc_mult"], 1)
        pre, stage_out = None, []
        for i, lw in enumerate(self.w["layers"]):
            new_pre, post, comb = sm.coeffs(X, lw["hc_attn"])
            a = X[:, 0] if pre is None else (pre.unsqueeze(-1) * X).sum(1)
            a = self.attention(i, rms_norm(a, lw["attn_norm"], self.eps), pos, ctx_kv[i])
            X = sm.post(a, X, post, comb)
            pre = new_pre
            new_pre, post, comb = sm.coeffs(X, lw["hc_ffn"])
            f = rms_norm((pre.unsqueeze(-1) * X).sum(1), lw["ffn_norm"], self.eps)
            X = sm.post(sm.moe(i, f, gaps), X, post, comb)
            pre = new_pre
            stage_out.append(X.clone())
        h = (pre.unsqueeze(-1) * X).sum(1)  # pre-norm head hidden
        base = rms_norm(h, self.w["norm"], self.eps) @ self.t.w["head"].T
        return dict(P0=P0, ids=ids, positions=pos, ctx_positions=ctx_pos, aux=aux[ctx_pos], main_x=mx,
                    ctx_kv=torch.stack(ctx_kv), stage_out=torch.stack(stage_out), head_hidden=h,
                    base_logits=base, router_gap=gaps.router, **sequential_drafts(self.w, h, base, bonus))


def main():
    spec = CONFIGS[CONFIG]
    c = dict(spec["cfg"])
    w, files = build(CONFIG, dict(spec, cfg=c))
    out_dir = os.path.join(GOLDEN, CONFIG)
    check_target_file(files, os.path.join(out_dir, "official", "model.safetensors"))
    dc = dspark_config(c)
    target = V41(c, w)
    dw, dfiles = build_dspark(dc)
    write_safetensors(os.path.join(out_dir, "official", "dspark.safetensors"), dfiles)
    announce_drafter(os.path.join(out_dir, "official", "config.json"), dc)
    ds = DSpark(target, dc, dw)
    head = {
        "config": CONFIG,
        "dspark_config": {k: dc[k] for k in list(DSPARK_FIELDS) + ["compress_ratios"]},
        "dspark_checkpoint": "official/dspark.safetensors",
        "dspark_tensors": {k: [v[0], v[1]] for k, v in dfiles.items()},
    }
    notes = {
        "X.aux": "[ctx, 3D] mean-over-hc entry streams of the target layers, context rows",
        "X.head_hidden": "[block, D] collapse with the last stage's ffn pre, before norm",
    }
    record(target, ds, c["vocab_size"], out_dir, head, notes, PROMPT_SEED)


if __name__ == "__main__":
    main()
