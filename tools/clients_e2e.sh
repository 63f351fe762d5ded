#!/usr/bin/env bash
# The clients a local user points at `deepinfer serve`, run for real on loopback (no internet
# needed), each configured as its documentation tells a user, against a DeepSeek-V4 model and
# a DeepSeek-V4.1 model (V4.1's own chat format). Sections, all by default, or those named:
#
#   tools/clients_e2e.sh [sdk] [llm] [agents] [aider] [webui]
#
#  sdk:    the `openai` and `anthropic` Python packages (tools/openai_e2e.py,
#          tools/anthropic_e2e.py) against the default model and a server scripted to a DSML
#          tool call (the hidden test hook --debug-force-output), with images
#          (tools/openai_vision_e2e.py) against checkpoints with a vision tower (synth presets
#          `tiny-v41-vision`, `tiny-v4-vision`) and the text-only default model, and again
#          against a V4.1 model (synth preset `tiny-v41`) scripted in V4.1's spaced markup;
#  llm:    `llm` (PyPI, 0.36) through its `--functions` tools;
#  agents: Claude Code (npm @anthropic-ai/claude-code, Messages API), Codex (npm @openai/codex,
#          Responses API), opencode (npm opencode-ai) and Qwen Code (npm @qwen-code/qwen-code),
#          both over Chat Completions;
#  aider:  aider (PyPI aider-chat 0.86.1) applying the file edit a scripted answer writes;
#  webui:  Open WebUI (PyPI open-webui 0.12.4) in Debian's chromium, headless, driven by
#          tools/webui_e2e.mjs (playwright-core from npm, no browser download): pick the model,
#          a streamed answer with its reasoning block, a follow-up served from the prefix
#          cache, Stop on a long answer, an image; keeps target/webui-e2e.png.
# In llm and agents each client runs a tool round trip against a server scripted as that
# conversation (the hidden hooks --debug-force-output and --debug-force-output-after): the
# model makes two parallel calls of the client's tool in one answer, the client runs both
# (each writes a file) and sends their results, the model answers, and the client must print
# exactly that answer.
# Servers are stopped with Ctrl-C (SIGINT) and must exit cleanly. Installs into target/ on
# first use: the Python packages (target/openai-venv, target/aider-venv, target/webui-venv),
# the npm clients (target/agents, target/webui-driver).
set -euo pipefail
cd "$(dirname "$0")/.."
sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(sdk llm agents aider webui)
for section in "${sections[@]}"; do
    case $section in
        sdk | llm | agents | aider | webui) ;;
        *) echo "unknown section '$section': pick from sdk llm agents aider webui" >&2; exit 2 ;;
    esac
done
venv="$PWD/target/openai-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check 'openai>=1.40,<4' 'anthropic>=0.40,<1' \
    'llm==0.36'
cargo build --locked -p deepinfer-cli
pids=()
logs=()
scratch=$(mktemp -d)
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "${logs[@]}" "$scratch"' EXIT

# start_server ARGS...: starts a server, waits until it listens; sets $url and $pid.
start_server() {
    local log
    log=$(mktemp)
    logs+=("$log")
    DEEPINFER_CACHE_DIR=target/deepinfer-cache target/debug/deepinfer serve --port 0 "$@" \
        2>"$log" &
    pid=$!
    pids+=("$pid")
    url=
    for _ in $(seq 1 600); do
        url=$(grep -o 'http://[0-9.:]*' "$log" | head -n1 || true)
        [ -n "$url" ] && break
        kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; echo "the server exited early" >&2; exit 1; }
        sleep 0.2
    done
    [ -n "$url" ] || { cat "$log" >&2; echo "the server did not start" >&2; exit 1; }
}

# served_name URL: the model a server serves.
served_name() {
    "$venv/bin/python" -c 'import json, sys, urllib.request
print(json.load(urllib.request.urlopen(sys.argv[1] + "/v1/models"))["data"][0]["id"])' "$1"
}

# synth PRESET: the path of a synthetic checkpoint of PRESET, written on first use.
synth() {
    [ -d "$scratch/$1" ] || target/debug/deepinfer synth --preset "$1" --out "$scratch/$1" >&2
    echo "$scratch/$1"
}

# stop_servers PID...: Ctrl-C, then a clean exit.
stop_servers() {
    for p in "$@"; do
        kill -INT "$p"
        wait "$p"
    done
}

