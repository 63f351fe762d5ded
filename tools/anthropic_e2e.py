"""Drives a running `deepinfer serve` with the official `anthropic` Python package.

Usage: python tools/anthropic_e2e.py MODEL http://127.0.0.1:PORT http://127.0.0.1:TOOL_PORT
The second server runs with `--debug-force-output` set to the text that
`tools/openai_e2e.py --print-tool-script [v41]` prints (reasoning, text and a DSML tool call
in the served model's family's markup). Covers Messages create and stream (the SDK's own accumulation of the event stream),
count_tokens, the prefix cache in `cache_read_input_tokens`, a tool-use round trip with
thinking on, and the SDK's exception types for our errors. Exits non-zero on the first
failed check. Run by tools/clients_e2e.sh.
"""

import sys

import anthropic

model, base, tool_base = sys.argv[1], sys.argv[2], sys.argv[3]
client = anthropic.Anthropic(base_url=base, api_key="unused")

# Long enough to fill a prefix-cache block (128 tokens) or two.
system = "Answer briefly and plainly. " * 60
question = [{"role": "user", "content": "Name three colours."}]


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


whole = client.messages.create(model=model, max_tokens=12, temperature=0, system=system,
                               messages=question)
assert whole.type == "message" and whole.role == "assistant", whole
assert whole.stop_reason in ("max_tokens", "end_turn"), whole
assert whole.usage.output_tokens <= 12, whole.usage
assert all(b.type == "text" for b in whole.content), whole.content
prompt = whole.usage.input_tokens + whole.usage.cache_read_input_tokens

# Streamed, accumulated by the SDK: the same answer, and the prompt now from the cache.
with client.messages.stream(model=model, max_tokens=12, temperature=0, system=system,
                            messages=question) as stream:
    streamed_text = "".join(stream.text_stream)
    final = stream.get_final_message()
assert streamed_text == text_of(whole) == text_of(final), (streamed_text, whole, final)
assert final.stop_reason == whole.stop_reason, final
assert final.usage.output_tokens == whole.usage.output_tokens, final.usage
assert final.usage.cache_read_input_tokens >= 128, final.usage
assert final.usage.input_tokens + final.usage.cache_read_input_tokens == prompt, final.usage
print(f"messages: {text_of(whole)!r}, cached {final.usage.cache_read_input_tokens}/{prompt}")

counted = client.messages.count_tokens(model=model, system=system, messages=question)
assert counted.input_tokens == prompt, (counted, prompt)

# Errors arrive as the SDK's exception types, in Anthropic's shape.
try:
    client.messages.create(model=model, max_tokens=4, temperature=-1, messages=question)
    raise AssertionError("negative temperature accepted")
except anthropic.BadRequestError as e:
    assert e.body["error"]["type"] == "invalid_request_error", e.body
    assert "temperature" in e.body["error"]["message"], e.body
try:
    client.messages.create(model="claude-no-such-model", max_tokens=4, messages=question)
    raise AssertionError("unknown model accepted")
except anthropic.NotFoundError as e:
    assert e.body["error"]["type"] == "not_found_error", e.body

# The scripted server writes reasoning, text and a DSML tool call for every request.
scripted = anthropic.Anthropic(base_url=tool_base, api_key="unused")
tools = [{"name": "get_weather", "description": "Current weather for a city",
          "input_schema": {"type": "object", "properties": {
              "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}]
ask = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
thinking = {"type": "enabled", "budget_tokens": 1024}
got = scripted.messages.create(model=model, max_tokens=200, tools=tools, thinking=thinking,
                               messages=ask)
assert got.stop_reason == "tool_use", got
assert [b.type for b in got.content] == ["thinking", "text", "tool_use"], got.content
assert got.content[0].thinking == "I should check the weather.", got.content[0]
assert got.content[1].text == "Let me look that up.", got.content[1]
call = got.content[2]
assert call.name == "get_weather" and call.input == {"city": "Paris", "days": 3}, call
assert call.id.startswith("toolu_"), call

with scripted.messages.stream(model=model, max_tokens=200, tools=tools, thinking=thinking,
                              messages=ask) as stream:
    final = stream.get_final_message()
assert final.stop_reason == "tool_use", final
assert [b.type for b in final.content] == ["thinking", "text", "tool_use"], final.content
assert final.content[0].thinking == got.content[0].thinking
assert final.content[2].input == call.input, final.content[2]

# The turn as the client keeps it, and the tool's result: the next turn is answered.
answer = scripted.messages.create(
    model=model, max_tokens=200, tools=tools, thinking=thinking,
    messages=ask + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in got.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": "18 C, sunny"}]}])
assert answer.role == "assistant", answer
grown = answer.usage.input_tokens + answer.usage.cache_read_input_tokens
assert grown > got.usage.input_tokens + got.usage.cache_read_input_tokens, answer.usage
print(f"scripted tool use: {call.name}({call.input})")

print("anthropic e2e: all checks passed")
