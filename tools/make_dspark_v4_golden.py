#!/usr/bin/env python3
"""DSpark drafting for DeepSeek-V4 (V4-Flash-0731 / -DSpark style checkpoints) on the CPU, in
float32, and goldens from it.

Run by hand (outputs are committed):

    /tmp/venv/bin/python tools/make_dspark_v4_golden.py

The target is tiny-a (tests/fixtures/golden/tiny-a). This script writes a second checkpoint
directory, tests/fixtures/golden/tiny-a-dspark/, shaped like a V4-Flash-0731 release:

  official/model-0000{1,2}-of-00002.safetensors
      symbolic links to tiny-a's shards: the target is tiny-a, byte for byte;
  official/dspark.safetensors
      the DSpark weights (stages mtp.0..2, mtp.0.main_proj/main_norm, the head stack under
      mtp.2) in their official names and storage formats (FP8 e4m3 with 128x128 E8M0 block
      scales, ragged at the edges; FP4 e2m1 experts; BF16 norms, gate and Markov factors;
      F32 mHC, sinks, gate bias, confidence), drawn with golden/storage.py's Store;
  official/config.json
      tiny-a's config with the dspark_* fields added and compress_ratios given the stages'
      three trailing 0 entries. num_nextn_predict_layers stays 1, as V4-Flash-0731's config
      says while shipping three stages (docs/MODEL.md §1.1, §11.5): vLLM's V4 drafter reads the stage
      count from `n_mtp_layers` and otherwise takes 3, never num_nextn_predict_layers;
  dspark_golden.safetensors, dspark_golden.json
      in the format of tools/make_dspark_golden.py (the loop and format of golden/dspark.py,
      shared with it): two fully recorded draft blocks and a greedy speculative decode loop
      against plain greedy decoding.

The target runs on golden/official_v4.py's port of DeepSeek's V4 inference code (the one
tools/make_official_golden.py records) with its quantisation points off
(`Numerics(quantise=False)`, as `--plain`), which is checked here against HF transformers'
float32 goldens of tiny-a before anything else runs (the same check as
`make_official_golden.py --plain`).

What differs from V4.1's DSpark (tools/make_dspark_golden.py states the shared computation,
steps 2-4 and 8-10 there hold unchanged), and the vLLM 0.33.0 source each part follows:

  1. Aux states (models/deepseek_v4/nvidia/model.py DeepseekV4Model.forward: the target
     captures `mhc_post(...)` mean-over-hc when idx + 1 is an aux layer; v1/worker/gpu/
     spec_decode/eagle/eagle3_utils.py get_eagle3_aux_layers_from_config adds 1 to V4's
     dspark_target_layer_ids): for each id i the mean over the hc streams of the residual
     AFTER layer i. The real [40, 41, 42] of V4-Flash's 43 layers are the outputs of its last
     three layers (42: the final streams, before hc_head); the tiny analogue for 4 layers is
     [1, 2, 3].
  5. Stages (models/deepseek_v4/nvidia/dspark.py DSparkDeepseekV4Model): three V4 decoder
     blocks (DeepseekV4DecoderLayer at layer ids num_hidden_layers + i), window only, scored
     MoE with the target's expert counts (the V4 drafter passes no dspark_* overrides), V4's
     own-`pre` mHC per sublayer (golden.official_v4.Block.hc_pre/hc_post; vLLM fuses a
     layer's post with the next layer's pre, the same arithmetic).
  6. Attention of a stage: as V4.1's block attention (every block row sees the context window
     and all block rows, sink softmax, inverse RoPE, grouped wo_a, wo_b), with V4's queries:
     the per-head RMS of q (no weight) before RoPE (golden.official_v4.Attention). Context
     keys: the stage's wkv and kv_norm on main_x, RoPE'd at the context positions
     (dspark.py precompute_and_store_context_kv: context_wkv_proj stacks the stages' wkv).
  7. Head (dspark.py forward): after the last stage the streams go through the drafter's own
     hc_head (mtp.2.hc_head_{fn,base,scale}; golden.official_v4.head's collapse) into the
     pre-norm head hidden h; base logits = head(norm(h)) with mtp.2.norm and the target's
     head.
  Names (dspark.py _remap_dspark_name): V4's loader maps `markov_head.*` straight onto
  DSparkMarkovHead's parameters, so the Markov factors are
  mtp.2.markov_head.markov_w1.weight / markov_w2.weight (docs/MODEL.md §7.2 lists both spellings; the
  V4.1 fixture uses the other one, embed/head).

Choices: dspark_noise_token_id 319 (tiny-a's last id), dspark_markov_rank 16, block 5; the
context window is tiny-a's sliding_window (8); everything else as tools/make_dspark_golden.py.
"""

