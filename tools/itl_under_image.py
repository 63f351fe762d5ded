#!/usr/bin/env python3
"""Inter-token latency of a decoding request while an image request goes through the
vision tower (docs/PERFORMANCE.md, "Decoding beside an image"):

    itl_under_image.py URL MAX_TOKENS

Streams a completion from the server at URL; after its 20th token sends a chat request with
tests/fixtures/vision/images/src_300x220.png; prints the stream's median inter-token gap
before, during and after the image request, and the largest gap during it.
"""
import base64
import json
import sys
import threading
import time

import openai

url = sys.argv[1]
c = openai.OpenAI(base_url=url + "/v1", api_key="x")
model = c.models.list().data[0].id
img = base64.b64encode(open("tests/fixtures/vision/images/src_300x220.png", "rb").read()).decode()
times = []
image_window = {}
def image_req():
    image_window["start"] = time.monotonic()
    r = c.chat.completions.create(model=model, max_tokens=1, temperature=0, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + img}}, {"type": "text", "text": "What?"}]}])
    image_window["end"] = time.monotonic()
    image_window["prompt"] = r.usage.prompt_tokens
s = c.completions.create(model=model, prompt="Once upon a time", max_tokens=int(sys.argv[2]), temperature=0, stream=True,
                         extra_body={"ignore_eos": True})
t = None
for ch in s:
    times.append(time.monotonic())
    if len(times) == 20:
        t = threading.Thread(target=image_req); t.start()
t.join()
gaps = [(b - a, b) for a, b in zip(times, times[1:])]
before = sorted(g for g, at in gaps if at < image_window["start"])
during = sorted(g for g, at in gaps if image_window["start"] <= at <= image_window["end"])
after = sorted(g for g, at in gaps if at > image_window["end"])
med = lambda v: v[len(v) // 2] if v else float("nan")
print(json.dumps({"image_request_s": round(image_window["end"] - image_window["start"], 2), "prompt_tokens": image_window["prompt"],
  "itl_before_median_ms": round(1e3 * med(before), 1), "itl_during_median_ms": round(1e3 * med(during), 1),
  "itl_during_max_ms": round(1e3 * max(during), 1) if during else None, "tokens_during": len(during),
  "itl_after_median_ms": round(1e3 * med(after), 1)}))
