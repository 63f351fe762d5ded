"""DSpark drafting's shared half: the loop that DeepSeek-V4.1's and V4's drafters run the same
way, and the golden format they record (make_dspark_golden.py on V4.1, make_dspark_v4_golden.py
on V4; make_dspark_golden.py's docstring states the computation step by step).

What each part follows (vLLM 0.33.0, paths under vllm/):
  - `draw_stage`: a stage's weights are a window-only decoder layer's (golden/v41.py's
    draw_layer) with the stages' expert count.
  - `sequential_drafts`: steps 8 and 9: the Markov head (dspark/speculator.py
    _sample_sequential, model_executor/models/qwen3_dspark.py DSparkMarkovHead) and the
    confidence head (qwen3_dspark.py DSparkConfidenceHead, dspark.py compute_confidence).
  - `speculative`: step 10, greedy verification by the target as vLLM's loop runs it; its
    output must equal `plain_greedy`'s.
  - `record`: picks a prompt whose every decision clears MARGIN, records blocks A and B and
    writes dspark_golden.safetensors/json.

A target is any object with `forward(ids, want_layers)` -> (logits [T, V], the streams after
every layer, gaps with router/indexer/candidate); a drafter has `aux_states(layers)` and
`draft(aux, bonus)` -> the dict `tensors_of` and `block_meta` read.
"""

import json
import math
import os

import torch

from golden.storage import raw, write_safetensors
from golden.v41 import draw_layer

PROMPT_LEN = 21
GEN_TOKENS = 16
FORCED_ACCEPTED = 3
TIE_GAP = 1e-4  # the V4.1 goldens' (make_v41_golden.py)
MARGIN = 5e-4
MIN_ACCEPTED = 3
RETRIES = 16


def draw_stage(s, p, c, bias_vl=True):
    """One window-only decoder layer with the stages' expert count (golden/v41.py's draw_layer;
    a V4 stage, tools/make_dspark_v4_golden.py, has no `gate.bias_vl` and its Store rounds onto
    V4's 128-wide FP8 blocks)."""
    return draw_layer(s, p, c, c["dspark_n_routed_experts"], bias_vl=bias_vl)


def sequential_drafts(w, h, base, bonus):
    """Steps 8 and 9: the Markov chain over the block's base logits and the confidences."""
    prev, drafts, embeds, adjusted, draft_gap = bonus, [], [], [], math.inf
    for j in range(base.shape[0]):
        e = w["markov_w1"][prev]
        lj = base[j] + w["markov_w2"] @ e
        top = lj.topk(2)
        draft_gap = min(draft_gap, float(top.values[0] - top.values[1]))
        prev = int(top.indices[0])
        drafts.append(prev)
        embeds.append(e)
        adjusted.append(lj)
    E = torch.stack(embeds)
    conf = torch.sigmoid((torch.cat([h, E], -1) @ w["confidence"].T).squeeze(-1))
    return dict(markov_embed=E, logits=torch.stack(adjusted), drafts=drafts, confidence=conf,
                draft_gap=draft_gap)


# ---------------------------------------------------------------- runs

class Margins:
    def __init__(self):
        self.target = self.greedy = self.draft = math.inf

    def add_target(self, gaps, logits=None):
        self.target = min(self.target, gaps.router, gaps.indexer, gaps.candidate)
        if logits is not None:
            v = logits.topk(2, -1).values
            self.greedy = min(self.greedy, float((v[..., 0] - v[..., 1]).min()))

    def add_draft(self, d):
        self.draft = min(self.draft, d["router_gap"], d["draft_gap"])

    def smallest(self):
        return min(self.target, self.greedy, self.draft)


@torch.no_grad()
def target_run(model, ids):
    logits, layers, gaps = model.forward(ids, want_layers=True)
    return logits, layers, gaps


