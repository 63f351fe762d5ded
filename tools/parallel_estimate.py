#!/usr/bin/env python3
"""On paper: a V4 model split over N machines the way `mpirun -n N deepinfer ...
--enable-expert-parallel` splits it (tensor parallel on, the default), at decode batch 1.

Per token it counts, from the checkpoint's shapes and stored formats (FP8 dense weights with
128x128 E8M0 scales, FP4 routed experts with 1x32 scales, BF16 head/compressors/gate, F32
mHC), the bytes each rank reads, the collectives and the bytes through rank 0's link, and
turns them into tokens/s for a stated memory bandwidth per machine, network bandwidth and
per-collective latency. Rank 0 is the critical path: it reads its share of the split
weights plus everything not split (wq_a, wkv, compressors, indexer, router, mHC), and the
attention core runs there while the others wait; each layer's MoE waits for the rank with
the most of the token's picks.

With --prefill-gflops it estimates context parallelism instead (`--context-parallel-size N`,
crates/engine/src/dist/context/): one prompt's prefill split into N ranges, one machine each
at that many GFLOP/s, a pipeline over the layers (rank r runs layer l while rank r+1 runs
l-1: N-1 layers of fill), each layer handing the next range the state before it (the last
window rows, every compressed entry and indexer key so far, in f32) and the last rank
handing rank 0 the later ranges' state; and prints, per prompt length, one machine against N.

The shapes are the config.json values in docs/MODEL.md §1.1 (V4-Flash, V4-Pro); the protocol is
crates/model/src/parallel/protocol.rs. Usage:

    tools/parallel_estimate.py --model flash --ranks 2 --mem-gbs 200 --net-gbs 12.5 --lat-us 20
    tools/parallel_estimate.py --model flash --ranks 2 --prefill-gflops 1000 --net-gbs 12.5
"""
import argparse
import random

MODELS = {
    "flash": dict(d=4096, layers=43, heads=64, hd=512, q_lora=1024, groups=8, o_lora=1024,
                  experts=256, k=6, inter=2048, vocab=129280, csa=21, hca=20,
                  idx_heads=64, idx_dim=128),
    "pro": dict(d=7168, layers=61, heads=128, hd=512, q_lora=1536, groups=16, o_lora=1024,
                experts=384, k=6, inter=3072, vocab=129280, csa=30, hca=31,
                idx_heads=64, idx_dim=128),
}


