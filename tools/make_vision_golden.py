#!/usr/bin/env python3
"""Goldens for the DeepSeek-V4 (Vision-Exp) and V4.1 vision towers: preprocessing, ViT,
aligner and the image span, on tiny random towers bolted onto the tiny text checkpoints.

Run by hand (outputs are committed under tests/fixtures/vision/):

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy pillow
    /tmp/venv/bin/python tools/make_vision_golden.py

The tower, its preprocessing and the span layouts are golden/vision.py, whose docstring says
which vLLM 0.33.0 source each part follows. Canvases come from the installed Pillow (the
goldens were made with Pillow 13.0.0); the maker checks golden/vision.py's numpy restatement of
Pillow's BICUBIC resample and ImageOps.pad against it byte for byte, on the fixture images and
on a sweep of sizes, and fails if they differ.

tiny-v4 sits on tiny-c; tiny-v41 on tiny-v41-b (image token 299 inside its vocabulary, so a
span's positions are real token ids). tools/make_vision_decoder_golden.py, run after this
maker, adds tiny-v41's decoder goldens with images (decoder_golden.{json,safetensors}).

Per config, tests/fixtures/vision/<name>/ holds:
  - model/config.json: the base text checkpoint's config plus the vision fields (flat `vision_*` for
    V4, a nested `vision_config` for V4.1); the base checkpoint's shards as relative links;
  - model/vision.safetensors: the tower's weights under the HF names (BF16; image_* vectors F32);
  - vision_golden.safetensors, per image k: image{k}.rgb u8 [h,w,3] (the source),
    image{k}.canvas u8 [bh,bw,3] (after resize/pad), image{k}.embed / .block0 / .vit f32
    [n_vit, dim] (patch embed, after block 0, after the final norm), image{k}.aligner f32
    [n_llm_h·n_llm_w, hidden] (row-major cell order), image{k}.span f32 [span_len, hidden]
    (the pad-free span in prompt order), image{k}.types i64 [span_len] and, for V4,
    image{k}.perm i64 [n_llm_h·n_llm_w] (aligner row of each IMAGE slot);
  - vision_golden.json: the sizes, grids, canvas path and resize branches of every image, and
    for V4 the block types at start positions 0..3 (with the compressor pad).
tests/fixtures/vision/resample_golden.safetensors holds Pillow's resize and pad of small random
images to random sizes (case{i}.src, case{i}.resize, case{i}.pad), for the resampler alone.
The source images are also written as PNGs under tests/fixtures/vision/images/ (for server
tests; the goldens' rgb tensors are the same pixels).
"""

import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden import vision as V  # noqa: E402
from golden.paths import GOLDEN, ROOT  # noqa: E402
from golden.storage import dump_json, raw, write_safetensors  # noqa: E402

OUT = os.path.join(ROOT, "tests", "fixtures", "vision")
IMAGES = os.path.join(OUT, "images")
IMAGE_SEED = 4242

# (width, height) of the source images, shared by both configs; which branch each takes is in
# the printed table and vision_golden.json.
SOURCES = [
    (40, 30),    # under min_pixels: scaled up; pad path
    (75, 61),    # odd size, fits the budget: pad path
    (300, 220),  # too many tokens: V4's shrinking loop, V4.1's single solve (aspect branch)
    (600, 30),   # very wide: V4's two-row branch; V4.1 clamps to 3:1, scales up, stretches
    (20, 700),   # very tall: the single-column branch of both
    (500, 100),  # wide: V4 shrinks (aspect); V4.1 clamps to 3:1 and stretches (downscale)
    (400, 127),  # V4.1: clamped to 381x127, then too many tokens: a solve on the exact 3:1
                 # aspect (max_w_float 9.0, max_h_float 3.0, two equal betas); V4 shrinks
]

SIZES = dict(n_layers=2, dim=32, n_heads=2, inter_dim=48, patch_size=14, rope_theta=10000.0,
             downsample_ratio=3, max_n_token=32, min_pixels=3136)

CONFIGS = {
    "tiny-v4": dict(version="v4", base="tiny-c", max_wh_ratio=None, seed=404,
                    links=["model.safetensors", "mtp.safetensors"]),
    # tiny-v41-b keeps its image token (299) inside the vocabulary, so a span's positions hold
    # a real token id (bias_vl routing, dead Engram positions) for the decoder goldens.
    "tiny-v41": dict(version="v41", base="tiny-v41-b", max_wh_ratio=3.0, seed=414,
                     links=["model.safetensors", "tokenizer.json"]),
}

TYPE_NAMES = {
    "v4": ["IMAGE_START", "IMAGE_PAD", "IMAGE", "IMAGE_NEW_LINE", "IMAGE_END"],
    "v41": ["IMAGE_START", "IMAGE", "IMAGE_NEW_LINE", "IMAGE_END"],
}