@torch.no_grad()
def plain_greedy(model, prompt, n, margins):
    seq, out = list(prompt), []
    for _ in range(n):
        logits, _, gaps = model.forward(seq)
        margins.add_target(gaps, logits[-1:])
        out.append(int(logits[-1].argmax()))
        seq.append(out[-1])
    return out


@torch.no_grad()
def speculative(model, ds, prompt, n, margins):
    """Greedy decoding with DSpark drafts and target verification, as vLLM's loop runs it."""
    logits, layers, gaps = target_run(model, prompt)
    margins.add_target(gaps, logits[-1:])
    committed, bonus, out, steps, first = list(prompt), int(logits[-1].argmax()), [], [], None
    aux = ds.aux_states(layers)
    while True:
        out.append(bonus)
        if len(out) >= n:
            break
        d = ds.draft(aux, bonus)
        margins.add_draft(d)
        first = first or d
        # Drafts past what the request may still emit are not verified (the engine caps them
        # likewise): the step's own target token is the last one needed.
        drafts = d["drafts"][: n - len(out) - 1]
        P0 = len(committed)
        logits, layers, gaps = target_run(model, committed + [bonus] + drafts)
        verify = logits[P0:].argmax(-1).tolist()  # the target's choice after each block row
        k = 0
        while k < len(drafts) and drafts[k] == verify[k]:
            k += 1
        margins.add_target(gaps, logits[P0:P0 + k + 1])  # the rows whose choice is used
        steps.append(dict(position=P0, anchor=bonus, drafts=drafts, target=verify, accepted=k,
                          confidence=d["confidence"].tolist()))
        committed += [bonus] + drafts[:k]
        out += drafts[:k]
        bonus = verify[k]
        aux = ds.aux_states(layers)[: len(committed)]
    return out[:n], steps, first


def tensors_of(prefix, d):
    return {
        f"{prefix}.aux": raw(d["aux"], "F32"),
        f"{prefix}.main_x": raw(d["main_x"], "F32"),
        f"{prefix}.context_kv": raw(d["ctx_kv"], "F32"),
        f"{prefix}.stage_out": raw(d["stage_out"], "F32"),
        f"{prefix}.head_hidden": raw(d["head_hidden"], "F32"),
        f"{prefix}.base_logits": raw(d["base_logits"], "F32"),
        f"{prefix}.markov_embed": raw(d["markov_embed"], "F32"),
        f"{prefix}.logits": raw(d["logits"], "F32"),
        f"{prefix}.drafts": raw(torch.tensor(d["drafts"]), "I64"),
        f"{prefix}.confidence": raw(d["confidence"], "F32"),
    }


def block_meta(d, committed_len, note):
    return dict(note=note, committed_len=committed_len, anchor=d["ids"][0], input_ids=d["ids"],
                positions=d["positions"].tolist(), context_positions=d["ctx_positions"].tolist(),
                drafts=d["drafts"], confidence=d["confidence"].tolist(),
                router_gap=d["router_gap"], draft_gap=d["draft_gap"])


# What each recorded tensor holds, per block (X = a or b); a drafter's `notes` fill the two
# whose meaning depends on the target (None here).
TENSORS = {
    "X.aux": None,
    "X.main_x": "[ctx, D] main_norm(main_proj(aux)), context rows",
    "X.context_kv": "[stages, ctx, head_dim] RoPE'd at context_positions",
    "X.stage_out": "[stages, block, hc, D] residual streams after each stage",
    "X.head_hidden": None,
    "X.base_logits": "[block, vocab] head(norm(head_hidden))",
    "X.markov_embed": "[block, r] markov_w1 of the token before each slot",
    "X.logits": "[block, vocab] base_logits + markov bias, the logits each draft is argmax of",
    "X.drafts": "[block] greedy drafts",
    "X.confidence": "[block] sigmoid(proj [head_hidden; markov_embed])",
}


