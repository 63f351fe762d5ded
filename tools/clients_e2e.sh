#!/usr/bin/env bash
# The official clients against `deepinfer serve` on loopback (no internet needed):
#  1. the `openai` and `anthropic` Python packages (tools/openai_e2e.py, tools/anthropic_e2e.py)
#     against the default model and against a second server whose output is scripted to a
#     DSML tool call (the hidden test hook --debug-force-output); `openai` and `anthropic`
#     with images (tools/openai_vision_e2e.py) against checkpoints with a vision tower (synth
#     presets `tiny-v41-vision`, `tiny-v4-vision`) and the text-only default model; the
#     `openai` and `anthropic` checks again against a DeepSeek-V4.1 model (synth preset
#     `tiny-v41`, V4.1's chat format) whose scripted call is in V4.1's spaced markup;
#  2. `llm` (PyPI, 0.36) running a tool round trip (two parallel calls) through its `--functions`
#     tools against a
#     V4 and a V4.1 model, each server scripted as that conversation;
#  3. Claude Code (npm @anthropic-ai/claude-code, Messages API) and Codex (npm @openai/codex,
#     Responses API) each completing a tool round trip (`claude -p`, `codex exec`: the model
#     makes two parallel calls of the agent's shell tool in one answer, the agent runs both
#     and sends their results, the model answers)
#     against a server scripted as that conversation (the hidden hooks --debug-force-output
#     and --debug-force-output-after): the default (V4) model's, then a V4.1 model's; and
#     opencode (npm opencode-ai) and Qwen Code (npm @qwen-code/qwen-code), both over Chat
#     Completions, the same with their shell tools;
#  4. aider (PyPI aider-chat 0.86.1) applying the file edit a scripted answer writes, against
#     both models.
# Servers are stopped with Ctrl-C (SIGINT) and must exit cleanly. Installs the Python packages
# into target/openai-venv, the npm clients into target/agents on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
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
# The two commands of every agent's round trip: two calls in one answer.
shell_cmds=("echo ran > tool-ran.txt" "echo ran > tool-ran-2.txt")
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
    tool_ran "$1" "$2" tool-ran.txt tool-ran-2.txt
}
# llm_turn FAMILY ARGS...: `llm` (PyPI) runs a tool round trip with its --functions tool (it
# writes the file). The model is configured as its docs tell a user (extra-openai-models.yaml).
llm_turn() {
    local family=$1 work="$scratch/llm-$1" llm="$venv/bin/llm"
    shift
    tool_server "$family" write_marker name tool-ran.txt tool-ran-2.txt "$@"
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

start_server
main_url=$url main_pid=$pid
script=$("$venv/bin/python" tools/openai_e2e.py --print-tool-script)
start_server --debug-force-output "$script"
tool_url=$url tool_pid=$pid
"$venv/bin/python" tools/openai_e2e.py "$main_url" "$tool_url"
# served_name URL: the model a server serves.
served_name() {
    "$venv/bin/python" -c 'import json, sys, urllib.request
print(json.load(urllib.request.urlopen(sys.argv[1] + "/v1/models"))["data"][0]["id"])' "$1"
}
model=$(served_name "$main_url")
"$venv/bin/python" tools/anthropic_e2e.py "$model" "$main_url" "$tool_url"
target/debug/deepinfer synth --preset tiny-v41-vision --out "$scratch/vision"
target/debug/deepinfer synth --preset tiny-v4-vision --out "$scratch/vision-v4"
start_server --model "$scratch/vision"
vision_url=$url vision_pid=$pid
start_server --model "$scratch/vision-v4"
v4_url=$url v4_pid=$pid
"$venv/bin/python" tools/openai_vision_e2e.py "$vision_url" "$main_url" "$v4_url"
# DeepSeek-V4.1 in its own chat format: the same checks, the scripted call in V4.1's markup.
target/debug/deepinfer synth --preset tiny-v41 --out "$scratch/v41"
start_server --model "$scratch/v41"
v41_url=$url v41_pid=$pid
start_server --model "$scratch/v41" --debug-force-output \
    "$("$venv/bin/python" tools/openai_e2e.py --print-tool-script v41)"
v41_tool_url=$url v41_tool_pid=$pid
"$venv/bin/python" tools/openai_e2e.py "$v41_url" "$v41_tool_url"
"$venv/bin/python" tools/anthropic_e2e.py "$(served_name "$v41_url")" "$v41_url" "$v41_tool_url"
stop_servers "$main_pid" "$tool_pid" "$vision_pid" "$v4_pid" "$v41_pid" "$v41_tool_pid"
echo "servers stopped cleanly"
llm_turn v4
llm_turn v41 --model "$scratch/v41"

# The agents, pinned to the versions this was checked with. Both ask for reasoning, so the
# scripted answers think first; only the text after </think> is printed.
agents=target/agents
# Qwen Code 0.15 is the last that runs on Node.js 20 (later ones ask for 22).
clients="@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 opencode-ai@1.18.33 @qwen-code/qwen-code@0.15.10"
for b in claude codex opencode qwen; do
    if [ ! -x "$agents/node_modules/.bin/$b" ]; then
        mkdir -p "$agents"
        # shellcheck disable=SC2086 # the list splits into packages
        npm install --prefix "$agents" --no-audit --no-fund --loglevel=error $clients
        break
    fi
done
bin="$PWD/$agents/node_modules/.bin"
home="$scratch/home"
mkdir -p "$home/.codex"
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
for family in v4 v41; do
    model_args=()
    if [ "$family" = v41 ]; then model_args=(--model "$scratch/v41"); fi
    for turn in claude_turn codex_turn opencode_turn qwen_turn; do
        "$turn" "$family" "${model_args[@]}"
    done
done

# aider (PyPI aider-chat, in its own venv: it pins its own openai) has no tool calls: it
# edits files from the answer's text. Its turn: the model (scripted to think, then write a
# file in aider's `whole` edit format) answers, aider applies the edit.
aider_venv="$PWD/target/aider-venv"
if [ ! -x "$aider_venv/bin/aider" ]; then
    python3 -m venv "$aider_venv"
    "$aider_venv/bin/pip" install --quiet --disable-pip-version-check 'aider-chat==0.86.1'
fi
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
aider_turn v4
aider_turn v41 --model "$scratch/v41"
echo "clients e2e: all passed"
