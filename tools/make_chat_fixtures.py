#!/usr/bin/env python3
"""Rendering fixtures for crates/server/tests/chat.rs from the reference DeepSeek-V4 encoder.

DeepSeek-V4 has no Jinja chat template. vLLM carries DeepSeek's Python encoder as
`vllm/tokenizers/deepseek_v4_encoding.py`; this script loads that file (it only needs the
standard library), feeds it OpenAI-style requests prepared the way vLLM's chat path prepares
them for the `deepseek_v4` tokenizer, and writes crates/server/tests/fixtures/chat_cases.json:
each case's request (messages, tools, reasoning_effort, chat_template_kwargs), the encoder
arguments vLLM would pass, and the expected prompt text (or the error the encoder raised).

The encoder file is third-party code and is not committed. Get it from a vLLM wheel:

    pip download vllm==0.33.0 --no-deps -d /tmp/vllm-wheel
    unzip -j /tmp/vllm-wheel/vllm-0.33.0-*.whl vllm/tokenizers/deepseek_v4_encoding.py -d /tmp/dsv4
    python tools/make_chat_fixtures.py /tmp/dsv4/deepseek_v4_encoding.py \\
        --wheel /tmp/vllm-wheel/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl

Run from the repository root; the output is committed (CI has no Python). The JSON records the
wheel, version, file and sha256 used.

What is emulated from vLLM 0.33 (0.34 renders V4 the same way) (`ChatCompletionRequest`, `renderers/chat_utils`,
`renderers/deepseek_v4.py`, `tokenizers/deepseek_v4.py`):
  * `reasoning_content` on a message is renamed `reasoning` unless `reasoning` is set;
  * content is parsed with content_format="openai": a string or text parts become a list of
    {"type": "text"} parts (the encoder joins them with a blank line), except for `tool`
    messages whose text parts are joined with "\\n" first; null content is an empty list;
  * assistant tool-call arguments are parsed from JSON ("" or null -> {});
  * tools are `ChatCompletionToolsParam.model_dump()`: function = name, description,
    parameters (null when absent), strict (only when set);
  * `build_chat_params`: a request reasoning_effort sets enable_thinking = (effort != "none")
    unless chat_template_kwargs has enable_thinking; None values are not merged;
  * the tokenizer wrapper: thinking on unless thinking/enable_thinking say otherwise, tools
    attached to the first system message (or a new one in front), effort mapping
    (none -> chat mode, max, low/minimal/medium -> low, other -> high, unset -> high when
    thinking), drop_thinking from the kwargs (default True).
"""

import argparse
import copy
import hashlib
import importlib.util
import json
import os
import re
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "server", "tests", "fixtures", "chat_cases.json")
FILE_IN_WHEEL = "vllm/tokenizers/deepseek_v4_encoding.py"

TEXT_PART_TYPES = ("text", "input_text", "output_text")


