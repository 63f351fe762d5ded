#!/usr/bin/env python3
"""Add a random MTP (multi-token-prediction) draft block to the tiny golden checkpoints and
record what it computes, in HF transformers' float32 numerics.

Run by hand, AFTER tools/make_golden.py (which rewrites the configs and the tiny-a index and
would drop what this script adds); outputs are committed:

    /work/venv/bin/python tools/make_mtp_golden.py [tiny-a tiny-b tiny-c]

For every config (tests/fixtures/golden/tiny-X/) it
  * draws the `mtp.0.*` weights (seeded; the distributions of golden/hf_v4.py's build_model)
    and rounds each onto its official storage format (FP8 e4m3 + E8M0 128x128 scales, FP4 e2m1
    experts + E8M0 1x32 scales, BF16 norms/gate, F32 mHC/sinks/bias; golden/layout.py), so the
    stored values are exactly what the reference computes with;
  * writes them, with their official names and formats, to official/mtp.safetensors and to
    hf/mtp.safetensors (HF 5.23 has no name for V4 MTP tensors: its DeepseekV4 model ignores
    `mtp.*` on load); adds them to official/model.safetensors.index.json where that exists;
    for tiny-b's official layout also writes the duplicate `mtp.0.emb.tok_emb.weight` (bytes of
    `embed.weight`) and `mtp.0.head.weight` (bytes of `head.weight`) that some real checkpoints
    carry; sets `num_nextn_predict_layers` (HF config and shipped-style official config) /
    `n_mtp_layers` (ModelArgs-style official config) to 1 and gives `compress_ratios` its
    trailing MTP entry 0 where it lacks one;
  * records mtp_golden.safetensors + mtp_golden.json (see FORMAT below).

Sources followed (see notes/mtp.md for file/line references):
  [OFF]  DeepSeek's V4 inference/model.py `MTPBlock`: e = enorm(embed(tok)); x = hnorm(h)
         (per stream); x = e_proj(e)[:, :, None] + h_proj(x); x = Block(x); logits =
         head(norm(hc_head_mtp(x))). Layer id n_layers, compress_ratios[n_layers] = 0, so
         sliding-window attention with plain rope (rope_theta, no YaRN) and a scored (non-hash)
         gate. Embedding and head are the main model's. No special case at position 0.
  [VLLM] vLLM 0.33 deepseek_v4/nvidia/mtp.py: same wiring; h = target's final streams before
         hc_head; k>1 drafts chain the MTP block's own pre-hc_head output streams as the next
         h, one position further on; it ZEROES the token embedding at position 0 (recorded
         here as a variant, `mtp_logits_pos0_zeroed`).
  [HF]   transformers 5.23 modules for everything numeric: DeepseekV4DecoderLayer (the block,
         instantiated at layer index num_hidden_layers of a config extended by one
         sliding_attention/moe layer), DeepseekV4RMSNorm (enorm/hnorm/norm),
         DeepseekV4HyperHead (the MTP hc_head), nn.Linear in float32 on dequantised weights
         (e_proj/h_proj), the main model's rotary embedding ("main" table) and HF's sliding
         window causal mask. Our Rust engine matches HF float32 numerics for V4.

FORMAT of mtp_golden.safetensors (T = prompt length, hc = hc_mult, D = hidden, V = vocab,
K = CHAIN drafts):
  prompt_ids       I64 [T]        x_0 .. x_{T-1}
  next_token       I64 [1]        HF's greedy target token x_T after the prompt
  hidden           F32 [T,hc,D]   target model's final residual streams (before hc_head)
  mtp_logits       F32 [T,V]      MTP logits at positions t = 0..T-1; position t takes
                                  (hidden[t], x_{t+1}), x_T = next_token; whole prompt in one
                                  causal pass through the MTP block (own sliding window)
  mtp_hidden       F32 [T,hc,D]   the MTP block's output streams (before its hc_head)
  chain_tokens     I64 [K]        d_1 = argmax mtp_logits[T-1]; d_{i+1} = argmax chain_logits[i-1]
  chain_logits     F32 [K-1,V]    draft step i = 1..K-1 at position T-1+i with inputs
                                  (MTP output streams of the previous position, d_i), attending
                                  to the MTP window over positions 0..T-1+i (drafts' KV included)
  mtp_logits_pos0_zeroed F32 [min(T,W),V]  vLLM variant: the token embedding is zeroed at
                                  position 0 (before enorm); rows t >= W (window) equal
                                  mtp_logits and are not stored; the chain is unaffected
                                  (all chain positions are >= W)
mtp_golden.json: prompt length, window, margins (top1 - top2) of every argmax used, the
argmax and margin of mtp_logits at every position, top-k selection gaps (main model router /
indexer, MTP router), tie_safe, seeds, and the source choices.
"""

