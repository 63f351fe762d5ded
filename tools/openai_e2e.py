"""Drives a running `deepinfer serve` with the official `openai` Python package.

Usage: python tools/openai_e2e.py http://127.0.0.1:PORT
Covers completions, chat streaming (with usage), a tool-call round trip (tool definitions,
the assistant's call and the tool's result sent back), logprobs and error mapping. Exits
non-zero on the first failed check. Run by .ci/run against the default model.
"""

import json
import sys

import openai

base = sys.argv[1].rstrip("/") + "/v1"
client = openai.OpenAI(base_url=base, api_key="unused")
model = client.models.list().data[0].id
print(f"model: {model}")

# Completions: greedy is deterministic, usage adds up.
a = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8,
                              temperature=0, extra_body={"ignore_eos": True})
b = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8,
                              temperature=0, extra_body={"ignore_eos": True})
assert a.choices[0].text == b.choices[0].text and a.choices[0].text, (a, b)
assert a.choices[0].finish_reason == "length"
assert a.usage.completion_tokens == 8
assert a.usage.total_tokens == a.usage.prompt_tokens + 8
print(f"completions: {a.choices[0].text!r}")

# Streamed completions concatenate to the whole answer.
parts = []
for chunk in client.completions.create(model=model, prompt="The capital of France is",
                                       max_tokens=8, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True}):
    parts.extend(c.text for c in chunk.choices)
assert "".join(parts) == a.choices[0].text, (parts, a.choices[0].text)

# Chat streaming in thinking mode: reasoning and content arrive as deltas, usage at the end.
messages = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2 + 2?"}]
whole = client.chat.completions.create(model=model, messages=messages, max_tokens=12,
                                       temperature=0, extra_body={"ignore_eos": True})
reasoning, content, usage, finish = "", "", None, None
for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=12,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}):
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        extra = c.delta.model_extra or {}
        reasoning += extra.get("reasoning_content") or ""
        content += c.delta.content or ""
        finish = c.finish_reason or finish
msg = whole.choices[0].message
assert content == (msg.content or ""), (content, msg.content)
assert reasoning == ((msg.model_extra or {}).get("reasoning_content") or ""), reasoning
assert usage is not None and usage.completion_tokens == 12, usage
assert finish == "length", finish
print(f"chat stream: reasoning={reasoning!r} content={content!r}")

# Tool-call round trip: tools offered, the assistant's call and the tool result sent back.
tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
first = client.chat.completions.create(model=model, messages=[
    {"role": "user", "content": "Weather in Paris?"}], tools=tools, max_tokens=8, temperature=0)
assert first.choices[0].finish_reason in ("length", "stop", "tool_calls")
call = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
second = client.chat.completions.create(model=model, tools=tools, max_tokens=8, temperature=0,
                                        messages=[
                                            {"role": "user", "content": "Weather in Paris?"},
                                            {"role": "assistant", "content": None,
                                             "tool_calls": [call]},
                                            {"role": "tool", "tool_call_id": "call_1",
                                             "content": "18 C, sunny"}])
assert second.choices[0].message.role == "assistant"
assert second.usage.prompt_tokens > first.usage.prompt_tokens
print("tool round trip: ok")

# Logprobs through the client's types.
lp = client.chat.completions.create(model=model, messages=messages, max_tokens=3,
                                    temperature=0, logprobs=True, top_logprobs=2)
entries = lp.choices[0].logprobs.content
assert len(entries) == 3 and all(len(e.top_logprobs) <= 2 for e in entries)

# Errors map onto the client's exception types.
try:
    client.chat.completions.create(model=model, messages=messages, temperature=-1)
    raise AssertionError("negative temperature accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "temperature", e.body
try:
    client.chat.completions.create(model="no-such-model", messages=messages)
    raise AssertionError("unknown model accepted")
except openai.NotFoundError:
    pass
print("openai e2e: all checks passed")
