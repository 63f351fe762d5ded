"""Drives a running `deepinfer serve` with the official `openai` Python package.

Usage: python tools/openai_e2e.py http://127.0.0.1:PORT [http://127.0.0.1:TOOL_PORT]
       python tools/openai_e2e.py --print-tool-script [v41]
Covers completions, chat streaming (with usage), a tool-call round trip (tool definitions,
the assistant's call and the tool's result sent back), logprobs and error mapping, and the
Responses API (create, stream accumulated by the SDK, store with `previous_response_id`,
retrieve and delete, function calls). The
optional second server runs with `--debug-force-output` set to the text that
`--print-tool-script` prints (a DeepSeek-V4 DSML tool call: a model with random weights
never writes one; with `v41`, the same call in DeepSeek-V4.1's spaced markup for a V4.1
model's server), and the script checks the parsed call exactly, whole and streamed.
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

# V4.1 writes the same markup with a space after the DSML token and `calls` for the block.
V41_TOOL_SCRIPT = (TOOL_SCRIPT.replace(f"{DSML}tool_calls", f"{DSML} calls")
                   .replace(f"{DSML}invoke", f"{DSML} invoke")
                   .replace(f"{DSML}parameter", f"{DSML} parameter"))

if sys.argv[1:2] == ["--print-tool-script"]:
    script = V41_TOOL_SCRIPT if sys.argv[2:] == ["v41"] else TOOL_SCRIPT
    sys.stdout.buffer.write(script.encode())
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

# Responses: the same answer whole and streamed (the SDK checks the event sequence).
def item_texts(response):
    """Each output item's type and text (the ids differ between runs)."""
    return [(o.type, "".join(c.text for c in (o.content or []))) for o in response.output]



long_input = "Tell me about the sea. " * 40
r1 = client.responses.create(model=model, input=long_input, max_output_tokens=8, temperature=0)
assert r1.object == "response" and r1.status in ("completed", "incomplete"), r1
assert r1.usage.output_tokens <= 8, r1.usage
with client.responses.stream(model=model, input=long_input, max_output_tokens=8,
                             temperature=0, store=False) as stream:
    final = stream.get_final_response()
assert item_texts(final) == item_texts(r1) and item_texts(r1), (final.output, r1.output)
assert final.usage.input_tokens_details.cached_tokens >= 128, final.usage
# Stored by default: retrieved, continued (the prefix cache serves the earlier turn), deleted.
assert client.responses.retrieve(r1.id).output_text == r1.output_text
r2 = client.responses.create(model=model, previous_response_id=r1.id, input="And the sky?",
                             max_output_tokens=4, temperature=0)
assert r2.usage.input_tokens > r1.usage.input_tokens, (r1.usage, r2.usage)
assert r2.usage.input_tokens_details.cached_tokens >= 128, r2.usage
assert client.responses.delete(r1.id) is None
for call in (lambda: client.responses.retrieve(r1.id),
             lambda: client.responses.create(model=model, previous_response_id=final.id,
                                             input="x", max_output_tokens=2)):
    try:
        call()
        raise AssertionError("an unstored response was found")
    except (openai.NotFoundError, openai.BadRequestError):
        pass
print(f"responses: {item_texts(r1)!r}, continued with {r2.usage.input_tokens} input tokens")

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

    # Responses: reasoning, a message and a function call as output items, whole and
    # streamed; the call's output sent back, statelessly and through previous_response_id.
    rtools = [{"type": "function", "name": TOOL_NAME, "description": "Weather for a city",
               "parameters": tools[0]["function"]["parameters"]}]
    got = scripted.responses.create(model=model, input="Weather in Paris for 3 days?",
                                    tools=rtools, max_output_tokens=200)
    assert [o.type for o in got.output] == ["reasoning", "message", "function_call"], got.output
    assert got.output[0].content[0].text == TOOL_REASONING, got.output[0]
    assert got.output_text == TOOL_CONTENT, got.output_text
    fc = got.output[2]
    assert fc.name == TOOL_NAME and fc.arguments == TOOL_ARGUMENTS and fc.call_id, fc
    with scripted.responses.stream(model=model, input="Weather in Paris for 3 days?",
                                   tools=rtools, max_output_tokens=200) as stream:
        final = stream.get_final_response()
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[2].arguments == TOOL_ARGUMENTS, final.output[2]
    result = {"type": "function_call_output", "call_id": fc.call_id, "output": "18 C, sunny"}
    stateless = scripted.responses.create(
        model=model, tools=rtools, max_output_tokens=200, store=False,
        input=[{"role": "user", "content": "Weather in Paris for 3 days?"}]
        + [o.model_dump(exclude_none=True) for o in got.output] + [result])
    chained = scripted.responses.create(model=model, tools=rtools, max_output_tokens=200,
                                        previous_response_id=got.id, input=[result])
    assert stateless.usage.input_tokens == chained.usage.input_tokens, (stateless.usage,
                                                                         chained.usage)
    assert chained.usage.input_tokens > got.usage.input_tokens
    print(f"scripted responses call: {fc.name}({fc.arguments})")

print("openai e2e: all checks passed")