import hashlib
import json
import math
import os
import sys

import torch
import torch.nn as nn

from safetensors import safe_open
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.masking_utils import create_sliding_window_causal_mask
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mdl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# golden.hf_v4 also registers the "softmax" router activation tiny-c uses.
from golden.hf_v4 import CONFIGS, TIE_GAP, GapRecorder, build_model  # noqa: E402
from golden.layout import official_name_and_format, round_onto_format  # noqa: E402
from golden.paths import GOLDEN as OUT  # noqa: E402
from golden.read import decode_official, dequant_fp8  # noqa: E402
from golden.storage import raw, write_safetensors  # noqa: E402

CHAIN = 4  # K: draft tokens per chain (d_1 from the prompt pass, then K-1 chained steps)
PROMPT_LEN = {"tiny-a": 37, "tiny-b": 40, "tiny-c": 37}
RETRIES = 6
MTP_SEED_OFFSET = 100     # build_model seed for the MTP block weights: 100 + config seed
EXTRA_SEED_OFFSET = 200   # e_proj/h_proj/enorm/hnorm: generator seed 200 + config seed
PROMPT_SEED_OFFSET = 3000  # prompt ids: generator seed 3000 + config seed


# ---------------------------------------------------------------- loading the target model

def load_target(out_dir):
    """The committed HF-layout checkpoint as a float32 DeepseekV4ForCausalLM.

    `from_pretrained` cannot be used as is: hf/config.json carries no quantization_config, so
    transformers would load the FP8 codes as plain numbers and drop the `weight_scale_inv`
    tensors. Build the model from that config and dequantise by hand instead (codes x scale is
    exact in f32), which reproduces the values make_golden.py ran on."""
    hf_dir = os.path.join(out_dir, "hf")
    config = DeepseekV4Config.from_pretrained(hf_dir)
    config._attn_implementation = "eager"
    model = DeepseekV4ForCausalLM(config).eval().to(torch.float32)
    sd = {}
    with safe_open(os.path.join(hf_dir, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        for k in keys:
            if k.endswith(".weight_scale_inv"):
                continue
            t = f.get_tensor(k)
            if t.dtype == torch.float8_e4m3fn:
                t = dequant_fp8(t, f.get_tensor(k[: -len(".weight")] + ".weight_scale_inv"))
            elif t.is_floating_point():
                t = t.to(torch.float32)
            else:
                t = t.to(torch.int64)
            sd[k] = t
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary_emb" in m for m in missing), (missing, unexpected)
    return model


def check_target_against_golden(model, out_dir):
    """The loaded model must reproduce make_golden.py's recorded logits (prompt 1)."""
    meta = json.load(open(os.path.join(out_dir, "golden.json")))
    p = meta["prompts"][1]
    with safe_open(os.path.join(out_dir, "golden.safetensors"), "pt") as g:
        ref = g.get_tensor("p1.last_logits")
    with torch.no_grad():
        out = model(input_ids=torch.tensor([p["ids"]]), use_cache=False).logits[0, -1]
    diff = (out - ref).abs().max().item()
    assert diff < 1e-4, f"loaded target disagrees with golden.safetensors p1 by {diff}"
    return diff


# ---------------------------------------------------------------- MTP weights

def mtp_hf_config(target_config):
    """Target config extended by one layer (index num_hidden_layers): sliding attention,
    scored MoE — what compress_ratios[n_layers] = 0 and n_hash_layers < n_layers give [OFF]."""
    d = target_config.to_dict()
    n = d["num_hidden_layers"]
    d["num_hidden_layers"] = n + 1
    d["layer_types"] = list(d["layer_types"][:n]) + ["sliding_attention"]
    d["mlp_layer_types"] = list(d["mlp_layer_types"][:n]) + ["moe"]
    cfg = DeepseekV4Config.from_dict(d)
    # Same attention/experts implementations as the target model's layers (a standalone
    # layer would otherwise fall back to the experts' plain loop: other summation order).
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = target_config._experts_implementation
    assert cfg.layer_types[n] == "sliding_attention" and cfg.mlp_layer_types[n] == "moe"
    return cfg, n


class MtpReference(nn.Module):
    """The MTP draft block. Wiring [OFF] MTPBlock.forward / [VLLM]
    DeepSeekV4MultiTokenPredictorLayer.forward; numerics [HF] float32 modules."""

    def __init__(self, target, mcfg, layer_idx):
        super().__init__()
        d = mcfg.hidden_size
        self.cfg = mcfg
        self.layer_idx = layer_idx
        # [HF] the decoder block itself, at layer index n_layers of the extended config.
        self.block = mdl.DeepseekV4DecoderLayer(mcfg, layer_idx)
        assert self.block.self_attn.compressor is None  # sliding window only
        assert self.block.self_attn.rope_layer_type == "main"  # rope_theta, no YaRN
        assert isinstance(self.block.mlp.gate, mdl.DeepseekV4TopKRouter)  # scored, not hash
        # [OFF] MTPBlock's own params: enorm, hnorm, e_proj, h_proj, norm, hc_head_{fn,base,scale}
        self.enorm = mdl.DeepseekV4RMSNorm(d, eps=mcfg.rms_norm_eps)
        self.hnorm = mdl.DeepseekV4RMSNorm(d, eps=mcfg.rms_norm_eps)
        self.e_proj = nn.Linear(d, d, bias=False)
        self.h_proj = nn.Linear(d, d, bias=False)
        self.norm = mdl.DeepseekV4RMSNorm(d, eps=mcfg.rms_norm_eps)
        self.hc_head = mdl.DeepseekV4HyperHead(mcfg)
        # [OFF] embed and head are shared with the main model (Transformer.__init__ sets
        # mtp.embed = self.embed, mtp.head = self.head); rope table = the main model's "main".
        self._target = [target]  # not a submodule

    @torch.no_grad()
    def forward(self, h, tokens, positions, zero_pos0=False):
        """h [1,S,hc,D] (target or previous-MTP streams), tokens [1,S] (the token after each
        position), positions [1,S]. Returns (output streams [1,S,hc,D], logits [1,S,V])."""
        target = self._target[0]
        e = target.model.embed_tokens(tokens)
        if zero_pos0:  # [VLLM] fused_mtp_input_rmsnorm: torch.where(positions == 0, 0, embeds)
            e = torch.where(positions[..., None] == 0, torch.zeros_like(e), e)
        # [OFF] e = enorm(e); x = hnorm(x) (RMSNorm over D, each stream);
        #       x = e_proj(e).unsqueeze(2) + h_proj(x)
        x = self.e_proj(self.enorm(e)).unsqueeze(2) + self.h_proj(self.hnorm(h))
        mask = create_sliding_window_causal_mask(
            config=self.cfg, inputs_embeds=e, attention_mask=None, past_key_values=None,
            position_ids=positions)
        check_window_mask(mask, positions.shape[1], self.cfg.sliding_window)
        rot = target.model.rotary_emb
        pe = {"main": rot(e, position_ids=positions, layer_type="main"),
              "compress": rot(e, position_ids=positions, layer_type="compress")}
        # [OFF] x = super().forward(x, start_pos, input_ids)  ([HF] DeepseekV4DecoderLayer)
        out = self.block(x, position_embeddings=pe, position_ids=positions, attention_mask=mask,
                         input_ids=tokens, past_key_values=None)
        # [OFF] logits = self.head(x, hc_head_fn, hc_head_scale, hc_head_base, self.norm):
        #       own hc_head + own norm + the shared head (all positions here, not only the last)
        logits = target.lm_head(self.norm(self.hc_head(out)))
        return out, logits


def check_window_mask(mask, s, w):
    """HF's mask must be the sliding causal window: query t sees keys max(0,t-W+1)..t."""
    assert isinstance(mask, torch.Tensor), type(mask)
    visible = torch.isfinite(mask[0, 0]) & (mask[0, 0] == 0)
    t = torch.arange(s)[:, None]
    j = torch.arange(s)[None, :]
    assert torch.equal(visible, (j <= t) & (j > t - w)), "unexpected attention mask"


def build_mtp(target, cfg_entry, n_layers_main):
    """Draw, round and load the MTP weights. Returns (MtpReference, official tensors)."""
    mcfg, n = mtp_hf_config(target.config)
    assert n == n_layers_main
    # The block (layer n), the MTP hc_head and the MTP norm are drawn by golden.hf_v4.build_model
    # itself on the extended config, so they follow its distributions exactly (matrices
    # N(0,0.05), sinks N(0,1), hc fn N(0,0.05) / base N(0,0.3) / scale U(0.5,1.5), norms
    # N(1,0.1), experts and shared experts N(0,0.06), router weight N(0,0.15), router bias
    # N(0,0.1)); only layer n, model.hc_head and model.norm of that throwaway model are used.
    hf_ext = dict(cfg_entry["hf"])
    hf_ext.update(num_hidden_layers=n + 1,
                  layer_types=list(hf_ext["layer_types"]) + ["sliding_attention"],
                  mlp_layer_types=list(hf_ext["mlp_layer_types"]) + ["moe"])
    donor = build_model(dict(seed=MTP_SEED_OFFSET + cfg_entry["seed"], hf=hf_ext))
    donor_sd = donor.state_dict()

    ref = MtpReference(target, mcfg, n).eval().to(torch.float32)
    official = {}
    block_sd = {}
    prefix = f"model.layers.{n}."
    for hf_name, t in donor_sd.items():
        if not hf_name.startswith(prefix):
            continue
        oname, kind = official_name_and_format(hf_name)
        assert oname.startswith(f"layers.{n}.") and kind != "ids", (oname, kind)
        oname = "mtp.0." + oname[len(f"layers.{n}."):]
        block_sd[hf_name[len(prefix):]] = round_onto_format(kind, oname, t.detach().float(), official)
    ref.block.load_state_dict(block_sd, strict=True)

    # MTP-specific tensors. hc_head and norm: the donor's top-level ones (build_model's hc_head
    # and norm distributions). e_proj/h_proj/enorm/hnorm have no counterpart in build_model:
    # drawn like its generic matrices (N(0,0.05)) and norms (N(1,0.1)).
    d = mcfg.hidden_size
    g = torch.Generator().manual_seed(EXTRA_SEED_OFFSET + cfg_entry["seed"])
    drawn = {
        "e_proj.weight": (torch.randn(d, d, generator=g) * 0.05, "fp8"),
        "h_proj.weight": (torch.randn(d, d, generator=g) * 0.05, "fp8"),
        "enorm.weight": (1.0 + 0.1 * torch.randn(d, generator=g), "bf16"),
        "hnorm.weight": (1.0 + 0.1 * torch.randn(d, generator=g), "bf16"),
        "norm.weight": (donor_sd["model.norm.weight"].float(), "bf16"),
        "hc_head_fn": (donor_sd["model.hc_head.hc_fn"].float(), "f32"),
        "hc_head_base": (donor_sd["model.hc_head.hc_base"].float(), "f32"),
        "hc_head_scale": (donor_sd["model.hc_head.hc_scale"].float(), "f32"),
    }
    module_param = {
        "e_proj.weight": ref.e_proj.weight, "h_proj.weight": ref.h_proj.weight,
        "enorm.weight": ref.enorm.weight, "hnorm.weight": ref.hnorm.weight,
        "norm.weight": ref.norm.weight, "hc_head_fn": ref.hc_head.hc_fn,
        "hc_head_base": ref.hc_head.hc_base, "hc_head_scale": ref.hc_head.hc_scale,
    }
    with torch.no_grad():
        for name, (t, kind) in drawn.items():
            module_param[name].copy_(round_onto_format(kind, "mtp.0." + name, t, official))
    return ref, official


# ---------------------------------------------------------------- reference runs

class MtpGap:
    """Smallest top-k boundary gap of the MTP block's router over all runs."""

    def __init__(self, gate):
        self.gap = math.inf
        self.h = gate.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output):
        s = module.score_fn(output[0]) + module.e_score_correction_bias
        top = s.topk(module.top_k + 1, dim=-1).values
        self.gap = min(self.gap, (top[:, module.top_k - 1] - top[:, module.top_k]).min().item())

    def close(self):
        self.h.remove()


def margin(v):
    top = v.topk(2).values
    return (top[0] - top[1]).item()


@torch.no_grad()
def run_case(target, ref, ids):
    t_len = len(ids)
    main_gaps = GapRecorder(target)
    mtp_gap = MtpGap(ref.block.mlp.gate)
    captured = []
    hook = target.model.hc_head.register_forward_pre_hook(lambda m, a: captured.append(a[0].clone()))
    logits = target(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
    hook.remove()
    hidden = captured[0]  # [1,T,hc,D]: final streams before hc_head [VLLM _mtp_hidden_buffer]
    next_token = int(logits[-1].argmax())
    next_margin = margin(logits[-1])

    # Prompt pass: position t takes (hidden[t], x_{t+1}), x_T = next_token.
    shifted = torch.tensor([ids[1:] + [next_token]])
    pos = torch.arange(t_len)[None]
    mtp_hidden, mtp_logits = ref(hidden, shifted, pos)
    _, zeroed_logits = ref(hidden, shifted, pos, zero_pos0=True)
    w = ref.cfg.sliding_window
    assert torch.equal(zeroed_logits[0, w:], mtp_logits[0, w:]), "pos-0 zeroing leaked past the window"

    # Chain: d_1 from position T-1, then K-1 steps at positions T..T+K-2, each fed the MTP
    # output streams of the previous position [VLLM llm_base_proposer]. Full causal recompute
    # over positions 0..T-1+i reproduces attention to the MTP window incl. the drafts' own KV.
    d = [int(mtp_logits[0, -1].argmax())]
    d_margins = [margin(mtp_logits[0, -1])]
    h_seq, tok_seq = hidden, shifted
    prev_out = mtp_hidden[:, -1:]
    chain_logits = []
    for i in range(1, CHAIN):
        h_seq = torch.cat([h_seq, prev_out], dim=1)
        tok_seq = torch.cat([tok_seq, torch.tensor([[d[-1]]])], dim=1)
        p = torch.arange(t_len + i)[None]
        out, lg = ref(h_seq, tok_seq, p)
        prev_out = out[:, -1:]
        chain_logits.append(lg[0, -1])
        d.append(int(lg[0, -1].argmax()))
        d_margins.append(margin(lg[0, -1]))
    main_gaps.close()
    mtp_gap.close()
    mtp_argmax = mtp_logits[0].argmax(dim=-1)
    mtp_margins = [margin(mtp_logits[0, t]) for t in range(t_len)]
    res = dict(
        hidden=hidden[0], next_token=next_token, next_margin=next_margin,
        mtp_logits=mtp_logits[0], mtp_hidden=mtp_hidden[0], zeroed=zeroed_logits[0, :min(t_len, w)],
        chain_tokens=d, chain_margins=d_margins, chain_logits=torch.stack(chain_logits),
        mtp_argmax=mtp_argmax.tolist(), mtp_margins=mtp_margins,
        main_router_gap=main_gaps.router, main_indexer_gap=main_gaps.indexer, mtp_router_gap=mtp_gap.gap,
    )
    for k in ("hidden", "mtp_logits", "mtp_hidden", "zeroed", "chain_logits"):
        assert torch.isfinite(res[k]).all(), k
    return res


# ---------------------------------------------------------------- writing

def update_json(path, mutate, indent):
    """Re-dump a config/index json the way make_golden.py wrote it (same indent, sorted keys,
    no trailing newline), after checking that a plain round trip is byte-identical."""
    text = open(path).read()
    obj = json.loads(text)
    assert json.dumps(obj, indent=indent, sort_keys=True) == text, f"{path}: not in make_golden's format"
    mutate(obj)
    new = json.dumps(obj, indent=indent, sort_keys=True)
    if new != text:
        with open(path, "w") as f:
            f.write(new)


def set_nextn(cname, out_dir, n_layers):
    def hf(c):
        c["num_nextn_predict_layers"] = 1
    update_json(os.path.join(out_dir, "hf", "config.json"), hf, 2)

    def off(c):
        # ModelArgs style (tiny-b) reads n_mtp_layers; the shipped style num_nextn_predict_layers.
        key = "n_mtp_layers" if "n_mtp_layers" in c else "num_nextn_predict_layers"
        c[key] = 1
        ratios = c["compress_ratios"]
        if len(ratios) == n_layers:
            ratios.append(0)  # [OFF] the MTP layer's entry: compress_ratios[n_layers] = 0
        assert len(ratios) == n_layers + 1 and ratios[n_layers] == 0, ratios
    update_json(os.path.join(out_dir, "official", "config.json"), off, 2)


def write_weights(cname, out_dir, official):
    hf_tensors = dict(sorted(official.items()))
    off_tensors = dict(hf_tensors)
    if cname == "tiny-b":
        # Duplicate copies some real checkpoints carry; [OFF] convert.py skips them and the
        # reference shares embed/head; vLLM maps them onto its MTP embed/shared_head.head.
        with safe_open(os.path.join(out_dir, "official", "model.safetensors"), "pt") as f:
            for src, dst in (("embed.weight", "mtp.0.emb.tok_emb.weight"), ("head.weight", "mtp.0.head.weight")):
                t = f.get_tensor(src)
                assert t.dtype == torch.bfloat16
                off_tensors[dst] = raw(t.float(), "BF16")
        off_tensors = dict(sorted(off_tensors.items()))
    write_safetensors(os.path.join(out_dir, "official", "mtp.safetensors"), off_tensors)
    write_safetensors(os.path.join(out_dir, "hf", "mtp.safetensors"), hf_tensors)
    index = os.path.join(out_dir, "official", "model.safetensors.index.json")
    if os.path.exists(index):
        def add(ix):
            wm = ix["weight_map"]
            for k in list(wm):
                if k.startswith("mtp."):
                    del wm[k]
            for k in off_tensors:
                wm[k] = "mtp.safetensors"
        update_json(index, add, 1)
    return sorted(off_tensors)


# ---------------------------------------------------------------- read-back check

@torch.no_grad()
def verify(cname):
    """Rebuild the MTP block from what was written (both layouts) and recompute the goldens
    from the recorded inputs; the numbers must be reproduced exactly."""
    out_dir = os.path.join(OUT, cname)
    target = load_target(out_dir)
    mcfg, n = mtp_hf_config(target.config)
    with safe_open(os.path.join(out_dir, "mtp_golden.safetensors"), "pt") as g:
        gold = {k: g.get_tensor(k) for k in g.keys()}
    hc_names = {"e_proj.weight": "e_proj.weight", "h_proj.weight": "h_proj.weight",
                "enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight", "norm.weight": "norm.weight",
                "hc_head.hc_fn": "hc_head_fn", "hc_head.hc_base": "hc_head_base",
                "hc_head.hc_scale": "hc_head_scale"}
    for layout in ("hf", "official"):
        ref = MtpReference(target, mcfg, n).eval()
        sd = {}
        with safe_open(os.path.join(out_dir, layout, "mtp.safetensors"), "pt") as f:
            keys = set(f.keys())
            for pname in ref.block.state_dict():
                oname, kind = official_name_and_format(f"model.layers.{n}.{pname}")
                oname = "mtp.0." + oname[len(f"layers.{n}."):]
                if kind in ("experts_gate_up", "experts_down"):
                    ws = ["w1", "w3"] if kind == "experts_gate_up" else ["w2"]
                    sd[pname] = torch.stack([
                        torch.cat([decode_official(f, f"{oname}.{e}.{w}.weight") for w in ws], dim=0)
                        for e in range(mcfg.n_routed_experts)])
                else:
                    sd[pname] = decode_official(f, oname)
            ref.block.load_state_dict(sd, strict=True)
            own = {}
            for pname, oname in hc_names.items():
                own[pname] = decode_official(f, "mtp.0." + oname)
            ref.load_state_dict({**own, **{"block." + k: v for k, v in sd.items()}}, strict=True)
            if layout == "official" and cname == "tiny-b":
                with safe_open(os.path.join(out_dir, "official", "model.safetensors"), "pt") as m:
                    assert torch.equal(f.get_tensor("mtp.0.emb.tok_emb.weight"), m.get_tensor("embed.weight"))
                    assert torch.equal(f.get_tensor("mtp.0.head.weight"), m.get_tensor("head.weight"))
            else:
                assert not any(k.startswith(("mtp.0.emb.", "mtp.0.head.")) for k in keys)
        ids = gold["prompt_ids"].tolist()
        t_len = len(ids)
        hidden = gold["hidden"][None]
        shifted = torch.tensor([ids[1:] + gold["next_token"].tolist()])
        out, lg = ref(hidden, shifted, torch.arange(t_len)[None])
        assert torch.equal(lg[0], gold["mtp_logits"]) and torch.equal(out[0], gold["mtp_hidden"]), (cname, layout)
        _, lz = ref(hidden, shifted, torch.arange(t_len)[None], zero_pos0=True)
        assert torch.equal(lz[0, : gold["mtp_logits_pos0_zeroed"].shape[0]], gold["mtp_logits_pos0_zeroed"])
        d = gold["chain_tokens"].tolist()
        assert d[0] == int(lg[0, -1].argmax())
        h_seq, tok_seq, prev = hidden, shifted, out[:, -1:]
        for i in range(1, CHAIN):
            h_seq = torch.cat([h_seq, prev], dim=1)
            tok_seq = torch.cat([tok_seq, torch.tensor([[d[i - 1]]])], dim=1)
            o, l2 = ref(h_seq, tok_seq, torch.arange(t_len + i)[None])
            prev = o[:, -1:]
            assert torch.equal(l2[0, -1], gold["chain_logits"][i - 1]), (cname, layout, i)
            assert d[i] == int(l2[0, -1].argmax())
        # and the target side: hidden / next_token from the committed checkpoint
        captured = []
        hook = target.model.hc_head.register_forward_pre_hook(lambda m, a: captured.append(a[0].clone()))
        logits = target(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
        hook.remove()
        assert torch.equal(captured[0][0], gold["hidden"]) and int(logits[-1].argmax()) == gold["next_token"].item()
    print(f"{cname}: read-back check passed (hf/ and official/ mtp.safetensors reproduce the goldens)")


# The source choices, recorded in mtp_golden.json ([OFF], [VLLM], [HF]: the module docstring).
CHOICES = {
    "input_combine": "X = e_proj(enorm(embed(x_{t+1})))[broadcast over hc] + h_proj(hnorm(h_t)), "
                     "hnorm per stream over D [OFF MTPBlock.forward]",
    "h_input": "target model's final residual streams before hc_head [VLLM, SGL; OFF unspecified]",
    "position_0": "no special case [OFF, SGL] in mtp_logits/mtp_hidden/chain; vLLM zeroes the "
                  "token embedding at position 0: mtp_logits_pos0_zeroed",
    "attention": "sliding window only (no compressor/indexer), window = sliding_window, "
                 "rope 'main' table: rope_theta, no YaRN [OFF compress_ratios[n_layers]=0]",
    "moe": "scored top-k router with gate.bias (not hash) [OFF layer_id >= n_hash_layers]",
    "logits": "shared head(norm_mtp(hc_head_mtp(X))) [OFF ParallelHead.forward]",
    "chain": "step i feeds the MTP output streams of position T-2+i and d_i at position T-1+i "
             "[VLLM llm_base_proposer]",
    "numerics": "HF transformers 5.23 float32 modules (DecoderLayer, RMSNorm, HyperHead, "
                "nn.Linear on dequantised FP8)",
    "hf_layout_names": "official mtp.0.* names and formats in hf/mtp.safetensors "
                       "(HF 5.23 ignores mtp.* and defines no MTP names for V4)",
}


def pick_prompt(target, ref, cname, cfg):
    """Prompts are drawn in turn; the first whose every decision (target argmax, drafts, main
    and MTP routers, main indexer) has a margin above TIE_GAP is kept, else the last one.
    Returns (attempt, ids, run_case's result, tie_safe)."""
    t_len = PROMPT_LEN[cname]
    vocab = target.config.vocab_size
    g = torch.Generator().manual_seed(PROMPT_SEED_OFFSET + cfg["seed"])
    for attempt in range(RETRIES):
        ids = torch.randint(0, vocab, (t_len,), generator=g).tolist()
        r = run_case(target, ref, ids)
        gaps = [r["next_margin"], *r["chain_margins"], r["main_router_gap"], r["main_indexer_gap"],
                r["mtp_router_gap"]]
        tie_safe = min(gaps) > TIE_GAP
        if tie_safe:
            break
    return attempt, ids, r, tie_safe


def write_golden(out_dir, ids, r):
    """mtp_golden.safetensors (FORMAT in the module docstring)."""
    golden = {
        "prompt_ids": raw(torch.tensor(ids), "I64"),
        "next_token": raw(torch.tensor([r["next_token"]]), "I64"),
        "hidden": raw(r["hidden"], "F32"),
        "mtp_logits": raw(r["mtp_logits"], "F32"),
        "mtp_hidden": raw(r["mtp_hidden"], "F32"),
        "chain_tokens": raw(torch.tensor(r["chain_tokens"]), "I64"),
        "chain_logits": raw(r["chain_logits"], "F32"),
        "mtp_logits_pos0_zeroed": raw(r["zeroed"], "F32"),
    }
    write_safetensors(os.path.join(out_dir, "mtp_golden.safetensors"), golden)


def golden_meta(cname, cfg, target, attempt, ids, r, tie_safe, target_diff, names):
    """mtp_golden.json."""
    t_len, n_layers = len(ids), target.config.num_hidden_layers
    fin = lambda x: None if math.isinf(x) else x  # noqa: E731
    return {
        "config": cname,
        "prompt_len": t_len,
        "prompt_attempt": attempt,
        "sliding_window": target.config.sliding_window,
        "chain_len": CHAIN,
        "mtp_layer_index": n_layers,
        "tie_gap": TIE_GAP,
        "tie_safe": tie_safe,
        "next_token": r["next_token"],
        "next_token_margin": r["next_margin"],
        "chain_tokens": r["chain_tokens"],
        "chain_margins": r["chain_margins"],
        "mtp_argmax": r["mtp_argmax"],
        "mtp_argmax_margins": r["mtp_margins"],
        "main_router_gap": fin(r["main_router_gap"]),
        "main_indexer_gap": fin(r["main_indexer_gap"]),
        "mtp_router_gap": fin(r["mtp_router_gap"]),
        "pos0_zeroed_rows": int(min(t_len, target.config.sliding_window)),
        "target_check_vs_golden_p1_maxdiff": target_diff,
        "seeds": {"mtp_block_build_model": MTP_SEED_OFFSET + cfg["seed"],
                  "mtp_extra_generator": EXTRA_SEED_OFFSET + cfg["seed"],
                  "prompt_generator": PROMPT_SEED_OFFSET + cfg["seed"]},
        "mtp_tensors": names,
        "choices": CHOICES,
    }


def main():
    torch.set_num_threads(1)
    only = sys.argv[1:]
    summary = {}
    for cname, cfg in CONFIGS.items():
        if only and cname not in only:
            continue
        out_dir = os.path.join(OUT, cname)
        target = load_target(out_dir)
        n_layers = target.config.num_hidden_layers
        target_diff = check_target_against_golden(target, out_dir)
        ref, official = build_mtp(target, cfg, n_layers)
        attempt, ids, r, tie_safe = pick_prompt(target, ref, cname, cfg)
        set_nextn(cname, out_dir, n_layers)
        names = write_weights(cname, out_dir, official)
        write_golden(out_dir, ids, r)
        meta = golden_meta(cname, cfg, target, attempt, ids, r, tie_safe, target_diff, names)
        with open(os.path.join(out_dir, "mtp_golden.json"), "w") as f:
            json.dump(meta, f, indent=1)
        summary[cname] = {k: meta[k] for k in ("prompt_attempt", "tie_safe", "next_token_margin", "chain_tokens",
                                               "chain_margins", "main_router_gap", "main_indexer_gap",
                                               "mtp_router_gap", "target_check_vs_golden_p1_maxdiff")}
        print(cname, json.dumps(summary[cname]))
    for cname in summary:
        verify(cname)
    for cname in summary:
        out_dir = os.path.join(OUT, cname)
        for rel in ("mtp_golden.safetensors", "official/mtp.safetensors", "hf/mtp.safetensors"):
            with open(os.path.join(out_dir, rel), "rb") as f:
                print(f"  {cname}/{rel} sha256 {hashlib.sha256(f.read()).hexdigest()[:16]}")


if __name__ == "__main__":
    main()