import json
import math
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden.dspark import draw_stage, record, sequential_drafts  # noqa: E402
from golden.official_v4 import Block, Model, check_plain, head  # noqa: E402
from golden.paths import GOLDEN  # noqa: E402
from golden.primitives import hc_head_collapse, rms_norm, rope, sparse_attn  # noqa: E402
from golden.quant_sim import Numerics  # noqa: E402
from golden.read import tensor  # noqa: E402
from golden.storage import Store, write_safetensors  # noqa: E402

TARGET = "tiny-a"
CONFIG = "tiny-a-dspark"
DSPARK_SEED = 4300
PROMPT_SEED = 4400
MAX_LEN = 64
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]

DSPARK_FIELDS = dict(
    dspark_target_layer_ids=[1, 2, 3],
    dspark_block_size=5,
    dspark_noise_token_id=319,
    dspark_markov_rank=16,
)
STAGES = 3
FP8_BLOCK = 128  # V4's FP8 weights carry 128x128 scale blocks
# The target and the drafter run unquantised (float32 between stored values), as the V4.1
# drafter does; one instance for every model here (nothing reads its fragile count).
PLAIN = Numerics(quantise=False)


# ---------------------------------------------------------------- checkpoint

def write_checkpoint(target_dir, out_dir):
    """config.json, the shard links and dspark.safetensors; returns the config as HF keys."""
    os.makedirs(out_dir, exist_ok=True)
    for shard in SHARDS:
        link = os.path.join(out_dir, shard)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.join("..", "..", TARGET, "official", shard), link)
    with open(os.path.join(target_dir, "config.json")) as f:
        cfg = json.load(f)
    n = cfg["num_hidden_layers"]
    cfg.update(DSPARK_FIELDS)
    cfg["compress_ratios"] = cfg["compress_ratios"][:n] + [0] * STAGES
    assert cfg["dspark_noise_token_id"] < cfg["vocab_size"]
    assert all(0 <= t < n for t in cfg["dspark_target_layer_ids"])
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    files = build_dspark(cfg)
    write_safetensors(os.path.join(out_dir, "dspark.safetensors"), files)
    return cfg, files


def build_dspark(cfg):
    """The drafter's tensors, drawn like V4.1's (golden.dspark.draw_stage) in V4's formats."""
    s = Store(DSPARK_SEED, FP8_BLOCK)
    D, V, r, hc = cfg["hidden_size"], cfg["vocab_size"], cfg["dspark_markov_rank"], cfg["hc_mult"]
    k, last = len(cfg["dspark_target_layer_ids"]), f"mtp.{STAGES - 1}"
    stage_cfg = dict(cfg, dspark_n_routed_experts=cfg["n_routed_experts"])
    s.fp8("mtp.0.main_proj.weight", s.draw((D, k * D), 0.05))
    s.bf16("mtp.0.main_norm.weight", s.draw((D,), 0.1, 1.0))
    for i in range(STAGES):
        draw_stage(s, f"mtp.{i}", stage_cfg, bias_vl=False)
    s.bf16(f"{last}.norm.weight", s.draw((D,), 0.1, 1.0))
    s.f32(f"{last}.hc_head_fn", s.draw((hc, hc * D), 0.05))
    s.f32(f"{last}.hc_head_base", s.draw((hc,), 0.3))
    s.f32(f"{last}.hc_head_scale", torch.rand(1, generator=s.g) + 0.5)
    s.bf16(f"{last}.markov_head.markov_w1.weight", s.draw((V, r), 0.5))
    s.bf16(f"{last}.markov_head.markov_w2.weight", s.draw((V, r), 0.5))
    s.f32(f"{last}.confidence_head.proj.weight", s.draw((1, D + r), 0.05))
    return s.files


