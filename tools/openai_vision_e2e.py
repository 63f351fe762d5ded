#!/usr/bin/env python3
"""Images through `deepinfer serve` with the official `openai` client (run by
tools/clients_e2e.sh):

    openai_vision_e2e.py VISION_URL TEXT_URL [V4_VISION_URL]

VISION_URL serves a checkpoint with a vision tower (the `tiny-v41-vision` synth preset),
TEXT_URL one without, V4_VISION_URL a V4-Flash-Vision-Exp-style one (`tiny-v4-vision`:
sentinel ids, its window widened over images). Checks: an image prompt answers, its prompt token count (image span
included) is /tokenize's; the same image again reports cached tokens and gives the same
tokens and logprobs; another image of the same size does not hit past the text before it;
bad images (undecodable, unsupported format, a small file declaring a huge canvas, an absurd
aspect ratio, too many, an http URL, bad base64) are 400s naming the field, each answered
quickly; an image to the text-only model is a 400 naming the model. The same image through
the official `anthropic` client (an `image` block, and one in a `tool_result`) and the
Responses API (`input_image`) gives the tokens Chat Completions gives for the same
conversation, counts its image tokens, and names the Anthropic or Responses field when bad.
"""

import base64
import json
import struct
import sys
import time
import urllib.request
import zlib

import anthropic
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
    # Text after the image (where the user put it) long enough that the prompt fills a cache
    # block (128 tokens) and the image lies inside it.
    text = "Describe the picture in detail. " * 12
    msgs = messages(data_url(image), text=text)

    first = chat(v, msgs)
    assert first.usage.completion_tokens == 6 and first.choices[0].finish_reason == "length"
    count = tokenize_count(vision_url, msgs)
    assert first.usage.prompt_tokens == count, (first.usage.prompt_tokens, count)
    text_only = tokenize_count(vision_url, [{"role": "user", "content": text}])
    print(f"image prompt: {count} tokens ({count - text_only} for the image), answered")

    again = chat(v, msgs)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached > 0, again.usage
    assert tokens_and_logprobs(again) == tokens_and_logprobs(first)
    print(f"the same image again: {cached} cached tokens, same tokens and logprobs")

    # The same size, one pixel apart: the span's first block must not be reused.
    other = png(300, 220)
    o1 = chat(v, messages(data_url(other), text=text))
    o2 = chat(v, messages(data_url(png(300, 220, lambda x, y: (1, 2, 3) if (x, y) == (0, 0) else (x * 7 % 256, y * 5 % 256, (x + y) % 256))), text=text))
    assert o1.usage.prompt_tokens == o2.usage.prompt_tokens
    before_image = 16  # what a hit of the text before the image would be: far less than a block
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
    other_apis(vision_url, text_url, v, image)
    if len(sys.argv) > 3:
        v4_family(sys.argv[3], image)
    print("vision e2e: ok")


def v4_family(url, image):
    """A V4-Flash-Vision-Exp-style checkpoint: its image block counts in the prompt, the
    same image again is served from the cache with the same tokens and logprobs."""
    c = client_for(url)
    # Text after the image longer than a cache block: the hit then ends past the image
    # block (a hit inside one is not resumed: its positions see one another).
    msgs = messages(data_url(image), text="Describe the picture in detail. " * 40)
    first, again = chat(c, msgs), chat(c, msgs)
    count = tokenize_count(url, msgs)
    assert first.usage.prompt_tokens == count, (first.usage, count)
    assert again.usage.prompt_tokens_details.cached_tokens > 0, again.usage
    assert tokens_and_logprobs(again) == tokens_and_logprobs(first)
    print(f"V4 image prompt: {count} tokens, answered; again: "
          f"{again.usage.prompt_tokens_details.cached_tokens} cached, the same tokens")


def chat_mode(client, msgs):
    """Greedy Chat Completions in chat mode (the Messages API's default)."""
    return client.chat.completions.create(
        model=client.model, messages=msgs, max_tokens=6, temperature=0,
        extra_body={"chat_template_kwargs": {"thinking": False}},
    )