def make_image(rng, w, h):
    """uint8 [h, w, 3]: smooth gradients and a ripple, mild noise, then sharp-edged shapes
    (a saturated bar, a black/white checker, a diagonal) so resampling overshoots and clips."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    u, v = x / max(w - 1, 1), y / max(h - 1, 1)
    img = np.stack([
        40 + 180 * u,
        30 + 200 * v,
        128 + 90 * np.sin(2 * np.pi * (1.5 * u + 0.7 * v)),
    ], axis=-1)
    img += rng.normal(0, 6, img.shape)
    x0, x1 = int(0.15 * w), max(int(0.35 * w), int(0.15 * w) + 2)
    img[:, x0:x1, 0] = 255
    img[:, x0:x1, 1:] = 0
    cy0, cy1 = int(0.55 * h), max(int(0.85 * h), int(0.55 * h) + 2)
    cx0, cx1 = int(0.55 * w), max(int(0.9 * w), int(0.55 * w) + 2)
    cell = max(2, min(w, h) // 8)
    yy, xx = np.mgrid[cy0:cy1, cx0:cx1]
    img[cy0:cy1, cx0:cx1] = np.where((((yy // cell) + (xx // cell)) % 2 == 0)[..., None], 255.0, 0.0)
    diag = np.abs(u - v) < 0.02
    img[diag] = [10, 250, 10]
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def write_pngs(images):
    from PIL import Image

    os.makedirs(IMAGES, exist_ok=True)
    names = []
    for rgb in images:
        h, w, _ = rgb.shape
        name = f"src_{w}x{h}.png"
        Image.fromarray(rgb, "RGB").save(os.path.join(IMAGES, name), optimize=True)
        names.append(name)
    return names


def link(out_dir, target_dir, name):
    path = os.path.join(out_dir, name)
    if os.path.lexists(path):
        os.remove(path)
    os.symlink(os.path.relpath(os.path.join(target_dir, name), out_dir), path)


def check_resampler(rng):
    """golden/vision.py's Pillow restatement against Pillow itself, over a sweep of sizes
    (up/down scaling on each axis, one-pass and two-pass, pads on either axis)."""
    n = 0
    for i in range(80):
        w, h = int(rng.integers(1, 90)), int(rng.integers(1, 90))
        ow, oh = int(rng.integers(1, 90)), int(rng.integers(1, 90))
        if i % 4 == 1:
            ow = w
        elif i % 4 == 2:
            oh = h
        elif i % 8 == 3:  # tall sources shrunk hard: the vertical-first order
            h, oh = int(rng.integers(120, 400)), int(rng.integers(1, 40))
        rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        pl = {"best_width": ow, "best_height": oh}
        for path in ("stretch", "pad"):
            pl["path"] = path
            a, b = V.canvas_pil(rgb, pl), V.canvas_port(rgb, pl)
            assert a.shape == b.shape and (a == b).all(), (w, h, ow, oh, path)
            n += 1
    return n


def write_resample_sweep(rng, cases=48):
    """Pillow's own resize and pad of small random images to random sizes, for the Rust
    resampler to match byte for byte (shapes are in the safetensors header): case{i}.src
    [h,w,3], case{i}.resize and case{i}.pad [oh,ow,3] (grey 127 around a contained resize)."""
    out = {}
    for i in range(cases):
        w, h = int(rng.integers(1, 40)), int(rng.integers(1, 40))
        ow, oh = int(rng.integers(1, 40)), int(rng.integers(1, 40))
        if i % 4 == 1:
            ow = w
        elif i % 4 == 2:
            oh = h
        elif i % 8 == 3:  # tall sources shrunk hard: the vertical-first order
            w, h, oh = int(rng.integers(1, 12)), int(rng.integers(100, 160)), int(rng.integers(1, 30))
        rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        pl = {"best_width": ow, "best_height": oh}
        out[f"case{i}.src"] = raw(torch.from_numpy(rgb), "U8")
        for path in ("resize", "pad"):
            pl["path"] = "stretch" if path == "resize" else "pad"
            out[f"case{i}.{path}"] = raw(torch.from_numpy(np.ascontiguousarray(V.canvas_pil(rgb, pl))), "U8")
    write_safetensors(os.path.join(OUT, "resample_golden.safetensors"), out)


def check_block(types, perm, n_llm_h, n_llm_w):
    """V4 block layout, restated with tensor views (pairs of rows, column-major inside a pair)."""
    row = n_llm_w + 1
    rows = n_llm_h + n_llm_h % 2
    grid = torch.full((rows, row), V.V4_PAD)
    grid[:n_llm_h] = V.V4_NEWLINE
    grid[:n_llm_h, :n_llm_w] = V.V4_IMAGE
    idx = torch.full((rows, row), -1)
    idx[:n_llm_h, :n_llm_w] = torch.arange(n_llm_h * n_llm_w).view(n_llm_h, n_llm_w)
    walk = lambda t: t.view(rows // 2, 2, row).transpose(1, 2).reshape(-1)  # noqa: E731
    body = walk(grid)
    p = walk(idx)
    pad_last = (rows // 2 * row) % 2 * 2
    want = torch.cat([torch.tensor([V.V4_START]), body, torch.full((pad_last,), V.V4_PAD),
                      torch.tensor([V.V4_END])])
    assert torch.equal(types, want), (types, want)
    assert torch.equal(perm, p[p >= 0])
    assert torch.equal(perm.sort().values, torch.arange(n_llm_h * n_llm_w)), "perm is not a permutation"


def check_aligner(vc, w, x, nh, nw, rows):
    """The reshape-based merge against F.unfold on the padded grid."""
    r = vc.downsample_ratio
    g = x.view(nh, nw, -1).permute(2, 0, 1)
    g = F.pad(g, (0, -nw % r, 0, -nh % r))
    cells = F.unfold(g.unsqueeze(0), r, stride=r).squeeze(0).transpose(0, 1)
    ref = F.linear(F.gelu(F.linear(cells, w["aligner.w1.weight"], w["aligner.w1.bias"])),
                   w["aligner.w2.weight"], w["aligner.w2.bias"])
    assert torch.allclose(ref, rows, atol=1e-5, rtol=1e-5)


def check_vit(vc, w, patches, nh, nw, out):
    """golden/vision.py's ViT against a second phrasing: the RoPE angles from a stacked
    (row, column) grid, rotation on explicit halves, torch's SDPA."""
    rd = vc.head_dim // 2
    f = 1.0 / (vc.rope_theta ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    pos = torch.stack(torch.meshgrid(torch.arange(nh), torch.arange(nw), indexing="ij"), dim=-1)
    ang = (pos.reshape(-1, 2, 1).float() * f).flatten(1)[:, None, :]
    cos, sin = ang.cos(), ang.sin()

    def rot(t):
        half = t.shape[-1] // 2
        a, b = t[..., :half], t[..., half:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    def norm(t, wt):
        return wt * t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)

    pe = "vision.patch_embed.proj"
    x = patches.reshape(nh * nw, -1) @ w[f"{pe}.weight"].T + w[f"{pe}.bias"]
    n, D, H = x.shape[0], vc.dim, vc.n_heads
    for i in range(vc.n_layers):
        b = f"vision.blocks.{i}"
        h = norm(x, w[f"{b}.norm1.weight"])
        qkv = h @ w[f"{b}.attn.wqkv.weight"].T + w[f"{b}.attn.wqkv.bias"]
        q, k, v = (t.reshape(n, H, -1) for t in qkv.chunk(3, dim=-1))
        q, k, v = rot(q).transpose(0, 1), rot(k).transpose(0, 1), v.transpose(0, 1)
        o = F.scaled_dot_product_attention(q, k, v)
        x = x + o.transpose(0, 1).reshape(n, D) @ w[f"{b}.attn.wo.weight"].T + w[f"{b}.attn.wo.bias"]
        h = norm(x, w[f"{b}.norm2.weight"]) @ w[f"{b}.mlp.w1.weight"].T
        x = x + (F.silu(h[:, :vc.inter_dim]) * h[:, vc.inter_dim:]) @ w[f"{b}.mlp.w2.weight"].T
    x = norm(x, w["vision.norm.weight"])
    assert torch.allclose(x, out, atol=1e-4, rtol=1e-4), (x - out).abs().max()


def make(name, spec, images, png_names):
    base_dir = os.path.join(GOLDEN, spec["base"], "official")
    out_dir = os.path.join(OUT, name)
    # The checkpoint (config, linked text shards, tower) apart from the goldens: a loader
    # reads every safetensors file of its directory.
    model_dir = os.path.join(out_dir, "model")
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(base_dir, "config.json")) as f:
        base = json.load(f)
    hidden = base["hidden_size"] if spec["version"] == "v4" else base["text_config"]["hidden_size"]
    vc = V.VisionConfig(**SIZES, max_wh_ratio=spec["max_wh_ratio"], hidden_size=hidden,
                        version=spec["version"])
    cfg = V.add_to_config(base, vc)
    assert V.read_config(cfg, vc.version) == vc
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    for stale in os.listdir(model_dir):  # links to a former base (a loader reads them all)
        if os.path.islink(os.path.join(model_dir, stale)) and stale not in spec["links"]:
            os.remove(os.path.join(model_dir, stale))
    for shard in spec["links"]:
        assert os.path.exists(os.path.join(base_dir, shard)), shard
        link(model_dir, base_dir, shard)

    w, files = V.draw_weights(vc, spec["seed"])
    write_safetensors(os.path.join(model_dir, "vision.safetensors"), files)

    golden = {}
    meta = {"config": name, "version": vc.version, "vision": {k: v for k, v in vars(vc).items()},
            "type_names": TYPE_NAMES[vc.version], "images": []}
    print(f"{name}:")
    for k, (rgb, png) in enumerate(zip(images, png_names)):
        r = V.encode(vc, w, rgb)
        pl = r["plan"]
        assert (V.canvas_port(rgb, pl) == r["canvas"]).all(), f"resampler port differs on image {k}"
        nh, nw, lh, lw = pl["n_vit_h"], pl["n_vit_w"], pl["n_llm_h"], pl["n_llm_w"]
        check_vit(vc, w, r["patches"], nh, nw, r["vit"])
        check_aligner(vc, w, r["vit"], nh, nw, r["aligner"])
        assert r["aligner"].shape == (lh * lw, hidden)
        assert len(r["types"]) == pl["span_len"] == r["span"].shape[0]
        entry = {"name": png, **{k2: pl[k2] for k2 in (
            "width", "height", "best_width", "best_height", "n_vit_h", "n_vit_w", "n_llm_h",
            "n_llm_w", "span_len", "path", "clamped", "upscaled", "solves")}}
        if pl["path"] == "pad":  # ImageOps.contain's size and where pad pastes it
            bw, bh = pl["best_width"], pl["best_height"]
            tw, th = V.pil_contain_size(pl["width"], pl["height"], (bw, bh))
            entry["contain"] = [tw, th]
            entry["paste"] = [round((bw - tw) * 0.5) if tw != bw else 0,
                              round((bh - th) * 0.5) if tw == bw else 0]
        if vc.version == "v4":
            row = lw + 1
            formula = lh * row + 2 + (lh % 2) * row + (lh + 1) // 2 * row % 2 * 2
            assert pl["span_len"] == formula
            check_block(r["types"], r["perm"], lh, lw)
            assert pl["span_len"] + V.COMPRESS_PAD_TO - 1 <= vc.max_n_token
            starts = []
            for s in range(V.COMPRESS_PAD_TO):
                emb, t, perm = V.span_v4(w, r["aligner"], lh, lw, start_pos=s)
                lead = V.COMPRESS_PAD_TO - 1 - s
                assert torch.equal(t[lead:], r["types"]) and (t[:lead] == V.V4_PAD).all()
                assert torch.equal(emb[lead:], r["span"]) and torch.equal(perm, r["perm"])
                assert len(t) <= vc.max_n_token
                starts.append(t.tolist())
            entry["blocks_at_start"] = starts
            golden[f"image{k}.perm"] = raw(r["perm"], "I64")
        else:
            assert pl["span_len"] == lh * (lw + 1) + 2 <= vc.max_n_token
            assert torch.equal(r["span"][r["types"] == V.V41_IMAGE], r["aligner"])
        golden[f"image{k}.rgb"] = raw(torch.from_numpy(rgb), "U8")
        golden[f"image{k}.canvas"] = raw(torch.from_numpy(r["canvas"]), "U8")
        golden[f"image{k}.embed"] = raw(r["embed"], "F32")
        golden[f"image{k}.block0"] = raw(r["blocks"][0], "F32")
        golden[f"image{k}.vit"] = raw(r["vit"], "F32")
        golden[f"image{k}.aligner"] = raw(r["aligner"], "F32")
        golden[f"image{k}.span"] = raw(r["span"], "F32")
        golden[f"image{k}.types"] = raw(r["types"], "I64")
        meta["images"].append(entry)
        print(f"  image{k} {pl['width']}x{pl['height']} -> {pl['best_width']}x{pl['best_height']} "
              f"{pl['path']:7s} vit {nh}x{nw} llm {lh}x{lw} span {pl['span_len']:2d} "
              f"clamped={pl['clamped']} upscaled={pl['upscaled']} solves={pl['solves']} "
              f"|vit| {r['vit'].abs().max():.2f} |aligner| {r['aligner'].abs().max():.2f}")
    write_safetensors(os.path.join(out_dir, "vision_golden.safetensors"), golden)
    dump_json(meta, os.path.join(out_dir, "vision_golden.json"))


def main():
    rng = np.random.default_rng(IMAGE_SEED)
    images = [make_image(rng, w, h) for w, h in SOURCES]
    print(f"resampler port matches Pillow on {check_resampler(np.random.default_rng(7))} sweeps")
    write_resample_sweep(np.random.default_rng(11))
    png_names = write_pngs(images)
    for name, spec in CONFIGS.items():
        make(name, spec, images, png_names)


if __name__ == "__main__":
    main()