# ---------------------------------------------------------------- target and drafter

class Target:
    """tiny-a on golden/official_v4.py's plain port; every call a whole teacher-forced pass
    from position 0 on a fresh model (the port keeps decode state in its layers)."""

    def __init__(self, d):
        self.d = d

    def model(self):
        return Model(self.d, MAX_LEN, PLAIN)

    @torch.no_grad()
    def forward(self, ids, want_layers=True):
        m = self.model()
        x = torch.tensor(ids)
        h = m.embed[x].unsqueeze(1).repeat(1, m.c["hc"], 1)
        layers = []
        for b in m.blocks:
            h = b(h, 0, x)
            layers.append(h)
        logits = head(h, m.hc_head, m.norm, m.head, m.c, m.nm)
        gaps = SimpleNamespace(router=m.gaps["router"], indexer=m.gaps["indexer"], candidate=math.inf)
        return logits, layers, gaps


class DSparkV4:
    def __init__(self, model, cfg):
        self.m, self.cfg, c, raw = model, cfg, model.c, model.raw
        self.c, self.eps, last = c, c["eps"], f"mtp.{STAGES - 1}"
        self.gaps = {"router": math.inf, "indexer": math.inf}
        n = c["layers"]
        self.blocks = [Block(c, raw, n + i, MAX_LEN, self.gaps, PLAIN, prefix=f"mtp.{i}") for i in range(STAGES)]
        t = lambda name: tensor(raw, name)
        self.w = {
            "main_proj": t("mtp.0.main_proj.weight"), "main_norm": t("mtp.0.main_norm.weight"),
            "norm": t(f"{last}.norm.weight"),
            "hc_head": [t(f"{last}.hc_head_{k}") for k in ["fn", "scale", "base"]],
            "markov_w1": t(f"{last}.markov_head.markov_w1.weight"),
            "markov_w2": t(f"{last}.markov_head.markov_w2.weight"),
            "confidence": t(f"{last}.confidence_head.proj.weight"),
        }

    def aux_states(self, layers):
        """Mean over hc of the streams AFTER each target layer (step 1 above)."""
        return torch.cat([layers[i].mean(1) for i in self.cfg["dspark_target_layer_ids"]], -1)

    def kv(self, attn, x, pos):
        rd = self.c["rd"]
        kv = rms_norm(x @ attn.wkv.T, attn.kv_norm, self.eps)
        return torch.cat([kv[:, :-rd], rope(kv[:, -rd:], attn.fc[pos])], -1)

    def attention(self, attn, x, pos, ctx_kv):
        c, T = self.c, x.shape[0]
        h, hd, rd = c["heads"], c["head_dim"], c["rd"]
        fc = attn.fc[pos]
        qr = rms_norm(x @ attn.wq_a.T, attn.q_norm, self.eps)
        q = (qr @ attn.wq_b.T).unflatten(-1, (h, hd))
        q = q * torch.rsqrt(q.square().mean(-1, keepdim=True) + self.eps)
        q = torch.cat([q[..., :-rd], rope(q[..., -rd:], fc)], -1)
        keys = torch.cat([ctx_kv, self.kv(attn, x, pos)], 0)
        idx = torch.arange(keys.shape[0]).unsqueeze(0).repeat(T, 1)
        o = sparse_attn(q, keys, attn.sink, idx, hd ** -0.5)
        o = torch.cat([o[..., :-rd], rope(o[..., -rd:], fc, inverse=True)], -1)
        g = c["groups"]
        o = torch.einsum("sgd,grd->sgr", o.reshape(T, g, -1), attn.wo_a.view(g, c["o_lora"], -1))
        return o.flatten(1) @ attn.wo_b.T

    def stage(self, blk, X, pos, ctx_kv, ids):
        r = X
        a, post, comb = blk.hc_pre(X, *blk.hc["attn"])
        a = self.attention(blk.attn, rms_norm(a, blk.attn_norm, self.eps), pos, ctx_kv)
        X = blk.hc_post(a, r, post, comb)
        r = X
        f, post, comb = blk.hc_pre(X, *blk.hc["ffn"])
        f = blk.ffn(rms_norm(f, blk.ffn_norm, self.eps), ids)
        return blk.hc_post(f, r, post, comb)

    def head_hidden(self, X):
        return hc_head_collapse(X, self.w["hc_head"], self.eps, self.c["hc_eps"])

    @torch.no_grad()
    def draft(self, aux, bonus):
        """aux [P0, 3D] (one row per context token, positions 0..P0-1), bonus = the token at P0."""
        cfg, c = self.cfg, self.c
        P0, B, win = aux.shape[0], cfg["dspark_block_size"], c["window"]
        self.gaps["router"] = math.inf
        ctx_pos = torch.arange(max(0, P0 - win), P0)
        mx = rms_norm(aux[ctx_pos] @ self.w["main_proj"].T, self.w["main_norm"], self.eps)
        ctx_kv = [self.kv(b.attn, mx, ctx_pos) for b in self.blocks]
        pos = torch.arange(P0, P0 + B)
        ids = [bonus] + [cfg["dspark_noise_token_id"]] * (B - 1)
        X = self.m.embed[torch.tensor(ids)].unsqueeze(1).repeat(1, c["hc"], 1)
        stage_out = []
        for blk, kv in zip(self.blocks, ctx_kv):
            X = self.stage(blk, X, pos, kv, torch.tensor(ids))
            stage_out.append(X.clone())
        h = self.head_hidden(X)
        base = rms_norm(h, self.w["norm"], self.eps) @ self.m.head.T
        return dict(P0=P0, ids=ids, positions=pos, ctx_positions=ctx_pos, aux=aux[ctx_pos], main_x=mx,
                    ctx_kv=torch.stack(ctx_kv), stage_out=torch.stack(stage_out), head_hidden=h,
                    base_logits=base, router_gap=self.gaps["router"],
                    **sequential_drafts(self.w, h, base, bonus))