def fp8(rows, cols):
    return rows * cols + 4 * -(-rows // 128) * -(-cols // 128)


def fp4(rows, cols):
    return rows * cols // 2 + rows * (cols // 32)


def busiest_share(m, n, trials=20000):
    """Expected picks on the rank with the most of a token's k experts (uniform routing,
    contiguous shares): each layer waits for that rank."""
    rng = random.Random(0)
    e, k = m["experts"], m["k"]
    owner = [min(i * n // e, n - 1) for i in range(e)]
    total = 0
    for _ in range(trials):
        counts = [0] * n
        for x in rng.sample(range(e), k):
            counts[owner[x]] += 1
        total += max(counts)
    return total / trials


def estimate(m, n, whole=False):
    d, hd, h = m["d"], m["hd"], m["heads"]
    split_layer = (fp8(h * hd, m["q_lora"]) + fp8(m["groups"] * m["o_lora"], h * hd // m["groups"])
                   + fp8(d, m["groups"] * m["o_lora"]) + 3 * fp8(m["inter"], d))
    expert = 3 * fp4(m["inter"], d)
    head = m["vocab"] * d * 2
    every = fp8(m["q_lora"], d) + fp8(hd, d) + m["experts"] * d * 2 + 2 * 24 * 4 * d * 4
    csa = 2 * 2 * hd * d * 2 + fp8(m["idx_heads"] * m["idx_dim"], m["q_lora"]) \
        + m["idx_heads"] * d * 2 + 2 * 2 * m["idx_dim"] * d * 2
    hca = 2 * hd * d * 2
    unsplit = m["layers"] * every + m["csa"] * csa + m["hca"] * hca
    split = m["layers"] * split_layer + head
    experts = m["layers"] * m["k"] * expert
    # Whole experts: each layer waits for the rank with the most picks; split by width,
    # every rank computes 1/n of every pick.
    busiest = busiest_share(m, n) / m["k"] if whole else 1 / n
    rank0 = split / n + experts * busiest + unsplit
    other = split / n + experts / n
    # Per layer: MoE (header, input + routing, reduce), AttnQ (header, qr, gather q),
    # AttnOut (header, o, reduce); then the head (header, h, gather logits).
    per_layer_calls = 9 if n > 1 else 0
    calls = m["layers"] * per_layer_calls + (3 if n > 1 else 0)
    f = 4
    per_layer_bytes = (d + 2 * m["k"]) * f + d * f + m["q_lora"] * f + h * hd * f \
        + h * hd * f + d * f
    net = (m["layers"] * per_layer_bytes + d * f + m["vocab"] * f) if n > 1 else 0
    return dict(split=split, experts=experts, unsplit=unsplit, rank0=rank0, other=other,
                calls=calls, net=net)


def prefill_flops(m):
    """Multiply-adds x2 per prompt token: every product's weights once, and the attention
    core over the window and the top-512 picks (CSA) or every entry (HCA, counted as 512)."""
    d, hd, h, g, ol = m["d"], m["hd"], m["heads"], m["groups"], m["o_lora"]
    attn = d * m["q_lora"] + m["q_lora"] * h * hd + d * hd + h * hd * ol + g * ol * d
    moe = (m["k"] + 1) * 3 * d * m["inter"] + m["experts"] * d
    core = h * hd * 2 * (128 + 512)
    comp = m["csa"] * (2 * 2 * hd * d + 2 * 2 * m["idx_dim"] * d + m["q_lora"] * m["idx_heads"] * m["idx_dim"]) \
        + m["hca"] * 2 * hd * d
    return 2 * (m["layers"] * (attn + moe + core) + comp)


def handover_bytes(m, p, span):
    """f32 bytes of the state handed over for a range starting at position `p` (every layer:
    the window rows before it, every entry and key so far), and of `span` positions' state
    handed back (window rows, the compressors' pending rows, their entries and keys)."""
    hd, ih, f = m["hd"], m["idx_dim"], 4
    forward = m["layers"] * 128 * hd + m["csa"] * (p // 4) * (hd + ih) + m["hca"] * (p // 128) * hd
    back = m["layers"] * span * hd + m["csa"] * span * (2 * 2 * hd + 2 * 2 * ih + (hd + ih) / 4) \
        + m["hca"] * span * (2 * hd + hd / 128)
    return forward * f, back * f


def context_parallel(m, a):
    n, flops = a.ranks, prefill_flops(m)
    print(f"{a.model}, context parallel over {n} machines at {a.prefill_gflops:g} GFLOP/s each, "
          f"{a.net_gbs:g} GB/s network, {a.lat_us:g} us per message; "
          f"{flops / 1e9:.1f} GFLOP per prompt token")
    print("  prompt   one machine   N machines (compute + hand-over)   speed-up")
    for prompt in [512, 1024, 2048, 4096, 8192, 16384, 65536]:
        one = prompt * flops / (a.prefill_gflops * 1e9)
        rng = prompt / n
        compute = rng * flops / (a.prefill_gflops * 1e9) * (m["layers"] + n - 1) / m["layers"]
        # Each range waits for its predecessor's layers: the hand-overs of the last range's
        # start lie on the critical path, then the state of every later range goes back.
        fwd, back = handover_bytes(m, int(prompt - rng), int(prompt - rng))
        msgs = 2 * m["layers"] * (n - 1) + m["layers"]
        net = (fwd + back) / (a.net_gbs * 1e9) + msgs * a.lat_us * 1e-6
        total = compute + net
        print(f"  {prompt:6d}   {one:8.2f} s   {total:8.2f} s ({compute:.2f} + {net:.2f})"
              f"   {one / total:6.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=MODELS, default="flash")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--mem-gbs", type=float, default=200.0, help="memory GB/s reached per machine")
    ap.add_argument("--net-gbs", type=float, default=12.5, help="network GB/s (100 Gb/s = 12.5)")
    ap.add_argument("--lat-us", type=float, default=20.0, help="one small collective, microseconds")
    ap.add_argument("--experts", choices=["width", "whole"], default="width",
                    help="split by width (the default under mpirun) or whole "
                         "(--enable-expert-parallel)")
    ap.add_argument("--prefill-gflops", type=float, default=None,
                    help="estimate context-parallel prefill at this GFLOP/s per machine instead")
    a = ap.parse_args()
    m = MODELS[a.model]
    if a.prefill_gflops:
        return context_parallel(m, a)
    one = estimate(m, 1)
    e = estimate(m, a.ranks, a.experts == "whole")
    gb = 1e9
    mem_ms = e["rank0"] / (a.mem_gbs * gb) * 1e3
    net_ms = e["net"] / (a.net_gbs * gb) * 1e3 + e["calls"] * a.lat_us / 1e3
    one_ms = one["rank0"] / (a.mem_gbs * gb) * 1e3
    print(f"{a.model}, {a.ranks} ranks, {a.mem_gbs:g} GB/s memory, {a.net_gbs:g} GB/s network, "
          f"{a.lat_us:g} us per collective; decode, batch 1, per token:")
    print(f"  one process reads {one['rank0'] / gb:.2f} GB: {one_ms:.1f} ms, {1e3 / one_ms:.1f} tok/s")
    spread = (f"whole: {busiest_share(m, a.ranks):.2f} of the {m['k']} picks on the busiest "
              f"rank" if a.experts == "whole" else "by width: 1/{} of each".format(a.ranks))
    print(f"  split weights {e['split'] / gb:.2f} GB (1/{a.ranks} each), routed experts "
          f"{e['experts'] / gb:.2f} GB ({spread}), not split (rank 0) {e['unsplit'] / gb:.2f} GB")
    print(f"  critical path (rank 0's part, the slowest rank's experts) {e['rank0'] / gb:.2f} GB; "
          f"a rank other than 0 reads {e['other'] / gb:.2f} GB on average")
    print(f"  {e['calls']} collectives, {e['net'] / 1e6:.1f} MB through rank 0's link")
    print(f"  memory {mem_ms:.1f} ms + network {net_ms:.1f} ms = {mem_ms + net_ms:.1f} ms: "
          f"{1e3 / (mem_ms + net_ms):.1f} tok/s")


if __name__ == "__main__":
    main()