def pick_prompt(target, ds, vocab, seed):
    """Prompts are drawn in turn; the first whose every recorded decision (target router,
    indexer and candidate picks, target argmax, stage routers, draft argmax) clears MARGIN and
    whose speculative loop accepts at least MIN_ACCEPTED drafts is kept. Returns (attempt,
    prompt, margins, speculative output, its steps, its first block)."""
    g = torch.Generator().manual_seed(seed)
    for attempt in range(RETRIES):
        prompt = torch.randint(0, vocab, (PROMPT_LEN,), generator=g).tolist()
        margins = Margins()
        spec_out, steps, block_a = speculative(target, ds, prompt, GEN_TOKENS, margins)
        accepted = sum(s["accepted"] for s in steps)
        print(f"attempt {attempt}: smallest margin {margins.smallest():.3g}, accepted "
              f"{[s['accepted'] for s in steps]}", flush=True)
        if margins.smallest() > MARGIN and accepted >= MIN_ACCEPTED:
            return attempt, prompt, margins, spec_out, steps, block_a
    raise SystemExit("no prompt cleared the margins")


def forced_block(target, ds, prompt, greedy, margins):
    """Block B: as if the target had accepted FORCED_ACCEPTED drafts of block A (the greedy
    tokens): context = prompt + greedy[:1 + FORCED_ACCEPTED], anchor = the next greedy token."""
    committed = prompt + greedy[: 1 + FORCED_ACCEPTED]
    logits, layers, gaps = target_run(target, committed)
    margins.add_target(gaps, logits[-1:])
    assert int(logits[-1].argmax()) == greedy[1 + FORCED_ACCEPTED]
    block_b = ds.draft(ds.aux_states(layers), greedy[1 + FORCED_ACCEPTED])
    margins.add_draft(block_b)
    return block_b


def record(target, ds, vocab, out_dir, head, notes, seed):
    """Picks the prompt, checks the speculative loop against plain greedy decoding, records
    blocks A and B, and writes dspark_golden.safetensors/json into `out_dir`: `head` leads
    the JSON, `notes` describes the tensors whose meaning depends on the target (X.aux,
    X.head_hidden)."""
    attempt, prompt, margins, spec_out, steps, block_a = pick_prompt(target, ds, vocab, seed)
    greedy = plain_greedy(target, prompt, GEN_TOKENS, margins)
    assert spec_out == greedy, (spec_out, greedy)
    block_b = forced_block(target, ds, prompt, greedy, margins)
    tie_safe = margins.smallest() > TIE_GAP
    print(f"prompt attempt {attempt}: target {margins.target:.3g} greedy {margins.greedy:.3g} "
          f"draft {margins.draft:.3g} tie_safe {tie_safe}")

    golden = {}
    golden.update(tensors_of("a", block_a))
    golden.update(tensors_of("b", block_b))
    tensors = dict(TENSORS)
    tensors.update(notes)
    meta = dict(head)
    meta.update({
        "prompt": prompt,
        "greedy": greedy,
        "speculative": {"output": spec_out, "steps": steps,
                        "accepted_total": sum(s["accepted"] for s in steps)},
        "blocks": {
            "a": block_meta(block_a, PROMPT_LEN, "first draft after the prompt (= speculative step 0)"),
            "b": block_meta(block_b, PROMPT_LEN + 1 + FORCED_ACCEPTED,
                            f"context = prompt + greedy[:{1 + FORCED_ACCEPTED}] (bonus + "
                            f"{FORCED_ACCEPTED} accepted), anchor greedy[{1 + FORCED_ACCEPTED}]"),
        },
        "tensors": tensors,
        "prompt_attempt": attempt,
        "margins": {"target": margins.target, "greedy": margins.greedy, "draft": margins.draft,
                    "tie_gap": TIE_GAP, "tie_safe": tie_safe},
    })
    write_safetensors(os.path.join(out_dir, "dspark_golden.safetensors"), golden)
    with open(os.path.join(out_dir, "dspark_golden.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("accepted per step", [s["accepted"] for s in steps], "tie_safe", tie_safe)