# ---------------------------------------------------------------- goldens

def main():
    torch.set_num_threads(os.cpu_count() or 1)
    target_dir = os.path.join(GOLDEN, TARGET, "official")
    check_plain(TARGET, target_dir, json.load(open(os.path.join(GOLDEN, TARGET, "golden.json"))))
    out_root = os.path.join(GOLDEN, CONFIG)
    cfg, files = write_checkpoint(target_dir, os.path.join(out_root, "official"))
    target = Target(os.path.join(out_root, "official"))
    ds = DSparkV4(target.model(), cfg)

    meta_head = {
        "config": CONFIG,
        "target": TARGET,
        "dspark_config": {k: cfg[k] for k in list(DSPARK_FIELDS) + ["compress_ratios", "num_nextn_predict_layers"]},
        "stages": STAGES,
        "dspark_checkpoint": "official/dspark.safetensors",
        "dspark_tensors": {k: [v[0], v[1]] for k, v in files.items()},
    }
    notes = {
        "X.aux": "[ctx, 3D] mean-over-hc streams AFTER the target layers, context rows",
        "X.head_hidden": "[block, D] the drafter's hc_head collapse, before norm",
    }
    record(target, ds, cfg["vocab_size"], out_root, meta_head, notes, PROMPT_SEED)


if __name__ == "__main__":
    main()
