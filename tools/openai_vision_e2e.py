#!/usr/bin/env python3
"""Images through `deepinfer serve` with the official `openai` client (run by
tools/clients_e2e.sh):

    openai_vision_e2e.py VISION_URL TEXT_URL

VISION_URL serves a checkpoint with a vision tower (the `tiny-v41-vision` synth preset),
TEXT_URL one without. Checks: an image prompt answers, its prompt token count (image span
included) is /tokenize's; the same image again reports cached tokens and gives the same
tokens and logprobs; another image of the same size does not hit past the text before it;
bad images (undecodable, unsupported format, a small file declaring a huge canvas, an absurd
aspect ratio, too many, an http URL, bad base64) are 400s naming the field, each answered
quickly; an image to the text-only model is a 400 naming the model.
"""

import base64
import json
import struct
import sys
import time
import urllib.request
import zlib

import openai

FIXTURES = "tests/fixtures/vision/images"


def png(width, height, pixel=lambda x, y: (x * 7 % 256, y * 5 % 256, (x + y) % 256)):
    """A truecolor PNG of the given size."""
    rows = b"".join(
        b"\x00" + bytes(c for x in range(width) for c in pixel(x, y)) for y in range(height)
    )
    return png_chunks(width, height, zlib.compress(rows))


def png_chunks(width, height, idat):
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def data_url(data, mime="image/png"):
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def messages(*urls, text="Describe the picture."):
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]


def chat(client, msgs):
    return client.chat.completions.create(
        model=client.model, messages=msgs, max_tokens=6, temperature=0, logprobs=True,
        top_logprobs=2,
    )


def tokens_and_logprobs(r):
    return [(t.token, t.logprob) for t in r.choices[0].logprobs.content]


def tokenize_count(url, msgs):
    req = urllib.request.Request(
        url + "/tokenize", data=json.dumps({"messages": msgs}).encode(),
        headers={"Content-Type": "application/json"},
    )
    return json.load(urllib.request.urlopen(req))["count"]


def expect_400(client, msgs, field, words):
    t0 = time.monotonic()
    try:
        chat(client, msgs)
    except openai.BadRequestError as e:
        took = time.monotonic() - t0
        body = e.body if isinstance(e.body, dict) else {}
        msg = str(body.get("message", e))
        assert body.get("param") == field, (field, body)
        assert words.lower() in msg.lower(), (words, msg)
        assert took < 10, f"{words}: {took:.1f} s"
        print(f"400 {field}: {msg[:110]}")
        return
    raise AssertionError(f"no 400 for {words}")


def client_for(url):
    c = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    c.model = c.models.list().data[0].id
    return c


def main():
    vision_url, text_url = sys.argv[1], sys.argv[2]
    v, t = client_for(vision_url), client_for(text_url)
    image = open(f"{FIXTURES}/src_300x220.png", "rb").read()
    msgs = messages(data_url(image))

    first = chat(v, msgs)
    assert first.usage.completion_tokens == 6 and first.choices[0].finish_reason == "length"
    count = tokenize_count(vision_url, msgs)
    assert first.usage.prompt_tokens == count, (first.usage.prompt_tokens, count)
    text_only = tokenize_count(vision_url, [{"role": "user", "content": "Describe the picture."}])
    print(f"image prompt: {count} tokens ({count - text_only} for the image), answered")

    again = chat(v, msgs)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached > 0, again.usage
    assert tokens_and_logprobs(again) == tokens_and_logprobs(first)
    print(f"the same image again: {cached} cached tokens, same tokens and logprobs")

    # The same size, one pixel apart: the span's first block must not be reused.
    other = png(300, 220)
    o1 = chat(v, messages(data_url(other)))
    o2 = chat(v, messages(data_url(png(300, 220, lambda x, y: (1, 2, 3) if (x, y) == (0, 0) else (x * 7 % 256, y * 5 % 256, (x + y) % 256)))))
    assert o1.usage.prompt_tokens == o2.usage.prompt_tokens
    before_image = 16  # BOS and the user marker: far less than a block
    assert o2.usage.prompt_tokens_details.cached_tokens < before_image, o2.usage
    print("another image of the same size: no cache hit past the text before it")

    expect_400(v, messages(data_url(b"not an image at all")), "messages[0].content[0]",
               "known format")
    expect_400(v, messages(data_url(b"BM" + bytes(60), "image/bmp")), "messages[0].content[0]",
               "not supported")
    bomb = png_chunks(60000, 60000, zlib.compress(b"\x00" * 1000))
    expect_400(v, messages(data_url(bomb)), "messages[0].content[0]", "more than")
    expect_400(v, messages(data_url(png(1, 400))), "messages[0].content[0]", "further apart")
    expect_400(v, messages(*[data_url(image)] * 9), "messages", "at most")
    expect_400(v, messages("https://example.com/cat.png"), "messages[0].content[0]", "data URL")
    expect_400(v, messages("data:image/png;base64,@@@@"), "messages[0].content[0]", "base64")
    expect_400(t, msgs, "messages[0].content[0]", f"`{t.model}` takes no images")
    print("vision e2e: ok")


if __name__ == "__main__":
    main()
