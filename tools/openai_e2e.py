"""Drives a running `deepinfer serve` with the official `openai` Python package.

Usage: python tools/openai_e2e.py http://127.0.0.1:PORT [http://127.0.0.1:TOOL_PORT]
       python tools/openai_e2e.py --print-tool-script
Covers completions, chat streaming (with usage), a tool-call round trip (tool definitions,
the assistant's call and the tool's result sent back), logprobs and error mapping. The
optional second server runs with `--debug-force-output` set to the text that
`--print-tool-script` prints (a DeepSeek-V4 DSML tool call: a model with random weights
never writes one), and the script checks the parsed call exactly, whole and streamed.
Exits non-zero on the first failed check. Run by tools/clients_e2e.sh.
"""

import json
import sys

import openai

DSML = "\uff5cDSML\uff5c"  # the ｜DSML｜ token
TOOL_REASONING = "I should check the weather."
TOOL_CONTENT = "Let me look that up."
TOOL_NAME = "get_weather"
TOOL_ARGUMENTS = '{"city": "Paris", "days": 3}'
TOOL_SCRIPT = (
    f"{TOOL_REASONING}</think>{TOOL_CONTENT}\n\n<{DSML}tool_calls>\n"
    f'<{DSML}invoke name="{TOOL_NAME}">\n'
    f'<{DSML}parameter name="city" string="true">Paris</{DSML}parameter>\n'
    f'<{DSML}parameter name="days" string="false">3</{DSML}parameter>\n'
    f"</{DSML}invoke>\n</{DSML}tool_calls>"
)

if sys.argv[1:] == ["--print-tool-script"]:
    sys.stdout.buffer.write(TOOL_SCRIPT.encode())
    sys.exit(0)

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

if len(sys.argv) > 2:
    # The scripted server writes a DSML tool call for every request.
    scripted = openai.OpenAI(base_url=sys.argv[2].rstrip("/") + "/v1", api_key="unused")
    question = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
    got = scripted.chat.completions.create(model=model, messages=question, tools=tools,
                                           max_tokens=200)
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    msg = choice.message
    assert msg.content == TOOL_CONTENT, msg
    assert (msg.model_extra or {}).get("reasoning_content") == TOOL_REASONING, msg
    assert len(msg.tool_calls) == 1, msg.tool_calls
    call = msg.tool_calls[0]
    assert call.type == "function" and call.id, call
    assert call.function.name == TOOL_NAME, call
    assert call.function.arguments == TOOL_ARGUMENTS, call
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}

    # Streamed: accumulate the tool-call deltas by index, as OpenAI clients do.
    calls, finish, content = {}, None, ""
    for chunk in scripted.chat.completions.create(model=model, messages=question, tools=tools,
                                                  max_tokens=200, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                acc = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                acc["id"] += tc.id or ""
                if tc.function is not None:
                    acc["name"] += tc.function.name or ""
                    acc["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls", finish
    assert content == TOOL_CONTENT, content
    assert list(calls) == [0], calls
    assert calls[0]["name"] == TOOL_NAME and calls[0]["arguments"] == TOOL_ARGUMENTS, calls
    assert calls[0]["id"], calls

    # The call and the tool's result go back; the next turn is answered.
    answer = scripted.chat.completions.create(
        model=model, tools=tools, max_tokens=200,
        messages=question + [
            {"role": "assistant", "content": msg.content,
             "tool_calls": [call.model_dump(exclude_none=True)]},
            {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}])
    assert answer.choices[0].message.role == "assistant", answer
    assert answer.usage.prompt_tokens > got.usage.prompt_tokens, (answer.usage, got.usage)
    print(f"scripted tool call: {call.function.name}({call.function.arguments})")

print("openai e2e: all checks passed")
