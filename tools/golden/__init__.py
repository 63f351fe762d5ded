"""The golden makers' shared library (tools/make_*_golden.py, make_saved_fixtures.py,
make_engram_fixtures.py, hf_bench.py import from here and never from each other).

  paths        where fixtures, the tokenizer and the checkout are
  storage      rounding onto DeepSeek's storage formats (BF16, FP8 e4m3 + E8M0 blocks, FP4 e2m1),
               the safetensors writers, `Store` (draw, round, keep values and bytes)
  layout       DeepSeek's official names and storage kinds for HF's V4 state dict, and the
               rounding of an HF tensor onto its official tensors
  read         reading stored tensors back (numpy on raw bytes; torch on safe_open tensors)
  primitives   RMSNorm, RoPE, mHC mixing, sink attention: what V4 and V4.1 share
  quant_sim    the quantisation points of DeepSeek's kernels, simulated (`Numerics`: the
               switch that turns them off is an argument, not a global)
  official_v4  the port of DeepSeek-V4's inference/model.py (make_official_golden.py)
  hf_v4        the tiny V4 configs, their weights and HF transformers' reference runs
               (importing it registers the "softmax" router activation)
  v41          the tiny V4.1 configs, weights and forward (a port of vLLM 0.33's V4.1)
  engram       V4.1's Engram n-gram hashing (vLLM's common/engram.py)
  dspark       DSpark drafting's shared loop and golden format (V4.1 and V4 drafters)

Importing the package imports nothing: each module brings only its own dependencies
(engram needs numpy alone; hf_v4 needs transformers).
"""
