#!/usr/bin/env python3
"""Rendering fixtures of DeepSeek-V4.1's chat format, from vLLM's own V4.1 prompt code.

vLLM 0.33.0 renders a V4.1 chat request with two files of its wheel:
`vllm/tokenizers/deepseek_v41.py` (the tokenizer wrapper: `_normalize_messages` joins content
parts with a blank line and turns image parts into `<｜deepseek_image｜>`, request tools go on
the first system message or a new empty one, thinking on by default, effort `high` by default,
`none` means chat mode, integers 1-100 accepted) and `vllm/tokenizers/deepseek_v41_encoding.py`
(the encoder itself). This script imports both from the wheel, the wrapper with stand-ins for
the three modules it imports but does not use to render (transformers' tokenizer class,
vLLM's message type alias, its tokenizer cache), wraps a stand-in tokenizer with vLLM's
`get_deepseek_v41_tokenizer` and calls the wrapper's `apply_chat_template(..., tokenize=False)`
for each request, so message normalisation, tools and effort handling are vLLM's code, not a
copy. What it emulates is only what happens before the wrapper (as in tools/make_chat_fixtures.py):
the request's `reasoning_effort` merged into `chat_template_kwargs` by vLLM's
`build_chat_params` (`enable_thinking = effort != "none"` unless given) and the tools as
`ChatCompletionToolsParam.model_dump()`.

    pip download vllm==0.33.0 --no-deps -d /tmp/vllm-wheel
    python tools/make_v41_chat_fixtures.py /tmp/vllm-wheel/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl

Run from the repository root; writes crates/server/tests/fixtures/chat_cases_v41.json (each
case: the request, the prompt text or the error the reference raised, and the order the images
are fed in), recording the wheel and the sha256 of both files. The output is committed.
"""

import argparse
import copy
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import types
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "server", "tests", "fixtures", "chat_cases_v41.json")
FILES = ("vllm/tokenizers/deepseek_v41_encoding.py", "vllm/tokenizers/deepseek_v41.py")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_chat_fixtures import (  # noqa: E402  (the V4 cases, their tools, vLLM's request merge)
    CALL_TIME,
    MULTI_TURN,
    SEARCH,
    WEATHER,
    CASES as V4_CASES,
    template_kwargs,
    tool_dump,
)


def load_reference(wheel):
    """Imports the wheel's V4.1 encoder and tokenizer wrapper (stand-ins for what they import
    but rendering never calls)."""
    tmp = tempfile.mkdtemp()
    with zipfile.ZipFile(wheel) as z:
        for name in FILES:
            z.extract(name, tmp)
    stub = lambda name, **attrs: sys.modules.setdefault(name, types.ModuleType(name)).__dict__.update(attrs)
    stub("transformers", TokenizersBackend=object)
    stub("vllm", __path__=[os.path.join(tmp, "vllm")])
    stub("vllm.renderers", __path__=[])
    stub("vllm.renderers.chat_utils", ChatCompletionMessageParam=dict)
    stub("vllm.tokenizers", __path__=[os.path.join(tmp, "vllm", "tokenizers")])
    stub("vllm.tokenizers.hf", HfTokenizer=object, get_cached_tokenizer=lambda t: t)
    stub("vllm.tokenizers.protocol", TokenizerLike=object)
    modules = []
    for name in FILES:
        mod_name = name[:-3].replace("/", ".")
        spec = importlib.util.spec_from_file_location(mod_name, os.path.join(tmp, name))
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        spec.loader.exec_module(module)
        modules.append(module)
    encoding, wrapper = modules

    class Tokenizer:  # what the wrapper asks of the tokenizer it wraps when tokenize=False
        def get_added_vocab(self):
            return {}

    return encoding, wrapper.get_deepseek_v41_tokenizer(Tokenizer())


def sha256(data):
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- cases

def img(url):
    return {"type": "image_url", "image_url": {"url": url}}


def text(t):
    return {"type": "text", "text": t}


MID_SYSTEM = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!", "reasoning": "Greet back."},
    {"role": "system", "content": "From now on answer in French."},
]


V4_REQUESTS = dict(V4_CASES)