def other_apis(vision_url, text_url, v, image):
    """The image through the Messages and Responses APIs: the same prompt as Chat
    Completions' for the same conversation, hence the same greedy answer."""
    url = data_url(image)
    reference = chat_mode(v, messages(url))
    a = anthropic.Anthropic(base_url=vision_url, api_key="unused")
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": url.split(",", 1)[1]}}
    content = [block, {"type": "text", "text": "Describe the picture."}]
    m = a.messages.create(model=v.model, max_tokens=6, temperature=0,
                          messages=[{"role": "user", "content": content}])
    assert m.content[0].text == reference.choices[0].message.content, (m, reference)
    assert m.usage.input_tokens == reference.usage.prompt_tokens, m.usage
    counted = a.messages.count_tokens(model=v.model, messages=[{"role": "user", "content": content}])
    assert counted.input_tokens == m.usage.input_tokens, counted
    print(f"Messages API image: {m.usage.input_tokens} input tokens "
          f"({m.usage.cache_read_input_tokens} read from the cache), Chat Completions' answer")

    # A tool result's image goes in a user message after the tool message (vLLM's order).
    turn = [
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "taken"}, block]}]},
    ]
    tools = [{"name": "shot", "input_schema": {"type": "object"}}]
    m = a.messages.create(model=v.model, max_tokens=6, temperature=0, messages=turn, tools=tools)
    same = v.chat.completions.create(
        model=v.model, max_tokens=6, temperature=0,
        extra_body={"chat_template_kwargs": {"thinking": False}},
        tools=[{"type": "function", "function": {"name": "shot", "parameters": {"type": "object"}}}],
        messages=[
            {"role": "user", "content": "Take a screenshot."},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "taken"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]},
        ])
    assert m.usage.input_tokens == same.usage.prompt_tokens, (m.usage, same.usage)
    print(f"Messages API tool_result image: {m.usage.input_tokens} input tokens, as Chat Completions")

    for content, field, words in [
        ([{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                       "data": base64.b64encode(b"junk").decode()}}],
         "messages[0].content[0]", "known format"),
        ([{"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}],
         "messages[0].content[0]", "data URL"),
        ([{"type": "image", "source": {"type": "file", "file_id": "f"}}],
         "messages[0].content[0].source.type", "not supported"),
    ]:
        try:
            a.messages.create(model=v.model, max_tokens=4, messages=[{"role": "user", "content": content}])
            raise AssertionError(f"no 400 for {field}")
        except anthropic.BadRequestError as e:
            msg = e.body["error"]["message"]
            assert msg.count(field) == 1 and words.lower() in msg.lower(), msg
            print(f"Messages 400: {msg[:110]}")
    t = anthropic.Anthropic(base_url=text_url, api_key="unused")
    try:
        t.messages.create(model=t.models.list().data[0].id, max_tokens=4,
                          messages=[{"role": "user", "content": [block]}])
        raise AssertionError("no 400 from the text-only model")
    except anthropic.BadRequestError as e:
        assert "takes no images" in e.body["error"]["message"], e.body

    r = v.responses.create(model=v.model, max_output_tokens=6, temperature=0,
                           reasoning={"effort": "none"},
                           input=[{"role": "user", "content": [
                               {"type": "input_image", "image_url": url, "detail": "auto"},
                               {"type": "input_text", "text": "Describe the picture."}]}])
    assert r.output_text == reference.choices[0].message.content, (r.output_text, reference)
    assert r.usage.input_tokens == reference.usage.prompt_tokens, r.usage
    print(f"Responses API image: {r.usage.input_tokens} input tokens, Chat Completions' answer")
    try:
        v.responses.create(model=v.model, max_output_tokens=4, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,@@@@"}]}])
        raise AssertionError("no 400 for bad base64")
    except openai.BadRequestError as e:
        assert e.body.get("param") == "input[0].content[0]", e.body
        print(f"Responses 400: {e.body['message'][:110]}")


if __name__ == "__main__":
    main()