# dsml_call FAMILY TOOL PARAM VALUE...: the scripted answer that calls TOOL once per VALUE
# (parallel calls in one answer), each with PARAM=VALUE, in the family's markup (v4:
# `<｜DSML｜tool_calls>`, v41: `<｜DSML｜ calls>` and spaced tags).
dsml_call() {
    local d="｜DSML｜" sp="" block="tool_calls" tool=$2 param=$3 v
    if [ "$1" = v41 ]; then sp=" " block=" calls"; fi
    shift 3
    printf 'The user wants me to run commands.</think>\n\n<%s%s>' "$d" "$block"
    for v in "$@"; do
        printf '\n<%s%sinvoke name="%s">\n<%s%sparameter name="%s" string="true">%s</%s%sparameter>\n</%s%sinvoke>' \
            "$d" "$sp" "$tool" "$d" "$sp" "$param" "$v" "$d" "$sp" "$d" "$sp"
    done
    printf '\n</%s%s>' "$d" "$block"
}
answer="Done: the files are written."
# The files a round trip's two calls write ("ran" into each), and the agents' commands that
# write them.
markers=(tool-ran.txt tool-ran-2.txt)
shell_cmds=("echo ran > ${markers[0]}" "echo ran > ${markers[1]}")
# tool_server FAMILY TOOL PARAM VALUE1 VALUE2 ARGS...: starts a server (ARGS after the
# script) scripted as a tool round trip: a user message gets two parallel calls of TOOL, with
# PARAM=VALUE1 and PARAM=VALUE2; the tools' results get the answer.
tool_server() {
    local family=$1 tool=$2 param=$3 v1=$4 v2=$5
    shift 5
    start_server --debug-force-output "$(dsml_call "$family" "$tool" "$param" "$v1" "$v2")" \
        --debug-force-output-after 'tool_result>' "The commands ran.</think>$answer" "$@"
}
# tool_ran CLIENT WORK FILE...: the client's tool wrote "ran" into each WORK/FILE.
tool_ran() {
    local client=$1 work=$2 f
    shift 2
    for f in "$@"; do
        [ "$(cat "$work/$f" 2>/dev/null)" = ran ] || { echo "$client did not write $f" >&2; exit 1; }
    done
}
# round_trip_done CLIENT WORK OUT: the client printed exactly the answer, and ran both calls.
round_trip_done() {
    [ "$3" = "$answer" ] || { echo "$1 did not print the server's answer" >&2; exit 1; }
    tool_ran "$1" "$2" "${markers[@]}"
}
# llm_turn FAMILY ARGS...: `llm` (PyPI) runs a tool round trip with its --functions tool (it
# writes the file). The model is configured as its docs tell a user (extra-openai-models.yaml).
llm_turn() {
    local family=$1 work="$scratch/llm-$1" llm="$venv/bin/llm"
    shift
    tool_server "$family" write_marker name "${markers[@]}" "$@"
    mkdir -p "$work/home"
    cat > "$work/home/extra-openai-models.yaml" <<YAML
- model_id: deepinfer
  model_name: $(served_name "$url")
  api_base: $url/v1
  supports_tools: true
YAML
    out=$(cd "$work" && LLM_USER_PATH="$work/home" timeout 300 "$llm" -m deepinfer \
        --functions 'def write_marker(name: str) -> str:
    "Writes ran into the file name."
    open(name, "w").write("ran")
    return "written"' "write the markers")
    echo "llm ($family): $out"
    round_trip_done llm "$work" "$out"
    stop_servers "$pid"
}

# sdk: the official Python SDKs, text, tools and images, V4 and V4.1.
sdk_section() {
    local main_url main_pid tool_url tool_pid vision_url vision_pid v4_url v4_pid v41_url v41_pid
    local v41_tool_url v41_tool_pid script
    start_server
    main_url=$url main_pid=$pid
    script=$("$venv/bin/python" tools/openai_e2e.py --print-tool-script)
    start_server --debug-force-output "$script"
    tool_url=$url tool_pid=$pid
    "$venv/bin/python" tools/openai_e2e.py "$main_url" "$tool_url"
    "$venv/bin/python" tools/anthropic_e2e.py "$(served_name "$main_url")" "$main_url" "$tool_url"
    start_server --model "$(synth tiny-v41-vision)"
    vision_url=$url vision_pid=$pid
    start_server --model "$(synth tiny-v4-vision)"
    v4_url=$url v4_pid=$pid
    "$venv/bin/python" tools/openai_vision_e2e.py "$vision_url" "$main_url" "$v4_url"
    # DeepSeek-V4.1 in its own chat format: the same checks, the scripted call in V4.1's markup.
    start_server --model "$(synth tiny-v41)"
    v41_url=$url v41_pid=$pid
    start_server --model "$(synth tiny-v41)" --debug-force-output \
        "$("$venv/bin/python" tools/openai_e2e.py --print-tool-script v41)"
    v41_tool_url=$url v41_tool_pid=$pid
    "$venv/bin/python" tools/openai_e2e.py "$v41_url" "$v41_tool_url"
    "$venv/bin/python" tools/anthropic_e2e.py "$(served_name "$v41_url")" "$v41_url" "$v41_tool_url"
    stop_servers "$main_pid" "$tool_pid" "$vision_pid" "$v4_pid" "$v41_pid" "$v41_tool_pid"
    echo "servers stopped cleanly"
}

# llm: its round trip against a V4 and a V4.1 model.
llm_section() {
    llm_turn v4
    llm_turn v41 --model "$(synth tiny-v41)"
}

# The agents, pinned to the versions this was checked with. All ask for reasoning, so the
# scripted answers think first; only the text after </think> is printed.
agents=target/agents
bin="$PWD/$agents/node_modules/.bin"
home="$scratch/home"
mkdir -p "$home/.codex"
install_agents() {
    # Qwen Code 0.15 is the last that runs on Node.js 20 (later ones ask for 22).
    local clients="@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 opencode-ai@1.18.33
        @qwen-code/qwen-code@0.15.10" b
    for b in claude codex opencode qwen; do
        if [ ! -x "$bin/$b" ]; then
            mkdir -p "$agents"
            # shellcheck disable=SC2086 # the list splits into packages
            npm install --prefix "$agents" --no-audit --no-fund --loglevel=error $clients
            break
        fi
    done
}
# Each *_turn FAMILY ARGS... has an agent run a tool round trip against a server (ARGS after
# the script) scripted as that conversation: the model calls the agent's shell tool twice in
# one answer, the agent runs both commands (each writes a file) and sends the results, the
# model answers.
# Claude Code over the Messages API, its `Bash` tool allowed.
claude_turn() {
    local family=$1 work="$scratch/claude-$1"
    shift
    tool_server "$family" Bash command "${shell_cmds[@]}" "$@"
    mkdir -p "$work"
    out=$(cd "$work" && HOME="$home" ANTHROPIC_BASE_URL="$url" ANTHROPIC_API_KEY=unused \
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1 \
        timeout 600 "$bin/claude" -p "write the files" --model "$(served_name "$url")" \
        --allowedTools Bash)
    echo "claude -p ($family): $out"
    round_trip_done "Claude Code" "$work" "$out"
    stop_servers "$pid"
}
# Codex over the Responses API (a provider in config.toml), its `exec_command` tool in a
# workspace-write sandbox.
codex_turn() {
    local family=$1 work="$scratch/codex-$1"
    shift
    tool_server "$family" exec_command cmd "${shell_cmds[@]}" "$@"
    cat > "$home/.codex/config.toml" <<TOML
model = "$(served_name "$url")"
model_provider = "local"
[model_providers.local]
name = "local"
base_url = "$url/v1"
wire_api = "responses"
env_key = "LOCAL_API_KEY"
TOML
    mkdir -p "$work"
    out=$(cd "$work" && HOME="$home" CODEX_HOME="$home/.codex" LOCAL_API_KEY=unused \
        timeout 600 "$bin/codex" exec --skip-git-repo-check --sandbox workspace-write \
        "write the files" 2>"$scratch/codex.err") || { cat "$scratch/codex.err" >&2; exit 1; }
    echo "codex exec ($family): $out"
    [ "$out" = "$answer" ] || cat "$scratch/codex.err" >&2
    round_trip_done Codex "$work" "$out"
    stop_servers "$pid"
}
# opencode over Chat Completions (an `@ai-sdk/openai-compatible` provider in opencode.json,
# as its docs tell a user), its `bash` tool approved by `--auto`.
opencode_turn() {
    local family=$1 work="$scratch/opencode-$1" line
    shift
    tool_server "$family" bash command "${shell_cmds[@]}" "$@"
    mkdir -p "$work"
    cat > "$work/opencode.json" <<JSON
{
  "\$schema": "https://opencode.ai/config.json",
  "provider": {"local": {"npm": "@ai-sdk/openai-compatible", "name": "deepinfer",
               "options": {"baseURL": "$url/v1"},
               "models": {"$(served_name "$url")": {"name": "deepinfer"}}}},
  "model": "local/$(served_name "$url")"
}
JSON
    out=$(cd "$work" && HOME="$home" timeout 600 "$bin/opencode" run --auto "write the files" 2>&1) \
        || { echo "$out" >&2; exit 1; }
    # Its output is decorated (the model, the command it ran); the answer is a line of it.
    line=$(printf '%s\n' "$out" | grep -xF "$answer" || echo "$out" >&2)
    echo "opencode run ($family): $line"
    round_trip_done opencode "$work" "$line"
    stop_servers "$pid"
}
# Qwen Code over Chat Completions (`--auth-type openai --openai-base-url`), its
# `run_shell_command` tool approved by `--yolo`.
qwen_turn() {
    local family=$1 work="$scratch/qwen-$1"
    shift
    tool_server "$family" run_shell_command command "${shell_cmds[@]}" "$@"
    mkdir -p "$work"
    out=$(cd "$work" && HOME="$home" timeout 600 "$bin/qwen" --auth-type openai \
        --openai-base-url "$url/v1" --openai-api-key unused -m "$(served_name "$url")" --yolo \
        "write the files")
    echo "qwen ($family): $out"
    round_trip_done "Qwen Code" "$work" "$out"
    stop_servers "$pid"
}
# agents: each agent's round trip against a V4 and a V4.1 model.
agents_section() {
    local family turn model_args
    install_agents
    for family in v4 v41; do
        model_args=()
        if [ "$family" = v41 ]; then model_args=(--model "$(synth tiny-v41)"); fi
        for turn in claude_turn codex_turn opencode_turn qwen_turn; do
            "$turn" "$family" "${model_args[@]}"
        done
    done
}

# aider (PyPI aider-chat, in its own venv: it pins its own openai) has no tool calls: it
# edits files from the answer's text. Its turn: the model (scripted to think, then write a
# file in aider's `whole` edit format) answers, aider applies the edit.
aider_venv="$PWD/target/aider-venv"
aider_turn() {
    local family=$1 work="$scratch/aider-$1"
    shift
    start_server --debug-force-output "$(printf 'I will write the file.</think>tool-ran.txt\n```\nran\n```')" "$@"
    mkdir -p "$work"
    # LITELLM_LOCAL_MODEL_COST_MAP: litellm reads its model table from the package, not the web.
    out=$(cd "$work" && HOME="$home" OPENAI_API_KEY=unused LITELLM_LOCAL_MODEL_COST_MAP=True \
        timeout 600 "$aider_venv/bin/aider" --model "openai/$(served_name "$url")" \
        --openai-api-base "$url/v1" --message "write ran into tool-ran.txt" --no-git \
        --yes-always --no-check-update --no-show-model-warnings --no-analytics --no-pretty \
        --no-stream </dev/null 2>&1) || { echo "$out" >&2; exit 1; }
    echo "aider ($family): $(printf '%s\n' "$out" | grep -F 'Applied edit')"
    printf '%s\n' "$out" | grep -qxF "Applied edit to tool-ran.txt" \
        || { echo "$out" >&2; echo "aider did not apply the answer's edit" >&2; exit 1; }
    tool_ran aider "$work" tool-ran.txt
    stop_servers "$pid"
}
aider_section() {
    if [ ! -x "$aider_venv/bin/aider" ]; then
        python3 -m venv "$aider_venv"
        "$aider_venv/bin/pip" install --quiet --disable-pip-version-check 'aider-chat==0.86.1'
    fi
    aider_turn v4
    aider_turn v41 --model "$(synth tiny-v41)"
}


# Open WebUI (its own venv: it pins its own packages; about 7 GB with torch) against two
# scripted vision models, V4 and V4.1, listed together; tools/webui_e2e.mjs drives it.
webui_venv="$PWD/target/webui-venv"
webui_driver="$PWD/target/webui-driver"
install_webui() {
    command -v chromium >/dev/null \
        || { echo "chromium not found: install Debian's chromium (apt-get install chromium)" >&2; exit 1; }
    if [ ! -x "$webui_venv/bin/open-webui" ]; then
        python3 -m venv "$webui_venv"
        "$webui_venv/bin/pip" install --quiet --disable-pip-version-check 'open-webui==0.12.4'
    fi
    if [ ! -f "$webui_driver/node_modules/playwright-core/index.mjs" ]; then
        mkdir -p "$webui_driver"
        npm install --prefix "$webui_driver" --no-audit --no-fund --loglevel=error playwright-core@1.64.1
    fi
}
# span_end_text MODEL: the text of the token an image's span ends with in MODEL's prompts
# (V4: the sentinel `image_sentinel_base_id` + 4; V4.1: `text_config.image_token_id`), so
# that a script turn can answer the prompts that end with an image.
span_end_text() {
    "$venv/bin/python" - "$1" <<'PY'
import json, sys
config = json.load(open(sys.argv[1] + "/config.json"))
text = config.get("text_config", config)  # V4.1 nests the decoder's fields
end = text.get("image_token_id") or config.get("image_sentinel_base_id", 129257) + 4
added = json.load(open(sys.argv[1] + "/tokenizer.json"))["added_tokens"]
print(next(t["content"] for t in added if t["id"] == end))
PY
}
# webui_server PRESET NAME: a vision model scripted for tools/webui_e2e.mjs.
webui_server() {
    local model long
    model=$(synth "$1")
    long="Let me write a long story.</think>Once upon a time there was a model.$(printf ' It wrote line %d of the story.' $(seq 1 799))"
    start_server --model "$model" --served-model-name "$2" \
        --debug-force-output-after "$(span_end_text "$model")" 'The user sent a picture.</think>I see your picture.' \
        --debug-force-output-after ' long story' "$long" \
        --debug-force-output 'Let me think about the greeting.</think>Hello from deepinfer.'
}
webui_section() {
    local v4_url v4_pid v41_url v41_pid port webui_pid
    install_webui
    webui_server tiny-v4-vision deepseek-v4-vision
    v4_url=$url v4_pid=$pid
    webui_server tiny-v41-vision deepseek-v41-vision
    v41_url=$url v41_pid=$pid
    port=$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # Configured as its docs tell a user (an OpenAI connection per server, single-user mode),
    # offline. Its follow-up and tag tasks are off, so that the prefix cache count the driver
    # reads is the chat request's own; title generation stays on.
    (cd "$scratch" && DATA_DIR="$scratch/webui" WEBUI_AUTH=False ENABLE_OLLAMA_API=False \
        OPENAI_API_BASE_URLS="$v4_url/v1;$v41_url/v1" OPENAI_API_KEYS="unused;unused" \
        OFFLINE_MODE=True HF_HUB_OFFLINE=1 WEBUI_SECRET_KEY=e2e ENABLE_FOLLOW_UP_GENERATION=False \
        ENABLE_TAGS_GENERATION=False ANONYMIZED_TELEMETRY=False DO_NOT_TRACK=True \
        SCARF_NO_ANALYTICS=True exec "$webui_venv/bin/open-webui" serve --host 127.0.0.1 \
        --port "$port" >"$scratch/webui.log" 2>&1) &
    webui_pid=$!
    pids+=("$webui_pid")
    for _ in $(seq 1 300); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
        kill -0 "$webui_pid" 2>/dev/null || { cat "$scratch/webui.log" >&2; echo "Open WebUI exited" >&2; exit 1; }
        sleep 1
    done
    PLAYWRIGHT_CORE="$webui_driver/node_modules/playwright-core/index.mjs" timeout 600 \
        node tools/webui_e2e.mjs "http://127.0.0.1:$port" target/webui-e2e.png \
        "deepseek-v4-vision=$v4_url" "deepseek-v41-vision=$v41_url" \
        || { tail -n 50 "$scratch/webui.log" >&2; exit 1; }
    kill "$webui_pid"
    wait "$webui_pid" || true
    stop_servers "$v4_pid" "$v41_pid"
}

for section in "${sections[@]}"; do
    started=$SECONDS
    "${section}_section"
    echo "clients e2e: $section took $((SECONDS - started)) s (installs included)"
done
echo "clients e2e: ${sections[*]}: all passed"