def v4_case(name):
    """A V4 fixture's request, rendered by V4.1 too."""
    return name, V4_REQUESTS[name]


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
    case("single_user_default", [{"role": "user", "content": "Hello!"}]),
    case("single_user_chat", [{"role": "user", "content": "Hello!"}],
         chat_template_kwargs={"thinking": False}),
    case("system_user_thinking", [{"role": "system", "content": "You are terse."},
                                  {"role": "user", "content": "Hello"}]),
    case("system_user_chat", [{"role": "system", "content": "You are terse."},
                              {"role": "user", "content": "Hello"}],
         chat_template_kwargs={"enable_thinking": False}),
    case("multi_turn_drops_old_reasoning", MULTI_TURN),
    v4_case("multi_turn_keep_reasoning"),
    v4_case("multi_turn_chat"),
    v4_case("effort_low"),
    v4_case("effort_high"),
    v4_case("effort_xhigh"),
    v4_case("effort_max"),
    v4_case("effort_none_is_chat"),
    case("effort_max_re_enables_thinking", [{"role": "user", "content": "x"}],
         reasoning_effort="max", chat_template_kwargs={"thinking": False}),
    v4_case("effort_max_but_enable_thinking_false"),
    case("effort_integer_kwarg", [{"role": "user", "content": "x"}],
         chat_template_kwargs={"reasoning_effort": 33}),
    case("effort_integer_1", [{"role": "system", "content": "S"}, {"role": "user", "content": "x"}],
         chat_template_kwargs={"reasoning_effort": 1}),
    case("effort_integer_100", [{"role": "user", "content": "x"}],
         chat_template_kwargs={"reasoning_effort": 100}),
    case("effort_string_kwarg", [{"role": "user", "content": "x"}],
         chat_template_kwargs={"reasoning_effort": "low"}),
    case("effort_request_overrides_kwarg", [{"role": "user", "content": "x"}],
         reasoning_effort="max", chat_template_kwargs={"reasoning_effort": 20}),
    case("effort_integer_in_chat_mode", [{"role": "user", "content": "x"}],
         chat_template_kwargs={"reasoning_effort": 60, "thinking": False}),
    v4_case("tools_with_system"),
    v4_case("tools_without_system"),
    case("tools_without_system_chat", [{"role": "user", "content": "Weather in Paris?"}],
         tools=[WEATHER], chat_template_kwargs={"thinking": False}),
    v4_case("tools_on_first_system_not_first_message"),
    v4_case("tool_loop_with_tools_keeps_reasoning"),
    v4_case("tool_loop_without_tools_drops_reasoning"),
    v4_case("tool_loop_chat"),
    v4_case("tool_loop_then_answer_then_user"),
    v4_case("tool_loop_then_answer_then_user_no_tools"),
    case("tool_arguments_not_an_object",
         [{"role": "user", "content": "Weather?"},
          {"role": "assistant", "content": "", "tool_calls": [
              {"id": "a", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}},
              {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}},
              {"id": "c", "type": "function",
               "function": {"name": "h", "arguments": json.dumps(json.dumps({"x": 1.5}))}},
              {"id": "d", "type": "function", "function": {"name": "k", "arguments": "{oops"}}]},
          {"role": "tool", "tool_call_id": "d", "content": "D"},
          {"role": "tool", "tool_call_id": "a", "content": "A"}]),
    v4_case("tool_call_arguments_as_object"),
    case("tool_result_then_user_merge",
         [{"role": "user", "content": "context"},
          {"role": "tool", "tool_call_id": "x", "content": "orphan result"},
          {"role": "user", "content": "and a follow-up"}]),
    v4_case("consecutive_users_merge"),
    v4_case("developer_role"),
    v4_case("developer_before_last_user_dropped_when_thinking"),
    v4_case("developer_before_last_user_kept_in_chat"),
    v4_case("developer_last_opens_generation"),
    case("mid_conversation_system_opens_turn", MID_SYSTEM),
    case("mid_conversation_system_keep_reasoning", MID_SYSTEM,
         chat_template_kwargs={"drop_thinking": False}),
    case("mid_conversation_system_chat", MID_SYSTEM, chat_template_kwargs={"thinking": False}),
    case("mid_conversation_system_then_user",
         MID_SYSTEM + [{"role": "user", "content": "Salut"}]),
    case("mid_conversation_system_then_assistant",
         MID_SYSTEM + [{"role": "assistant", "content": "D'accord.", "reasoning": "OK."},
                       {"role": "user", "content": "Merci"}]),
    case("mid_conversation_system_with_tools",
         MID_SYSTEM + [{"role": "user", "content": "Weather?"}], tools=[WEATHER]),
    case("system_before_assistant",
         [{"role": "system", "content": "S"},
          {"role": "assistant", "content": "Welcome!"},
          {"role": "user", "content": "Hi"}]),
    case("tool_results_only_turn_is_not_a_user_turn",
         [{"role": "user", "content": "Time?"},
          {"role": "assistant", "content": "", "reasoning": "Call it.", "tool_calls": [CALL_TIME]},
          {"role": "tool", "tool_call_id": "call_t", "content": "12:00"},
          {"role": "assistant", "content": "Noon.", "reasoning": "Answer."},
          {"role": "tool", "tool_call_id": "call_t", "content": "late result"}]),
    case("content_parts",
         [{"role": "system", "content": [text("Part A."), text("Part B.")]},
          {"role": "user", "content": [text("Look:"), {"type": "input_text", "text": "input text"}]},
          {"role": "assistant", "content": [{"type": "output_text", "text": "Seen."}]},
          {"role": "user", "content": []}]),
    case("unicode_cjk_emoji",
         [{"role": "system", "content": "你是一个乐于助人的助手。🙂"},
          {"role": "user", "content": "こんにちは！今日は何曜日？ 🇯🇵 — naïve café \u200b tab\tnl\n"},
          {"role": "assistant", "content": "月曜日です。😀", "reasoning": "曜日を答える。"},
          {"role": "user", "content": "한국어로도 말해 줘 ✨"}]),
    v4_case("reasoning_wins_over_reasoning_content"),
    v4_case("image_after_text"),
    v4_case("images_interleaved"),
    v4_case("image_only_message_then_text_message"),
    case("image_with_tools", [{"role": "user", "content": [text("Find this place."), img("data:a")]}],
         tools=[SEARCH]),
    case("error_effort_medium", [{"role": "user", "content": "x"}], reasoning_effort="medium"),
    case("error_effort_minimal", [{"role": "user", "content": "x"}], reasoning_effort="minimal"),
    case("error_effort_integer_0", [{"role": "user", "content": "x"}],
         chat_template_kwargs={"reasoning_effort": 0}),
    case("error_effort_integer_101", [{"role": "user", "content": "x"}],
         chat_template_kwargs={"reasoning_effort": 101}),
    case("error_effort_float", [{"role": "user", "content": "x"}],
         chat_template_kwargs={"reasoning_effort": 50.0}),
    case("error_effort_bool", [{"role": "user", "content": "x"}],
         chat_template_kwargs={"reasoning_effort": True}),
    case("error_effort_unknown_string", [{"role": "user", "content": "x"}],
         chat_template_kwargs={"reasoning_effort": "extreme"}),
    v4_case("error_empty_developer"),
    case("error_unknown_role", [{"role": "function", "content": "x"},
                                {"role": "user", "content": "x"}]),
    case("error_image_placeholder_in_text",
         [{"role": "user", "content": "a <｜deepseek_image｜> b"}]),
    case("error_unsupported_part", [{"role": "user", "content": [{"type": "input_audio"}]}]),
]