def load_encoder(path):
    spec = importlib.util.spec_from_file_location("deepseek_v4_encoding", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- vLLM request preparation


def text_parts(content):
    """OpenAI content -> list of {"type": "text", "text": ...} (content_format="openai")."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts = []
    for part in content:
        if isinstance(part, str):
            parts.append({"type": "text", "text": part})
        elif part.get("type") in TEXT_PART_TYPES:
            if part.get("text") is not None:
                parts.append({"type": "text", "text": part["text"]})
        elif part.get("type") == "image_url":
            # parse_chat_messages leaves {"type": "image"} where the image was; the encoder's
            # flatten_content_blocks puts IMAGE_PLACEHOLDER there.
            parts.append({"type": "image"})
        else:
            raise ValueError(f"unsupported content part {part.get('type')!r}")
    return parts


def prepare_message(msg):
    msg = copy.deepcopy(msg)
    reasoning_content = msg.pop("reasoning_content", None)
    if reasoning_content is not None and msg.get("reasoning") is None:
        msg["reasoning"] = reasoning_content
    role = msg["role"]
    out = {"role": role, "content": text_parts(msg.get("content"))}
    if role == "assistant":
        if msg.get("tool_calls") is not None:
            out["tool_calls"] = list(msg["tool_calls"])
        if msg.get("reasoning") is not None:
            out["reasoning"] = msg["reasoning"]
            out["reasoning_content"] = msg["reasoning"]
    elif role == "tool":
        if "tool_call_id" in msg:
            out["tool_call_id"] = msg["tool_call_id"]
        out["content"] = "\n".join(p["text"] for p in out["content"])
    if isinstance(msg.get("name"), str):
        out["name"] = msg["name"]
    if role == "developer":
        out["tools"] = None
    return out


def postprocess_tool_calls(messages):
    for m in messages:
        if m["role"] != "assistant" or "tool_calls" not in m:
            continue
        if len(m["tool_calls"]) == 0:
            m.pop("tool_calls")
            continue
        for call in m["tool_calls"]:
            fn = call["function"]
            args = fn.get("arguments")
            if args:
                parsed = args if isinstance(args, dict) else json.loads(args)
                fn["arguments"] = parsed if isinstance(parsed, dict) else {}
            else:
                fn["arguments"] = {}


def tool_dump(tool):
    fn = tool["function"]
    dumped = {
        "name": fn["name"],
        "description": fn.get("description"),
        "parameters": fn.get("parameters"),
    }
    if fn.get("strict") is not None:
        dumped["strict"] = fn["strict"]
    return {"type": "function", "function": dumped}


def template_kwargs(request):
    """build_chat_params: the kwargs apply_chat_template receives."""
    effort = request.get("reasoning_effort")
    user_kwargs = request.get("chat_template_kwargs") or {}
    extra = {"reasoning_effort": effort}
    if effort is not None and "enable_thinking" not in user_kwargs:
        extra["enable_thinking"] = effort != "none"
    merged = dict(user_kwargs)
    for k, v in extra.items():
        if v is None or v == "auto":
            continue
        merged[k] = v
    return merged


def encoder_args(request):
    """The DeepSeek-V4 tokenizer wrapper: messages and encode_messages arguments."""
    kwargs = template_kwargs(request)
    thinking_enabled = bool(kwargs.get("thinking")) or bool(kwargs.get("enable_thinking"))
    if "thinking" not in kwargs and "enable_thinking" not in kwargs:
        thinking_enabled = True
    thinking_mode = "thinking" if thinking_enabled else "chat"

    messages = [prepare_message(m) for m in request["messages"]]
    postprocess_tool_calls(messages)
    tools = [tool_dump(t) for t in request.get("tools") or []]
    if tools:
        idx = next((i for i, m in enumerate(messages) if m.get("role") == "system"), None)
        if idx is None:
            messages.insert(0, {"role": "system"})
            idx = 0
        else:
            messages[idx] = copy.copy(messages[idx])
        messages[idx]["tools"] = tools

    effort = kwargs.get("reasoning_effort")
    if not isinstance(effort, str):
        effort = "high" if thinking_enabled else None
    elif effort == "none":
        thinking_mode = "chat"
        effort = None
    elif effort == "max":
        effort = "max"
    elif effort in ("low", "minimal", "medium"):
        effort = "low"
    else:
        effort = "high"
    config = {
        "thinking_mode": thinking_mode,
        "drop_thinking": kwargs.get("drop_thinking", True),
        "reasoning_effort": effort,
    }
    return messages, config


# ---------------------------------------------------------------- cases

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name, e.g. 杭州"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 1e1, "default": 3},
            },
            "required": ["location"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {
                    "type": "object",
                    "properties": {"site": {"type": "string"}, "after": {"type": "number"}},
                },
                "top_k": {"type": "integer"},
                "threshold": {"type": "number", "default": 0.25},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
NO_PARAMS = {"type": "function", "function": {"name": "get_time"}}

CALL_WEATHER = {
    "id": "call_w",
    "type": "function",
    "function": {"name": "get_weather", "arguments": json.dumps({"location": "杭州", "days": 2})},
}
CALL_SEARCH = {
    "id": "call_s",
    "type": "function",
    "function": {
        "name": "search",
        "arguments": (
            '{"query": "DeepSeek \\"V4\\" release\\nnotes", "filters": {"site": "example.com",'
            ' "after": 2024.5}, "top_k": 5, "threshold": 1e-3, "exact": true, "lang": null,'
            ' "tags": ["a", 1, 2.0, {"z": 0, "a": -1}], "big": 123456789012345678901234567890}'
        ),
    },
}
CALL_TIME = {"id": "call_t", "type": "function", "function": {"name": "get_time", "arguments": ""}}

TOOL_LOOP = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather in Hangzhou, and any news about DeepSeek V4?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning": "I need the weather and a search.",
        "tool_calls": [CALL_WEATHER, CALL_SEARCH],
    },
    # Results arrive out of call order; the encoder puts them back in call order.
    {"role": "tool", "tool_call_id": "call_s", "content": "V4 released."},
    {"role": "tool", "tool_call_id": "call_w", "content": [{"type": "text", "text": "Sunny"},
                                                           {"type": "text", "text": "25°C"}]},
]

MULTI_TURN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!", "reasoning": "Greet back."},
    {"role": "user", "content": "2+2?"},
]


def case(name, messages, tools=None, reasoning_effort=None, chat_template_kwargs=None):
    request = {"messages": messages}
    if tools is not None:
        request["tools"] = tools
    if reasoning_effort is not None:
        request["reasoning_effort"] = reasoning_effort
    if chat_template_kwargs is not None:
        request["chat_template_kwargs"] = chat_template_kwargs
    return name, request


CASES = [
    case("single_user_default", [{"role": "user", "content": "Hello"}]),
    case("system_user_chat", [{"role": "system", "content": "You are terse."},
                              {"role": "user", "content": "Hello"}],
         chat_template_kwargs={"thinking": False}),
    case("multi_turn_thinking_drops_old_reasoning", MULTI_TURN),
    case("multi_turn_chat", MULTI_TURN, chat_template_kwargs={"thinking": False}),
    case("multi_turn_keep_reasoning", MULTI_TURN, chat_template_kwargs={"drop_thinking": False}),
    case("multi_turn_enable_thinking_kwarg", MULTI_TURN,
         chat_template_kwargs={"enable_thinking": True}),
    case("effort_max", MULTI_TURN, reasoning_effort="max"),
    case("effort_high", [{"role": "user", "content": "Prove it."}], reasoning_effort="high"),
    case("effort_xhigh", [{"role": "user", "content": "Prove it."}], reasoning_effort="xhigh"),
    case("effort_low", [{"role": "user", "content": "Quick one."}], reasoning_effort="low"),
    case("effort_none_is_chat", MULTI_TURN, reasoning_effort="none"),
    case("effort_medium_enables_thinking", [{"role": "user", "content": "x"}],
         reasoning_effort="medium", chat_template_kwargs={"thinking": False}),
    case("effort_max_but_enable_thinking_false", [{"role": "user", "content": "x"}],
         reasoning_effort="max", chat_template_kwargs={"enable_thinking": False}),
    case("effort_in_template_kwargs", [{"role": "user", "content": "x"}],
         chat_template_kwargs={"reasoning_effort": "max"}),
    case("tools_with_system", [{"role": "system", "content": "Use tools when useful."},
                               {"role": "user", "content": "Weather in Paris?"}],
         tools=[WEATHER, SEARCH, NO_PARAMS]),
    case("tools_without_system", [{"role": "user", "content": "Weather in Paris?"}],
         tools=[WEATHER]),
    case("tools_chat_mode", [{"role": "user", "content": "Weather in Paris?"}],
         tools=[WEATHER], chat_template_kwargs={"thinking": False}),
    case("tools_on_first_system_not_first_message",
         [{"role": "user", "content": "first"},
          {"role": "system", "content": "late system"},
          {"role": "user", "content": "second"}],
         tools=[NO_PARAMS]),
    case("tool_loop_with_tools_keeps_reasoning", TOOL_LOOP, tools=[WEATHER, SEARCH]),
    case("tool_loop_without_tools_drops_reasoning", TOOL_LOOP),
    case("tool_loop_chat", TOOL_LOOP, tools=[WEATHER, SEARCH],
         chat_template_kwargs={"thinking": False}),
    case("tool_loop_effort_max", TOOL_LOOP, tools=[WEATHER, SEARCH], reasoning_effort="max"),
    case("tool_loop_then_answer_then_user",
         TOOL_LOOP + [
             {"role": "assistant", "content": "Sunny, 25°C; V4 is out.",
              "reasoning": "Summarise."},
             {"role": "user", "content": "Thanks! What time is it?"},
             {"role": "assistant", "content": "", "reasoning_content": "Call get_time.",
              "tool_calls": [CALL_TIME]},
             {"role": "tool", "tool_call_id": "call_t", "content": "12:00"},
             {"role": "user", "content": "And in Tokyo?"},
         ], tools=[WEATHER, SEARCH, NO_PARAMS]),
    case("tool_loop_then_answer_then_user_no_tools",
         TOOL_LOOP + [
             {"role": "assistant", "content": "Sunny, 25°C; V4 is out.",
              "reasoning": "Summarise."},
             {"role": "user", "content": "Thanks!"},
         ]),
    case("tool_call_arguments_as_object",
         [{"role": "user", "content": "Weather?"},
          {"role": "assistant", "content": "Checking.",
           "tool_calls": [{"id": "c1", "type": "function",
                           "function": {"name": "get_weather",
                                        "arguments": {"unit": "celsius", "location": "Oslo",
                                                      "days": 1.5}}}]},
          {"role": "tool", "tool_call_id": "c1", "content": "Cold"}],
         tools=[WEATHER]),
    case("tool_result_after_user_merges",
         [{"role": "user", "content": "context"},
          {"role": "tool", "tool_call_id": "x", "content": "orphan result"},
          {"role": "tool", "content": None},
          {"role": "user", "content": "and a follow-up"}]),
    case("consecutive_users_merge",
         [{"role": "system", "content": "S"},
          {"role": "user", "content": "one"},
          {"role": "user", "content": "two"}]),
    case("developer_role",
         [{"role": "developer", "content": "Answer in French."},
          {"role": "user", "content": "Hello"}]),
    case("developer_before_last_user_dropped_when_thinking",
         [{"role": "system", "content": "S"},
          {"role": "developer", "content": "Dev note"},
          {"role": "user", "content": "Q1"},
          {"role": "assistant", "content": "A1", "reasoning": "R1"},
          {"role": "user", "content": "Q2"}]),
    case("developer_before_last_user_kept_in_chat",
         [{"role": "system", "content": "S"},
          {"role": "developer", "content": "Dev note"},
          {"role": "user", "content": "Q1"},
          {"role": "assistant", "content": "A1", "reasoning": "R1"},
          {"role": "user", "content": "Q2"}],
         chat_template_kwargs={"thinking": False}),
    case("developer_last_opens_generation",
         [{"role": "user", "content": "Q1"},
          {"role": "developer", "content": "Be formal."}]),
    case("content_parts",
         [{"role": "system", "content": [{"type": "text", "text": "Part A."},
                                         {"type": "text", "text": "Part B."}]},
          {"role": "user", "content": [{"type": "text", "text": "Look:"}, "bare string part",
                                       {"type": "input_text", "text": "input text"},
                                       {"type": "text", "text": None}]},
          {"role": "assistant", "content": [{"type": "output_text", "text": "Seen."}]},
          {"role": "user", "content": []}]),
    case("unicode_cjk_emoji",
         [{"role": "system", "content": "你是一个乐于助人的助手。🙂"},
          {"role": "user", "content": "こんにちは！今日は何曜日？ 🇯🇵 — naïve café, Ünïcödé \u200b tab\tnl\n"},
          {"role": "assistant", "content": "月曜日です。😀", "reasoning": "曜日を答える。"},
          {"role": "user", "content": "한국어로도 말해 줘 ✨"}]),
    case("reasoning_content_alias",
         [{"role": "user", "content": "Q"},
          {"role": "assistant", "content": "A", "reasoning_content": "via reasoning_content"},
          {"role": "user", "content": "Q2"}],
         chat_template_kwargs={"drop_thinking": False}),
    case("reasoning_wins_over_reasoning_content",
         [{"role": "user", "content": "Q"},
          {"role": "assistant", "content": "A", "reasoning": "R", "reasoning_content": "RC"},
          {"role": "user", "content": "Q2"}],
         chat_template_kwargs={"drop_thinking": False}),
    case("system_last_opens_generation",
         [{"role": "user", "content": "Q"},
          {"role": "assistant", "content": "A"},
          {"role": "system", "content": "Now summarise."}]),
    case("system_before_assistant_opens_turn",
         [{"role": "system", "content": "S"},
          {"role": "assistant", "content": "Welcome!"},
          {"role": "user", "content": "Hi"}]),
    case("empty_tool_calls_list",
         [{"role": "user", "content": "Q"},
          {"role": "assistant", "content": "A", "tool_calls": []},
          {"role": "user", "content": "Q2"}]),
    case("special_characters_in_content",
         [{"role": "user", "content": "Braces {like} this, <tags>, \"quotes\", back\\slash, "
                                      "and a literal </think> mention"}]),
    # In thinking mode the encoder silently drops these before the last user turn (as it drops
    # developer turns there); in chat mode it raises, which is what render_chat always does.
    case("image_after_text",
         [{"role": "user", "content": [{"type": "text", "text": "Describe this picture."},
                                       {"type": "image_url", "image_url": {"url": "data:a"}}]}]),
    case("images_interleaved",
         [{"role": "system", "content": "You see images."},
          {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:a"}},
                                       {"type": "text", "text": "and"},
                                       {"type": "image_url", "image_url": {"url": "data:b"}},
                                       {"type": "text", "text": "?"}]},
          {"role": "assistant", "content": "Two cats.", "reasoning": "Look."},
          {"role": "user", "content": [{"type": "text", "text": "And this one?"},
                                       {"type": "image_url", "image_url": {"url": "data:c"}}]}]),
    case("image_only_message_then_text_message",
         [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:a"}}]},
          {"role": "user", "content": "What is it?"}],
         chat_template_kwargs={"thinking": False}),
    case("error_empty_developer", [{"role": "developer", "content": ""},
                                   {"role": "user", "content": "x"}],
         chat_template_kwargs={"thinking": False}),
    case("error_unknown_role", [{"role": "function", "content": "x"},
                                {"role": "user", "content": "x"}],
         chat_template_kwargs={"thinking": False}),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("encoder", help="path of deepseek_v4_encoding.py extracted from the wheel")
    ap.add_argument("--wheel", help="the wheel it came from (name, version and sha256 recorded)")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()

    enc = load_encoder(args.encoder)
    reference = {"file": FILE_IN_WHEEL, "sha256": sha256(args.encoder)}
    if args.wheel:
        name = os.path.basename(args.wheel)
        match = re.match(r"([A-Za-z0-9_]+)-([^-]+)-", name)
        reference.update(
            package=match.group(1) if match else None,
            version=match.group(2) if match else None,
            wheel=name,
            wheel_sha256=sha256(args.wheel),
        )
        with zipfile.ZipFile(args.wheel) as z:
            in_wheel = hashlib.sha256(z.read(FILE_IN_WHEEL)).hexdigest()
        if in_wheel != reference["sha256"]:
            raise SystemExit(f"{args.encoder} differs from {FILE_IN_WHEEL} in {name}")

    cases = []
    for name, request in CASES:
        entry = {"name": name, "request": request}
        try:
            messages, config = encoder_args(request)
            entry["encoder_args"] = config
            entry["prompt"] = enc.encode_messages(messages, **config)
        except Exception as e:  # the reference rejects the conversation
            entry["error"] = f"{type(e).__name__}: {e}"
        cases.append(entry)

    doc = {
        "generator": "tools/make_chat_fixtures.py",
        "reference": reference,
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {args.out}")


if __name__ == "__main__":
    main()