def render(tokenizer, request):
    """The wrapper's prompt text and image order for one request."""
    kwargs = template_kwargs(request)
    tools = [tool_dump(t) for t in request.get("tools") or []] or None
    image_order = []
    # vLLM's DeepseekV41Renderer passes image_order (renderers/deepseek_v4.py).
    prompt = tokenizer.apply_chat_template(
        copy.deepcopy(request["messages"]), tools=tools, image_order=image_order,
        tokenize=False, **kwargs)
    return prompt, image_order


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", help="vllm-0.33.0-*.whl (pip download vllm==0.33.0 --no-deps)")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    _, tokenizer = load_reference(args.wheel)
    with zipfile.ZipFile(args.wheel) as z:
        files = {name: sha256(z.read(name)) for name in FILES}
    with open(args.wheel, "rb") as f:
        wheel_sha = sha256(f.read())
    cases = []
    for name, request in CASES:
        entry = {"name": name, "request": request}
        try:
            entry["prompt"], entry["image_order"] = render(tokenizer, request)
        except Exception as e:  # the reference refuses the request
            entry["error"] = f"{type(e).__name__}: {e}"
        cases.append(entry)
    doc = {
        "generator": "tools/make_v41_chat_fixtures.py",
        "reference": {"wheel": os.path.basename(args.wheel), "wheel_sha256": wheel_sha,
                      "files": files},
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in cases)
    print(f"wrote {len(cases)} cases ({errors} refused) to {args.out}")


if __name__ == "__main__":
    main()
